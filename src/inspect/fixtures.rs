//! Snapshots built by hand for the operator commands' tests: pools, claims, address objects
//! and ledgers as the API server would return them.

use std::net::IpAddr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;

use super::snapshot::{AnyPool, Snapshot, StoredLedger};
use crate::api::capi::{
    self, IPAddress, IPAddressClaim, IPAddressClaimSpec, IPAddressClaimStatus, IPAddressSpec,
    IPPoolReference, LocalObjectName,
};
use crate::api::capi_pools::{InClusterIPPool, InClusterIPPoolSpec};
use crate::ipam::ledger::Ledger;

/// The namespace of the fixtures' claims.
pub const NS: &str = "tenant";
/// The time the fixtures are read at.
pub const NOW: &str = "2026-12-04T12:00:00Z";

/// A reference to the CAPI pool `pool` of `kind`.
pub fn reference(kind: &str, pool: &str) -> IPPoolReference {
    IPPoolReference {
        api_group: capi::GROUP.into(),
        kind: kind.into(),
        name: pool.into(),
    }
}

/// An InClusterIPPool in [`NS`] with `addresses`, each given `prefix`.
pub fn capi_pool(name: &str, addresses: &[&str], prefix: i32) -> AnyPool {
    let mut pool = InClusterIPPool::new(
        name,
        InClusterIPPoolSpec {
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            prefix,
            ..Default::default()
        },
    );
    pool.metadata.namespace = Some(NS.into());
    pool.metadata.uid = Some(format!("uid-pool-{name}"));
    AnyPool::InCluster(pool)
}

/// A claim in [`NS`] of the InClusterIPPool `pool`, not yet served.
pub fn claim(name: &str, pool: &str) -> IPAddressClaim {
    let mut claim = IPAddressClaim::new(
        name,
        IPAddressClaimSpec {
            cluster_name: None,
            pool_ref: reference("InClusterIPPool", pool),
        },
    );
    claim.metadata.namespace = Some(NS.into());
    claim.metadata.uid = Some(format!("uid-claim-{name}"));
    claim
}

/// `claim` with its Ready condition and address reference as bitpool writes them.
pub fn served(mut claim: IPAddressClaim, address_name: &str) -> IPAddressClaim {
    claim.status = Some(IPAddressClaimStatus {
        conditions: vec![Condition {
            type_: capi::READY_CONDITION.into(),
            status: "True".into(),
            reason: "AddressAllocated".into(),
            message: String::new(),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }],
        address_ref: Some(LocalObjectName {
            name: address_name.into(),
        }),
        deprecated: None,
    });
    claim
}

/// The IPAddress named `name` holding `address` of `pool` for `claim` (owned by it).
pub fn address(name: &str, pool: &str, claim: &str, address: &str) -> IPAddress {
    let mut object = IPAddress::new(
        name,
        IPAddressSpec {
            claim_ref: LocalObjectName { name: claim.into() },
            pool_ref: reference("InClusterIPPool", pool),
            address: address.into(),
            prefix: 24,
            gateway: None,
        },
    );
    object.metadata.namespace = Some(NS.into());
    object.metadata.uid = Some(format!("uid-address-{name}"));
    object.metadata.owner_references = Some(vec![OwnerReference {
        api_version: IPAddressClaim::api_version(&()).into(),
        kind: "IPAddressClaim".into(),
        name: claim.into(),
        uid: format!("uid-claim-{claim}"),
        ..Default::default()
    }]);
    object
}

/// `pool`'s ledger listing `addresses`.
pub fn ledger(pool: &AnyPool, addresses: &[&str]) -> (String, StoredLedger) {
    let parsed = addresses.iter().filter_map(|a| a.parse::<IpAddr>().ok());
    (
        pool.ledger_key(),
        StoredLedger {
            config_map: format!("{NS}/ledger"),
            pool_identity: Some(pool.ledger_identity()),
            record: Ok(Ledger::from_addresses(parsed)),
        },
    )
}

/// A pool `p` of 10.0.0.0/24 with claims a and b served by .1 and .2, its ledger in step.
pub fn settled() -> Snapshot {
    let pool = capi_pool("p", &["10.0.0.0/24"], 24);
    let ledger = ledger(&pool, &["10.0.0.1", "10.0.0.2"]);
    Snapshot {
        pools: vec![pool],
        claims: vec![served(claim("a", "p"), "a"), served(claim("b", "p"), "b")],
        addresses: vec![
            address("a", "p", "a", "10.0.0.1"),
            address("b", "p", "b", "10.0.0.2"),
        ],
        ledgers: [ledger].into(),
        read_at: NOW.into(),
        ..Snapshot::default()
    }
}

/// [`settled`], with 10.0.0.3 reserved in the ledger for claim c, whose object is not created yet.
pub fn reserved_in_flight() -> Snapshot {
    let mut snapshot = settled();
    for stored in snapshot.ledgers.values_mut() {
        if let Ok(record) = &mut stored.record {
            let reservation = crate::ipam::ledger::Reservation {
                claim_namespace: NS.into(),
                claim_name: "c".into(),
                claim_uid: "uid-claim-c".into(),
                since: NOW.into(),
            };
            record.reserve(IpAddr::from([10, 0, 0, 3]), reservation);
        }
    }
    snapshot
}
