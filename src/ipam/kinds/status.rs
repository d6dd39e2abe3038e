//! What a claim's status says after a reconcile, and the patch that says it, in each API's terms.

use k8s_openapi::api::core::v1::ObjectReference;
use serde_json::json;

use crate::alloc::AllocError;
use crate::api::capi::{self, LocalObjectName};
use crate::ipam::ledger::intent::Refusal;
use crate::runtime::cached::{ClaimObject, IpamApi};
use crate::runtime::objects;

/// What a claim's status should say after a reconcile.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Allocated {
        address_name: String,
        /// As people read it (a prefix pool's sub-prefix with its length).
        address: String,
    },
    Refused {
        refusal: Refusal,
        pool: String,
        spec_error: Option<String>,
    },
    /// The address object could not be written.
    Failed(String),
}

/// What a person reads of a refusal: a CAPI claim's `Ready` message, a Metal3 claim's
/// `errorMessage` where upstream has no words of its own, and the claim's Event.
pub fn refusal_message(pool: &str, refusal: &Refusal, spec_error: Option<&str>) -> String {
    match refusal {
        Refusal::PoolInvalid => {
            format!(
                "{pool} is not ready: {}",
                spec_error.unwrap_or("invalid spec")
            )
        }
        Refusal::Alloc(AllocError::Exhausted) => {
            format!("{pool} has no free address; the claim is retried when one is released")
        }
        Refusal::Alloc(e) => e.to_string(),
        Refusal::Fenced { until } => format!(
            "{pool} rebuilt its allocation record from its address objects; new addresses are handed out from {until}, when nothing can still be in flight"
        ),
        Refusal::Paused => format!(
            "{pool} is paused (annotation {}): it hands out no address until the annotation is removed",
            crate::api::labels::PAUSED
        ),
        Refusal::Deferred => format!("{pool} is serving earlier claims; this one is next"),
        Refusal::LedgerFull { bytes } => format!(
            "{pool} hands out no new address: its allocation record takes {} KiB of the {} KiB it may, because its addresses are scattered over a vast space (requested addresses across many /64s); release addresses, or serve further claims from another pool",
            bytes / 1024,
            crate::ipam::ledger::MAX_BITMAP_BYTES / 1024
        ),
        Refusal::NotHanded { address, why } => format!(
            "the claim's address object names {address}, which {pool} did not hand to this claim ({why}): bitpool did not make that object; delete it and the claim is served"
        ),
        Refusal::NamespaceNotSelected {
            namespace,
            selector,
        } => not_selected_message(pool, namespace, selector),
    }
}

/// The contract's reason (one of its three, and bitpool's own for a namespace not selected).
fn capi_refusal_reason(refusal: &Refusal) -> &'static str {
    match refusal {
        Refusal::Alloc(AllocError::Exhausted) | Refusal::LedgerFull { .. } => {
            capi::reasons::POOL_EXHAUSTED
        }
        Refusal::PoolInvalid | Refusal::Fenced { .. } | Refusal::Paused | Refusal::Deferred => {
            capi::reasons::POOL_NOT_READY
        }
        Refusal::Alloc(_) | Refusal::NotHanded { .. } => capi::reasons::ALLOCATION_FAILED,
        Refusal::NamespaceNotSelected { .. } => capi::reasons::NAMESPACE_NOT_SELECTED,
    }
}

/// The Ready condition's reason and message for an outcome that is not an allocation.
pub(super) fn capi_reason(outcome: &Outcome) -> (&'static str, String) {
    match outcome {
        Outcome::Refused {
            refusal,
            pool,
            spec_error,
        } => (
            capi_refusal_reason(refusal),
            refusal_message(pool, refusal, spec_error.as_deref()),
        ),
        Outcome::Failed(message) => (capi::reasons::ALLOCATION_FAILED, message.clone()),
        Outcome::Allocated { .. } => (ALLOCATED_REASON, String::new()),
    }
}

/// The reason of a served CAPI claim's `Ready` condition.
pub(super) const ALLOCATED_REASON: &str = "AddressAllocated";
/// Its message, before the address.
pub(super) const ALLOCATED_MESSAGE: &str = "allocated ";

/// Whether `claim`'s status already says it holds `address` through the object `address_name`,
/// so that its status patch for that allocation would be `None`. Answered without building the
/// status: a reconcile asks it of every claim the pool serves.
pub(super) fn shows_allocated(claim: &ClaimObject, address_name: &str, address: &str) -> bool {
    if claim.address.as_deref() != Some(address_name) {
        return false;
    }
    match claim.api {
        IpamApi::Metal3 => claim.error_message().is_none(),
        IpamApi::Capi => (claim.conditions.iter())
            .find(|c| &*c.head.type_ == capi::READY_CONDITION)
            .is_some_and(|c| {
                &*c.head.status == "True"
                    && &*c.head.reason == ALLOCATED_REASON
                    && c.message.strip_prefix(ALLOCATED_MESSAGE) == Some(address)
                    && c.observed_generation() == claim.generation()
            }),
    }
}

pub(super) fn capi_status_patch(
    claim: &ClaimObject,
    outcome: &Outcome,
) -> Option<serde_json::Value> {
    let current = claim.address.as_deref().map(|name| LocalObjectName {
        name: name.to_string(),
    });
    let mut address_ref = current.clone();
    let mut conditions = claim.conditions();
    let condition = match outcome {
        Outcome::Allocated {
            address_name,
            address,
        } => {
            address_ref = Some(LocalObjectName {
                name: address_name.clone(),
            });
            objects::condition(
                capi::READY_CONDITION,
                true,
                ALLOCATED_REASON,
                format!("{ALLOCATED_MESSAGE}{address}"),
                claim.generation(),
            )
        }
        other => {
            let (reason, message) = capi_reason(other);
            objects::condition(
                capi::READY_CONDITION,
                false,
                reason,
                message,
                claim.generation(),
            )
        }
    };
    let ref_changed = current != address_ref;
    let condition_changed = objects::set_condition(&mut conditions, condition);
    (ref_changed || condition_changed)
        .then(|| capi::claim_status_patch(address_ref.as_ref(), &conditions))
}

/// Why a claim of `namespace` gets nothing from a pool whose selector leaves it out.
pub fn not_selected_message(pool: &str, namespace: &str, selector: &str) -> String {
    format!(
        "{pool} serves only namespaces its spec.namespaceSelector ({selector}) selects, and namespace {namespace} is not one: label the namespace, or claim from another pool"
    )
}

/// Upstream's `errorMessage` strings, which existing tooling matches on.
pub(super) fn metal3_error(outcome: &Outcome) -> Option<String> {
    Some(match outcome {
        Outcome::Allocated { .. } => return None,
        // Neither is a failure, and Metal3 consumers read any errorMessage as one.
        Outcome::Refused {
            refusal: Refusal::Deferred | Refusal::Paused,
            ..
        } => return None,
        Outcome::Refused {
            refusal: Refusal::Alloc(e),
            ..
        } => metal3_alloc_error(e),
        Outcome::Refused {
            refusal,
            pool,
            spec_error,
        } => refusal_message(pool, refusal, spec_error.as_deref()),
        // Upstream's words first, which tooling matches; then what exactly is wrong.
        Outcome::Failed(reason) => {
            format!("Failed to create associated IPAddress object: {reason}")
        }
    })
}

/// Upstream's words for an allocation error.
fn metal3_alloc_error(e: &AllocError) -> String {
    match e {
        AllocError::Exhausted => "Exhausted IP Pools".into(),
        AllocError::RequestedUnparseable { value } => {
            format!("Invalid ipAddress annotation {value:?}: not a valid IP address")
        }
        AllocError::RequestedNotASubPrefix { value, length } => {
            format!("Invalid ipAddress annotation {value:?}: not a /{length} sub-prefix")
        }
        AllocError::ConflictsWithPreAllocation { .. } => {
            "PreAllocation and requested ip address are conflicting".into()
        }
        AllocError::RequestedOutsidePool { .. }
        | AllocError::RequestedInUse { .. }
        | AllocError::RequestedPreallocated { .. } => "Requested IP not available".into(),
        AllocError::PreAllocatedInUse { .. } => "Pre-allocated IP not available".into(),
        AllocError::PreAllocationOutOfBounds { .. } => "Pre-allocated IP out of bounds".into(),
        // No upstream words for it: upstream hands such an address another entry's prefix.
        e @ AllocError::ReservedOutsidePool { .. } => e.to_string(),
    }
}

pub(super) fn metal3_status_patch(
    claim: &ClaimObject,
    outcome: &Outcome,
) -> Option<serde_json::Value> {
    let current = claim.address.as_deref();
    let address_name = match outcome {
        Outcome::Allocated { address_name, .. } => Some(address_name.as_str()),
        _ => current,
    };
    let error = metal3_error(outcome);
    let unchanged = claim.error_message() == error.as_deref() && current == address_name;
    let address = address_name.map(|name| ObjectReference {
        name: Some(name.to_string()),
        namespace: Some(claim.meta.namespace().to_string()),
        ..Default::default()
    });
    (!unchanged).then(|| json!({ "status": { "address": address, "errorMessage": error } }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::capi::IPAddressClaim;
    use crate::api::capi::{IPAddressClaimSpec, IPAddressClaimStatus, IPPoolReference};
    use crate::api::metal3_ipam::IPClaim;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn claim(conditions: Vec<Condition>, address: Option<&str>) -> ClaimObject {
        let mut object = IPAddressClaim::new(
            "c",
            IPAddressClaimSpec {
                cluster_name: None,
                pool_ref: IPPoolReference {
                    name: "p".into(),
                    kind: "InClusterIPPool".into(),
                    api_group: capi::GROUP.into(),
                },
            },
        );
        object.metadata.namespace = Some("ns".into());
        object.status = Some(IPAddressClaimStatus {
            address_ref: address.map(|name| LocalObjectName { name: name.into() }),
            conditions,
            ..Default::default()
        });
        ClaimObject::of_capi(&object).expect("named and namespaced")
    }

    fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }
    }

    /// The status patch of a cached claim writes every condition it had (a merge patch replaces
    /// the list), and nothing when the claim already says so.
    #[test]
    fn a_status_patch_keeps_the_other_conditions() {
        let other = condition("Other", "False", "Elsewhere", "kept");
        let allocated = Outcome::Allocated {
            address_name: "c".into(),
            address: "10.0.0.4".into(),
        };
        let patch =
            capi_status_patch(&claim(vec![other.clone()], None), &allocated).expect("a change");
        let written = &patch["status"]["conditions"];
        assert_eq!(written.as_array().map(Vec::len), Some(2), "{patch}");
        assert_eq!(written[0]["type"], "Other");
        assert_eq!(written[0]["message"], "kept");
        assert_eq!(written[1]["type"], "Ready");
        assert_eq!(patch["status"]["addressRef"]["name"], "c");
        let ready = condition("Ready", "True", "AddressAllocated", "allocated 10.0.0.4");
        let served = claim(vec![other, ready], Some("c"));
        assert_eq!(capi_status_patch(&served, &allocated), None);
    }

    fn metal3_claim(address: Option<&str>, error: Option<&str>) -> ClaimObject {
        let object: IPClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "ipam.metal3.io/v1alpha1", "kind": "IPClaim",
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"pool": {"name": "p"}},
            "status": {"address": address.map(|name| serde_json::json!({"name": name, "namespace": "ns"})),
                       "errorMessage": error}
        }))
        .expect("a valid IPClaim");
        ClaimObject::of_metal3(&object).expect("named and namespaced")
    }

    /// The shortcut a reconcile takes for a served claim answers as the status patch does:
    /// `true` exactly where the patch of the allocation would be `None`.
    #[test]
    fn a_claim_shows_its_allocation_exactly_when_its_patch_is_empty() {
        let ready = |message: &str| condition("Ready", "True", "AddressAllocated", message);
        let mut other_generation = ready("allocated 10.0.0.4");
        other_generation.observed_generation = Some(2);
        let cases = [
            ("no status", claim(vec![], None)),
            ("the object named, no condition", claim(vec![], Some("c"))),
            (
                "served",
                claim(vec![ready("allocated 10.0.0.4")], Some("c")),
            ),
            (
                "another object named",
                claim(vec![ready("allocated 10.0.0.4")], Some("d")),
            ),
            (
                "another address",
                claim(vec![ready("allocated 10.0.0.5")], Some("c")),
            ),
            (
                "another generation",
                claim(vec![other_generation], Some("c")),
            ),
            (
                "not ready",
                claim(
                    vec![condition("Ready", "False", "PoolExhausted", "full")],
                    Some("c"),
                ),
            ),
            (
                "another reason",
                claim(
                    vec![condition("Ready", "True", "Other", "allocated 10.0.0.4")],
                    Some("c"),
                ),
            ),
            (
                "served, with another condition first",
                claim(
                    vec![
                        condition("Other", "False", "X", "y"),
                        ready("allocated 10.0.0.4"),
                    ],
                    Some("c"),
                ),
            ),
            ("Metal3, served", metal3_claim(Some("c"), None)),
            ("Metal3, no address", metal3_claim(None, None)),
            ("Metal3, another object", metal3_claim(Some("d"), None)),
            (
                "Metal3, an error left",
                metal3_claim(Some("c"), Some("Failed to allocate")),
            ),
        ];
        let allocated = Outcome::Allocated {
            address_name: "c".into(),
            address: "10.0.0.4".into(),
        };
        let mut served = Vec::new();
        for (what, claim) in &cases {
            let patch = match claim.api {
                IpamApi::Capi => capi_status_patch(claim, &allocated),
                IpamApi::Metal3 => metal3_status_patch(claim, &allocated),
            };
            let shows = shows_allocated(claim, "c", "10.0.0.4");
            assert_eq!(shows, patch.is_none(), "{what}: patch {patch:?}");
            if shows {
                served.push(*what);
            }
        }
        assert_eq!(
            served,
            [
                "served",
                "served, with another condition first",
                "Metal3, served"
            ]
        );
    }
}
