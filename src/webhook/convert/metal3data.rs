//! Conversion of Metal3DataTemplate, Metal3Data and Metal3DataClaim between v1beta1 and v1beta2
//! (the version CAPM3 1.13 and later store, and bitpool's storage), lossless both ways.
//!
//! v1beta2 renames the template's metaData `…FromIPPool` lists to `…FromPool`, turns a bond's
//! `parameters` map into a `[{name, value}]` list and the template's `status.indexes` map into
//! `[{name, index}]`, drops `templateReference`, and narrows object references to `{name,
//! namespace}`. What the target version has no place for is kept in
//! [`CONVERSION_DATA_ANNOTATION`] — each field by its JSON pointer — and put back when the object
//! converts to its first version again.

use serde_json::{Map, Value};

use super::shared::{ConversionError, take_annotation};
use crate::api::metal3_data::CONVERSION_DATA_ANNOTATION;

/// The apiVersion older CAPM3 stores: served, deprecated.
pub const V1BETA1: &str = "infrastructure.cluster.x-k8s.io/v1beta1";
/// The apiVersion CAPM3 1.13 and later store, and bitpool's storage version.
pub const V1BETA2: &str = "infrastructure.cluster.x-k8s.io/v1beta2";
/// The kinds converted here.
pub const KINDS: [&str; 3] = ["Metal3DataTemplate", "Metal3Data", "Metal3DataClaim"];

/// The metaData lists v1beta2 renamed: (v1beta1, v1beta2).
pub const RENAMED: [(&str, &str); 4] = [
    ("ipAddressesFromIPPool", "ipAddressesFromPool"),
    ("prefixesFromIPPool", "prefixesFromPool"),
    ("gatewaysFromIPPool", "gatewaysFromPool"),
    ("dnsServersFromIPPool", "dnsServersFromPool"),
];
/// The fields of a v1beta1 object reference that v1beta2's `{name, namespace}` keeps.
const REFERENCE_FIELDS: [&str; 2] = ["name", "namespace"];

/// The fields one direction drops, by JSON pointer.
type Lost = Map<String, Value>;

/// `object` (a Metal3DataTemplate, Metal3Data or Metal3DataClaim) at `desired`.
pub fn convert(mut object: Value, desired: &str) -> Result<Value, ConversionError> {
    let kind = object["kind"].as_str().unwrap_or_default().to_string();
    let from = object["apiVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let unsupported = || ConversionError::Unsupported {
        kind: kind.clone(),
        name: name.clone(),
        from: from.clone(),
        to: desired.to_string(),
    };
    if !KINDS.contains(&kind.as_str()) {
        return Err(unsupported());
    }
    if from == desired {
        return Ok(object);
    }
    let kept = take_kept(&mut object);
    let lost = match (from.as_str(), desired) {
        (V1BETA1, V1BETA2) => up(&mut object, &kind),
        (V1BETA2, V1BETA1) => down(&mut object, &kind),
        _ => return Err(unsupported()),
    };
    object["apiVersion"] = Value::String(desired.to_string());
    if let Some((version, fields)) = kept
        && version == desired
    {
        restore(&mut object, fields);
    }
    if !lost.is_empty() {
        keep(&mut object, &from, lost);
    }
    Ok(object)
}

fn up(object: &mut Value, kind: &str) -> Lost {
    let mut lost = Lost::new();
    take(object, "/spec/templateReference", &mut lost);
    match kind {
        "Metal3DataTemplate" => {
            if let Some(meta_data) = object.pointer_mut("/spec/metaData") {
                for (old, new) in RENAMED {
                    rename(meta_data, old, new);
                }
            }
            for_each_bond(object, |bond| map_to_list(bond, "parameters", "value"));
            if let Some(status) = object.pointer_mut("/status") {
                map_to_list(status, "indexes", "index");
            }
        }
        "Metal3Data" => {
            narrow_reference(object, "/spec/claim", &mut lost);
            narrow_reference(object, "/spec/template", &mut lost);
        }
        _ => {
            narrow_reference(object, "/spec/template", &mut lost);
            narrow_reference(object, "/status/renderedData", &mut lost);
        }
    }
    lost
}

fn down(object: &mut Value, kind: &str) -> Lost {
    let mut lost = Lost::new();
    if kind == "Metal3DataTemplate" {
        if let Some(meta_data) = object.pointer_mut("/spec/metaData") {
            for (old, new) in RENAMED {
                rename(meta_data, new, old);
            }
        }
        let bonds = object
            .pointer("/spec/networkData/links/bonds")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        for i in 0..bonds {
            let path = format!("/spec/networkData/links/bonds/{i}");
            list_to_map(object, &path, "parameters", "value", &mut lost);
        }
        list_to_map(object, "/status", "indexes", "index", &mut lost);
    }
    lost
}

fn for_each_bond(object: &mut Value, mut f: impl FnMut(&mut Value)) {
    if let Some(Value::Array(bonds)) = object.pointer_mut("/spec/networkData/links/bonds") {
        bonds.iter_mut().for_each(&mut f);
    }
}

fn rename(object: &mut Value, from: &str, to: &str) {
    if let Some(fields) = object.as_object_mut()
        && let Some(value) = fields.remove(from)
    {
        fields.insert(to.to_string(), value);
    }
}

/// Moves the value at `pointer` (if any) into `lost`.
fn take(object: &mut Value, pointer: &str, lost: &mut Lost) {
    let Some((parent, field)) = pointer.rsplit_once('/') else {
        return;
    };
    if let Some(Value::Object(fields)) = object.pointer_mut(parent)
        && let Some(value) = fields.remove(field)
    {
        lost.insert(pointer.to_string(), value);
    }
}

/// Keeps only `name` and `namespace` of the reference at `pointer`.
fn narrow_reference(object: &mut Value, pointer: &str, lost: &mut Lost) {
    let Some(Value::Object(reference)) = object.pointer_mut(pointer) else {
        return;
    };
    let dropped: Vec<String> = reference
        .keys()
        .filter(|k| !REFERENCE_FIELDS.contains(&k.as_str()))
        .cloned()
        .collect();
    for key in dropped {
        if let Some(value) = reference.remove(&key) {
            lost.insert(format!("{pointer}/{}", escape(&key)), value);
        }
    }
}

/// `{k: v, …}` at `field` → `[{name: k, <value_key>: v}, …]`, in key order.
fn map_to_list(parent: &mut Value, field: &str, value_key: &str) {
    let Some(Value::Object(map)) = parent.get_mut(field).map(std::mem::take) else {
        return;
    };
    let list = map
        .into_iter()
        .map(|(name, value)| {
            let mut entry = Map::new();
            entry.insert("name".into(), Value::String(name));
            entry.insert(value_key.into(), value);
            Value::Object(entry)
        })
        .collect();
    parent[field] = Value::Array(list);
}

/// `[{name: k, <value_key>: v}, …]` at `<pointer>/<field>` → `{k: v, …}`. A list a map cannot
/// hold as it is (names repeated or out of order, entries without a name or value, or with more)
/// is kept whole in `lost`, and the map gets what it can.
fn list_to_map(object: &mut Value, pointer: &str, field: &str, value_key: &str, lost: &mut Lost) {
    let Some(parent) = object.pointer_mut(pointer) else {
        return;
    };
    let Some(Value::Array(list)) = parent.get(field).cloned() else {
        return;
    };
    let mut map = Map::new();
    let mut exact = true;
    let mut previous: Option<String> = None;
    for entry in &list {
        let name = entry.get("name").and_then(Value::as_str);
        let value = entry.get(value_key);
        let shape_ok = entry.as_object().is_some_and(|e| e.len() == 2);
        match (name, value) {
            (Some(name), Some(value)) if shape_ok => {
                exact &= previous.as_deref().is_none_or(|p| p < name);
                previous = Some(name.to_string());
                map.insert(name.to_string(), value.clone());
            }
            _ => exact = false,
        }
    }
    parent[field] = Value::Object(map);
    if !exact {
        lost.insert(format!("{pointer}/{field}"), Value::Array(list));
    }
}

/// Removes this module's annotation and returns what it kept: (version, fields).
fn take_kept(object: &mut Value) -> Option<(String, Lost)> {
    let kept = take_annotation(object, CONVERSION_DATA_ANNOTATION)?;
    let version = kept["version"].as_str()?.to_string();
    let fields = kept.get("fields")?.as_object()?.clone();
    Some((version, fields))
}

fn keep(object: &mut Value, version: &str, lost: Lost) {
    let mut kept = Map::new();
    kept.insert("version".into(), Value::String(version.to_string()));
    kept.insert("fields".into(), Value::Object(lost));
    let text = Value::Object(kept).to_string();
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = metadata
            .entry("annotations")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(annotations) = annotations.as_object_mut() {
            annotations.insert(CONVERSION_DATA_ANNOTATION.to_string(), Value::String(text));
        }
    }
}

/// Puts kept fields back where their parent still exists (an object edited since may have
/// dropped it: then the field goes too).
fn restore(object: &mut Value, fields: Lost) {
    for (pointer, value) in fields {
        let Some((parent, field)) = pointer.rsplit_once('/') else {
            continue;
        };
        if let Some(Value::Object(parent)) = object.pointer_mut(parent) {
            parent.insert(unescape(field), value);
        }
    }
}

/// A map key as a JSON pointer segment (RFC 6901).
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn unescape(segment: &str) -> String {
    segment.replace("~1", "/").replace("~0", "~")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn template_v1beta1() -> Value {
        json!({
            "apiVersion": V1BETA1, "kind": "Metal3DataTemplate",
            "metadata": {"name": "workers", "namespace": "metal3", "annotations": {"a": "b"}},
            "spec": {
                "clusterName": "test1", "templateReference": "old",
                "metaData": {
                    "ipAddressesFromIPPool": [{"key": "ip", "name": "pool", "apiGroup": "ipam.metal3.io", "kind": "IPPool"}],
                    "dnsServersFromIPPool": [{"key": "dns", "name": "pool", "apiGroup": "", "kind": ""}],
                },
                "networkData": {"links": {"bonds": [{
                    "bondMode": "802.3ad", "id": "bond0", "macAddress": {"string": "00:00:00:00:00:01"},
                    "parameters": {"miimon": 100, "lacp_rate": "fast"}, "bondLinks": ["eth0", "eth1"],
                }]}},
            },
            "status": {"indexes": {"m3m-b": 1, "m3m-a": 0}, "lastUpdated": "2026-12-01T00:00:00Z"},
        })
    }

    #[test]
    fn a_template_converts_to_the_v1beta2_shape_and_back_exactly() {
        let original = template_v1beta1();
        let up = convert(original.clone(), V1BETA2).expect("up");
        assert_eq!(up["apiVersion"], V1BETA2);
        assert_eq!(
            up["spec"]["metaData"]["ipAddressesFromPool"][0]["name"],
            "pool"
        );
        assert!(
            up["spec"]["metaData"]
                .get("ipAddressesFromIPPool")
                .is_none()
        );
        assert_eq!(
            up["spec"]["networkData"]["links"]["bonds"][0]["parameters"],
            json!([{"name": "lacp_rate", "value": "fast"}, {"name": "miimon", "value": 100}])
        );
        assert_eq!(
            up["status"]["indexes"],
            json!([{"name": "m3m-a", "index": 0}, {"name": "m3m-b", "index": 1}])
        );
        assert!(up["spec"].get("templateReference").is_none());
        let kept = up["metadata"]["annotations"][CONVERSION_DATA_ANNOTATION]
            .as_str()
            .expect("templateReference is kept");
        assert!(kept.contains("\"old\""), "{kept}");
        assert_eq!(up["metadata"]["annotations"]["a"], "b");
        assert_eq!(convert(up, V1BETA1).expect("down"), original);
    }

    #[test]
    fn references_narrow_to_name_and_namespace_and_come_back() {
        let data = json!({
            "apiVersion": V1BETA1, "kind": "Metal3Data",
            "metadata": {"name": "workers-0"},
            "spec": {"index": 0,
                     "claim": {"name": "m3m", "namespace": "metal3", "kind": "Metal3DataClaim", "uid": "u-1"},
                     "template": {"name": "workers", "namespace": "metal3"}},
            "status": {"ready": true},
        });
        let up = convert(data.clone(), V1BETA2).expect("up");
        assert_eq!(
            up["spec"]["claim"],
            json!({"name": "m3m", "namespace": "metal3"})
        );
        assert_eq!(convert(up, V1BETA1).expect("down"), data);
        // Nothing lost: no annotation.
        let claim = json!({"apiVersion": V1BETA1, "kind": "Metal3DataClaim", "metadata": {"name": "m3m"},
                           "spec": {"template": {"name": "workers"}}});
        let up = convert(claim.clone(), V1BETA2).expect("up");
        assert!(up["metadata"].get("annotations").is_none(), "{up}");
        assert_eq!(convert(up, V1BETA1).expect("down"), claim);
    }

    #[test]
    fn a_v1beta2_list_a_map_cannot_hold_is_kept() {
        let template = json!({
            "apiVersion": V1BETA2, "kind": "Metal3DataTemplate", "metadata": {"name": "t"},
            "spec": {"clusterName": "c"},
            "status": {"indexes": [{"name": "b", "index": 1}, {"name": "a", "index": 0}, {"name": "a", "index": 2}]},
        });
        let down = convert(template.clone(), V1BETA1).expect("down");
        assert_eq!(down["status"]["indexes"], json!({"a": 2, "b": 1}));
        assert_eq!(convert(down, V1BETA2).expect("up"), template);
    }

    #[test]
    fn other_kinds_and_versions_are_refused_by_name() {
        let pool = json!({"apiVersion": "ipam.metal3.io/v1alpha1", "kind": "IPPool", "metadata": {"name": "p"}});
        let error = convert(pool, V1BETA2).unwrap_err().to_string();
        assert!(error.contains("IPPool p"), "{error}");
        let old = json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha5", "kind": "Metal3Data", "metadata": {"name": "d"}});
        assert!(convert(old, V1BETA2).is_err());
    }

    fn name() -> impl Strategy<Value = String> {
        "[a-z][a-z0-9/~-]{0,6}"
    }

    fn json_value() -> impl Strategy<Value = Value> {
        prop_oneof![
            any::<i32>().prop_map(Value::from),
            "[a-z ]{0,5}".prop_map(Value::from),
            any::<bool>().prop_map(Value::from),
        ]
    }

    prop_compose! {
        fn v1beta1_template()(
            reference in proptest::option::of(name()),
            lists in proptest::collection::vec(any::<bool>(), 4),
            parameters in proptest::collection::vec(proptest::collection::btree_map(name(), json_value(), 0..4), 0..3),
            indexes in proptest::option::of(proptest::collection::btree_map(name(), 0..100i64, 0..5)),
        ) -> Value {
            let mut meta_data = Map::new();
            for ((old, _), present) in RENAMED.iter().zip(lists) {
                if present {
                    meta_data.insert(old.to_string(), json!([{"key": "k", "name": "p"}]));
                }
            }
            let bonds: Vec<Value> = parameters.into_iter().map(|p| json!({"bondMode": "balance-rr", "id": "b", "parameters": p})).collect();
            let mut spec = json!({"clusterName": "c", "metaData": meta_data, "networkData": {"links": {"bonds": bonds}}});
            if let Some(reference) = reference {
                spec["templateReference"] = Value::from(reference);
            }
            let mut template = json!({"apiVersion": V1BETA1, "kind": "Metal3DataTemplate", "metadata": {"name": "t"}, "spec": spec});
            if let Some(indexes) = indexes {
                template["status"] = json!({"indexes": indexes});
            }
            template
        }
    }

    prop_compose! {
        fn v1beta2_template()(
            parameters in proptest::collection::vec(proptest::collection::vec((name(), json_value()), 0..4), 0..3),
            indexes in proptest::option::of(proptest::collection::vec((name(), 0..100i64), 0..5)),
        ) -> Value {
            let bonds: Vec<Value> = parameters.into_iter().map(|p| {
                let list: Vec<Value> = p.into_iter().map(|(n, v)| json!({"name": n, "value": v})).collect();
                json!({"bondMode": "balance-rr", "id": "b", "parameters": list})
            }).collect();
            let mut template = json!({"apiVersion": V1BETA2, "kind": "Metal3DataTemplate", "metadata": {"name": "t"},
                                      "spec": {"clusterName": "c", "networkData": {"links": {"bonds": bonds}}}});
            if let Some(indexes) = indexes {
                let list: Vec<Value> = indexes.into_iter().map(|(n, i)| json!({"name": n, "index": i})).collect();
                template["status"] = json!({"indexes": list});
            }
            template
        }
    }

    proptest! {
        #[test]
        fn v1beta1_templates_survive_a_round_trip(template in v1beta1_template()) {
            let up = convert(template.clone(), V1BETA2).expect("up");
            prop_assert_eq!(convert(up, V1BETA1).expect("down"), template);
        }

        #[test]
        fn v1beta2_templates_survive_a_round_trip(template in v1beta2_template()) {
            let down = convert(template.clone(), V1BETA1).expect("down");
            prop_assert_eq!(convert(down, V1BETA2).expect("up"), template);
        }
    }
}
