//! The rules of claims (CAPI IPAddressClaims, Metal3 IPClaims) and Metal3 IPAddresses: the
//! pool they name, the address they request, and what stays fixed after creation.

use crate::alloc::{self, Layout, Numbering};
use crate::api::metal3_ipam::{self, Metal3IPAddressSpec};

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

/// The `ipAddress` annotation of a claim: an IP, and one the pool hands out when it is known.
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
