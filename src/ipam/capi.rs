//! The CAPI IPAM provider's dialect: InClusterIPPool and GlobalInClusterIPPool serving
//! IPAddressClaims with IPAddresses named after the claims, as the in-cluster provider does.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, ObjectMeta};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use super::dialect::{PoolSpace, PoolStatus, PoolWrites, Report};
use super::duplicates;
use super::key::PoolKind;
use super::kinds::{AnyClaim, ClaimKind, NewAddress};
use super::ledger::MAX_BITMAP_BYTES;
use super::overlaps;
use super::tenancy::{self, Reach};
use crate::alloc::{AddressSpace, Lease};
use crate::api::capi::{IPAddress, IPAddressSpec, LocalObjectName};
use crate::api::capi_pools::{
    ADDRESS_FINALIZER, GlobalInClusterIPPool, IPAddressCounts, InClusterIPPool,
    InClusterIPPoolSpec, InClusterIPPoolStatus,
};
use crate::api::labels;
use crate::runtime::objects;

/// The spec and status both CAPI pool kinds share.
trait CapiPool: Resource<DynamicType = ()> {
    fn pool_spec(&self) -> &InClusterIPPoolSpec;
    fn pool_status(&self) -> Option<&InClusterIPPoolStatus>;
}

impl CapiPool for InClusterIPPool {
    fn pool_spec(&self) -> &InClusterIPPoolSpec {
        &self.spec
    }
    fn pool_status(&self) -> Option<&InClusterIPPoolStatus> {
        self.status.as_ref()
    }
}

impl CapiPool for GlobalInClusterIPPool {
    fn pool_spec(&self) -> &InClusterIPPoolSpec {
        &self.spec.pool
    }
    fn pool_status(&self) -> Option<&InClusterIPPoolStatus> {
        self.status.as_ref()
    }
}

/// The IPAddress for a claim, as the contract has it: named after the claim, owned by the
/// claim (controller) and the pool, protected by a finalizer, with the Cluster's name label.
pub(super) fn capi_address<P: Resource<DynamicType = ()>>(
    pool: &P,
    claim: &AnyClaim,
    lease: &Lease,
    name: String,
    finalizer: &str,
) -> Option<NewAddress> {
    if claim.kind() != ClaimKind::Capi {
        return None;
    }
    let mut owners = vec![claim.owner_reference(true)?];
    owners.extend(objects::owner_reference(pool, false));
    let mut labels = BTreeMap::new();
    if let Some(cluster) = claim.cluster_name() {
        labels.insert(labels::CLUSTER_NAME.to_string(), cluster.to_string());
    }
    Some(NewAddress::Capi(Box::new(IPAddress {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(claim.namespace()),
            finalizers: Some(vec![finalizer.to_string()]),
            labels: (!labels.is_empty()).then_some(labels),
            owner_references: Some(owners),
            ..Default::default()
        },
        spec: IPAddressSpec {
            claim_ref: LocalObjectName { name: claim.name() },
            pool_ref: claim.pool().clone(),
            address: lease.address.to_string(),
            prefix: i32::from(lease.prefix),
            gateway: lease.gateway.map(|g| g.to_string()),
        },
    })))
}

/// A count as an int64 status field holds it: `i64::MAX` beyond.
pub(super) fn saturate(value: u128) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The condition a pool carries while its addresses meet another pool's (True then).
pub const OVERLAP_CONDITION: &str = "AddressesOverlap";

/// The status of a CAPI pool of either shape: counts, and a Ready condition saying what keeps
/// the pool from serving; `show` writes a held address as people read it.
pub(super) fn status_patch(
    status: Option<&InClusterIPPoolStatus>,
    generation: Option<i64>,
    report: &Report,
    show: impl Fn(IpAddr) -> String,
) -> Option<serde_json::Value> {
    let current = status.cloned().unwrap_or_default();
    let mut next = current.clone();
    if let Some(usage) = report.usage {
        let counts = usage.counts;
        next.ip_addresses = Some(IPAddressCounts {
            total: saturate(counts.total),
            free: saturate(counts.free),
            used: saturate(counts.used),
            out_of_range: saturate(counts.out_of_range),
        });
    }
    let conditions_changed = set_conditions(&mut next.conditions, report, generation, &show);
    (conditions_changed || current.ip_addresses != next.ip_addresses).then(
        || json!({ "status": { "ipAddresses": next.ip_addresses, "conditions": next.conditions } }),
    )
}

/// A pool's conditions, for every pool kind: `Ready`, and `AddressesOverlap` while its
/// addresses meet another pool's. True when they changed.
pub(super) fn set_conditions(
    conditions: &mut Vec<Condition>,
    report: &Report,
    generation: Option<i64>,
    show: &impl Fn(IpAddr) -> String,
) -> bool {
    let ready = ready_condition(report, generation, show);
    let mut changed = objects::set_condition(conditions, ready);
    changed |= match report.overlaps.is_empty() {
        true => objects::remove_condition(conditions, OVERLAP_CONDITION),
        false => {
            let message = overlaps::message(report.overlaps);
            let overlap =
                objects::condition(OVERLAP_CONDITION, true, "PoolsOverlap", message, generation);
            objects::set_condition(conditions, overlap)
        }
    };
    changed | set_reach(conditions, &report.reach, generation)
}

/// The condition a cluster-scoped pool with a `namespaceSelector` carries: whether it selects
/// any namespace (a selector that selects none serves nobody, which is rarely meant).
pub const NAMESPACES_CONDITION: &str = "NamespacesSelected";

fn set_reach(conditions: &mut Vec<Condition>, reach: &Reach, generation: Option<i64>) -> bool {
    match reach {
        Reach::Everyone => objects::remove_condition(conditions, NAMESPACES_CONDITION),
        Reach::Unknown => false,
        Reach::Selects {
            selector,
            namespaces: 0,
        } => {
            let message = tenancy::selects_nothing(selector);
            let condition = objects::condition(
                NAMESPACES_CONDITION,
                false,
                "NoNamespaceSelected",
                message,
                generation,
            );
            objects::set_condition(conditions, condition)
        }
        Reach::Selects {
            selector,
            namespaces,
        } => {
            let message =
                format!("spec.namespaceSelector ({selector}) selects {namespaces} namespace(s)");
            let condition =
                objects::condition(NAMESPACES_CONDITION, true, "Selected", message, generation);
            objects::set_condition(conditions, condition)
        }
    }
}

/// What keeps a pool from serving, or that it serves (and what it holds outside its ranges).
fn ready_condition(
    report: &Report,
    generation: Option<i64>,
    show: &impl Fn(IpAddr) -> String,
) -> Condition {
    let ready = match report.usage {
        Some(usage) => {
            let counts = usage.counts;
            if counts.out_of_range > 0 {
                let outside: Vec<String> = usage.outside.iter().map(|a| show(*a)).collect();
                let message = format!(
                    "{} allocated address(es) are outside the pool's addresses and stay allocated until released: {}",
                    counts.out_of_range,
                    outside.join(", ")
                );
                objects::condition("Ready", true, "AddressesOutOfRange", message, generation)
            } else {
                objects::condition("Ready", true, "Valid", String::new(), generation)
            }
        }
        None => {
            let allocated = report.ledger.len();
            let message = format!(
                "{}; nothing is allocated until the spec is fixed, and the {allocated} allocated address(es) are kept",
                report.spec_error.unwrap_or("invalid spec")
            );
            objects::condition("Ready", false, "InvalidSpec", message, generation)
        }
    };
    let holding = holding_back(report, generation, show);
    // The first that holds says what keeps the pool from serving.
    match ready.status.as_str() {
        "True" => holding.unwrap_or(ready),
        _ => ready,
    }
}

/// What keeps a valid pool from serving, first first: an address held twice, a full record, a
/// rebuild fence.
fn holding_back(
    report: &Report,
    generation: Option<i64>,
    show: &impl Fn(IpAddr) -> String,
) -> Option<Condition> {
    let shared = (!report.shared.is_empty()).then(|| {
        let message = duplicates::message(report.shared, show);
        objects::condition("Ready", false, "DuplicateAddress", message, generation)
    });
    let bitmaps = report.ledger.bitmap_bytes();
    let full = (bitmaps >= MAX_BITMAP_BYTES).then(|| {
        let message = format!(
            "the allocation record takes {} KiB of the {} KiB it may, because the pool's addresses are scattered over a vast space; no new address until addresses are released",
            bitmaps / 1024,
            MAX_BITMAP_BYTES / 1024
        );
        objects::condition("Ready", false, "LedgerFull", message, generation)
    });
    let fenced = report
        .ledger
        .fenced_until(&objects::now().0.to_string())
        .map(|until| {
            let message = format!(
                "{}; the ledger was rebuilt from the pool's address objects at {}, and new addresses are handed out from {until}",
                report.ledger.rebuilt_because.as_deref().unwrap_or("the allocation record was lost"),
                report.ledger.rebuilt_at.as_deref().unwrap_or_default()
            );
            objects::condition("Ready", false, "LedgerRebuilt", message, generation)
        });
    shared.or(full).or(fenced)
}

/// The parts of [`PoolDialect`] both CAPI address pool kinds share.
macro_rules! capi_dialect {
    (space) => {
        fn space(&self) -> Result<AddressSpace, String> {
            AddressSpace::capi(&$crate::ipam::spec::capi_pool(self.pool_spec()))
                .map_err(|e| e.to_string())
        }

        fn reuse_grace(&self) -> Option<Duration> {
            self.pool_spec()
                .address_reuse_grace_period_seconds
                .filter(|s| *s > 0)
                .map(|s| Duration::from_secs(s.unsigned_abs().into()))
        }
    };
    (writes) => {
        fn new_address(&self, claim: &AnyClaim, lease: &Lease) -> Result<NewAddress, String> {
            capi_address(self, claim, lease, claim.name(), ADDRESS_FINALIZER)
                .ok_or_else(|| format!("{} has no UID yet", claim.describe()))
        }
    };
    (status) => {
        fn status_patch(&self, report: &Report) -> Option<serde_json::Value> {
            status_patch(self.pool_status(), self.meta().generation, report, |a| {
                a.to_string()
            })
        }
    };
}

impl PoolSpace for InClusterIPPool {
    const KIND: PoolKind = PoolKind::InClusterIPPool;

    capi_dialect!(space);
}

impl PoolWrites for InClusterIPPool {
    capi_dialect!(writes);

    fn api_for(&self, client: Client) -> Api<Self> {
        Api::namespaced(client, &self.namespace().unwrap_or_default())
    }
}

impl PoolStatus for InClusterIPPool {
    capi_dialect!(status);
}

impl PoolSpace for GlobalInClusterIPPool {
    const KIND: PoolKind = PoolKind::GlobalInClusterIPPool;

    capi_dialect!(space);

    /// Claims of any namespace share a global pool, so a preallocation names the claim's
    /// namespace: `<namespace>/<name>`; see [`global_preallocation_key`].
    fn preallocation_key(&self, claim: &AnyClaim) -> String {
        global_preallocation_key(self.meta(), &self.spec.pool.pre_allocations, claim)
    }

    fn tenancy(&self) -> Result<super::tenancy::Tenancy, String> {
        super::tenancy::Tenancy::of(self.spec.namespace_selector.as_ref())
    }
}

impl PoolWrites for GlobalInClusterIPPool {
    capi_dialect!(writes);

    fn api_for(&self, client: Client) -> Api<Self> {
        Api::all(client)
    }
}

impl PoolStatus for GlobalInClusterIPPool {
    capi_dialect!(status);
}

/// The key that names `claim` among a cluster-scoped pool's `preAllocations`: `<namespace>/<name>`,
/// or the bare `<name>` for a claim of the namespace the pool's
/// [`crate::api::capi_pools::PREALLOCATION_NAMESPACE_ANNOTATION`] names (a qualified key wins over a bare one).
pub(super) fn global_preallocation_key(
    pool: &ObjectMeta,
    pre_allocations: &BTreeMap<String, String>,
    claim: &AnyClaim,
) -> String {
    let qualified = format!("{}/{}", claim.namespace(), claim.name());
    let bare_namespace = pool
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::api::capi_pools::PREALLOCATION_NAMESPACE_ANNOTATION));
    if !pre_allocations.contains_key(&qualified) && bare_namespace == Some(&claim.namespace()) {
        claim.name()
    } else {
        qualified
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::capi::{IPAddressClaim, IPAddressClaimSpec, IPPoolReference};
    use crate::api::capi_pools::PREALLOCATION_NAMESPACE_ANNOTATION;

    fn claim(namespace: &str, name: &str) -> AnyClaim {
        let mut claim = IPAddressClaim::new(
            name,
            IPAddressClaimSpec {
                cluster_name: None,
                pool_ref: IPPoolReference::default(),
            },
        );
        claim.metadata.namespace = Some(namespace.into());
        AnyClaim::capi(&claim).expect("named and namespaced")
    }

    #[test]
    fn bare_preallocation_keys_name_only_the_pools_own_namespace() {
        let keys = BTreeMap::from([
            ("vip".to_string(), "10.0.0.5".to_string()),
            ("infra/api".to_string(), "10.0.0.6".to_string()),
            ("api".to_string(), "10.0.0.7".to_string()),
        ]);
        let owned = ObjectMeta {
            annotations: Some(BTreeMap::from([(
                PREALLOCATION_NAMESPACE_ANNOTATION.to_string(),
                "infra".to_string(),
            )])),
            ..Default::default()
        };
        let unowned = ObjectMeta::default();
        let cases = [
            (&owned, "infra", "vip", "vip"),
            (&owned, "tenant", "vip", "tenant/vip"),
            // A qualified key wins over a bare one.
            (&owned, "infra", "api", "infra/api"),
            (&owned, "tenant", "api", "tenant/api"),
            // Without the annotation no bare key names anybody.
            (&unowned, "infra", "vip", "infra/vip"),
            (&unowned, "tenant", "vip", "tenant/vip"),
        ];
        for (pool, namespace, name, key) in cases {
            assert_eq!(
                global_preallocation_key(pool, &keys, &claim(namespace, name)),
                key,
                "{namespace}/{name}"
            );
        }
    }
}
