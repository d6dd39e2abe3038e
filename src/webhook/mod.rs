//! The admission and conversion webhooks `bitpool run` serves over HTTPS.
//!
//! - [`server`]: the routes on the shared HTTPS listener ([`crate::net`]) (`/validate`, `/mutate`, `/convert`);
//! - [`rules`]: what is allowed, as plain functions;
//! - [`admission`]: AdmissionReviews: which rules apply to which object, and the cluster state
//!   (allocated addresses, the pool a claim names) they need;
//! - [`convert`]: the routing of every ConversionReview, to the v1alpha1 ↔ v1alpha2 pool
//!   conversion and the v1beta1 ↔ v1beta2 conversion of the Metal3Data kinds;
//! - [`endpoint`]: a Metal3Cluster's endpoint filled from its pool, a Cluster's pool checked;
//! - [`writers`]: who may create the address objects of a pool bitpool allocates from.

pub mod admission;
pub mod convert;
pub mod endpoint;
pub mod rules;
pub mod server;
pub mod writers;

pub use server::{CONVERT_PATH, MUTATE_PATH, ServeError, VALIDATE_PATH, serve};

/// Which kind of admission webhook a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Validate,
    Mutate,
}

/// What the webhooks need: a client for the state some rules read, and the opt-in checks.
#[derive(Clone)]
pub struct Webhooks {
    pub client: kube::Client,
    /// Refuse a pool whose addresses overlap another pool's (upstream allows it: NAT and
    /// separate sites can reuse ranges).
    pub refuse_overlap: bool,
    /// Where the pools' ledgers are (`--ledger-namespace`): a pool's allocated addresses are
    /// read from its ledger.
    pub ledger_namespace: String,
    /// Who may write address objects, as the API server last said.
    pub writers: std::sync::Arc<writers::Writers>,
}

/// `response` allowing the object with the JSON patch `operations` applied, or refusing it
/// saying the patch could not be made (`what`: what the patch writes) — never the object
/// admitted without what the webhook exists to write.
fn patched(
    response: kube::core::admission::AdmissionResponse,
    operations: serde_json::Value,
    what: &str,
) -> kube::core::admission::AdmissionResponse {
    let patch = serde_json::from_value::<json_patch::Patch>(operations)
        .map_err(|e| e.to_string())
        .and_then(|p| response.clone().with_patch(p).map_err(|e| e.to_string()));
    match patch {
        Ok(patched) => patched,
        Err(e) => response.deny(format!("cannot write {what}: {e}")),
    }
}

impl Webhooks {
    /// Answers a ConversionReview.
    pub fn convert(&self, body: &[u8]) -> Result<Vec<u8>, String> {
        convert::review(body)
    }
}
