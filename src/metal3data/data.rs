//! Metal3Data: claims an address from every pool its template references (an IPClaim for a
//! Metal3 IPPool, an IPAddressClaim for any other kind), renders the metaData and networkData
//! secrets once, and releases every claim when it goes.
//!
//! Fetch (template, Metal3Machine, Machine, BareMetalHost), compute ([`crate::render`]), apply
//! (claims, secrets), write status.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, ObjectMeta};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::ip_claims::{ClaimState, ensure_claim, owned_by, release_claim};
use super::secrets::{create_secret, pin_secret_names, secret_missing};
use crate::api::capi::{IPAddressClaim, Machine};
use crate::api::labels;
use crate::api::metal3_data::{
    DATA_FINALIZER, DATA_NAME_LABEL, Metal3Data, Metal3DataClaim, Metal3DataTemplate,
    Metal3ObjectRef,
};
use crate::api::metal3_hosts::{
    AnyMetal3Machine, BARE_METAL_HOST_ANNOTATION, BareMetalHost, Metal3Machine,
    metal3_machine_resource,
};
use crate::api::metal3_ipam::IPClaim;
use crate::ops::events::Reason;
use crate::render::{self, Host, ObjectFacts, PoolAddresses};
use crate::runtime::Context;
use crate::runtime::cached::Meta;
use crate::runtime::error::{Call, Error, Verb};
use crate::runtime::objects::{self, FinalizerPatch};

/// How often a Metal3Data that waits on objects bitpool does not watch looks again.
pub(super) const WAIT: Duration = Duration::from_secs(10);
/// How often a Metal3Data whose claim failed asks again (the pool may have changed).
pub(super) const RETRY_FAILED: Duration = Duration::from_secs(30);

/// Where a reconcile stopped.
#[derive(Debug, PartialEq)]
pub(super) enum Step {
    Ready,
    /// Something else must happen first; not an error.
    Waiting(String),
    /// An error a person must act on; retried, since pools and objects change.
    Failed(String),
}

/// Reconciles a Metal3Data: its claims, its rendered secrets and its status, or their release.
pub async fn reconcile(data: Arc<Metal3Data>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = data
        .namespace()
        .ok_or_else(|| Error::MissingNamespace(data.name_any()))?;
    let api: Api<Metal3Data> = Api::namespaced(ctx.client.clone(), &namespace);
    if data.meta().deletion_timestamp.is_some() {
        return release(&data, &ctx, &api).await;
    }
    if paused(&data, &ctx) {
        // Unpausing a Cluster does not touch its Metal3Data: look again later.
        return Ok(Action::requeue(RETRY_FAILED));
    }
    if adopt_if_handed_over(&data, &ctx, &api).await? {
        return Ok(Action::await_change());
    }
    if objects::add_finalizer(&api, &data, DATA_FINALIZER).await? == FinalizerPatch::Stale {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let step = build(&data, &ctx, &api).await?;
    let (ready, error, action) = match &step {
        Step::Ready => (true, None, Action::await_change()),
        Step::Waiting(why) => {
            tracing::debug!(data = %data.name_any(), waiting = %why);
            (false, None, Action::requeue(WAIT))
        }
        Step::Failed(message) => (false, Some(message.clone()), Action::requeue(RETRY_FAILED)),
    };
    write_status(&api, &data, ready, error).await?;
    Ok(action)
}

/// A Metal3Data CAPM3 made before its template was handed to bitpool: marked as handed over
/// too (CAPM3 leaves it from then on), and reconciled on the event of that write. Its secrets
/// and IP claims carry the same names either way, so bitpool carries on where CAPM3 stopped.
pub(super) async fn adopt_if_handed_over(
    data: &Metal3Data,
    ctx: &Context,
    api: &Api<Metal3Data>,
) -> Result<bool, Error> {
    let template = data.spec.template.name.as_deref().and_then(|name| {
        ctx.data_templates
            .get(&ObjectRef::new(name).within(&data.namespace()?))
    });
    let handed_over = template.is_some_and(|t| objects::handed_to_bitpool(t.meta()));
    if !handed_over || objects::handed_to_bitpool(data.meta()) {
        return Ok(false);
    }
    tracing::info!(data = %data.name_any(), "taking over a Metal3Data its template hands to bitpool");
    let patch = json!({ "metadata": { "annotations": {
        labels::PAUSED: labels::HANDED_TO_BITPOOL,
    } } });
    objects::merge_patch(api, &data.name_any(), patch).await?;
    Ok(true)
}

pub(super) fn paused(data: &Metal3Data, ctx: &Context) -> bool {
    if objects::is_paused(data.meta()) {
        return true;
    }
    match (data.labels().get(labels::CLUSTER_NAME), data.namespace()) {
        (Some(cluster), Some(ns)) => ctx.cluster_paused(&ns, cluster),
        _ => false,
    }
}

pub(super) async fn write_status(
    api: &Api<Metal3Data>,
    data: &Metal3Data,
    ready: bool,
    error: Option<String>,
) -> Result<(), Error> {
    let current = data.status.clone().unwrap_or_default();
    if current.ready == ready && current.error_message == error {
        return Ok(());
    }
    let patch = json!({ "status": { "ready": ready, "errorMessage": error } });
    objects::merge_status(api, &data.name_any(), patch).await
}

pub(super) fn facts(meta: &ObjectMeta) -> ObjectFacts {
    ObjectFacts {
        name: meta.name.clone().unwrap_or_default(),
        labels: meta.labels.clone().unwrap_or_default(),
        annotations: meta.annotations.clone().unwrap_or_default(),
    }
}

/// The owner of `meta` of the given kind in the given API group (any version).
pub(super) fn owner_named<'a>(meta: &'a ObjectMeta, kind: &str, group: &str) -> Option<&'a str> {
    meta.owner_references.iter().flatten().find_map(|o| {
        let owner_group = o.api_version.rsplit_once('/').map_or("", |(g, _)| g);
        (o.kind == kind && owner_group == group).then_some(o.name.as_str())
    })
}

pub(super) async fn build(
    data: &Metal3Data,
    ctx: &Context,
    api: &Api<Metal3Data>,
) -> Result<Step, Error> {
    let inputs = match read_inputs(data, ctx).await? {
        Ok(inputs) => inputs,
        Err(step) => return Ok(step),
    };
    let machine = inputs.metal3_machine.name_any();
    let pinned = pin_secret_names(data, api, &inputs.template, &machine).await?;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &inputs.namespace);
    let meta_missing = secret_missing(&secrets, pinned.meta_data.as_ref()).await?;
    let network_missing = secret_missing(&secrets, pinned.network_data.as_ref()).await?;
    if !meta_missing && !network_missing {
        return Ok(Step::Ready);
    }
    let resolved = resolve_host(&ctx.client, &inputs.namespace, data, &inputs.metal3_machine);
    let (host, host_name) = match resolved.await? {
        Ok(found) => found,
        Err(step) => return Ok(step),
    };
    let addresses = match collect_addresses(data, ctx, &inputs.template, &host, &host_name).await? {
        Ok(addresses) => addresses,
        Err(step) => return Ok(step),
    };
    let spec = &inputs.template.spec;
    // Rendered only where a secret is missing: one written before is never rendered again.
    let meta = (spec.meta_data.as_ref())
        .zip(pinned.meta_data.as_ref())
        .filter(|_| meta_missing)
        .map(|(template, reference)| (render::meta_data(template, &host, &addresses), reference));
    let network = (spec.network_data.as_ref())
        .zip(pinned.network_data.as_ref())
        .filter(|_| network_missing)
        .map(|(template, reference)| {
            (render::network_data(template, &host, &addresses), reference)
        });
    let cluster = secret_cluster(&inputs.template, data);
    for (key, rendered) in [("metaData", meta), ("networkData", network)] {
        match rendered {
            Some((Ok(text), reference)) => {
                create_secret(&secrets, data, reference, &cluster, key, text).await?
            }
            Some((Err(e), _)) => return Ok(Step::Failed(e.to_string())),
            None => {}
        }
    }
    tracing::info!(data = %data.name_any(), "rendered metaData and networkData");
    Ok(Step::Ready)
}

/// What a Metal3Data is rendered from: its template, and its claim's Metal3Machine.
pub(super) struct Inputs {
    pub(super) namespace: String,
    pub(super) template: Arc<Metal3DataTemplate>,
    pub(super) metal3_machine: Metal3Machine,
}

/// The template (from the cache), the claim (from the cache) and the claim's Metal3Machine
/// (read at the version the API server serves); a missing one is waited for.
pub(super) async fn read_inputs(
    data: &Metal3Data,
    ctx: &Context,
) -> Result<Result<Inputs, Step>, Error> {
    let namespace = data.namespace().unwrap_or_default();
    let Some(template_name) = data.spec.template.name.clone() else {
        return Ok(Err(Step::Failed("spec.template has no name".into())));
    };
    let Some(template) = ctx
        .data_templates
        .get(&ObjectRef::new(&template_name).within(&namespace))
    else {
        let why = format!("Metal3DataTemplate {template_name} not found");
        return Ok(Err(Step::Waiting(why)));
    };
    if let Some(cluster) = data.labels().get(labels::CLUSTER_NAME)
        && !template.spec.cluster_name.is_empty()
        && *cluster != template.spec.cluster_name
    {
        let why = "Metal3DataTemplate associated with another cluster";
        return Ok(Err(Step::Failed(why.into())));
    }
    let Some(claim_name) = data.spec.claim.name.clone() else {
        return Ok(Err(Step::Failed("spec.claim has no name".into())));
    };
    let Some(claim) = ctx
        .data_claims
        .get(&ObjectRef::new(&claim_name).within(&namespace))
    else {
        let why = format!("Metal3DataClaim {claim_name} not found");
        return Ok(Err(Step::Waiting(why)));
    };
    let group = crate::api::metal3_data::GROUP;
    let Some(machine_name) = owner_named(claim.meta(), "Metal3Machine", group) else {
        let why = "Metal3Machine not found in owner references";
        return Ok(Err(Step::Failed(why.into())));
    };
    let machines = Api::<AnyMetal3Machine>::namespaced_with(
        ctx.client.clone(),
        &namespace,
        &metal3_machine_resource(ctx.settings.metal3_machine_version),
    );
    let found = objects::get_optional(&machines, machine_name).await?;
    let Some(metal3_machine) = found.map(Metal3Machine::from) else {
        let why = format!("Metal3Machine {machine_name} not found");
        return Ok(Err(Step::Waiting(why)));
    };
    Ok(Ok(Inputs {
        namespace,
        template,
        metal3_machine,
    }))
}

/// An address from every pool the template references for this host, each through a claim of
/// the pool's kind; what is still missing is waited for, what cannot be had fails.
pub(super) async fn collect_addresses(
    data: &Metal3Data,
    ctx: &Context,
    template: &Metal3DataTemplate,
    host: &Host,
    host_name: &str,
) -> Result<Result<PoolAddresses, Step>, Error> {
    let references = match render::referenced_pools(&template.spec, Some(host)) {
        Ok(references) => references,
        Err(e) => return Ok(Err(Step::Failed(e.to_string()))),
    };
    let mut addresses = PoolAddresses::new();
    let (mut waiting, mut failed) = (vec![], vec![]);
    for (pool, reference) in &references {
        match ensure_claim(data, ctx, reference, host_name).await? {
            ClaimState::Address(address) => {
                addresses.insert(pool.clone(), address);
            }
            ClaimState::Waiting(why) => waiting.push(why),
            ClaimState::Failed(why) => failed.push(why),
            ClaimState::Unanswered(why) => {
                let regarding = data.object_ref(&());
                (ctx.ops.events).publish(regarding, Reason::ClaimUnanswered, why.clone());
                failed.push(why);
            }
        }
    }
    if !failed.is_empty() {
        return Ok(Err(Step::Failed(failed.join("; "))));
    }
    if !waiting.is_empty() {
        return Ok(Err(Step::Waiting(waiting.join("; "))));
    }
    Ok(Ok(addresses))
}

/// The Cluster the secrets are labelled with: CAPM3 labels them with the template's Cluster; a
/// template shared by several clusters names none, and the Metal3Data's own Cluster is the one.
pub(super) fn secret_cluster(template: &Metal3DataTemplate, data: &Metal3Data) -> String {
    template
        .labels()
        .get(labels::CLUSTER_NAME)
        .or_else(|| Some(&template.spec.cluster_name).filter(|c| !c.is_empty()))
        .or_else(|| data.labels().get(labels::CLUSTER_NAME))
        .cloned()
        .unwrap_or_default()
}

/// The host a Metal3Data renders for: its Metal3Machine's Machine and BareMetalHost, with the
/// host's name; or why they cannot be found yet.
pub(super) async fn resolve_host(
    client: &kube::Client,
    namespace: &str,
    data: &Metal3Data,
    metal3_machine: &Metal3Machine,
) -> Result<Result<(Host, String), Step>, Error> {
    let Some(machine_owner) = owner_named(metal3_machine.meta(), "Machine", "cluster.x-k8s.io")
    else {
        return Ok(Err(Step::Waiting(format!(
            "waiting for the Machine controller to set the owner of Metal3Machine {}",
            metal3_machine.name_any()
        ))));
    };
    let Some(machine) = objects::get_optional(
        &Api::<Machine>::namespaced(client.clone(), namespace),
        machine_owner,
    )
    .await?
    else {
        return Ok(Err(Step::Waiting(format!(
            "Machine {machine_owner} not found"
        ))));
    };
    // The annotation's namespace part is ignored: the host is in the Metal3Machine's namespace.
    let Some(host_name) = metal3_machine
        .annotations()
        .get(BARE_METAL_HOST_ANNOTATION)
        .and_then(|a| a.rsplit('/').next())
        .filter(|n| !n.is_empty())
        .map(str::to_string)
    else {
        return Ok(Err(Step::Waiting(format!(
            "Metal3Machine {} has no {BARE_METAL_HOST_ANNOTATION} annotation yet",
            metal3_machine.name_any()
        ))));
    };
    let Some(bare_metal_host) = objects::get_optional(
        &Api::<BareMetalHost>::namespaced(client.clone(), namespace),
        &host_name,
    )
    .await?
    else {
        return Ok(Err(Step::Waiting(format!(
            "BareMetalHost {host_name} not found"
        ))));
    };
    let host = Host {
        namespace: namespace.to_string(),
        index: data.spec.index,
        metal3_machine: facts(metal3_machine.meta()),
        machine: facts(machine.meta()),
        bare_metal_host: facts(bare_metal_host.meta()),
        nics: bare_metal_host
            .status
            .as_ref()
            .and_then(|s| s.hardware.as_ref())
            .filter(|h| !h.nics.is_empty())
            .map(|h| {
                h.nics
                    .iter()
                    .map(|n| (n.name.clone(), n.mac.clone()))
                    .collect()
            }),
        boot_mac: bare_metal_host.spec.boot_mac_address.clone(),
    };
    Ok(Ok((host, host_name)))
}

/// Deletion: once the Metal3DataClaim is gone (or going), every IP claim of this Metal3Data is
/// released, of both kinds and whatever named its pool (annotations included), then the
/// finalizer goes.
pub(super) async fn release(
    data: &Metal3Data,
    ctx: &Context,
    api: &Api<Metal3Data>,
) -> Result<Action, Error> {
    let namespace = data.namespace().unwrap_or_default();
    if let Some(claim_name) = &data.spec.claim.name {
        let claim = ctx
            .data_claims
            .get(&ObjectRef::new(claim_name).within(&namespace));
        if claim.is_some_and(|c| c.meta().deletion_timestamp.is_none()) {
            // Deleted while its claim still uses it: keep the addresses.
            return Ok(Action::requeue(WAIT));
        }
    }
    let data_name = data.name_any();
    let belongs = |meta: &ObjectMeta| {
        owned_by(meta, data)
            || (meta.owner_references.as_ref().is_none_or(|o| o.is_empty())
                && meta.labels.as_ref().and_then(|l| l.get(DATA_NAME_LABEL)) == Some(&data_name))
    };
    let ipclaims: Api<IPClaim> = Api::namespaced(ctx.client.clone(), &namespace);
    let claims: Api<IPAddressClaim> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut released = 0;
    let listed = ipclaims.list(&ListParams::default()).await;
    for claim in listed.call(Verb::List, &ipclaims, "")? {
        if belongs(claim.meta()) {
            release_claim(&ipclaims, &claim).await?;
            released += 1;
        }
    }
    let listed = claims.list(&ListParams::default()).await;
    for claim in listed.call(Verb::List, &claims, "")? {
        if belongs(claim.meta()) {
            release_claim(&claims, &claim).await?;
            released += 1;
        }
    }
    tracing::info!(data = %data_name, claims = released, "released the IP claims of a deleted Metal3Data");
    // The template controller removes its own finalizer from the same list: losing that race
    // is no event for this controller, so look again soon.
    if objects::remove_finalizer(api, data, DATA_FINALIZER).await? == FinalizerPatch::Stale {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    Ok(Action::await_change())
}

/// The Metal3Data a claim or address event concerns: the claim's controlling Metal3Data.
pub fn owner_data(meta: &Meta) -> Option<ObjectRef<Metal3Data>> {
    meta.owners()
        .find(|o| o.kind() == "Metal3Data")
        .map(|o| ObjectRef::new(&o.name).within(meta.namespace()))
}

/// The Metal3Data a Metal3DataClaim's events concern (deletion waits on the claim).
pub fn data_of_claim(claim: &Metal3DataClaim) -> Option<ObjectRef<Metal3Data>> {
    let name = claim
        .status
        .as_ref()?
        .rendered_data
        .as_ref()?
        .name
        .as_deref()?;
    Some(ObjectRef::new(name).within(claim.meta().namespace.as_deref()?))
}

/// The template a Metal3DataClaim or Metal3Data names (an empty namespace means its own).
pub fn template_of(
    reference: &Metal3ObjectRef,
    namespace: Option<&str>,
) -> Option<ObjectRef<Metal3DataTemplate>> {
    let name = reference.name.as_deref()?;
    let ns = reference
        .namespace
        .as_deref()
        .filter(|n| !n.is_empty())
        .or(namespace)?;
    Some(ObjectRef::new(name).within(ns))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metal3data::secrets::secret_ref;
    use k8s_openapi::api::core::v1::SecretReference;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn owned(owners: &[(&str, &str, &str)]) -> ObjectMeta {
        ObjectMeta {
            owner_references: Some(
                owners
                    .iter()
                    .map(|(api_version, kind, name)| OwnerReference {
                        api_version: api_version.to_string(),
                        kind: kind.to_string(),
                        name: name.to_string(),
                        uid: format!("uid-{name}"),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn owners_match_kind_and_group_in_any_version() {
        let meta = owned(&[
            (
                "infrastructure.cluster.x-k8s.io/v1beta2",
                "Metal3Machine",
                "m3m",
            ),
            ("other.example.com/v1", "Machine", "not-capi"),
            ("cluster.x-k8s.io/v1beta1", "Machine", "capi"),
        ]);
        assert_eq!(
            owner_named(&meta, "Metal3Machine", "infrastructure.cluster.x-k8s.io"),
            Some("m3m")
        );
        assert_eq!(
            owner_named(&meta, "Machine", "cluster.x-k8s.io"),
            Some("capi")
        );
        assert_eq!(owner_named(&meta, "BareMetalHost", "metal3.io"), None);
    }

    #[test]
    fn secret_names_default_from_the_metal3_machine_and_are_then_kept() {
        let fresh = secret_ref(None, "m3m-0", "metadata", "ns");
        assert_eq!(fresh.name.as_deref(), Some("m3m-0-metadata"));
        assert_eq!(fresh.namespace.as_deref(), Some("ns"));
        let kept = SecretReference {
            name: Some("custom".into()),
            namespace: Some("ns".into()),
        };
        assert_eq!(secret_ref(Some(&kept), "m3m-1", "metadata", "ns"), kept);
        let empty = SecretReference::default();
        assert_eq!(
            secret_ref(Some(&empty), "m3m-1", "networkdata", "ns")
                .name
                .as_deref(),
            Some("m3m-1-networkdata")
        );
    }

    #[test]
    fn claim_and_address_events_map_to_the_controlling_metal3_data() {
        let meta = owned(&[(
            "infrastructure.cluster.x-k8s.io/v1beta1",
            "Metal3Data",
            "t-0",
        )]);
        let cached = |meta: &ObjectMeta| {
            let mut meta = meta.clone();
            meta.namespace = Some("ns".into());
            meta.name = Some("claim".into());
            Meta::of(&meta).expect("named and namespaced")
        };
        assert_eq!(
            owner_data(&cached(&meta)),
            Some(ObjectRef::new("t-0").within("ns"))
        );
        let claim_meta = owned(&[("ipam.metal3.io/v1alpha1", "IPPool", "p")]);
        assert_eq!(owner_data(&cached(&claim_meta)), None);
    }
}
