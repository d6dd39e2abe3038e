//! Round trips against a real API server: every kind bitpool serves, from a realistic manifest
//! with every field set, is created, read back and compared, as raw JSON (the server kept every
//! field) and through bitpool's types (the types hold every field). CAPI IPAddressClaim and
//! IPAddress written through bitpool's types round-trip through the upstream CAPI CRDs. The CRDs'
//! own validation rejects malformed objects with a message that names the field.

mod support;

use std::fmt::Debug;

use bitpool::api::{capi, capi_pools, metal3_data, metal3_ipam};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

fn fixture(name: &str, namespace: &str) -> Value {
    let path = support::root().join("tests/fixtures/roundtrip").join(name);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_saphyr::from_str(&text.replace("NAMESPACE", namespace))
        .unwrap_or_else(|e| panic!("parse {name}: {e}"))
}

/// Creates `manifest` as a `K`, writes its status through the status subresource, reads it back,
/// and checks that spec and status survived unchanged, raw and typed.
async fn round_trip<K>(api: Api<K>, client: &Client, namespace: &str, mut manifest: Value)
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    let kind = K::kind(&()).to_string();
    // Cluster-scoped objects share one namespace-less space across test runs: make the name unique.
    let name = format!(
        "{}-{namespace}",
        manifest["metadata"]["name"]
            .as_str()
            .expect("fixture has a name")
    );
    manifest["metadata"]["name"] = json!(name);

    let typed: K = serde_json::from_value(manifest.clone())
        .unwrap_or_else(|e| panic!("{kind}: types parse the fixture: {e}"));
    let reserialized = serde_json::to_value(&typed).expect("serializes");
    for part in ["spec", "status"] {
        assert_eq!(
            reserialized[part], manifest[part],
            "{kind}: bitpool's types do not keep every {part} field"
        );
    }

    let resource = ApiResource::erase::<K>(&());
    let namespaced = api.resource_url().contains("/namespaces/");
    let raw_api: Api<DynamicObject> = if namespaced {
        Api::namespaced_with(client.clone(), namespace, &resource)
    } else {
        Api::all_with(client.clone(), &resource)
    };
    api.create(&PostParams::default(), &typed)
        .await
        .unwrap_or_else(|e| panic!("{kind}: create: {e}"));
    if manifest.get("status").is_some() {
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": manifest["status"]})),
        )
        .await
        .unwrap_or_else(|e| panic!("{kind}: status patch: {e}"));
    }

    let stored = raw_api
        .get(&name)
        .await
        .unwrap_or_else(|e| panic!("{kind}: read back: {e}"));
    for part in ["spec", "status"] {
        assert_eq!(
            stored.data[part], manifest[part],
            "{kind}: the server did not keep {part} as written"
        );
    }
    let read_back: K = api.get(&name).await.expect("typed read");
    assert_eq!(
        serde_json::to_value(&read_back).expect("serializes")["spec"],
        manifest["spec"],
        "{kind}: typed read"
    );

    if !namespaced {
        api.delete(&name, &DeleteParams::default())
            .await
            .expect("clean up cluster-scoped object");
    }
}

#[tokio::test]
async fn every_served_kind_round_trips_with_every_field_set() {
    let client = support::client().await;
    support::install_all_crds(&client).await;
    let ns = support::TestNamespace::new(&client, "roundtrip").await;
    let n = ns.name.as_str();
    round_trip(
        Api::<capi_pools::InClusterIPPool>::namespaced(client.clone(), n),
        &client,
        n,
        fixture("inclusterippool.yaml", n),
    )
    .await;
    round_trip(
        Api::<capi_pools::GlobalInClusterIPPool>::all(client.clone()),
        &client,
        n,
        fixture("globalinclusterippool.yaml", n),
    )
    .await;
    round_trip(
        Api::<metal3_ipam::IPPool>::namespaced(client.clone(), n),
        &client,
        n,
        fixture("ippool.yaml", n),
    )
    .await;
    round_trip(
        Api::<metal3_ipam::IPClaim>::namespaced(client.clone(), n),
        &client,
        n,
        fixture("ipclaim.yaml", n),
    )
    .await;
    round_trip(
        Api::<metal3_ipam::Metal3IPAddress>::namespaced(client.clone(), n),
        &client,
        n,
        fixture("ipaddress-metal3.yaml", n),
    )
    .await;
    round_trip(
        Api::<metal3_data::Metal3DataTemplate>::namespaced(client.clone(), n),
        &client,
        n,
        fixture("metal3datatemplate.yaml", n),
    )
    .await;
    round_trip(
        Api::<metal3_data::Metal3Data>::namespaced(client.clone(), n),
        &client,
        n,
        fixture("metal3data.yaml", n),
    )
    .await;
    round_trip(
        Api::<metal3_data::Metal3DataClaim>::namespaced(client.clone(), n),
        &client,
        n,
        fixture("metal3dataclaim.yaml", n),
    )
    .await;
}

fn time(s: &str) -> Time {
    serde_json::from_value(json!(s)).expect("a valid timestamp")
}

/// IPAddressClaim and IPAddress written through bitpool's types, stored by the upstream CAPI CRDs.
#[tokio::test]
async fn capi_claims_and_addresses_round_trip_through_the_upstream_crds() {
    let client = support::client().await;
    support::install_all_crds(&client).await;
    let ns = support::TestNamespace::new(&client, "roundtrip-capi").await;
    let pool_ref = capi::IPPoolReference {
        name: "workers-v4".into(),
        kind: "InClusterIPPool".into(),
        api_group: capi::GROUP.into(),
    };
    let mut claim = capi::IPAddressClaim::new(
        "node-0",
        capi::IPAddressClaimSpec {
            cluster_name: Some("edge-1".into()),
            pool_ref: pool_ref.clone(),
        },
    );
    claim.status = Some(capi::IPAddressClaimStatus {
        conditions: vec![Condition {
            type_: capi::READY_CONDITION.into(),
            status: "False".into(),
            reason: capi::reasons::POOL_EXHAUSTED.into(),
            message: "pool workers-v4 has no free address".into(),
            last_transition_time: time("2026-11-30T04:00:00Z"),
            observed_generation: Some(1),
        }],
        address_ref: Some(capi::LocalObjectName {
            name: "node-0".into(),
        }),
        deprecated: Some(capi::IPAddressClaimDeprecatedStatus {
            v1beta1: Some(capi::IPAddressClaimV1Beta1Status {
                conditions: vec![capi::V1Beta1Condition {
                    type_: "Ready".into(),
                    status: "False".into(),
                    severity: Some("Warning".into()),
                    last_transition_time: time("2026-11-30T04:00:00Z"),
                    reason: Some("PoolExhausted".into()),
                    message: Some("no free address".into()),
                }],
            }),
        }),
    });
    let claims: Api<capi::IPAddressClaim> = Api::namespaced(client.clone(), &ns.name);
    claims
        .create(&PostParams::default(), &claim)
        .await
        .expect("create claim");
    let status = json!({ "status": claim.status });
    claims
        .patch_status("node-0", &PatchParams::default(), &Patch::Merge(status))
        .await
        .expect("claim status");
    let stored = claims.get("node-0").await.expect("read claim");
    assert_eq!(stored.spec, claim.spec);
    assert_eq!(stored.status, claim.status);

    let address = capi::IPAddress::new(
        "node-0",
        capi::IPAddressSpec {
            claim_ref: capi::LocalObjectName {
                name: "node-0".into(),
            },
            pool_ref,
            address: "10.20.0.11".into(),
            prefix: 22,
            gateway: Some("10.20.0.1".into()),
        },
    );
    let addresses: Api<capi::IPAddress> = Api::namespaced(client.clone(), &ns.name);
    addresses
        .create(&PostParams::default(), &address)
        .await
        .expect("create address");
    assert_eq!(
        addresses.get("node-0").await.expect("read address").spec,
        address.spec
    );
}

/// bitpool's standalone IPAddressClaim/IPAddress CRDs are valid for the server (checked by a
/// server-side dry run, which leaves the installed upstream CRDs in place).
#[tokio::test]
async fn standalone_capi_crds_are_accepted_by_the_server() {
    let client = support::client().await;
    support::install_all_crds(&client).await;
    let api: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    let mut params = PatchParams::apply("bitpool-test").force();
    params.dry_run = true;
    for crd in bitpool::crds::standalone() {
        api.patch(&crd.name_any(), &params, &Patch::Apply(&crd))
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", crd.name_any()));
    }
}

/// Creates `manifest` and returns the API server's refusal message.
async fn rejection(
    client: &Client,
    namespace: &str,
    resource: ApiResource,
    manifest: Value,
) -> String {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    let object: DynamicObject = serde_json::from_value(manifest).expect("a dynamic object");
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => panic!("the API server accepted an invalid {}", resource.kind),
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{}", status.message);
            status.message
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[tokio::test]
async fn malformed_objects_are_rejected_with_the_crd_validation_message() {
    let client = support::client().await;
    support::install_all_crds(&client).await;
    let ns = support::TestNamespace::new(&client, "roundtrip-invalid").await;
    let ippool = ApiResource::erase::<metal3_ipam::IPPool>(&());
    let incluster = ApiResource::erase::<capi_pools::InClusterIPPool>(&());
    let template = ApiResource::erase::<metal3_data::Metal3DataTemplate>(&());
    let cases = [
        (
            ippool.clone(),
            json!({"apiVersion": "ipam.metal3.io/v1alpha1", "kind": "IPPool", "metadata": {"name": "no-prefix"},
                   "spec": {"pools": [{"start": "10.0.0.1"}]}}),
            vec!["spec.namePrefix", "Required value"],
        ),
        (
            ippool,
            json!({"apiVersion": "ipam.metal3.io/v1alpha1", "kind": "IPPool", "metadata": {"name": "bad-gateway"},
                   "spec": {"namePrefix": "p", "gateway": "300.1.1.1"}}),
            vec!["spec.gateway", "should match"],
        ),
        (
            incluster.clone(),
            json!({"apiVersion": "ipam.cluster.x-k8s.io/v1alpha2", "kind": "InClusterIPPool", "metadata": {"name": "big-prefix"},
                   "spec": {"addresses": ["10.0.0.0/24"], "prefix": 129}}),
            vec!["spec.prefix", "less than or equal to 128"],
        ),
        (
            incluster,
            json!({"apiVersion": "ipam.cluster.x-k8s.io/v1alpha2", "kind": "InClusterIPPool", "metadata": {"name": "no-addresses"},
                   "spec": {"prefix": 24}}),
            vec!["spec.addresses", "Required value"],
        ),
        (
            template,
            json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "Metal3DataTemplate", "metadata": {"name": "wifi"},
                   "spec": {"clusterName": "c", "networkData": {"links": {"ethernets": [
                       {"type": "wifi", "id": "wlan0", "macAddress": {"string": "00:11:22:33:44:55"}}]}}}}),
            vec![
                "spec.networkData.links.ethernets",
                "Unsupported value: \"wifi\"",
            ],
        ),
    ];
    for (resource, manifest, expected) in cases {
        let name = manifest["metadata"]["name"].clone();
        let message = rejection(&client, &ns.name, resource, manifest).await;
        for fragment in expected {
            assert!(
                message.contains(fragment),
                "{name}: {message:?} lacks {fragment:?}"
            );
        }
    }
}
