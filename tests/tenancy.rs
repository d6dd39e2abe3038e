//! Who may claim from a shared pool: a GlobalInClusterIPPool (and prefix pool) with a
//! `namespaceSelector` serves claims of the namespaces it selects and refuses the others on their
//! status, with an Event and a metric; relabelling a namespace lets its claims in; addresses
//! already held stay when the selector changes. Against the real control plane, bitpool watching
//! every namespace.

mod support;

use std::time::Duration;

use bitpool::api::capi::IPAddressClaim;
use bitpool::api::capi_pools::{
    GlobalInClusterIPPool, GlobalInClusterIPPoolSpec, GlobalInClusterPrefixPool,
    GlobalInClusterPrefixPoolSpec,
};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use support::build::{capi_spec, claim_object, prefix_spec};
use support::check::ready;
use support::ops::{Endpoints, sample};
use support::wait::{WAIT, wait_event_in};
use support::{Bitpool, Env, TestNamespace, eventually};

/// Labels `namespace` with `labels` (merged).
async fn label(env: &Env, namespace: &str, labels: serde_json::Value) {
    Api::<Namespace>::all(env.client.clone())
        .patch(
            namespace,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": labels } })),
        )
        .await
        .unwrap_or_else(|e| panic!("label namespace {namespace}: {e}"));
}

fn selector(tenant: &str) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: Some([("tenant".to_string(), tenant.to_string())].into()),
        ..Default::default()
    })
}

/// A claim of this test's bitpool (its watch filter) in `namespace`.
async fn claim_in(env: &Env, namespace: &str, name: &str, kind: &str, pool: &str) {
    let mut claim = claim_object(env, name, kind, pool);
    claim.metadata.namespace = Some(namespace.to_string());
    Api::<IPAddressClaim>::namespaced(env.client.clone(), namespace)
        .create(&PostParams::default(), &claim)
        .await
        .unwrap_or_else(|e| panic!("create claim {namespace}/{name}: {e}"));
}

/// The claim's Ready condition as (status, reason, message), once `check` holds of it.
async fn ready_of(
    env: &Env,
    namespace: &str,
    name: &str,
    what: &str,
    check: impl Fn(&str, &str) -> bool,
) -> (String, String, String) {
    let claims: Api<IPAddressClaim> = Api::namespaced(env.client.clone(), namespace);
    eventually(&format!("{namespace}/{name}: {what}"), WAIT, || async {
        let claim = claims.get_opt(name).await.ok()??;
        let ready = ready(&claim)?;
        check(&ready.status, &ready.reason).then(|| {
            (
                ready.status.clone(),
                ready.reason.clone(),
                ready.message.clone(),
            )
        })
    })
    .await
}

/// The pool's NamespacesSelected condition, once it has `status` and its message says `says`.
async fn selected_condition(
    pools: &Api<GlobalInClusterIPPool>,
    name: &str,
    status: &str,
    says: &str,
) {
    eventually(
        &format!("{name}: NamespacesSelected={status} saying {says:?}"),
        WAIT,
        || async {
            let pool = pools.get(name).await.ok()?;
            pool.status?.conditions.into_iter().find(|c| {
                c.type_ == "NamespacesSelected" && c.status == status && c.message.contains(says)
            })
        },
    )
    .await;
}

#[tokio::test]
async fn a_shared_pool_serves_only_the_namespaces_it_selects() {
    let env = Env::new("tenancy").await;
    let tenant = env.name().to_string();
    let a = TestNamespace::new(&env.client, "tenant-a").await;
    let b = TestNamespace::new(&env.client, "tenant-b").await;
    label(&env, &a.name, json!({ "tenant": tenant })).await;
    let endpoints = Endpoints::new();
    let args = endpoints.args(false);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _bitpool = Bitpool::start_all_namespaces_with(env.name(), &args);

    let name = format!("{}-shared", env.name());
    let mut pool = GlobalInClusterIPPool {
        metadata: env.meta(&name),
        spec: GlobalInClusterIPPoolSpec {
            pool: capi_spec(&["10.80.0.10-10.80.0.20"], 24),
            namespace_selector: selector(&tenant),
        },
        status: None,
    };
    pool.metadata.namespace = None;
    let pools: Api<GlobalInClusterIPPool> = Api::all(env.client.clone());
    pools
        .create(&PostParams::default(), &pool)
        .await
        .expect("create the shared pool");

    claim_in(&env, &a.name, "node", "GlobalInClusterIPPool", &name).await;
    claim_in(&env, &b.name, "node", "GlobalInClusterIPPool", &name).await;
    selected_condition(&pools, &name, "True", "selects 1 namespace(s)").await;
    ready_of(&env, &a.name, "node", "served", |s, _| s == "True").await;
    let (_, reason, message) = ready_of(&env, &b.name, "node", "refused", |s, r| {
        s == "False" && r == "NamespaceNotSelected"
    })
    .await;
    assert!(
        message.contains(&format!("namespace {} is not one", b.name))
            && message.contains(&format!("tenant={tenant}")),
        "{reason}: {message}"
    );
    wait_event_in(&env, &b.name, Some("node"), "NamespaceNotSelected").await;
    let refused = r#"bitpool_claims_refused_total{kind="GlobalInClusterIPPool",reason="NamespaceNotSelected"}"#;
    let metrics = endpoints.metrics().await;
    assert_eq!(sample(&metrics, refused), Some(1.0), "{metrics}");

    // Labelled in: its claim is served.
    label(&env, &b.name, json!({ "tenant": tenant })).await;
    ready_of(&env, &b.name, "node", "served once selected", |s, _| {
        s == "True"
    })
    .await;
    selected_condition(&pools, &name, "True", "selects 2 namespace(s)").await;

    // The selector narrowed to another tenant: nothing held moves, new claims are refused.
    let held = |ns: String| {
        let client = env.client.clone();
        async move {
            Api::<bitpool::api::capi::IPAddress>::namespaced(client, &ns)
                .get("node")
                .await
                .expect("the address object")
                .spec
                .address
        }
    };
    let before = (held(a.name.clone()).await, held(b.name.clone()).await);
    pools
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "namespaceSelector": { "matchLabels": { "tenant": "nobody" } } } })),
        )
        .await
        .expect("narrow the selector");
    claim_in(&env, &a.name, "late", "GlobalInClusterIPPool", &name).await;
    ready_of(
        &env,
        &a.name,
        "late",
        "refused after the narrowing",
        |s, r| s == "False" && r == "NamespaceNotSelected",
    )
    .await;
    let after = (held(a.name.clone()).await, held(b.name.clone()).await);
    assert_eq!(before, after, "addresses already held stay");
    // Without the webhook (which refuses it), a selector that selects nobody says so on the pool.
    selected_condition(&pools, &name, "False", "selects no namespace").await;
    ready_of(&env, &a.name, "node", "still served", |s, _| s == "True").await;
}

/// A prefix pool with a selector that is not one is invalid: it hands out nothing, and says why.
#[tokio::test]
async fn an_invalid_selector_makes_the_pool_hand_out_nothing() {
    let env = Env::new("tenancy-invalid").await;
    let _bitpool = Bitpool::start_all_namespaces(env.name());
    let name = format!("{}-racks", env.name());
    let mut pool = GlobalInClusterPrefixPool {
        metadata: env.meta(&name),
        spec: GlobalInClusterPrefixPoolSpec {
            pool: prefix_spec(&["fd00:80::/60"], 64),
            namespace_selector: Some(
                serde_json::from_value(json!({
                    "matchExpressions": [{ "key": "tenant", "operator": "In" }]
                }))
                .expect("a selector object"),
            ),
        },
        status: None,
    };
    pool.metadata.namespace = None;
    let pools: Api<GlobalInClusterPrefixPool> = Api::all(env.client.clone());
    pools
        .create(&PostParams::default(), &pool)
        .await
        .expect("create the pool (no webhook here)");
    let claim = claim_object(&env, "rack", "GlobalInClusterPrefixPool", &name);
    env.api::<IPAddressClaim>()
        .create(&PostParams::default(), &claim)
        .await
        .expect("create the claim");
    let (_, _, message) = ready_of(&env, env.name(), "rack", "refused", |s, r| {
        s == "False" && r == "PoolNotReady"
    })
    .await;
    assert!(message.contains("spec.namespaceSelector"), "{message}");
    let ready = eventually("the pool says why", Duration::from_secs(60), || async {
        let pool = pools.get(&name).await.ok()?;
        pool.status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Ready" && c.status == "False")
    })
    .await;
    assert!(
        ready.message.contains("spec.namespaceSelector"),
        "{ready:?}"
    );
}
