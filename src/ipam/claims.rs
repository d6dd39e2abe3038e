//! Claims whose pool does not exist: the pool reconciler never sees them, so this one tells the
//! claim's owner (Ready=False, PoolNotReady), and lets a claim whose pool is gone be deleted —
//! IPAddressClaims on pools of every kind and Metal3 IPClaims alike, each with the finalizers
//! the pool kind gives them.

use std::sync::Arc;
use std::time::Duration;

use kube::Resource;
use kube::runtime::controller::Action;

use super::Context;
use super::dialect::{AddressKinds, PoolWrites, fresh_addresses};
use super::key::{PoolKey, PoolKind};
use super::kinds::{AnyAddress, AnyClaim, ClaimKind};
use crate::api::capi::{self, IPAddressClaim};
use crate::api::capi_pools::{ADDRESS_FINALIZER, CLAIM_FINALIZER};
use crate::api::metal3_ipam::{IPClaim, IPPool};
use crate::runtime::cached::ClaimObject;
use crate::runtime::error::{Call, Error, Verb};
use crate::runtime::index::Index;
use crate::runtime::objects;

/// Whether `claim` may be an orphan this process acts on: it names a pool of a kind served here
/// that is not cached, and it is not paused; a live Metal3 IPClaim waits with nothing to do.
/// Only these enter the orphan controllers' stores ([`crate::runtime::selection`]).
pub fn may_be_orphan(ctx: &crate::runtime::context::Context, claim: &Arc<ClaimObject>) -> bool {
    let claim = AnyClaim::from(claim.clone());
    let Some(key) = claim.pool_key() else {
        return false; // another provider's claim
    };
    let groups = ctx.settings.groups;
    let served = match (claim.kind(), key.kind) {
        (ClaimKind::Capi, PoolKind::Metal3IPPool) => groups.metal3_ipam,
        (ClaimKind::Capi, _) => groups.capi_ipam,
        (ClaimKind::Metal3, _) => groups.metal3_pools() && claim.deleting(),
    };
    served && !claim.paused() && !super::context::pool_cached(ctx, &key)
}

/// The stand-in the orphan controller's store holds for an IPAddressClaim: its name and
/// namespace.
pub fn capi_stand_in(claim: &ClaimObject) -> IPAddressClaim {
    let mut object = IPAddressClaim::new(&claim.meta.name, Default::default());
    object.metadata.namespace = Some(claim.meta.namespace().to_string());
    object
}

/// The stand-in the orphan controller's store holds for an IPClaim.
pub fn metal3_stand_in(claim: &ClaimObject) -> IPClaim {
    let mut object = IPClaim::new(&claim.meta.name, Default::default());
    object.metadata.namespace = Some(claim.meta.namespace().to_string());
    object
}

/// An IPAddressClaim whose pool is missing: Ready=False (PoolNotReady) while it waits for it,
/// released when it is deleted.
pub async fn reconcile(stand_in: Arc<IPAddressClaim>, ctx: Arc<Context>) -> Result<Action, Error> {
    let claim = cached(&ctx.claims, &*stand_in);
    match claim.filter(|c| may_be_orphan(&ctx, c)).map(AnyClaim::from) {
        Some(claim) if claim.deleting() => release_orphan(&ctx, &claim).await,
        Some(claim) => tell_missing_pool(&ctx, &claim).await,
        None => Ok(Action::await_change()),
    }
}

/// A Metal3 IPClaim whose IPPool is gone: released when deleted (a live one waits for its pool,
/// as upstream's does, with nothing to report on its status).
pub async fn reconcile_ipclaim(stand_in: Arc<IPClaim>, ctx: Arc<Context>) -> Result<Action, Error> {
    let claim = cached(&ctx.ipclaims, &*stand_in);
    match claim.filter(|c| may_be_orphan(&ctx, c)).map(AnyClaim::from) {
        Some(claim) => release_orphan(&ctx, &claim).await,
        None => Ok(Action::await_change()),
    }
}

/// The cached claim a stand-in names.
fn cached<K: Resource>(claims: &Index<ClaimObject>, stand_in: &K) -> Option<Arc<ClaimObject>> {
    let meta = stand_in.meta();
    claims.get(meta.namespace.as_deref()?, meta.name.as_deref()?)
}

/// Ready=False (PoolNotReady) naming the missing pool, unless the claim says so already.
async fn tell_missing_pool(ctx: &Context, claim: &AnyClaim) -> Result<Action, Error> {
    let Some(key) = claim.pool_key() else {
        return Ok(Action::await_change());
    };
    let mut conditions = claim.conditions();
    let where_ = key
        .namespace
        .as_deref()
        .map(|ns| format!(" in namespace {ns}"))
        .unwrap_or_default();
    let changed = objects::set_condition(
        &mut conditions,
        objects::condition(
            capi::READY_CONDITION,
            false,
            capi::reasons::POOL_NOT_READY,
            format!(
                "{} {} not found{where_}; the claim waits for it",
                key.kind, key.name
            ),
            claim.generation(),
        ),
    );
    if changed {
        let patch = capi::claim_status_patch(None, &conditions);
        claim.patch_status(ctx, patch).await?;
    }
    Ok(Action::await_change())
}

/// The finalizers a claim of `kind` carries on a pool of `key`'s kind, and its address
/// objects carry.
fn finalizers(key: &PoolKey, kind: ClaimKind) -> (&'static str, &'static str) {
    if key.kind.is_metal3() {
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
async fn release_orphan(ctx: &Context, claim: &AnyClaim) -> Result<Action, Error> {
    let Some(key) = &claim.pool_key() else {
        return Ok(Action::await_change());
    };
    let (claim_finalizer, address_finalizer) = finalizers(key, claim.kind());
    if !claim.meta.has_finalizer(claim_finalizer) {
        return Ok(Action::await_change());
    }
    let namespace = claim.namespace();
    let kinds = match key.kind.is_metal3() {
        true => AddressKinds::CapiAndMetal3,
        false => AddressKinds::Capi,
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
