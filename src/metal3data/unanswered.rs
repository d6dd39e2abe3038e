//! IP claims that no IPAM provider answers: a template's pool reference that names a kind (or
//! API group) nothing serves leaves its claim untouched for good. After [`UNANSWERED_AFTER`]
//! the Metal3Data says so in `status.errorMessage`, instead of waiting silently; the message
//! goes as soon as a provider answers.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::api::metal3_data::DATA_FINALIZER;
use crate::runtime::cached::{ClaimObject, IpamApi};
use crate::runtime::objects;

/// How long a claim may go without any sign of a provider before its Metal3Data reports it. A
/// provider that runs answers within seconds (a finalizer, a condition or an address); a minute
/// leaves room for one that is starting up or catching up on a burst.
pub const UNANSWERED_AFTER: Duration = Duration::from_secs(60);

/// Whether any provider has touched `claim`: an address, an error or condition in its status,
/// or a finalizer other than the Metal3Data's own (every provider adds its own before it
/// serves, bitpool, the in-cluster provider and Metal3 IPAM alike).
fn answered(claim: &ClaimObject) -> bool {
    claim.address.is_some()
        || !claim.conditions.is_empty()
        || claim.error_message().is_some()
        || claim
            .meta
            .finalizers()
            .iter()
            .any(|f| &**f != DATA_FINALIZER)
}

/// Why `claim` (for the template's pool `pool`) has no address, when no provider has answered
/// it for [`UNANSWERED_AFTER`] at `now`: the error its Metal3Data reports.
pub fn unanswered(claim: &ClaimObject, pool: &str, now: Timestamp) -> Option<String> {
    let created = claim.meta.created()?;
    if answered(claim) || objects::elapsed(created, now) < UNANSWERED_AFTER {
        return None;
    }
    let reference = claim.pool();
    let (kind, serves) = match claim.api {
        IpamApi::Capi => (
            "IPAddressClaim",
            format!("{} of API group {}", reference.kind, reference.api_group),
        ),
        IpamApi::Metal3 => ("IPClaim", "IPPool of API group ipam.metal3.io".to_string()),
    };
    Some(format!(
        "IP Allocation for {pool} failed : no IPAM provider has answered {kind} {} in {} s (no address, condition or finalizer): check that a provider serving {serves} runs, and that the template's pool reference names the pool's kind and apiGroup",
        claim.meta.name,
        UNANSWERED_AFTER.as_secs()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::capi::{IPAddressClaim, IPAddressClaimSpec, IPPoolReference};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use kube::api::ObjectMeta;

    const CREATED: &str = "2026-12-06T10:00:00Z";

    fn claim(finalizers: &[&str], conditions: Vec<Condition>) -> ClaimObject {
        let claim = IPAddressClaim {
            metadata: ObjectMeta {
                name: Some("m3d-0-workers".into()),
                namespace: Some("metal3".into()),
                uid: Some("u".into()),
                creation_timestamp: Some(Time(CREATED.parse().expect("a time"))),
                finalizers: Some(finalizers.iter().map(|f| f.to_string()).collect()),
                ..Default::default()
            },
            spec: IPAddressClaimSpec {
                cluster_name: None,
                pool_ref: IPPoolReference {
                    name: "workers".into(),
                    kind: "NoSuchPool".into(),
                    api_group: "ipam.example.com".into(),
                },
            },
            status: Some(crate::api::capi::IPAddressClaimStatus {
                conditions,
                ..Default::default()
            }),
        };
        ClaimObject::of_capi(&claim).expect("a claim with a name and namespace")
    }

    fn at(seconds: i64) -> Timestamp {
        let created: Timestamp = CREATED.parse().expect("a time");
        created + k8s_openapi::jiff::SignedDuration::from_secs(seconds)
    }

    #[test]
    fn a_claim_no_provider_touches_is_reported_after_the_wait_and_not_before() {
        let untouched = claim(&[DATA_FINALIZER], Vec::new());
        assert_eq!(unanswered(&untouched, "workers", at(59)), None);
        let message = unanswered(&untouched, "workers", at(60)).expect("reported");
        assert!(
            message.starts_with("IP Allocation for workers failed : no IPAM provider")
                && message.contains("IPAddressClaim m3d-0-workers")
                && message.contains("NoSuchPool of API group ipam.example.com"),
            "{message}"
        );
    }

    #[test]
    fn any_sign_of_a_provider_is_an_answer() {
        let finalized = claim(
            &[DATA_FINALIZER, "ipam.cluster.x-k8s.io/ReleaseAddress"],
            Vec::new(),
        );
        assert_eq!(unanswered(&finalized, "workers", at(3600)), None);
        let waiting = Condition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: "PoolNotReady".into(),
            message: "paused".into(),
            last_transition_time: Time(at(1)),
            observed_generation: None,
        };
        let conditioned = claim(&[DATA_FINALIZER], vec![waiting]);
        assert_eq!(unanswered(&conditioned, "workers", at(3600)), None);
    }
}
