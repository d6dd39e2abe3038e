//! Every manifest the upstream CRD accepts, bitpool's CRD must accept and keep: this walks the
//! upstream and generated schemas field by field, for each kind bitpool serves (and for the
//! standalone CAPI kinds), and compares names, printer columns (upstream's first, bitpool's
//! additions after them) and short names too.

mod support;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionVersion,
};
use serde_json::Value;

/// Upstream file for each kind bitpool generates.
const UPSTREAM_FILES: &[(&str, &str)] = &[
    (
        "InClusterIPPool",
        "in-cluster/ipam.cluster.x-k8s.io_inclusterippools.yaml",
    ),
    (
        "GlobalInClusterIPPool",
        "in-cluster/ipam.cluster.x-k8s.io_globalinclusterippools.yaml",
    ),
    (
        "InClusterPrefixPool",
        "in-cluster/ipam.cluster.x-k8s.io_inclusterprefixpools.yaml",
    ),
    (
        "GlobalInClusterPrefixPool",
        "in-cluster/ipam.cluster.x-k8s.io_globalinclusterprefixpools.yaml",
    ),
    ("IPPool", "ip-address-manager/ipam.metal3.io_ippools.yaml"),
    ("IPClaim", "ip-address-manager/ipam.metal3.io_ipclaims.yaml"),
    (
        "IPAddress.ipam.metal3.io",
        "ip-address-manager/ipam.metal3.io_ipaddresses.yaml",
    ),
    (
        "Metal3DataTemplate",
        "cluster-api-provider-metal3/infrastructure.cluster.x-k8s.io_metal3datatemplates.yaml",
    ),
    (
        "Metal3Data",
        "cluster-api-provider-metal3/infrastructure.cluster.x-k8s.io_metal3datas.yaml",
    ),
    (
        "Metal3DataClaim",
        "cluster-api-provider-metal3/infrastructure.cluster.x-k8s.io_metal3dataclaims.yaml",
    ),
    (
        "IPAddressClaim",
        "cluster-api/ipam.cluster.x-k8s.io_ipaddressclaims.yaml",
    ),
    (
        "IPAddress.ipam.cluster.x-k8s.io",
        "cluster-api/ipam.cluster.x-k8s.io_ipaddresses.yaml",
    ),
];

fn upstream_file_for(crd: &CustomResourceDefinition) -> &'static str {
    let kind = crd.spec.names.kind.as_str();
    let qualified = format!("{kind}.{}", crd.spec.group);
    UPSTREAM_FILES
        .iter()
        .find(|(k, _)| *k == kind || *k == qualified)
        .map(|(_, f)| *f)
        .unwrap_or_else(|| panic!("no upstream CRD listed for {qualified}"))
}

/// Differences that would make bitpool's CRD reject or prune something upstream's accepts.
fn compare(path: &str, upstream: &Value, ours: &Value, problems: &mut Vec<String>) {
    let u = upstream.as_object().expect("schema node is an object");
    let Some(o) = ours.as_object() else {
        problems.push(format!("{path}: missing in bitpool's schema"));
        return;
    };
    if o.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
        && o.get("properties").is_none()
    {
        return; // bitpool keeps anything here
    }
    for key in [
        "type",
        "x-kubernetes-int-or-string",
        "x-kubernetes-preserve-unknown-fields",
        "nullable",
    ] {
        if let Some(expected) = u.get(key).filter(|v| **v != Value::Bool(false))
            && o.get(key) != Some(expected)
        {
            problems.push(format!(
                "{path}: {key} is {:?}, upstream {expected}",
                o.get(key)
            ));
        }
    }
    if let Some(pattern) = o.get("pattern")
        && u.get("pattern") != Some(pattern)
    {
        problems.push(format!(
            "{path}: pattern differs from upstream's ({:?})",
            u.get("pattern")
        ));
    }
    if let Some(Value::Array(ours_enum)) = o.get("enum") {
        match u.get("enum") {
            Some(Value::Array(up_enum)) => {
                for value in up_enum.iter().filter(|v| !ours_enum.contains(v)) {
                    problems.push(format!("{path}: enum lacks upstream value {value}"));
                }
            }
            _ => problems.push(format!("{path}: enum where upstream has none")),
        }
    }
    // Bounds: bitpool's may be looser, never tighter.
    for (key, ours_must_be_at_least) in [
        ("maximum", true),
        ("maxLength", true),
        ("maxItems", true),
        ("minimum", false),
        ("minLength", false),
        ("minItems", false),
    ] {
        let Some(ours_bound) = o.get(key).and_then(Value::as_f64) else {
            continue;
        };
        match u.get(key).and_then(Value::as_f64) {
            None => problems.push(format!(
                "{path}: {key}={ours_bound} where upstream has no bound"
            )),
            Some(up) if ours_must_be_at_least && ours_bound < up => problems.push(format!(
                "{path}: {key}={ours_bound} is tighter than upstream's {up}"
            )),
            Some(up) if !ours_must_be_at_least && ours_bound > up => problems.push(format!(
                "{path}: {key}={ours_bound} is tighter than upstream's {up}"
            )),
            _ => {}
        }
    }
    let required = |v: &serde_json::Map<String, Value>| -> Vec<String> {
        v.get("required")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let upstream_required = required(u);
    // The one deliberate difference: bitpool's types require `spec` at the root. Upstream's CRDs
    // accept an object without one, but every such object is invalid for upstream's own
    // controllers too (its required fields live inside spec); an admission error saying
    // "spec: Required value" serves its author better than a stored object nobody can act on.
    let deliberate = |f: &String| path.is_empty() && f == "spec";
    for field in required(o)
        .iter()
        .filter(|f| !upstream_required.contains(f) && !deliberate(f))
    {
        problems.push(format!(
            "{path}.{field}: required by bitpool, optional upstream"
        ));
    }
    if let Some(Value::Object(props)) = u.get("properties") {
        let ours_props = o.get("properties").and_then(Value::as_object);
        for (name, sub) in props {
            let child = format!("{path}.{name}");
            if path.is_empty() && ["apiVersion", "kind", "metadata"].contains(&name.as_str()) {
                continue; // always accepted at the root of every object
            }
            match ours_props.and_then(|p| p.get(name)) {
                Some(ours_sub) => compare(&child, sub, ours_sub, problems),
                None => problems.push(format!("{child}: missing in bitpool's schema")),
            }
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(sub @ Value::Object(_)) = u.get(key) {
            match o.get(key) {
                Some(ours_sub) => compare(&format!("{path}[{key}]"), sub, ours_sub, problems),
                None => problems.push(format!("{path}: no {key} schema, upstream has one")),
            }
        }
    }
}

fn schema_of(version: &CustomResourceDefinitionVersion) -> Value {
    let schema = version
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("version has a schema");
    serde_json::to_value(schema).expect("schema serializes")
}

fn columns(version: &CustomResourceDefinitionVersion) -> Vec<(String, String, String)> {
    version
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| (c.name.clone(), c.type_.clone(), c.json_path.clone()))
        .collect()
}

fn check(ours: &CustomResourceDefinition, upstream: &CustomResourceDefinition) -> Vec<String> {
    let kind = &ours.spec.names.kind;
    let mut problems = Vec::new();
    let mut expect = |what: &str, ok: bool| {
        if !ok {
            problems.push(format!("{kind}: {what} differs from upstream"));
        }
    };
    expect("name", ours.metadata.name == upstream.metadata.name);
    expect("group", ours.spec.group == upstream.spec.group);
    expect("scope", ours.spec.scope == upstream.spec.scope);
    expect(
        "plural",
        ours.spec.names.plural == upstream.spec.names.plural,
    );
    expect(
        "singular",
        ours.spec.names.singular == upstream.spec.names.singular,
    );
    expect(
        "listKind",
        ours.spec.names.list_kind == upstream.spec.names.list_kind,
    );
    expect(
        "short names",
        ours.spec.names.short_names == upstream.spec.names.short_names,
    );
    expect(
        "categories",
        ours.spec.names.categories == upstream.spec.names.categories,
    );
    for version in &ours.spec.versions {
        let Some(up) = upstream
            .spec
            .versions
            .iter()
            .find(|v| v.name == version.name)
        else {
            problems.push(format!("{kind}: upstream has no version {}", version.name));
            continue;
        };
        let prefix = format!("{kind} {}", version.name);
        // Upstream's v1alpha1 pool columns read `.spec.first`/`.spec.last`, fields that do not
        // exist (the JSON names are `start`/`end`): bitpool shows the real fields.
        let upstream_columns: Vec<_> = columns(up)
            .into_iter()
            .map(|(name, type_, path)| {
                let path = match path.as_str() {
                    ".spec.first" => ".spec.start".to_string(),
                    ".spec.last" => ".spec.end".to_string(),
                    _ => path,
                };
                (name, type_, path)
            })
            .collect();
        // bitpool may show more (utilisation at a glance), after upstream's own.
        if !columns(version).starts_with(&upstream_columns) {
            problems.push(format!(
                "{prefix}: printer columns {:?}, upstream {:?}",
                columns(version),
                columns(up)
            ));
        }
        let has_status = |v: &CustomResourceDefinitionVersion| {
            v.subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        };
        if has_status(version) != has_status(up) {
            problems.push(format!(
                "{prefix}: status subresource differs from upstream"
            ));
        }
        // CEL rules (x-kubernetes-validations) that upstream enforces, ours enforce too.
        let ours_rules = cel_rules(&schema_of(version));
        for rule in cel_rules(&schema_of(up)) {
            if !ours_rules.contains(&rule) {
                problems.push(format!("{prefix}: upstream's CEL rule {rule:?} is missing"));
            }
        }
        let mut schema_problems = Vec::new();
        compare(
            "",
            &schema_of(up),
            &schema_of(version),
            &mut schema_problems,
        );
        problems.extend(
            schema_problems
                .into_iter()
                .map(|p| format!("{prefix}: {p}")),
        );
    }
    problems
}

/// Every CEL rule in a schema, with the path it applies to.
fn cel_rules(schema: &Value) -> Vec<String> {
    fn walk(path: &str, value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for rule in map
                    .get("x-kubernetes-validations")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    out.push(format!(
                        "{path}: {}",
                        rule["rule"].as_str().unwrap_or_default()
                    ));
                }
                for (key, child) in map {
                    walk(&format!("{path}/{key}"), child, out);
                }
            }
            Value::Array(items) => items.iter().for_each(|item| walk(path, item, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk("", schema, &mut out);
    out
}

#[test]
fn cel_rules_are_found_wherever_they_are() {
    let schema = serde_json::json!({
        "properties": { "spec": {
            "x-kubernetes-validations": [{ "rule": "self.a == self.b" }],
            "properties": { "a": { "x-kubernetes-validations": [{ "rule": "size(self) < 9" }] } }
        } }
    });
    assert_eq!(
        cel_rules(&schema),
        vec![
            "/properties/spec: self.a == self.b".to_string(),
            "/properties/spec/properties/a: size(self) < 9".to_string()
        ]
    );
}

#[test]
fn generated_crds_accept_everything_upstream_accepts() {
    let dir = support::upstream_crds_dir();
    let mut problems = Vec::new();
    let ours: Vec<_> = bitpool::crds::served()
        .into_iter()
        .chain(bitpool::crds::standalone())
        .collect();
    for crd in &ours {
        let upstream = support::read_crds(&dir.join(upstream_file_for(crd)));
        assert_eq!(upstream.len(), 1, "one CRD per upstream file");
        problems.extend(check(crd, &upstream[0]));
    }
    assert!(
        problems.is_empty(),
        "incompatible with upstream:\n{}",
        problems.join("\n")
    );
}

/// The comparison itself must catch what it claims to: a missing field, a changed type, a field
/// made required, a tighter bound, and a dropped enum value.
#[test]
fn the_comparison_catches_incompatibilities() {
    let upstream: Value = serde_json::json!({
        "type": "object",
        "required": ["a"],
        "properties": {
            "a": {"type": "string", "enum": ["x", "y"]},
            "b": {"type": "integer", "maximum": 128},
            "c": {"type": "array", "items": {"type": "string"}},
        }
    });
    let cases = [
        (
            serde_json::json!({"type": "object", "required": ["a"], "properties": {
            "a": {"type": "string", "enum": ["x", "y"]}, "b": {"type": "integer", "maximum": 128},
            "c": {"type": "array", "items": {"type": "string"}}}}),
            0,
        ),
        (
            serde_json::json!({"type": "object", "properties": {
            "a": {"type": "string"}, "b": {"type": "integer"}}}),
            1,
        ), // c missing
        (
            serde_json::json!({"type": "object", "properties": {
            "a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "array", "items": {"type": "string"}}}}),
            1,
        ),
        (
            serde_json::json!({"type": "object", "required": ["a", "b"], "properties": {
            "a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": "array", "items": {"type": "string"}}}}),
            1,
        ),
        (
            serde_json::json!({"type": "object", "properties": {
            "a": {"type": "string", "enum": ["x"]}, "b": {"type": "integer", "maximum": 32},
            "c": {"type": "array", "items": {"type": "integer"}}}}),
            3,
        ),
    ];
    for (i, (ours, expected)) in cases.iter().enumerate() {
        let mut problems = Vec::new();
        compare("", &upstream, ours, &mut problems);
        assert_eq!(problems.len(), *expected, "case {i}: {problems:?}");
    }
}
