//! Claims whose pool does not exist: the pool reconciler never sees them, so this one tells the
//! claim's owner (Ready=False, PoolNotReady), and lets a claim whose pool is gone be deleted.

use std::sync::Arc;

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};

use super::Context;
use super::error::Error;
use super::objects;
use super::pool::PoolKey;
use crate::api::capi::{self, IPAddress, IPAddressClaim};
use crate::api::capi_pools::{ADDRESS_FINALIZER, CLAIM_FINALIZER};

pub async fn reconcile(claim: Arc<IPAddressClaim>, ctx: Arc<Context>) -> Result<Action, Error> {
    let Some(key) = PoolKey::of_claim(&claim) else {
        return Ok(Action::await_change()); // another provider's claim
    };
    if key.kind == crate::api::metal3_ipam::POOL_KIND && !ctx.settings.groups.metal3_ipam {
        return Ok(Action::await_change()); // Metal3 IPAM serves these here
    }
    if ctx.pool_exists(&key) || objects::is_paused(claim.meta()) {
        return Ok(Action::await_change());
    }
    let namespace = claim.namespace().unwrap_or_default();
    if claim.meta().deletion_timestamp.is_some() {
        if !objects::has_finalizer(claim.meta(), CLAIM_FINALIZER) {
            return Ok(Action::await_change());
        }
        // The pool (and its ledger) is gone: nothing is left to release but the IPAddress.
        let addresses: Api<IPAddress> = Api::namespaced(ctx.client.clone(), &namespace);
        if let Some(address) = addresses
            .get_opt(&claim.name_any())
            .await
            .map_err(Error::Kube)?
            && PoolKey::of_address(&address).as_ref() == Some(&key)
        {
            objects::remove_finalizer(&addresses, &address, ADDRESS_FINALIZER).await?;
            let _ = addresses
                .delete(&address.name_any(), &Default::default())
                .await;
            return Ok(Action::requeue(std::time::Duration::from_secs(1)));
        }
        let claims: Api<IPAddressClaim> = Api::namespaced(ctx.client.clone(), &namespace);
        objects::remove_finalizer(&claims, &*claim, CLAIM_FINALIZER).await?;
        return Ok(Action::await_change());
    }
    let mut status = claim.status.clone().unwrap_or_default();
    let where_ = key
        .namespace
        .as_deref()
        .map(|ns| format!(" in namespace {ns}"))
        .unwrap_or_default();
    let changed = objects::set_condition(
        &mut status.conditions,
        objects::condition(
            capi::READY_CONDITION,
            false,
            capi::reasons::POOL_NOT_READY,
            format!(
                "{} {} not found{where_}; the claim waits for it",
                key.kind, key.name
            ),
            claim.meta().generation,
        ),
    );
    if changed {
        let claims: Api<IPAddressClaim> = Api::namespaced(ctx.client.clone(), &namespace);
        let patch = capi::claim_status_patch(None, &status.conditions);
        objects::merge_status(&claims, &claim.name_any(), patch).await?;
    }
    Ok(Action::await_change())
}
