//! The pool specs' parsing and layout, case by case.

use super::*;

#[test]
fn subtract_removes_points_and_ranges() {
    assert_eq!(subtract(&[(0, 10)], &[(0, 0), (10, 10)]), vec![(1, 9)]);
    assert_eq!(
        subtract(&[(0, 10), (20, 30)], &[(5, 25)]),
        vec![(0, 4), (26, 30)]
    );
    assert_eq!(subtract(&[(0, 10)], &[(0, 10)]), vec![]);
    assert_eq!(
        subtract(&[(0, u128::MAX)], &[(u128::MAX, u128::MAX)]),
        vec![(0, u128::MAX - 1)]
    );
    assert_eq!(subtract(&[(5, 9)], &[(1, 2), (11, 12)]), vec![(5, 9)]);
}

fn subnet(addresses: &[&str], prefix: i64, gateway: Option<&str>) -> CapiSubnet {
    CapiSubnet {
        addresses: addresses.iter().map(|a| a.to_string()).collect(),
        prefix,
        gateway: gateway.map(str::to_string),
        dns_servers: Vec::new(),
    }
}

fn racks(subnets: Vec<CapiSubnet>) -> CapiPool {
    CapiPool {
        addresses: vec!["10.0.1.0/24".into()],
        prefix: 24,
        gateway: Some("10.0.1.1".into()),
        dns_servers: vec!["10.0.0.53".into()],
        subnets,
        ..Default::default()
    }
}

fn v4(text: &str) -> u128 {
    family::to_value(text.parse().expect("an address"))
}

/// Each subnet keeps out its own network and broadcast addresses and gateway; segments run
/// lowest first whichever subnet they are in, each with its subnet's lease parameters.
#[test]
fn a_pool_of_several_subnets_hands_out_each_with_its_own_parameters() {
    let mut lower = subnet(&["10.0.0.0/25"], 25, Some("10.0.0.126"));
    lower.dns_servers = vec!["10.0.0.54".into()];
    let pool = racks(vec![lower, subnet(&["10.0.2.10-10.0.2.20"], 24, None)]);
    let layout = pool.layout().expect("a valid pool");
    let segments: Vec<(u128, u128, usize)> = layout
        .segments
        .iter()
        .map(|s| (s.first, s.last, s.params))
        .collect();
    assert_eq!(
        segments,
        [
            (v4("10.0.0.1"), v4("10.0.0.125"), 1),
            (v4("10.0.1.2"), v4("10.0.1.254"), 0),
            (v4("10.0.2.10"), v4("10.0.2.20"), 2),
        ]
    );
    let gateway = |p: &LeaseParams| p.gateway.map(|g| g.to_string());
    let params: Vec<(u8, Option<String>, usize)> = layout
        .params
        .iter()
        .map(|p| (p.prefix, gateway(p), p.dns_servers.len()))
        .collect();
    assert_eq!(
        params,
        [
            (24, Some("10.0.1.1".into()), 1),
            (25, Some("10.0.0.126".into()), 1),
            (24, None, 1),
        ]
    );
    assert_eq!(layout.params[1].dns_servers[0].to_string(), "10.0.0.54");
    assert_eq!(layout.params[2].dns_servers[0].to_string(), "10.0.0.53");
}

#[test]
fn subnets_that_are_not_apart_or_not_whole_are_refused_naming_the_subnet() {
    let error = |subnets| racks(subnets).layout().expect_err("invalid").to_string();
    assert_eq!(
        error(vec![subnet(&["10.0.1.128/25"], 25, None)]),
        "subnets[0]: subnet 10.0.1.128/25 overlaps subnet 10.0.1.0/24 of addresses; a pool's subnets are apart"
    );
    assert_eq!(
        error(vec![
            subnet(&["10.0.2.5"], 24, None),
            subnet(&["10.0.2.9"], 23, None)
        ]),
        "subnets[1]: subnet 10.0.2.0/23 overlaps subnet 10.0.2.0/24 of subnets[0]; a pool's subnets are apart"
    );
    assert!(
        error(vec![subnet(&["10.0.2.5"], 24, Some("10.0.3.1"))])
            .starts_with("subnets[0].gateway: gateway 10.0.3.1 is outside its subnet 10.0.2.0/24")
    );
    assert!(
        error(vec![subnet(&["10.0.2.5", "10.0.3.5"], 24, None)]).starts_with(
            "subnets[0].addresses[1]: \"10.0.3.5\" is outside the pool's subnet 10.0.2.0/24"
        )
    );
    assert_eq!(
        error(vec![subnet(&[], 24, None)]),
        "subnets[0].addresses: a subnet needs at least one address"
    );
    assert!(
        error(vec![subnet(&["10.0.2.5"], 33, None)])
            .starts_with("subnets[0].prefix: prefix 33 is not valid for IPv4")
    );
    assert!(error(vec![subnet(&["fd00::5"], 64, None)]).starts_with("subnets[0].addresses[0]"));
}

#[test]
fn an_ipv6_subnet_may_name_a_link_local_gateway() {
    let pool = CapiPool {
        addresses: vec!["fd00:1::10-fd00:1::20".into()],
        prefix: 64,
        subnets: vec![subnet(&["fd00:2::10-fd00:2::20"], 64, Some("fe80::1"))],
        ..Default::default()
    };
    let layout = pool.layout().expect("a valid pool");
    assert_eq!(
        layout.params[1].gateway.map(|g| g.to_string()).as_deref(),
        Some("fe80::1")
    );
}

#[test]
fn normalize_merges_adjacent_and_overlapping() {
    assert_eq!(
        normalize(vec![(5, 9), (0, 4), (7, 12), (20, 20)]),
        vec![(0, 12), (20, 20)]
    );
    assert_eq!(
        normalize(vec![(0, u128::MAX), (3, 4)]),
        vec![(0, u128::MAX)]
    );
}
