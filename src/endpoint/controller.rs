//! The Cluster controller of endpoints: read the Cluster and its endpoint claim from the caches,
//! plan ([`super::plan`]), then claim, fill or report.

use std::sync::Arc;

use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::plan::{ClaimState, Endpoint, Step, plan};
use super::reference::{self, ClaimFor, DEFAULT_PORT, EndpointPool, FIELD};
use crate::api::FIELD_MANAGER;
use crate::api::capi::{Cluster, IPAddressClaim};
use crate::api::labels::WATCH_FILTER;
use crate::ops::events::Reason;
use crate::runtime::cached::Uid;
use crate::runtime::error::{Call, Verb};
use crate::runtime::objects;
use crate::runtime::{Context, Error};

/// Reconciles one Cluster: nothing unless it names an endpoint pool.
pub async fn reconcile(cluster: Arc<Cluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let Some(pool) = EndpointPool::of(cluster.meta()) else {
        return Ok(Action::await_change());
    };
    // A paused Cluster's objects wait, as every Cluster API controller's do (a move pauses it).
    if objects::cluster_is_paused(&cluster) {
        return Ok(Action::await_change());
    }
    // Clusters are cached unfiltered (for pause); a `--watch-filter` process serves its own.
    let filter = ctx.settings.watch_filter.as_deref();
    if filter.is_some_and(|f| cluster.labels().get(WATCH_FILTER).map(String::as_str) != Some(f)) {
        return Ok(Action::await_change());
    }
    let namespace = cluster
        .namespace()
        .ok_or_else(|| Error::MissingNamespace(cluster.name_any()))?;
    let pool = match pool {
        Ok(pool) => pool,
        Err(e) => {
            let note = format!("{FIELD}: {e}");
            report(&ctx, &cluster, Reason::InvalidEndpointPool, note);
            return Ok(Action::await_change());
        }
    };
    let claim = read(&ctx, &cluster, &namespace);
    let deleting = cluster.meta().deletion_timestamp.is_some();
    let step = plan(deleting, &endpoint_of(&cluster), &claim, DEFAULT_PORT);
    apply(&ctx, &cluster, &namespace, &pool, step).await?;
    Ok(Action::await_change())
}

fn endpoint_of(cluster: &Cluster) -> Endpoint {
    let endpoint = cluster
        .spec
        .control_plane_endpoint
        .clone()
        .unwrap_or_default();
    Endpoint {
        host: endpoint.host,
        port: endpoint.port,
    }
}

/// The Cluster's endpoint claim, as the caches hold it.
fn read(ctx: &Context, cluster: &Cluster, namespace: &str) -> ClaimState {
    let name = cluster.name_any();
    let Some(claim) = ctx.claims.get(namespace, &reference::claim_name(&name)) else {
        return ClaimState::Absent;
    };
    let uid = Uid::of(cluster.meta().uid.as_deref().unwrap_or_default());
    let owned = claim
        .meta
        .owners()
        .any(|o| o.kind() == "Cluster" && *o.name == *name && o.uid == uid);
    if !owned {
        return ClaimState::Foreign;
    }
    let address = (claim.address.as_deref()).and_then(|a| ctx.addresses.get(namespace, a));
    match address {
        Some(address) => ClaimState::Allocated(address.address.to_string()),
        None => ClaimState::Pending(claim.refusal().map(str::to_string)),
    }
}

async fn apply(
    ctx: &Context,
    cluster: &Cluster,
    namespace: &str,
    pool: &EndpointPool,
    step: Step,
) -> Result<(), Error> {
    let name = cluster.name_any();
    let claim_name = reference::claim_name(&name);
    match step {
        Step::Nothing => {}
        Step::Claim(requested) => {
            let Some(uid) = cluster.meta().uid.as_deref() else {
                return Ok(()); // a Cluster read from the server always has one
            };
            let claim = reference::claim(ClaimFor {
                namespace,
                cluster: &name,
                owner: reference::owner(&Cluster::api_version(&()), &name, uid),
                pool,
                watch_filter: cluster.labels().get(WATCH_FILTER).map(String::as_str),
                requested: requested.as_deref(),
            });
            create_claim(ctx, namespace, &claim).await?;
        }
        // A claim not judged yet is no news: the Event waits for its reason (one Event per
        // Cluster and reason is sent in a while, and it should say why).
        Step::Wait(None) => {}
        Step::Wait(Some(why)) => {
            let note = format!(
                "IPAddressClaim {claim_name} of {} {}: {why}",
                pool.kind, pool.name
            );
            report(ctx, cluster, Reason::ControlPlaneEndpointPending, note);
        }
        Step::Fill { host, port } => {
            fill(ctx, cluster, namespace, &host, port).await?;
            let note = format!(
                "spec.controlPlaneEndpoint is {host}:{port}, from {} {} (IPAddressClaim {claim_name})",
                pool.kind, pool.name
            );
            report(ctx, cluster, Reason::ControlPlaneEndpointSet, note);
        }
        Step::Differs { host, claimed } => {
            let note = format!(
                "spec.controlPlaneEndpoint.host is {host}, not {claimed}, the address IPAddressClaim {claim_name} holds for it: bitpool leaves the endpoint as it is; delete the claim if the endpoint no longer needs that address"
            );
            report(ctx, cluster, Reason::ControlPlaneEndpointPending, note);
        }
        Step::Foreign => {
            let note = format!(
                "IPAddressClaim {claim_name} exists and is not this Cluster's: bitpool does not touch it; rename or remove it"
            );
            report(ctx, cluster, Reason::ControlPlaneEndpointPending, note);
        }
    }
    Ok(())
}

async fn create_claim(ctx: &Context, namespace: &str, claim: &IPAddressClaim) -> Result<(), Error> {
    let claims: Api<IPAddressClaim> = Api::namespaced(ctx.client.clone(), namespace);
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..Default::default()
    };
    match claims.create(&params, claim).await {
        // Made meanwhile (by the webhook of a Metal3Cluster): the next read judges it.
        Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(()),
        result => result
            .map(|_| ())
            .call(Verb::Create, &claims, &claim.name_any()),
    }
}

/// Applies the endpoint's host and port as bitpool's, and nothing else of the Cluster.
async fn fill(
    ctx: &Context,
    cluster: &Cluster,
    namespace: &str,
    host: &str,
    port: i32,
) -> Result<(), Error> {
    let clusters: Api<Cluster> = Api::namespaced(ctx.client.clone(), namespace);
    let name = cluster.name_any();
    let patch = json!({
        "apiVersion": Cluster::api_version(&()),
        "kind": "Cluster",
        "metadata": {"name": name},
        "spec": {"controlPlaneEndpoint": {"host": host, "port": port}},
    });
    clusters
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Apply(patch),
        )
        .await
        .map(|_| ())
        .call(Verb::Patch, &clusters, &name)
}

fn report(ctx: &Context, cluster: &Cluster, reason: Reason, note: String) {
    tracing::info!(cluster = %cluster.name_any(), namespace = ?cluster.namespace(), reason = reason.as_str(), %note, "control-plane endpoint");
    ctx.ops
        .events
        .publish(cluster.object_ref(&()), reason, note);
}
