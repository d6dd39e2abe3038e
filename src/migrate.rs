//! `bitpool migrate`: from Metal3 IPPools to InClusterIPPools without changing any address.
//!
//! Each Metal3 IPPool becomes an InClusterIPPool of the same name and namespace whose
//! `preAllocations` pin every allocated address to the name of the claim that holds it (and keep
//! the pool's own preallocations). Claims re-created against the new pool under the same names
//! — BareMetalHost-name based claim names (`<bmh>-<pool>`) are stable across re-provisioning —
//! get the same addresses, so no node rolls and no address changes. [`check`] proves it by
//! building the new pool's address space and asking it.

use std::collections::BTreeMap;
use std::net::IpAddr;

use kube::api::ObjectMeta;
use kube::{Resource, ResourceExt};

use crate::alloc::pool::LeaseParams;
use crate::alloc::{self, AddressSpace, Layout};
use crate::api::capi_pools::{
    InClusterIPPool, InClusterIPPoolSpec, MIGRATED_FROM_ANNOTATION, PoolSubnet,
};
use crate::api::labels;
use crate::api::metal3_ipam::{IPPool, Metal3IPAddress};
use crate::ipam::spec;

/// Why a pool cannot be migrated as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigrateError {
    #[error("IPPool {pool}: {source}")]
    InvalidPool {
        pool: String,
        #[source]
        source: alloc::SpecError,
    },
    #[error(
        "IPPool {pool}: entries in subnet {subnet} use different prefixes, gateways or DNS servers ({details}); an InClusterIPPool subnet has one of each, so split the pool first"
    )]
    MixedParameters {
        pool: String,
        subnet: String,
        details: String,
    },
    #[error(
        "IPPool {pool}: entry {index} spans more than its subnet {subnet}; an InClusterIPPool subnet holds its addresses, so shorten the entry first"
    )]
    WiderThanSubnet {
        pool: String,
        index: usize,
        subnet: String,
    },
    #[error("IPPool {pool}: entry {index} is open-ended (start only); give it an end or a subnet")]
    OpenEnded { pool: String, index: usize },
    #[error("IPPool {pool}: claim {claim} holds {address}, which is not a valid address")]
    BadAddress {
        pool: String,
        claim: String,
        address: String,
    },
    #[error("IPPool {pool}: claim {claim} holds both {first} and {second}")]
    TwoAddresses {
        pool: String,
        claim: String,
        first: String,
        second: String,
    },
}

/// One Metal3 pool's migration: the InClusterIPPool to create and what it pins.
#[derive(Debug, Clone)]
pub struct Migration {
    pub source: String,
    pub pool: InClusterIPPool,
    /// Claim name → address it has today (and will get from the new pool).
    pub pinned: BTreeMap<String, IpAddr>,
}

fn pool_key(pool: &IPPool) -> String {
    format!(
        "{}/{}",
        pool.namespace().unwrap_or_default(),
        pool.name_any()
    )
}

/// Entries that give no end and no subnet: an InClusterIPPool lists its addresses.
fn refuse_open_ended(pool: &IPPool) -> Result<(), MigrateError> {
    match pool
        .spec
        .pools
        .iter()
        .position(|e| e.end.is_none() && e.subnet.is_none())
    {
        Some(index) => Err(MigrateError::OpenEnded {
            pool: pool_key(pool),
            index,
        }),
        None => Ok(()),
    }
}

/// The Metal3 entries (by index) that become one InClusterIPPool subnet: the same subnet
/// (`<lowest address>/<prefix>`), prefix, gateway and DNS servers.
#[derive(Debug, Clone, PartialEq)]
struct SubnetGroup {
    bounds: (u128, u128),
    params: LeaseParams,
    entries: Vec<usize>,
}

/// The pool's entries grouped into subnets, in declaration order (the first becomes the
/// InClusterIPPool's own `addresses`, the rest its `subnets`).
fn subnet_groups(layout: &Layout, key: &str) -> Result<Vec<SubnetGroup>, MigrateError> {
    let family = layout.family;
    let mut groups: Vec<SubnetGroup> = Vec::new();
    for (index, params) in layout.params.iter().enumerate() {
        let mut segments = layout.segments.iter().filter(|s| s.params == index);
        let Some(lowest) = segments.clone().map(|s| s.first).min() else {
            continue; // every address of it is listed by an earlier entry
        };
        let bounds = family.subnet_bounds(lowest, params.prefix);
        let subnet = format!("{}/{}", family.address(bounds.0), params.prefix);
        if segments.any(|s| s.last > bounds.1) {
            return Err(MigrateError::WiderThanSubnet {
                pool: key.to_string(),
                index,
                subnet,
            });
        }
        let met = groups
            .iter_mut()
            .find(|g| g.bounds.0 <= bounds.1 && bounds.0 <= g.bounds.1);
        match met {
            Some(group) if group.bounds == bounds && group.params == *params => {
                group.entries.push(index)
            }
            Some(group) => {
                let show = |p: &LeaseParams| {
                    let via = p.gateway.map_or("none".to_string(), |g| g.to_string());
                    let dns: Vec<String> = p.dns_servers.iter().map(ToString::to_string).collect();
                    format!("/{} via {via}, DNS [{}]", p.prefix, dns.join(" "))
                };
                return Err(MigrateError::MixedParameters {
                    pool: key.to_string(),
                    subnet,
                    details: format!("{}; {}", show(&group.params), show(params)),
                });
            }
            None => groups.push(SubnetGroup {
                bounds,
                params: params.clone(),
                entries: vec![index],
            }),
        }
    }
    Ok(groups)
}

/// A subnet's `addresses`: its entries' segments, in order, adjacent ones written as one range.
fn group_ranges(layout: &Layout, group: &SubnetGroup) -> Vec<String> {
    let family = layout.family;
    let mut out = Vec::new();
    for index in &group.entries {
        let mut runs: Vec<(u128, u128)> = Vec::new();
        for segment in layout.segments.iter().filter(|s| s.params == *index) {
            match runs.last_mut() {
                Some((_, last)) if last.checked_add(1) == Some(segment.first) => {
                    *last = segment.last
                }
                _ => runs.push((segment.first, segment.last)),
            }
        }
        out.extend(runs.into_iter().map(|(first, last)| match first == last {
            true => family.address(first).to_string(),
            false => format!("{}-{}", family.address(first), family.address(last)),
        }));
    }
    out
}

fn strings(addresses: &[IpAddr]) -> Vec<String> {
    addresses.iter().map(ToString::to_string).collect()
}

/// Plans the migration of `pool` whose allocated addresses are `addresses` (Metal3 IPAddress
/// objects; those of other pools are ignored).
pub fn plan(pool: &IPPool, addresses: &[Metal3IPAddress]) -> Result<Migration, MigrateError> {
    let key = pool_key(pool);
    let layout =
        spec::metal3_pool(&pool.spec)
            .layout()
            .map_err(|source| MigrateError::InvalidPool {
                pool: key.clone(),
                source,
            })?;
    refuse_open_ended(pool)?;
    let groups = subnet_groups(&layout, &key)?;
    let Some((own, more)) = groups.split_first() else {
        return Err(MigrateError::InvalidPool {
            pool: key,
            source: alloc::SpecError::NoAddresses,
        });
    };
    let pinned = pinned_addresses(pool, addresses, &key)?;
    let mut meta = ObjectMeta {
        name: Some(pool.name_any()),
        namespace: pool.namespace(),
        ..Default::default()
    };
    if let Some(cluster) = pool.spec.cluster_name.as_ref().filter(|c| !c.is_empty()) {
        meta.labels = Some(BTreeMap::from([(
            labels::CLUSTER_NAME.to_string(),
            cluster.clone(),
        )]));
    }
    let subnets = more
        .iter()
        .map(|group| PoolSubnet {
            addresses: group_ranges(&layout, group),
            prefix: i32::from(group.params.prefix),
            gateway: group.params.gateway.map(|g| g.to_string()),
            // The pool's own servers serve a subnet that lists none.
            dns_servers: match group.params.dns_servers == own.params.dns_servers {
                true => Vec::new(),
                false => strings(&group.params.dns_servers),
            },
        })
        .collect();
    let new_pool = InClusterIPPool {
        metadata: meta,
        spec: InClusterIPPoolSpec {
            addresses: group_ranges(&layout, own),
            prefix: i32::from(own.params.prefix),
            gateway: own.params.gateway.map(|g| g.to_string()),
            // Metal3 hands out a subnet's network-adjacent and broadcast addresses: keep them.
            allocate_reserved_ip_addresses: true,
            pre_allocations: pinned
                .iter()
                .map(|(c, a)| (c.clone(), a.to_string()))
                .collect(),
            allocation_strategy: pool.spec.allocation_strategy,
            dns_servers: strings(&own.params.dns_servers),
            subnets,
            ..Default::default()
        },
        status: None,
    };
    Ok(Migration {
        source: key,
        pool: new_pool,
        pinned,
    })
}

/// Every claim's address, pinned in the new pool's preAllocations: the pool's own
/// preAllocations, then the addresses its IPAddress objects hold (one per claim).
fn pinned_addresses(
    pool: &IPPool,
    addresses: &[Metal3IPAddress],
    key: &str,
) -> Result<BTreeMap<String, IpAddr>, MigrateError> {
    let mut pinned: BTreeMap<String, IpAddr> = BTreeMap::new();
    for (claim, text) in &pool.spec.pre_allocations {
        if let Some(address) = alloc::family::parse_address(text) {
            pinned.insert(claim.clone(), address);
        }
    }
    let namespace = pool.namespace().unwrap_or_default();
    for address in addresses {
        let same_pool = address.spec.pool.name.as_deref() == Some(pool.name_any().as_str())
            && address.namespace().unwrap_or_default() == namespace;
        if !same_pool {
            continue;
        }
        let claim = address.spec.claim.name.clone().unwrap_or_default();
        let parsed = alloc::family::parse_address(&address.spec.address).ok_or_else(|| {
            MigrateError::BadAddress {
                pool: key.to_string(),
                claim: claim.clone(),
                address: address.spec.address.clone(),
            }
        })?;
        if let Some(previous) = pinned.insert(claim.clone(), parsed)
            && previous != parsed
            && !pool.spec.pre_allocations.contains_key(&claim)
        {
            return Err(MigrateError::TwoAddresses {
                pool: key.to_string(),
                claim,
                first: previous.to_string(),
                second: parsed.to_string(),
            });
        }
    }
    Ok(pinned)
}

/// A claim whose address would change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub claim: String,
    pub today: IpAddr,
    pub after: String,
}

/// Proves the migration keeps every address: builds the new pool's address space and lets
/// each pinned claim allocate, as it will after migration.
pub fn check(migration: &Migration) -> Vec<Change> {
    let space = AddressSpace::capi(&spec::capi_pool(&migration.pool.spec));
    let mut space = match space {
        Ok(space) => space,
        Err(e) => {
            return migration
                .pinned
                .iter()
                .map(|(claim, today)| Change {
                    claim: claim.clone(),
                    today: *today,
                    after: format!("no address: the new pool is invalid ({e})"),
                })
                .collect();
        }
    };
    let mut rng = rand::rng();
    let mut changes = Vec::new();
    for (claim, today) in &migration.pinned {
        let after = match space.allocate(claim, None, &mut rng) {
            Ok(lease) if lease.address == *today => continue,
            Ok(lease) => lease.address.to_string(),
            Err(e) => format!("no address: {e}"),
        };
        changes.push(Change {
            claim: claim.clone(),
            today: *today,
            after,
        });
    }
    changes
}

/// The manifests of `migrations` as one YAML stream, in a stable order.
pub fn to_yaml(migrations: &[Migration]) -> Result<String, serde_saphyr::SerializeError> {
    let mut out = String::new();
    for migration in migrations {
        let mut pool = migration.pool.clone();
        pool.meta_mut().annotations = Some(BTreeMap::from([(
            MIGRATED_FROM_ANNOTATION.to_string(),
            format!("IPPool.ipam.metal3.io {}", migration.source),
        )]));
        let mut value = serde_json::to_value(&pool).unwrap_or_default();
        if let Some(object) = value.as_object_mut() {
            object.remove("status");
        }
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&value)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::metal3_ipam::{IPPoolSpec, Metal3IPAddressSpec, Metal3PoolRange};
    use k8s_openapi::api::core::v1::ObjectReference;

    fn pool(ranges: Vec<Metal3PoolRange>) -> IPPool {
        let mut pool = IPPool::new(
            "provisioning",
            IPPoolSpec {
                name_prefix: "prov".into(),
                pools: ranges,
                prefix: Some(24),
                gateway: Some("192.168.0.1".into()),
                dns_servers: vec!["8.8.8.8".into()],
                cluster_name: Some("test1".into()),
                ..Default::default()
            },
        );
        pool.metadata.namespace = Some("metal3".into());
        pool
    }

    fn range(start: &str, end: &str) -> Metal3PoolRange {
        Metal3PoolRange {
            start: Some(start.into()),
            end: Some(end.into()),
            ..Default::default()
        }
    }

    fn address(claim: &str, ip: &str) -> Metal3IPAddress {
        let mut a = Metal3IPAddress::new(
            &format!("prov-{}", ip.replace('.', "-")),
            Metal3IPAddressSpec {
                claim: ObjectReference {
                    name: Some(claim.into()),
                    ..Default::default()
                },
                pool: ObjectReference {
                    name: Some("provisioning".into()),
                    ..Default::default()
                },
                address: ip.into(),
                ..Default::default()
            },
        );
        a.metadata.namespace = Some("metal3".into());
        a
    }

    #[test]
    fn every_allocation_is_pinned_and_the_check_finds_no_change() {
        let pool = pool(vec![
            range("192.168.0.20", "192.168.0.30"),
            range("192.168.0.10", "192.168.0.15"),
        ]);
        let allocations: Vec<_> = (0..8)
            .map(|i| {
                address(
                    &format!("node-{i}-provisioning"),
                    &format!("192.168.0.{}", 20 + i),
                )
            })
            .chain(
                [address("other-pool-claim", "10.0.0.1")]
                    .into_iter()
                    .map(|mut a| {
                        a.spec.pool.name = Some("elsewhere".into());
                        a
                    }),
            )
            .collect();
        let migration = plan(&pool, &allocations).expect("migratable");
        assert_eq!(
            migration.pinned.len(),
            8,
            "the other pool's address is not pinned"
        );
        let spec = &migration.pool.spec;
        assert_eq!(
            spec.addresses,
            ["192.168.0.20-192.168.0.30", "192.168.0.10-192.168.0.15"]
        );
        assert_eq!(
            (spec.prefix, spec.gateway.as_deref()),
            (24, Some("192.168.0.1"))
        );
        assert_eq!(spec.dns_servers, ["8.8.8.8"]);
        assert_eq!(spec.pre_allocations["node-3-provisioning"], "192.168.0.23");
        assert_eq!(
            migration.pool.metadata.name.as_deref(),
            Some("provisioning")
        );
        assert_eq!(migration.pool.metadata.namespace.as_deref(), Some("metal3"));
        assert!(check(&migration).is_empty());
        let yaml = to_yaml(&[migration]).expect("renders");
        assert!(
            yaml.contains("kind: InClusterIPPool")
                && yaml.contains("node-7-provisioning: \"192.168.0.27\""),
            "{yaml}"
        );
        assert!(!yaml.contains("status"));
    }

    #[test]
    fn the_check_reports_an_address_the_new_pool_cannot_give() {
        // Upstream Metal3 hands out the gateway when it lies in a range; an InClusterIPPool never
        // does, so that allocation cannot be kept and the check must say so.
        let pool = pool(vec![range("192.168.0.1", "192.168.0.5")]);
        let migration = plan(&pool, &[address("gw-holder", "192.168.0.1")]).expect("plans");
        let changes = check(&migration);
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].claim, "gw-holder");
        assert!(
            changes[0].after.contains("no address"),
            "{}",
            changes[0].after
        );
    }

    /// Three racks, each its own /24 with its own gateway (one with its own DNS servers): one
    /// InClusterIPPool of three subnets, every allocation kept.
    #[test]
    fn a_pool_of_several_subnets_becomes_one_pool_of_as_many_subnets() {
        let mut racks = pool(vec![
            range("192.168.0.10", "192.168.0.20"),
            range("192.168.1.10", "192.168.1.20"),
            range("192.168.0.30", "192.168.0.40"),
            range("192.168.2.10", "192.168.2.20"),
        ]);
        racks.spec.pools[1].gateway = Some("192.168.1.1".into());
        racks.spec.pools[3].gateway = Some("192.168.2.1".into());
        racks.spec.pools[3].prefix = Some(25);
        racks.spec.pools[3].dns_servers = vec!["192.168.2.53".into()];
        let held = [
            ("rack0-a", "192.168.0.10"),
            ("rack0-b", "192.168.0.35"),
            ("rack1-a", "192.168.1.10"),
            ("rack1-b", "192.168.1.20"),
            ("rack2-a", "192.168.2.15"),
        ];
        let allocations: Vec<_> = held.iter().map(|(c, a)| address(c, a)).collect();
        let migration = plan(&racks, &allocations).expect("migratable");
        let spec = &migration.pool.spec;
        assert_eq!(
            spec.addresses,
            ["192.168.0.10-192.168.0.20", "192.168.0.30-192.168.0.40"]
        );
        assert_eq!(
            (spec.prefix, spec.gateway.as_deref()),
            (24, Some("192.168.0.1"))
        );
        assert_eq!(spec.dns_servers, ["8.8.8.8"]);
        assert_eq!(
            spec.subnets,
            [
                PoolSubnet {
                    addresses: vec!["192.168.1.10-192.168.1.20".into()],
                    prefix: 24,
                    gateway: Some("192.168.1.1".into()),
                    dns_servers: Vec::new(),
                },
                PoolSubnet {
                    addresses: vec!["192.168.2.10-192.168.2.20".into()],
                    prefix: 25,
                    gateway: Some("192.168.2.1".into()),
                    dns_servers: vec!["192.168.2.53".into()],
                },
            ]
        );
        assert_eq!(migration.pinned.len(), held.len());
        assert_eq!(check(&migration), Vec::new(), "no address changes");
        // Each address comes with its own subnet's prefix and gateway.
        let mut space = AddressSpace::capi(&spec::capi_pool(spec)).expect("a valid pool");
        let lease = space
            .allocate("rack2-a", None, &mut rand::rng())
            .expect("its pinned address");
        assert_eq!(lease.address.to_string(), "192.168.2.15");
        assert_eq!(
            (lease.prefix, lease.gateway.map(|g| g.to_string())),
            (25, Some("192.168.2.1".into()))
        );
        assert_eq!(spec.dns_servers_for("192.168.2.15"), ["192.168.2.53"]);
        assert_eq!(spec.dns_servers_for("192.168.1.15"), ["8.8.8.8"]);
    }

    #[test]
    fn pools_that_cannot_be_expressed_are_refused_with_a_reason() {
        let mut mixed = pool(vec![
            range("192.168.0.10", "192.168.0.20"),
            range("192.168.0.30", "192.168.0.40"),
        ]);
        mixed.spec.pools[1].gateway = Some("192.168.0.254".into());
        let err = plan(&mixed, &[]);
        assert!(
            matches!(&err, Err(MigrateError::MixedParameters { subnet, .. }) if subnet == "192.168.0.0/24"),
            "{err:?}"
        );
        let wide = pool(vec![range("192.168.0.10", "192.168.1.20")]);
        assert!(matches!(
            plan(&wide, &[]),
            Err(MigrateError::WiderThanSubnet { index: 0, .. })
        ));
        let open = pool(vec![Metal3PoolRange {
            start: Some("192.168.0.10".into()),
            ..Default::default()
        }]);
        assert!(matches!(
            plan(&open, &[]),
            Err(MigrateError::OpenEnded { index: 0, .. })
        ));
        let twice = pool(vec![range("192.168.0.10", "192.168.0.20")]);
        let err = plan(
            &twice,
            &[address("a", "192.168.0.10"), address("a", "192.168.0.11")],
        );
        assert!(matches!(err, Err(MigrateError::TwoAddresses { .. })));
    }
}
