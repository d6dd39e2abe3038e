//! Small, shared operations on Kubernetes objects: finalizers (written with the object's
//! resourceVersion so a stale cache cannot overwrite a newer object), conditions, owner
//! references and pause checks.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use kube::Resource;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams};
use serde::de::DeserializeOwned;
use serde_json::json;

use super::cached::{Meta, Owner, Uid};
use super::error::{Call, Error, Verb, object_of};
use crate::api::labels;

/// Whether `meta` lists `finalizer`.
pub fn has_finalizer(meta: &ObjectMeta, finalizer: &str) -> bool {
    meta.finalizers.iter().flatten().any(|f| f == finalizer)
}

/// What a finalizer patch found.
#[derive(Debug, PartialEq, Eq)]
pub enum FinalizerPatch {
    Done,
    /// The object changed since it was read (409) or is gone (404): read it again.
    Stale,
}

/// An object's finalizers as last read, with what a patch of them needs: its name, and the
/// resourceVersion the patch is conditional on.
pub struct Finalizers<'a, I> {
    pub name: &'a str,
    pub resource_version: &'a str,
    pub current: I,
}

impl<'a, I: Iterator<Item = &'a str>> Finalizers<'a, I> {
    /// Makes `finalizer` present or absent, unless the object changed since it was read.
    pub async fn set<K>(
        self,
        api: &Api<K>,
        finalizer: &str,
        present: bool,
    ) -> Result<FinalizerPatch, Error>
    where
        K: Resource + Clone + DeserializeOwned + Debug,
    {
        let mut finalizers = Vec::new();
        let mut had = false;
        for f in self.current {
            if f == finalizer {
                had = true;
            } else {
                finalizers.push(f.to_string());
            }
        }
        if had == present {
            return Ok(FinalizerPatch::Done);
        }
        if present {
            finalizers.push(finalizer.to_string());
        }
        let patch = json!({
            "metadata": {
                "resourceVersion": (!self.resource_version.is_empty()).then_some(self.resource_version),
                "finalizers": finalizers,
            }
        });
        match api
            .patch(self.name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => Ok(FinalizerPatch::Done),
            Err(kube::Error::Api(status)) if status.is_conflict() || status.is_not_found() => {
                Ok(FinalizerPatch::Stale)
            }
            Err(e) => Err(Error::api(Verb::Patch, object_of(api, self.name), e)),
        }
    }
}

/// Makes `finalizer` present on `object` or absent, unless it changed since it was read.
pub async fn set_finalizer<K>(
    api: &Api<K>,
    object: &K,
    finalizer: &str,
    present: bool,
) -> Result<FinalizerPatch, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let meta = object.meta();
    let listed = Finalizers {
        name: meta.name.as_deref().unwrap_or_default(),
        resource_version: meta.resource_version.as_deref().unwrap_or_default(),
        current: meta.finalizers.iter().flatten().map(String::as_str),
    };
    listed.set(api, finalizer, present).await
}

/// Adds `finalizer` to `object` (see [`set_finalizer`]).
pub async fn add_finalizer<K>(
    api: &Api<K>,
    object: &K,
    finalizer: &str,
) -> Result<FinalizerPatch, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    set_finalizer(api, object, finalizer, true).await
}

/// Removes `finalizer` from `object` (see [`set_finalizer`]).
pub async fn remove_finalizer<K>(
    api: &Api<K>,
    object: &K,
    finalizer: &str,
) -> Result<FinalizerPatch, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    set_finalizer(api, object, finalizer, false).await
}

/// Merge-patches `name` (metadata or spec).
pub async fn merge_patch<K>(api: &Api<K>, name: &str, patch: serde_json::Value) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(|_| ())
        .call(Verb::Patch, api, name)
}

/// `Some(object)`, `None` when it does not exist.
pub async fn get_optional<K>(api: &Api<K>, name: &str) -> Result<Option<K>, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    api.get_opt(name).await.call(Verb::Get, api, name)
}

/// Deletes `name`; one already gone is fine.
pub async fn delete_ignoring_missing<K>(api: &Api<K>, name: &str) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
        Err(e) => Err(Error::api(Verb::Delete, object_of(api, name), e)),
    }
}

/// Merge-patches `status` of `name`; an object deleted meanwhile needs no status.
pub async fn merge_status<K>(
    api: &Api<K>,
    name: &str,
    patch: serde_json::Value,
) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    match api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
        Err(e) => Err(Error::api(Verb::PatchStatus, object_of(api, name), e)),
    }
}

/// The status patch that makes `status.indexes` (claim name → address, on Metal3 IPPools) equal
/// `next`. A merge patch merges maps, so claims no longer listed are
/// written as null.
pub fn indexes_patch<V: serde::Serialize>(
    current: &BTreeMap<String, V>,
    next: &BTreeMap<String, V>,
    last_updated: Time,
) -> serde_json::Value {
    let mut indexes: serde_json::Map<String, serde_json::Value> = current
        .keys()
        .map(|k| (k.clone(), serde_json::Value::Null))
        .collect();
    indexes.extend(next.iter().map(|(k, v)| (k.clone(), json!(v))));
    json!({ "status": { "indexes": indexes, "lastUpdated": last_updated } })
}

/// How long ago `then` was at `now`; zero for a time still to come (a clock that was ahead
/// wrote it), never the distance to it.
pub fn elapsed(then: k8s_openapi::jiff::Timestamp, now: k8s_openapi::jiff::Timestamp) -> Duration {
    Duration::try_from(now.duration_since(then)).unwrap_or(Duration::ZERO)
}

/// Now on the API server's clock (see [`crate::client::clock`]): what other processes read.
pub fn now() -> Time {
    Time(crate::client::clock::now())
}

/// A condition of `type_`, True or False, stamped now (see [`now`]).
pub fn condition(
    type_: &str,
    ready: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if ready { "True" } else { "False" }.to_string(),
        reason: reason.to_string(),
        message,
        last_transition_time: now(),
        observed_generation: generation,
    }
}

/// Puts `new` into `conditions`, keeping the transition time when the status does not change.
/// Returns whether anything but the time changed.
pub fn set_condition(conditions: &mut Vec<Condition>, mut new: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(existing) => {
            let same = existing.status == new.status
                && existing.reason == new.reason
                && existing.message == new.message
                && existing.observed_generation == new.observed_generation;
            if same {
                return false;
            }
            if existing.status == new.status {
                new.last_transition_time = existing.last_transition_time.clone();
            }
            *existing = new;
            true
        }
        None => {
            conditions.push(new);
            true
        }
    }
}

/// How many items a message names; the rest are counted.
const NAMED_IN_MESSAGES: usize = 5;

/// The first few of `items` joined by `separator`, and how many more there are.
pub fn first_few(items: &[String], separator: &str) -> String {
    let shown = items
        .iter()
        .take(NAMED_IN_MESSAGES)
        .cloned()
        .collect::<Vec<_>>()
        .join(separator);
    match items.len().saturating_sub(NAMED_IN_MESSAGES) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}

/// Removes the condition of `type_`; whether there was one.
pub fn remove_condition(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    conditions.len() != before
}

/// An owner reference to `owner`; `controller` marks the managing owner.
pub fn owner_reference<K: Resource<DynamicType = ()>>(
    owner: &K,
    controller: bool,
) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: K::api_version(&()).to_string(),
        kind: K::kind(&()).to_string(),
        name: owner.meta().name.clone()?,
        uid: owner.meta().uid.clone()?,
        controller: Some(controller),
        block_owner_deletion: Some(true),
    })
}

/// The API group of an `apiVersion` (`""` for the core group).
fn api_group(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

/// Whether two owner references name the same owner: kind, API group and name (a restored
/// owner has a new UID, and another version of its API names the same object).
fn same_owner(a: &OwnerReference, b: &OwnerReference) -> bool {
    names_same_owner([&a.api_version, &a.kind, &a.name], b)
}

/// [`same_owner`], for a reference given as its API version, kind and name.
fn names_same_owner([api_version, kind, name]: [&str; 3], b: &OwnerReference) -> bool {
    kind == b.kind && name == b.name && api_group(api_version) == api_group(&b.api_version)
}

/// Whether the cached object `existing` already carries all that `desired` asks, so that
/// [`adoption_patch`] would write nothing: every desired owner is the first reference to that
/// owner and equal to it, no other owner is a controller, and every desired finalizer and label
/// is there. `true` only where the patch is `None`; an unusual object (a stale reference, a
/// foreign controller) gets `false` and the full comparison. Nothing is allocated: a reconcile
/// asks it of every address object its pool serves.
pub fn carries(existing: &Meta, desired: &ObjectMeta) -> bool {
    let wanted = || desired.owner_references.iter().flatten();
    let same =
        |o: &Owner, d: &OwnerReference| names_same_owner([o.api_version(), o.kind(), &o.name], d);
    let owners_equal = wanted().all(|d| {
        (existing.owners()).find(|o| same(o, d)).is_some_and(|o| {
            o.api_version() == d.api_version
                && o.uid == Uid::of(&d.uid)
                && o.controller == d.controller
                && o.block_owner_deletion == d.block_owner_deletion
        })
    });
    let no_other_controller = existing
        .owners()
        .all(|o| !o.is_controller() || wanted().any(|d| same(o, d)));
    owners_equal
        && no_other_controller
        && (desired.finalizers.iter().flatten()).all(|f| existing.has_finalizer(f))
        && (desired.labels.iter().flatten()).all(|(k, v)| existing.label(k) == Some(v.as_str()))
}

/// The merge patch that gives an existing object what `desired` says every such object carries:
/// its owner references (an outdated reference to the same owner replaced in place, others
/// kept), finalizers and labels — added, never removed. `None` when nothing is missing. The
/// patch names the object's resourceVersion: a change made meanwhile fails it with a conflict
/// instead of being overwritten.
pub fn adoption_patch(existing: &ObjectMeta, desired: &ObjectMeta) -> Option<serde_json::Value> {
    let mut owners = existing.owner_references.clone().unwrap_or_default();
    // An object has at most one controller: a foreign one stays, and ours is added beside it.
    let foreign_controller = owners.iter().any(|o| {
        o.controller == Some(true)
            && !desired
                .owner_references
                .iter()
                .flatten()
                .any(|d| same_owner(o, d))
    });
    for wanted in desired.owner_references.iter().flatten() {
        let mut wanted = wanted.clone();
        if foreign_controller {
            wanted.controller = Some(false);
        }
        match owners.iter_mut().find(|o| same_owner(o, &wanted)) {
            Some(present) => *present = wanted,
            None => owners.push(wanted),
        }
    }
    let mut finalizers = existing.finalizers.clone().unwrap_or_default();
    for wanted in desired.finalizers.iter().flatten() {
        if !finalizers.contains(wanted) {
            finalizers.push(wanted.clone());
        }
    }
    let labels: BTreeMap<&String, &String> = desired
        .labels
        .iter()
        .flatten()
        .filter(|(key, value)| existing.labels.as_ref().and_then(|l| l.get(*key)) != Some(value))
        .collect();

    let mut metadata = serde_json::Map::new();
    if Some(&owners) != existing.owner_references.as_ref() && !owners.is_empty() {
        metadata.insert("ownerReferences".into(), json!(owners));
    }
    if Some(&finalizers) != existing.finalizers.as_ref() && !finalizers.is_empty() {
        metadata.insert("finalizers".into(), json!(finalizers));
    }
    if !labels.is_empty() {
        metadata.insert("labels".into(), json!(labels));
    }
    if metadata.is_empty() {
        return None;
    }
    metadata.insert("resourceVersion".into(), json!(existing.resource_version));
    Some(json!({ "metadata": metadata }))
}

/// Whether the object is paused for bitpool: the pause annotation with any value but
/// [`labels::HANDED_TO_BITPOOL`] (which pauses everyone else).
pub fn is_paused(meta: &ObjectMeta) -> bool {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(labels::PAUSED))
        .is_some_and(|value| value != labels::HANDED_TO_BITPOOL)
}

/// Whether a Cluster pauses what belongs to it (`spec.paused`, or its pause annotation).
pub fn cluster_is_paused(cluster: &crate::api::capi::Cluster) -> bool {
    cluster.spec.paused == Some(true) || is_paused(cluster.meta())
}

/// Whether the object is paused for every controller but bitpool.
pub fn handed_to_bitpool(meta: &ObjectMeta) -> bool {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(labels::PAUSED))
        .is_some_and(|value| value == labels::HANDED_TO_BITPOOL)
}

/// The Cluster an object belongs to: its explicit cluster name, else the cluster-name label.
pub fn cluster_name<'a>(explicit: Option<&'a str>, meta: &'a ObjectMeta) -> Option<&'a str> {
    explicit.filter(|n| !n.is_empty()).or_else(|| {
        meta.labels
            .as_ref()
            .and_then(|l| l.get(labels::CLUSTER_NAME))
            .map(String::as_str)
    })
}

/// Labels with `key=value` added.
pub fn with_label(
    labels: Option<&BTreeMap<String, String>>,
    key: &str,
    value: &str,
) -> BTreeMap<String, String> {
    let mut out = labels.cloned().unwrap_or_default();
    out.insert(key.to_string(), value.to_string());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_condition_keeps_the_transition_time_of_an_unchanged_status() {
        let mut conditions = vec![];
        assert!(set_condition(
            &mut conditions,
            condition("Ready", false, "PoolExhausted", "full".into(), Some(1))
        ));
        let first = conditions[0].last_transition_time.clone();
        assert!(!set_condition(
            &mut conditions,
            condition("Ready", false, "PoolExhausted", "full".into(), Some(1))
        ));
        assert!(set_condition(
            &mut conditions,
            condition(
                "Ready",
                false,
                "PoolExhausted",
                "still full".into(),
                Some(1)
            )
        ));
        assert_eq!(conditions[0].last_transition_time, first);
        assert!(set_condition(
            &mut conditions,
            condition("Ready", true, "AddressAllocated", "ok".into(), Some(1))
        ));
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].status, "True");
    }

    fn owner(kind: &str, name: &str, uid: &str, controller: bool) -> OwnerReference {
        OwnerReference {
            api_version: "ipam.cluster.x-k8s.io/v1beta2".into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            controller: Some(controller),
            block_owner_deletion: Some(true),
        }
    }

    fn desired() -> ObjectMeta {
        ObjectMeta {
            owner_references: Some(vec![
                owner("IPAddressClaim", "c", "claim-uid", true),
                owner("InClusterIPPool", "p", "pool-uid", false),
            ]),
            finalizers: Some(vec!["ipam.cluster.x-k8s.io/ProtectAddress".into()]),
            labels: Some(BTreeMap::from([(
                labels::CLUSTER_NAME.to_string(),
                "k".to_string(),
            )])),
            ..Default::default()
        }
    }

    #[test]
    fn adoption_adds_what_is_missing_after_foreign_owners_and_keeps_the_rest() {
        let foreign = OwnerReference {
            api_version: "alpha-dummy".into(),
            kind: "dummy-kind".into(),
            name: "dummy-name".into(),
            uid: "abc".into(),
            ..Default::default()
        };
        let existing = ObjectMeta {
            resource_version: Some("7".into()),
            owner_references: Some(vec![foreign.clone()]),
            finalizers: Some(vec!["example.com/keep".into()]),
            labels: Some(BTreeMap::from([("team".to_string(), "a".to_string())])),
            ..Default::default()
        };
        let patch = adoption_patch(&existing, &desired()).expect("something is missing");
        let expected_owners = json!([
            foreign,
            owner("IPAddressClaim", "c", "claim-uid", true),
            owner("InClusterIPPool", "p", "pool-uid", false),
        ]);
        assert_eq!(patch["metadata"]["ownerReferences"], expected_owners);
        assert_eq!(
            patch["metadata"]["finalizers"],
            json!(["example.com/keep", "ipam.cluster.x-k8s.io/ProtectAddress"])
        );
        assert_eq!(
            patch["metadata"]["labels"],
            json!({ labels::CLUSTER_NAME: "k" })
        );
        assert_eq!(patch["metadata"]["resourceVersion"], json!("7"));
    }

    #[test]
    fn adoption_of_a_complete_object_writes_nothing() {
        let mut existing = desired();
        existing.resource_version = Some("7".into());
        assert_eq!(adoption_patch(&existing, &desired()), None);
    }

    #[test]
    fn adoption_replaces_a_stale_reference_to_the_same_owner_and_defers_to_a_foreign_controller() {
        // A claim restored from a backup has a new UID; the old reference names the same claim.
        let mut existing = desired();
        existing.owner_references = Some(vec![
            owner("IPAddressClaim", "c", "old-uid", true),
            owner("InClusterIPPool", "p", "pool-uid", false),
        ]);
        let patch = adoption_patch(&existing, &desired()).expect("a stale UID");
        assert_eq!(
            patch["metadata"]["ownerReferences"][0]["uid"],
            json!("claim-uid")
        );
        assert_eq!(patch["metadata"].get("finalizers"), None);

        let mut foreign = owner("Machine", "m", "machine-uid", true);
        foreign.api_version = "cluster.x-k8s.io/v1beta2".into();
        existing.owner_references = Some(vec![foreign]);
        let patch = adoption_patch(&existing, &desired()).expect("owners missing");
        let owners = patch["metadata"]["ownerReferences"]
            .as_array()
            .expect("owners");
        assert_eq!(owners.len(), 3);
        assert!(
            owners
                .iter()
                .filter(|o| o["controller"] == json!(true))
                .count()
                == 1
        );
    }

    /// The shortcut a reconcile takes ([`carries`]) is `true` for a complete object, and only
    /// where the full comparison writes nothing.
    #[test]
    fn an_object_carries_what_is_desired_only_where_adoption_writes_nothing() {
        let mut foreign = owner("Machine", "m", "machine-uid", true);
        foreign.api_version = "cluster.x-k8s.io/v1beta2".into();
        let with = |change: &dyn Fn(&mut ObjectMeta)| {
            let mut meta = desired();
            meta.name = Some("c".into());
            meta.namespace = Some("ns".into());
            meta.resource_version = Some("7".into());
            change(&mut meta);
            meta
        };
        let cases = [
            ("complete", with(&|_| {}), true),
            (
                "a label and a finalizer of others too",
                with(&|m| {
                    m.finalizers
                        .get_or_insert_default()
                        .push("example.com/keep".into());
                    m.labels
                        .get_or_insert_default()
                        .insert("team".into(), "a".into());
                }),
                true,
            ),
            ("no owners", with(&|m| m.owner_references = None), false),
            (
                "a stale UID",
                with(&|m| {
                    m.owner_references = Some(vec![
                        owner("IPAddressClaim", "c", "old-uid", true),
                        owner("InClusterIPPool", "p", "pool-uid", false),
                    ])
                }),
                false,
            ),
            (
                "not the controller",
                with(&|m| {
                    m.owner_references = Some(vec![
                        owner("IPAddressClaim", "c", "claim-uid", false),
                        owner("InClusterIPPool", "p", "pool-uid", false),
                    ])
                }),
                false,
            ),
            (
                "a foreign controller beside",
                with(&|m| {
                    m.owner_references
                        .get_or_insert_default()
                        .push(foreign.clone())
                }),
                false,
            ),
            ("no finalizer", with(&|m| m.finalizers = None), false),
            (
                "another cluster label",
                with(&|m| {
                    m.labels = Some(BTreeMap::from([(labels::CLUSTER_NAME.into(), "x".into())]))
                }),
                false,
            ),
        ];
        for (what, existing, expected) in cases {
            let cached = Meta::of(&existing).expect("named and namespaced");
            let carried = carries(&cached, &desired());
            assert_eq!(carried, expected, "{what}");
            if carried {
                assert_eq!(adoption_patch(&existing, &desired()), None, "{what}");
                assert_eq!(
                    adoption_patch(&cached.object_meta(), &desired()),
                    None,
                    "{what}"
                );
            } else {
                assert!(adoption_patch(&existing, &desired()).is_some(), "{what}");
            }
        }
    }

    #[test]
    fn cluster_name_prefers_the_explicit_field() {
        let meta = ObjectMeta {
            labels: Some(BTreeMap::from([(
                labels::CLUSTER_NAME.to_string(),
                "from-label".to_string(),
            )])),
            ..Default::default()
        };
        assert_eq!(cluster_name(Some("explicit"), &meta), Some("explicit"));
        assert_eq!(cluster_name(None, &meta), Some("from-label"));
        assert_eq!(cluster_name(Some(""), &ObjectMeta::default()), None);
    }
}
