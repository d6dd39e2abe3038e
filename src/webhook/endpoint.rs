//! Control-plane endpoints from pools ([`crate::endpoint`]) at admission:
//!
//! - a Metal3Cluster created without `spec.controlPlaneEndpoint.host`, whose annotation (or its
//!   Cluster's) names an endpoint pool, gets the address of its Cluster's endpoint claim there,
//!   before CAPM3's own webhook (which refuses an empty host) sees it: the claim is made here
//!   when missing, owned by the Cluster, and its address waited for at most [`ADDRESS_WAIT`];
//! - a Cluster whose annotation is set or changed is refused when the annotation names no
//!   address pool, a pool that does not exist, or one with no free address.

use std::time::Duration;

use kube::api::{Api, DynamicObject, PostParams};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use super::Webhooks;
use super::admission::{AdmissionError, get};
use crate::api::FIELD_MANAGER;
use crate::api::capi::{
    Cluster, ENDPOINT_POOL_ANNOTATION as POOL_ANNOTATION, IPAddress, IPAddressClaim,
    READY_CONDITION,
};
use crate::api::labels::WATCH_FILTER as WATCH_FILTER_LABEL;
use crate::endpoint::reference::{self, ClaimFor, DEFAULT_PORT, EndpointPool, FIELD};

/// How long the mutating webhook waits for the endpoint claim's address. The shipped webhook
/// configuration gives the call [`WEBHOOK_TIMEOUT_SECONDS`], so the answer, whichever it is,
/// reaches the API server in time (a test holds the two together).
pub const ADDRESS_WAIT: Duration = Duration::from_secs(8);
/// `timeoutSeconds` of the endpoint webhooks in `config/webhook/endpoint/manifests.yaml`.
pub const WEBHOOK_TIMEOUT_SECONDS: u64 = 15;

/// What the Metal3Cluster webhook decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Not bitpool's to fill.
    Allow,
    /// Refused, with why.
    Deny(String),
    /// The endpoint's host is this address.
    Fill(String),
}

/// The endpoint of a Metal3Cluster as created: whether its host is empty, and its port.
fn endpoint_of(object: &Value) -> (bool, Option<i64>) {
    let endpoint = object.pointer("/spec/controlPlaneEndpoint");
    let host = endpoint.and_then(|e| e.get("host")).and_then(Value::as_str);
    let port = endpoint.and_then(|e| e.get("port")).and_then(Value::as_i64);
    (host.is_none_or(str::is_empty), port.filter(|p| *p != 0))
}

/// The JSON patch that writes `address` as the endpoint's host, with its port or the default.
pub fn fill_patch(object: &Value, address: &str) -> Value {
    let (_, port) = endpoint_of(object);
    let port = port.unwrap_or(i64::from(DEFAULT_PORT));
    let mut patch = Vec::new();
    if object.get("spec").is_none_or(Value::is_null) {
        patch.push(json!({"op": "add", "path": "/spec", "value": {}}));
    }
    patch.push(json!({
        "op": "add",
        "path": "/spec/controlPlaneEndpoint",
        "value": {"host": address, "port": port},
    }));
    Value::Array(patch)
}

/// The Cluster whose `infrastructureRef` names Metal3Cluster `name`.
fn cluster_of<'a>(clusters: &'a [Cluster], name: &str) -> Option<&'a Cluster> {
    clusters.iter().find(|c| {
        c.spec
            .infrastructure_ref
            .as_ref()
            .is_some_and(|r| r.kind == "Metal3Cluster" && r.name == name)
    })
}

impl Webhooks {
    /// The mutating webhook's answer for a Metal3Cluster.
    pub(super) async fn metal3_cluster(
        &self,
        request: &AdmissionRequest<DynamicObject>,
        response: AdmissionResponse,
    ) -> AdmissionResponse {
        let decision = match self.metal3_cluster_decision(request).await {
            Ok(decision) => decision,
            Err(e) => Decision::Deny(e.to_string()),
        };
        match decision {
            Decision::Allow => response,
            Decision::Deny(message) => {
                tracing::info!(name = %request.name, namespace = ?request.namespace, reason = %message, "Metal3Cluster denied");
                response.deny(message)
            }
            Decision::Fill(address) => {
                let object = request.object.as_ref().map(|o| &o.data);
                let patch = fill_patch(object.unwrap_or(&Value::Null), &address);
                super::patched(response, patch, "the endpoint")
            }
        }
    }

    async fn metal3_cluster_decision(
        &self,
        request: &AdmissionRequest<DynamicObject>,
    ) -> Result<Decision, AdmissionError> {
        let (Operation::Create, Some(object), Some(namespace)) = (
            &request.operation,
            request.object.as_ref(),
            request.namespace.as_deref(),
        ) else {
            return Ok(Decision::Allow);
        };
        let (host_empty, _) = endpoint_of(&object.data);
        if !host_empty {
            return Ok(Decision::Allow);
        }
        let clusters: Api<Cluster> = Api::namespaced(self.client.clone(), namespace);
        let listed = clusters
            .list(&Default::default())
            .await
            .map_err(|e| read_error(format!("the Clusters of namespace {namespace}"), e))?;
        let cluster = cluster_of(&listed.items, &request.name);
        // The Metal3Cluster's own annotation, else its Cluster's.
        let named = EndpointPool::of(object.meta())
            .map(|p| (p, format!("Metal3Cluster {}", request.name)))
            .or_else(|| {
                let cluster = cluster?;
                Some((
                    EndpointPool::of(cluster.meta())?,
                    format!("Cluster {}", cluster.name_any()),
                ))
            });
        let Some((pool, whose)) = named else {
            return Ok(Decision::Allow);
        };
        let pool = match pool {
            Ok(pool) => pool,
            Err(e) => return Ok(Decision::Deny(format!("{whose} {FIELD}: {e}"))),
        };
        let Some(cluster) = cluster else {
            return Ok(Decision::Deny(format!(
                "{FIELD}: no Cluster in namespace {namespace} has Metal3Cluster {} as its infrastructureRef yet: create the Cluster first (its endpoint's address is claimed for it, and released with it)",
                request.name
            )));
        };
        let existing = self.endpoint_claim(namespace, &cluster.name_any()).await?;
        // An exhausted pool is no problem for a Cluster whose claim was made (it may hold the
        // address that exhausted it).
        match self.pool_problem(namespace, &pool).await? {
            Some(PoolProblem::Exhausted(_)) if existing.is_some() => {}
            Some(problem) => return Ok(Decision::Deny(format!("{whose} {FIELD}: {problem}"))),
            None => {}
        }
        let watch_filter = object.labels().get(WATCH_FILTER_LABEL).map(String::as_str);
        let dry_run = request.dry_run;
        self.address_for(cluster, existing, &pool, watch_filter, dry_run)
            .await
            .map(|answer| match answer {
                Ok(Some(address)) => Decision::Fill(address),
                Ok(None) => Decision::Allow,
                Err(why) => Decision::Deny(format!("{whose} {FIELD}: {why}")),
            })
    }

    /// The endpoint claim of Cluster `cluster` of `namespace`, if it was made (by anyone: its
    /// owner is checked on use).
    async fn endpoint_claim(
        &self,
        namespace: &str,
        cluster: &str,
    ) -> Result<Option<IPAddressClaim>, AdmissionError> {
        let claim_name = reference::claim_name(cluster);
        let claims: Api<IPAddressClaim> = Api::namespaced(self.client.clone(), namespace);
        let what = format!("IPAddressClaim {namespace}/{claim_name}");
        get(&claims, &claim_name, &what).await
    }

    /// The address of `cluster`'s endpoint claim (`existing`, or made here if missing — not on
    /// a dry run: `Ok(None)`), waited for at most [`ADDRESS_WAIT`]; `Err` says why there is none.
    async fn address_for(
        &self,
        cluster: &Cluster,
        existing: Option<IPAddressClaim>,
        pool: &EndpointPool,
        watch_filter: Option<&str>,
        dry_run: bool,
    ) -> Result<Result<Option<String>, String>, AdmissionError> {
        let namespace = cluster.namespace().unwrap_or_default();
        let name = cluster.name_any();
        let claim_name = reference::claim_name(&name);
        let claims: Api<IPAddressClaim> = Api::namespaced(self.client.clone(), &namespace);
        let uid = cluster.meta().uid.clone().unwrap_or_default();
        match existing {
            Some(claim) if !claim.owner_references().iter().any(|o| o.uid == uid) => {
                return Ok(Err(format!(
                    "IPAddressClaim {claim_name} exists and is not Cluster {name}'s: rename or remove it"
                )));
            }
            Some(_) => {}
            None if dry_run => return Ok(Ok(None)),
            None => {
                let claim = reference::claim(ClaimFor {
                    namespace: &namespace,
                    cluster: &name,
                    owner: reference::owner(&Cluster::api_version(&()), &name, &uid),
                    pool,
                    watch_filter,
                    requested: None,
                });
                let params = PostParams {
                    field_manager: Some(FIELD_MANAGER.to_string()),
                    ..Default::default()
                };
                match claims.create(&params, &claim).await {
                    Err(kube::Error::Api(s)) if s.is_already_exists() => {}
                    Err(e) => {
                        return Err(read_error(format!("create IPAddressClaim {claim_name}"), e));
                    }
                    Ok(_) => {}
                }
            }
        }
        self.wait_for_address(&claims, &claim_name).await
    }

    async fn wait_for_address(
        &self,
        claims: &Api<IPAddressClaim>,
        claim_name: &str,
    ) -> Result<Result<Option<String>, String>, AdmissionError> {
        let answered = |claim: Option<&IPAddressClaim>| {
            claim.and_then(|c| c.status.as_ref()).is_some_and(|s| {
                s.address_ref.is_some()
                    || s.conditions
                        .iter()
                        .any(|c| c.type_ == READY_CONDITION && c.status == "False")
            })
        };
        let waited = kube::runtime::wait::await_condition(claims.clone(), claim_name, answered);
        let claim = match tokio::time::timeout(ADDRESS_WAIT, waited).await {
            Ok(Ok(Some(claim))) => claim,
            Ok(Ok(None)) => return Ok(Err(format!("IPAddressClaim {claim_name} was deleted"))),
            Ok(Err(e)) => {
                return Ok(Err(format!(
                    "cannot watch IPAddressClaim {claim_name}: {e}; try again"
                )));
            }
            Err(_) => {
                return Ok(Err(format!(
                    "IPAddressClaim {claim_name} got no address within {} s (is bitpool's controller running?); try again",
                    ADDRESS_WAIT.as_secs()
                )));
            }
        };
        let status = claim.status.unwrap_or_default();
        let Some(address_ref) = status.address_ref else {
            let refusal = status
                .conditions
                .iter()
                .find(|c| c.type_ == READY_CONDITION)
                .map(|c| format!("{}: {}", c.reason, c.message))
                .unwrap_or_default();
            return Ok(Err(format!(
                "no address for the endpoint: IPAddressClaim {claim_name}: {refusal} (the claim stays, owned by the Cluster, and is served once the pool can)"
            )));
        };
        let addresses: Api<IPAddress> =
            Api::namespaced(self.client.clone(), claims.namespace().unwrap_or_default());
        let address = addresses
            .get(&address_ref.name)
            .await
            .map_err(|e| read_error(format!("IPAddress {}", address_ref.name), e))?;
        Ok(Ok(Some(address.spec.address)))
    }

    /// Why the endpoint pool cannot give an address: it does not exist, or it has no free
    /// address (by its status); `None` when it may.
    async fn pool_problem(
        &self,
        namespace: &str,
        pool: &EndpointPool,
    ) -> Result<Option<PoolProblem>, AdmissionError> {
        Ok(
            match self
                .address_pool(&pool.key(namespace))
                .await?
                .map(|p| p.free())
            {
                None if pool.kind.is_global() => Some(PoolProblem::Missing(format!(
                    "{} {} does not exist",
                    pool.kind, pool.name
                ))),
                None => Some(PoolProblem::Missing(format!(
                    "{} {} does not exist in namespace {namespace}",
                    pool.kind, pool.name
                ))),
                Some(Some(0)) => Some(PoolProblem::Exhausted(format!(
                    "{} {} has no free address (by its status)",
                    pool.kind, pool.name
                ))),
                Some(_) => None,
            },
        )
    }

    /// The validating webhook's problems with a Cluster: only when its annotation is set or
    /// changed (Cluster API's own updates of a Cluster are never held up by a pool), and not
    /// while the Cluster is paused.
    pub(super) async fn cluster(
        &self,
        request: &AdmissionRequest<DynamicObject>,
    ) -> Result<Vec<String>, AdmissionError> {
        let annotation = |o: Option<&DynamicObject>| {
            o.and_then(|o| o.annotations().get(POOL_ANNOTATION).cloned())
        };
        let new = annotation(request.object.as_ref());
        let (Some(value), Some(namespace)) = (new.as_deref(), request.namespace.as_deref()) else {
            return Ok(Vec::new());
        };
        if request.operation != Operation::Create && annotation(request.old_object.as_ref()) == new
        {
            return Ok(Vec::new());
        }
        // `clusterctl move` creates Clusters paused, before the pools it moves after them.
        let paused = request
            .object
            .as_ref()
            .and_then(|o| o.data.pointer("/spec/paused"));
        if paused == Some(&Value::Bool(true)) {
            return Ok(Vec::new());
        }
        let pool = match EndpointPool::parse(value) {
            Ok(pool) => pool,
            Err(e) => return Ok(vec![format!("{FIELD}: {e}")]),
        };
        // A pool with no free address is no problem for a Cluster whose claim was made.
        let made = self
            .endpoint_claim(namespace, &request.name)
            .await?
            .is_some();
        match self.pool_problem(namespace, &pool).await? {
            Some(PoolProblem::Exhausted(_)) if made => Ok(Vec::new()),
            Some(problem) => Ok(vec![format!("{FIELD}: {problem}")]),
            None => Ok(Vec::new()),
        }
    }
}

/// Why a pool cannot give an endpoint its address.
#[derive(Debug)]
enum PoolProblem {
    Missing(String),
    Exhausted(String),
}

impl std::fmt::Display for PoolProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolProblem::Missing(m) | PoolProblem::Exhausted(m) => f.write_str(m),
        }
    }
}

fn read_error(what: String, source: kube::Error) -> AdmissionError {
    AdmissionError::Read { what, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_is_filled_and_the_port_kept_or_defaulted() {
        let cases = [
            (
                json!({"spec": {"noCloudProvider": true}}),
                json!([{"op": "add", "path": "/spec/controlPlaneEndpoint", "value": {"host": "10.0.0.5", "port": 6443}}]),
            ),
            (
                json!({"spec": {"controlPlaneEndpoint": {"host": "", "port": 8443}}}),
                json!([{"op": "add", "path": "/spec/controlPlaneEndpoint", "value": {"host": "10.0.0.5", "port": 8443}}]),
            ),
            (
                json!({"spec": {"controlPlaneEndpoint": {"port": 0}}}),
                json!([{"op": "add", "path": "/spec/controlPlaneEndpoint", "value": {"host": "10.0.0.5", "port": 6443}}]),
            ),
            (
                json!({}),
                json!([
                    {"op": "add", "path": "/spec", "value": {}},
                    {"op": "add", "path": "/spec/controlPlaneEndpoint", "value": {"host": "10.0.0.5", "port": 6443}},
                ]),
            ),
        ];
        for (object, expected) in cases {
            assert_eq!(fill_patch(&object, "10.0.0.5"), expected, "{object}");
        }
        assert!(endpoint_of(&json!({"spec": {}})).0);
        assert!(!endpoint_of(&json!({"spec": {"controlPlaneEndpoint": {"host": "h"}}})).0);
    }

    #[test]
    fn the_wait_fits_inside_the_shipped_webhook_timeout() {
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("config/webhook/endpoint/manifests.yaml"),
        )
        .expect("the endpoint webhook manifests");
        let documents: Vec<Value> = serde_saphyr::from_multiple(&text).expect("YAML");
        let timeouts: Vec<u64> = documents
            .iter()
            .flat_map(|d| d["webhooks"].as_array().cloned().unwrap_or_default())
            .map(|w| w["timeoutSeconds"].as_u64().unwrap_or(10))
            .collect();
        assert_eq!(timeouts.len(), 2, "a mutating and a validating webhook");
        for timeout in timeouts {
            assert_eq!(timeout, WEBHOOK_TIMEOUT_SECONDS);
            // Room for the reads and writes around the wait, and the answer's way back.
            assert!(Duration::from_secs(timeout) >= ADDRESS_WAIT + Duration::from_secs(5));
        }
    }

    #[test]
    fn a_metal3_cluster_is_found_through_its_clusters_infrastructure_ref() {
        let cluster = |name: &str, kind: &str, infra: &str| {
            let mut c = Cluster::new(name, Default::default());
            c.spec.infrastructure_ref = Some(crate::api::capi::InfrastructureReference {
                kind: kind.into(),
                name: infra.into(),
            });
            c
        };
        let clusters = [
            cluster("a", "DockerCluster", "m3"),
            cluster("b", "Metal3Cluster", "other"),
            cluster("c", "Metal3Cluster", "m3"),
        ];
        assert_eq!(
            cluster_of(&clusters, "m3").map(|c| c.name_any()),
            Some("c".to_string())
        );
        assert!(cluster_of(&clusters, "none").is_none());
    }
}
