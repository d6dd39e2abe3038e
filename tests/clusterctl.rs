//! bitpool installed as operators install Cluster API providers: the real clusterctl (built from
//! the Go module proxy by hack/tools.sh) with a local repository (hack/clusterctl-repo.sh) holding
//! bitpool's release artifacts beside Cluster API core, kubeadm, CAPM3 and Metal3 IPAM rendered
//! from their own modules. On a control plane of the test's own (clusterctl installs webhooks for
//! which no pod runs here), with a stand-in for cert-manager: its kinds, which is all clusterctl
//! checks. `generate provider`, `init`, `upgrade plan`, `upgrade apply` and `delete`, and nothing
//! another provider owns is touched.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use bitpool::api::capi_pools::InClusterIPPool;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use support::clusterctl::{Clusterctl, install_cert_manager_stand_in};
use support::eventually;
use support::plane::Dedicated;

const PROVIDER_LABEL: &str = "cluster.x-k8s.io/provider";

/// Every CRD: its resourceVersion and provider label.
async fn crds(client: &Client) -> BTreeMap<String, (String, String)> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let list = api
        .list(&ListParams::default())
        .await
        .expect("list the CRDs");
    list.items
        .into_iter()
        .map(|crd| {
            let provider = crd
                .labels()
                .get(PROVIDER_LABEL)
                .cloned()
                .unwrap_or_default();
            let version = crd.resource_version().unwrap_or_default();
            (crd.name_any(), (version, provider))
        })
        .collect()
}

/// The CRDs of providers other than bitpool, once they stop changing (the API server finishes
/// establishing them a moment after they are created).
async fn others(client: &Client) -> BTreeMap<String, (String, String)> {
    let of_others = |all: BTreeMap<String, (String, String)>| -> BTreeMap<_, _> {
        all.into_iter()
            .filter(|(_, (_, provider))| !provider.starts_with("ipam-bitpool"))
            .collect()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut last = of_others(crds(client).await);
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = of_others(crds(client).await);
        if now == last {
            return now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the CRDs kept changing for 60 s"
        );
        last = now;
    }
}

fn documents(yaml: &str) -> Vec<serde_json::Value> {
    serde_saphyr::from_multiple::<serde_json::Value>(yaml)
        .expect("the generated components parse")
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn crd_names(objects: &[serde_json::Value]) -> Vec<String> {
    let mut names: Vec<String> = objects
        .iter()
        .filter(|o| o["kind"] == "CustomResourceDefinition")
        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    names.sort();
    names
}

/// `generate provider`: every variable described, and the components carry only the kinds the
/// provider owns, in its namespace, with a canonical image and the variables' defaults.
fn generated_components_are_what_each_role_owns(clusterctl: &Clusterctl) {
    let described = clusterctl.run(&["generate", "provider", "--ipam", "bitpool", "--describe"]);
    eprintln!("clusterctl generate provider --ipam bitpool --describe:\n{described}");
    for variable in [
        "BITPOOL_LOG_LEVEL",
        "BITPOOL_REFUSE_OVERLAPPING_POOLS",
        "CAPI_DIAGNOSTICS_ADDRESS",
        "CAPI_INSECURE_DIAGNOSTICS",
    ] {
        assert!(
            described.contains(variable),
            "{variable} missing:\n{described}"
        );
    }
    assert!(
        described.contains("registry.bitpool.dev/bitpool/bitpool:v0.2.1"),
        "{described}"
    );
    let capi = documents(&clusterctl.run(&["generate", "provider", "--ipam", "bitpool"]));
    assert_eq!(
        crd_names(&capi),
        [
            "globalinclusterippools.ipam.cluster.x-k8s.io",
            "globalinclusterprefixpools.ipam.cluster.x-k8s.io",
            "inclusterippools.ipam.cluster.x-k8s.io",
            "inclusterprefixpools.ipam.cluster.x-k8s.io"
        ]
    );
    for object in &capi {
        let namespace = object["metadata"]["namespace"].as_str();
        assert!(
            namespace.is_none() || namespace == Some("bitpool-system"),
            "{object}"
        );
        assert!(
            !object.to_string().contains("${"),
            "a variable left unsubstituted: {object}"
        );
    }
    let deployment = capi
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("a Deployment");
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    for arg in [
        "--controllers=capi-ipam",
        "--insecure-diagnostics=false",
        "--diagnostics-address=:8443",
        "--leader-elect",
    ] {
        assert!(args.contains(arg), "{arg} missing in {args}");
    }
    let bundle =
        documents(&clusterctl.run(&["generate", "provider", "--ipam", "bitpool-baremetal"]));
    let names = crd_names(&bundle);
    assert_eq!(names.len(), 7, "{names:?}");
    assert!(
        names
            .iter()
            .all(|n| n.ends_with(".ipam.cluster.x-k8s.io") || n.ends_with(".ipam.metal3.io")),
        "the bundle carries another provider's kinds: {names:?}"
    );
}

async fn deployment_image(client: &Client) -> String {
    let api: Api<Deployment> = Api::namespaced(client.clone(), "bitpool-system");
    let deployment = api
        .get("bitpool-controller-manager")
        .await
        .expect("bitpool's Deployment");
    deployment
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.image)
        .unwrap_or_default()
}

/// No pod runs here to answer bitpool's webhooks: their configuration goes before the test
/// writes a pool (clusterctl brings it back with each install).
async fn remove_webhooks(client: &Client) {
    let webhooks: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    webhooks
        .delete(
            "bitpool-validating-webhook-configuration",
            &DeleteParams::default(),
        )
        .await
        .expect("remove the webhook configuration");
}

/// A pool created while v0.2.0 is installed.
async fn create_pool(client: &Client) {
    remove_webhooks(client).await;
    let pools: Api<InClusterIPPool> = Api::namespaced(client.clone(), "default");
    let pool: InClusterIPPool = serde_json::from_value(serde_json::json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1alpha2",
        "kind": "InClusterIPPool",
        "metadata": { "name": "kept" },
        "spec": { "addresses": ["10.80.0.0/24"], "prefix": 24, "gateway": "10.80.0.1" }
    }))
    .expect("a pool");
    eventually("the pool is created", Duration::from_secs(30), || async {
        pools.create(&PostParams::default(), &pool).await.ok()
    })
    .await;
}

/// A deleted CRD goes once the API server has removed its objects.
async fn crd_gone(client: &Client, name: &str) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    eventually(
        &format!("{name} to be deleted"),
        Duration::from_secs(60),
        || async { matches!(api.get_opt(name).await, Ok(None)).then_some(()) },
    )
    .await;
}

fn assert_untouched(
    before: &BTreeMap<String, (String, String)>,
    after: &BTreeMap<String, (String, String)>,
    step: &str,
) {
    for (name, was) in before {
        assert_eq!(
            after.get(name),
            Some(was),
            "{step} touched {name} (resourceVersion, provider)"
        );
    }
}

#[tokio::test]
async fn clusterctl_installs_upgrades_and_deletes_bitpool_beside_capm3() {
    let plane = Dedicated::start("clusterctl");
    let client = plane.client().await;
    install_cert_manager_stand_in(&client).await;
    let clusterctl = Clusterctl::new(&plane);
    generated_components_are_what_each_role_owns(&clusterctl);

    // Cluster API and CAPM3 first, as a Metal3 management cluster has them.
    clusterctl
        .init(&client, &["--infrastructure", "metal3"])
        .await;
    let before = others(&client).await;
    assert_eq!(
        before
            .get("metal3datas.infrastructure.cluster.x-k8s.io")
            .map(|(_, p)| p.as_str()),
        Some("infrastructure-metal3")
    );

    // The CAPI IPAM provider, one release behind; upgrade plan offers the next one.
    clusterctl
        .init(&client, &["--ipam", "bitpool:v0.2.0"])
        .await;
    let installed = crds(&client).await;
    for pool in [
        "inclusterippools",
        "globalinclusterippools",
        "inclusterprefixpools",
        "globalinclusterprefixpools",
    ] {
        let name = format!("{pool}.ipam.cluster.x-k8s.io");
        assert_eq!(
            installed.get(&name).map(|(_, p)| p.as_str()),
            Some("ipam-bitpool"),
            "{name}"
        );
    }
    assert_untouched(&before, &others(&client).await, "init --ipam bitpool");
    let plan = clusterctl.run(&["upgrade", "plan"]);
    let line = plan
        .lines()
        .find(|l| l.starts_with("ipam-bitpool "))
        .unwrap_or_else(|| panic!("no ipam-bitpool in the plan:\n{plan}"));
    let columns: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(columns[columns.len() - 2..], ["v0.2.0", "v0.2.1"], "{plan}");

    create_pool(&client).await;
    clusterctl.run(&[
        "upgrade",
        "apply",
        "--ipam",
        "bitpool-system/bitpool:v0.2.1",
    ]);
    assert!(deployment_image(&client).await.ends_with(":v0.2.1"));
    let pools: Api<InClusterIPPool> = Api::namespaced(client.clone(), "default");
    assert!(
        pools
            .get_opt("kept")
            .await
            .expect("read the pool")
            .is_some(),
        "the upgrade lost a pool"
    );
    assert_untouched(&before, &others(&client).await, "upgrade apply");

    remove_webhooks(&client).await;
    pools
        .delete("kept", &DeleteParams::default())
        .await
        .expect("delete the pool");
    clusterctl.run(&["delete", "--ipam", "bitpool", "--include-crd"]);
    for pool in [
        "inclusterippools",
        "globalinclusterippools",
        "inclusterprefixpools",
        "globalinclusterprefixpools",
    ] {
        crd_gone(&client, &format!("{pool}.ipam.cluster.x-k8s.io")).await;
    }
    assert_untouched(&before, &others(&client).await, "delete --ipam bitpool");

    // Switching from Metal3 IPAM: its provider goes (its CRDs and objects stay), the bundle
    // takes the kinds over; deleting the bundle with its CRDs leaves CAPM3 alone.
    clusterctl.init(&client, &["--ipam", "metal3"]).await;
    clusterctl.run(&["delete", "--ipam", "metal3"]);
    let before = others(&client).await;
    clusterctl
        .init(&client, &["--ipam", "bitpool-baremetal"])
        .await;
    let adopted = crds(&client).await;
    assert_eq!(
        adopted
            .get("ippools.ipam.metal3.io")
            .map(|(_, p)| p.as_str()),
        Some("ipam-bitpool-baremetal")
    );
    let still_others: BTreeMap<_, _> = before
        .into_iter()
        .filter(|(name, _)| !name.ends_with(".ipam.metal3.io"))
        .collect();
    assert_untouched(
        &still_others,
        &others(&client).await,
        "init --ipam bitpool-baremetal",
    );
    clusterctl.run(&["delete", "--ipam", "bitpool-baremetal", "--include-crd"]);
    crd_gone(&client, "ippools.ipam.metal3.io").await;
    let after = crds(&client).await;
    assert_untouched(
        &still_others,
        &others(&client).await,
        "delete --ipam bitpool-baremetal",
    );
    for name in [
        "metal3datas.infrastructure.cluster.x-k8s.io",
        "metal3datatemplates.infrastructure.cluster.x-k8s.io",
        "ipaddressclaims.ipam.cluster.x-k8s.io",
    ] {
        assert!(after.contains_key(name), "{name} was deleted with bitpool");
    }
}
