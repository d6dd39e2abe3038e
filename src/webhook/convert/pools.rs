//! Conversion of InClusterIPPool and GlobalInClusterIPPool between v1alpha1 (`subnet`, `start`,
//! `end`) and v1alpha2 (storage: `addresses` only), lossless both ways.
//!
//! Up, the in-cluster provider's mapping: a `subnet` gives `start`/`end` defaults (its second and
//! second-last addresses) and the prefix when none is set, and `start-end` is appended to
//! `addresses`. What one version cannot hold is kept in the annotation the in-cluster provider
//! (and Cluster API) use, [`CONVERSION_DATA_ANNOTATION`]: on a v1alpha2 object the v1alpha1 spec
//! it came from (restored on the way down while it still describes the same pool), on a v1alpha1
//! object the v1alpha2 fields v1alpha1 has no place for (restored on the way up).

use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::{Map, Value};

use super::shared::{ConversionError, field, take_annotation};
use crate::alloc::Family;
use crate::api::capi_pools::{CONVERSION_DATA_ANNOTATION, v1alpha1};

/// The apiVersion of the in-cluster provider's first API, still served.
pub const V1ALPHA1: &str = "ipam.cluster.x-k8s.io/v1alpha1";
/// The apiVersion the pools are stored at.
pub const V1ALPHA2: &str = "ipam.cluster.x-k8s.io/v1alpha2";
/// The kinds converted here; both share one spec.
pub const KINDS: [&str; 2] = ["InClusterIPPool", "GlobalInClusterIPPool"];
/// The v1alpha2 spec fields that v1alpha1 also has.
const SHARED_FIELDS: [&str; 3] = ["addresses", "prefix", "gateway"];

/// One pool object to `desired` (an apiVersion).
pub fn convert(object: Value, desired: &str) -> Result<Value, ConversionError> {
    let from = field(&object, "/apiVersion").to_string();
    let kind = field(&object, "/kind").to_string();
    match (KINDS.contains(&kind.as_str()), from.as_str(), desired) {
        (true, V1ALPHA1, V1ALPHA2) => to_v1alpha2(object),
        (true, V1ALPHA2, V1ALPHA1) => to_v1alpha1(object),
        _ => Err(ConversionError::Unsupported {
            name: field(&object, "/metadata/name").to_string(),
            kind,
            from,
            to: desired.to_string(),
        }),
    }
}

fn spec_of(object: &Value) -> Map<String, Value> {
    object
        .get("spec")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// The annotation's value, parsed, and the object without it.
fn take_data(object: &mut Value) -> Option<Value> {
    take_annotation(object, CONVERSION_DATA_ANNOTATION)
}

fn put_data(object: &mut Value, version: &str, kind: &str, spec: Value) {
    let data = serde_json::json!({ "apiVersion": version, "kind": kind, "spec": spec });
    if !object["metadata"].is_object() {
        object["metadata"] = Value::Object(Map::new());
    }
    if !object["metadata"]["annotations"].is_object() {
        object["metadata"]["annotations"] = Value::Object(Map::new());
    }
    object["metadata"]["annotations"][CONVERSION_DATA_ANNOTATION] = Value::String(data.to_string());
}

fn parse_v1alpha1(
    name: &str,
    spec: Map<String, Value>,
) -> Result<v1alpha1::InClusterIPPoolSpec, ConversionError> {
    serde_json::from_value(Value::Object(spec)).map_err(|e| ConversionError::Spec {
        name: name.to_string(),
        version: "v1alpha1",
        reason: e.to_string(),
    })
}

/// The in-cluster provider's mapping of the v1alpha1 fields to `addresses`, `prefix`, `gateway`.
/// A subnet that does not parse is kept in `addresses` as written, so that the pool is refused
/// with a message naming it instead of losing it.
pub fn shared_fields(spec: &v1alpha1::InClusterIPPoolSpec) -> (Vec<String>, i32, Option<String>) {
    let mut addresses = spec.addresses.clone();
    let mut prefix = spec.prefix.unwrap_or(0);
    let mut start = spec.start.clone().filter(|s| !s.is_empty());
    let mut end = spec.end.clone().filter(|s| !s.is_empty());
    if let Some(text) = spec.subnet.as_deref().filter(|s| !s.is_empty()) {
        match text.parse::<IpNet>() {
            Ok(subnet) => {
                let subnet = subnet.trunc();
                let (network, last) = (subnet.network(), subnet.broadcast());
                start = start.or_else(|| step(network, true).map(|a| a.to_string()));
                end = end.or_else(|| step(last, false).map(|a| a.to_string()));
                if prefix == 0 {
                    prefix = i32::from(subnet.prefix_len());
                }
            }
            Err(_) => addresses.push(text.to_string()),
        }
    }
    if let (Some(start), Some(end)) = (start, end) {
        addresses.push(format!("{start}-{end}"));
    }
    (
        addresses,
        prefix,
        spec.gateway.clone().filter(|g| !g.is_empty()),
    )
}

/// The address after (`forward`) or before `address`, if there is one.
fn step(address: IpAddr, forward: bool) -> Option<IpAddr> {
    let family = Family::of(address);
    let value = crate::alloc::family::to_value(address);
    let next = if forward {
        value.checked_add(1).filter(|v| *v <= family.max())
    } else {
        value.checked_sub(1)
    };
    next.map(|v| family.address(v))
}

/// The v1alpha1 spec that holds exactly `addresses`, `prefix` and `gateway`.
fn plain_v1alpha1(hub: &Map<String, Value>) -> Map<String, Value> {
    let mut spec = Map::new();
    if let Some(addresses) = hub
        .get("addresses")
        .filter(|a| a.as_array().is_some_and(|a| !a.is_empty()))
    {
        spec.insert("addresses".into(), addresses.clone());
    }
    if let Some(prefix) = hub.get("prefix").filter(|p| p.as_i64() != Some(0)) {
        spec.insert("prefix".into(), prefix.clone());
    }
    if let Some(gateway) = hub
        .get("gateway")
        .filter(|g| g.as_str().is_some_and(|g| !g.is_empty()))
    {
        spec.insert("gateway".into(), gateway.clone());
    }
    spec
}

fn shared_as_json(spec: &v1alpha1::InClusterIPPoolSpec) -> Map<String, Value> {
    let (addresses, prefix, gateway) = shared_fields(spec);
    let mut out = Map::new();
    out.insert("addresses".into(), addresses.into());
    out.insert("prefix".into(), prefix.into());
    if let Some(gateway) = gateway {
        out.insert("gateway".into(), gateway.into());
    }
    out
}

fn to_v1alpha2(mut object: Value) -> Result<Value, ConversionError> {
    let name = field(&object, "/metadata/name").to_string();
    let kind = field(&object, "/kind").to_string();
    let saved_hub = take_data(&mut object);
    let old_spec = spec_of(&object);
    let old = parse_v1alpha1(&name, old_spec.clone())?;
    let mut spec = shared_as_json(&old);
    // The v1alpha2 spec kept when the object went down: whole while the v1alpha1 client left
    // the pool as it was, else only the fields v1alpha1 cannot see.
    if let Some(Value::Object(saved)) = saved_hub
        .filter(|d| d["apiVersion"] == V1ALPHA2)
        .and_then(|d| d.get("spec").cloned())
    {
        if normalized(&shared_of(&saved)) == normalized(&spec) {
            spec = saved;
        } else {
            for (key, value) in saved {
                if !SHARED_FIELDS.contains(&key.as_str()) {
                    spec.insert(key, value);
                }
            }
        }
    }
    if plain_v1alpha1(&spec) != old_spec {
        put_data(&mut object, V1ALPHA1, &kind, Value::Object(old_spec));
    }
    object["spec"] = Value::Object(spec);
    object["apiVersion"] = V1ALPHA2.into();
    Ok(object)
}

fn to_v1alpha1(mut object: Value) -> Result<Value, ConversionError> {
    let name = field(&object, "/metadata/name").to_string();
    let kind = field(&object, "/kind").to_string();
    let saved_v1alpha1 = take_data(&mut object);
    let hub = spec_of(&object);
    let shared = shared_of(&hub);
    // The v1alpha1 spec the object was written with, while it still gives this pool.
    let restored = saved_v1alpha1
        .filter(|d| d["apiVersion"] == V1ALPHA1)
        .and_then(|d| d.get("spec").and_then(Value::as_object).cloned())
        .filter(|saved| {
            parse_v1alpha1(&name, saved.clone())
                .is_ok_and(|s| normalized(&shared_as_json(&s)) == normalized(&shared))
        });
    let spec = restored.unwrap_or_else(|| plain_v1alpha1(&hub));
    let reproduced = parse_v1alpha1(&name, spec.clone()).map(|s| shared_as_json(&s));
    if reproduced.as_ref() != Ok(&shared) || hub.len() > shared.len() {
        put_data(&mut object, V1ALPHA2, &kind, Value::Object(hub));
    }
    object["spec"] = Value::Object(spec);
    object["apiVersion"] = V1ALPHA1.into();
    Ok(object)
}

fn shared_of(spec: &Map<String, Value>) -> Map<String, Value> {
    spec.iter()
        .filter(|(k, _)| SHARED_FIELDS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Shared fields compared as a pool: an absent gateway equals an empty one.
fn normalized(spec: &Map<String, Value>) -> Map<String, Value> {
    let mut spec = spec.clone();
    if spec.get("gateway").is_some_and(|g| g.as_str() == Some("")) {
        spec.remove("gateway");
    }
    spec.entry("addresses")
        .or_insert_with(|| Value::Array(vec![]));
    spec.entry("prefix").or_insert(0.into());
    spec
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn pool(version: &str, kind: &str, spec: Value) -> Value {
        json!({
            "apiVersion": version,
            "kind": kind,
            "metadata": {"name": "p", "namespace": "ns", "labels": {"a": "b"}, "resourceVersion": "7"},
            "spec": spec,
            "status": {"ipAddresses": {"total": 10, "free": 9, "used": 1, "outOfRange": 0}}
        })
    }

    fn up(object: Value) -> Value {
        convert(object, V1ALPHA2).expect("converts up")
    }

    fn down(object: Value) -> Value {
        convert(object, V1ALPHA1).expect("converts down")
    }

    #[test]
    fn upstream_mapping_of_subnet_start_and_end() {
        // The in-cluster provider's own conversion cases.
        let cases = [
            (
                json!({"gateway": "1.1.1.1", "subnet": "1.1.1.1/28", "start": "1.1.1.1", "end": "1.1.1.10", "prefix": 28}),
                json!({"gateway": "1.1.1.1", "addresses": ["1.1.1.1-1.1.1.10"], "prefix": 28}),
            ),
            (
                json!({"gateway": "1.1.1.1", "addresses": ["1.1.1.1-1.1.1.10"], "prefix": 28}),
                json!({"gateway": "1.1.1.1", "addresses": ["1.1.1.1-1.1.1.10"], "prefix": 28}),
            ),
            (
                json!({"subnet": "1.1.1.0/24", "start": "1.1.1.10", "end": "1.1.1.15", "gateway": "1.1.1.1"}),
                json!({"gateway": "1.1.1.1", "addresses": ["1.1.1.10-1.1.1.15"], "prefix": 24}),
            ),
            (
                json!({"subnet": "1.1.1.0/24", "gateway": "1.1.1.1"}),
                json!({"gateway": "1.1.1.1", "addresses": ["1.1.1.1-1.1.1.254"], "prefix": 24}),
            ),
            (
                json!({"subnet": "fd00::/120"}),
                json!({"addresses": ["fd00::1-fd00::fe"], "prefix": 120}),
            ),
        ];
        for kind in KINDS {
            for (v1alpha1, v1alpha2) in &cases {
                let converted = up(pool(V1ALPHA1, kind, v1alpha1.clone()));
                assert_eq!(converted["spec"], *v1alpha2, "{kind} {v1alpha1}");
                assert_eq!(converted["apiVersion"], V1ALPHA2);
                assert_eq!(converted["status"]["ipAddresses"]["used"], 1);
                assert_eq!(converted["metadata"]["labels"]["a"], "b");
            }
        }
    }

    #[test]
    fn only_what_the_other_version_cannot_hold_goes_into_the_annotation() {
        let plain = up(pool(
            V1ALPHA1,
            "InClusterIPPool",
            json!({"addresses": ["10.0.0.1"], "prefix": 24}),
        ));
        assert!(plain["metadata"].get("annotations").is_none(), "{plain}");
        let subnet = up(pool(
            V1ALPHA1,
            "InClusterIPPool",
            json!({"subnet": "10.0.0.0/24"}),
        ));
        let data = subnet["metadata"]["annotations"][CONVERSION_DATA_ANNOTATION]
            .as_str()
            .expect("annotated");
        assert!(data.contains("10.0.0.0/24"), "{data}");
        let hub = down(pool(
            V1ALPHA2,
            "InClusterIPPool",
            json!({"addresses": ["10.0.0.1"], "prefix": 24, "excludedAddresses": ["10.0.0.2"]}),
        ));
        assert_eq!(
            hub["spec"],
            json!({"addresses": ["10.0.0.1"], "prefix": 24})
        );
        let data = hub["metadata"]["annotations"][CONVERSION_DATA_ANNOTATION]
            .as_str()
            .expect("annotated");
        assert!(data.contains("excludedAddresses"), "{data}");
    }

    /// A global pool's namespace selector (a bitpool extension v1alpha1 has no place for)
    /// survives a v1alpha1 client reading and writing the pool back.
    #[test]
    fn a_namespace_selector_survives_a_v1alpha1_round_trip() {
        let selector = json!({
            "matchLabels": {"tenant": "a"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold", "silver"]}]
        });
        let original = pool(
            V1ALPHA2,
            "GlobalInClusterIPPool",
            json!({"addresses": ["10.0.0.1-10.0.0.9"], "prefix": 24, "namespaceSelector": selector}),
        );
        let old = down(original.clone());
        assert!(old["spec"].get("namespaceSelector").is_none(), "{old}");
        let back = up(old);
        assert_eq!(back["spec"]["namespaceSelector"], selector, "{back}");
    }

    /// A pool's further subnets (a bitpool extension v1alpha1 has no place for) survive a
    /// v1alpha1 client reading and writing the pool back, as written.
    #[test]
    fn subnets_survive_a_v1alpha1_round_trip() {
        let subnets = json!([
            {"addresses": ["10.0.2.10-10.0.2.20"], "prefix": 24, "gateway": "10.0.2.1"},
            {"addresses": ["10.0.3.0/25"], "prefix": 25, "dnsServers": ["10.0.3.53"]}
        ]);
        let original = pool(
            V1ALPHA2,
            "InClusterIPPool",
            json!({"addresses": ["10.0.1.10-10.0.1.20"], "prefix": 24, "gateway": "10.0.1.1", "subnets": subnets}),
        );
        let old = down(original.clone());
        assert!(old["spec"].get("subnets").is_none(), "{old}");
        let back = up(old);
        assert_eq!(back["spec"]["subnets"], subnets, "{back}");
        assert_eq!(back["spec"]["addresses"], original["spec"]["addresses"]);
    }

    #[test]
    fn a_stale_v1alpha1_form_is_not_restored_over_a_changed_pool() {
        let hub = up(pool(
            V1ALPHA1,
            "InClusterIPPool",
            json!({"subnet": "10.0.0.0/24"}),
        ));
        let mut changed = hub.clone();
        changed["spec"]["addresses"] = json!(["10.0.0.1-10.0.0.100"]);
        let v1alpha1 = down(changed);
        assert_eq!(
            v1alpha1["spec"],
            json!({"addresses": ["10.0.0.1-10.0.0.100"], "prefix": 24})
        );
        assert_eq!(down(hub)["spec"], json!({"subnet": "10.0.0.0/24"}));
    }

    #[test]
    fn an_unparseable_subnet_stays_visible_instead_of_failing_the_read() {
        let converted = up(pool(
            V1ALPHA1,
            "InClusterIPPool",
            json!({"subnet": "not-a-subnet"}),
        ));
        assert_eq!(converted["spec"]["addresses"], json!(["not-a-subnet"]));
        assert_eq!(down(converted)["spec"], json!({"subnet": "not-a-subnet"}));
    }

    #[test]
    fn other_kinds_and_versions_are_refused_by_name() {
        let other = json!({"apiVersion": "ipam.cluster.x-k8s.io/v1beta1", "kind": "IPAddress", "metadata": {"name": "x"}});
        let error = convert(other, V1ALPHA2).unwrap_err().to_string();
        assert!(
            error.contains("IPAddress x") && error.contains("v1beta1"),
            "{error}"
        );
    }

    #[test]
    fn a_review_answers_every_object_in_order() {
        let review = json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": {"uid": "u1", "desiredAPIVersion": V1ALPHA2, "objects": [
                pool(V1ALPHA1, "InClusterIPPool", json!({"subnet": "10.0.0.0/30"})),
                pool(V1ALPHA2, "InClusterIPPool", json!({"addresses": ["10.0.1.1"], "prefix": 24})),
            ]}
        });
        let answer: Value = serde_json::from_slice(&review_bytes(&review)).expect("json");
        assert_eq!(answer["response"]["uid"], "u1");
        assert_eq!(answer["response"]["result"]["status"], "Success");
        let objects = answer["response"]["convertedObjects"]
            .as_array()
            .expect("objects");
        assert_eq!(
            objects[0]["spec"]["addresses"],
            json!(["10.0.0.1-10.0.0.2"])
        );
        assert_eq!(objects[1]["spec"]["addresses"], json!(["10.0.1.1"]));
    }

    fn review_bytes(review: &Value) -> Vec<u8> {
        review_answer(serde_json::to_vec(review).expect("json"))
    }

    fn review_answer(body: Vec<u8>) -> Vec<u8> {
        crate::webhook::convert::review(&body).expect("answered")
    }

    fn without_data(mut object: Value) -> Value {
        take_data(&mut object);
        object
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(String::new()),
            "10\\.0\\.[0-9]\\.[0-9]{1,2}",
            "10\\.0\\.0\\.0/2[4-9]",
            "fd00::[0-9a-f]{1,3}",
            "fd00::/1[12][0-9]",
            "[a-z]{1,5}",
        ]
    }

    fn v1alpha1_spec() -> impl Strategy<Value = Value> {
        (
            proptest::collection::vec(text(), 0..3),
            proptest::option::of(text()),
            proptest::option::of(text()),
            proptest::option::of(text()),
            proptest::option::of(0i32..=128),
            proptest::option::of(text()),
        )
            .prop_map(|(addresses, subnet, start, end, prefix, gateway)| {
                let spec = v1alpha1::InClusterIPPoolSpec {
                    addresses,
                    subnet,
                    start,
                    end,
                    prefix,
                    gateway,
                };
                serde_json::to_value(spec).expect("json")
            })
    }

    fn v1alpha2_spec() -> impl Strategy<Value = Value> {
        (
            proptest::collection::vec(text(), 0..3),
            0i32..=128,
            proptest::option::of(text()),
            proptest::collection::vec(text(), 0..2),
            any::<bool>(),
            proptest::option::of(0i32..100),
            proptest::collection::btree_map("[a-z]{1,4}", text(), 0..2),
            proptest::option::of(prop_oneof![Just("sequential"), Just("random")]),
            proptest::collection::vec(text(), 0..2),
        )
            .prop_map(
                |(addresses, prefix, gateway, excluded, reserved, grace, pre, strategy, dns)| {
                    let mut spec = json!({"addresses": addresses, "prefix": prefix});
                    let optional = [
                        ("gateway", gateway.map(Value::from)),
                        (
                            "excludedAddresses",
                            (!excluded.is_empty()).then(|| excluded.into()),
                        ),
                        (
                            "allocateReservedIPAddresses",
                            reserved.then_some(true.into()),
                        ),
                        ("addressReuseGracePeriodSeconds", grace.map(Value::from)),
                        ("preAllocations", (!pre.is_empty()).then(|| json!(pre))),
                        ("allocationStrategy", strategy.map(Value::from)),
                        ("dnsServers", (!dns.is_empty()).then(|| dns.into())),
                    ];
                    for (key, value) in optional {
                        if let Some(value) = value {
                            spec[key] = value;
                        }
                    }
                    spec
                },
            )
    }

    proptest! {
        /// Every v1alpha1 field survives a trip through storage.
        #[test]
        fn v1alpha1_round_trips(spec in v1alpha1_spec(), global in any::<bool>()) {
            let kind = KINDS[usize::from(global)];
            let original = pool(V1ALPHA1, kind, spec);
            prop_assert_eq!(without_data(down(up(original.clone()))), original);
        }

        /// Every v1alpha2 field survives a v1alpha1 client reading and writing the object back.
        #[test]
        fn v1alpha2_round_trips(spec in v1alpha2_spec(), global in any::<bool>()) {
            let kind = KINDS[usize::from(global)];
            let original = pool(V1ALPHA2, kind, spec);
            prop_assert_eq!(without_data(up(down(original.clone()))), original);
        }
    }
}
