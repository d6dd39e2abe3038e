//! The prefix pools' dialect: InClusterPrefixPool and GlobalInClusterPrefixPool hand each
//! IPAddressClaim a whole sub-prefix, written as an IPAddress whose `address` is the sub-prefix's
//! network address and `prefix` its length, as the in-cluster provider does.
//!
//! The pool's space numbers sub-prefixes ([`alloc::Numbering`]); this dialect converts at the
//! edge: an IPAddress is held as the number of the sub-prefix containing its address, a lease
//! becomes the sub-prefix's network address, and messages name sub-prefixes.

use std::net::IpAddr;

use kube::api::Api;
use kube::{Client, Resource, ResourceExt};

use super::capi::{capi_address, global_preallocation_key, status_patch};
use super::dialect::{PoolSpace, PoolStatus, PoolWrites, Report};
use super::key::PoolKind;
use super::kinds::{AnyAddress, AnyClaim, NewAddress};
use super::ledger::intent::Refusal;
use super::overlaps::Covered;
use crate::alloc::{self, AddressSpace, AllocError, Family, Lease, Numbering};
use crate::api::capi_pools::{
    ADDRESS_FINALIZER, GlobalInClusterPrefixPool, InClusterIPPoolStatus, InClusterPrefixPool,
    InClusterPrefixPoolSpec,
};

/// The allocation length, defaulted as upstream does (asked once per address object: no copy of
/// the spec).
fn allocation_length(spec: &InClusterPrefixPoolSpec) -> i64 {
    alloc::prefix::effective_length(i64::from(spec.allocation_prefix_length))
}

/// The numbering of `family`'s sub-prefixes at the spec's allocation length. It is known even
/// for an invalid spec (the length clamped to the family), so that the sub-prefixes held by
/// address objects are never lost from sight while the spec is being fixed.
fn numbering(spec: &InClusterPrefixPoolSpec, family: Family) -> Numbering {
    let length = allocation_length(spec).clamp(1, i64::from(family.bits()));
    Numbering {
        family,
        length: u8::try_from(length).unwrap_or(family.bits()),
    }
}

/// `network/length` of sub-prefix `number`.
fn show(spec: &InClusterPrefixPoolSpec, number: IpAddr) -> String {
    numbering(spec, Family::of(number)).sub_prefix(number)
}

/// A claim's `ipAddress` annotation as a sub-prefix number: `network/length` or the bare
/// network address, of the pool's allocation length.
fn requested(spec: &InClusterPrefixPoolSpec, text: &str) -> Result<String, AllocError> {
    let address = text.split_once('/').map_or(text, |(address, _)| address);
    let family = alloc::parse_address(address).map(Family::of);
    let numbering = numbering(spec, family.unwrap_or(Family::V6));
    family
        .and_then(|_| numbering.parse(text))
        .map(|number| number.to_string())
        .ok_or_else(|| AllocError::RequestedNotASubPrefix {
            value: text.to_string(),
            length: numbering.length,
        })
}

/// A refusal naming sub-prefixes by their network addresses instead of their numbers.
fn explain(spec: &InClusterPrefixPoolSpec, refusal: Refusal) -> Refusal {
    match refusal {
        Refusal::Alloc(error) => Refusal::Alloc(
            error.map_addresses(|number| numbering(spec, Family::of(number)).network(number)),
        ),
        other => other,
    }
}

/// The spec and status both prefix pool kinds share.
trait PrefixPool: Resource<DynamicType = ()> {
    fn pool_spec(&self) -> &InClusterPrefixPoolSpec;
    fn pool_status(&self) -> Option<&InClusterIPPoolStatus>;
}

impl PrefixPool for InClusterPrefixPool {
    fn pool_spec(&self) -> &InClusterPrefixPoolSpec {
        &self.spec
    }
    fn pool_status(&self) -> Option<&InClusterIPPoolStatus> {
        self.status.as_ref()
    }
}

impl PrefixPool for GlobalInClusterPrefixPool {
    fn pool_spec(&self) -> &InClusterPrefixPoolSpec {
        &self.spec.pool
    }
    fn pool_status(&self) -> Option<&InClusterIPPoolStatus> {
        self.status.as_ref()
    }
}

/// The parts of [`PoolDialect`] both prefix pool kinds share.
macro_rules! prefix_dialect {
    (space) => {
        /// Sub-prefix numbers mean something only at one length: a ledger written at another
        /// (the length changed without the webhook) is rebuilt from the address objects.
        fn ledger_identity(&self) -> String {
            format!(
                "{}/{}",
                self.uid().unwrap_or_default(),
                allocation_length(self.pool_spec())
            )
        }

        fn space(&self) -> Result<AddressSpace, String> {
            $crate::ipam::spec::prefix_pool(self.pool_spec())
                .space()
                .map(|(space, _)| space)
                .map_err(|e| e.to_string())
        }

        /// The addresses its sub-prefixes cover.
        fn covered(&self) -> Option<Covered> {
            let (space, numbering) = $crate::ipam::spec::prefix_pool(self.pool_spec())
                .space()
                .ok()?;
            Some(Covered {
                family: space.family(),
                ranges: space
                    .segments()
                    .map(|s| numbering.address_bounds(s.first, s.last))
                    .collect(),
            })
        }

        fn held(&self, address: &AnyAddress) -> Option<IpAddr> {
            let ip = address.ip()?;
            Some(numbering(self.pool_spec(), Family::of(ip)).containing(ip))
        }

        fn show(&self, held: IpAddr) -> String {
            show(self.pool_spec(), held)
        }

        fn requested(&self, claim: &AnyClaim) -> Result<Option<String>, AllocError> {
            claim
                .requested()
                .map(|text| requested(self.pool_spec(), &text))
                .transpose()
        }

        fn explain(&self, refusal: Refusal) -> Refusal {
            explain(self.pool_spec(), refusal)
        }
    };
    (writes) => {
        /// The sub-prefix's network address and length, and the pool's gateway as written.
        fn new_address(&self, claim: &AnyClaim, lease: &Lease) -> Result<NewAddress, String> {
            let numbering = numbering(self.pool_spec(), Family::of(lease.address));
            let network = Lease {
                address: numbering.network(lease.address),
                ..lease.clone()
            };
            let mut object = capi_address(self, claim, &network, claim.name(), ADDRESS_FINALIZER)
                .ok_or_else(|| format!("{} has no UID yet", claim.describe()))?;
            if let NewAddress::Capi(address) = &mut object {
                address.spec.gateway = self.pool_spec().gateway.clone().filter(|g| !g.is_empty());
            }
            Ok(object)
        }
    };
    (status) => {
        fn status_patch(&self, report: &Report) -> Option<serde_json::Value> {
            let spec = self.pool_spec();
            status_patch(self.pool_status(), self.meta().generation, report, |held| {
                show(spec, held)
            })
        }
    };
}

impl PoolSpace for InClusterPrefixPool {
    const KIND: PoolKind = PoolKind::InClusterPrefixPool;

    prefix_dialect!(space);
}

impl PoolWrites for InClusterPrefixPool {
    prefix_dialect!(writes);

    fn api_for(&self, client: Client) -> Api<Self> {
        Api::namespaced(client, &self.namespace().unwrap_or_default())
    }
}

impl PoolStatus for InClusterPrefixPool {
    prefix_dialect!(status);
}

impl PoolSpace for GlobalInClusterPrefixPool {
    const KIND: PoolKind = PoolKind::GlobalInClusterPrefixPool;

    prefix_dialect!(space);

    /// As for GlobalInClusterIPPool.
    fn preallocation_key(&self, claim: &AnyClaim) -> String {
        global_preallocation_key(self.meta(), &self.spec.pool.pre_allocations, claim)
    }

    fn tenancy(&self) -> Result<super::tenancy::Tenancy, String> {
        super::tenancy::Tenancy::of(self.spec.namespace_selector.as_ref())
    }
}

impl PoolWrites for GlobalInClusterPrefixPool {
    prefix_dialect!(writes);

    fn api_for(&self, client: Client) -> Api<Self> {
        Api::all(client)
    }
}

impl PoolStatus for GlobalInClusterPrefixPool {
    prefix_dialect!(status);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(length: i32) -> InClusterPrefixPoolSpec {
        InClusterPrefixPoolSpec {
            prefixes: vec!["fd00::/48".into()],
            allocation_prefix_length: length,
            ..Default::default()
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("an address")
    }

    #[test]
    fn a_requested_prefix_is_read_with_or_without_its_length() {
        let spec = spec(64);
        let fifth = numbering(&spec, Family::V6)
            .parse("fd00:0:0:5::/64")
            .expect("sub-prefix")
            .to_string();
        assert_eq!(requested(&spec, "fd00:0:0:5::/64"), Ok(fifth.clone()));
        assert_eq!(requested(&spec, "fd00:0:0:5::"), Ok(fifth));
        for wrong in [
            "fd00:0:0:5::/60",
            "fd00:0:0:5::1",
            "fd00:0:0:5::1/64",
            "nonsense",
            "",
        ] {
            assert_eq!(
                requested(&spec, wrong),
                Err(AllocError::RequestedNotASubPrefix {
                    value: wrong.into(),
                    length: 64
                }),
                "{wrong}"
            );
        }
    }

    #[test]
    fn messages_name_sub_prefixes_not_numbers() {
        let spec = spec(64);
        let number = numbering(&spec, Family::V6)
            .parse("fd00:0:0:5::/64")
            .expect("sub-prefix");
        assert_eq!(show(&spec, number), "fd00:0:0:5::/64");
        let refusal = Refusal::Alloc(AllocError::RequestedInUse { address: number });
        assert_eq!(
            explain(&spec, refusal),
            Refusal::Alloc(AllocError::RequestedInUse {
                address: ip("fd00:0:0:5::")
            })
        );
    }

    #[test]
    fn an_invalid_length_still_numbers_what_objects_hold() {
        // 200 is refused by the schema and the webhook; the numbering stays usable.
        assert_eq!(numbering(&spec(200), Family::V4).length, 32);
        assert_eq!(numbering(&spec(0), Family::V6).length, 64);
    }
}
