//! bitpool on a Cluster API 1.10 installation: IPAddressClaim, IPAddress, Cluster and Machine
//! served at v1beta1 only (the upstream CRDs of CAPI 1.10, pinned in hack/versions.env). bitpool
//! picks v1beta1 from discovery, serves claims, and writes conditions in v1beta1's shape.
//!
//! The CRDs are cluster-wide, so this binary replaces them for its run (the next binary's set-up
//! installs the current ones again; v1beta1 stays in their versions).

mod support;

use std::time::Duration;

use bitpool::api::capi::{self, ContractVersion, IPAddress, IPAddressClaim};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use support::build::*;
use support::check::*;
use support::wait::*;
use support::{Bitpool, Env, TestNamespace, eventually, read_crds, upstream_crds_dir};

const CAPI_1_10: [&str; 4] = [
    "ipam.cluster.x-k8s.io_ipaddressclaims.yaml",
    "ipam.cluster.x-k8s.io_ipaddresses.yaml",
    "cluster.x-k8s.io_clusters.yaml",
    "cluster.x-k8s.io_machines.yaml",
];

/// Deletes every object of `crd` (without waiting for finalizers) and the CRD itself.
async fn remove_crd(client: &Client, crd: &CustomResourceDefinition) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().unwrap_or_default();
    let _ = crds.delete(&name, &DeleteParams::default()).await;
    eventually(
        &format!("CRD {name} is gone"),
        Duration::from_secs(120),
        || {
            let crds = crds.clone();
            let name = name.clone();
            async move {
                let current = crds.get_opt(&name).await.ok()?;
                let Some(current) = current else {
                    return Some(());
                };
                // The API server deletes the objects; finalizers nobody removes would hold them.
                if let Some(version) = current.spec.versions.iter().find(|v| v.served) {
                    let resource = ApiResource {
                        group: current.spec.group.clone(),
                        version: version.name.clone(),
                        api_version: format!("{}/{}", current.spec.group, version.name),
                        kind: current.spec.names.kind.clone(),
                        plural: current.spec.names.plural.clone(),
                    };
                    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
                    if let Ok(list) = api.list(&ListParams::default()).await {
                        for object in list.items.iter().filter(|o| !o.finalizers().is_empty()) {
                            let api: Api<DynamicObject> = Api::namespaced_with(
                                client.clone(),
                                &object.namespace().unwrap_or_default(),
                                &resource,
                            );
                            let clear = Patch::Merge(json!({"metadata": {"finalizers": null}}));
                            let _ = api
                                .patch(&object.name_any(), &PatchParams::default(), &clear)
                                .await;
                        }
                    }
                }
                None
            }
        },
    )
    .await;
}

#[tokio::test]
async fn claims_are_served_at_v1beta1_with_v1beta1_conditions() {
    let client = support::client().await;
    let upstream = upstream_crds_dir();
    // The current CRDs first (bitpool's own among them), then CAPI 1.10's in place of CAPI's.
    support::install_all_crds(&client).await;
    let old: Vec<CustomResourceDefinition> = CAPI_1_10
        .iter()
        .flat_map(|file| read_crds(&upstream.join("cluster-api-v1.10").join(file)))
        .collect();
    for crd in &old {
        remove_crd(&client, crd).await;
    }
    support::install_crds(&client, &old).await;
    assert_eq!(
        bitpool::crds::served_contract_version(&client)
            .await
            .expect("discovery"),
        ContractVersion::V1Beta1
    );
    capi::select_contract_version(ContractVersion::V1Beta1).expect("first choice of this process");

    let env = Env {
        client: client.clone(),
        ns: TestNamespace::new(&client, "v1beta1").await,
    };
    let bitpool = Bitpool::start(env.name(), &[]);
    capi_pool(&env, "p", capi_spec(&["10.40.0.1-10.40.0.2"], 24)).await;
    for name in ["a", "b", "c"] {
        claim(&env, name, "InClusterIPPool", "p").await;
    }
    for name in ["a", "b"] {
        wait_claim(&env, name, "Ready", |c| c.status == "True").await;
    }
    let exhausted = wait_claim(&env, "c", "exhausted", |c| {
        c.reason == capi::reasons::POOL_EXHAUSTED
    })
    .await;
    assert_eq!(exhausted.status, "False");

    // What a CAPI 1.10 client sees: v1beta1 conditions, the metav1 ones under status.v1beta2.
    let raw: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        env.name(),
        &ApiResource::erase::<IPAddressClaim>(&()),
    );
    let a = raw.get("a").await.expect("claim a");
    assert_eq!(
        a.types.as_ref().map(|t| t.api_version.as_str()),
        Some("ipam.cluster.x-k8s.io/v1beta1")
    );
    let ready = &a.data["status"]["conditions"][0];
    assert_eq!(
        (ready["type"].as_str(), ready["status"].as_str()),
        (Some("Ready"), Some("True"))
    );
    assert!(
        ready.get("severity").is_none() && ready.get("observedGeneration").is_none(),
        "{ready}"
    );
    assert_eq!(
        a.data["status"]["v1beta2"]["conditions"][0]["reason"],
        "AddressAllocated"
    );
    assert_eq!(a.data["status"]["addressRef"]["name"], "a");
    let c = raw.get("c").await.expect("claim c");
    let waiting = &c.data["status"]["conditions"][0];
    assert_eq!(
        (waiting["severity"].as_str(), waiting["reason"].as_str()),
        (Some("Warning"), Some("PoolExhausted")),
        "{waiting}"
    );

    let address = env.api::<IPAddress>().get("a").await.expect("address a");
    assert_eq!(
        (
            address.spec.address.as_str(),
            address.spec.pool_ref.api_group.as_str()
        ),
        ("10.40.0.1", capi::GROUP)
    );

    // Freed addresses go to the waiting claim; then nothing is written at rest.
    env.api::<IPAddressClaim>()
        .delete("a", &DeleteParams::default())
        .await
        .expect("delete a");
    wait_claim(&env, "c", "Ready", |c| c.status == "True").await;
    assert_quiet_at_rest(&env, 5).await;
    assert_warnings_name_objects(&bitpool);
    let log = std::fs::read_to_string(&bitpool.log).unwrap_or_default();
    assert!(log.contains("v1beta1"), "the chosen version is logged");
}
