//! One ledger transaction, as a pure function: what a pool reconcile wants (allocations for
//! claims without an address, bindings, confirmations, releases), applied to a ledger read from
//! the server. The reconciler writes the result with the ledger's resourceVersion and, on a
//! conflict, applies the same intent to the fresh ledger.

use std::collections::BTreeMap;
use std::net::IpAddr;

use rand::Rng;

use super::ledger::{IN_FLIGHT_BOUND, Ledger, MAX_BITMAP_BYTES, PendingRoom, Reservation};
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
mod tests {
    use super::*;
    use crate::alloc::CapiPool;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    const NOW: &str = "2026-11-30T04:00:00Z";

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    fn claim(uid: &str) -> ClaimId {
        ClaimId {
            uid: uid.into(),
            namespace: "ns".into(),
            name: format!("claim-{uid}"),
        }
    }

    fn request(uid: &str) -> Request {
        Request {
            claim: claim(uid),
            requested: None,
            preallocation_key: format!("claim-{uid}"),
        }
    }

    fn space() -> AddressSpace {
        AddressSpace::capi(&CapiPool {
            addresses: vec!["10.0.0.1-10.0.0.3".into()],
            prefix: 24,
            ..Default::default()
        })
        .expect("valid")
    }

    /// `apply` on a space that mirrors `ledger`, checking that it still mirrors the result.
    fn run(
        ledger: &Ledger,
        intent: &Intent,
        rng: &mut StdRng,
    ) -> (Ledger, BTreeMap<String, Result<Lease, Refusal>>) {
        let mut mirrored = space();
        mirrored.mark_all_used(ledger.addresses());
        let (next, outcomes) = apply(ledger, Some(&mut mirrored), intent, NOW, rng);
        let mut rebuilt = space();
        rebuilt.mark_all_used(next.addresses());
        assert_eq!(
            mirrored.counts(),
            rebuilt.counts(),
            "the space mirrors the ledger"
        );
        assert_eq!(
            mirrored.used_addresses().collect::<Vec<_>>(),
            rebuilt.used_addresses().collect::<Vec<_>>()
        );
        (next, outcomes)
    }

    #[test]
    fn allocations_reserve_and_a_retry_reuses_the_reservation() {
        let mut rng = StdRng::seed_from_u64(1);
        let intent = Intent {
            allocate: vec![request("a"), request("b")],
            ..Default::default()
        };
        let (first, outcomes) = run(&Ledger::default(), &intent, &mut rng);
        assert_eq!(
            outcomes["a"].as_ref().map(|l| l.address),
            Ok(ip("10.0.0.1"))
        );
        assert_eq!(
            outcomes["b"].as_ref().map(|l| l.address),
            Ok(ip("10.0.0.2"))
        );
        assert_eq!(first.pending.len(), 2);
        // The same intent against the written ledger (a retry after a crash, or a second
        // process) gives each claim the address it already has: nothing new is allocated.
        let (second, again) = run(&first, &intent, &mut rng);
        assert_eq!(second, first);
        assert_eq!(again, outcomes);
    }

    /// A claim whose reserved address left the pool (its spec shrank before the create was
    /// sent again) gets no lease of another subnet: it is refused, saying so, and the
    /// reservation stays as it was, neither freed nor refreshed.
    #[test]
    fn a_reservation_the_pool_no_longer_contains_is_refused_and_kept() {
        let mut rng = StdRng::seed_from_u64(1);
        let intent = Intent {
            allocate: vec![request("a")],
            ..Default::default()
        };
        let (mut first, _) = run(&Ledger::default(), &intent, &mut rng);
        // The reservation as one made on a wider pool: 10.0.0.9 is outside 10.0.0.1-3.
        let reservation = first.pending.remove("10.0.0.1").expect("reserved");
        first.remove(ip("10.0.0.1"));
        first.reserve(ip("10.0.0.9"), reservation);
        let (next, outcomes) = apply(&first, Some(&mut space()), &intent, NOW, &mut rng);
        assert_eq!(
            outcomes["a"],
            Err(Refusal::Alloc(AllocError::ReservedOutsidePool {
                address: ip("10.0.0.9")
            }))
        );
        assert_eq!(
            next, first,
            "the reservation is kept, and nothing else is taken"
        );
    }

    #[test]
    fn a_stale_writer_recomputing_on_the_fresh_ledger_never_duplicates() {
        let mut rng = StdRng::seed_from_u64(2);
        let base = Ledger::default();
        // Process 1 wins the write for claim a; process 2 computed for claim b on the old ledger,
        // got a conflict, and recomputes on process 1's ledger.
        let (after_one, _) = run(
            &base,
            &Intent {
                allocate: vec![request("a")],
                ..Default::default()
            },
            &mut rng,
        );
        let (after_two, outcomes) = run(
            &after_one,
            &Intent {
                allocate: vec![request("b")],
                ..Default::default()
            },
            &mut rng,
        );
        assert_eq!(
            outcomes["b"].as_ref().map(|l| l.address),
            Ok(ip("10.0.0.2"))
        );
        assert_eq!(after_two.len(), 2);
    }

    #[test]
    fn confirm_release_and_exhaustion() {
        let mut rng = StdRng::seed_from_u64(3);
        let all = Intent {
            allocate: vec![request("a"), request("b"), request("c"), request("d")],
            ..Default::default()
        };
        let (ledger, outcomes) = run(&Ledger::default(), &all, &mut rng);
        assert_eq!(outcomes["d"], Err(Refusal::Alloc(AllocError::Exhausted)));
        let done = Intent {
            confirm: vec![
                (ip("10.0.0.1"), "a".into()),
                (ip("10.0.0.2"), "wrong".into()),
            ],
            release: vec![(ip("10.0.0.3"), "c".into())],
            allocate: vec![request("d")],
            ..Default::default()
        };
        let (ledger, outcomes) = run(&ledger, &done, &mut rng);
        assert_eq!(
            outcomes["d"].as_ref().map(|l| l.address),
            Ok(ip("10.0.0.3")),
            "a released address is reused"
        );
        assert!(!ledger.pending.contains_key("10.0.0.1"), "confirmed");
        assert!(
            ledger.pending.contains_key("10.0.0.2"),
            "another claim cannot confirm b's reservation"
        );
    }

    #[test]
    fn releases_never_free_an_address_reserved_for_another_claim() {
        let mut rng = StdRng::seed_from_u64(4);
        let mut ledger = Ledger::default();
        ledger.reserve(ip("10.0.0.1"), claim("a").reservation("t"));
        ledger.insert(ip("10.0.0.2"));
        let intent = Intent {
            release: vec![(ip("10.0.0.1"), "b".into())],
            release_unbound: vec![ip("10.0.0.1"), ip("10.0.0.2")],
            release_claims: vec!["b".into()],
            ..Default::default()
        };
        let (next, _) = run(&ledger, &intent, &mut rng);
        assert!(next.contains(ip("10.0.0.1")), "still a's");
        assert!(
            !next.contains(ip("10.0.0.2")),
            "unbound and verified absent: freed"
        );
        let (next, _) = run(
            &next,
            &Intent {
                release_claims: vec!["a".into()],
                ..Default::default()
            },
            &mut rng,
        );
        assert!(
            !next.contains(ip("10.0.0.1")),
            "a's reservation released with a"
        );
    }

    /// A release frees only the releaser's own reservation. Process A reserved .1 for claim x,
    /// then found x's object with .2 and queued the release of .1; meanwhile process B confirmed
    /// x's .2 (freeing the stale .1), gave .1 to claim z and confirmed it. A's late release must
    /// leave z's address alone, and a later claim must not get it.
    #[test]
    fn a_late_release_never_frees_another_claims_confirmed_address() {
        let mut rng = StdRng::seed_from_u64(6);
        let mut ledger = Ledger::default();
        ledger.reserve(ip("10.0.0.1"), claim("x").reservation("t"));
        ledger.insert(ip("10.0.0.2"));
        let cases: Vec<(&str, Intent, bool)> = vec![
            (
                "the releaser's own reservation",
                Intent {
                    release: vec![(ip("10.0.0.1"), "x".into())],
                    ..Default::default()
                },
                false,
            ),
            (
                "another claim's reservation",
                Intent {
                    release: vec![(ip("10.0.0.1"), "y".into())],
                    ..Default::default()
                },
                true,
            ),
            (
                "an address with no reservation (a confirmed one)",
                Intent {
                    release: vec![(ip("10.0.0.2"), "x".into())],
                    ..Default::default()
                },
                true,
            ),
        ];
        for (case, intent, kept) in cases {
            let (next, _) = run(&ledger, &intent, &mut rng);
            let address = intent.release[0].0;
            assert_eq!(next.contains(address), kept, "{case}");
        }

        // The interleaving itself, step by step.
        let (after_b, _) = run(
            &ledger,
            &Intent {
                confirm: vec![(ip("10.0.0.2"), "x".into())],
                ..Default::default()
            },
            &mut rng,
        );
        assert!(
            !after_b.contains(ip("10.0.0.1")),
            "x's stale reservation freed"
        );
        let (after_z, outcomes) = run(
            &after_b,
            &Intent {
                allocate: vec![request("z")],
                ..Default::default()
            },
            &mut rng,
        );
        assert_eq!(
            outcomes["z"].as_ref().map(|l| l.address),
            Ok(ip("10.0.0.1"))
        );
        let (confirmed, _) = run(
            &after_z,
            &Intent {
                confirm: vec![(ip("10.0.0.1"), "z".into())],
                ..Default::default()
            },
            &mut rng,
        );
        let (after_a, outcomes) = run(
            &confirmed,
            &Intent {
                release: vec![(ip("10.0.0.1"), "x".into())],
                allocate: vec![request("w")],
                ..Default::default()
            },
            &mut rng,
        );
        assert!(after_a.contains(ip("10.0.0.1")), "z keeps its address");
        assert_eq!(
            outcomes["w"].as_ref().map(|l| l.address),
            Ok(ip("10.0.0.3"))
        );
    }

    #[test]
    fn an_invalid_pool_allocates_nothing_but_keeps_the_ledger() {
        let mut rng = StdRng::seed_from_u64(5);
        let ledger = Ledger::from_addresses([ip("10.0.0.1")]);
        let intent = Intent {
            allocate: vec![request("a")],
            ..Default::default()
        };
        let (next, outcomes) = apply(&ledger, None, &intent, NOW, &mut rng);
        assert_eq!(next, ledger);
        assert_eq!(outcomes["a"], Err(Refusal::PoolInvalid));
    }

    #[test]
    fn confirming_a_claims_address_frees_any_second_reservation_it_got() {
        let mut rng = StdRng::seed_from_u64(6);
        let mut ledger = Ledger::default();
        ledger.insert(ip("10.0.0.1")); // a's address object exists
        ledger.reserve(ip("10.0.0.2"), claim("a").reservation(NOW)); // from a stale view
        ledger.reserve(ip("10.0.0.3"), claim("b").reservation(NOW));
        let intent = Intent {
            confirm: vec![(ip("10.0.0.1"), "a".into())],
            ..Default::default()
        };
        let (next, _) = run(&ledger, &intent, &mut rng);
        assert!(next.contains(ip("10.0.0.1")));
        assert!(!next.contains(ip("10.0.0.2")), "a holds one address");
        assert!(next.contains(ip("10.0.0.3")), "b's reservation is b's");
    }

    fn found(address: &str, uid: &str, shared: bool) -> Found {
        Found {
            address: ip(address),
            claim: claim(uid),
            shared,
        }
    }

    /// An object a claim's status does not name yet is the claim's only where the record says
    /// so; an object someone else made takes, frees and moves nothing.
    #[test]
    fn a_found_object_is_confirmed_only_where_the_record_agrees() {
        let mut rng = StdRng::seed_from_u64(8);
        let mut ledger = Ledger::default();
        ledger.reserve(ip("10.0.0.1"), claim("a").reservation(NOW)); // a's create landed
        ledger.reserve(ip("10.0.0.2"), claim("b").reservation(NOW)); // b's is in flight
        ledger.insert(ip("10.0.0.3")); // c's confirmed address; its status not written yet
        let table = [
            (found("10.0.0.1", "a", false), None),
            (
                found("10.0.0.2", "x", false),
                Some("reserved for claim ns/claim-b"),
            ),
            (found("10.0.0.3", "c", false), None),
            (
                found("10.0.0.3", "y", true),
                Some("another claim's address object"),
            ),
            (
                found("10.0.0.4", "z", false),
                Some("record does not hold it"),
            ),
        ];
        for (found, refused) in table {
            let uid = found.claim.uid.clone();
            let intent = Intent {
                found: vec![found],
                ..Default::default()
            };
            let (next, outcomes) = run(&ledger, &intent, &mut rng);
            match refused {
                None => assert!(!outcomes.contains_key(&uid), "{uid}: {outcomes:?}"),
                Some(why) => {
                    let Some(Err(Refusal::NotHanded { why: said, .. })) = outcomes.get(&uid) else {
                        panic!("{uid} is refused: {outcomes:?}");
                    };
                    assert!(said.contains(why), "{uid}: {said}");
                    assert_eq!(next, ledger, "{uid}: a refused object changes nothing");
                }
            }
        }
        let (next, _) = run(
            &ledger,
            &Intent {
                found: vec![found("10.0.0.1", "a", false)],
                ..Default::default()
            },
            &mut rng,
        );
        assert!(!next.pending.contains_key("10.0.0.1"), "a is confirmed");
        assert!(next.contains(ip("10.0.0.1")));
    }

    #[test]
    fn a_record_is_marked_whole_only_in_the_configmap_it_was_judged_in() {
        let mut rng = StdRng::seed_from_u64(9);
        let ledger = Ledger {
            uid: Some("cm-1".into()),
            ..Default::default()
        };
        assert!(!ledger.whole(), "never judged");
        let judged = |uid: &str| Intent {
            whole_in: Some(uid.into()),
            ..Default::default()
        };
        let (next, _) = run(&ledger, &judged("cm-1"), &mut rng);
        assert!(next.whole());
        // A restore between the judgement and the commit: another ConfigMap is not marked.
        let (next, _) = run(&ledger, &judged("cm-0"), &mut rng);
        assert!(!next.whole());
        let restored = Ledger {
            written_to: Some("cm-0".into()),
            ..ledger
        };
        assert!(!restored.whole(), "a copy of another ConfigMap's record");
    }

    #[test]
    fn a_fenced_ledger_hands_out_nothing_new_but_keeps_reservations() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut ledger = Ledger::default();
        ledger.reserve(ip("10.0.0.2"), claim("a").reservation(NOW));
        ledger.rebuilt_at = Some(NOW.into());
        let intent = Intent {
            allocate: vec![request("a"), request("b")],
            ..Default::default()
        };
        let (next, outcomes) = run(&ledger, &intent, &mut rng);
        assert_eq!(
            outcomes["a"].as_ref().map(|l| l.address),
            Ok(ip("10.0.0.2"))
        );
        assert_eq!(
            outcomes["b"],
            Err(Refusal::Fenced {
                until: "2026-11-30T04:00:37Z".into()
            })
        );
        let (after, outcomes) = run(
            &next,
            &Intent {
                end_fence: true,
                ..intent
            },
            &mut rng,
        );
        assert_eq!(after.rebuilt_at, None);
        assert!(outcomes["b"].is_ok(), "served once the fence ends");
    }

    #[test]
    fn a_gone_claims_reservation_stays_while_its_create_may_land() {
        // Reservation times, against NOW (04:00:00) and the 37 s bound.
        let cases = [
            ("just made", "2026-11-30T04:00:00Z", false),
            ("36 s old", "2026-11-30T03:59:24Z", false),
            ("37 s old", "2026-11-30T03:59:23Z", true),
            ("an hour old", "2026-11-30T03:00:00Z", true),
            ("from a clock ahead", "2026-11-30T04:02:00Z", false),
            ("unreadable", "yesterday", true),
        ];
        let mut rng = StdRng::seed_from_u64(9);
        for (case, since, freed) in cases {
            let mut ledger = Ledger::default();
            ledger.reserve(ip("10.0.0.2"), claim("a").reservation(since));
            let intent = Intent {
                release_unlanded: vec!["a".into()],
                ..Default::default()
            };
            let (next, _) = run(&ledger, &intent, &mut rng);
            assert_eq!(!next.contains(ip("10.0.0.2")), freed, "{case}");
            assert_eq!(next.reservation_of("a").is_none(), freed, "{case}");
        }
    }

    #[test]
    fn a_ledger_whose_bitmaps_are_full_hands_out_nothing_new() {
        let mut rng = StdRng::seed_from_u64(10);
        // Addresses each in a /64 of its own: the costliest there are to record.
        let scattered = (0..20_000u128).map(|i| {
            let value = (0xfd00u128 << 112) | (i << 64) | 1;
            IpAddr::V6(std::net::Ipv6Addr::from(value))
        });
        let mut ledger = Ledger::from_addresses(scattered);
        assert!(
            ledger.bitmap_bytes() >= MAX_BITMAP_BYTES,
            "{}",
            ledger.bitmap_bytes()
        );
        ledger.reserve(ip("10.0.0.2"), claim("a").reservation(NOW));
        let intent = Intent {
            allocate: vec![request("a"), request("b")],
            ..Default::default()
        };
        let (_, outcomes) = run(&ledger, &intent, &mut rng);
        assert_eq!(
            outcomes["a"].as_ref().map(|l| l.address),
            Ok(ip("10.0.0.2")),
            "a reservation is still served"
        );
        assert!(
            matches!(outcomes["b"], Err(Refusal::LedgerFull { bytes }) if bytes >= MAX_BITMAP_BYTES),
            "{:?}",
            outcomes["b"]
        );
    }

    #[test]
    fn reservations_are_bounded() {
        let mut rng = StdRng::seed_from_u64(8);
        let mut ledger = Ledger::default();
        let mut big = AddressSpace::capi(&CapiPool {
            addresses: vec!["10.0.0.0/16".into()],
            prefix: 16,
            ..Default::default()
        })
        .expect("valid");
        let intent = Intent {
            allocate: (0..5000).map(|i| request(&i.to_string())).collect(),
            ..Default::default()
        };
        let (next, outcomes) = apply(&ledger, Some(&mut big), &intent, NOW, &mut rng);
        let fit = next.pending.len();
        assert!(
            (1000..5000).contains(&fit),
            "typical reservations: over a thousand fit, not all; {fit} did"
        );
        let deferred = outcomes
            .values()
            .filter(|o| **o == Err(Refusal::Deferred))
            .count();
        assert_eq!(deferred, 5000 - fit, "every claim that did not fit waits");
        ledger = next;
        assert!(
            ledger
                .to_config_map(Default::default())
                .data
                .map_or(0, |d| d.values().map(String::len).sum::<usize>())
                < 512 * 1024,
            "a full batch of reservations stays far below the object size limit"
        );
    }
}
