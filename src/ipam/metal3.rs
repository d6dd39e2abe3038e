//! The Metal3 IPAM dialect: an IPPool serving Metal3 IPClaims and CAPI IPAddressClaims from one
//! address space (one ledger), with upstream's naming (`<namePrefix>-<address>`), finalizers,
//! `status.indexes` and error messages. Claims are told apart by UID, so a Metal3 claim and a
//! CAPI claim of the same name never collide.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ObjectMeta};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use super::Context;
use super::capi;
use super::dialect::{
    AddressKinds, FreshAddresses, PoolSpace, PoolStatus, PoolWrites, Report, cached_addresses,
    cached_claims,
};
use super::key::PoolKind;
use super::kinds::{AnyAddress, AnyClaim, ClaimKind, NewAddress};
use super::overlaps::Covered;
use super::spec;
use crate::alloc::{self, AddressSpace, Counts, Lease};
use crate::api::capi::Cluster;
use crate::api::labels;
use crate::api::metal3_ipam::{
    ADDRESS_FINALIZER, CAPI_ADDRESS_FINALIZER, CAPI_CLAIM_FINALIZER, CLAIM_FINALIZER, IPPool,
    IPPoolStatus, Metal3IPAddress, Metal3IPAddressSpec, POOL_FINALIZER, PROVIDER_LABEL_VALUE,
};
use crate::runtime::objects;

/// Upstream's address object name: `<namePrefix>-<address with . and : as ->`, without
/// trailing dashes (`p-fd00--1` for `fd00::1`).
pub fn address_name(name_prefix: &str, address: IpAddr) -> String {
    let text = address.to_string().replace(['.', ':'], "-");
    format!("{name_prefix}-{text}")
        .trim_end_matches('-')
        .to_string()
}

/// Why `name` (an address object name built from the pool's `namePrefix`) is not a valid
/// Kubernetes object name, if it is not.
fn name_problem(name_prefix: &str, name: &str) -> Option<String> {
    let why = if name.len() > 253 {
        format!("it is {} characters long, more than 253", name.len())
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    {
        "it may contain only lower-case letters, digits, '-' and '.'".to_string()
    } else if name
        .split('.')
        .any(|part| part.is_empty() || part.starts_with('-') || part.ends_with('-'))
    {
        "each '.'-separated part must start and end with a letter or digit".to_string()
    } else {
        return None;
    };
    Some(format!(
        "the IPPool's namePrefix {name_prefix:?} gives address object names such as {name:?}, which is not a valid name: {why}; shorten or fix spec.namePrefix"
    ))
}

/// An owner reference as upstream writes it on Metal3 IPAddresses: neither controller nor
/// blocking deletion.
fn plain_owner<K: Resource<DynamicType = ()>>(owner: &K) -> Option<OwnerReference> {
    Some(OwnerReference {
        controller: None,
        block_owner_deletion: None,
        ..objects::owner_reference(owner, false)?
    })
}

impl IPPool {
    fn cluster(&self, ctx: &Context) -> Option<std::sync::Arc<Cluster>> {
        let name = self
            .spec
            .cluster_name
            .as_deref()
            .filter(|n| !n.is_empty())?;
        ctx.clusters
            .as_ref()?
            .get(&ObjectRef::new(name).within(&self.namespace().unwrap_or_default()))
    }
}

impl PoolSpace for IPPool {
    const KIND: PoolKind = PoolKind::Metal3IPPool;

    const ADDRESS_KINDS: AddressKinds = AddressKinds::CapiAndMetal3;

    // `<namePrefix>-<address>`, as upstream names them.
    const OBJECTS_NAMED_AFTER_CLAIMS: bool = false;

    const FINALIZER: &'static str = POOL_FINALIZER;

    fn space(&self) -> Result<AddressSpace, String> {
        AddressSpace::metal3(&spec::metal3_pool(&self.spec)).map_err(|e| e.to_string())
    }

    /// A pool that proxies hands out its target's addresses, none of its own: it meets no
    /// pool, least of all its target (one address space by design).
    fn covered(&self) -> Option<Covered> {
        match self.proxies() {
            true => None,
            false => self.space().ok().map(|space| Covered::of_space(&space)),
        }
    }

    fn paused_by_cluster(&self, ctx: &Context) -> bool {
        self.cluster(ctx)
            .is_some_and(|c| objects::cluster_is_paused(&c))
    }

    fn claims(&self, ctx: &Context) -> Vec<AnyClaim> {
        let key = self.key();
        let mut claims = cached_claims(&ctx.ipclaims, &key);
        claims.extend(cached_claims(&ctx.claims, &key));
        claims
    }

    fn addresses(&self, ctx: &Context, fresh: Option<&FreshAddresses>) -> Vec<AnyAddress> {
        let key = self.key();
        match fresh {
            Some(fresh) => (fresh.metal3.iter().chain(&fresh.capi))
                .filter(|a| a.is_of(&key))
                .cloned()
                .collect(),
            None => {
                let mut all = cached_addresses(&ctx.metal3_addresses, &key);
                all.extend(cached_addresses(&ctx.addresses, &key));
                all
            }
        }
    }
}

impl PoolWrites for IPPool {
    fn api_for(&self, client: Client) -> Api<Self> {
        Api::namespaced(client, &self.namespace().unwrap_or_default())
    }

    /// A pool that names its Cluster carries the cluster-name and provider labels and is owned
    /// by the Cluster (so `clusterctl move` and deletion follow it), as upstream does.
    fn metadata_patch(&self, ctx: &Context) -> Option<serde_json::Value> {
        let cluster_name = self
            .spec
            .cluster_name
            .as_deref()
            .filter(|n| !n.is_empty())?;
        let labels = self.labels();
        let mut patch = serde_json::Map::new();
        if labels.get(labels::CLUSTER_NAME).map(String::as_str) != Some(cluster_name)
            || labels.get(labels::PROVIDER).map(String::as_str) != Some(PROVIDER_LABEL_VALUE)
        {
            patch.insert(
                "labels".into(),
                json!({ labels::CLUSTER_NAME: cluster_name, labels::PROVIDER: PROVIDER_LABEL_VALUE }),
            );
        }
        if let Some(owner) = self.cluster(ctx).and_then(|c| plain_owner(&*c)) {
            let mut owners = self.owner_references().to_vec();
            if !owners.iter().any(|o| o.uid == owner.uid) {
                owners.push(owner);
                patch.insert("ownerReferences".into(), json!(owners));
            }
        }
        (!patch.is_empty()).then(|| json!({ "metadata": patch }))
    }

    fn claim_finalizer(kind: ClaimKind) -> &'static str {
        match kind {
            ClaimKind::Metal3 => CLAIM_FINALIZER,
            ClaimKind::Capi => CAPI_CLAIM_FINALIZER,
        }
    }

    fn address_finalizer(kind: ClaimKind) -> &'static str {
        match kind {
            ClaimKind::Metal3 => ADDRESS_FINALIZER,
            ClaimKind::Capi => CAPI_ADDRESS_FINALIZER,
        }
    }

    fn address_name_problem(&self, _claim: &AnyClaim, family: alloc::Family) -> Option<String> {
        // The longest address text of the family names the longest object.
        let widest: IpAddr = match family {
            alloc::Family::V4 => std::net::Ipv4Addr::new(255, 255, 255, 255).into(),
            alloc::Family::V6 => "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
                .parse::<std::net::Ipv6Addr>()
                .map(IpAddr::from)
                .unwrap_or(IpAddr::from(std::net::Ipv6Addr::UNSPECIFIED)),
        };
        name_problem(
            &self.spec.name_prefix,
            &address_name(&self.spec.name_prefix, widest),
        )
    }

    fn new_address(&self, claim: &AnyClaim, lease: &Lease) -> Result<NewAddress, String> {
        let name = address_name(&self.spec.name_prefix, lease.address);
        if let Some(problem) = name_problem(&self.spec.name_prefix, &name) {
            return Err(problem);
        }
        let missing = || format!("{} has no UID or namespace yet", claim.describe());
        match claim.kind() {
            ClaimKind::Metal3 => metal3_address(
                self,
                claim,
                lease.address,
                i32::from(lease.prefix),
                lease.gateway.map(|g| g.to_string()),
                lease.dns_servers.iter().map(ToString::to_string).collect(),
            )
            .ok_or_else(missing),
            ClaimKind::Capi => {
                super::capi::capi_address(self, claim, lease, name, CAPI_ADDRESS_FINALIZER)
                    .ok_or_else(missing)
            }
        }
    }
}

impl PoolStatus for IPPool {
    const STATUS_NAMES_HOLDERS: bool = true;

    /// `status.indexes` (claim name → address) and `lastUpdated`, changed only when the
    /// allocations change. A CAPI claim named like a Metal3 claim of the pool is listed as
    /// `IPAddressClaim/<name>` instead of overwriting it (upstream keys by name alone).
    fn status_patch(&self, report: &Report) -> Option<serde_json::Value> {
        let metal3_names: std::collections::HashSet<&std::sync::Arc<str>> = report
            .holders
            .keys()
            .filter(|(kind, _)| *kind == ClaimKind::Metal3)
            .map(|(_, name)| name)
            .collect();
        let indexes: BTreeMap<String, String> = report
            .holders
            .iter()
            .map(|((kind, name), ip)| {
                let key = match kind {
                    ClaimKind::Capi if metal3_names.contains(name) => {
                        format!("IPAddressClaim/{name}")
                    }
                    _ => name.to_string(),
                };
                (key, ip.to_string())
            })
            .collect();
        let status = self.status.clone().unwrap_or_default();
        let mut next = status.clone();
        if let Some(usage) = report.usage {
            set_counts(&mut next, &usage.counts);
        }
        let show = |address: IpAddr| address.to_string();
        // Whether they changed shows in `next` against `status`, with the counts.
        capi::set_conditions(&mut next.conditions, report, self.meta().generation, &show);
        let indexes_written = status.indexes == indexes && status.last_updated.is_some();
        if indexes_written && next == status {
            return None;
        }
        let mut patch = if indexes_written {
            json!({ "status": {} })
        } else {
            // First write of an unchanged (empty) index: lastUpdated starts at the pool's creation.
            let last_updated = if status.indexes == indexes {
                self.meta()
                    .creation_timestamp
                    .clone()
                    .unwrap_or_else(objects::now)
            } else {
                objects::now()
            };
            objects::indexes_patch(&status.indexes, &indexes, last_updated)
        };
        patch["status"]["capacity"] = json!(next.capacity);
        patch["status"]["availableIPCount"] = json!(next.available_ip_count);
        patch["status"]["usedIPCount"] = json!(next.used_ip_count);
        patch["status"]["outOfRangeIPCount"] = json!(next.out_of_range_ip_count);
        patch["status"]["conditions"] = json!(next.conditions);
        Some(patch)
    }
}

/// A Metal3 pool's counts as its status carries them: capacity and what is free as upstream's
/// pull request #1540 has them (left out, not capped, past int64), what is held as bitpool adds.
fn set_counts(status: &mut IPPoolStatus, counts: &Counts) {
    let capacity = i64::try_from(counts.total).ok();
    status.capacity = capacity;
    status.available_ip_count = capacity.and_then(|_| i64::try_from(counts.free).ok());
    status.used_ip_count = Some(capi::saturate(counts.used));
    status.out_of_range_ip_count = Some(capi::saturate(counts.out_of_range));
}

/// A Metal3 IPAddress for `ipclaim` from `pool`, as upstream writes it: named
/// `<namePrefix>-<address>`, labels copied from the claim, owned by pool and claim.
pub(super) fn metal3_address(
    pool: &IPPool,
    ipclaim: &AnyClaim,
    address: IpAddr,
    prefix: i32,
    gateway: Option<String>,
    dns_servers: Vec<String>,
) -> Option<NewAddress> {
    let namespace = ipclaim.namespace();
    let reference = |name: String| ObjectReference {
        name: Some(name),
        namespace: Some(namespace.clone()),
        ..Default::default()
    };
    Some(NewAddress::Metal3(Box::new(Metal3IPAddress {
        metadata: ObjectMeta {
            name: Some(address_name(&pool.spec.name_prefix, address)),
            namespace: Some(namespace.clone()),
            finalizers: Some(vec![ADDRESS_FINALIZER.to_string()]),
            labels: ipclaim.labels(),
            owner_references: Some(vec![
                plain_owner(pool)?,
                OwnerReference {
                    controller: None,
                    block_owner_deletion: None,
                    ..ipclaim.owner_reference(false)?
                },
            ]),
            ..Default::default()
        },
        spec: Metal3IPAddressSpec {
            claim: reference(ipclaim.name()),
            pool: reference(pool.name_any()),
            address: address.to_string(),
            prefix: Some(prefix),
            gateway,
            dns_servers,
        },
    })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::metal3_ipam::IPPoolSpec;
    use crate::ipam::dialect::Usage;
    use crate::ipam::ledger::Ledger;
    use std::sync::Arc;

    type Holders = BTreeMap<(ClaimKind, Arc<str>), IpAddr>;

    fn usage(total: u128, used: u128, out_of_range: u128) -> Usage {
        Usage {
            counts: Counts {
                total,
                used,
                free: total - (used - out_of_range),
                out_of_range,
                reserved: 0,
            },
            outside: Vec::new(),
        }
    }

    fn status_after(
        pool: &IPPool,
        usage: Option<&Usage>,
        holders: &Holders,
    ) -> Option<IPPoolStatus> {
        let ledger = Ledger::default();
        let report = Report {
            usage,
            ledger: &ledger,
            spec_error: usage.is_none().then_some("spec.pools[0]: no address"),
            holders,
            shared: &[],
            overlaps: &[],
            reach: crate::ipam::tenancy::Reach::Everyone,
        };
        let patch = pool.status_patch(&report)?;
        let mut merged = serde_json::to_value(pool.status.clone().unwrap_or_default())
            .expect("a status serializes");
        json_patch::merge(&mut merged, &patch["status"]);
        Some(serde_json::from_value(merged).expect("the patched status reads back"))
    }

    /// Counts as metal3 ip-address-manager's pull request #1540 names them (capacity and what
    /// is free, left out past int64), bitpool's used and out-of-range counts, and Ready; written
    /// once, then nothing while nothing changes.
    #[test]
    fn status_counts_and_ready_follow_the_pool() {
        let mut pool = IPPool::new("p", IPPoolSpec::default());
        let holders = Holders::from([(
            (ClaimKind::Metal3, Arc::from("c1")),
            "10.0.0.2".parse().expect("an address"),
        )]);
        let small = usage(254, 2, 1);
        let status = status_after(&pool, Some(&small), &holders).expect("a first status");
        assert_eq!(status.capacity, Some(254));
        assert_eq!(status.available_ip_count, Some(253));
        assert_eq!(status.used_ip_count, Some(2));
        assert_eq!(status.out_of_range_ip_count, Some(1));
        assert_eq!(
            status.indexes.get("c1").map(String::as_str),
            Some("10.0.0.2")
        );
        let ready = &status.conditions[0];
        assert_eq!(
            (ready.type_.as_str(), ready.status.as_str()),
            ("Ready", "True")
        );
        assert_eq!(ready.reason, "AddressesOutOfRange");
        pool.status = Some(status);
        assert!(
            status_after(&pool, Some(&small), &holders).is_none(),
            "a pool at rest is written again"
        );

        let vast = usage(1 << 64, 1, 0);
        let status = status_after(&pool, Some(&vast), &holders).expect("new counts");
        assert_eq!((status.capacity, status.available_ip_count), (None, None));
        assert_eq!(status.used_ip_count, Some(1));
        pool.status = Some(status);

        let status = status_after(&pool, None, &holders).expect("an invalid spec is reported");
        let ready = &status.conditions[0];
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "InvalidSpec")
        );
        assert!(ready.message.contains("spec.pools[0]"), "{}", ready.message);
        assert_eq!(
            status.used_ip_count,
            Some(1),
            "counts are kept while the spec is invalid"
        );
    }

    #[test]
    fn invalid_address_names_are_explained() {
        let ip = |s: &str| s.parse::<IpAddr>().expect("test address");
        let long = "p".repeat(250);
        let problem = name_problem(&long, &address_name(&long, ip("10.0.0.1"))).expect("too long");
        assert!(problem.contains("more than 253") && problem.contains("namePrefix"));
        assert!(name_problem("Upper", "Upper-10-0-0-1").is_some());
        assert!(name_problem("ok.prefix", "ok.prefix-10-0-0-1").is_none());
    }

    #[test]
    fn address_names_follow_upstream() {
        let ip = |s: &str| s.parse::<IpAddr>().expect("test address");
        assert_eq!(
            address_name("test1-prov", ip("192.168.0.13")),
            "test1-prov-192-168-0-13"
        );
        assert_eq!(address_name("p", ip("fd00::1")), "p-fd00--1");
        assert_eq!(address_name("p", ip("fd00::")), "p-fd00");
    }
}
