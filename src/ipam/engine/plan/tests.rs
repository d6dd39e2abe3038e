//! The plan's decisions, one row each, with no cluster: what was read goes in, what the
//! reconcile will ask of the ledger and of the API server comes out.

use std::collections::HashMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::ObjectMeta;

use super::*;
use crate::api::capi::{
    IPAddress, IPAddressClaim, IPAddressClaimSpec, IPAddressClaimStatus, IPAddressSpec,
    IPPoolReference, LocalObjectName,
};
use crate::api::capi_pools::{InClusterIPPool, InClusterIPPoolSpec};
use crate::ipam::dialect::PoolSpace;
use crate::ipam::engine::Sight;
use crate::ipam::engine::read::{Outside, index_by_claim};

fn pool() -> InClusterIPPool {
    let mut pool = InClusterIPPool::new(
        "p",
        InClusterIPPoolSpec {
            addresses: vec!["10.0.0.0/24".into()],
            prefix: 24,
            ..Default::default()
        },
    );
    pool.metadata.namespace = Some("ns".into());
    pool.metadata.uid = Some("pool-uid".into());
    pool
}

fn base(space: crate::alloc::AddressSpace) -> spec::Base {
    let spec = spec::SpecFingerprint {
        uid: "pool-uid".into(),
        generation: 0,
    };
    spec::Base { space, spec }
}

fn pool_ref() -> IPPoolReference {
    IPPoolReference {
        name: "p".into(),
        kind: "InClusterIPPool".into(),
        api_group: "ipam.cluster.x-k8s.io".into(),
    }
}

fn gone() -> Option<Time> {
    Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))
}

/// A claim of the pool; `names` is the object its status names, if any.
fn claim_object(name: &str, names: Option<&str>, deleting: bool) -> IPAddressClaim {
    IPAddressClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(format!("uid-{name}")),
            deletion_timestamp: if deleting { gone() } else { None },
            ..Default::default()
        },
        spec: IPAddressClaimSpec {
            cluster_name: None,
            pool_ref: pool_ref(),
        },
        status: names.map(|object| IPAddressClaimStatus {
            address_ref: Some(LocalObjectName {
                name: object.into(),
            }),
            ..Default::default()
        }),
    }
}

fn claim(name: &str, names: Option<&str>, deleting: bool) -> AnyClaim {
    AnyClaim::capi(&claim_object(name, names, deleting)).expect("named and namespaced")
}

/// A live claim whose status already says it holds `ip` through the object `names`.
fn settled(name: &str, names: &str, ip: &str) -> AnyClaim {
    let mut object = claim_object(name, Some(names), false);
    if let Some(status) = object.status.as_mut() {
        status.conditions = vec![Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "AddressAllocated".into(),
            message: format!("allocated {ip}"),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }];
    }
    AnyClaim::capi(&object).expect("named and namespaced")
}

/// An address object of `claim` holding `ip`.
fn object(name: &str, claim: &str, ip: &str, going: bool) -> AnyAddress {
    AnyAddress::capi(&IPAddress {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(format!("uid-{name}")),
            deletion_timestamp: if going { gone() } else { None },
            ..Default::default()
        },
        spec: IPAddressSpec {
            claim_ref: LocalObjectName { name: claim.into() },
            pool_ref: pool_ref(),
            address: ip.into(),
            prefix: 24,
            gateway: None,
        },
    })
    .expect("a named, namespaced object")
}

/// What was read: claims live and deleting, objects in the cache, and those read from the
/// server for live (`known`) and deleting (`fresh`) claims.
#[derive(Default)]
struct Read {
    live: Vec<AnyClaim>,
    releasing: Vec<AnyClaim>,
    cached: Vec<AnyAddress>,
    known: Vec<AnyAddress>,
    fresh: Option<Vec<AnyAddress>>,
    again: bool,
    /// Namespaces the pool's `namespaceSelector` leaves out.
    outside: Vec<&'static str>,
}

impl Read {
    fn observed(self) -> Observed {
        let claims: Vec<&AnyClaim> = self.live.iter().chain(&self.releasing).collect();
        let named: HashMap<ClaimKey, std::sync::Arc<str>> = claims
            .iter()
            .filter_map(|c| Some((claim_key(c), c.status_address()?.clone())))
            .collect();
        let (addresses, extras) = index_by_claim(self.cached, &named);
        Observed {
            claims: Selected {
                live: self.live,
                releasing: self.releasing,
                grace_wait: None,
                again: self.again,
            },
            addresses,
            extras,
            named,
            known: index_by_claim(self.known, &HashMap::new()).0,
            fresh: self.fresh.map(|f| index_by_claim(f, &HashMap::new()).0),
            orphaned: Vec::new(),
            sight: Sight::Listed,
            outside: (!self.outside.is_empty()).then(|| Outside {
                selector: "tenant=a".into(),
                namespaces: self
                    .outside
                    .iter()
                    .map(|ns| std::sync::Arc::from(*ns))
                    .collect(),
            }),
        }
    }
}

/// The plan's decisions, each list sorted.
#[derive(Debug, Default, PartialEq)]
struct Decisions {
    /// Claims given a request for a new address.
    allocate: Vec<String>,
    /// `address claim-uid` confirmed as the claim's.
    confirm: Vec<String>,
    /// `address claim` kept for the claim while its object goes.
    bind: Vec<String>,
    /// `address claim shared` left for the record to judge.
    found: Vec<String>,
    /// Objects to delete.
    delete: Vec<String>,
    /// Claim UIDs whose reservation goes once no create can land.
    unlanded: Vec<String>,
    /// Claims whose finalizer goes.
    finished: Vec<String>,
    /// `claim address` written to the claim's status.
    served: Vec<String>,
    /// `claim refusal` written to the claim's status.
    refused: Vec<String>,
    /// Look again at once.
    again: bool,
}

fn sorted(mut items: Vec<String>) -> Vec<String> {
    items.sort();
    items
}

fn decisions(batch: &Plan) -> Decisions {
    let first = &batch.first;
    Decisions {
        allocate: sorted(
            first
                .allocate
                .iter()
                .map(|r| r.claim.name.clone())
                .collect(),
        ),
        confirm: sorted(
            first
                .confirm
                .iter()
                .map(|(ip, uid)| format!("{ip} {uid}"))
                .collect(),
        ),
        bind: sorted(
            first
                .bind
                .iter()
                .map(|(ip, id)| format!("{ip} {}", id.name))
                .collect(),
        ),
        found: sorted(
            (first.found.iter())
                .map(|f| format!("{} {} {}", f.address, f.claim.name, f.shared))
                .collect(),
        ),
        delete: sorted(batch.deletes.iter().map(|(_, a)| a.name()).collect()),
        unlanded: sorted(first.release_unlanded.clone()),
        finished: sorted(batch.told.finished.iter().map(AnyClaim::name).collect()),
        served: sorted(
            (batch.told.statuses.iter())
                .filter_map(|(claim, outcome)| match outcome {
                    Outcome::Allocated { address, .. } => {
                        Some(format!("{} {address}", claim.name()))
                    }
                    _ => None,
                })
                .collect(),
        ),
        refused: sorted(
            (batch.told.statuses.iter())
                .filter_map(|(claim, outcome)| match outcome {
                    Outcome::Refused { refusal, .. } => {
                        Some(format!("{} {refusal:?}", claim.name()))
                    }
                    _ => None,
                })
                .collect(),
        ),
        again: batch.told.next == Some(Duration::ZERO),
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn every_decision_of_the_plan() {
    let cases: Vec<(&str, Read, Decisions)> = vec![
        (
            "a claim with the object its status names is confirmed and served",
            Read {
                live: vec![claim("c1", Some("a1"), false)],
                cached: vec![object("a1", "c1", "10.0.0.5", false)],
                ..Default::default()
            },
            Decisions {
                confirm: strings(&["10.0.0.5 uid-c1"]),
                served: strings(&["c1 10.0.0.5"]),
                ..Default::default()
            },
        ),
        (
            "a claim whose status already shows its object is confirmed; nothing is written to it",
            Read {
                live: vec![settled("c1", "a1", "10.0.0.5")],
                cached: vec![object("a1", "c1", "10.0.0.5", false)],
                ..Default::default()
            },
            Decisions {
                confirm: strings(&["10.0.0.5 uid-c1"]),
                ..Default::default()
            },
        ),
        (
            "a claim without an object gets a request for an address",
            Read {
                live: vec![claim("c1", None, false)],
                ..Default::default()
            },
            Decisions {
                allocate: strings(&["c1"]),
                ..Default::default()
            },
        ),
        (
            "an object the claim's status does not name waits for the record's judgement",
            Read {
                live: vec![claim("c1", None, false)],
                cached: vec![object("a1", "c1", "10.0.0.5", false)],
                ..Default::default()
            },
            Decisions {
                found: strings(&["10.0.0.5 c1 false"]),
                ..Default::default()
            },
        ),
        (
            "the judgement knows when another claim's object holds the same address",
            Read {
                live: vec![claim("c1", None, false), claim("c2", Some("a2"), false)],
                cached: vec![
                    object("a1", "c1", "10.0.0.5", false),
                    object("a2", "c2", "10.0.0.5", false),
                ],
                ..Default::default()
            },
            Decisions {
                found: strings(&["10.0.0.5 c1 true"]),
                confirm: strings(&["10.0.0.5 uid-c2"]),
                served: strings(&["c2 10.0.0.5"]),
                ..Default::default()
            },
        ),
        (
            "a going object the claim's status names keeps its address for the claim",
            Read {
                live: vec![claim("c1", Some("a1"), false)],
                cached: vec![object("a1", "c1", "10.0.0.5", true)],
                ..Default::default()
            },
            Decisions {
                bind: strings(&["10.0.0.5 c1"]),
                ..Default::default()
            },
        ),
        (
            "a going object nobody vouches for serves nothing: the claim gets a request",
            Read {
                live: vec![claim("c1", None, false)],
                cached: vec![object("a1", "c1", "10.0.0.5", true)],
                ..Default::default()
            },
            Decisions {
                allocate: strings(&["c1"]),
                ..Default::default()
            },
        ),
        (
            "an object holding no address is none: the claim gets a request",
            Read {
                live: vec![claim("c1", Some("a1"), false)],
                cached: vec![object("a1", "c1", "not-an-address", false)],
                ..Default::default()
            },
            Decisions {
                allocate: strings(&["c1"]),
                ..Default::default()
            },
        ),
        (
            "an object the cache lags behind, read from the server, serves its claim",
            Read {
                live: vec![claim("c1", Some("a1"), false)],
                known: vec![object("a1", "c1", "10.0.0.5", false)],
                ..Default::default()
            },
            Decisions {
                confirm: strings(&["10.0.0.5 uid-c1"]),
                served: strings(&["c1 10.0.0.5"]),
                ..Default::default()
            },
        ),
        (
            "a deleting claim's object goes, its address kept for the claim until then",
            Read {
                releasing: vec![claim("c1", Some("a1"), true)],
                cached: vec![object("a1", "c1", "10.0.0.5", false)],
                ..Default::default()
            },
            Decisions {
                bind: strings(&["10.0.0.5 c1"]),
                delete: strings(&["a1"]),
                ..Default::default()
            },
        ),
        (
            "a deleting claim's object bitpool did not vouch for goes without keeping its address",
            Read {
                releasing: vec![claim("c1", None, true)],
                cached: vec![object("a1", "c1", "10.0.0.5", false)],
                ..Default::default()
            },
            Decisions {
                delete: strings(&["a1"]),
                ..Default::default()
            },
        ),
        (
            "a deleting claim does not keep an address another claim's object holds",
            Read {
                live: vec![claim("c2", Some("a2"), false)],
                releasing: vec![claim("c1", Some("a1"), true)],
                cached: vec![
                    object("a1", "c1", "10.0.0.5", false),
                    object("a2", "c2", "10.0.0.5", false),
                ],
                ..Default::default()
            },
            Decisions {
                confirm: strings(&["10.0.0.5 uid-c2"]),
                served: strings(&["c2 10.0.0.5"]),
                delete: strings(&["a1"]),
                ..Default::default()
            },
        ),
        (
            "a deleting claim's object read from the server goes",
            Read {
                releasing: vec![claim("c1", Some("a1"), true)],
                fresh: Some(vec![object("a1", "c1", "10.0.0.5", false)]),
                ..Default::default()
            },
            Decisions {
                bind: strings(&["10.0.0.5 c1"]),
                delete: strings(&["a1"]),
                ..Default::default()
            },
        ),
        (
            "a deleting claim with no object anywhere is done; its reservation waits out the flight",
            Read {
                releasing: vec![claim("c1", None, true)],
                fresh: Some(Vec::new()),
                ..Default::default()
            },
            Decisions {
                unlanded: strings(&["uid-c1"]),
                finished: strings(&["c1"]),
                ..Default::default()
            },
        ),
        (
            "a claim of a namespace the selector leaves out gets no address and is told why",
            Read {
                live: vec![claim("c1", None, false)],
                outside: vec!["ns"],
                ..Default::default()
            },
            Decisions {
                refused: strings(&[
                    r#"c1 NamespaceNotSelected { namespace: "ns", selector: "tenant=a" }"#,
                ]),
                ..Default::default()
            },
        ),
        (
            "a claim of a left-out namespace keeps the address it holds",
            Read {
                live: vec![claim("c1", Some("a1"), false)],
                cached: vec![object("a1", "c1", "10.0.0.5", false)],
                outside: vec!["ns"],
                ..Default::default()
            },
            Decisions {
                confirm: strings(&["10.0.0.5 uid-c1"]),
                served: strings(&["c1 10.0.0.5"]),
                ..Default::default()
            },
        ),
        (
            "claims the read left over are looked at again at once",
            Read {
                again: true,
                ..Default::default()
            },
            Decisions {
                again: true,
                ..Default::default()
            },
        ),
    ];
    let pool = pool();
    let space = pool.space().expect("a valid pool");
    let base = base(space);
    for (case, read, want) in cases {
        let batch = plan(&pool, &read.observed(), Some(&base));
        assert_eq!(decisions(&batch), want, "{case}");
    }
}

/// A backlog is served a batch at a time: the claims beyond it wait for the next reconcile,
/// which comes at once.
#[test]
fn a_backlog_is_planned_a_batch_at_a_time() {
    let live: Vec<AnyClaim> = (0..=BATCH)
        .map(|i| claim(&format!("c{i:04}"), None, false))
        .collect();
    let pool = pool();
    let base = base(pool.space().expect("a valid pool"));
    let read = Read {
        live,
        ..Default::default()
    };
    let batch = plan(&pool, &read.observed(), Some(&base));
    assert_eq!(batch.first.allocate.len(), BATCH);
    assert_eq!(batch.first.allocate[0].claim.name, "c0000", "oldest first");
    assert_eq!(batch.told.next, Some(Duration::ZERO));
}
