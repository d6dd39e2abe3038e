//! Metal3Data: claims an address from every pool its template references (an IPClaim for a
//! Metal3 IPPool, an IPAddressClaim for any other kind), renders the metaData and networkData
//! secrets once, and releases every claim when it goes.
//!
//! Fetch (template, Metal3Machine, Machine, BareMetalHost), compute ([`crate::render`]), apply
//! (claims, secrets), write status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ObjectReference, Secret, SecretReference};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::unanswered::unanswered;
use crate::api::capi::{IPAddressClaim, IPAddressClaimSpec, IPPoolReference, Machine};
use crate::api::labels;
use crate::api::metal3_data::{
    DATA_FINALIZER, DATA_NAME_LABEL, Metal3Data, Metal3DataClaim, Metal3DataTemplate,
    Metal3ObjectRef, POOL_NAME_LABEL, SECRET_TYPE,
};
use crate::api::metal3_hosts::{
    AnyMetal3Machine, BARE_METAL_HOST_ANNOTATION, BareMetalHost, Metal3Machine,
    metal3_machine_resource,
};
use crate::api::metal3_ipam::{IPClaim, IPClaimSpec};
use crate::ops::events::Reason;
use crate::render::{self, Host, ObjectFacts, PoolAddress, PoolAddresses, PoolKind, PoolReference};
use crate::runtime::Context;
use crate::runtime::cached::{ClaimObject, Meta, Uid};
use crate::runtime::error::{Call, Error, Verb, object_of};
use crate::runtime::index::Index;
use crate::runtime::objects::{self, FinalizerPatch};

/// How often a Metal3Data that waits on objects bitpool does not watch looks again.
const WAIT: Duration = Duration::from_secs(10);
/// How often a Metal3Data whose claim failed asks again (the pool may have changed).
const RETRY_FAILED: Duration = Duration::from_secs(30);

/// Where a reconcile stopped.
#[derive(Debug, PartialEq)]
enum Step {
    Ready,
    /// Something else must happen first; not an error.
    Waiting(String),
    /// An error a person must act on; retried, since pools and objects change.
    Failed(String),
}

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
async fn adopt_if_handed_over(
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

fn paused(data: &Metal3Data, ctx: &Context) -> bool {
    if objects::is_paused(data.meta()) {
        return true;
    }
    match (data.labels().get(labels::CLUSTER_NAME), data.namespace()) {
        (Some(cluster), Some(ns)) => ctx.cluster_paused(&ns, cluster),
        _ => false,
    }
}

async fn write_status(
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

fn facts(meta: &ObjectMeta) -> ObjectFacts {
    ObjectFacts {
        name: meta.name.clone().unwrap_or_default(),
        labels: meta.labels.clone().unwrap_or_default(),
        annotations: meta.annotations.clone().unwrap_or_default(),
    }
}

/// The owner of `meta` of the given kind in the given API group (any version).
fn owner_named<'a>(meta: &'a ObjectMeta, kind: &str, group: &str) -> Option<&'a str> {
    meta.owner_references.iter().flatten().find_map(|o| {
        let owner_group = o.api_version.rsplit_once('/').map_or("", |(g, _)| g);
        (o.kind == kind && owner_group == group).then_some(o.name.as_str())
    })
}

async fn build(data: &Metal3Data, ctx: &Context, api: &Api<Metal3Data>) -> Result<Step, Error> {
    let inputs = match read_inputs(data, ctx).await? {
        Ok(inputs) => inputs,
        Err(step) => return Ok(step),
    };
    let pinned = pin_secret_names(data, api, &inputs).await?;
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
struct Inputs {
    namespace: String,
    template: Arc<Metal3DataTemplate>,
    metal3_machine: Metal3Machine,
}

/// The template (from the cache), the claim (from the cache) and the claim's Metal3Machine
/// (read at the version the API server serves); a missing one is waited for.
async fn read_inputs(data: &Metal3Data, ctx: &Context) -> Result<Result<Inputs, Step>, Error> {
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

/// The secrets a Metal3Data renders into.
struct Pinned {
    meta_data: Option<SecretReference>,
    network_data: Option<SecretReference>,
}

/// Names the secrets in the Metal3Data's spec. Secrets keep their names once set, and are never
/// rendered twice: a host re-provisions into exactly the state it had.
async fn pin_secret_names(
    data: &Metal3Data,
    api: &Api<Metal3Data>,
    inputs: &Inputs,
) -> Result<Pinned, Error> {
    let machine = inputs.metal3_machine.name_any();
    let spec = &inputs.template.spec;
    let pin = |current: Option<&SecretReference>, suffix: &str| {
        secret_ref(current, &machine, suffix, &inputs.namespace)
    };
    let pinned = Pinned {
        meta_data: (spec.meta_data.as_ref()).map(|_| pin(data.spec.meta_data.as_ref(), "metadata")),
        network_data: (spec.network_data.as_ref())
            .map(|_| pin(data.spec.network_data.as_ref(), "networkdata")),
    };
    if pinned.meta_data.as_ref() != data.spec.meta_data.as_ref()
        || pinned.network_data.as_ref() != data.spec.network_data.as_ref()
    {
        let patch =
            json!({ "spec": { "metaData": pinned.meta_data, "networkData": pinned.network_data } });
        objects::merge_patch(api, &data.name_any(), patch).await?;
    }
    Ok(pinned)
}

/// An address from every pool the template references for this host, each through a claim of
/// the pool's kind; what is still missing is waited for, what cannot be had fails.
async fn collect_addresses(
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
fn secret_cluster(template: &Metal3DataTemplate, data: &Metal3Data) -> String {
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
async fn resolve_host(
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

/// Whether a wanted secret is still to be written (`None`: the template renders no such data).
async fn secret_missing(
    secrets: &Api<Secret>,
    reference: Option<&SecretReference>,
) -> Result<bool, Error> {
    match reference.and_then(|r| r.name.as_deref()) {
        Some(name) => Ok(objects::get_optional(secrets, name).await?.is_none()),
        None => Ok(false),
    }
}

fn secret_ref(
    existing: Option<&SecretReference>,
    machine: &str,
    suffix: &str,
    namespace: &str,
) -> SecretReference {
    match existing.filter(|r| r.name.as_deref().is_some_and(|n| !n.is_empty())) {
        Some(r) => r.clone(),
        None => SecretReference {
            name: Some(format!("{machine}-{suffix}")),
            namespace: Some(namespace.to_string()),
        },
    }
}

async fn create_secret(
    secrets: &Api<Secret>,
    data: &Metal3Data,
    reference: &SecretReference,
    cluster: &str,
    key: &str,
    text: String,
) -> Result<(), Error> {
    let secret = Secret {
        metadata: ObjectMeta {
            name: reference.name.clone(),
            namespace: data.namespace(),
            labels: Some(BTreeMap::from([(
                labels::CLUSTER_NAME.to_string(),
                cluster.to_string(),
            )])),
            owner_references: objects::owner_reference(data, true).map(|o| vec![o]),
            ..Default::default()
        },
        type_: Some(SECRET_TYPE.to_string()),
        data: Some(BTreeMap::from([(
            key.to_string(),
            ByteString(text.into_bytes()),
        )])),
        ..Default::default()
    };
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(()),
        // Written by an earlier pass or another process: never re-rendered.
        Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(()),
        Err(e) => Err(Error::api(
            Verb::Create,
            object_of(secrets, &reference.name.clone().unwrap_or_default()),
            e,
        )),
    }
}

/// What one pool's claim says.
enum ClaimState {
    Address(PoolAddress),
    Waiting(String),
    Failed(String),
    /// No IPAM provider has answered the claim ([`unanswered`]): failed, and told in an Event.
    Unanswered(String),
}

fn owned_by(meta: &ObjectMeta, data: &Metal3Data) -> bool {
    let uid = data.meta().uid.as_deref();
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| Some(o.uid.as_str()) == uid)
}

/// [`owned_by`] for a cached object.
fn owned_by_cached(meta: &Meta, data: &Metal3Data) -> bool {
    let Some(uid) = data.meta().uid.as_deref().map(Uid::of) else {
        return false;
    };
    meta.owners.iter().any(|o| o.uid == uid)
}

/// Finds or creates the claim for one pool and reads its address.
async fn ensure_claim(
    data: &Metal3Data,
    ctx: &Context,
    reference: &PoolReference,
    host_name: &str,
) -> Result<ClaimState, Error> {
    let namespace = data.namespace().unwrap_or_default();
    let own_name = format!("{}-{}", data.name_any(), reference.name);
    let host_keyed = format!("{host_name}-{}", reference.name);
    let preferred = if ctx.settings.bmh_name_based_preallocation {
        &host_keyed
    } else {
        &own_name
    };
    let names = ClaimNames {
        candidates: [&own_name, &host_keyed],
        preferred,
        namespace: &namespace,
    };
    let pool = &reference.name;
    match reference.kind() {
        PoolKind::Metal3 => {
            let read = |claim: &ClaimObject| metal3_address(ctx, claim, pool);
            let new = |metadata| IPClaim {
                metadata,
                spec: IPClaimSpec {
                    pool: ObjectReference {
                        name: Some(pool.clone()),
                        namespace: Some(namespace.clone()),
                        ..Default::default()
                    },
                },
                status: None,
            };
            claim_of_pool(data, ctx, &ctx.ipclaims, &names, pool, read, new).await
        }
        PoolKind::Capi => {
            let read = |claim: &ClaimObject| capi_address(ctx, claim, reference);
            let new = |metadata| IPAddressClaim {
                metadata,
                spec: IPAddressClaimSpec {
                    cluster_name: data.labels().get(labels::CLUSTER_NAME).cloned(),
                    pool_ref: IPPoolReference {
                        name: pool.clone(),
                        kind: reference.kind.clone(),
                        api_group: reference.api_group.clone(),
                    },
                },
                status: None,
            };
            claim_of_pool(data, ctx, &ctx.claims, &names, pool, read, new).await
        }
    }
}

/// Where a Metal3Data's claim for one pool may be: under its own name or the host-keyed one
/// (the mode may have changed since the claim was made); new claims take `preferred`.
struct ClaimNames<'a> {
    candidates: [&'a String; 2],
    preferred: &'a String,
    namespace: &'a str,
}

/// The claim of either kind: the one this Metal3Data owns is read; a claim of the preferred name
/// owned by another is waited for; otherwise `new` is created under the preferred name.
async fn claim_of_pool<K>(
    data: &Metal3Data,
    ctx: &Context,
    cache: &Index<ClaimObject>,
    names: &ClaimNames<'_>,
    pool: &str,
    read: impl FnOnce(&ClaimObject) -> ClaimState,
    new: impl FnOnce(ObjectMeta) -> K,
) -> Result<ClaimState, Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let find = |name: &str| cache.get(names.namespace, name);
    let ours = names
        .candidates
        .into_iter()
        .filter_map(|n| find(n))
        .find(|c| owned_by_cached(&c.meta, data));
    if let Some(claim) = ours {
        return Ok(read(&claim));
    }
    let api: Api<K> = Api::namespaced(ctx.client.clone(), names.namespace);
    if let Some(other) = find(names.preferred) {
        return earlier_claim(&api, &other).await;
    }
    let claim = new(claim_meta(data, names.preferred, pool));
    create_claim(&api, &claim, pool).await
}

/// The claim's metadata: the Metal3Data's labels plus `data-name`/`pool-name` (how release finds
/// host-keyed claims), the Metal3Data as controller, and the finalizer that keeps the claim while
/// the Metal3Data uses it.
fn claim_meta(data: &Metal3Data, name: &str, pool: &str) -> ObjectMeta {
    let mut claim_labels = objects::with_label(
        data.meta().labels.as_ref(),
        DATA_NAME_LABEL,
        &data.name_any(),
    );
    claim_labels.insert(POOL_NAME_LABEL.to_string(), pool.to_string());
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: data.namespace(),
        labels: Some(claim_labels),
        finalizers: Some(vec![DATA_FINALIZER.to_string()]),
        owner_references: objects::owner_reference(data, true).map(|o| vec![o]),
        ..Default::default()
    }
}

async fn create_claim<K>(api: &Api<K>, claim: &K, pool: &str) -> Result<ClaimState, Error>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    match api.create(&PostParams::default(), claim).await {
        Ok(_) => {
            tracing::info!(claim = %claim.name_any(), kind = %K::kind(&()), "created IP claim");
            Ok(ClaimState::Waiting(format!(
                "waiting for an address from pool {pool}"
            )))
        }
        Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(ClaimState::Waiting(format!(
            "claim {} exists but is not in the cache yet",
            claim.name_any()
        ))),
        Err(e) => Err(Error::api(
            Verb::Create,
            object_of(api, &claim.name_any()),
            e,
        )),
    }
}

/// A claim of the wanted name that belongs to another (earlier) Metal3Data: never taken over.
/// If it is being deleted, its finalizer from that Metal3Data is lifted so that it can go.
async fn earlier_claim<K>(api: &Api<K>, claim: &ClaimObject) -> Result<ClaimState, Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let meta = &claim.meta;
    if meta.deleted.is_some() {
        let listed = objects::Finalizers {
            name: &meta.name,
            resource_version: &meta.resource_version,
            current: meta.finalizers.iter().map(|f| &**f),
        };
        listed.set(api, DATA_FINALIZER, false).await?;
        return Ok(ClaimState::Waiting(format!(
            "claim {} of an earlier Metal3Data is being deleted",
            meta.name
        )));
    }
    Ok(ClaimState::Waiting(format!(
        "claim {} belongs to another Metal3Data; waiting for it to be released",
        meta.name
    )))
}

fn metal3_address(ctx: &Context, claim: &ClaimObject, pool: &str) -> ClaimState {
    if let Some(message) = claim.error_message() {
        return ClaimState::Failed(format!("IP Allocation for {pool} failed : {message}"));
    }
    let Some(address_name) = &claim.address else {
        return waiting_for_an_address(claim, pool);
    };
    match ctx
        .metal3_addresses
        .get(&claim.meta.namespace, address_name)
    {
        Some(address) => ClaimState::Address(PoolAddress {
            address: address.address.to_string(),
            prefix: address.prefix.unwrap_or(0),
            gateway: address.gateway.as_deref().unwrap_or_default().to_string(),
            dns_servers: address.dns_servers.iter().map(|d| d.to_string()).collect(),
        }),
        None => ClaimState::Waiting(format!("IPAddress {address_name} not found")),
    }
}

fn capi_address(ctx: &Context, claim: &ClaimObject, reference: &PoolReference) -> ClaimState {
    let pool = &reference.name;
    if claim.meta.deleted.is_some() {
        return ClaimState::Waiting(format!(
            "IPAddressClaim {} is being deleted",
            claim.meta.name
        ));
    }
    let Some(address_name) = claim.address.as_deref().filter(|n| !n.is_empty()) else {
        // Beyond CAPM3: say why the provider refused, instead of waiting silently.
        return match claim.refusal() {
            Some(message) => {
                ClaimState::Failed(format!("IP Allocation for {pool} failed : {message}"))
            }
            None => waiting_for_an_address(claim, pool),
        };
    };
    let namespace = &claim.meta.namespace;
    let Some(address) = ctx.addresses.get(namespace, address_name) else {
        return ClaimState::Waiting(format!("IPAddress {address_name} not found"));
    };
    ClaimState::Address(PoolAddress {
        address: address.address.to_string(),
        prefix: address.prefix.unwrap_or(0),
        gateway: address.gateway.as_deref().unwrap_or_default().to_string(),
        // The CAPI contract carries no DNS; bitpool's own pools may list servers per subnet.
        dns_servers: ctx
            .address_pool(&reference.api_group, &reference.kind, pool, namespace)
            .map(|p| p.dns_servers_for(&address.address))
            .unwrap_or_default(),
    })
}

/// A claim without an address or a refusal: waiting, unless no provider has answered it for
/// longer than a provider takes.
fn waiting_for_an_address(claim: &ClaimObject, pool: &str) -> ClaimState {
    match unanswered(claim, pool, objects::now().0) {
        Some(why) => ClaimState::Unanswered(why),
        None => ClaimState::Waiting(format!("waiting for an address from pool {pool}")),
    }
}

/// Deletion: once the Metal3DataClaim is gone (or going), every IP claim of this Metal3Data is
/// released, of both kinds and whatever named its pool (annotations included), then the
/// finalizer goes.
async fn release(data: &Metal3Data, ctx: &Context, api: &Api<Metal3Data>) -> Result<Action, Error> {
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

async fn release_claim<K>(api: &Api<K>, claim: &K) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    objects::remove_finalizer(api, claim, DATA_FINALIZER).await?;
    if claim.meta().deletion_timestamp.is_none() {
        objects::delete_ignoring_missing(api, &claim.name_any()).await?;
    }
    Ok(())
}

/// The Metal3Data a claim or address event concerns: the claim's controlling Metal3Data.
pub fn owner_data(meta: &Meta) -> Option<ObjectRef<Metal3Data>> {
    meta.owners
        .iter()
        .find(|o| &*o.kind == "Metal3Data")
        .map(|o| ObjectRef::new(&o.name).within(&meta.namespace))
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
