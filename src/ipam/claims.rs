//! Claims whose pool does not exist: the pool reconciler never sees them, so this one tells the
//! claim's owner (Ready=False, PoolNotReady), and lets a claim whose pool is gone be deleted —
//! IPAddressClaims on pools of every kind and Metal3 IPClaims alike, each with the finalizers
//! the pool kind gives them.

use std::sync::Arc;
use std::time::Duration;

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};

use super::Context;
use super::dialect::{AddressKinds, PoolDialect, fresh_addresses};
use super::key::{PoolKey, PoolKind};
use super::kinds::{AnyAddress, AnyClaim, ClaimKind};
use crate::api::capi::{self, IPAddressClaim};
use crate::api::capi_pools::{ADDRESS_FINALIZER, CLAIM_FINALIZER};
use crate::api::metal3_ipam::{IPClaim, IPPool};
use crate::runtime::error::{Call, Error, Verb};
use crate::runtime::objects;

pub async fn reconcile(claim: Arc<IPAddressClaim>, ctx: Arc<Context>) -> Result<Action, Error> {
    let Some(key) = PoolKey::of_claim(&claim) else {
        return Ok(Action::await_change()); // another provider's claim
    };
    if key.kind == PoolKind::Metal3IPPool && !ctx.settings.groups.metal3_ipam {
        return Ok(Action::await_change()); // Metal3 IPAM serves these here
    }
    if ctx.pool_exists(&key) || objects::is_paused(claim.meta()) {
        return Ok(Action::await_change());
    }
    if claim.meta().deletion_timestamp.is_some() {
        return release_orphan(&ctx, &AnyClaim::Capi(claim), &key).await;
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
        let namespace = claim.namespace().unwrap_or_default();
        let claims: Api<IPAddressClaim> = Api::namespaced(ctx.client.clone(), &namespace);
        let patch = capi::claim_status_patch(None, &status.conditions);
        objects::merge_status(&claims, &claim.name_any(), patch).await?;
    }
    Ok(Action::await_change())
}

/// A Metal3 IPClaim whose IPPool is gone: released when deleted (a live one waits for its pool,
/// as upstream's does, with nothing to report on its status).
pub async fn reconcile_ipclaim(claim: Arc<IPClaim>, ctx: Arc<Context>) -> Result<Action, Error> {
    let Some(key) = PoolKey::of_ipclaim(&claim) else {
        return Ok(Action::await_change());
    };
    if ctx.pool_exists(&key)
        || objects::is_paused(claim.meta())
        || claim.meta().deletion_timestamp.is_none()
    {
        return Ok(Action::await_change());
    }
    release_orphan(&ctx, &AnyClaim::Metal3(claim), &key).await
}

/// The finalizers a claim of `kind` carries on a pool of `key`'s kind, and its address
/// objects carry.
fn finalizers(key: &PoolKey, kind: ClaimKind) -> (&'static str, &'static str) {
    if key.kind == PoolKind::Metal3IPPool {
        (
            IPPool::claim_finalizer(kind),
            IPPool::address_finalizer(kind),
        )
    } else {
        (CLAIM_FINALIZER, ADDRESS_FINALIZER)
    }
}

/// A deleting claim whose pool is gone: the pool and its ledger are gone, so nothing is left to
/// release but the claim's address objects (found by a fresh list: a Metal3 pool names them
/// after the address, not the claim). They are deleted first, then the claim's finalizer goes.
async fn release_orphan(ctx: &Context, claim: &AnyClaim, key: &PoolKey) -> Result<Action, Error> {
    let (claim_finalizer, address_finalizer) = finalizers(key, claim.kind());
    if !objects::has_finalizer(claim.meta(), claim_finalizer) {
        return Ok(Action::await_change());
    }
    let namespace = claim.namespace();
    let kinds = match key.kind {
        PoolKind::Metal3IPPool => AddressKinds::CapiAndMetal3,
        _ => AddressKinds::Capi,
    };
    let fresh = fresh_addresses(&ctx.client, Some(&namespace), kinds)
        .await
        .call_on(Verb::List, format!("address objects in {namespace}"))?;
    let claimed = (claim.kind(), claim.name());
    let own: Vec<AnyAddress> = fresh
        .all()
        .filter(|a| a.pool_key().as_ref() == Some(key) && a.claim() == claimed)
        .collect();
    if own.is_empty() {
        claim.set_finalizer(ctx, claim_finalizer, false).await?;
        tracing::info!(claim = %claim.describe(), pool = %key.describe(), "released a claim whose pool is gone");
        return Ok(Action::await_change());
    }
    for address in own {
        address.delete(ctx, address_finalizer).await?;
    }
    Ok(Action::requeue(Duration::from_secs(1)))
}
