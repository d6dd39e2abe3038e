//! AdmissionReviews: the object's kind picks the rules ([`super::rules`]); this module reads the
//! cluster state they need. Reads are live (not cached): an admission decision must not act on
//! a stale view of what is allocated.
//!
//! - [`pools`]: the requests on pools: their spec, their update, their deletion;
//! - [`claims`]: the requests on claims, address objects and Metal3DataTemplates;
//! - [`state`]: the cluster state those rules read (a pool's allocated addresses, the other
//!   pools' layouts, the pool a claim names).

mod claims;
mod pools;
mod state;

use kube::ResourceExt;
use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::convert::pools as conversion;
use super::rules;
use super::{Phase, Webhooks};
use crate::api::capi;
use crate::api::metal3_ipam;
use crate::ipam::key::PoolKind;

use claims::{data_template, metal3_address};
pub(super) use state::get;

/// Why a request could not be judged (the API server applies the webhook's failure policy).
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    #[error("the object is not a valid {kind}: {reason}")]
    Decode { kind: String, reason: String },
    #[error("cannot read {what}: {source}")]
    Read { what: String, source: kube::Error },
    #[error("cannot read {ledger}: {reason}")]
    Ledger { ledger: String, reason: String },
}

type Verdict = Result<Vec<String>, AdmissionError>;

impl Webhooks {
    /// Answers an AdmissionReview (the request body).
    pub async fn admit(&self, body: &[u8], phase: Phase) -> Result<Vec<u8>, String> {
        let review: AdmissionReview<DynamicObject> =
            serde_json::from_slice(body).map_err(|e| format!("not an AdmissionReview: {e}"))?;
        let request: AdmissionRequest<DynamicObject> = review
            .try_into()
            .map_err(|e: kube::core::admission::ConvertAdmissionReviewError| e.to_string())?;
        let response = AdmissionResponse::from(&request);
        let response = match phase {
            Phase::Mutate if request.kind.kind == "Metal3Cluster" => {
                self.metal3_cluster(&request, response).await
            }
            Phase::Mutate => mutate(&request, response),
            Phase::Validate => match self.validate(&request).await {
                Ok(problems) if problems.is_empty() => warn(&request, response),
                Ok(problems) => {
                    let message = problems.join("; ");
                    tracing::info!(kind = %request.kind.kind, object = %describe(&request), operation = ?request.operation, reason = %message, "admission denied");
                    response.deny(message)
                }
                Err(e) => {
                    tracing::warn!(kind = %request.kind.kind, object = %describe(&request), error = %e, "cannot judge an admission request");
                    response.deny(e.to_string())
                }
            },
        };
        serde_json::to_vec(&response.into_review()).map_err(|e| e.to_string())
    }

    async fn validate(&self, request: &AdmissionRequest<DynamicObject>) -> Verdict {
        let kind = &request.kind;
        if let Some(pool) = pool_kind(request) {
            return self.pool(request, pool).await;
        }
        match (kind.group.as_str(), kind.kind.as_str()) {
            (metal3_ipam::GROUP, "IPClaim") => self.ipclaim(request).await,
            (metal3_ipam::GROUP, "IPAddress") => {
                let mut problems = metal3_address(request)?;
                problems.extend(self.address_writer(request).await?);
                Ok(problems)
            }
            (capi::GROUP, "IPAddress") => self.address_writer(request).await,
            (capi::GROUP, "IPAddressClaim") => self.capi_claim(request).await,
            ("infrastructure.cluster.x-k8s.io", "Metal3DataTemplate") => data_template(request),
            ("cluster.x-k8s.io", "Cluster") => self.cluster(request).await,
            _ => Ok(Vec::new()),
        }
    }
}

/// The pool kind of the request's object, `None` when it is not a pool.
fn pool_kind(request: &AdmissionRequest<DynamicObject>) -> Option<PoolKind> {
    PoolKind::of(&request.kind.group, &request.kind.kind)
}

/// Adds the warnings a valid object earns (kubectl prints them on apply).
fn warn(
    request: &AdmissionRequest<DynamicObject>,
    mut response: AdmissionResponse,
) -> AdmissionResponse {
    if request.operation == Operation::Delete {
        return response;
    }
    let object = request.object.as_ref();
    /// Bare preallocation keys, a cluster-scoped pool's concern only.
    fn bare(
        pool: PoolKind,
        meta: &kube::api::ObjectMeta,
        keys: &std::collections::BTreeMap<String, String>,
    ) -> Vec<String> {
        if !pool.is_global() {
            return Vec::new();
        }
        let namespace = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::api::capi_pools::PREALLOCATION_NAMESPACE_ANNOTATION));
        rules::bare_preallocation_warnings(keys, namespace.map(String::as_str))
    }
    let warnings = match pool_kind(request) {
        Some(pool) if pool.is_metal3() => None,
        Some(pool) if pool.is_prefix() => pools::prefix_pool_of(pool, object)
            .ok()
            .flatten()
            .map(|(meta, spec)| bare(pool, &meta, &spec.pre_allocations)),
        Some(pool) => pools::ip_pool_of(pool, object)
            .ok()
            .flatten()
            .map(|(meta, spec)| {
                let mut warnings = rules::capi_pool_warnings(&spec);
                warnings.extend(bare(pool, &meta, &spec.pre_allocations));
                warnings
            }),
        None => None,
    }
    .unwrap_or_default();
    if !warnings.is_empty() {
        response.warnings = Some(warnings);
    }
    response
}

fn describe(request: &AdmissionRequest<DynamicObject>) -> String {
    match &request.namespace {
        Some(ns) => format!("{ns}/{}", request.name),
        None => request.name.clone(),
    }
}

/// The request's object (or old object) as `K`, at the version bitpool works with.
fn decode<K: DeserializeOwned>(
    kind: &str,
    object: Option<&DynamicObject>,
) -> Result<Option<K>, AdmissionError> {
    let Some(object) = object else {
        return Ok(None);
    };
    let decode_error = |reason: String| AdmissionError::Decode {
        kind: kind.to_string(),
        reason,
    };
    let mut value = serde_json::to_value(object).map_err(|e| decode_error(e.to_string()))?;
    if value["apiVersion"] == conversion::V1ALPHA1 && conversion::KINDS.contains(&kind) {
        value = conversion::convert(value, conversion::V1ALPHA2)
            .map_err(|e| decode_error(e.to_string()))?;
    }
    serde_json::from_value(value)
        .map(Some)
        .map_err(|e| decode_error(e.to_string()))
}

/// An update that leaves the spec as it was (finalizers, labels, annotations): never refused, so
/// that an object stored before these rules, or whose pool changed since, can still be released
/// and deleted.
fn spec_unchanged(request: &AdmissionRequest<DynamicObject>) -> bool {
    match (&request.operation, &request.object, &request.old_object) {
        (Operation::Update, Some(new), Some(old)) => new.data.get("spec") == old.data.get("spec"),
        _ => false,
    }
}

/// Whether the object carries `annotation` (any value, as upstream reads its skip annotation).
fn annotated(object: Option<&DynamicObject>, annotation: &str) -> bool {
    object.is_some_and(|o| o.annotations().contains_key(annotation))
}

/// Whether the object carries `annotation: "true"`.
fn annotated_true(object: Option<&DynamicObject>, annotation: &str) -> bool {
    object.is_some_and(|o| o.annotations().get(annotation).is_some_and(|v| v == "true"))
}

/// The Metal3 IPPool defaulting upstream does: `allocationStrategy: sequential`.
fn mutate(
    request: &AdmissionRequest<DynamicObject>,
    response: AdmissionResponse,
) -> AdmissionResponse {
    let is_ippool = pool_kind(request).is_some_and(PoolKind::is_metal3);
    let unset = request.object.as_ref().is_some_and(|o| {
        o.data
            .pointer("/spec/allocationStrategy")
            .is_none_or(Value::is_null)
    });
    if !(is_ippool && unset) {
        return response;
    }
    let default = serde_json::json!([
        {"op": "add", "path": "/spec/allocationStrategy", "value": "sequential"}
    ]);
    super::patched(response, default, "the default allocationStrategy")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::capi_pools::InClusterIPPool;

    fn request(
        object: serde_json::Value,
        kind: (&str, &str, &str),
    ) -> AdmissionRequest<DynamicObject> {
        let review = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u", "kind": {"group": kind.0, "version": kind.1, "kind": kind.2},
                "resource": {"group": kind.0, "version": kind.1, "resource": "x"},
                "name": "p", "namespace": "ns", "operation": "CREATE",
                "userInfo": {}, "object": object
            }
        });
        let review: AdmissionReview<DynamicObject> =
            serde_json::from_value(review).expect("review");
        review.try_into().expect("request")
    }

    fn patch_of(response: &AdmissionResponse) -> Option<serde_json::Value> {
        response
            .patch
            .as_ref()
            .map(|p| serde_json::from_slice(p).expect("json patch"))
    }

    #[test]
    fn metal3_pools_get_the_sequential_strategy_when_none_is_set() {
        let pool = |spec: serde_json::Value| serde_json::json!({"apiVersion": "ipam.metal3.io/v1alpha1", "kind": "IPPool", "metadata": {"name": "p"}, "spec": spec});
        let unset = request(
            pool(serde_json::json!({"namePrefix": "p"})),
            (metal3_ipam::GROUP, "v1alpha1", "IPPool"),
        );
        let patched = mutate(&unset, AdmissionResponse::from(&unset));
        assert_eq!(
            patch_of(&patched),
            Some(
                serde_json::json!([{"op": "add", "path": "/spec/allocationStrategy", "value": "sequential"}])
            )
        );
        let set = request(
            pool(serde_json::json!({"namePrefix": "p", "allocationStrategy": "random"})),
            (metal3_ipam::GROUP, "v1alpha1", "IPPool"),
        );
        assert_eq!(patch_of(&mutate(&set, AdmissionResponse::from(&set))), None);
        let other = request(
            pool(serde_json::json!({})),
            (capi::GROUP, "v1alpha2", "InClusterIPPool"),
        );
        assert_eq!(
            patch_of(&mutate(&other, AdmissionResponse::from(&other))),
            None
        );
    }

    #[test]
    fn a_v1alpha1_pool_is_judged_after_conversion() {
        let object = serde_json::json!({"apiVersion": conversion::V1ALPHA1, "kind": "InClusterIPPool", "metadata": {"name": "p"}, "spec": {"subnet": "10.0.0.0/30"}});
        let request = request(object, (capi::GROUP, "v1alpha1", "InClusterIPPool"));
        let pool = decode::<InClusterIPPool>("InClusterIPPool", request.object.as_ref())
            .expect("decodes")
            .expect("present");
        assert_eq!(pool.spec.addresses, vec!["10.0.0.1-10.0.0.2".to_string()]);
        assert_eq!(pool.spec.prefix, 30);
    }
}
