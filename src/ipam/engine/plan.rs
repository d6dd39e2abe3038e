//! Plan: what one reconcile does, decided from what was read, with no client and no await.
//! Which claims are served with the objects they have, which get a reservation, which objects
//! go, and what transaction 1 asks of the ledger.

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::Duration;

use super::read::{Observed, Selected};
use super::{
    AddressIndex, BATCH, Batch, ClaimKey, Outcomes, address_key, claim_key, usable, vouches,
};
use crate::ipam::dialect::PoolDialect;
use crate::ipam::duplicates::{self, SharedAddress};
use crate::ipam::kinds::{AnyAddress, AnyClaim, Outcome};
use crate::ipam::ledger::intent::{Found, Refusal, Request};
use crate::ipam::spec;
use crate::runtime::objects;

/// Transaction 1 and the work around it, from what was read: each live claim is served with
/// the object it has (in the cache, or read from the server where the cache showed none) or
/// gets a reservation; each deleting claim's object goes.
pub(super) fn plan<P: PoolDialect>(
    pool: &P,
    observed: &Observed,
    base: Option<&spec::Base>,
) -> Batch {
    let (claims, addresses) = (&observed.claims, &observed.addresses);
    let mut batch = Batch {
        holders: match P::STATUS_NAMES_HOLDERS {
            true => (addresses.iter())
                .filter_map(|(claim, a)| Some(((claim.kind, claim.name.clone()), pool.held(a)?)))
                .collect(),
            false => Default::default(),
        },
        duplicates: second_objects::<P>(claims, observed.extras.clone()),
        orphaned: observed.orphaned.clone(),
        ..Default::default()
    };
    if claims.again {
        batch.again_within(Duration::ZERO);
    }
    // An address another claim's object holds too stays allocated when this one goes.
    batch.shared = shared_addresses(pool, addresses);
    for claim in &claims.live {
        let key = claim_key(claim);
        let held = [addresses, &observed.known]
            .into_iter()
            .filter_map(|index| index.get(&key))
            .find(|object| usable(pool, claim, object));
        match (held, not_selected(observed, claim)) {
            (Some(object), _) => batch.plan_held(pool, claim, object),
            // A namespace the pool does not serve gets no new address; one it holds stays.
            (None, Some(refusal)) => batch.statuses.push((
                claim.clone(),
                Outcome::Refused {
                    refusal,
                    pool: pool.key().describe(),
                    spec_error: None,
                },
            )),
            (None, None) => batch.plan_allocation(pool, claim, base),
        }
    }
    plan_releases(pool, &mut batch, claims, addresses, observed.fresh.as_ref());
    batch
}

/// The refusal of a claim whose namespace the pool's `namespaceSelector` leaves out.
fn not_selected(observed: &Observed, claim: &AnyClaim) -> Option<Refusal> {
    let outside = observed.outside.as_ref()?;
    outside
        .namespaces
        .contains(&claim.meta.namespace)
        .then(|| Refusal::NamespaceNotSelected {
            namespace: claim.meta.namespace.to_string(),
            selector: outside.selector.clone(),
        })
}

impl Batch {
    /// A live claim with an object that serves it ([`usable`]): confirmed (and the object
    /// adopted where it lacks owners or finalizer), or bound while the object goes. An object
    /// the claim's status does not name is confirmed only if transaction 1 finds that the
    /// address is the claim's.
    pub(super) fn plan_held<P: PoolDialect>(
        &mut self,
        pool: &P,
        claim: &AnyClaim,
        object: &AnyAddress,
    ) {
        let (Some(id), Some(ip)) = (claim.id(), pool.held(object)) else {
            return;
        };
        let vouched = vouches(claim, object);
        if object.deleting() {
            // Its address stays the claim's while the object goes, if bitpool gave it.
            if vouched {
                self.first.bind.push((ip, id));
            }
            return;
        }
        if !vouched {
            let shared = self.shared.iter().any(|s| s.address == ip);
            self.first.found.push(Found {
                address: ip,
                claim: id,
                shared,
            });
            return self.found_first.push((claim.clone(), object.clone()));
        }
        self.first.confirm.push((ip, id.uid));
        self.serve_with(pool, claim, object, ip);
    }

    /// `claim` is served with `object`, which holds `ip`.
    pub(super) fn serve_with<P: PoolDialect>(
        &mut self,
        pool: &P,
        claim: &AnyClaim,
        object: &AnyAddress,
        ip: IpAddr,
    ) {
        let adoption = pool
            .address_metadata(claim, object)
            .filter(|desired| !objects::carries(&object.meta, desired))
            .and_then(|desired| objects::adoption_patch(&object.meta.object_meta(), &desired));
        if let Some(patch) = adoption {
            self.to_adopt.push((object.clone(), patch));
        }
        self.holds::<P>(claim, ip);
        // A served claim that says so already costs nothing more (most of a full pool's are).
        let address = pool.show(ip);
        if !claim.shows_allocated(&object.meta.name, &address) {
            let address_name = object.name();
            let served = Outcome::Allocated {
                address_name,
                address,
            };
            self.statuses.push((claim.clone(), served));
        }
    }

    /// The claims whose objects a transaction judged ([`Found`]): served with them, or
    /// told why not. Confirming again what the transaction confirmed changes nothing.
    pub(super) fn settle_found<P: PoolDialect>(
        &mut self,
        pool: &P,
        found: Vec<(AnyClaim, AnyAddress)>,
        outcomes: &Outcomes,
        spec_error: &Option<String>,
    ) {
        for (claim, object) in found {
            let (Some(uid), Some(ip)) = (claim.uid(), pool.held(&object)) else {
                continue;
            };
            match outcomes.get(&uid) {
                Some(Err(refusal @ Refusal::NotHanded { .. })) => {
                    self.foreign.push(object);
                    let refused = Outcome::Refused {
                        refusal: refusal.clone(),
                        pool: pool.key().describe(),
                        spec_error: spec_error.clone(),
                    };
                    self.statuses.push((claim, refused));
                }
                _ => self.serve_with(pool, &claim, &object, ip),
            }
        }
    }

    /// A live claim without an address object: a request in transaction 1, or why it cannot
    /// have one.
    pub(super) fn plan_allocation<P: PoolDialect>(
        &mut self,
        pool: &P,
        claim: &AnyClaim,
        base: Option<&spec::Base>,
    ) {
        let Some(id) = claim.id() else { return };
        let problem = base.and_then(|base| pool.address_name_problem(claim, base.space.family()));
        if let Some(problem) = problem {
            return self
                .statuses
                .push((claim.clone(), Outcome::Failed(problem)));
        }
        if self.to_create.len() >= BATCH {
            return self.again_within(Duration::ZERO);
        }
        let requested = match pool.requested(claim) {
            Ok(requested) => requested,
            Err(e) => {
                let refused = Outcome::Refused {
                    refusal: Refusal::Alloc(e),
                    pool: pool.key().describe(),
                    spec_error: None,
                };
                return self.statuses.push((claim.clone(), refused));
            }
        };
        self.to_create.push(claim.clone());
        self.first.allocate.push(Request {
            preallocation_key: pool.preallocation_key(claim),
            claim: id,
            requested,
        });
    }
}

/// Deleting claims: each address object goes (its address bound to the claim until then), or,
/// where none is left (in the cache, nor in `fresh`, read from the server), the claim is done.
fn plan_releases<P: PoolDialect>(
    pool: &P,
    batch: &mut Batch,
    claims: &Selected,
    addresses: &AddressIndex,
    fresh: Option<&AddressIndex>,
) {
    let shared: HashSet<IpAddr> = batch.shared.iter().map(|s| s.address).collect();
    for claim in &claims.releasing {
        let Some(id) = claim.id() else { continue };
        let object = addresses
            .get(&claim_key(claim))
            .or_else(|| fresh?.get(&claim_key(claim)));
        match object.and_then(|a| Some((pool.held(a)?, a))) {
            Some((ip, a)) => {
                // An object the claim's status does not name may be someone else's making:
                // what it holds is freed after it goes only if no other object holds it.
                if !shared.contains(&ip) && vouches(claim, a) {
                    batch.first.bind.push((ip, id));
                }
                batch.to_delete.push((claim.clone(), a.clone()));
            }
            None => {
                // No object of the claim was seen: one may still be on its way.
                batch.first.release_unlanded.push(id.uid);
                batch.finished.push(claim.clone());
            }
        }
    }
}

/// The extra objects of claims this reconcile serves or releases: they go, and their addresses
/// with them once a fresh list shows no other object holding them. Extras of claims it does not
/// act on (paused, unknown) wait, and so does one being deleted that bitpool no longer holds.
pub(super) fn second_objects<P: PoolDialect>(
    claims: &Selected,
    extras: Vec<AnyAddress>,
) -> Vec<AnyAddress> {
    let acted_on: HashSet<ClaimKey> = claims
        .live
        .iter()
        .chain(&claims.releasing)
        .map(claim_key)
        .collect();
    extras
        .into_iter()
        .filter(|a| {
            let held = a.meta.has_finalizer(P::address_finalizer(a.claim_kind()));
            acted_on.contains(&address_key(a)) && (!a.deleting() || held)
        })
        .collect()
}

/// Addresses the live objects of more than one claim hold (one object per claim: a claim's
/// second objects are another matter, see [`super::read::index_by_claim`]).
pub(super) fn shared_addresses<P: PoolDialect>(
    pool: &P,
    addresses: &AddressIndex,
) -> Vec<SharedAddress> {
    duplicates::shared(
        addresses
            .values()
            .filter(|a| !a.deleting())
            .filter_map(|a| Some((pool.held(a)?, a.describe()))),
    )
}

#[cfg(test)]
mod tests {
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

    fn decisions(batch: &Batch) -> Decisions {
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
            delete: sorted(batch.to_delete.iter().map(|(_, a)| a.name()).collect()),
            unlanded: sorted(first.release_unlanded.clone()),
            finished: sorted(batch.finished.iter().map(AnyClaim::name).collect()),
            served: sorted(
                (batch.statuses.iter())
                    .filter_map(|(claim, outcome)| match outcome {
                        Outcome::Allocated { address, .. } => {
                            Some(format!("{} {address}", claim.name()))
                        }
                        _ => None,
                    })
                    .collect(),
            ),
            refused: sorted(
                (batch.statuses.iter())
                    .filter_map(|(claim, outcome)| match outcome {
                        Outcome::Refused { refusal, .. } => {
                            Some(format!("{} {refusal:?}", claim.name()))
                        }
                        _ => None,
                    })
                    .collect(),
            ),
            again: batch.next == Some(Duration::ZERO),
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
        assert_eq!(batch.next, Some(Duration::ZERO));
    }
}
