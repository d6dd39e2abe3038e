//! Objects of any kind, by apiVersion and kind, in one namespace: the Metal3 tests make and read
//! Cluster API, CAPM3 and baremetal-operator objects as plain JSON manifests. Each call fails the
//! test with the call and the object it was about.

use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::Value;

use super::stack::resource;

pub fn api(client: &Client, namespace: &str, api_version: &str, kind: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &resource(api_version, kind))
}

/// Creates `object`, a full manifest (apiVersion, kind, metadata), in `namespace`.
pub async fn create(client: &Client, namespace: &str, object: Value) -> DynamicObject {
    let api_version = object["apiVersion"].as_str().expect("apiVersion");
    let kind = object["kind"].as_str().expect("kind");
    let object: DynamicObject = serde_json::from_value(object.clone()).expect("a manifest");
    api(client, namespace, api_version, kind)
        .create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("create {kind} {}: {e}", object.name_any()))
}

pub async fn get(
    client: &Client,
    namespace: &str,
    api_version: &str,
    kind: &str,
    name: &str,
) -> Option<DynamicObject> {
    api(client, namespace, api_version, kind)
        .get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("get {kind} {name}: {e}"))
}

pub async fn list(
    client: &Client,
    namespace: &str,
    api_version: &str,
    kind: &str,
) -> Vec<DynamicObject> {
    api(client, namespace, api_version, kind)
        .list(&ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("list {kind}: {e}"))
        .items
}
