//! Conversion webhooks: the routing of every ConversionReview to the conversion of its group,
//! each a leaf of its own:
//!
//! - [`pools`]: InClusterIPPool and GlobalInClusterIPPool, v1alpha1 ↔ v1alpha2;
//! - [`metal3data`]: the Metal3Data kinds, v1beta1 ↔ v1beta2;
//! - [`shared`]: the error and annotation helpers both use.

pub mod metal3data;
pub mod pools;
pub mod shared;

use kube::core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};
use serde_json::Value;

pub use shared::ConversionError;
use shared::field;

/// Answers a ConversionReview (the request body) with the converted objects or the failure.
pub fn review(body: &[u8]) -> Result<Vec<u8>, String> {
    let review: ConversionReview =
        serde_json::from_slice(body).map_err(|e| format!("not a ConversionReview: {e}"))?;
    let mut request = ConversionRequest::from_review(review).map_err(|e| e.to_string())?;
    let desired = request.desired_api_version.clone();
    // The API server calls this for every pool event of its v1alpha1 watch cache: no copies.
    let converted: Result<Vec<Value>, ConversionError> = std::mem::take(&mut request.objects)
        .into_iter()
        .map(|object| convert(object, &desired))
        .collect();
    let response = ConversionResponse::for_request(request);
    let response = match converted {
        Ok(objects) => response.success(objects),
        Err(e) => {
            tracing::warn!(error = %e, "conversion refused");
            response.failure(kube::core::Status::failure(&e.to_string(), "Invalid"))
        }
    };
    serde_json::to_vec(&response.into_review()).map_err(|e| e.to_string())
}

/// One object to `desired` (an apiVersion).
pub fn convert(object: Value, desired: &str) -> Result<Value, ConversionError> {
    let from = field(&object, "/apiVersion").to_string();
    if from == desired {
        return Ok(object);
    }
    if from.starts_with(&format!("{}/", crate::api::metal3_data::GROUP)) {
        return metal3data::convert(object, desired);
    }
    pools::convert(object, desired)
}
