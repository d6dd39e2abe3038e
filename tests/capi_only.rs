//! A cluster without Metal3: only the CRDs the `capi-ipam` group needs (bitpool's four pool
//! kinds, and Cluster API's IPAddressClaim, IPAddress and Cluster), as the `bitpool` clusterctl
//! provider installs them beside Cluster API core, served by `bitpool run --controllers
//! capi-ipam`. Every other test installs every CRD, so none of them can see a code path that
//! reads a Metal3 kind where there is none.

mod support;

use std::time::Duration;

use bitpool::api::capi::{IPAddress, IPAddressClaim};
use bitpool::api::capi_pools::{
    GlobalInClusterIPPool, GlobalInClusterPrefixPool, InClusterIPPool, InClusterPrefixPool,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Resource;
use kube::api::{Api, DeleteParams};
use support::build::{
    capi_pool, capi_spec, claim, global_pool, global_prefix_pool, prefix_pool, prefix_spec,
};
use support::plane::Dedicated;
use support::wait::wait_claim;
use support::{Bitpool, Env, TestNamespace, eventually, install_crds, read_crds};

const WAIT: Duration = Duration::from_secs(60);

async fn wait_gone<K>(api: &Api<K>, name: &str)
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    eventually(&format!("{name} to be gone"), WAIT, || async {
        matches!(api.get_opt(name).await, Ok(None)).then_some(())
    })
    .await
}

/// Pools of all four kinds serve a claim each, release it, and go when deleted: no step reads
/// a Metal3 kind (a pool deletion used to list Metal3 IPAddresses and stay Terminating for ever
/// on a 404).
#[tokio::test]
async fn pools_of_every_capi_kind_serve_and_go_without_the_metal3_crds() {
    let plane = Dedicated::start("capi-only");
    let client = plane.client().await;
    install_crds(&client, &capi_ipam_crds()).await;
    let env = Env {
        client: client.clone(),
        ns: TestNamespace::in_cluster(&client, &plane.kubeconfig, "capi-only").await,
    };
    let bitpool = Bitpool::start_in(
        &plane.kubeconfig,
        "capi-only",
        &["--controllers", "capi-ipam"],
    );

    capi_pool(&env, "ip", capi_spec(&["10.80.0.0/24"], 24)).await;
    prefix_pool(&env, "prefix", prefix_spec(&["fd00:80::/56"], 64)).await;
    let global = global_pool(&env, "ip", capi_spec(&["10.81.0.0/24"], 24)).await;
    let global_prefix =
        global_prefix_pool(&env, "prefix", prefix_spec(&["fd00:81::/56"], 64)).await;
    let pools = [
        ("on-ip", "InClusterIPPool", "ip"),
        ("on-prefix", "InClusterPrefixPool", "prefix"),
        ("on-global", "GlobalInClusterIPPool", global.as_str()),
        (
            "on-global-prefix",
            "GlobalInClusterPrefixPool",
            global_prefix.as_str(),
        ),
    ];
    for (name, kind, pool) in pools {
        claim(&env, name, kind, pool).await;
    }
    for (name, _, _) in pools {
        wait_claim(&env, name, "served", |c| c.status == "True").await;
    }

    // A pool with an address allocated waits for it; its claim gone, the pool goes too.
    let claims: Api<IPAddressClaim> = env.api();
    let addresses: Api<IPAddress> = env.api();
    for (name, _, _) in pools {
        claims
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete claim");
    }
    env.api::<InClusterIPPool>()
        .delete("ip", &DeleteParams::default())
        .await
        .expect("delete pool");
    env.api::<InClusterPrefixPool>()
        .delete("prefix", &DeleteParams::default())
        .await
        .expect("delete pool");
    Api::<GlobalInClusterIPPool>::all(client.clone())
        .delete(&global, &DeleteParams::default())
        .await
        .expect("delete pool");
    Api::<GlobalInClusterPrefixPool>::all(client.clone())
        .delete(&global_prefix, &DeleteParams::default())
        .await
        .expect("delete pool");
    for (name, _, _) in pools {
        wait_gone(&claims, name).await;
        wait_gone(&addresses, name).await;
    }
    wait_gone(&env.api::<InClusterIPPool>(), "ip").await;
    wait_gone(&env.api::<InClusterPrefixPool>(), "prefix").await;
    wait_gone(&Api::<GlobalInClusterIPPool>::all(client.clone()), &global).await;
    wait_gone(
        &Api::<GlobalInClusterPrefixPool>::all(client.clone()),
        &global_prefix,
    )
    .await;
    let log = std::fs::read_to_string(&bitpool.log).expect("bitpool's log");
    assert!(
        !log.contains("ipam.metal3.io") && !log.contains("404 page not found"),
        "bitpool reached for a Metal3 kind (log: {:?})",
        bitpool.log
    );
    assert!(
        !log.contains(REFUSED_STREAM),
        "this server streams lists, and bitpool fell back to listing (log: {:?})",
        bitpool.log
    );
}

/// What bitpool logs when the server will not stream a list.
const REFUSED_STREAM: &str = "the API server does not stream lists; listing instead";

/// The CRDs of the `capi-ipam` group: bitpool's four pool kinds and Cluster API's claim,
/// address and Cluster.
fn capi_ipam_crds() -> Vec<CustomResourceDefinition> {
    let upstream = support::upstream_crds_dir();
    let mut crds: Vec<_> = bitpool::crds::served()
        .into_iter()
        .filter(|crd| crd.spec.group == "ipam.cluster.x-k8s.io")
        .collect();
    assert_eq!(crds.len(), 4, "bitpool's four CAPI pool kinds");
    for file in [
        "ipam.cluster.x-k8s.io_ipaddressclaims.yaml",
        "ipam.cluster.x-k8s.io_ipaddresses.yaml",
        "cluster.x-k8s.io_clusters.yaml",
    ] {
        crds.extend(read_crds(&upstream.join("cluster-api").join(file)));
    }
    crds
}

/// A server that will not stream lists (the WatchList feature off, as before Kubernetes 1.34
/// but in 1.32): bitpool lists instead, and its caches hold what was there before it started
/// and what comes after.
#[tokio::test]
async fn a_server_that_does_not_stream_lists_is_listed() {
    let plane = Dedicated::start_with("no-watch-list", "--feature-gates=WatchList=false");
    let client = plane.client().await;
    install_crds(&client, &capi_ipam_crds()).await;
    let env = Env {
        client: client.clone(),
        ns: TestNamespace::in_cluster(&client, &plane.kubeconfig, "no-watch-list").await,
    };
    capi_pool(&env, "ip", capi_spec(&["10.82.0.0/24"], 24)).await;
    claim(&env, "before", "InClusterIPPool", "ip").await;
    let bitpool = Bitpool::start_in(
        &plane.kubeconfig,
        "no-watch-list",
        &["--controllers", "capi-ipam"],
    );
    wait_claim(&env, "before", "served", |c| c.status == "True").await;
    claim(&env, "after", "InClusterIPPool", "ip").await;
    wait_claim(&env, "after", "served", |c| c.status == "True").await;
    let addresses: Vec<String> = env
        .api::<IPAddress>()
        .list(&Default::default())
        .await
        .expect("list address objects")
        .items
        .into_iter()
        .map(|a| a.spec.address)
        .collect();
    assert_eq!(
        addresses.len(),
        2,
        "one address object per claim: {addresses:?}"
    );
    assert_ne!(addresses[0], addresses[1]);
    let log = std::fs::read_to_string(&bitpool.log).expect("bitpool's log");
    for kind in ["IPAddressClaim", "IPAddress"] {
        assert!(
            log.lines()
                .any(|l| l.contains(REFUSED_STREAM) && l.contains(&format!("kind={kind} "))),
            "no fallback to a list logged for {kind} (log: {:?})",
            bitpool.log
        );
    }
}
