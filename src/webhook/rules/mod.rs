//! The admission rules, as plain functions over plain data: each returns the violations it
//! finds, every one naming the field and the rule. Upstream's messages are kept where users and
//! tooling match on them; bitpool's own rules (preallocations, shrinking, deletion, overlap)
//! say what to change.
//!
//! - [`pools`]: a pool's spec, on create and update;
//! - [`held`]: what a pool's allocated addresses forbid (shrinking, deletion) and overlap;
//! - [`claims`]: claims, Metal3 IPAddresses and the addresses they request;
//! - [`templates`]: the rules of Metal3DataTemplates.

pub mod claims;
pub mod held;
pub mod pools;
pub mod templates;
#[cfg(test)]
mod tests;

pub use claims::{
    Reference, claim_namespace, ipclaim, metal3_address, requested_address, requested_prefix,
};
pub use held::{delete, overlaps, prefix_addresses, shrink};
pub use pools::{
    bare_preallocation_warnings, capi_pool, capi_pool_warnings, metal3_indexes_in_bounds,
    metal3_pool, metal3_pool_update, prefix_pool, prefix_pool_update, v1alpha1_pool,
};
pub use templates::data_template;

use crate::alloc::SpecError;

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
