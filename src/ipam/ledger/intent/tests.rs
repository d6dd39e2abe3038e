//! The transaction's rules, one case each, with no cluster.

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
