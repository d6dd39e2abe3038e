//! Plan: what one reconcile does, decided from what was read, with no client and no await.
//! Which claims are served with the objects they have, which get a reservation, which objects
//! go, and what transaction 1 asks of the ledger.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::time::Duration;

use super::read::{Observed, Selected};
use super::{
    AddressIndex, BATCH, ClaimKey, Holder, Outcomes, Told, address_key, claim_key, usable, vouches,
};
use crate::ipam::dialect::PoolDialect;
use crate::ipam::duplicates::{self, SharedAddress};
use crate::ipam::kinds::{AnyAddress, AnyClaim, Outcome};
use crate::ipam::ledger::intent::{Found, Intent, Refusal, Request};
use crate::ipam::spec;
use crate::runtime::objects;

/// What a reconcile does, as the plan decides it from what was read.
#[derive(Default)]
pub(super) struct Plan {
    /// Transaction 1: allocate, bind what is about to lose its address object, confirm.
    pub(super) first: Intent,
    /// Claims whose reservation in transaction 1 gets an address object.
    pub(super) creates: Vec<AnyClaim>,
    /// Address objects of releasing claims, which go.
    pub(super) deletes: Vec<(AnyClaim, AnyAddress)>,
    pub(super) unkept: Unkept,
    /// Objects of live claims that their status does not name, judged by transaction 1 before
    /// the claim is served with them ([`crate::ipam::ledger::Found`]).
    pub(super) found: Vec<(AnyClaim, AnyAddress)>,
    /// Addresses the live objects of more than one claim hold: they stay allocated, and the
    /// report says so.
    pub(super) shared: Vec<SharedAddress>,
    /// Who holds what as the reconcile found it (claim kind and name → address), for the
    /// status of a pool that names holders.
    pub(super) holders: BTreeMap<Holder, IpAddr>,
    /// What the plan already decided for the report.
    pub(super) told: Told,
}

/// Address objects no claim keeps, which go; what each held is freed once a fresh list shows
/// no other object holding it (a hand-made object may name another claim's address).
#[derive(Default)]
pub(super) struct Unkept {
    /// Address objects whose claim is gone.
    pub(super) orphaned: Vec<AnyAddress>,
    /// Second address objects of live or releasing claims (see [`super::read::index_by_claim`]).
    pub(super) duplicates: Vec<AnyAddress>,
}

/// Transaction 1 and the work around it, from what was read: each live claim is served with
/// the object it has (in the cache, or read from the server where the cache showed none) or
/// gets a reservation; each deleting claim's object goes.
pub(super) fn plan<P: PoolDialect>(
    pool: &P,
    observed: &Observed,
    base: Option<&spec::Base>,
) -> Plan {
    let (claims, addresses) = (&observed.claims, &observed.addresses);
    let mut batch = Plan {
        holders: match P::STATUS_NAMES_HOLDERS {
            true => (addresses.iter())
                .filter_map(|(claim, a)| Some(((claim.kind, claim.name.clone()), pool.held(a)?)))
                .collect(),
            false => Default::default(),
        },
        unkept: Unkept {
            duplicates: second_objects::<P>(claims, observed.extras.clone()),
            orphaned: observed.orphaned.clone(),
        },
        // An address another claim's object holds too stays allocated when this one goes.
        shared: shared_addresses(pool, addresses),
        ..Default::default()
    };
    if claims.again {
        batch.told.again_within(Duration::ZERO);
    }
    for claim in &claims.live {
        let key = claim_key(claim);
        let held = [addresses, &observed.known]
            .into_iter()
            .filter_map(|index| index.get(&key))
            .find(|object| usable(pool, claim, object));
        match (held, not_selected(observed, claim)) {
            (Some(object), _) => batch.plan_held(pool, claim, object),
            // A namespace the pool does not serve gets no new address; one it holds stays.
            (None, Some(refusal)) => batch.told.statuses.push((
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
        .contains(claim.meta.namespace())
        .then(|| Refusal::NamespaceNotSelected {
            namespace: claim.meta.namespace().to_string(),
            selector: outside.selector.clone(),
        })
}

impl Plan {
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
            return self.found.push((claim.clone(), object.clone()));
        }
        self.first.confirm.push((ip, id.uid));
        self.told.serve_with(pool, claim, object, ip);
    }
}

impl Told {
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
            self.adoptions.push((object.clone(), patch));
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
}

impl Plan {
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
            return (self.told.statuses).push((claim.clone(), Outcome::Failed(problem)));
        }
        if self.creates.len() >= BATCH {
            return self.told.again_within(Duration::ZERO);
        }
        let requested = match pool.requested(claim) {
            Ok(requested) => requested,
            Err(e) => {
                let refused = Outcome::Refused {
                    refusal: Refusal::Alloc(e),
                    pool: pool.key().describe(),
                    spec_error: None,
                };
                return self.told.statuses.push((claim.clone(), refused));
            }
        };
        self.creates.push(claim.clone());
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
    batch: &mut Plan,
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
                batch.deletes.push((claim.clone(), a.clone()));
            }
            None => {
                // No object of the claim was seen: one may still be on its way.
                batch.first.release_unlanded.push(id.uid);
                batch.told.finished.push(claim.clone());
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
mod tests;
