//! The rules of a pool's spec, on create and update, for each pool kind.

use std::collections::BTreeMap;

use super::held::shrink_of;
use super::{Held, spec_error};
use crate::alloc::{self, Layout, Numbering};
use crate::api::AllocationStrategy;
use crate::api::capi_pools::{InClusterIPPoolSpec, InClusterPrefixPoolSpec};
use crate::api::metal3_ipam::IPPoolSpec;
use crate::ipam::spec;

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
/// stay in the pool unless the pool carries [`super::ALLOW_SHRINK_ANNOTATION`].
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
