//! The rules' tests: the messages each rule gives, and where it gives none.

use std::collections::BTreeMap;

use super::*;
use crate::alloc::Layout;
use crate::api::AllocationStrategy;
use crate::api::capi_pools::{InClusterIPPoolSpec, InClusterPrefixPoolSpec};
use crate::api::metal3_data::Metal3DataTemplateSpec;
use crate::api::metal3_ipam::{IPPoolSpec, Metal3IPAddressSpec};

#[test]
fn bare_preallocation_keys_of_a_global_pool_without_a_namespace_are_warned_of() {
    let keys = BTreeMap::from([
        ("vip".to_string(), "10.0.0.5".to_string()),
        ("infra/api".to_string(), "10.0.0.6".to_string()),
    ]);
    let warnings = bare_preallocation_warnings(&keys, None);
    assert_eq!(warnings.len(), 1);
    assert!(
        warnings[0].starts_with("spec.preAllocations: vip name(s) no namespace"),
        "{warnings:?}"
    );
    assert!(warnings[0].contains("ipam.bitpool.dev/preallocation-namespace"));
    assert!(bare_preallocation_warnings(&keys, Some("infra")).is_empty());
    let qualified = BTreeMap::from([("infra/api".to_string(), "10.0.0.6".to_string())]);
    assert!(bare_preallocation_warnings(&qualified, None).is_empty());
}
use crate::api::metal3_ipam::Metal3PoolRange;

fn capi(addresses: &[&str], prefix: i32, gateway: Option<&str>) -> InClusterIPPoolSpec {
    InClusterIPPoolSpec {
        addresses: addresses.iter().map(|s| s.to_string()).collect(),
        prefix,
        gateway: gateway.map(str::to_string),
        ..Default::default()
    }
}

fn problems(result: Result<Layout, Vec<String>>) -> String {
    result.err().unwrap_or_default().join("; ")
}

#[test]
fn capi_pools_get_upstreams_messages_with_the_field() {
    let cases: &[(InClusterIPPoolSpec, &str)] = &[
        (capi(&[], 24, None), "spec.addresses: addresses is required"),
        (capi(&["10.0.0.1"], -1, None), "a valid prefix is required"),
        (
            capi(&["not-an-ip"], 24, None),
            "provided address is not a valid IP, range, nor CIDR",
        ),
        (
            capi(&["10.0.0.1", "fd00::1"], 24, None),
            "provided addresses are of mixed IP families",
        ),
        (
            capi(&["10.0.0.1"], 24, Some("fd00::1")),
            "provided gateway and addresses are of mixed IP families",
        ),
        (
            capi(&["10.0.0.1", "10.0.1.1"], 24, None),
            "provided address belongs to a different subnet than others",
        ),
        (
            capi(&["10.0.0.1"], 99, None),
            "provided prefix is not valid",
        ),
    ];
    for (spec, expected) in cases {
        let found = problems(capi_pool(spec));
        assert!(found.contains(expected), "{spec:?}: {found}");
        assert!(found.starts_with("spec"), "names the field: {found}");
    }
    let mut excluded = capi(&["10.0.0.1"], 24, None);
    excluded.excluded_addresses = vec!["fd00::1".into()];
    assert!(
        problems(capi_pool(&excluded))
            .contains("addresses and excluded addresses are of mixed IP families")
    );
    let mut grace = capi(&["10.0.0.1"], 24, None);
    grace.address_reuse_grace_period_seconds = Some(-1);
    assert!(problems(capi_pool(&grace)).contains("must not be negative"));
    let mut twice = capi(&["10.0.0.0/24"], 24, None);
    twice.pre_allocations = [
        ("a".into(), "10.0.0.5".into()),
        ("b".into(), "10.0.0.5".into()),
    ]
    .into();
    assert!(problems(capi_pool(&twice)).contains("preAllocations"));
    let mut outside = capi(&["10.0.0.0/28"], 24, None);
    outside.pre_allocations = [("a".into(), "10.0.0.200".into())].into();
    assert!(problems(capi_pool(&outside)).contains("is not in the pool"));
    assert!(capi_pool(&capi(&["10.0.0.10-10.0.0.20"], 24, Some("10.0.0.1"))).is_ok());
}

/// A problem in `spec.subnets` names the subnet and the rule, in bitpool's words only.
#[test]
fn subnet_problems_name_the_subnet() {
    let with = |addresses: &[&str], prefix: i32, gateway: Option<&str>| {
        let mut spec = capi(&["10.0.0.10-10.0.0.20"], 24, Some("10.0.0.1"));
        spec.subnets = vec![crate::api::capi_pools::PoolSubnet {
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            prefix,
            gateway: gateway.map(str::to_string),
            dns_servers: Vec::new(),
        }];
        spec
    };
    assert!(capi_pool(&with(&["10.0.1.10-10.0.1.20"], 24, Some("10.0.1.1"))).is_ok());
    let cases = [
        (
            with(&["10.0.0.100"], 24, None),
            "spec.subnets[0]: subnet 10.0.0.0/24 overlaps subnet 10.0.0.0/24 of addresses",
        ),
        (
            with(&["10.0.1.10"], 24, Some("10.0.2.1")),
            "spec.subnets[0].gateway: gateway 10.0.2.1 is outside its subnet 10.0.1.0/24",
        ),
        (
            with(&["10.0.1.10", "10.0.5.1"], 24, None),
            "spec.subnets[0].addresses[1]: \"10.0.5.1\" is outside the pool's subnet 10.0.1.0/24",
        ),
    ];
    for (spec, expected) in cases {
        let found = problems(capi_pool(&spec));
        assert!(found.starts_with(expected), "{found}");
        assert!(!found.contains("provided"), "no upstream words: {found}");
    }
}

fn metal3(pools: Vec<Metal3PoolRange>) -> IPPoolSpec {
    IPPoolSpec {
        name_prefix: "p".into(),
        pools,
        prefix: Some(24),
        ..Default::default()
    }
}

fn range(start: Option<&str>, end: Option<&str>, subnet: Option<&str>) -> Metal3PoolRange {
    Metal3PoolRange {
        start: start.map(str::to_string),
        end: end.map(str::to_string),
        subnet: subnet.map(str::to_string),
        ..Default::default()
    }
}

#[test]
fn metal3_pools_follow_upstreams_rules() {
    let empty = problems(metal3_pool(&metal3(vec![range(None, None, None)])));
    assert!(
        empty.contains("spec.pools[0]: at least one of start, end or subnet"),
        "{empty}"
    );
    let reversed = problems(metal3_pool(&metal3(vec![range(
        Some("10.0.0.9"),
        Some("10.0.0.1"),
        None,
    )])));
    assert!(reversed.contains("ends before it starts"), "{reversed}");
    let mut random = metal3(vec![range(Some("10.0.0.1"), None, None)]);
    random.allocation_strategy = Some(AllocationStrategy::Random);
    assert!(
        problems(metal3_pool(&random)).contains("random allocation strategy needs a bounded range")
    );
    let mut outside = metal3(vec![range(Some("10.0.0.1"), Some("10.0.0.9"), None)]);
    outside.pre_allocations = [("c".into(), "10.0.0.50".into())].into();
    assert!(
        problems(metal3_pool(&outside))
            .contains("spec.preAllocations[c]: 10.0.0.50 is out of bounds")
    );
    let mut twice = metal3(vec![range(None, None, Some("fd00::/120"))]);
    twice.prefix = Some(120);
    twice.pre_allocations = [
        ("a".into(), "fd00::5".into()),
        ("b".into(), "fd00::0005".into()),
    ]
    .into();
    assert!(problems(metal3_pool(&twice)).contains("given to both"));
    let mut bad_gateway = metal3(vec![range(None, None, Some("10.0.0.0/24"))]);
    bad_gateway.gateway = Some("gw".into());
    assert!(problems(metal3_pool(&bad_gateway)).contains("gateway"));

    let old = metal3(vec![range(None, None, Some("10.0.0.0/24"))]);
    let mut new = old.clone();
    new.name_prefix = "q".into();
    new.allocation_strategy = Some(AllocationStrategy::Random);
    let fixed = metal3_pool_update(&old, &new).join("; ");
    assert!(
        fixed.contains("spec.namePrefix: cannot be modified"),
        "{fixed}"
    );
    assert!(
        fixed.contains("spec.allocationStrategy: cannot be modified after creation"),
        "{fixed}"
    );
    let mut defaulted = old.clone();
    defaulted.allocation_strategy = Some(AllocationStrategy::Sequential);
    assert!(
        metal3_pool_update(&old, &defaulted).is_empty(),
        "unset is sequential"
    );
    let small = metal3_pool(&metal3(vec![range(
        Some("10.0.0.1"),
        Some("10.0.0.9"),
        None,
    )]))
    .expect("valid");
    let indexes = [
        ("c1".to_string(), "10.0.0.20".to_string()),
        ("c2".to_string(), "10.0.0.2".to_string()),
    ]
    .into();
    let out = metal3_indexes_in_bounds(&indexes, &small).join("; ");
    assert!(
        out.contains("10.0.0.20 (claim c1) is in use but out of bounds") && !out.contains("c2"),
        "{out}"
    );
}

fn held(pairs: &[(&str, &str)]) -> Vec<Held> {
    pairs
        .iter()
        .map(|(a, c)| Held {
            address: a.to_string(),
            claim: c.to_string(),
        })
        .collect()
}

#[test]
fn shrinking_below_an_allocated_address_names_it() {
    let old = capi_pool(&capi(&["10.0.0.0/24"], 24, None)).expect("valid");
    let new = capi_pool(&capi(&["10.0.0.1-10.0.0.9"], 24, None)).expect("valid");
    let allocated = held(&[("10.0.0.5", "keep"), ("10.0.0.50", "lost")]);
    let found = shrink(&allocated, Some(&old), &new).join("; ");
    assert!(
        found.contains("pool addresses do not contain allocated addresses: 10.0.0.50 (claim lost)"),
        "{found}"
    );
    assert!(
        !found.contains("(claim keep)") && found.contains(ALLOW_SHRINK_ANNOTATION),
        "{found}"
    );
    // Making an allocated address the gateway removes it too.
    let gateway = capi_pool(&capi(&["10.0.0.0/24"], 24, Some("10.0.0.5"))).expect("valid");
    assert!(
        shrink(&allocated, Some(&old), &gateway)
            .join("")
            .contains("10.0.0.5 (claim keep)")
    );
    // An address outside the old pool already was out of range: not this update's doing.
    let stray = held(&[("10.0.9.9", "stray")]);
    assert!(shrink(&stray, Some(&old), &new).is_empty());
    assert!(shrink(&allocated, Some(&old), &old).is_empty());
}

#[test]
fn deleting_a_pool_in_use_names_count_and_claims() {
    assert!(delete(&[]).is_empty());
    let many: Vec<Held> = (0..12)
        .map(|i| Held {
            address: format!("10.0.0.{i}"),
            claim: format!("c{i}"),
        })
        .collect();
    let found = delete(&many).join("");
    assert!(found.starts_with("Pool has IPAddresses allocated. Cannot delete Pool until all IPAddresses have been removed."), "{found}");
    assert!(
        found.contains("12 address(es)")
            && found.contains("c0, c1")
            && found.contains("and 2 more"),
        "{found}"
    );
}

#[test]
fn overlap_is_found_across_pools_of_one_family() {
    let a = capi_pool(&capi(&["10.0.0.0/24"], 24, None)).expect("valid");
    let b = capi_pool(&capi(&["10.0.0.100-10.0.0.120"], 24, None)).expect("valid");
    let c = capi_pool(&capi(&["10.0.1.0/24"], 24, None)).expect("valid");
    let v6 = capi_pool(&capi(&["fd00::/120"], 120, None)).expect("valid");
    let others = vec![
        ("InClusterIPPool ns/b".to_string(), b),
        ("InClusterIPPool ns/c".to_string(), c),
        ("GlobalInClusterIPPool v6".to_string(), v6),
    ];
    assert_eq!(
        overlaps(&a, &others),
        vec!["spec: the pool's addresses overlap those of InClusterIPPool ns/b".to_string()]
    );
}

#[test]
fn a_prefix_pool_overlaps_by_the_addresses_its_sub_prefixes_cover() {
    let mut spec = prefixes(&["10.0.0.0/24"], 26);
    spec.excluded_prefixes = vec!["10.0.0.64/26".into()];
    let sub_prefixes = prefix_addresses(&prefix_pool(&spec).expect("valid"));
    let inside_excluded = capi_pool(&capi(&["10.0.0.70-10.0.0.80"], 24, None)).expect("valid");
    let in_last = capi_pool(&capi(&["10.0.0.200"], 24, None)).expect("valid");
    let beyond = capi_pool(&capi(&["10.0.1.0/24"], 24, None)).expect("valid");
    let others = vec![
        ("InClusterIPPool ns/excluded".to_string(), inside_excluded),
        ("InClusterIPPool ns/last".to_string(), in_last),
        ("InClusterIPPool ns/beyond".to_string(), beyond),
    ];
    assert_eq!(
        overlaps(&sub_prefixes, &others),
        vec!["spec: the pool's addresses overlap those of InClusterIPPool ns/last".to_string()]
    );
}

#[test]
fn requested_addresses_parse_and_lie_in_the_pool() {
    let pool = capi_pool(&capi(&["10.0.0.0/24"], 24, None)).expect("valid");
    assert!(requested_address(None, Some(&pool)).is_empty());
    assert!(requested_address(Some("10.0.0.7"), Some(&pool)).is_empty());
    assert!(
        requested_address(Some("10.0.0.7"), None).is_empty(),
        "pool unknown yet"
    );
    assert!(
        requested_address(Some("ten"), None)[0].contains("Invalid ipAddress annotation \"ten\"")
    );
    assert!(
        requested_address(Some("10.0.5.7"), Some(&pool))[0]
            .contains("10.0.5.7 is not an address of the pool")
    );
}

#[test]
fn templates_name_a_pool_for_every_static_network_and_stay_fixed() {
    let template = |ipv4: serde_json::Value| -> Metal3DataTemplateSpec {
        serde_json::from_value(
            serde_json::json!({"clusterName": "c", "networkData": {"networks": {"ipv4": ipv4}}}),
        )
        .expect("template")
    };
    let without = template(serde_json::json!([{"id": "n", "link": "eth0"}]));
    assert_eq!(
        data_template(None, &without),
        vec!["spec.networkData.networks.ipv4[0].fromPoolRef.name: Required value: fromPoolRef needs to contain a reference to an IPPool".to_string()]
    );
    for source in [
        serde_json::json!({"fromPoolRef": {"kind": "IPPool", "name": "p"}}),
        serde_json::json!({"ipAddressFromIPPool": "p"}),
        serde_json::json!({"fromPoolAnnotation": {"object": "machine", "annotation": "a"}}),
    ] {
        let mut network = serde_json::json!({"id": "n", "link": "eth0"});
        for (k, v) in source.as_object().into_iter().flatten() {
            network[k] = v.clone();
        }
        let spec = template(serde_json::json!([network]));
        assert!(data_template(None, &spec).is_empty(), "{source}");
        assert_eq!(data_template(Some(&spec), &spec), Vec::<String>::new());
        assert_eq!(
            data_template(Some(&spec), &without),
            vec!["spec.networkData: cannot be modified".to_string()]
        );
        assert!(
            data_template(Some(&without), &without).is_empty(),
            "a template stored before the rule still updates"
        );
    }
}

#[test]
fn ipclaims_and_metal3_addresses_are_fixed_after_creation() {
    let r = |name: &str, ns: Option<&str>| Reference {
        name: name.into(),
        namespace: ns.map(str::to_string),
        kind: Some("IPPool".into()),
    };
    assert_eq!(
        ipclaim(None, &r("", None)),
        vec!["spec.pool.name: cannot be empty".to_string()]
    );
    let changed = ipclaim(Some(&r("a", None)), &r("b", Some("x"))).join("; ");
    assert!(
        changed.contains("spec.pool.name: cannot be modified")
            && changed.contains("spec.pool.namespace"),
        "{changed}"
    );
    let reference = |name: &str| k8s_openapi::api::core::v1::ObjectReference {
        name: Some(name.into()),
        ..Default::default()
    };
    let spec = |address: &str| Metal3IPAddressSpec {
        claim: reference("c"),
        pool: reference("p"),
        address: address.into(),
        ..Default::default()
    };
    assert!(metal3_address(None, &spec("10.0.0.1")).is_empty());
    assert!(metal3_address(None, &spec("x"))[0].contains("\"x\" is not a valid IP address"));
    assert!(
        metal3_address(Some(&spec("10.0.0.1")), &spec("10.0.0.2"))[0]
            .contains("spec.address: cannot be modified")
    );
    assert!(
        metal3_address(Some(&spec("x")), &spec("x")).is_empty(),
        "stored before the rule, still updates"
    );
}

fn prefixes(prefixes: &[&str], length: i32) -> InClusterPrefixPoolSpec {
    InClusterPrefixPoolSpec {
        prefixes: prefixes.iter().map(|s| s.to_string()).collect(),
        allocation_prefix_length: length,
        ..Default::default()
    }
}

#[test]
fn prefix_pools_are_refused_naming_field_and_rule() {
    let cases: &[(InClusterPrefixPoolSpec, &str)] = &[
        (prefixes(&[], 64), "spec.prefixes: prefixes is required"),
        (prefixes(&["fd00::/48"], 0), "between 1 and 128 (got 0)"),
        (prefixes(&["fd00::/48"], 129), "between 1 and 128 (got 129)"),
        (
            prefixes(&["fd00::1/48"], 64),
            "\"fd00::1/48\" is not network aligned",
        ),
        (
            prefixes(&["fd00::/72"], 64),
            "longer than allocationPrefixLength 64",
        ),
        (
            prefixes(&["10.0.0.0/8"], 64),
            "allocationPrefixLength 64 is not valid for IPv4",
        ),
        (
            prefixes(&["fd00::/48", "10.0.0.0/8"], 64),
            "one address family",
        ),
        (
            InClusterPrefixPoolSpec {
                excluded_prefixes: vec!["fd01::/64".into()],
                ..prefixes(&["fd00::/48"], 64)
            },
            "excludedPrefixes[0]: \"fd01::/64\" is not inside the pool's prefixes",
        ),
    ];
    for (spec, expected) in cases {
        let problems = prefix_pool(spec).err().unwrap_or_default().join("; ");
        assert!(problems.contains(expected), "{spec:?}: {problems}");
    }
    assert!(
        prefix_pool(&prefixes(&["10.0.0.0/8"], 24)).is_ok(),
        "IPv4 is served too"
    );
}

#[test]
fn a_requested_sub_prefix_must_be_one_of_the_pool() {
    let pool = prefix_pool(&prefixes(&["fd00::/56"], 64)).expect("valid");
    assert!(requested_prefix(Some("fd00:0:0:5::/64"), Some(&pool)).is_empty());
    assert!(requested_prefix(Some("fd00:0:0:5::"), Some(&pool)).is_empty());
    assert!(requested_prefix(None, Some(&pool)).is_empty());
    let found = requested_prefix(Some("fd00:0:0:5::1"), Some(&pool)).join("; ");
    assert!(found.contains("not a /64 sub-prefix"), "{found}");
    let found = requested_prefix(Some("fd00:0:1::/64"), Some(&pool)).join("; ");
    assert!(
        found.contains("fd00:0:1::/64 is not a sub-prefix of the pool"),
        "{found}"
    );
    assert!(
        requested_prefix(Some("anything"), None).is_empty(),
        "no pool, no rule"
    );
}

#[test]
fn a_prefix_pool_update_keeps_its_length_and_every_allocated_sub_prefix() {
    let old = prefixes(&["fd00::/56"], 64);
    let allocated = held(&[("fd00:0:0:5::", "a"), ("fd00:0:0:80::", "b")]);
    let valid = |spec: &InClusterPrefixPoolSpec| prefix_pool(spec).expect("valid");

    let longer = valid(&prefixes(&["fd00::/56"], 80));
    let found = prefix_pool_update(&allocated, &old, (&longer.0, longer.1), true);
    assert_eq!(found, ["spec.allocationPrefixLength is immutable"]);

    let shrunk = valid(&prefixes(&["fd00::/57"], 64));
    let found = prefix_pool_update(&allocated, &old, (&shrunk.0, shrunk.1), false).join("; ");
    assert!(
        found.contains("fd00:0:0:80::/64 (claim b)") && !found.contains("claim a"),
        "{found}"
    );
    let excluded = valid(&InClusterPrefixPoolSpec {
        excluded_prefixes: vec!["fd00:0:0:5::1".into()],
        ..old.clone()
    });
    let found = prefix_pool_update(&allocated, &old, (&excluded.0, excluded.1), false);
    assert!(
        found.join("; ").contains("fd00:0:0:5::/64 (claim a)"),
        "{found:?}"
    );
    assert!(prefix_pool_update(&allocated, &old, (&shrunk.0, shrunk.1), true).is_empty());
    let grown = valid(&prefixes(&["fd00::/48"], 64));
    assert!(prefix_pool_update(&allocated, &old, (&grown.0, grown.1), false).is_empty());
}
