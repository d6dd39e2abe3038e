//! Metal3DataTemplate: gives each Metal3DataClaim of the template the lowest free index and a
//! Metal3Data `<template>-<index>`, points the claim at it, and tears both down together.
//!
//! Two processes cannot hand one index to two claims: the index is the Metal3Data's name, so the
//! API server refuses the second. Nor one claim two indexes: a claim is bound to its index by a
//! status write made with the claim's resourceVersion before the Metal3Data is created, and a
//! reconcile after a crash creates the Metal3Data the claim already names.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::api::capi::Cluster;
use crate::api::labels;
use crate::api::metal3_data::{
    DATA_CLAIM_FINALIZER, IndexEntry, Metal3Data, Metal3DataClaim, Metal3DataSpec,
    Metal3DataTemplate, Metal3ObjectRef, TEMPLATE_FINALIZER,
};
use crate::runtime::Context;
use crate::runtime::error::{Call, Error, Verb, object_of};
use crate::runtime::objects::{self, FinalizerPatch};

/// How soon to look again after losing a race with another writer.
const RETRY: Duration = Duration::from_secs(1);

/// The Metal3Data of `template` at `index`.
pub fn data_name(template: &str, index: i64) -> String {
    format!("{template}-{index}")
}

/// The index a Metal3Data name stands for under `template`, if it is one of its names.
fn index_of(template: &str, data: &str) -> Option<i64> {
    data.strip_prefix(template)?
        .strip_prefix('-')?
        .parse()
        .ok()
        .filter(|i| *i >= 0)
}

/// The lowest index that is neither taken nor reserved.
pub fn lowest_free(taken: &BTreeSet<i64>) -> i64 {
    (0..)
        .find(|i| !taken.contains(i))
        .unwrap_or(taken.len() as i64)
}

fn same_template(reference: &Metal3ObjectRef, namespace: &str, template: &str) -> bool {
    reference.name.as_deref() == Some(template)
        && reference
            .namespace
            .as_deref()
            .is_none_or(|n| n.is_empty() || n == namespace)
}

/// The cached objects of `namespace` (Metal3Data or Metal3DataClaims) whose `reference` names
/// the template `name`.
pub fn of_template<K>(
    store: &Store<K>,
    namespace: &str,
    name: &str,
    reference: impl Fn(&K) -> &Metal3ObjectRef,
) -> Vec<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone,
{
    store
        .state()
        .into_iter()
        .filter(|o| {
            o.meta().namespace.as_deref() == Some(namespace)
                && same_template(reference(o), namespace, name)
        })
        .collect()
}

/// Reconciles a Metal3DataTemplate: its finalizer, its index of Metal3Datas, and its status.
pub async fn reconcile(
    template: Arc<Metal3DataTemplate>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let namespace = template
        .namespace()
        .ok_or_else(|| Error::MissingNamespace(template.name_any()))?;
    let name = template.name_any();
    let templates: Api<Metal3DataTemplate> = Api::namespaced(ctx.client.clone(), &namespace);
    let data_of_template = of_template(&ctx.datas, &namespace, &name, |d| &d.spec.template);
    let claims = of_template(&ctx.data_claims, &namespace, &name, |c| &c.spec.template);

    let deleting = template.meta().deletion_timestamp.is_some();
    if !deleting && template_paused(&template, &ctx, &namespace) {
        // Its own unpause is its event, its Cluster's comes through `unpaused_by`.
        return Ok(Action::await_change());
    }
    if !deleting
        && objects::add_finalizer(&templates, &template, TEMPLATE_FINALIZER).await?
            == FinalizerPatch::Stale
    {
        return Ok(Action::requeue(RETRY));
    }
    let mut pass = Pass {
        template: &template,
        datas: Api::namespaced(ctx.client.clone(), &namespace),
        claims: Api::namespaced(ctx.client.clone(), &namespace),
        by_claim: first_data_by_claim(&data_of_template),
        taken: taken_indexes(&data_of_template, &claims, &name),
        retry: false,
    };
    for claim in &claims {
        pass.claim(claim, deleting).await?;
    }
    write_indexes(&ctx, &template, &data_of_template).await?;

    if deleting {
        if data_of_template.is_empty() {
            objects::remove_finalizer(&templates, &template, TEMPLATE_FINALIZER).await?;
            return Ok(Action::await_change());
        }
        // Shared watches report no deletions: the last Metal3Data's comes through
        // `after_data_removal`.
        return Ok(Action::await_change());
    }
    Ok(if pass.retry {
        Action::requeue(RETRY)
    } else {
        Action::await_change()
    })
}

/// Each claim's Metal3Data: the one of the lowest index where a claim has several.
fn first_data_by_claim(datas: &[Arc<Metal3Data>]) -> BTreeMap<String, Arc<Metal3Data>> {
    let mut by_claim: BTreeMap<String, Arc<Metal3Data>> = BTreeMap::new();
    for data in datas {
        if let Some(claim) = &data.spec.claim.name {
            let keep = by_claim
                .get(claim)
                .is_none_or(|kept| data.spec.index < kept.spec.index);
            if keep {
                by_claim.insert(claim.clone(), data.clone());
            }
        }
    }
    by_claim
}

/// Indexes in use, or reserved by a claim whose Metal3Data is not created yet.
fn taken_indexes(
    datas: &[Arc<Metal3Data>],
    claims: &[Arc<Metal3DataClaim>],
    template: &str,
) -> BTreeSet<i64> {
    let in_use = datas.iter().map(|d| d.spec.index);
    let reserved = claims.iter().filter_map(|c| reserved_index(c, template));
    in_use.chain(reserved).collect()
}

/// One pass of a template over its claims.
struct Pass<'a> {
    template: &'a Metal3DataTemplate,
    datas: Api<Metal3Data>,
    claims: Api<Metal3DataClaim>,
    by_claim: BTreeMap<String, Arc<Metal3Data>>,
    taken: BTreeSet<i64>,
    /// Look again soon: something changed under a write, or is on its way.
    retry: bool,
}

impl Pass<'_> {
    /// A claim released (its Metal3Data deleted), bound to its Metal3Data, or given one.
    async fn claim(&mut self, claim: &Metal3DataClaim, deleting: bool) -> Result<(), Error> {
        let data = self.by_claim.get(&claim.name_any()).cloned();
        if claim.meta().deletion_timestamp.is_some() || (deleting && data.is_none()) {
            return self.release(claim, data.as_deref()).await;
        }
        if deleting {
            return Ok(());
        }
        if !objects::has_finalizer(claim.meta(), DATA_CLAIM_FINALIZER) {
            // The claim's resourceVersion changes: bind it on the next pass.
            objects::add_finalizer(&self.claims, claim, DATA_CLAIM_FINALIZER).await?;
            self.retry = true;
            return Ok(());
        }
        match data {
            Some(data) if claim_points_at(claim, &data.name_any()) => {}
            Some(data) => self.retry |= !bind(&self.claims, claim, &data.name_any()).await?,
            None => {
                let (template, taken) = (self.template, &mut self.taken);
                let created = create_data(template, claim, taken, &self.datas, &self.claims);
                self.retry |= !created.await?;
            }
        }
        Ok(())
    }

    /// A deleting claim (or any claim of a deleting template without a Metal3Data): its
    /// Metal3Data goes, then its finalizer.
    async fn release(
        &mut self,
        claim: &Metal3DataClaim,
        data: Option<&Metal3Data>,
    ) -> Result<(), Error> {
        if let Some(data) = data {
            // A Metal3Data written meanwhile keeps this finalizer: so does its claim, until a
            // later pass, or nothing would be left to name the Metal3Data to release.
            if objects::remove_finalizer(&self.datas, data, DATA_CLAIM_FINALIZER).await?
                == FinalizerPatch::Stale
            {
                self.retry = true;
                return Ok(());
            }
            objects::delete_ignoring_missing(&self.datas, &data.name_any()).await?;
            // Shared watches do not report deletions: look again for the indexes.
            self.retry = true;
        }
        self.retry |= objects::remove_finalizer(&self.claims, claim, DATA_CLAIM_FINALIZER).await?
            == FinalizerPatch::Stale;
        Ok(())
    }
}

/// Whether the template waits: paused itself (unless handed to bitpool), or its Cluster paused.
fn template_paused(template: &Metal3DataTemplate, ctx: &Context, namespace: &str) -> bool {
    let cluster = objects::cluster_name(Some(&template.spec.cluster_name), template.meta());
    objects::is_paused(template.meta())
        || cluster.is_some_and(|cluster| ctx.cluster_paused(namespace, cluster))
}

/// The templates of `cluster`'s namespace that belong to it (as [`template_paused`] finds their
/// Cluster), when it pauses none: a Cluster's unpause is no change of its templates. A Cluster
/// that pauses them gives them nothing to do, nor does it to one paused by its own annotation.
pub fn unpaused_by(
    templates: &Store<Metal3DataTemplate>,
    cluster: &Cluster,
) -> Vec<ObjectRef<Metal3DataTemplate>> {
    let (Some(namespace), Some(name)) = (
        cluster.meta().namespace.as_deref(),
        cluster.meta().name.as_deref(),
    ) else {
        return Vec::new();
    };
    if objects::cluster_is_paused(cluster) {
        return Vec::new();
    }
    templates
        .state()
        .into_iter()
        .filter(|t| {
            t.meta().namespace.as_deref() == Some(namespace)
                && !objects::is_paused(t.meta())
                && objects::cluster_name(Some(&t.spec.cluster_name), t.meta()) == Some(name)
        })
        .map(|t| ObjectRef::from_obj(&*t))
        .collect()
}

/// The templates a Metal3Data's removal may concern, since a removal names no object: the
/// deleting ones (they wait for their last Metal3Data), and those with a live claim bound to a
/// Metal3Data no longer cached (they make it again).
pub fn after_data_removal(ctx: &Context) -> Vec<ObjectRef<Metal3DataTemplate>> {
    let deleting = ctx
        .data_templates
        .state()
        .into_iter()
        .filter(|t| t.meta().deletion_timestamp.is_some())
        .map(|t| ObjectRef::from_obj(&*t));
    let bound_to_missing = |claim: &Metal3DataClaim| {
        let data = super::data::data_of_claim(claim)?;
        ctx.datas.get(&data).is_none().then_some(())
    };
    let stranded = ctx
        .data_claims
        .state()
        .into_iter()
        .filter(|c| c.meta().deletion_timestamp.is_none() && bound_to_missing(c).is_some())
        .filter_map(|c| super::data::template_of(&c.spec.template, c.meta().namespace.as_deref()))
        .filter(|t| ctx.data_templates.get(t).is_some());
    deleting.chain(stranded).collect()
}

/// The index a claim was bound to before its Metal3Data existed (crash or race recovery).
fn reserved_index(claim: &Metal3DataClaim, template: &str) -> Option<i64> {
    let rendered = claim.status.as_ref()?.rendered_data.as_ref()?;
    index_of(template, rendered.name.as_deref()?)
}

fn claim_points_at(claim: &Metal3DataClaim, data: &str) -> bool {
    claim
        .status
        .as_ref()
        .and_then(|s| s.rendered_data.as_ref())
        .and_then(|r| r.name.as_deref())
        == Some(data)
}

/// Points the claim at `data`, only if the claim has not changed since it was read. Returns
/// whether the write happened.
async fn bind(
    claims: &Api<Metal3DataClaim>,
    claim: &Metal3DataClaim,
    data: &str,
) -> Result<bool, Error> {
    let patch = json!({
        "metadata": { "resourceVersion": claim.meta().resource_version },
        "status": {
            "renderedData": { "name": data, "namespace": claim.namespace() },
            "errorMessage": null,
        },
    });
    match claims
        .patch_status(
            &claim.name_any(),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.is_conflict() || s.is_not_found() => Ok(false),
        Err(e) => Err(Error::api(
            Verb::PatchStatus,
            object_of(claims, &claim.name_any()),
            e,
        )),
    }
}

/// Binds the claim to an index and creates its Metal3Data. Returns false when another writer
/// got there first (the caller looks again).
async fn create_data(
    template: &Metal3DataTemplate,
    claim: &Metal3DataClaim,
    taken: &mut BTreeSet<i64>,
    datas: &Api<Metal3Data>,
    claims: &Api<Metal3DataClaim>,
) -> Result<bool, Error> {
    let template_name = template.name_any();
    let index = match reserved_index(claim, &template_name) {
        // Created by an earlier pass that did not finish, or reserved by this claim.
        Some(index) => index,
        None => {
            let index = lowest_free(taken);
            if !bind(claims, claim, &data_name(&template_name, index)).await? {
                return Ok(false);
            }
            index
        }
    };
    taken.insert(index);
    let data = new_data(template, claim, index);
    match datas.create(&PostParams::default(), &data).await {
        Ok(_) => {
            tracing::info!(claim = %claim.name_any(), index, "created Metal3Data");
            Ok(true)
        }
        Err(kube::Error::Api(s)) if s.is_already_exists() => {
            // Either this claim's own Metal3Data from an earlier pass, or another claim won the
            // index: unbind so that the next pass picks again unless the data is ours.
            let existing = objects::get_optional(datas, &data.name_any()).await?;
            let ours = existing
                .as_ref()
                .is_some_and(|d| d.spec.claim.name.as_deref() == Some(&claim.name_any()));
            if !ours {
                tracing::info!(claim = %claim.name_any(), index, "index taken by another claim; choosing again");
                unbind(claims, claim).await?;
            }
            Ok(false)
        }
        Err(e) => Err(Error::api(
            Verb::Create,
            object_of(datas, &data.name_any()),
            e,
        )),
    }
}

/// The Metal3Data of `claim` at `index`: owned by the template (as controller), the claim and
/// the claim's Metal3Machine, with the claim's labels.
fn new_data(template: &Metal3DataTemplate, claim: &Metal3DataClaim, index: i64) -> Metal3Data {
    let template_name = template.name_any();
    let namespace = claim.namespace();
    let mut owners: Vec<_> = [
        objects::owner_reference(template, true),
        objects::owner_reference(claim, false),
    ]
    .into_iter()
    .flatten()
    .collect();
    let machines = claim.meta().owner_references.iter().flatten();
    owners.extend(
        machines
            .filter(|o| o.kind == "Metal3Machine")
            .map(|o| OwnerReference {
                controller: Some(false),
                ..o.clone()
            }),
    );
    // A Metal3Data of a template handed to bitpool is handed over too, from its creation on:
    // CAPM3's own Metal3Data controller never acts on it.
    let annotations = objects::handed_to_bitpool(template.meta()).then(|| {
        BTreeMap::from([(
            labels::PAUSED.to_string(),
            labels::HANDED_TO_BITPOOL.to_string(),
        )])
    });
    Metal3Data {
        metadata: ObjectMeta {
            name: Some(data_name(&template_name, index)),
            namespace: namespace.clone(),
            labels: claim.meta().labels.clone(),
            annotations,
            finalizers: Some(vec![DATA_CLAIM_FINALIZER.to_string()]),
            owner_references: Some(owners),
            ..Default::default()
        },
        spec: Metal3DataSpec {
            index,
            claim: Metal3ObjectRef {
                name: Some(claim.name_any()),
                namespace: namespace.clone(),
            },
            template: Metal3ObjectRef {
                name: Some(template_name),
                namespace,
            },
            ..Default::default()
        },
        status: None,
    }
}

/// Clears the claim's chosen Metal3Data, so that the next pass chooses an index again.
async fn unbind(claims: &Api<Metal3DataClaim>, claim: &Metal3DataClaim) -> Result<(), Error> {
    let name = claim.name_any();
    let fresh = claims.get(&name).await.call(Verb::Get, claims, &name)?;
    let patch = json!({
        "metadata": { "resourceVersion": fresh.meta().resource_version },
        "status": { "renderedData": null },
    });
    // A claim changed meanwhile is chosen for again on its event.
    let _ = claims
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
        .await;
    Ok(())
}

/// `status.indexes` (claim name → index) as the Metal3Data say, `lastUpdated` when it changes.
async fn write_indexes(
    ctx: &Context,
    template: &Metal3DataTemplate,
    datas: &[Arc<Metal3Data>],
) -> Result<(), Error> {
    let by_claim: BTreeMap<String, i64> = datas
        .iter()
        .filter(|d| d.meta().deletion_timestamp.is_none())
        .filter_map(|d| Some((d.spec.claim.name.clone()?, d.spec.index)))
        .collect();
    let indexes: Vec<IndexEntry> = by_claim
        .into_iter()
        .map(|(name, index)| IndexEntry { name, index })
        .collect();
    let current = template
        .status
        .as_ref()
        .map(|s| s.indexes.clone())
        .unwrap_or_default();
    if current == indexes {
        return Ok(());
    }
    let api: Api<Metal3DataTemplate> = Api::namespaced(
        ctx.client.clone(),
        &template.namespace().unwrap_or_default(),
    );
    // A list: a merge patch replaces it whole.
    let patch = json!({ "status": { "indexes": indexes, "lastUpdated": objects::now() } });
    objects::merge_status(&api, &template.name_any(), patch).await
}

/// Metal3DataClaims the template reconciler never sees: their template does not exist, or is in
/// another namespace. They get an error message a person can act on, and a claim that is being
/// deleted loses bitpool's finalizer so that it can go.
pub async fn reconcile_claim(
    claim: Arc<Metal3DataClaim>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let namespace = claim
        .namespace()
        .ok_or_else(|| Error::MissingNamespace(claim.name_any()))?;
    let template = claim.spec.template.name.clone().unwrap_or_default();
    let problem = match claim.spec.template.namespace.as_deref() {
        _ if template.is_empty() => Some("spec.template.name is required".to_string()),
        Some(other) if !other.is_empty() && other != namespace => Some(format!(
            "spec.template.namespace must be empty or {namespace}, not {other}"
        )),
        _ if ctx
            .data_templates
            .get(&ObjectRef::new(&template).within(&namespace))
            .is_none() =>
        {
            Some(format!("Metal3DataTemplate {template} not found"))
        }
        _ => None,
    };
    let Some(problem) = problem else {
        return Ok(Action::await_change()); // the template's reconciler serves it
    };
    let claims: Api<Metal3DataClaim> = Api::namespaced(ctx.client.clone(), &namespace);
    if claim.meta().deletion_timestamp.is_some() {
        objects::remove_finalizer(&claims, &claim, DATA_CLAIM_FINALIZER).await?;
        return Ok(Action::await_change());
    }
    let current = claim.status.as_ref().and_then(|s| s.error_message.as_ref());
    if current != Some(&problem) {
        let patch = json!({ "status": { "errorMessage": problem } });
        objects::merge_status(&claims, &claim.name_any(), patch).await?;
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_fill_gaps_from_zero() {
        assert_eq!(lowest_free(&BTreeSet::new()), 0);
        assert_eq!(lowest_free(&BTreeSet::from([0, 1, 3])), 2);
        assert_eq!(lowest_free(&BTreeSet::from([1, 2])), 0);
        assert_eq!(lowest_free(&BTreeSet::from([0, 1, 2])), 3);
    }

    #[test]
    fn data_names_round_trip_to_indexes() {
        assert_eq!(index_of("workers", &data_name("workers", 12)), Some(12));
        assert_eq!(index_of("workers", "workers-x"), None);
        assert_eq!(index_of("workers", "workers-ab-1"), None);
        assert_eq!(index_of("workers-ab", "workers-ab-1"), Some(1));
        assert_eq!(index_of("workers", "other-1"), None);
        assert_eq!(index_of("workers", "workers--1"), None);
    }
}
