//! The CAPI IPAM provider against a real API server with the upstream CAPI CRDs, driven by real
//! `bitpool run` processes.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bitpool::api::capi::{
    Cluster, ClusterSpec, IPAddress, IPAddressClaim, IPAddressSpec, LocalObjectName,
};
use bitpool::api::capi_pools::{
    ADDRESS_FINALIZER, CLAIM_FINALIZER, InClusterIPPool, InClusterIPPoolSpec, PoolSubnet,
};
use bitpool::api::labels::WATCH_FILTER as WATCH_FILTER_LABEL;
use bitpool::api::{AllocationStrategy, labels};
use bitpool::ipam::moving;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;
use support::build::{
    capi_pool, capi_spec, claim, claim_object, create_claim, create_claims, global_pool,
    with_gateway,
};
use support::check::{assert_consistent, ready};
use support::{Bitpool, Env, TestNamespace, eventually};

const WAIT: Duration = Duration::from_secs(60);

/// CAPI helpers on the shared test environment.
trait CapiEnv {
    fn pools(&self) -> Api<InClusterIPPool>;
    fn claims(&self) -> Api<IPAddressClaim>;
    fn addresses(&self) -> Api<IPAddress>;
    async fn cluster(&self, name: &str, paused: bool);
    async fn pause_cluster(&self, name: &str, paused: bool);
    async fn pause_pool(&self, name: &str, paused: bool);
    async fn wait_ready(&self, name: &str, status: &str, reason: Option<&str>) -> IPAddressClaim;
    async fn address(&self, name: &str) -> IPAddress;
    async fn pool_counts(&self, name: &str) -> (i64, i64, i64, i64);
    async fn wait_pool_counts(&self, name: &str, expected: (i64, i64, i64, i64));
    /// The message of the pool's Ready condition once it is False.
    async fn wait_pool_not_ready(&self, name: &str) -> String;
    async fn wait_gone<K>(&self, api: &Api<K>, name: &str)
    where
        K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug;
}

impl CapiEnv for Env {
    fn pools(&self) -> Api<InClusterIPPool> {
        Api::namespaced(self.client.clone(), self.name())
    }

    fn claims(&self) -> Api<IPAddressClaim> {
        Api::namespaced(self.client.clone(), self.name())
    }

    fn addresses(&self) -> Api<IPAddress> {
        Api::namespaced(self.client.clone(), self.name())
    }

    async fn cluster(&self, name: &str, paused: bool) {
        let cluster = Cluster {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(self.ns.name.clone()),
                ..Default::default()
            },
            spec: ClusterSpec {
                paused: Some(paused),
                ..Default::default()
            },
        };
        Api::<Cluster>::namespaced(self.client.clone(), self.name())
            .create(&PostParams::default(), &cluster)
            .await
            .expect("create cluster");
    }

    /// Sets the Cluster's `spec.paused`.
    async fn pause_cluster(&self, name: &str, paused: bool) {
        Api::<Cluster>::namespaced(self.client.clone(), self.name())
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"paused": paused}})),
            )
            .await
            .expect("pause or resume the Cluster");
    }

    /// Sets or removes the pool's pause annotation.
    async fn pause_pool(&self, name: &str, paused: bool) {
        let value = paused.then_some("");
        self.pools()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {labels::PAUSED: value}}})),
            )
            .await
            .expect("pause or resume the pool");
    }

    /// Waits until the claim's Ready condition has `status` (and `reason` if given).
    async fn wait_ready(&self, name: &str, status: &str, reason: Option<&str>) -> IPAddressClaim {
        let claims = self.claims();
        eventually(
            &format!("claim {name} Ready={status} {reason:?}"),
            WAIT,
            || {
                let claims = claims.clone();
                async move {
                    let claim = claims.get_opt(name).await.ok()??;
                    let ready = ready(&claim)?;
                    (ready.status == status && reason.is_none_or(|r| r == ready.reason))
                        .then_some(claim)
                }
            },
        )
        .await
    }

    async fn address(&self, name: &str) -> IPAddress {
        self.addresses().get(name).await.expect("IPAddress exists")
    }

    async fn pool_counts(&self, name: &str) -> (i64, i64, i64, i64) {
        let pool = self.pools().get(name).await.expect("pool");
        let c = pool.status.and_then(|s| s.ip_addresses).unwrap_or_default();
        (c.total, c.used, c.free, c.out_of_range)
    }

    async fn wait_pool_counts(&self, name: &str, expected: (i64, i64, i64, i64)) {
        eventually(
            &format!("pool {name} counts {expected:?}"),
            WAIT,
            || async { (self.pool_counts(name).await == expected).then_some(()) },
        )
        .await
    }

    async fn wait_pool_not_ready(&self, name: &str) -> String {
        eventually(&format!("pool {name} Ready=False"), WAIT, || async {
            let pool = self.pools().get(name).await.ok()?;
            let ready = pool
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Ready")?;
            (ready.status == "False").then_some(ready.message)
        })
        .await
    }

    async fn wait_gone<K>(&self, api: &Api<K>, name: &str)
    where
        K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        eventually(&format!("{name} to be gone"), WAIT, || async {
            matches!(api.get_opt(name).await, Ok(None)).then_some(())
        })
        .await
    }
}

#[tokio::test]
async fn a_claim_gets_an_address_per_the_contract() {
    let env = Env::new("capi-contract").await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    env.cluster("edge-1", false).await;
    env.cluster("edge-2", false).await;
    let pool = capi_pool(
        &env,
        "pool",
        with_gateway(capi_spec(&["10.1.0.0/24"], 24), "10.1.0.1"),
    )
    .await;
    let mut by_field = claim_object(&env, "node-0", "InClusterIPPool", "pool");
    by_field.spec.cluster_name = Some("edge-1".into());
    create_claim(&env, by_field).await;
    let mut by_label = claim_object(&env, "node-1", "InClusterIPPool", "pool");
    by_label
        .metadata
        .labels
        .get_or_insert_default()
        .insert(labels::CLUSTER_NAME.into(), "edge-2".into());
    create_claim(&env, by_label).await;

    let claim = env
        .wait_ready("node-0", "True", Some("AddressAllocated"))
        .await;
    assert!(
        claim
            .finalizers()
            .contains(&"ipam.cluster.x-k8s.io/ReleaseAddress".to_string())
    );
    assert_eq!(
        claim
            .status
            .as_ref()
            .and_then(|s| s.address_ref.as_ref())
            .map(|r| r.name.as_str()),
        Some("node-0")
    );
    let address = env.address("node-0").await;
    assert_eq!(
        address.spec.address, "10.1.0.2",
        "network .0 and gateway .1 are skipped"
    );
    assert_eq!(
        (address.spec.prefix, address.spec.gateway.as_deref()),
        (24, Some("10.1.0.1"))
    );
    assert_eq!(address.spec.claim_ref.name, "node-0");
    assert_eq!(address.spec.pool_ref, claim.spec.pool_ref);
    assert_eq!(
        address.finalizers(),
        ["ipam.cluster.x-k8s.io/ProtectAddress"]
    );
    assert_eq!(
        address
            .labels()
            .get(labels::CLUSTER_NAME)
            .map(String::as_str),
        Some("edge-1")
    );
    let owners = address.owner_references();
    let claim_owner = owners
        .iter()
        .find(|o| o.kind == "IPAddressClaim")
        .expect("owned by the claim");
    assert_eq!(
        (claim_owner.controller, claim_owner.block_owner_deletion),
        (Some(true), Some(true))
    );
    assert_eq!(claim_owner.uid, claim.uid().unwrap_or_default());
    let pool_owner = owners
        .iter()
        .find(|o| o.kind == "InClusterIPPool")
        .expect("owned by the pool");
    assert_eq!(
        (pool_owner.controller, pool_owner.block_owner_deletion),
        (Some(false), Some(true))
    );
    assert_eq!(pool_owner.uid, pool.uid().unwrap_or_default());

    env.wait_ready("node-1", "True", None).await;
    let labelled = env.address("node-1").await;
    assert_eq!(labelled.spec.address, "10.1.0.3");
    assert_eq!(
        labelled
            .labels()
            .get(labels::CLUSTER_NAME)
            .map(String::as_str),
        Some("edge-2")
    );

    env.wait_pool_counts("pool", (253, 2, 251, 0)).await;
    let pool = env.pools().get("pool").await.expect("pool");
    assert!(
        pool.finalizers()
            .contains(&"ipam.cluster.x-k8s.io/ProtectPool".to_string())
    );
    let ready = pool
        .status
        .expect("status")
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready");
    assert_eq!(ready.status, "True");
}

#[tokio::test]
async fn claims_of_other_kinds_are_ignored_and_missing_pools_wait() {
    let env = Env::new("capi-ignore").await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    let mut foreign = claim_object(&env, "foreign", "InClusterIPPool", "pool");
    foreign.spec.pool_ref.api_group = "ipam.example.com".into();
    create_claim(&env, foreign).await;
    create_claim(
        &env,
        claim_object(&env, "other-kind", "SomeOtherPool", "pool"),
    )
    .await;
    claim(&env, "waiting", "InClusterIPPool", "pool").await;
    let waiting = env
        .wait_ready("waiting", "False", Some("PoolNotReady"))
        .await;
    let message = ready(&waiting)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("InClusterIPPool pool not found"),
        "{message}"
    );
    // Events are handled in order: once "waiting" was handled, the two earlier claims were too.
    for name in ["foreign", "other-kind"] {
        let claim = env.claims().get(name).await.expect("claim");
        assert!(claim.finalizers().is_empty(), "{name} was touched");
        assert!(claim.status.is_none(), "{name} got a status");
    }
    capi_pool(&env, "pool", capi_spec(&["10.2.0.10-10.2.0.20"], 24)).await;
    env.wait_ready("waiting", "True", None).await;
    assert_eq!(env.address("waiting").await.spec.address, "10.2.0.10");
}

#[tokio::test]
async fn an_invalid_pool_allocates_nothing_and_keeps_what_it_allocated() {
    let env = Env::new("capi-invalid").await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    capi_pool(&env, "pool", capi_spec(&["10.3.0.0/29"], 24)).await;
    claim(&env, "first", "InClusterIPPool", "pool").await;
    env.wait_ready("first", "True", None).await;

    env.pools()
        .patch(
            "pool",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"addresses": ["10.3.0.0/29", "10.3.0.x"]}})),
        )
        .await
        .expect("patch");
    let message = env.wait_pool_not_ready("pool").await;
    assert!(
        message.contains("addresses[1]") && message.contains("10.3.0.x"),
        "{message}"
    );
    claim(&env, "second", "InClusterIPPool", "pool").await;
    let second = env
        .wait_ready("second", "False", Some("PoolNotReady"))
        .await;
    assert!(
        ready(&second)
            .map(|c| c.message.clone())
            .unwrap_or_default()
            .contains("10.3.0.x")
    );
    assert_eq!(
        env.address("first").await.spec.address,
        "10.3.0.1",
        "the allocated address stays"
    );

    env.pools()
        .patch(
            "pool",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"addresses": ["10.3.0.0/29"]}})),
        )
        .await
        .expect("patch");
    env.wait_ready("second", "True", None).await;
    assert_eq!(env.address("second").await.spec.address, "10.3.0.2");
}

/// A pool of three subnets (racks): addresses go lowest first across them, exclusions and a
/// preallocation hold in any of them, each IPAddress has its subnet's prefix and gateway, and
/// the counts cover all. An update that makes two subnets overlap leaves the pool serving
/// nothing new, says which subnet, and keeps every address.
#[tokio::test]
async fn a_pool_of_several_subnets_serves_each_address_with_its_subnets_prefix_and_gateway() {
    let env = Env::new("capi-subnets").await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    let mut spec = with_gateway(capi_spec(&["10.7.0.10-10.7.0.11"], 24), "10.7.0.1");
    spec.excluded_addresses = vec!["10.7.1.11".into()];
    spec.pre_allocations = [("pinned".to_string(), "10.7.2.11".to_string())].into();
    let rack = |addresses: &str, prefix: i32, gateway: &str| PoolSubnet {
        addresses: vec![addresses.into()],
        prefix,
        gateway: Some(gateway.into()),
        dns_servers: Vec::new(),
    };
    spec.subnets = vec![
        rack("10.7.2.10-10.7.2.11", 24, "10.7.2.1"),
        rack("10.7.1.10-10.7.1.12", 25, "10.7.1.1"),
    ];
    capi_pool(&env, "racks", spec).await;
    let mut got = Vec::new();
    for name in ["c0", "c1", "c2", "c3", "c4"] {
        claim(&env, name, "InClusterIPPool", "racks").await;
        env.wait_ready(name, "True", None).await;
        let address = env.address(name).await.spec;
        got.push((
            address.address,
            address.prefix,
            address.gateway.unwrap_or_default(),
        ));
    }
    claim(&env, "pinned", "InClusterIPPool", "racks").await;
    env.wait_ready("pinned", "True", None).await;
    let pinned = env.address("pinned").await.spec;
    got.push((
        pinned.address,
        pinned.prefix,
        pinned.gateway.unwrap_or_default(),
    ));
    let want: Vec<(String, i32, String)> = [
        ("10.7.0.10", 24, "10.7.0.1"),
        ("10.7.0.11", 24, "10.7.0.1"),
        ("10.7.1.10", 25, "10.7.1.1"),
        ("10.7.1.12", 25, "10.7.1.1"),
        ("10.7.2.10", 24, "10.7.2.1"),
        ("10.7.2.11", 24, "10.7.2.1"),
    ]
    .iter()
    .map(|(a, p, g)| (a.to_string(), *p, g.to_string()))
    .collect();
    assert_eq!(got, want);
    env.wait_pool_counts("racks", (6, 6, 0, 0)).await;
    claim(&env, "c5", "InClusterIPPool", "racks").await;
    env.wait_ready("c5", "False", Some("PoolExhausted")).await;

    env.pools()
        .patch(
            "racks",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"subnets": [
                {"addresses": ["10.7.2.10-10.7.2.11"], "prefix": 24, "gateway": "10.7.2.1"},
                {"addresses": ["10.7.2.100"], "prefix": 23, "gateway": "10.7.2.1"}
            ]}})),
        )
        .await
        .expect("patch");
    let message = env.wait_pool_not_ready("racks").await;
    assert!(
        message
            .contains("subnets[1]: subnet 10.7.2.0/23 overlaps subnet 10.7.2.0/24 of subnets[0]"),
        "{message}"
    );
    for (name, (address, _, _)) in ["c0", "c1", "c2", "c3", "c4"].iter().zip(&want) {
        assert_eq!(
            &env.address(name).await.spec.address,
            address,
            "{name} keeps its address"
        );
    }
}

#[tokio::test]
async fn namespaced_pools_serve_their_namespace_and_global_pools_serve_all() {
    let env = Env::new("capi-scope").await;
    let client = env.client.clone();
    let other = TestNamespace::new(&client, "capi-scope-other").await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    let _other_bitpool = Bitpool::start(&other.name, &[]);
    // Same-named namespaced pools in two namespaces are independent.
    capi_pool(&env, "pool", capi_spec(&["10.4.0.1-10.4.0.9"], 24)).await;
    let other_env = Env {
        client: client.clone(),
        ns: other,
    };
    capi_pool(&other_env, "pool", capi_spec(&["10.4.0.1-10.4.0.9"], 24)).await;
    claim(&env, "a", "InClusterIPPool", "pool").await;
    claim(&other_env, "a", "InClusterIPPool", "pool").await;
    env.wait_ready("a", "True", None).await;
    other_env.wait_ready("a", "True", None).await;
    assert_eq!(env.address("a").await.spec.address, "10.4.0.1");
    assert_eq!(other_env.address("a").await.spec.address, "10.4.0.1");
    // A claim cannot use another namespace's pool.
    claim(&other_env, "lost", "InClusterIPPool", "only-in-first").await;
    capi_pool(&env, "only-in-first", capi_spec(&["10.4.1.1"], 24)).await;
    other_env
        .wait_ready("lost", "False", Some("PoolNotReady"))
        .await;

    // A global pool serves both namespaces from one address space. Both processes watch it
    // (its label names the first test namespace; the second process uses the same filter).
    let global = global_pool(&env, "global", capi_spec(&["10.4.9.1-10.4.9.2"], 24)).await;
    let global_claim = |env: &Env| claim_object(env, "g", "GlobalInClusterIPPool", &global);
    create_claim(&env, global_claim(&env)).await;
    let mut second = global_claim(&other_env);
    // The second namespace's claim carries the first namespace's watch filter, so that the
    // first process (which serves global pools with that filter) sees it too.
    second.metadata.labels = Some(BTreeMap::from([(
        WATCH_FILTER_LABEL.to_string(),
        env.name().to_string(),
    )]));
    create_claim(&other_env, second).await;
    let _all_namespaces = Bitpool::start_all_namespaces(env.name());
    env.wait_ready("g", "True", None).await;
    other_env.wait_ready("g", "True", None).await;
    let addresses: BTreeSet<String> = [env.address("g").await, other_env.address("g").await]
        .into_iter()
        .map(|a| a.spec.address)
        .collect();
    assert_eq!(
        addresses,
        BTreeSet::from(["10.4.9.1".to_string(), "10.4.9.2".to_string()])
    );
}

#[tokio::test]
async fn paused_clusters_claims_and_pools_are_skipped_until_resumed() {
    let env = Env::new("capi-pause").await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    capi_pool(&env, "pool", capi_spec(&["10.5.0.1-10.5.0.50"], 24)).await;
    env.cluster("paused", true).await;
    let mut by_cluster = claim_object(&env, "by-cluster", "InClusterIPPool", "pool");
    by_cluster.spec.cluster_name = Some("paused".into());
    create_claim(&env, by_cluster).await;
    let mut annotated = claim_object(&env, "by-annotation", "InClusterIPPool", "pool");
    annotated.metadata.annotations = Some(BTreeMap::from([(
        labels::PAUSED.to_string(),
        String::new(),
    )]));
    create_claim(&env, annotated).await;
    let mut no_cluster = claim_object(&env, "no-cluster", "InClusterIPPool", "pool");
    no_cluster.spec.cluster_name = Some("does-not-exist".into());
    create_claim(&env, no_cluster).await;
    claim(&env, "control", "InClusterIPPool", "pool").await;
    env.wait_ready("control", "True", None).await;
    for name in ["by-cluster", "by-annotation", "no-cluster"] {
        let claim = env.claims().get(name).await.expect("claim");
        assert!(
            claim.finalizers().is_empty() && claim.status.is_none(),
            "{name} was served while paused"
        );
    }

    env.pause_cluster("paused", false).await;
    env.wait_ready("by-cluster", "True", None).await;
    env.claims()
        .patch(
            "by-annotation",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {labels::PAUSED: null}}})),
        )
        .await
        .expect("unpause claim");
    env.wait_ready("by-annotation", "True", None).await;

    // A paused pool serves nobody until resumed, and its claims say so.
    env.pause_pool("pool", true).await;
    claim(&env, "while-pool-paused", "InClusterIPPool", "pool").await;
    let waiting = env
        .wait_ready("while-pool-paused", "False", Some("PoolNotReady"))
        .await
        .status
        .expect("a status");
    assert!(waiting.address_ref.is_none());
    let ready = waiting.conditions.iter().find(|c| c.type_ == "Ready");
    let message = &ready.expect("Ready").message;
    assert!(
        message.contains("is paused (annotation cluster.x-k8s.io/paused)"),
        "{message}"
    );
    env.pause_pool("pool", false).await;
    env.wait_ready("while-pool-paused", "True", None).await;

    // A claim whose Cluster is gone is still released when deleted.
    create_claim(&env, {
        let mut c = claim_object(&env, "orphaned", "InClusterIPPool", "pool");
        c.spec.cluster_name = Some("gone".into());
        c
    })
    .await;
    env.cluster("gone", false).await;
    env.wait_ready("orphaned", "True", None).await;
    Api::<Cluster>::namespaced(env.client.clone(), env.name())
        .delete("gone", &DeleteParams::default())
        .await
        .expect("delete cluster");
    env.claims()
        .delete("orphaned", &DeleteParams::default())
        .await
        .expect("delete claim");
    env.wait_gone(&env.claims(), "orphaned").await;
    env.wait_gone(&env.addresses(), "orphaned").await;
}

#[tokio::test]
async fn deleting_claims_releases_addresses_and_exhausted_claims_recover() {
    let env = Env::new("capi-lifecycle").await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    capi_pool(&env, "pool", capi_spec(&["10.6.0.1-10.6.0.2"], 24)).await;
    claim(&env, "a", "InClusterIPPool", "pool").await;
    claim(&env, "b", "InClusterIPPool", "pool").await;
    env.wait_ready("a", "True", None).await;
    env.wait_ready("b", "True", None).await;
    claim(&env, "c", "InClusterIPPool", "pool").await;
    let exhausted = env.wait_ready("c", "False", Some("PoolExhausted")).await;
    assert!(
        ready(&exhausted)
            .map(|c| c.message.clone())
            .unwrap_or_default()
            .contains("no free address")
    );
    env.wait_pool_counts("pool", (2, 2, 0, 0)).await;

    // An IPAddress deleted while its claim lives keeps its address: deletion waits for the claim.
    env.addresses()
        .delete("a", &DeleteParams::default())
        .await
        .expect("delete address");
    let held = env.address("a").await;
    assert!(held.meta().deletion_timestamp.is_some());
    assert_eq!(held.spec.address, "10.6.0.1");
    claim(&env, "d", "InClusterIPPool", "pool").await;
    env.wait_ready("d", "False", Some("PoolExhausted")).await;

    env.claims()
        .delete("b", &DeleteParams::default())
        .await
        .expect("delete claim");
    env.wait_gone(&env.claims(), "b").await;
    env.wait_gone(&env.addresses(), "b").await;
    // The freed address goes to a waiting claim (the older one first).
    let recovered = env.wait_ready("c", "True", None).await;
    assert_eq!(env.address("c").await.spec.address, "10.6.0.2");
    assert!(
        recovered
            .finalizers()
            .contains(&"ipam.cluster.x-k8s.io/ReleaseAddress".to_string())
    );
    env.wait_ready("d", "False", Some("PoolExhausted")).await;

    // Deleting the claim whose IPAddress was already terminating releases it too.
    env.claims()
        .delete("a", &DeleteParams::default())
        .await
        .expect("delete claim");
    env.wait_gone(&env.addresses(), "a").await;
    env.wait_ready("d", "True", None).await;
    assert_eq!(env.address("d").await.spec.address, "10.6.0.1");
}

#[tokio::test]
async fn the_reuse_grace_period_holds_a_released_address() {
    let env = Env::new("capi-grace").await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    let mut pool_spec = capi_spec(&["10.7.0.1-10.7.0.2"], 24);
    pool_spec.address_reuse_grace_period_seconds = Some(4);
    capi_pool(&env, "pool", pool_spec).await;
    claim(&env, "a", "InClusterIPPool", "pool").await;
    env.wait_ready("a", "True", None).await;
    env.claims()
        .delete("a", &DeleteParams::default())
        .await
        .expect("delete");
    let deleted_at = std::time::Instant::now();
    claim(&env, "b", "InClusterIPPool", "pool").await;
    env.wait_ready("b", "True", None).await;
    assert_eq!(
        env.address("b").await.spec.address,
        "10.7.0.2",
        "a's address is held during the grace period"
    );
    assert!(
        env.addresses().get_opt("a").await.expect("get").is_some(),
        "a's IPAddress is kept during the grace period"
    );
    env.wait_gone(&env.addresses(), "a").await;
    assert!(
        deleted_at.elapsed() >= Duration::from_secs(3),
        "released after the grace period"
    );
    env.wait_gone(&env.claims(), "a").await;
}

#[tokio::test]
async fn pools_are_protected_while_addresses_are_allocated_and_shrinking_never_orphans() {
    let env = Env::new("capi-protect").await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    capi_pool(&env, "pool", capi_spec(&["10.8.0.1-10.8.0.5"], 24)).await;
    for name in ["a", "b", "c"] {
        claim(&env, name, "InClusterIPPool", "pool").await;
        env.wait_ready(name, "True", None).await;
    }
    // Shrink the pool below c's address: c keeps it, and the pool counts it as out of range.
    env.pools()
        .patch(
            "pool",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"addresses": ["10.8.0.1-10.8.0.2"]}})),
        )
        .await
        .expect("shrink");
    env.wait_pool_counts("pool", (2, 3, 0, 1)).await;
    let pool = env.pools().get("pool").await.expect("pool");
    let ready = pool
        .status
        .expect("status")
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready");
    assert!(ready.message.contains("10.8.0.3"), "{}", ready.message);
    assert_eq!(env.address("c").await.spec.address, "10.8.0.3");

    env.pools()
        .delete("pool", &DeleteParams::default())
        .await
        .expect("delete pool");
    let reason = eventually("pool Deleting condition", WAIT, || async {
        let pool = env.pools().get_opt("pool").await.ok()??;
        let ready = pool
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Ready")?;
        (ready.reason == "Deleting").then_some(ready.message)
    })
    .await;
    assert!(reason.contains("waiting for 3 address(es)"), "{reason}");
    for name in ["a", "b", "c"] {
        env.claims()
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete claim");
    }
    env.wait_gone(&env.pools(), "pool").await;
    let ledgers: Api<ConfigMap> = Api::namespaced(env.client.clone(), env.name());
    env.wait_gone(&ledgers, &env.ledger_name("InClusterIPPool", "pool"))
        .await;
}

#[tokio::test]
async fn preallocations_requested_addresses_and_random_allocation() {
    let env = Env::new("capi-extensions").await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    let mut pinned = with_gateway(capi_spec(&["fd00:9::/120"], 64), "fd00:9::1");
    pinned.pre_allocations = BTreeMap::from([("host-a".into(), "fd00:9::0050".into())]);
    capi_pool(&env, "pinned", pinned).await;
    claim(&env, "other", "InClusterIPPool", "pinned").await;
    claim(&env, "host-a", "InClusterIPPool", "pinned").await;
    let mut requested = claim_object(&env, "wants-7", "InClusterIPPool", "pinned");
    requested.metadata.annotations =
        Some(BTreeMap::from([("ipAddress".into(), "fd00:9::7".into())]));
    create_claim(&env, requested).await;
    let mut taken = claim_object(&env, "wants-50", "InClusterIPPool", "pinned");
    taken.metadata.annotations = Some(BTreeMap::from([("ipAddress".into(), "fd00:9::50".into())]));
    create_claim(&env, taken).await;
    env.wait_ready("host-a", "True", None).await;
    env.wait_ready("other", "True", None).await;
    env.wait_ready("wants-7", "True", None).await;
    assert_eq!(env.address("host-a").await.spec.address, "fd00:9::50");
    assert_eq!(env.address("other").await.spec.address, "fd00:9::2");
    assert_eq!(env.address("wants-7").await.spec.address, "fd00:9::7");
    let refused = env
        .wait_ready("wants-50", "False", Some("AllocationFailed"))
        .await;
    assert!(
        ready(&refused)
            .map(|c| c.message.clone())
            .unwrap_or_default()
            .contains("preallocated to claim \"host-a\"")
    );

    let mut random = capi_spec(&["10.9.0.0/16"], 16);
    random.allocation_strategy = Some(AllocationStrategy::Random);
    capi_pool(&env, "random", random).await;
    for i in 0..5 {
        claim(&env, &format!("r{i}"), "InClusterIPPool", "random").await;
    }
    let mut seen = BTreeSet::new();
    for i in 0..5 {
        env.wait_ready(&format!("r{i}"), "True", None).await;
        seen.insert(env.address(&format!("r{i}")).await.spec.address);
    }
    assert_eq!(seen.len(), 5);
    // Five sequential picks would be .1 to .5; five uniform picks over 65,534 almost never are.
    let sequential: BTreeSet<String> = (1..=5).map(|i| format!("10.9.0.{i}")).collect();
    assert_ne!(seen, sequential);
}

/// Creates `count` claims spread over `pools`, `parallel` at a time.
async fn burst(env: &Env, pools: &[&str], count: usize) {
    let claims = (0..count).map(|i| {
        claim_object(
            env,
            &format!("claim-{i:03}"),
            "InClusterIPPool",
            pools[i % pools.len()],
        )
    });
    create_claims(env, claims).await;
}

/// Each of `pools` settled with its share of the claims of [`burst`] (support's check: one
/// address object per claim, none twice, the ledger equal to the live objects), and its status
/// counting them.
async fn assert_pools_consistent(env: &Env, pools: &[&str], count: usize) {
    for (index, pool) in pools.iter().enumerate() {
        let share = (0..count).filter(|i| i % pools.len() == index).count();
        assert_consistent(
            env,
            "InClusterIPPool",
            pool,
            share,
            Duration::from_secs(180),
        )
        .await;
        let used = i64::try_from(share).expect("a test's claim count");
        eventually(
            &format!("pool {pool} counts {share} used"),
            WAIT,
            || async { (env.pool_counts(pool).await.1 == used).then_some(()) },
        )
        .await;
    }
}

#[tokio::test]
async fn two_processes_racing_never_hand_out_an_address_twice() {
    let env = Env::new("capi-race").await;
    capi_pool(&env, "left", capi_spec(&["10.10.0.0/24"], 24)).await;
    capi_pool(&env, "right", capi_spec(&["10.10.1.0/24"], 24)).await;
    let mut first = Bitpool::start(env.name(), &[]);
    let mut second = Bitpool::start(env.name(), &[]);
    burst(&env, &["left", "right"], 300).await;
    assert_pools_consistent(&env, &["left", "right"], 300).await;
    assert!(
        first.is_running() && second.is_running(),
        "logs: {:?} {:?}",
        first.log,
        second.log
    );
    // Racing to create a new pool's first ledger loses nothing, so nothing is rebuilt or fenced.
    for bitpool in [&first, &second] {
        let log = std::fs::read_to_string(&bitpool.log).unwrap_or_default();
        assert!(
            !log.contains("rebuilding the pool's ledger"),
            "a new pool's ledger was taken for a lost one: {:?}",
            bitpool.log
        );
    }
}

#[tokio::test]
async fn a_process_killed_mid_burst_leaves_no_duplicate_and_no_leak() {
    let env = Env::new("capi-sigkill").await;
    capi_pool(&env, "left", capi_spec(&["10.11.0.0/24"], 24)).await;
    capi_pool(&env, "right", capi_spec(&["10.11.1.0/24"], 24)).await;
    let mut victim = Bitpool::start(env.name(), &[]);
    let creating = burst(&env, &["left", "right"], 300);
    // Kill at a random point of the burst: on the N-th IPAddress creation, seen by a watch so
    // that the kill lands within milliseconds of it.
    let threshold = rand::random_range(10..150);
    let kill_mid_burst = support::process::kill_when_created(&env, &mut victim, threshold);
    let ((), seen) = futures::join!(creating, kill_mid_burst);
    let at_kill = env
        .addresses()
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .len();
    assert!(
        at_kill < 300,
        "the kill came after the burst ({seen} seen, {at_kill} after); it proves nothing"
    );
    let _restarted = Bitpool::start(env.name(), &[]);
    assert_pools_consistent(&env, &["left", "right"], 300).await;
}

/// A claim and its IPAddress as the provider bitpool replaces left them: both finalizers, the
/// address owned by the claim, and no ledger. Returns the address object's UID.
async fn replaced_provider_claim(
    env: &Env,
    name: &str,
    kind: &str,
    pool: &str,
    address: &str,
) -> String {
    let mut claim = claim_object(env, name, kind, pool);
    claim.metadata.finalizers = Some(vec![CLAIM_FINALIZER.into()]);
    let claim = create_claim(env, claim).await;
    let object = IPAddress {
        metadata: ObjectMeta {
            finalizers: Some(vec![ADDRESS_FINALIZER.into()]),
            owner_references: Some(vec![
                bitpool::runtime::objects::owner_reference(&claim, true).expect("claim has a UID"),
            ]),
            ..env.meta(name)
        },
        spec: IPAddressSpec {
            claim_ref: LocalObjectName { name: name.into() },
            pool_ref: claim.spec.pool_ref.clone(),
            address: address.to_string(),
            prefix: 24,
            gateway: None,
        },
    };
    env.addresses()
        .create(&PostParams::default(), &object)
        .await
        .expect("create the replaced provider's IPAddress")
        .uid()
        .unwrap_or_default()
}

/// Switching in place: the provider bitpool replaces left claims with address objects, and no
/// ledger. bitpool keeps every one of them and hands the new claims only the other addresses.
#[tokio::test]
async fn addresses_written_by_the_replaced_provider_are_kept() {
    let env = Env::new("capi-switch").await;
    capi_pool(&env, "pool", capi_spec(&["10.9.0.1-10.9.0.6"], 24)).await;
    let mut before = BTreeMap::new();
    for (i, address) in ["10.9.0.2", "10.9.0.4", "10.9.0.5"].iter().enumerate() {
        let name = format!("old-{i}");
        let uid = replaced_provider_claim(&env, &name, "InClusterIPPool", "pool", address).await;
        before.insert(name, (address.to_string(), Some(uid)));
    }

    let _bitpool = Bitpool::start(env.name(), &[]);
    for i in 0..3 {
        claim(&env, &format!("new-{i}"), "InClusterIPPool", "pool").await;
    }
    let mut handed = BTreeSet::new();
    for i in 0..3 {
        let name = format!("new-{i}");
        env.wait_ready(&name, "True", None).await;
        handed.insert(env.address(&name).await.spec.address);
    }
    let free: BTreeSet<String> = ["10.9.0.1", "10.9.0.3", "10.9.0.6"]
        .map(String::from)
        .into();
    assert_eq!(handed, free, "the new claims got the addresses nobody held");
    for (name, (address, uid)) in &before {
        let kept = env.address(name).await;
        assert_eq!(
            (&kept.spec.address, kept.uid()),
            (address, uid.clone()),
            "{name}'s address object was left as it was"
        );
        env.wait_ready(name, "True", None).await;
    }
    env.wait_pool_counts("pool", (6, 6, 0, 0)).await;

    // A process limited to one namespace seeds a global pool with what it holds everywhere.
    let other = Env {
        client: env.client.clone(),
        ns: TestNamespace::new(&env.client, "capi-switch-other").await,
    };
    let global = global_pool(&env, "global", capi_spec(&["10.9.9.1-10.9.9.2"], 24)).await;
    let kind = "GlobalInClusterIPPool";
    replaced_provider_claim(&other, "old", kind, &global, "10.9.9.1").await;
    create_claim(&env, claim_object(&env, "new-global", kind, &global)).await;
    env.wait_ready("new-global", "True", None).await;
    assert_eq!(
        env.address("new-global").await.spec.address,
        "10.9.9.2",
        "the address held in another namespace was kept"
    );
}

/// As upstream has it, a gateway need only parse and be of the pool's family: one outside the
/// pool's subnet (an IPv6 link-local router, the router of another segment) is kept out of the
/// pool, written on every address as it is, and the pool serves.
#[tokio::test]
async fn a_gateway_outside_the_subnet_leaves_the_pool_serving() {
    let env = Env::new("capi-gateway").await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    capi_pool(
        &env,
        "v4",
        with_gateway(capi_spec(&["10.0.0.50-10.0.0.52"], 24), "10.0.1.1"),
    )
    .await;
    capi_pool(
        &env,
        "v6",
        with_gateway(capi_spec(&["fe80::ffff"], 120), "fe80::a"),
    )
    .await;
    claim(&env, "on-v4", "InClusterIPPool", "v4").await;
    claim(&env, "on-v6", "InClusterIPPool", "v6").await;
    env.wait_ready("on-v4", "True", None).await;
    env.wait_ready("on-v6", "True", None).await;
    let v4 = env.address("on-v4").await.spec;
    assert_eq!(
        (v4.address.as_str(), v4.prefix, v4.gateway.as_deref()),
        ("10.0.0.50", 24, Some("10.0.1.1"))
    );
    let v6 = env.address("on-v6").await.spec;
    assert_eq!(
        (v6.address.as_str(), v6.prefix, v6.gateway.as_deref()),
        ("fe80::ffff", 120, Some("fe80::a"))
    );
    env.wait_pool_counts("v4", (3, 1, 2, 0)).await;
    env.wait_pool_counts("v6", (1, 1, 0, 0)).await;
}

/// An IPAddress that exists before its claim (made by hand, restored from a backup) is the
/// claim's allocation, and gets what the contract gives every address: the claim as controller
/// owner, the pool as owner, the finalizer and the Cluster's label, owners of others kept
/// (upstream #87). Nothing else is handed that address.
#[tokio::test]
async fn an_existing_address_is_adopted_with_owners_finalizer_and_label() {
    let env = Env::new("capi-adopt").await;
    let pool = capi_pool(
        &env,
        "pool",
        with_gateway(capi_spec(&["10.0.0.1-10.0.0.254"], 24), "10.0.0.2"),
    )
    .await;
    env.cluster("k", false).await;
    let marker = Api::<ConfigMap>::namespaced(env.client.clone(), env.name())
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: env.meta("restored-from-backup"),
                ..Default::default()
            },
        )
        .await
        .expect("create the foreign owner");
    let mut foreign = bitpool::runtime::objects::owner_reference(&marker, false)
        .expect("the ConfigMap has a UID");
    foreign.controller = None;
    foreign.block_owner_deletion = None;
    let restored = IPAddress {
        metadata: ObjectMeta {
            owner_references: Some(vec![foreign.clone()]),
            ..env.meta("restored")
        },
        spec: IPAddressSpec {
            claim_ref: LocalObjectName {
                name: "restored".into(),
            },
            pool_ref: claim_object(&env, "x", "InClusterIPPool", "pool")
                .spec
                .pool_ref,
            address: "10.0.0.1".into(),
            prefix: 24,
            gateway: Some("10.0.0.2".into()),
        },
    };
    let created = env
        .addresses()
        .create(&PostParams::default(), &restored)
        .await
        .expect("create the IPAddress by hand");

    let _bitpool = Bitpool::start(env.name(), &[]);
    let mut restored = claim_object(&env, "restored", "InClusterIPPool", "pool");
    restored.spec.cluster_name = Some("k".into());
    let restored = create_claim(&env, restored).await;
    claim(&env, "new", "InClusterIPPool", "pool").await;
    env.wait_ready("restored", "True", None).await;
    env.wait_ready("new", "True", None).await;
    let owners = |a: &IPAddress| a.metadata.owner_references.clone().unwrap_or_default();
    let claim_owner = bitpool::runtime::objects::owner_reference(&restored, true).expect("uid");
    let pool_owner = bitpool::runtime::objects::owner_reference(&pool, false).expect("uid");
    let adopted = eventually("the IPAddress adopted", WAIT, || async {
        let address = env.addresses().get("restored").await.ok()?;
        (owners(&address).len() == 3).then_some(address)
    })
    .await;
    assert_eq!(owners(&adopted), vec![foreign, claim_owner, pool_owner]);
    assert_eq!(adopted.finalizers(), [ADDRESS_FINALIZER.to_string()]);
    assert_eq!(
        adopted
            .labels()
            .get(labels::CLUSTER_NAME)
            .map(String::as_str),
        Some("k")
    );
    assert_eq!(adopted.uid(), created.uid(), "the object itself is kept");
    assert_eq!(adopted.spec.address, "10.0.0.1");
    assert_eq!(env.address("new").await.spec.address, "10.0.0.3");
    env.wait_pool_counts("pool", (253, 2, 251, 0)).await;
}

/// A pool paused just after a claim was created still protects the claim with its finalizer
/// (upstream adds it before it looks at the pause): deleted while the pool is paused, the
/// claim waits for the pool to resume, and is released then.
#[tokio::test]
async fn a_paused_pool_protects_its_claims_until_it_resumes() {
    let env = Env::new("capi-paused-protect").await;
    capi_pool(&env, "pool", capi_spec(&["10.0.20.51"], 24)).await;
    env.pause_pool("pool", true).await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    claim(&env, "deleted", "InClusterIPPool", "pool").await;
    let protected = |name: &'static str| {
        let claims = env.claims();
        async move {
            let claim = claims.get_opt(name).await.ok()??;
            claim
                .finalizers()
                .contains(&CLAIM_FINALIZER.to_string())
                .then_some(claim)
        }
    };
    let deleted = eventually("the claim protected", WAIT, || protected("deleted")).await;
    let address = deleted.status.as_ref().and_then(|s| s.address_ref.as_ref());
    assert!(address.is_none(), "a paused pool serves nobody");
    env.claims()
        .delete("deleted", &DeleteParams::default())
        .await
        .expect("delete claim");
    // A later claim protected means the pool was reconciled after the deletion.
    claim(&env, "later", "InClusterIPPool", "pool").await;
    eventually("the later claim protected", WAIT, || protected("later")).await;
    let waiting = env.claims().get("deleted").await.expect("the claim waits");
    assert!(waiting.metadata.deletion_timestamp.is_some());
    assert!(
        env.addresses()
            .get_opt("deleted")
            .await
            .expect("read")
            .is_none(),
        "nothing was allocated while paused"
    );

    env.pause_pool("pool", false).await;
    env.wait_gone(&env.claims(), "deleted").await;
    env.wait_ready("later", "True", None).await;
}

/// bitpool's own extensions are bounded by the API server (upstream's fields keep upstream's
/// schema): at most 4096 preAllocations, each an address or sub-prefix, and 16 DNS servers.
#[tokio::test]
async fn the_api_server_bounds_bitpools_extensions() {
    let env = Env::new("capi-bounds").await;
    let pools: Api<InClusterIPPool> = env.api();
    let pool = |name: &str, edit: &dyn Fn(&mut InClusterIPPoolSpec)| {
        let mut spec = support::build::capi_spec(&["10.80.0.0/16"], 16);
        edit(&mut spec);
        InClusterIPPool {
            metadata: env.meta(name),
            spec,
            status: None,
        }
    };
    let refused = |result: Result<InClusterIPPool, kube::Error>, field: &str| match result {
        Err(kube::Error::Api(status)) if status.code == 422 => {
            assert!(status.message.contains(field), "{}", status.message)
        }
        other => panic!("{field}: not refused: {other:?}"),
    };
    let many = |n: usize| -> BTreeMap<String, String> {
        (0..n)
            .map(|i| (format!("c{i}"), format!("10.80.{}.{}", i / 256, i % 256)))
            .collect()
    };
    let at_most = pool("at-most", &|s| s.pre_allocations = many(4096));
    pools
        .create(&PostParams::default(), &at_most)
        .await
        .expect("4096 preAllocations are accepted");
    let too_many = pool("too-many", &|s| s.pre_allocations = many(4097));
    refused(
        pools.create(&PostParams::default(), &too_many).await,
        "spec.preAllocations",
    );
    let long = pool("long-value", &|s| {
        s.pre_allocations = BTreeMap::from([("c".to_string(), "1".repeat(50))]);
    });
    refused(
        pools.create(&PostParams::default(), &long).await,
        "spec.preAllocations",
    );
    let dns = pool("dns", &|s| {
        s.dns_servers = vec!["10.0.0.53".to_string(); 17]
    });
    refused(
        pools.create(&PostParams::default(), &dns).await,
        "spec.dnsServers",
    );
    let subnet = |addresses: Vec<String>| PoolSubnet {
        addresses,
        prefix: 24,
        gateway: None,
        dns_servers: Vec::new(),
    };
    let subnets = pool("subnets", &|s| {
        s.subnets = vec![subnet(vec!["10.81.0.1".into()]); 65]
    });
    refused(
        pools.create(&PostParams::default(), &subnets).await,
        "spec.subnets",
    );
    let entries = pool("subnet-entries", &|s| {
        s.subnets = vec![subnet(vec!["10.81.0.1".into(); 257])]
    });
    refused(
        pools.create(&PostParams::default(), &entries).await,
        "spec.subnets[0].addresses",
    );
    let empty = pool("empty-subnet", &|s| s.subnets = vec![subnet(Vec::new())]);
    refused(
        pools.create(&PostParams::default(), &empty).await,
        "spec.subnets[0].addresses",
    );
}

/// The pool's annotations as the server has them.
async fn pool_annotations(env: &Env, pool: &str) -> BTreeMap<String, String> {
    env.pools()
        .get(pool)
        .await
        .expect("the pool")
        .metadata
        .annotations
        .unwrap_or_default()
}

/// The addresses a hand-over carries, as text.
fn handed_over(annotations: &BTreeMap<String, String>) -> Option<BTreeSet<String>> {
    let text = annotations.get(moving::HANDOVER_ANNOTATION)?;
    let handover: bitpool::ipam::ledger::handover::Handover =
        serde_json::from_str(text).expect("a hand-over");
    let ledger = handover.ledger().expect("readable bitmaps");
    Some(ledger.addresses().map(|a| a.to_string()).collect())
}

/// clusterctl move's handshake, played by hand on one plane (tests/metal3_stack.rs runs the real
/// clusterctl): a pool blocks the move while its namespace's Cluster runs; once it is paused the
/// ledger is handed over on the pool, which goes on serving claims no paused Cluster holds back,
/// each address in the hand-over before it is handed out; a copy of the pool elsewhere starts its
/// ledger from the hand-over (no fence) and waits for its Clusters before sweeping; the source,
/// marked delete-for-move and deleted, lets the pool and its ledger go.
#[tokio::test]
async fn a_pools_ledger_travels_with_it_through_clusterctl_moves_handshake() {
    let env = Env::new("capi-move").await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    let spec = capi_spec(&["10.6.0.1-10.6.0.50"], 24);
    capi_pool(&env, "pool", spec.clone()).await;
    env.cluster("fleet", false).await;
    let mut held = claim_object(&env, "held", "InClusterIPPool", "pool");
    held.spec.cluster_name = Some("fleet".into());
    create_claim(&env, held).await;
    env.wait_ready("held", "True", None).await;
    let held = env.address("held").await.spec.address;
    eventually("the pool blocks clusterctl move", WAIT, || async {
        let annotations = pool_annotations(&env, "pool").await;
        annotations
            .contains_key(moving::BLOCK_MOVE_ANNOTATION)
            .then_some(())
    })
    .await;

    env.pause_cluster("fleet", true).await;
    let carried = eventually("the ledger is handed over", WAIT, || async {
        let annotations = pool_annotations(&env, "pool").await;
        let blocked = annotations.contains_key(moving::BLOCK_MOVE_ANNOTATION);
        handed_over(&annotations).filter(|_| !blocked)
    })
    .await;
    assert_eq!(carried, BTreeSet::from([held.clone()]));
    claim(&env, "free", "InClusterIPPool", "pool").await;
    env.wait_ready("free", "True", None).await;
    let free = env.address("free").await.spec.address;
    let carried = handed_over(&pool_annotations(&env, "pool").await).expect("a hand-over");
    assert_eq!(carried, BTreeSet::from([held.clone(), free.clone()]));

    // A copy, as clusterctl makes it: the same annotations on a new pool elsewhere.
    let target = Env::new("capi-move-target").await;
    let _target_bitpool = Bitpool::start(target.name(), &[]);
    target.cluster("fleet", true).await;
    let mut copy = InClusterIPPool {
        metadata: target.meta("pool"),
        spec,
        status: None,
    };
    copy.metadata.annotations = Some(pool_annotations(&env, "pool").await);
    target
        .pools()
        .create(&PostParams::default(), &copy)
        .await
        .expect("create the copy");
    claim(&target, "new", "InClusterIPPool", "pool").await;
    target.wait_ready("new", "True", None).await;
    let new = target.address("new").await.spec.address;
    assert!(
        ![&held, &free].contains(&&new),
        "{new} was handed out on the source"
    );
    let ledger = target
        .ledger("InClusterIPPool", "pool")
        .await
        .expect("the copy's ledger");
    assert!(ledger.rebuilt_at.is_none(), "the copy's ledger was fenced");
    let annotations = pool_annotations(&target, "pool").await;
    assert!(annotations.contains_key(moving::MOVED_IN_ANNOTATION));
    assert!(!annotations.contains_key(moving::HANDOVER_ANNOTATION));
    // Nothing holds the moved addresses here yet: they stay while the move may bring them.
    for address in [&held, &free] {
        assert!(ledger.contains(address.parse().expect("an address")));
    }
    target.pause_cluster("fleet", false).await;
    eventually("the move into the target is over", WAIT, || async {
        let annotations = pool_annotations(&target, "pool").await;
        (!annotations.contains_key(moving::MOVED_IN_ANNOTATION)).then_some(())
    })
    .await;

    // Resumed without a move, the source blocks again.
    env.pause_cluster("fleet", false).await;
    eventually("the source blocks clusterctl move again", WAIT, || async {
        let annotations = pool_annotations(&env, "pool").await;
        let blocked = annotations.contains_key(moving::BLOCK_MOVE_ANNOTATION);
        (blocked && handed_over(&annotations).is_none()).then_some(())
    })
    .await;
    // clusterctl deleting the source pool after a move: it goes with its ledger, though it holds
    // addresses.
    env.pools()
        .patch(
            "pool",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(json!([{"op": "add", "path": "/metadata/annotations",
                    "value": {moving::DELETE_FOR_MOVE_ANNOTATION: ""}}]))
                .expect("a JSON patch"),
            ),
        )
        .await
        .expect("mark the pool delete-for-move");
    env.pools()
        .delete("pool", &DeleteParams::default())
        .await
        .expect("delete the pool");
    env.wait_gone(&env.pools(), "pool").await;
    eventually("the source pool's ledger is gone", WAIT, || async {
        env.ledger("InClusterIPPool", "pool")
            .await
            .is_none()
            .then_some(())
    })
    .await;
}
