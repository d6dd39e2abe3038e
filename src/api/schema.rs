//! Schema fragments that derive macros cannot express on their own.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};

/// `status.conditions`: a list-map keyed on `type`, as every Kubernetes API with conditions declares it.
pub(crate) fn conditions(generator: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "items": generator.subschema_for::<Condition>(),
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "maxItems": 32,
    })
}

/// `preAllocations` (bitpool's extension, so bitpool bounds it): claim → address or sub-prefix.
/// Values are at most an IPv6 address with an IPv4 tail and a length (49 characters).
pub(crate) fn pre_allocations(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "additionalProperties": { "type": "string", "maxLength": 49 },
        "maxProperties": MAX_PRE_ALLOCATIONS,
    })
}

/// The most `preAllocations` a pool may have.
pub const MAX_PRE_ALLOCATIONS: usize = 4096;

/// A free-form value that the API server must keep as written (bond `parameters`).
pub(crate) fn preserve_unknown(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "x-kubernetes-preserve-unknown-fields": true })
}

/// An optional string enum without the `null` entry that `Option<Enum>` would add: Kubernetes
/// 1.20 rejects such a CRD with a misleading message (see the test control-plane facts).
pub(crate) fn optional_enum<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<T>()
}

/// The IPv4 and IPv6 forms the Metal3 CRDs accept: dotted-quad IPv4, and IPv6 in any of its
/// compressed forms without an embedded IPv4 tail. Built from parts so that it can be read.
fn ip_family_patterns() -> (String, String) {
    let octet = "([0-9]|[1-9][0-9]|1[0-9]{2}|2[0-4][0-9]|25[0-5])";
    let ipv4 = format!("(({octet}\\.){{3}}{octet})");
    let h = "[0-9a-fA-F]{1,4}";
    let ipv6_forms = [
        format!("({h}:){{7,7}}{h}"),
        format!("({h}:){{1,7}}:"),
        format!("({h}:){{1,6}}:{h}"),
        format!("({h}:){{1,5}}(:{h}){{1,2}}"),
        format!("({h}:){{1,4}}(:{h}){{1,3}}"),
        format!("({h}:){{1,3}}(:{h}){{1,4}}"),
        format!("({h}:){{1,2}}(:{h}){{1,5}}"),
        format!("{h}:((:{h}){{1,6}})"),
        format!(":((:{h}){{1,7}}|:)"),
    ];
    (ipv4, format!("({})", ipv6_forms.join("|")))
}

/// An IPv4 or IPv6 address.
pub(crate) fn ip_address_pattern() -> String {
    let (ipv4, ipv6) = ip_family_patterns();
    format!("((^{ipv4}$)|(^{ipv6}$))")
}

/// An IPv4 address only.
pub(crate) fn ipv4_address_pattern() -> String {
    format!("^{}$", ip_family_patterns().0)
}

/// An IPv6 address only.
pub(crate) fn ipv6_address_pattern() -> String {
    format!("^{}$", ip_family_patterns().1)
}

/// An address with a prefix length: `/0`–`/32` for IPv4, `/0`–`/128` for IPv6.
pub(crate) fn ip_subnet_pattern() -> String {
    let (ipv4, ipv6) = ip_family_patterns();
    let v4_len = "([0-9]|[1-2][0-9]|3[0-2])";
    let v6_len = "([0-9]|[0-9][0-9]|1[0-1][0-9]|12[0-8])";
    format!("((^{ipv4}/{v4_len}$)|(^{ipv6}/{v6_len}$))")
}

/// An IPv4 or IPv6 address, as upstream's pattern spells it.
pub(crate) fn ip_address(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "string", "pattern": ip_address_pattern() })
}

/// An optional address: the same schema as [`ip_address`].
pub(crate) fn optional_ip_address(generator: &mut SchemaGenerator) -> Schema {
    ip_address(generator)
}

/// A list of addresses.
pub(crate) fn ip_address_list(generator: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "array", "items": ip_address(generator) })
}

/// A map whose values are addresses.
pub(crate) fn ip_address_map(generator: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "object", "additionalProperties": ip_address(generator) })
}

/// An optional address with a prefix length ([`ip_subnet_pattern`]).
pub(crate) fn optional_ip_subnet(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "string", "pattern": ip_subnet_pattern() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The patterns must be the very strings the upstream CRDs carry, so that bitpool's CRD
    /// accepts and rejects exactly what upstream does. Pinned here; the CRD compatibility test
    /// compares them with the upstream files as well.
    #[test]
    fn ip_patterns_have_the_upstream_shape() {
        let address = ip_address_pattern();
        assert!(
            address.starts_with("((^((([0-9]|[1-9][0-9]|1[0-9]{2}|2[0-4][0-9]|25[0-5])\\.){3}")
        );
        assert!(address.ends_with(":((:[0-9a-fA-F]{1,4}){1,7}|:))$))"));
        let subnet = ip_subnet_pattern();
        assert!(subnet.contains("25[0-5]))/([0-9]|[1-2][0-9]|3[0-2])$)|(^("));
        assert!(subnet.ends_with("|:))/([0-9]|[0-9][0-9]|1[0-1][0-9]|12[0-8])$))"));
    }
}
