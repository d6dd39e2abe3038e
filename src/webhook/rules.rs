//! The admission rules, as plain functions over plain data: each returns the violations it
//! finds, every one naming the field and the rule. Upstream's messages are kept where users and
//! tooling match on them; bitpool's own rules (preallocations, shrinking, deletion, overlap)
//! say what to change.

use crate::alloc::{self, Layout, Numbering, SpecError};
use crate::api::capi_pools::{InClusterIPPoolSpec, InClusterPrefixPoolSpec};
use crate::api::metal3_data::{Metal3DataTemplateSpec, Networks};
use crate::api::metal3_ipam::{IPPoolSpec, Metal3IPAddressSpec};
use crate::api::{AllocationStrategy, metal3_ipam};
use crate::ipam::spec;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// Set on a pool to allow an update that leaves allocated addresses outside it (they stay
/// allocated and are counted as out of range).
pub const ALLOW_SHRINK_ANNOTATION: &str = "ipam.bitpool.dev/allow-shrink";

/// One allocated address of a pool and the claim that holds it (empty where not known).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub address: String,
    pub claim: String,
}

/// Upstream's wording for the spec errors users match on, before bitpool's detail.
fn upstream_phrase(error: &SpecError) -> Option<&'static str> {
    match error {
        SpecError::Unparseable { .. } => {
            Some("provided address is not a valid IP, range, nor CIDR")
        }
        SpecError::MixedFamilies { field, .. } if field.starts_with("gateway") => {
            Some("provided gateway and addresses are of mixed IP families")
        }
        SpecError::MixedFamilies { field, .. } if field.starts_with("excludedAddresses") => {
            Some("addresses and excluded addresses are of mixed IP families")
        }
        SpecError::MixedFamilies { .. } => Some("provided addresses are of mixed IP families"),
        SpecError::OutsideSubnet { field, .. } if field.starts_with("addresses") => {
            Some("provided address belongs to a different subnet than others")
        }
        SpecError::InvalidPrefix { .. } => Some("provided prefix is not valid"),
        SpecError::NoAddresses => Some("addresses is required"),
        _ => None,
    }
}

fn spec_error(error: &SpecError) -> String {
    let detail = error.to_string();
    // `spec.subnets` is bitpool's: upstream has no words for its errors, which name the field.
    if detail.starts_with("subnets[") {
        return format!("spec.{detail}");
    }
    match upstream_phrase(error) {
        Some(phrase) => format!("spec: {phrase}: {error}"),
        None => format!("spec: {error}"),
    }
}

/// InClusterIPPool and GlobalInClusterIPPool, on create and update.
pub fn capi_pool(spec: &InClusterIPPoolSpec) -> Result<Layout, Vec<String>> {
    let mut problems = Vec::new();
    if spec.addresses.is_empty() {
        problems.push("spec.addresses: addresses is required".to_string());
    }
    if spec.prefix < 0 {
        problems.push(format!(
            "spec.prefix: a valid prefix is required (got {})",
            spec.prefix
        ));
    }
    if spec
        .address_reuse_grace_period_seconds
        .is_some_and(|s| s < 0)
    {
        problems.push(
            "spec.addressReuseGracePeriodSeconds: addressReuseGracePeriodSeconds must not be negative"
                .to_string(),
        );
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    spec::capi_pool(spec)
        .layout()
        .map_err(|e| vec![spec_error(&e)])
}

/// What an InClusterIPPool or GlobalInClusterIPPool may have but is worth a second look: a
/// gateway outside the pool's subnet (valid, as upstream has it: link-local IPv6 gateways are).
pub fn capi_pool_warnings(spec: &InClusterIPPoolSpec) -> Vec<String> {
    spec::capi_pool(spec)
        .gateway_outside_subnet()
        .map(|subnet| {
            format!(
                "spec.gateway: {} is outside the pool's subnet {subnet}; it is kept out of the pool and written on every IPAddress as it is",
                spec.gateway.as_deref().unwrap_or_default()
            )
        })
        .into_iter()
        .collect()
}

/// A cluster-scoped pool's bare `preAllocations` keys (`<name>`) when the pool names no
/// namespace for them (`bare_namespace`, its annotation): they name no claim.
pub fn bare_preallocation_warnings(
    pre_allocations: &BTreeMap<String, String>,
    bare_namespace: Option<&str>,
) -> Vec<String> {
    if bare_namespace.is_some() {
        return Vec::new();
    }
    let bare: Vec<&str> = pre_allocations
        .keys()
        .filter(|k| !k.contains('/'))
        .map(String::as_str)
        .collect();
    if bare.is_empty() {
        return Vec::new();
    }
    vec![format!(
        "spec.preAllocations: {} name(s) no namespace and are held for no claim: write <namespace>/<name>, or name the namespace whose claims bare keys are for in annotation {}",
        bare.join(", "),
        crate::api::capi_pools::PREALLOCATION_NAMESPACE_ANNOTATION
    )]
}

/// InClusterPrefixPool and GlobalInClusterPrefixPool, on create and update: the layout over
/// sub-prefix numbers and their numbering.
pub fn prefix_pool(spec: &InClusterPrefixPoolSpec) -> Result<(Layout, Numbering), Vec<String>> {
    if spec.prefixes.is_empty() {
        return Err(vec!["spec.prefixes: prefixes is required".to_string()]);
    }
    if !(1..=128).contains(&spec.allocation_prefix_length) {
        return Err(vec![format!(
            "spec.allocationPrefixLength: allocationPrefixLength must be between 1 and 128 (got {})",
            spec.allocation_prefix_length
        )]);
    }
    spec::prefix_pool(spec)
        .layout()
        .map_err(|e| vec![spec_error(&e)])
}

/// A prefix pool's update: the allocation length is fixed (upstream's rule: the sub-prefixes
/// handed out would no longer be sub-prefixes of the pool), and every allocated sub-prefix must
/// stay in the pool unless the pool carries [`ALLOW_SHRINK_ANNOTATION`].
pub fn prefix_pool_update(
    held: &[Held],
    old: &InClusterPrefixPoolSpec,
    new: (&Layout, Numbering),
    allow_shrink: bool,
) -> Vec<String> {
    let (layout, numbering) = new;
    if old.allocation_prefix_length != i32::from(numbering.length) {
        return vec!["spec.allocationPrefixLength is immutable".to_string()];
    }
    if allow_shrink {
        return Vec::new();
    }
    let old = prefix_pool(old).ok();
    let held_as = |h: &Held| {
        alloc::parse_address(&h.address)
            .filter(|a| alloc::Family::of(*a) == numbering.family)
            .map(|a| numbering.containing(a))
    };
    let show = |number| numbering.sub_prefix(number);
    shrink_of(held, old.as_ref().map(|(l, _)| l), layout, held_as, show)
}

/// Metal3 IPPool, on create and update.
pub fn metal3_pool(spec: &IPPoolSpec) -> Result<Layout, Vec<String>> {
    let mut problems = Vec::new();
    let random = spec.allocation_strategy == Some(AllocationStrategy::Random);
    for (i, entry) in spec.pools.iter().enumerate() {
        let set = |v: &Option<String>| v.as_deref().is_some_and(|s| !s.is_empty());
        if !set(&entry.start) && !set(&entry.end) && !set(&entry.subnet) {
            problems.push(format!(
                "spec.pools[{i}]: at least one of start, end or subnet must be set"
            ));
        } else if random && !set(&entry.end) && !set(&entry.subnet) {
            problems.push(format!(
                "spec.pools[{i}]: the random allocation strategy needs a bounded range (an end or a subnet)"
            ));
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let pool = spec::metal3_pool(spec);
    let layout = pool.layout().map_err(|e| vec![spec_error(&e)])?;
    let outside: Vec<String> = layout
        .pre_allocations_outside
        .iter()
        .map(|(claim, value)| {
            format!(
                "spec.preAllocations[{claim}]: {} is out of bounds of the pools given",
                layout.family.address(*value)
            )
        })
        .collect();
    if outside.is_empty() {
        Ok(layout)
    } else {
        Err(outside)
    }
}

/// Metal3 IPPool fields fixed at creation (upstream's update rules).
pub fn metal3_pool_update(old: &IPPoolSpec, new: &IPPoolSpec) -> Vec<String> {
    let mut problems = Vec::new();
    if old.name_prefix != new.name_prefix {
        problems.push("spec.namePrefix: cannot be modified".to_string());
    }
    let strategy = |s: &IPPoolSpec| s.allocation_strategy.unwrap_or_default();
    if strategy(old) != strategy(new) {
        problems.push("spec.allocationStrategy: cannot be modified after creation".to_string());
    }
    problems
}

/// Upstream Metal3's check of the old `status.indexes` against the new ranges.
pub fn metal3_indexes_in_bounds(
    indexes: &BTreeMap<String, String>,
    layout: &Layout,
) -> Vec<String> {
    indexes
        .iter()
        .filter(|(_, address)| {
            alloc::parse_address(address).is_some_and(|a| !layout.contains(a))
        })
        .map(|(claim, address)| {
            format!("spec.pools: {address} (claim {claim}) is in use but out of bounds of the pools given")
        })
        .collect()
}

/// An update must keep every allocated address inside the pool, unless the pool carries
/// [`ALLOW_SHRINK_ANNOTATION`]. Addresses already outside the old pool do not count.
pub fn shrink(held: &[Held], old: Option<&Layout>, new: &Layout) -> Vec<String> {
    shrink_of(
        held,
        old,
        new,
        |h| alloc::parse_address(&h.address),
        |a| a.to_string(),
    )
}

/// [`shrink`] for a pool whose layout numbers something else than addresses: `held` says what
/// an address object holds in the layout's terms, `show` how to name that to people.
fn shrink_of(
    held: &[Held],
    old: Option<&Layout>,
    new: &Layout,
    held_as: impl Fn(&Held) -> Option<IpAddr>,
    show: impl Fn(IpAddr) -> String,
) -> Vec<String> {
    let dropped: Vec<String> = held
        .iter()
        .filter_map(|h| Some((held_as(h)?, h)))
        .filter(|(a, _)| old.is_none_or(|old| old.contains(*a)) && !new.contains(*a))
        .map(|(a, h)| match h.claim.as_str() {
            "" => show(a),
            claim => format!("{} (claim {claim})", show(a)),
        })
        .collect();
    if dropped.is_empty() {
        return Vec::new();
    }
    vec![format!(
        "spec: pool addresses do not contain allocated addresses: {}; free them first, or set the annotation {ALLOW_SHRINK_ANNOTATION}: \"true\" to keep them allocated outside the pool",
        list(&dropped)
    )]
}

/// A pool with allocated addresses cannot be deleted (upstream's message, and who holds them).
pub fn delete(held: &[Held]) -> Vec<String> {
    if held.is_empty() {
        return Vec::new();
    }
    let claims: Vec<String> = held
        .iter()
        .filter(|h| !h.claim.is_empty())
        .map(|h| h.claim.clone())
        .collect();
    let held_by = match claims.len() {
        0 => String::new(),
        known if known < held.len() => format!(
            " held by claim(s): {}, and {} more",
            list(&claims),
            held.len() - known
        ),
        _ => format!(" held by claim(s): {}", list(&claims)),
    };
    vec![format!(
        "Pool has IPAddresses allocated. Cannot delete Pool until all IPAddresses have been removed. {} address(es){held_by}",
        held.len()
    )]
}

/// At most ten names, then how many more.
fn list(names: &[String]) -> String {
    const SHOWN: usize = 10;
    let mut text = names
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        text.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    text
}

/// A prefix pool's layout over the addresses its sub-prefixes cover (for [`overlaps`]).
pub fn prefix_addresses((layout, numbering): &(Layout, Numbering)) -> Layout {
    let mut addresses = layout.clone();
    for segment in &mut addresses.segments {
        (segment.first, segment.last) = numbering.address_bounds(segment.first, segment.last);
    }
    addresses
}

/// Pools (by `Kind namespace/name`) whose addresses meet this one's.
pub fn overlaps(layout: &Layout, others: &[(String, Layout)]) -> Vec<String> {
    others
        .iter()
        .filter(|(_, other)| {
            other.family == layout.family
                && layout.segments.iter().any(|a| {
                    other
                        .segments
                        .iter()
                        .any(|b| a.first <= b.last && b.first <= a.last)
                })
        })
        .map(|(name, _)| format!("spec: the pool's addresses overlap those of {name}"))
        .collect()
}

/// The `ipAddress` annotation of a claim: an IP, and one the pool hands out when it is known.
/// A new claim on a cluster-scoped pool from a namespace its `namespaceSelector` leaves out.
pub fn claim_namespace(
    pool: &str,
    tenancy: &crate::ipam::tenancy::Tenancy,
    namespace: &str,
    labels: &std::collections::BTreeMap<String, String>,
) -> Vec<String> {
    match tenancy.admits(labels) {
        true => Vec::new(),
        false => vec![format!(
            "spec.poolRef: {}",
            crate::ipam::kinds::not_selected_message(pool, namespace, &tenancy.describe())
        )],
    }
}

pub fn requested_address(value: Option<&str>, pool: Option<&Layout>) -> Vec<String> {
    let Some(value) = value else {
        return Vec::new();
    };
    let annotation = metal3_ipam::REQUESTED_ADDRESS_ANNOTATION;
    match alloc::parse_address(value) {
        None => vec![format!(
            "metadata.annotations[{annotation}]: Invalid ipAddress annotation {value:?}: not a valid IP address"
        )],
        Some(address) if pool.is_some_and(|p| !p.contains(address)) => vec![format!(
            "metadata.annotations[{annotation}]: {address} is not an address of the pool"
        )],
        Some(_) => Vec::new(),
    }
}

/// IPAddressClaim on a prefix pool: the `ipAddress` annotation names a sub-prefix of the pool's
/// allocation length (`network/length` or the network address) inside the pool, when the pool is
/// known and valid.
pub fn requested_prefix(value: Option<&str>, pool: Option<&(Layout, Numbering)>) -> Vec<String> {
    let (Some(value), Some((layout, numbering))) = (value, pool) else {
        return Vec::new();
    };
    let annotation = metal3_ipam::REQUESTED_ADDRESS_ANNOTATION;
    match numbering.parse(value) {
        None => vec![format!(
            "metadata.annotations[{annotation}]: Invalid ipAddress annotation {value:?}: not a /{} sub-prefix",
            numbering.length
        )],
        Some(number) if !layout.contains(number) => vec![format!(
            "metadata.annotations[{annotation}]: {} is not a sub-prefix of the pool",
            numbering.sub_prefix(number)
        )],
        Some(_) => Vec::new(),
    }
}

/// A reference to a pool by name, kind and group, as a claim gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    pub name: String,
    pub namespace: Option<String>,
    pub kind: Option<String>,
}

/// Metal3 IPClaim: a pool name; fixed after creation.
pub fn ipclaim(old: Option<&Reference>, new: &Reference) -> Vec<String> {
    let mut problems = Vec::new();
    if new.name.is_empty() {
        problems.push("spec.pool.name: cannot be empty".to_string());
    }
    if let Some(old) = old {
        if old.name != new.name {
            problems.push("spec.pool.name: cannot be modified".to_string());
        }
        if old.namespace != new.namespace {
            problems.push("spec.pool.namespace: cannot be modified".to_string());
        }
        if old.kind != new.kind {
            problems.push("spec.pool.kind: cannot be modified".to_string());
        }
    }
    problems
}

/// Metal3 IPAddress: pool, claim and a valid address; none of them changes.
pub fn metal3_address(old: Option<&Metal3IPAddressSpec>, new: &Metal3IPAddressSpec) -> Vec<String> {
    // On create, as upstream; an update only may not change them.
    if let Some(old) = old {
        return immutable_address_fields(old, new);
    }
    let mut problems = Vec::new();
    let name = |r: &k8s_openapi::api::core::v1::ObjectReference| r.name.clone().unwrap_or_default();
    if name(&new.pool).is_empty() {
        problems.push("spec.pool.name: cannot be empty".to_string());
    }
    if name(&new.claim).is_empty() {
        problems.push("spec.claim.name: cannot be empty".to_string());
    }
    if new.address.is_empty() {
        problems.push("spec.address: cannot be empty".to_string());
    } else if alloc::parse_address(&new.address).is_none() {
        problems.push(format!(
            "spec.address: {:?} is not a valid IP address",
            new.address
        ));
    }
    problems
}

fn immutable_address_fields(old: &Metal3IPAddressSpec, new: &Metal3IPAddressSpec) -> Vec<String> {
    let mut problems = Vec::new();
    if old.address != new.address {
        problems.push("spec.address: cannot be modified".to_string());
    }
    let same = |a: &k8s_openapi::api::core::v1::ObjectReference,
                b: &k8s_openapi::api::core::v1::ObjectReference| {
        a.name == b.name && a.namespace == b.namespace && a.kind == b.kind
    };
    if !same(&old.pool, &new.pool) {
        problems.push("spec.pool: cannot be modified".to_string());
    }
    if !same(&old.claim, &new.claim) {
        problems.push("spec.claim: cannot be modified".to_string());
    }
    problems
}

/// Metal3DataTemplate: every static network names where its address comes from; metaData and
/// networkData are fixed after creation (CAPM3's rules).
pub fn data_template(
    old: Option<&Metal3DataTemplateSpec>,
    new: &Metal3DataTemplateSpec,
) -> Vec<String> {
    let mut problems = Vec::new();
    // On create only, as CAPM3: a template stored before the rule can still lose its finalizer.
    if let (None, Some(networks)) = (
        old,
        new.network_data.as_ref().and_then(|n| n.networks.as_ref()),
    ) {
        problems.extend(static_network_sources(networks));
    }
    if let Some(old) = old {
        if old.meta_data != new.meta_data {
            problems.push("spec.metaData: cannot be modified".to_string());
        }
        if old.network_data != new.network_data {
            problems.push("spec.networkData: cannot be modified".to_string());
        }
    }
    problems
}

fn static_network_sources(networks: &Networks) -> Vec<String> {
    let v4 = networks.ipv4.iter().map(|n| {
        (
            n.from_pool_ref.as_ref().map(|r| r.name.as_str()),
            n.ip_address_from_ip_pool.as_deref(),
            n.from_pool_annotation.is_some(),
        )
    });
    let v6 = networks.ipv6.iter().map(|n| {
        (
            n.from_pool_ref.as_ref().map(|r| r.name.as_str()),
            n.ip_address_from_ip_pool.as_deref(),
            n.from_pool_annotation.is_some(),
        )
    });
    let mut problems = Vec::new();
    for (family, entries) in [("ipv4", v4.collect::<Vec<_>>()), ("ipv6", v6.collect())] {
        for (i, (pool_ref, by_name, annotation)) in entries.into_iter().enumerate() {
            let named = |v: Option<&str>| v.is_some_and(|s| !s.is_empty());
            if !named(pool_ref) && !named(by_name) && !annotation {
                problems.push(format!(
                    "spec.networkData.networks.{family}[{i}].fromPoolRef.name: Required value: fromPoolRef needs to contain a reference to an IPPool"
                ));
            }
        }
    }
    problems
}

/// The v1alpha1 pool fields that v1alpha2 has no place for: they must parse before they are
/// mapped to `addresses`.
pub fn v1alpha1_pool(spec: &crate::api::capi_pools::v1alpha1::InClusterIPPoolSpec) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(subnet) = spec.subnet.as_deref().filter(|s| !s.is_empty())
        && alloc::parse_subnet(subnet).is_none()
    {
        problems.push(format!("spec.subnet: {subnet:?} is not a valid CIDR"));
    }
    for (field, value) in [("start", &spec.start), ("end", &spec.end)] {
        if let Some(value) = value.as_deref().filter(|s| !s.is_empty())
            && alloc::parse_address(value).is_none()
        {
            problems.push(format!("spec.{field}: {value:?} is not a valid IP address"));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

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
            problems(metal3_pool(&random))
                .contains("random allocation strategy needs a bounded range")
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
            found.contains(
                "pool addresses do not contain allocated addresses: 10.0.0.50 (claim lost)"
            ),
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
            requested_address(Some("ten"), None)[0]
                .contains("Invalid ipAddress annotation \"ten\"")
        );
        assert!(
            requested_address(Some("10.0.5.7"), Some(&pool))[0]
                .contains("10.0.5.7 is not an address of the pool")
        );
    }

    #[test]
    fn templates_name_a_pool_for_every_static_network_and_stay_fixed() {
        let template = |ipv4: serde_json::Value| -> Metal3DataTemplateSpec {
            serde_json::from_value(serde_json::json!({"clusterName": "c", "networkData": {"networks": {"ipv4": ipv4}}})).expect("template")
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
}
