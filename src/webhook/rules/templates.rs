//! The rules of a Metal3DataTemplate (CAPM3's).

use crate::api::metal3_data::{Metal3DataTemplateSpec, Networks};

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
