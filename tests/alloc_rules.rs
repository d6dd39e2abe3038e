//! The allocation core against each upstream rule, as tables.

use std::collections::BTreeMap;
use std::net::IpAddr;

use bitpool::alloc::{
    AddressSpace, AllocError, CapiPool, Counts, Metal3Entry, Metal3Pool, SpecError, Strategy,
};
use rand::SeedableRng;
use rand::rngs::StdRng;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn capi(addresses: &[&str], prefix: i64) -> CapiPool {
    CapiPool {
        addresses: strings(addresses),
        prefix,
        ..Default::default()
    }
}

fn rng() -> StdRng {
    StdRng::seed_from_u64(7)
}

/// Allocates `n` addresses for claims `c0..`, returning them.
fn take(space: &mut AddressSpace, n: usize) -> Vec<String> {
    let mut rng = rng();
    (0..n)
        .map(|i| {
            space
                .allocate(&format!("c{i}"), None, &mut rng)
                .unwrap_or_else(|e| panic!("allocation {i}: {e}"))
                .address
                .to_string()
        })
        .collect()
}

#[test]
fn in_cluster_provider_rules() {
    struct Case {
        name: &'static str,
        pool: CapiPool,
        first: &'static [&'static str],
        total: u128,
    }
    let cases = [
        Case {
            name: "IPv4 network and broadcast addresses are skipped",
            pool: capi(&["10.0.0.0/24"], 24),
            first: &["10.0.0.1", "10.0.0.2"],
            total: 254,
        },
        Case {
            name: "allocateReservedIPAddresses hands them out",
            pool: CapiPool {
                allocate_reserved: true,
                ..capi(&["10.0.0.0/30"], 30)
            },
            first: &["10.0.0.0", "10.0.0.1", "10.0.0.2", "10.0.0.3"],
            total: 4,
        },
        Case {
            name: "IPv6 skips the subnet-router anycast address but has no broadcast",
            pool: capi(&["fd00::/126"], 126),
            first: &["fd00::1", "fd00::2", "fd00::3"],
            total: 3,
        },
        Case {
            name: "the gateway is never handed out",
            pool: CapiPool {
                gateway: Some("10.0.0.2".into()),
                ..capi(&["10.0.0.1-10.0.0.4"], 24)
            },
            first: &["10.0.0.1", "10.0.0.3", "10.0.0.4"],
            total: 3,
        },
        Case {
            name: "out-of-order entries still give the lowest address first",
            pool: capi(&["10.0.0.50", "10.0.0.10-10.0.0.11", "10.0.0.5/32"], 24),
            first: &["10.0.0.5", "10.0.0.10", "10.0.0.11", "10.0.0.50"],
            total: 4,
        },
        Case {
            name: "excluded addresses, ranges and CIDRs are skipped",
            pool: CapiPool {
                excluded_addresses: strings(&["10.0.0.10-10.0.0.12", "10.0.0.14", "10.0.0.16/30"]),
                ..capi(&["10.0.0.10-10.0.0.20"], 24)
            },
            first: &["10.0.0.13", "10.0.0.15", "10.0.0.20"],
            total: 3,
        },
        Case {
            name: "the reserved subnet comes from the lowest address and the prefix",
            pool: capi(&["10.0.0.255", "10.0.0.1"], 24),
            first: &["10.0.0.1"],
            total: 1,
        },
        Case {
            name: "a range that does not touch the subnet edges loses nothing",
            pool: capi(&["10.0.1.5-10.0.1.7"], 24),
            first: &["10.0.1.5", "10.0.1.6", "10.0.1.7"],
            total: 3,
        },
        Case {
            name: "host bits of a CIDR entry are ignored",
            pool: CapiPool {
                allocate_reserved: true,
                ..capi(&["192.168.1.77/30"], 30)
            },
            first: &[
                "192.168.1.76",
                "192.168.1.77",
                "192.168.1.78",
                "192.168.1.79",
            ],
            total: 4,
        },
        Case {
            name: "prefix 0 for scattered public addresses",
            pool: capi(&["203.0.113.7", "198.51.100.9"], 0),
            first: &["198.51.100.9", "203.0.113.7"],
            total: 2,
        },
    ];
    for case in cases {
        let mut space =
            AddressSpace::capi(&case.pool).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert_eq!(space.counts().total, case.total, "{}", case.name);
        assert_eq!(
            take(&mut space, case.first.len()),
            strings(case.first),
            "{}",
            case.name
        );
    }
}

#[test]
fn addresses_outside_the_subnet_are_refused_a_gateway_outside_it_is_not() {
    // Upstream's webhook: "provided address belongs to a different subnet than others".
    let spanning = AddressSpace::capi(&capi(&["10.0.1.0", "10.0.0.255"], 24))
        .expect_err("two subnets in one pool");
    assert!(spanning.to_string().contains("addresses[0]"), "{spanning}");
    assert!(spanning.to_string().contains("10.0.0.0/24"), "{spanning}");
    // Upstream asks only that a gateway parse and be of the pool's family.
    let mut gateway = capi(&["10.0.0.50/24"], 24);
    gateway.gateway = Some("10.0.1.1".into());
    let space = AddressSpace::capi(&gateway).expect("a gateway in another subnet is valid");
    assert_eq!(space.counts().total, 254);
    assert_eq!(
        gateway.gateway_outside_subnet().as_deref(),
        Some("10.0.0.0/24")
    );
    // An IPv6 link-local gateway beside the last /120 of a subnet; never handed out.
    let mut v6 = capi(&["fe80::ffff/120"], 120);
    v6.gateway = Some("fe80::a".into());
    let mut space = AddressSpace::capi(&v6).expect("valid spec");
    assert_eq!(space.counts().total, 255);
    let lease = space.allocate("c", None, &mut rng()).expect("an address");
    assert_eq!(
        lease.address,
        "fe80::ff01".parse::<std::net::IpAddr>().unwrap()
    );
    assert_eq!(lease.gateway, Some("fe80::a".parse().unwrap()));
    v6.gateway = Some("fe80::ff80".into());
    assert_eq!(v6.gateway_outside_subnet(), None);
    assert_eq!(AddressSpace::capi(&v6).expect("valid").counts().total, 254);
    // prefix 0 puts every address in one subnet (upstream allows it for scattered addresses).
    assert!(AddressSpace::capi(&capi(&["203.0.113.7", "198.51.100.9"], 0)).is_ok());
}

#[test]
fn an_ipv4_slash_31_needs_allocate_reserved() {
    let mut space = AddressSpace::capi(&capi(&["10.0.0.0/31"], 31)).expect("valid spec");
    assert_eq!(space.counts().total, 0);
    assert_eq!(
        space.allocate("c", None, &mut rng()),
        Err(AllocError::Exhausted)
    );
}

#[test]
fn pool_spec_errors_name_the_bad_input() {
    let cases: Vec<(CapiPool, SpecError)> = vec![
        (
            capi(&["10.0.0.1", "banana"], 24),
            SpecError::Unparseable {
                field: "addresses[1]".into(),
                value: "banana".into(),
            },
        ),
        (
            capi(&["10.0.0.9-10.0.0.1"], 24),
            SpecError::ReversedRange {
                field: "addresses[0]".into(),
                value: "10.0.0.9-10.0.0.1".into(),
            },
        ),
        (
            capi(&["10.0.0.1", "fd00::1"], 24),
            SpecError::MixedFamilies {
                field: "addresses[1]".into(),
                value: "fd00::1".into(),
                found: bitpool::alloc::Family::V6,
                pool: bitpool::alloc::Family::V4,
            },
        ),
        (
            capi(&["10.0.0.0/24"], 33),
            SpecError::InvalidPrefix {
                field: "prefix".into(),
                prefix: 33,
                family: bitpool::alloc::Family::V4,
            },
        ),
        (
            capi(&["10.0.0.0/24"], -1),
            SpecError::InvalidPrefix {
                field: "prefix".into(),
                prefix: -1,
                family: bitpool::alloc::Family::V4,
            },
        ),
        (
            CapiPool {
                gateway: Some("fd00::1".into()),
                ..capi(&["10.0.0.0/24"], 24)
            },
            SpecError::MixedFamilies {
                field: "gateway".into(),
                value: "fd00::1".into(),
                found: bitpool::alloc::Family::V6,
                pool: bitpool::alloc::Family::V4,
            },
        ),
        (
            CapiPool {
                excluded_addresses: strings(&["fd00::/64"]),
                ..capi(&["10.0.0.0/24"], 24)
            },
            SpecError::MixedFamilies {
                field: "excludedAddresses[0]".into(),
                value: "fd00::/64".into(),
                found: bitpool::alloc::Family::V6,
                pool: bitpool::alloc::Family::V4,
            },
        ),
        (capi(&[], 24), SpecError::NoAddresses),
        (
            CapiPool {
                pre_allocations: BTreeMap::from([("a".into(), "10.0.1.1".into())]),
                ..capi(&["10.0.0.0/24"], 24)
            },
            SpecError::PreAllocationOutsidePool {
                claim: "a".into(),
                address: ip("10.0.1.1"),
            },
        ),
        (
            CapiPool {
                pre_allocations: BTreeMap::from([
                    ("a".into(), "fd00::5".into()),
                    ("b".into(), "fd00::0005".into()),
                ]),
                ..capi(&["fd00::/64"], 64)
            },
            SpecError::PreAllocationTwice {
                address: ip("fd00::5"),
                first: "a".into(),
                second: "b".into(),
            },
        ),
        (
            CapiPool {
                pre_allocations: BTreeMap::from([("a".into(), "10.0.0.0".into())]),
                ..capi(&["10.0.0.0/24"], 24)
            },
            SpecError::PreAllocationOutsidePool {
                claim: "a".into(),
                address: ip("10.0.0.0"),
            },
        ),
    ];
    for (pool, expected) in cases {
        let got = AddressSpace::capi(&pool)
            .map(|_| ())
            .expect_err("invalid spec");
        assert_eq!(got, expected);
        assert!(!got.to_string().is_empty());
    }
}

#[test]
fn preallocations_are_reserved_up_front_and_compared_canonically() {
    let pool = CapiPool {
        pre_allocations: BTreeMap::from([("host-a".into(), "fd00::0001".into())]),
        ..capi(&["fd00::/125"], 125)
    };
    let mut space = AddressSpace::capi(&pool).expect("valid");
    let mut rng = rng();
    assert_eq!(space.counts().free, 6, "fd00::1 is reserved for host-a");
    assert_eq!(
        space
            .allocate("other", None, &mut rng)
            .expect("free")
            .address,
        ip("fd00::2")
    );
    assert!(!space.is_free(ip("fd00::1")));
    assert_eq!(
        space.allocate("x", Some("fd00::1"), &mut rng),
        Err(AllocError::RequestedPreallocated {
            address: ip("fd00::1"),
            holder: "host-a".into()
        })
    );
    let lease = space
        .allocate("host-a", None, &mut rng)
        .expect("its own address");
    assert_eq!(lease.address, ip("fd00::1"));
    assert_eq!(space.preallocation("host-a"), Some(ip("fd00::1")));
    // Released, it goes back to host-a's reservation, not to the free addresses.
    assert!(space.release(ip("fd00::1")));
    assert!(!space.is_free(ip("fd00::1")));
    assert_eq!(
        space
            .allocate("host-a", Some("fd00:0::1"), &mut rng)
            .expect("again")
            .address,
        ip("fd00::1")
    );
    assert_eq!(
        space.allocate("host-a", None, &mut rng),
        Err(AllocError::PreAllocatedInUse {
            address: ip("fd00::1")
        })
    );
}

#[test]
fn requested_addresses() {
    let pool = CapiPool {
        pre_allocations: BTreeMap::from([("pinned".into(), "10.0.0.9".into())]),
        gateway: Some("10.0.0.1".into()),
        ..capi(&["10.0.0.0/28"], 28)
    };
    let mut space = AddressSpace::capi(&pool).expect("valid");
    let mut rng = rng();
    assert_eq!(
        space
            .allocate("a", Some("10.0.0.7"), &mut rng)
            .expect("free")
            .address,
        ip("10.0.0.7")
    );
    let cases = [
        (
            "b",
            "10.0.0.7",
            AllocError::RequestedInUse {
                address: ip("10.0.0.7"),
            },
        ),
        (
            "b",
            "10.0.0.1",
            AllocError::RequestedOutsidePool {
                address: ip("10.0.0.1"),
            },
        ),
        (
            "b",
            "10.0.1.7",
            AllocError::RequestedOutsidePool {
                address: ip("10.0.1.7"),
            },
        ),
        (
            "b",
            "fd00::7",
            AllocError::RequestedOutsidePool {
                address: ip("fd00::7"),
            },
        ),
        (
            "b",
            "10.0.0.x",
            AllocError::RequestedUnparseable {
                value: "10.0.0.x".into(),
            },
        ),
        (
            "pinned",
            "10.0.0.8",
            AllocError::ConflictsWithPreAllocation {
                requested: ip("10.0.0.8"),
                preallocated: ip("10.0.0.9"),
            },
        ),
    ];
    for (claim, requested, expected) in cases {
        assert_eq!(
            space.allocate(claim, Some(requested), &mut rng),
            Err(expected),
            "{requested}"
        );
    }
    assert_eq!(space.counts().used, 1, "failed requests allocate nothing");
}

#[test]
fn exhaustion_and_recovery() {
    let mut space = AddressSpace::capi(&capi(&["10.0.0.1-10.0.0.3"], 24)).expect("valid");
    take(&mut space, 3);
    assert_eq!(
        space.allocate("late", None, &mut rng()),
        Err(AllocError::Exhausted)
    );
    assert!(space.release(ip("10.0.0.2")));
    assert!(
        !space.release(ip("10.0.0.2")),
        "a second release does nothing"
    );
    assert_eq!(
        space
            .allocate("late", None, &mut rng())
            .expect("freed")
            .address,
        ip("10.0.0.2")
    );
}

#[test]
fn rebuild_counts_addresses_outside_the_pool_as_out_of_range() {
    let mut space = AddressSpace::capi(&CapiPool {
        excluded_addresses: strings(&["10.0.0.5"]),
        gateway: Some("10.0.0.1".into()),
        ..capi(&["10.0.0.0/28"], 28)
    })
    .expect("valid");
    space.mark_all_used(["10.0.0.2", "10.0.0.5", "10.0.0.1", "10.0.1.1", "10.0.0.2"].map(ip));
    assert_eq!(
        space.counts(),
        Counts {
            total: 12,
            used: 4,
            free: 11,
            out_of_range: 3,
            reserved: 0,
        }
    );
    assert_eq!(
        space.mark_used(ip("10.0.0.3")),
        bitpool::alloc::Marked::InRange
    );
    assert_eq!(
        space.mark_used(ip("10.0.0.3")),
        bitpool::alloc::Marked::AlreadyUsed
    );
    assert_eq!(
        space.mark_used(ip("10.0.2.3")),
        bitpool::alloc::Marked::OutOfRange
    );
    assert_eq!(
        space.mark_used(ip("fd00::3")),
        bitpool::alloc::Marked::OtherFamily
    );
    assert_eq!(take(&mut space, 1), strings(&["10.0.0.4"]));
    assert!(
        space.release(ip("10.0.1.1")),
        "out-of-range addresses can be released"
    );
    assert_eq!(space.counts().out_of_range, 3);
}

#[test]
fn huge_ipv6_pools_are_instant_and_counted_exactly() {
    let mut space = AddressSpace::capi(&capi(&["::/0"], 0)).expect("valid");
    assert_eq!(
        space.counts().total,
        u128::MAX,
        "2^128 minus the anycast address"
    );
    assert_eq!(take(&mut space, 2), strings(&["::1", "::2"]));
    let mut slash48 = AddressSpace::capi(&CapiPool {
        strategy: Strategy::Random,
        ..capi(&["2001:db8:1::/48"], 48)
    })
    .expect("valid");
    assert_eq!(slash48.counts().total, (1u128 << 80) - 1);
    let lease = slash48.allocate("r", None, &mut rng()).expect("free");
    assert!(slash48.contains(lease.address));
    assert_eq!(slash48.counts().free, (1u128 << 80) - 2);
}

fn entry(start: Option<&str>, end: Option<&str>, subnet: Option<&str>) -> Metal3Entry {
    Metal3Entry {
        start: start.map(String::from),
        end: end.map(String::from),
        subnet: subnet.map(String::from),
        ..Default::default()
    }
}

#[test]
fn metal3_rules() {
    struct Case {
        name: &'static str,
        pool: Metal3Pool,
        first: &'static [&'static str],
    }
    let m3 = |entries: Vec<Metal3Entry>| Metal3Pool {
        entries,
        prefix: Some(24),
        ..Default::default()
    };
    let cases = [
        Case {
            name: "entries are consumed in declaration order",
            pool: m3(vec![
                entry(Some("10.0.0.20"), Some("10.0.0.21"), None),
                entry(Some("10.0.0.10"), Some("10.0.0.11"), None),
            ]),
            first: &["10.0.0.20", "10.0.0.21", "10.0.0.10", "10.0.0.11"],
        },
        Case {
            name: "a subnet alone starts after its network address and includes its last",
            pool: m3(vec![entry(None, None, Some("10.0.0.0/30"))]),
            first: &["10.0.0.1", "10.0.0.2", "10.0.0.3"],
        },
        Case {
            name: "start with subnet runs to the end of the subnet",
            pool: m3(vec![entry(Some("10.0.0.253"), None, Some("10.0.0.0/24"))]),
            first: &["10.0.0.253", "10.0.0.254", "10.0.0.255"],
        },
        Case {
            name: "a start alone is open-ended",
            pool: m3(vec![entry(Some("10.0.0.254"), None, None)]),
            first: &["10.0.0.254", "10.0.0.255", "10.0.1.0"],
        },
        Case {
            name: "the gateway is never handed out (upstream hands it out)",
            pool: Metal3Pool {
                gateway: Some("10.0.0.1".into()),
                ..m3(vec![entry(None, None, Some("10.0.0.0/24"))])
            },
            first: &["10.0.0.2", "10.0.0.3"],
        },
        Case {
            name: "an address listed twice belongs to the first entry",
            pool: m3(vec![
                entry(Some("10.0.0.5"), Some("10.0.0.6"), None),
                entry(Some("10.0.0.4"), Some("10.0.0.7"), None),
            ]),
            first: &["10.0.0.5", "10.0.0.6", "10.0.0.4", "10.0.0.7"],
        },
    ];
    for case in cases {
        let mut space =
            AddressSpace::metal3(&case.pool).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert_eq!(
            take(&mut space, case.first.len()),
            strings(case.first),
            "{}",
            case.name
        );
    }
}

#[test]
fn metal3_entries_override_prefix_gateway_and_dns() {
    let pool = Metal3Pool {
        entries: vec![
            Metal3Entry {
                prefix: Some(25),
                gateway: Some("10.0.0.129".into()),
                dns_servers: strings(&["10.0.0.53"]),
                ..entry(Some("10.0.0.130"), Some("10.0.0.130"), None)
            },
            entry(Some("10.0.1.10"), Some("10.0.1.10"), Some("10.0.1.0/24")),
        ],
        prefix: Some(16),
        gateway: Some("10.0.0.1".into()),
        dns_servers: strings(&["8.8.8.8"]),
        ..Default::default()
    };
    let mut space = AddressSpace::metal3(&pool).expect("valid");
    let mut rng = rng();
    let first = space.allocate("a", None, &mut rng).expect("free");
    assert_eq!(
        (first.prefix, first.gateway, first.dns_servers),
        (25, Some(ip("10.0.0.129")), vec![ip("10.0.0.53")])
    );
    let second = space.allocate("b", None, &mut rng).expect("free");
    assert_eq!(
        (
            second.address,
            second.prefix,
            second.gateway,
            second.dns_servers
        ),
        (
            ip("10.0.1.10"),
            16,
            Some(ip("10.0.0.1")),
            vec![ip("8.8.8.8")]
        )
    );
}

#[test]
fn a_metal3_preallocation_outside_the_pool_refuses_only_its_claim() {
    let pool = Metal3Pool {
        entries: vec![entry(Some("10.0.0.10"), Some("10.0.0.11"), None)],
        pre_allocations: BTreeMap::from([("lost".to_string(), "10.0.9.9".to_string())]),
        ..Default::default()
    };
    let mut space = AddressSpace::metal3(&pool).expect("the pool still works");
    assert_eq!(
        space.allocate("lost", None, &mut rng()),
        Err(AllocError::PreAllocationOutOfBounds {
            address: ip("10.0.9.9")
        })
    );
    assert_eq!(
        space
            .allocate("other", None, &mut rng())
            .expect("free")
            .address,
        ip("10.0.0.10")
    );
}

#[test]
fn metal3_spec_errors() {
    let cases = [
        (
            Metal3Pool {
                entries: vec![entry(None, Some("10.0.0.9"), None)],
                ..Default::default()
            },
            SpecError::EntryWithoutStart { index: 0 },
        ),
        (
            Metal3Pool {
                entries: vec![entry(Some("10.0.0.9"), Some("10.0.0.1"), None)],
                ..Default::default()
            },
            SpecError::ReversedRange {
                field: "pools[0]".into(),
                value: "10.0.0.9-10.0.0.1".into(),
            },
        ),
        (
            Metal3Pool {
                entries: vec![
                    entry(None, None, Some("10.0.0.0/24")),
                    entry(None, None, Some("fd00::/64")),
                ],
                ..Default::default()
            },
            SpecError::MixedFamilies {
                field: "pools[1].subnet".into(),
                value: "fd00::/64".into(),
                found: bitpool::alloc::Family::V6,
                pool: bitpool::alloc::Family::V4,
            },
        ),
        (
            Metal3Pool {
                entries: vec![entry(None, None, Some("10.0.0.0/24"))],
                prefix: Some(64),
                ..Default::default()
            },
            SpecError::InvalidPrefix {
                field: "prefix".into(),
                prefix: 64,
                family: bitpool::alloc::Family::V4,
            },
        ),
        (
            Metal3Pool {
                entries: vec![entry(None, None, Some("10.0.0.0/24"))],
                dns_servers: strings(&["dns.example"]),
                ..Default::default()
            },
            SpecError::InvalidAddress {
                field: "dnsServers[0]".into(),
                value: "dns.example".into(),
            },
        ),
        (Metal3Pool::default(), SpecError::NoAddresses),
    ];
    for (pool, expected) in cases {
        assert_eq!(AddressSpace::metal3(&pool).map(|_| ()), Err(expected));
    }
}

/// Random allocation in a pool far larger than its use spreads over a window that grows with
/// use (64 times the addresses in use, at least 65,536): uniform in it, dense enough for the
/// ledger, never beyond it.
#[test]
fn random_allocation_in_a_huge_pool_spreads_over_a_window_that_grows() {
    let mut space = AddressSpace::capi(&CapiPool {
        strategy: Strategy::Random,
        ..capi(&["2001:db8::/64"], 64)
    })
    .expect("valid");
    let base = u128::from("2001:db8::".parse::<std::net::Ipv6Addr>().expect("literal"));
    let mut rng = rng();
    let mut offsets = Vec::new();
    for i in 0..5000u128 {
        let window = space.random_window(i);
        assert_eq!(window, ((i + 1) * 64).max(1 << 16));
        let lease = space
            .allocate(&format!("c{i}"), None, &mut rng)
            .expect("free");
        let IpAddr::V6(address) = lease.address else {
            panic!("an IPv6 pool gave {}", lease.address)
        };
        let offset = u128::from(address) - base;
        // Ordinals count from the first address handed out (the anycast address is not).
        assert!(
            offset <= window,
            "address {address} beyond the window of {window}"
        );
        offsets.push(offset);
    }
    offsets.sort();
    offsets.dedup();
    assert_eq!(offsets.len(), 5000, "no address twice");
    // Spread, not sequential: the later addresses reach far into the grown window.
    assert!(*offsets.last().expect("some") > 200_000);
    // A small pool is random throughout.
    let small = AddressSpace::capi(&capi(&["10.0.0.0/24"], 24)).expect("valid");
    assert_eq!(small.random_window(0), small.counts().total);
}
