//! The transparent proxy for migration: a Metal3 IPPool whose `spec.poolRef` names a CAPI pool
//! serves its IPClaims through IPAddressClaims against that pool (bitpool's own or another
//! provider's) and mirrors each resulting IPAddress back as the Metal3 IPAddress that existing
//! consumers read. Consumers keep working while the addresses come from the new pool.
//!
//! The proxy claim is named like the IPClaim, so that an InClusterIPPool written by
//! `bitpool migrate` (preallocations keyed by those names) gives every host its old address.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::Context;
use super::dialect::PoolDialect;
use super::engine;
use super::key::PoolKey;
use super::kinds::{AnyAddress, AnyClaim, NewAddress, Outcome};
use super::metal3::metal3_address;
use crate::api::capi::{self, IPAddress, IPAddressClaim, IPAddressClaimSpec, IPPoolReference};
use crate::api::metal3_ipam::{ADDRESS_FINALIZER, CLAIM_FINALIZER, IPClaim, IPPool};
use crate::runtime::error::{Call, Error, Verb, object_of};
use crate::runtime::objects::{self, FinalizerPatch};

/// The IPPool controller's reconcile: the pool engine (group `metal3-ipam`), or the proxy when
/// the pool names a CAPI pool (group `migration-proxy`); a pool of a group that is off is left
/// to whoever runs it.
pub async fn reconcile(pool: Arc<IPPool>, ctx: Arc<Context>) -> Result<Action, Error> {
    let groups = ctx.settings.groups;
    match pool.spec.pool_ref.clone() {
        None if groups.metal3_ipam => engine::reconcile(pool, ctx).await,
        Some(target) if groups.migration_proxy => reconcile_proxy(pool, target, ctx).await,
        _ => Ok(Action::await_change()),
    }
}

/// What the proxy claim of an IPClaim says.
enum Proxied {
    Pending,
    Failed(String),
    Allocated(Box<IPAddress>),
}

async fn proxied(ctx: &Context, claim: &IPAddressClaim) -> Result<Proxied, Error> {
    let status = claim.status.clone().unwrap_or_default();
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == capi::READY_CONDITION);
    match (ready, status.address_ref) {
        (Some(c), Some(address)) if c.status == "True" => {
            let api: Api<IPAddress> =
                Api::namespaced(ctx.client.clone(), &claim.namespace().unwrap_or_default());
            let found = api.get_opt(&address.name).await;
            match found.call(Verb::Get, &api, &address.name)? {
                Some(a) => Ok(Proxied::Allocated(Box::new(a))),
                None => Ok(Proxied::Pending),
            }
        }
        (Some(c), _) if c.status == "False" => {
            Ok(Proxied::Failed(format!("{}: {}", c.reason, c.message)))
        }
        _ => Ok(Proxied::Pending),
    }
}

fn owned_by(claim: &IPAddressClaim, owner: &IPClaim) -> bool {
    claim
        .owner_references()
        .iter()
        .any(|o| Some(&o.uid) == owner.meta().uid.as_ref())
}

/// The proxy claim for `ipclaim`: same name and namespace, owned by it, against `target`.
fn proxy_claim(
    pool: &IPPool,
    ipclaim: &IPClaim,
    target: &IPPoolReference,
) -> Option<IPAddressClaim> {
    Some(IPAddressClaim {
        metadata: ObjectMeta {
            name: Some(ipclaim.name_any()),
            namespace: ipclaim.namespace(),
            labels: ipclaim.metadata.labels.clone(),
            owner_references: Some(vec![objects::owner_reference(ipclaim, true)?]),
            ..Default::default()
        },
        spec: IPAddressClaimSpec {
            cluster_name: pool.spec.cluster_name.clone().filter(|c| !c.is_empty()),
            pool_ref: target.clone(),
        },
        status: None,
    })
}

/// The Metal3 IPAddress mirroring `address` for `ipclaim`. DNS servers come from the Metal3
/// pool (the CAPI contract carries none).
fn mirror(pool: &IPPool, ipclaim: &IPClaim, address: &IPAddress) -> Option<NewAddress> {
    metal3_address(
        pool,
        ipclaim,
        address.spec.address.parse().ok()?,
        address.spec.prefix,
        address.spec.gateway.clone(),
        pool.spec.dns_servers.clone(),
    )
}

async fn reconcile_proxy(
    pool: Arc<IPPool>,
    target: IPPoolReference,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    if objects::is_paused(pool.meta()) || pool.paused_by_cluster(&ctx) {
        return Ok(Action::requeue(Duration::from_secs(30)));
    }
    let namespace = pool.namespace().unwrap_or_default();
    let pools: Api<IPPool> = Api::namespaced(ctx.client.clone(), &namespace);
    let ipclaims: Api<IPClaim> = Api::namespaced(ctx.client.clone(), &namespace);
    let claims: Api<IPAddressClaim> = Api::namespaced(ctx.client.clone(), &namespace);
    let key = pool.key();
    let mirrors: BTreeMap<String, AnyAddress> = pool
        .addresses(&ctx, None)
        .into_iter()
        .filter(|a| matches!(a, AnyAddress::Metal3(_)))
        .map(|a| (a.claim().1, a))
        .collect();

    if pool.meta().deletion_timestamp.is_some() {
        if mirrors.is_empty() {
            objects::remove_finalizer(&pools, &*pool, IPPool::FINALIZER).await?;
            return Ok(Action::await_change());
        }
    } else if objects::add_finalizer(&pools, &*pool, IPPool::FINALIZER).await?
        == FinalizerPatch::Stale
    {
        return Ok(Action::requeue(Duration::from_millis(200)));
    }

    let mut indexes = BTreeMap::new();
    let mut requeue = None;
    for ipclaim in ctx.ipclaims.state() {
        if PoolKey::of_ipclaim(&ipclaim).as_ref() != Some(&key)
            || objects::is_paused(ipclaim.meta())
        {
            continue;
        }
        let name = ipclaim.name_any();
        let existing = claims
            .get_opt(&name)
            .await
            .call(Verb::Get, &claims, &name)?;
        if ipclaim.meta().deletion_timestamp.is_some() {
            if !objects::has_finalizer(ipclaim.meta(), CLAIM_FINALIZER) {
                continue;
            }
            // Release: the mirror first, then the proxy claim (which releases the address).
            if let Some(address) = mirrors.get(&name)
                && !address.delete(&ctx, ADDRESS_FINALIZER).await?
            {
                requeue = Some(Duration::from_secs(1));
                continue;
            }
            if let Some(proxy) = existing.filter(|c| owned_by(c, &ipclaim)) {
                if proxy.meta().deletion_timestamp.is_none() {
                    let _ = claims.delete(&name, &DeleteParams::background()).await;
                }
                requeue = Some(Duration::from_secs(1));
                continue;
            }
            objects::remove_finalizer(&ipclaims, &*ipclaim, CLAIM_FINALIZER).await?;
            continue;
        }
        if objects::add_finalizer(&ipclaims, &*ipclaim, CLAIM_FINALIZER).await?
            == FinalizerPatch::Stale
        {
            requeue = Some(Duration::from_millis(200));
            continue;
        }
        let any = AnyClaim::Metal3(ipclaim.clone());
        let proxy = match existing {
            Some(proxy) if owned_by(&proxy, &ipclaim) => proxy,
            Some(_) => {
                let message =
                    format!("an IPAddressClaim named {name} exists and is not this claim's proxy");
                any.write_status(&ctx, &Outcome::Failed(message)).await?;
                continue;
            }
            None => {
                let Some(proxy) = proxy_claim(&pool, &ipclaim, &target) else {
                    continue;
                };
                match claims.create(&PostParams::default(), &proxy).await {
                    Ok(created) => created,
                    // Retried on its event.
                    Err(kube::Error::Api(s)) if s.is_already_exists() => continue,
                    Err(e) => return Err(Error::api(Verb::Create, object_of(&claims, &name), e)),
                }
            }
        };
        match proxied(&ctx, &proxy).await? {
            Proxied::Pending => {}
            Proxied::Failed(message) => {
                let patch = json!({ "status": { "errorMessage": message } });
                if ipclaim
                    .status
                    .as_ref()
                    .and_then(|s| s.error_message.as_deref())
                    != Some(message.as_str())
                {
                    ipclaims
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
                        .await
                        .call(Verb::PatchStatus, &ipclaims, &name)?;
                }
            }
            Proxied::Allocated(address) => {
                let (Some(object), Ok(ip)) = (
                    mirror(&pool, &ipclaim, &address),
                    address.spec.address.parse::<std::net::IpAddr>(),
                ) else {
                    continue;
                };
                // A mirror of an address that exists: no reservation's window applies.
                let deadline =
                    tokio::time::Instant::now() + crate::client::deadline::WRITE_DEADLINE;
                let outcome = match object.create(&ctx, &any, deadline).await? {
                    super::kinds::Created::Confirmed | super::kinds::Created::Own(_) => {
                        indexes.insert(name.clone(), address.spec.address.clone());
                        Outcome::Allocated {
                            address_name: object.name(),
                            address: ip.to_string(),
                        }
                    }
                    super::kinds::Created::Conflict(message) => Outcome::Failed(message),
                };
                any.write_status(&ctx, &outcome).await?;
            }
        }
    }
    let status = pool.status.clone().unwrap_or_default();
    if status.indexes != indexes {
        let patch = objects::indexes_patch(&status.indexes, &indexes, objects::now());
        let name = pool.name_any();
        pools
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .call(Verb::PatchStatus, &pools, &name)?;
    }
    Ok(match requeue {
        Some(after) => Action::requeue(after),
        None => Action::requeue(Duration::from_secs(600)),
    })
}
