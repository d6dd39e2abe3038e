//! A Metal3Data's IP claims, one per pool its template names (an IPClaim for a Metal3 IPPool,
//! an IPAddressClaim for any other kind): made, found, read for their address, released.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Resource, ResourceExt};

use super::unanswered::unanswered;
use crate::api::capi::{IPAddressClaim, IPAddressClaimSpec, IPPoolReference};
use crate::api::labels;
use crate::api::metal3_data::{DATA_FINALIZER, DATA_NAME_LABEL, Metal3Data, POOL_NAME_LABEL};
use crate::api::metal3_ipam::{IPClaim, IPClaimSpec};
use crate::render::{PoolAddress, PoolKind, PoolReference};
use crate::runtime::Context;
use crate::runtime::cached::{ClaimObject, Meta, Uid};
use crate::runtime::error::{Error, Verb, object_of};
use crate::runtime::index::Index;
use crate::runtime::objects::{self};

/// What one pool's claim says.
pub(super) enum ClaimState {
    Address(PoolAddress),
    Waiting(String),
    Failed(String),
    /// No IPAM provider has answered the claim ([`unanswered`]): failed, and told in an Event.
    Unanswered(String),
}

pub(super) fn owned_by(meta: &ObjectMeta, data: &Metal3Data) -> bool {
    let uid = data.meta().uid.as_deref();
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| Some(o.uid.as_str()) == uid)
}

/// [`owned_by`] for a cached object.
pub(super) fn owned_by_cached(meta: &Meta, data: &Metal3Data) -> bool {
    let Some(uid) = data.meta().uid.as_deref().map(Uid::of) else {
        return false;
    };
    meta.owners().any(|o| o.uid == uid)
}

/// Finds or creates the claim for one pool and reads its address.
pub(super) async fn ensure_claim(
    data: &Metal3Data,
    ctx: &Context,
    reference: &PoolReference,
    host_name: &str,
) -> Result<ClaimState, Error> {
    let namespace = data.namespace().unwrap_or_default();
    let own_name = format!("{}-{}", data.name_any(), reference.name);
    let host_keyed = format!("{host_name}-{}", reference.name);
    let preferred = if ctx.settings.bmh_name_based_preallocation {
        &host_keyed
    } else {
        &own_name
    };
    let names = ClaimNames {
        candidates: [&own_name, &host_keyed],
        preferred,
        namespace: &namespace,
    };
    let pool = &reference.name;
    match reference.kind() {
        PoolKind::Metal3 => {
            let read = |claim: &ClaimObject| metal3_address(ctx, claim, pool);
            let new = |metadata| IPClaim {
                metadata,
                spec: IPClaimSpec {
                    pool: ObjectReference {
                        name: Some(pool.clone()),
                        namespace: Some(namespace.clone()),
                        ..Default::default()
                    },
                },
                status: None,
            };
            claim_of_pool(data, ctx, &ctx.ipclaims, &names, pool, read, new).await
        }
        PoolKind::Capi => {
            let read = |claim: &ClaimObject| capi_address(ctx, claim, reference);
            let new = |metadata| IPAddressClaim {
                metadata,
                spec: IPAddressClaimSpec {
                    cluster_name: data.labels().get(labels::CLUSTER_NAME).cloned(),
                    pool_ref: IPPoolReference {
                        name: pool.clone(),
                        kind: reference.kind.clone(),
                        api_group: reference.api_group.clone(),
                    },
                },
                status: None,
            };
            claim_of_pool(data, ctx, &ctx.claims, &names, pool, read, new).await
        }
    }
}

/// Where a Metal3Data's claim for one pool may be: under its own name or the host-keyed one
/// (the mode may have changed since the claim was made); new claims take `preferred`.
pub(super) struct ClaimNames<'a> {
    candidates: [&'a String; 2],
    preferred: &'a String,
    namespace: &'a str,
}

/// The claim of either kind: the one this Metal3Data owns is read; a claim of the preferred name
/// owned by another is waited for; otherwise `new` is created under the preferred name.
pub(super) async fn claim_of_pool<K>(
    data: &Metal3Data,
    ctx: &Context,
    cache: &Index<ClaimObject>,
    names: &ClaimNames<'_>,
    pool: &str,
    read: impl FnOnce(&ClaimObject) -> ClaimState,
    new: impl FnOnce(ObjectMeta) -> K,
) -> Result<ClaimState, Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let find = |name: &str| cache.get(names.namespace, name);
    let ours = names
        .candidates
        .into_iter()
        .filter_map(|n| find(n))
        .find(|c| owned_by_cached(&c.meta, data));
    if let Some(claim) = ours {
        return Ok(read(&claim));
    }
    let api: Api<K> = Api::namespaced(ctx.client.clone(), names.namespace);
    if let Some(other) = find(names.preferred) {
        return earlier_claim(&api, &other).await;
    }
    let claim = new(claim_meta(data, names.preferred, pool));
    create_claim(&api, &claim, pool).await
}

/// The claim's metadata: the Metal3Data's labels plus `data-name`/`pool-name` (how release finds
/// host-keyed claims), the Metal3Data as controller, and the finalizer that keeps the claim while
/// the Metal3Data uses it.
pub(super) fn claim_meta(data: &Metal3Data, name: &str, pool: &str) -> ObjectMeta {
    let mut claim_labels = objects::with_label(
        data.meta().labels.as_ref(),
        DATA_NAME_LABEL,
        &data.name_any(),
    );
    claim_labels.insert(POOL_NAME_LABEL.to_string(), pool.to_string());
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: data.namespace(),
        labels: Some(claim_labels),
        finalizers: Some(vec![DATA_FINALIZER.to_string()]),
        owner_references: objects::owner_reference(data, true).map(|o| vec![o]),
        ..Default::default()
    }
}

pub(super) async fn create_claim<K>(
    api: &Api<K>,
    claim: &K,
    pool: &str,
) -> Result<ClaimState, Error>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    match api.create(&PostParams::default(), claim).await {
        Ok(_) => {
            tracing::info!(claim = %claim.name_any(), kind = %K::kind(&()), "created IP claim");
            Ok(ClaimState::Waiting(format!(
                "waiting for an address from pool {pool}"
            )))
        }
        Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(ClaimState::Waiting(format!(
            "claim {} exists but is not in the cache yet",
            claim.name_any()
        ))),
        Err(e) => Err(Error::api(
            Verb::Create,
            object_of(api, &claim.name_any()),
            e,
        )),
    }
}

/// A claim of the wanted name that belongs to another (earlier) Metal3Data: never taken over.
/// If it is being deleted, its finalizer from that Metal3Data is lifted so that it can go.
pub(super) async fn earlier_claim<K>(api: &Api<K>, claim: &ClaimObject) -> Result<ClaimState, Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let meta = &claim.meta;
    if meta.is_deleted() {
        let version = meta.resource_version.to_string();
        let listed = objects::Finalizers {
            name: &meta.name,
            resource_version: &version,
            current: meta.finalizers().iter().map(|f| &**f),
        };
        listed.set(api, DATA_FINALIZER, false).await?;
        return Ok(ClaimState::Waiting(format!(
            "claim {} of an earlier Metal3Data is being deleted",
            meta.name
        )));
    }
    Ok(ClaimState::Waiting(format!(
        "claim {} belongs to another Metal3Data; waiting for it to be released",
        meta.name
    )))
}

pub(super) fn metal3_address(ctx: &Context, claim: &ClaimObject, pool: &str) -> ClaimState {
    if let Some(message) = claim.error_message() {
        return ClaimState::Failed(format!("IP Allocation for {pool} failed : {message}"));
    }
    let Some(address_name) = &claim.address else {
        return waiting_for_an_address(claim, pool);
    };
    match ctx
        .metal3_addresses
        .get(claim.meta.namespace(), address_name)
    {
        Some(address) => ClaimState::Address(PoolAddress {
            address: address.address.to_string(),
            prefix: address.prefix().unwrap_or(0),
            gateway: address.gateway().unwrap_or_default().to_string(),
            dns_servers: address
                .dns_servers()
                .iter()
                .map(|d| d.to_string())
                .collect(),
        }),
        None => ClaimState::Waiting(format!("IPAddress {address_name} not found")),
    }
}

pub(super) fn capi_address(
    ctx: &Context,
    claim: &ClaimObject,
    reference: &PoolReference,
) -> ClaimState {
    let pool = &reference.name;
    if claim.meta.is_deleted() {
        return ClaimState::Waiting(format!(
            "IPAddressClaim {} is being deleted",
            claim.meta.name
        ));
    }
    let Some(address_name) = claim.address.as_deref().filter(|n| !n.is_empty()) else {
        // Beyond CAPM3: say why the provider refused, instead of waiting silently.
        return match claim.refusal() {
            Some(message) => {
                ClaimState::Failed(format!("IP Allocation for {pool} failed : {message}"))
            }
            None => waiting_for_an_address(claim, pool),
        };
    };
    let namespace = claim.meta.namespace();
    let Some(address) = ctx.addresses.get(namespace, address_name) else {
        return ClaimState::Waiting(format!("IPAddress {address_name} not found"));
    };
    ClaimState::Address(PoolAddress {
        address: address.address.to_string(),
        prefix: address.prefix().unwrap_or(0),
        gateway: address.gateway().unwrap_or_default().to_string(),
        // The CAPI contract carries no DNS; bitpool's own pools may list servers per subnet.
        dns_servers: ctx
            .address_pool(&reference.api_group, &reference.kind, pool, namespace)
            .map(|p| p.dns_servers_for(&address.address))
            .unwrap_or_default(),
    })
}

/// A claim without an address or a refusal: waiting, unless no provider has answered it for
/// longer than a provider takes.
pub(super) fn waiting_for_an_address(claim: &ClaimObject, pool: &str) -> ClaimState {
    match unanswered(claim, pool, objects::now().0) {
        Some(why) => ClaimState::Unanswered(why),
        None => ClaimState::Waiting(format!("waiting for an address from pool {pool}")),
    }
}

pub(super) async fn release_claim<K>(api: &Api<K>, claim: &K) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    objects::remove_finalizer(api, claim, DATA_FINALIZER).await?;
    if claim.meta().deletion_timestamp.is_none() {
        objects::delete_ignoring_missing(api, &claim.name_any()).await?;
    }
    Ok(())
}
