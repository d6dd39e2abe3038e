//! Small, shared operations on Kubernetes objects: finalizers (written with the object's
//! resourceVersion so a stale cache cannot overwrite a newer object), conditions, owner
//! references and pause checks.

use std::collections::BTreeMap;
use std::fmt::Debug;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

use super::error::Error;
use crate::api::labels;

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

async fn patch_finalizers<K>(
    api: &Api<K>,
    object: &K,
    finalizers: Vec<String>,
) -> Result<FinalizerPatch, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let patch = json!({
        "metadata": {
            "resourceVersion": object.meta().resource_version,
            "finalizers": finalizers,
        }
    });
    match api
        .patch(
            &object.name_any(),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
    {
        Ok(_) => Ok(FinalizerPatch::Done),
        Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => {
            Ok(FinalizerPatch::Stale)
        }
        Err(e) => Err(Error::Kube(e)),
    }
}

/// Makes `finalizer` present on `object` or absent from it; a no-op when it already is.
pub async fn set_finalizer<K>(
    api: &Api<K>,
    object: &K,
    finalizer: &str,
    present: bool,
) -> Result<FinalizerPatch, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    if has_finalizer(object.meta(), finalizer) == present {
        return Ok(FinalizerPatch::Done);
    }
    let mut finalizers: Vec<String> = object
        .finalizers()
        .iter()
        .filter(|f| *f != finalizer)
        .cloned()
        .collect();
    if present {
        finalizers.push(finalizer.to_string());
    }
    patch_finalizers(api, object, finalizers).await
}

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
        .map_err(Error::Kube)
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
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(Error::Kube(e)),
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

pub fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

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
