//! One ledger transaction, as a pure function: what a pool reconcile wants (allocations for
//! claims without an address, bindings, confirmations, releases), applied to a ledger read from
//! the server. The reconciler writes the result with the ledger's resourceVersion and, on a
//! conflict, applies the same intent to the fresh ledger.

use std::collections::BTreeMap;
use std::net::IpAddr;

use rand::Rng;

use super::record::{IN_FLIGHT_BOUND, Ledger, MAX_BITMAP_BYTES, PendingRoom, Reservation};
use crate::alloc::{AddressSpace, AllocError, Lease};

/// A claim as the ledger knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimId {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

impl ClaimId {
    fn reservation(&self, since: &str) -> Reservation {
        Reservation {
            claim_namespace: self.namespace.clone(),
            claim_name: self.name.clone(),
            claim_uid: self.uid.clone(),
            since: since.to_string(),
        }
    }
}

/// A claim that needs an address.
#[derive(Clone, Debug)]
pub struct Request {
    pub claim: ClaimId,
    /// The claim's `ipAddress` annotation.
    pub requested: Option<String>,
    /// The `preAllocations` key that names this claim (its name, or on a global pool
    /// `<namespace>/<name>`; see the pool dialect).
    pub preallocation_key: String,
}

/// What one transaction asks of the ledger; [`apply`] says what it leaves.
#[derive(Clone, Debug, Default)]
pub struct Intent {
    /// Claims without an IPAddress: each gets its reserved address, or a new one.
    pub allocate: Vec<Request>,
    /// Addresses whose IPAddress is about to go away (or has gone) while their claim still
    /// needs them recorded: keep them reserved for that claim.
    pub bind: Vec<(IpAddr, ClaimId)>,
    /// IPAddress objects found (and verified) that the ledger does not list.
    pub adopt: Vec<IpAddr>,
    /// IPAddresses now known to exist: clear the claim's reservation.
    pub confirm: Vec<(IpAddr, String)>,
    /// Reservations their claim (by UID) turned out not to need: its address object was found
    /// with another address, or its object's name is taken. Each is freed only while it is
    /// still reserved for that claim: by then another process may have freed it and handed it
    /// to another claim, whose confirmed address it now is.
    pub release: Vec<(IpAddr, String)>,
    /// Addresses with neither a reservation nor an IPAddress (verified by a fresh list).
    pub release_unbound: Vec<IpAddr>,
    /// Claims (by UID) that are gone or done: free whatever they have reserved.
    pub release_claims: Vec<String>,
    /// Claims (by UID) gone before any address object of theirs was seen: a create for them may
    /// still be on its way, so each reservation is freed only once [`IN_FLIGHT_BOUND`] has
    /// passed since it was made; until then it stays (and the next reconcile looks again).
    pub release_unlanded: Vec<String>,
    /// The ledger turned out to lack what was in flight (a live address it did not list):
    /// start the rebuild fence now, for this reason.
    pub fence: Option<String>,
    /// The rebuild fence is over and the live addresses were adopted: end it.
    pub end_fence: bool,
    /// Address objects found for claims whose status does not name them yet (a status not
    /// written yet, or an object someone else made): each is confirmed only if the record
    /// agrees that the address is the claim's ([`Found`]).
    pub found: Vec<Found>,
    /// The record was judged whole in the ConfigMap of this UID: mark it so
    /// ([`Ledger::whole`]), unless the commit meets another ConfigMap (restored meanwhile).
    pub whole_in: Option<String>,
}

/// An address object of a claim, found without the claim's status naming it.
#[derive(Clone, Debug)]
pub struct Found {
    pub address: IpAddr,
    pub claim: ClaimId,
    /// Another claim's live object holds the address too.
    pub shared: bool,
}

impl Found {
    /// Why the record does not let `self.claim` have this address, if it does not: the address
    /// is reserved for another claim, is not allocated at all (a whole record lists every
    /// address bitpool handed out), or is another claim's.
    fn refused_by(&self, ledger: &Ledger) -> Option<String> {
        match ledger.pending.get(&self.address.to_string()) {
            Some(r) if r.claim_uid == self.claim.uid => None,
            Some(r) => Some(format!(
                "it is reserved for claim {}/{}",
                r.claim_namespace, r.claim_name
            )),
            None if !ledger.contains(self.address) => {
                Some("the pool's allocation record does not hold it".into())
            }
            None if self.shared => Some("another claim's address object holds it".into()),
            None => None,
        }
    }
}

impl Intent {
    /// Whether the transaction asks nothing.
    pub fn is_empty(&self) -> bool {
        self.allocate.is_empty()
            && self.bind.is_empty()
            && self.adopt.is_empty()
            && self.confirm.is_empty()
            && self.release.is_empty()
            && self.release_unbound.is_empty()
            && self.release_claims.is_empty()
            && self.release_unlanded.is_empty()
            && self.fence.is_none()
            && !self.end_fence
            && self.found.is_empty()
    }
}

/// Why a claim got no address from this transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    Alloc(AllocError),
    /// The pool's spec is invalid; nothing is allocated until it is fixed.
    PoolInvalid,
    /// The pool is paused (`cluster.x-k8s.io/paused`); nothing is allocated until it is lifted.
    Paused,
    /// The ledger was rebuilt after its record was lost; no new address until this time.
    Fenced {
        until: String,
    },
    /// The ledger holds as many reservations as it may; the claim is served in the next batch.
    Deferred,
    /// The ledger's bitmaps take all the room they may ([`MAX_BITMAP_BYTES`]): no new address
    /// until addresses are released.
    LedgerFull {
        bytes: usize,
    },
    /// The claim's address object names an address the pool did not hand to it: bitpool did
    /// not make that object, and neither takes nor frees an address for it.
    NotHanded {
        address: IpAddr,
        why: String,
    },
    /// A cluster-scoped pool's `namespaceSelector` does not select the claim's namespace.
    NamespaceNotSelected {
        namespace: String,
        selector: String,
    },
}

/// Frees `address` in the ledger and in the space that mirrors it.
fn free(next: &mut Ledger, space: &mut Option<&mut AddressSpace>, address: IpAddr) {
    if next.remove(address)
        && let Some(space) = space.as_deref_mut()
    {
        space.release(address);
    }
}

/// Whether `IN_FLIGHT_BOUND` has passed since `reservation` was made, at `now` (RFC 3339, the
/// API server's clock). A reservation whose time cannot be read is judged old: it was not
/// written by bitpool.
pub fn no_create_can_land(reservation: &Reservation, now: &str) -> bool {
    use k8s_openapi::jiff::Timestamp;
    match (
        reservation.since.parse::<Timestamp>(),
        now.parse::<Timestamp>(),
    ) {
        (Ok(since), Ok(now)) => since
            .checked_add(IN_FLIGHT_BOUND)
            .is_ok_and(|bound| bound <= now),
        (Err(_), _) => true,
        (Ok(_), Err(_)) => false,
    }
}

/// Clears `uid`'s reservation of `address`, its address object being there. A claim never holds
/// two addresses: a reservation it got from a stale view (its object existed but was not seen)
/// is freed.
fn confirm(next: &mut Ledger, space: &mut Option<&mut AddressSpace>, address: IpAddr, uid: &str) {
    next.confirm(address, uid);
    let extra: Vec<IpAddr> = next
        .reservations_of(uid)
        .map(|(a, _)| a)
        .filter(|a| *a != address)
        .collect();
    for stale in extra {
        free(next, space, stale);
    }
}

/// Records `address` as allocated in the ledger and in the space that mirrors it.
fn hold(next: &mut Ledger, space: &mut Option<&mut AddressSpace>, address: IpAddr) {
    next.insert(address);
    if let Some(space) = space.as_deref_mut() {
        space.mark_used(address);
    }
}

/// The next ledger, and the outcome for each claim in `intent.allocate` (by UID).
///
/// `space` must hold exactly `ledger`'s addresses as used (built from the pool spec and
/// [`AddressSpace::mark_all_used`], or kept from the previous transaction on the same ledger
/// version); it is changed in step with the ledger, so that it mirrors the returned one. Work
/// per claim does not grow with the number of addresses used.
pub fn apply(
    ledger: &Ledger,
    mut space: Option<&mut AddressSpace>,
    intent: &Intent,
    now: &str,
    rng: &mut impl Rng,
) -> (Ledger, BTreeMap<String, Result<Lease, Refusal>>) {
    let mut next = ledger.clone();
    release(&mut next, &mut space, intent, now);
    record(&mut next, &mut space, intent, now);
    // After adoption: a record rebuilt from the live objects holds what they hold.
    let mut outcomes = judge_found(&mut next, &mut space, &intent.found);
    let mut room = PendingRoom::of(&next);
    for (address, claim) in &intent.bind {
        let reservation = claim.reservation(now);
        if !next.pending.contains_key(&address.to_string()) && room.take(&reservation) {
            hold(&mut next, &mut space, *address);
            next.reserve(*address, reservation);
        }
    }
    match space {
        Some(space) => allocate(&mut next, space, &mut room, intent, now, rng, &mut outcomes),
        None => {
            for request in &intent.allocate {
                outcomes.insert(request.claim.uid.clone(), Err(Refusal::PoolInvalid));
            }
        }
    }
    (next, outcomes)
}

/// Frees what the intent releases: a reservation only for the claim it is for, a gone claim's
/// reservations (those of claims gone before their object landed only once no create can land),
/// and addresses verified unbound only while nothing is reserved on them.
fn release(next: &mut Ledger, space: &mut Option<&mut AddressSpace>, intent: &Intent, now: &str) {
    for (address, uid) in &intent.release {
        let reserved_for_releaser = next
            .pending
            .get(&address.to_string())
            .is_some_and(|r| &r.claim_uid == uid);
        if reserved_for_releaser {
            free(next, space, *address);
        }
    }
    for uid in &intent.release_claims {
        if let Some((address, _)) = next.reservation_of(uid) {
            free(next, space, address);
        }
    }
    for uid in &intent.release_unlanded {
        let landed: Vec<IpAddr> = next
            .reservations_of(uid)
            .filter(|(_, r)| no_create_can_land(r, now))
            .map(|(a, _)| a)
            .collect();
        for address in landed {
            free(next, space, address);
        }
    }
    for address in &intent.release_unbound {
        if !next.pending.contains_key(&address.to_string()) {
            free(next, space, *address);
        }
    }
}

/// Records what is known to exist (confirmed and adopted addresses), starts or ends the rebuild
/// fence, and marks the record whole where it was judged so.
fn record(next: &mut Ledger, space: &mut Option<&mut AddressSpace>, intent: &Intent, now: &str) {
    for (address, uid) in &intent.confirm {
        confirm(next, space, *address, uid);
    }
    for address in &intent.adopt {
        hold(next, space, *address);
    }
    if let Some(because) = &intent.fence {
        next.fence(now, because.clone());
    } else if intent.end_fence {
        next.rebuilt_at = None;
        next.rebuilt_because = None;
    }
    if let Some(uid) = &intent.whole_in
        && next.uid.as_ref() == Some(uid)
    {
        next.written_to = Some(uid.clone());
    }
}

/// Objects found for claims whose status does not name them: confirmed where the record agrees
/// the address is the claim's, refused (with why) where it does not.
fn judge_found(
    next: &mut Ledger,
    space: &mut Option<&mut AddressSpace>,
    found: &[Found],
) -> BTreeMap<String, Result<Lease, Refusal>> {
    let mut outcomes = BTreeMap::new();
    for found in found {
        match found.refused_by(next) {
            None => confirm(next, space, found.address, &found.claim.uid),
            Some(why) => {
                let refusal = Refusal::NotHanded {
                    address: found.address,
                    why,
                };
                outcomes.insert(found.claim.uid.clone(), Err(refusal));
            }
        }
    }
    outcomes
}

/// Each request's lease: its claim's reservation again (its create is sent again), or a new
/// address unless the record is fenced, full, or out of room for reservations.
fn allocate(
    next: &mut Ledger,
    space: &mut AddressSpace,
    room: &mut PendingRoom,
    intent: &Intent,
    now: &str,
    rng: &mut impl Rng,
    outcomes: &mut BTreeMap<String, Result<Lease, Refusal>>,
) {
    let fenced = next.fenced_until(now);
    let bitmaps = next.bitmap_bytes();
    let full = bitmaps >= MAX_BITMAP_BYTES;
    for request in &intent.allocate {
        let reservation = request.claim.reservation(now);
        let reserved = next.reservation_of(&request.claim.uid).map(|(a, _)| a);
        let outcome = match reserved {
            // A reservation the pool no longer contains (its spec shrank meanwhile) keeps its
            // address and is not sent again: no other subnet's prefix and gateway go with it.
            Some(address) => match space.lease(address) {
                Some(lease) => {
                    // Its create is sent again: the time a create of it can land counts from now.
                    if let Some(r) = next.pending.get_mut(&address.to_string()) {
                        r.since = now.to_string();
                    }
                    Ok(lease)
                }
                None => Err(Refusal::Alloc(AllocError::ReservedOutsidePool { address })),
            },
            None if fenced.is_some() => Err(Refusal::Fenced {
                until: fenced.clone().unwrap_or_default(),
            }),
            None if full => Err(Refusal::LedgerFull { bytes: bitmaps }),
            None if !room.fits(&reservation) => Err(Refusal::Deferred),
            None => match space.allocate(
                &request.preallocation_key,
                request.requested.as_deref(),
                rng,
            ) {
                Ok(lease) => {
                    room.take(&reservation);
                    next.reserve(lease.address, reservation);
                    Ok(lease)
                }
                Err(e) => Err(Refusal::Alloc(e)),
            },
        };
        outcomes.insert(request.claim.uid.clone(), outcome);
    }
}

#[cfg(test)]
mod tests;
