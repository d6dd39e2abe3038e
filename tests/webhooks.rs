//! The admission and conversion webhooks end to end: the test control plane calls bitpool over
//! HTTPS (a CA bundle, the shipped webhook configurations), denials reach API clients and
//! `kubectl`, pools written at v1alpha1 are read at v1alpha2 and the reverse, an installation
//! that stored v1alpha1 upgrades in place, and a rotated certificate is served without a
//! restart. The tests change cluster-wide objects, so they take turns ([`webhook::SERIAL`]).

mod support;

use bitpool::api::capi::IPAddressClaim;
use bitpool::api::capi_pools::{
    GlobalInClusterIPPool, GlobalInClusterPrefixPool, GlobalInClusterPrefixPoolSpec,
    InClusterIPPool, InClusterPrefixPool,
};
use bitpool::api::metal3_ipam::{IPClaim, IPClaimSpec, IPPool, Metal3PoolRange};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::json;
use support::build::*;
use support::check::*;
use support::wait::*;
use support::webhook::{self, Registered, Served};
use support::{Env, eventually, kubeconfig_path};

/// The refusal of a write: the API server's message for a webhook denial, with every fragment.
fn assert_denied<T: std::fmt::Debug>(result: Result<T, kube::Error>, fragments: &[&str]) {
    match result {
        Err(kube::Error::Api(e)) => {
            assert!(
                e.message.contains("denied the request"),
                "not a webhook denial: {}",
                e.message
            );
            for fragment in fragments {
                assert!(
                    e.message.contains(fragment),
                    "{fragment:?} missing from: {}",
                    e.message
                );
            }
        }
        other => panic!("expected a denial naming {fragments:?}, got {other:?}"),
    }
}

/// `kubectl <args>` with `stdin`, against the test control plane: (success, stderr).
fn kubectl(args: &[&str], stdin: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = std::process::Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", kubeconfig_path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("kubectl must be on PATH (denials are checked as users see them): {e}")
        });
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin.as_bytes()).expect("write to kubectl");
    }
    let output = child.wait_with_output().expect("kubectl finishes");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

fn v1alpha1(kind: &str) -> ApiResource {
    ApiResource {
        group: CAPI_GROUP.into(),
        version: "v1alpha1".into(),
        api_version: format!("{CAPI_GROUP}/v1alpha1"),
        kind: kind.into(),
        plural: format!("{}s", kind.to_lowercase()),
    }
}

fn v1alpha1_pool(env: &Env, name: &str, spec: serde_json::Value) -> DynamicObject {
    let mut pool =
        DynamicObject::new(name, &v1alpha1("InClusterIPPool")).data(json!({ "spec": spec }));
    pool.metadata = env.meta(name);
    pool
}

/// One test's turn: bitpool with webhooks on, the configurations registered and called, the
/// pool CRDs converting through it. Fields drop in order: configurations, bitpool, namespace,
/// then the turn.
struct Harness {
    registered: Registered,
    served: Served,
    env: Env,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

async fn serve(prefix: &str, extra_args: &[&str]) -> Harness {
    let turn = webhook::SERIAL.lock().await;
    let env = Env::new(prefix).await;
    let served = Served::start(&env, extra_args);
    served.wait_listening().await;
    webhook::convert_through(&env.client, &served).await;
    let registered = Registered::new(&env, &served).await;
    registered.wait_active(&env).await;
    Harness {
        registered,
        served,
        env,
        _turn: turn,
    }
}

#[tokio::test]
async fn invalid_objects_are_refused_naming_field_and_rule() {
    let harness = serve("wh-invalid", &[]).await;
    let env = &harness.env;
    let pools: Api<InClusterIPPool> = env.api();
    let pp = PostParams::default();

    let bad = InClusterIPPool {
        metadata: env.meta("bad"),
        spec: capi_spec(&["not-an-ip"], 99),
        status: None,
    };
    assert_denied(
        pools.create(&pp, &bad).await,
        &[
            "spec: provided address is not a valid IP, range, nor CIDR",
            "not-an-ip",
        ],
    );
    let mut mixed = capi_spec(&["10.1.0.1", "fd00::1"], 24);
    mixed.gateway = Some("10.1.0.254".into());
    let global = GlobalInClusterIPPool {
        metadata: {
            let mut m = env.meta(&format!("{}-mixed", env.name()));
            m.namespace = None;
            m
        },
        spec: bitpool::api::capi_pools::GlobalInClusterIPPoolSpec {
            pool: mixed,
            namespace_selector: None,
        },
        status: None,
    };
    assert_denied(
        Api::<GlobalInClusterIPPool>::all(env.client.clone())
            .create(&pp, &global)
            .await,
        &["provided addresses are of mixed IP families"],
    );
    let old_form: Api<DynamicObject> =
        Api::namespaced_with(env.client.clone(), env.name(), &v1alpha1("InClusterIPPool"));
    assert_denied(
        old_form
            .create(
                &pp,
                &v1alpha1_pool(env, "banana", json!({"subnet": "banana"})),
            )
            .await,
        &["spec.subnet: \"banana\" is not a valid CIDR"],
    );

    // A pool stored before the rules (outside the webhooks' selector here) can still be updated
    // as long as its spec stays, so that finalizers and labels never get stuck; a spec change is
    // judged.
    let mut unlabelled = env.meta("stored-before");
    unlabelled.labels = None;
    let stored = InClusterIPPool {
        metadata: unlabelled,
        spec: capi_spec(&["not-an-ip"], 24),
        status: None,
    };
    pools
        .create(&pp, &stored)
        .await
        .expect("not selected by the webhooks");
    let label = json!({"metadata": {"labels": {bitpool::api::labels::WATCH_FILTER: env.name()}}});
    pools
        .patch(
            "stored-before",
            &PatchParams::default(),
            &Patch::Merge(label),
        )
        .await
        .expect("a metadata update is not refused");
    assert_denied(
        pools
            .patch(
                "stored-before",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"prefix": 25}})),
            )
            .await,
        &["provided address is not a valid IP"],
    );

    // The same refusal reaches kubectl.
    let manifest = format!(
        "apiVersion: ipam.cluster.x-k8s.io/v1alpha2\nkind: InClusterIPPool\nmetadata:\n  name: by-kubectl\n  namespace: {ns}\n  labels: {{cluster.x-k8s.io/watch-filter: {ns}}}\nspec:\n  addresses: [10.1.0.0/24]\n  prefix: 99\n",
        ns = env.name()
    );
    let (ok, output) = kubectl(&["apply", "-f", "-"], &manifest);
    assert!(
        !ok && output.contains("denied the request")
            && output.contains("provided prefix is not valid"),
        "{output}"
    );

    // A pool's further subnets: problems name the subnet and the rule.
    let manifest = format!(
        "apiVersion: ipam.cluster.x-k8s.io/v1alpha2\nkind: InClusterIPPool\nmetadata:\n  name: racks\n  namespace: {ns}\n  labels: {{cluster.x-k8s.io/watch-filter: {ns}}}\nspec:\n  addresses: [10.1.0.10-10.1.0.20]\n  prefix: 24\n  gateway: 10.1.0.1\n  subnets:\n  - {{addresses: [10.1.1.10-10.1.1.20], prefix: 24, gateway: 10.1.1.1}}\n  - {{addresses: [10.1.1.100], prefix: 25, gateway: 10.1.1.1}}\n",
        ns = env.name()
    );
    let (ok, output) = kubectl(&["apply", "-f", "-"], &manifest);
    assert!(
        !ok && output.contains(
            "spec.subnets[1]: subnet 10.1.1.0/25 overlaps subnet 10.1.1.0/24 of subnets[0]"
        ),
        "{output}"
    );
    let gateway_outside = manifest
        .replace(
            "prefix: 25, gateway: 10.1.1.1",
            "prefix: 24, gateway: 10.1.3.1",
        )
        .replace("10.1.1.100]", "10.1.2.100]");
    let (ok, output) = kubectl(&["apply", "-f", "-"], &gateway_outside);
    assert!(
        !ok && output.contains(
            "spec.subnets[1].gateway: gateway 10.1.3.1 is outside its subnet 10.1.2.0/24"
        ),
        "{output}"
    );
    let fixed = gateway_outside.replace("gateway: 10.1.3.1", "gateway: 10.1.2.1");
    let (ok, output) = kubectl(&["apply", "-f", "-"], &fixed);
    assert!(ok, "a pool of three valid subnets is admitted: {output}");

    let mut metal3 = metal3_spec("10.2.0.1", "10.2.0.9", 24);
    metal3.pre_allocations = [("c".to_string(), "10.2.0.50".to_string())].into();
    let ippool = IPPool {
        metadata: env.meta("m3"),
        spec: metal3,
        status: None,
    };
    assert_denied(
        env.api::<IPPool>().create(&pp, &ippool).await,
        &["spec.preAllocations[c]: 10.2.0.50 is out of bounds of the pools given"],
    );

    let mut ipclaim = IPClaim {
        metadata: env.meta("ipc"),
        spec: IPClaimSpec {
            pool: k8s_openapi::api::core::v1::ObjectReference {
                name: Some("m3".into()),
                ..Default::default()
            },
        },
        status: None,
    };
    ipclaim
        .annotations_mut()
        .insert("ipAddress".into(), "nope".into());
    assert_denied(
        env.api::<IPClaim>().create(&pp, &ipclaim).await,
        &["Invalid ipAddress annotation \"nope\""],
    );

    capi_pool(env, "good", capi_spec(&["10.3.0.0/24"], 24)).await;
    let mut claim = claim_object(env, "wants-far", "InClusterIPPool", "good");
    claim
        .annotations_mut()
        .insert("ipAddress".into(), "10.9.9.9".into());
    assert_denied(
        env.api::<IPAddressClaim>().create(&pp, &claim).await,
        &["10.9.9.9 is not an address of the pool"],
    );

    let template: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3DataTemplate",
        "metadata": {"name": "t", "namespace": env.name(), "labels": {"cluster.x-k8s.io/watch-filter": env.name()}},
        "spec": {"clusterName": "c", "networkData": {"networks": {"ipv4": [{"id": "n", "link": "eth0"}]}}}
    }))
    .expect("template");
    let templates: Api<DynamicObject> = Api::namespaced_with(
        env.client.clone(),
        env.name(),
        &ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk(
                "infrastructure.cluster.x-k8s.io",
                "v1beta1",
                "Metal3DataTemplate",
            ),
            "metal3datatemplates",
        ),
    );
    assert_denied(
        templates.create(&pp, &template).await,
        &["spec.networkData.networks.ipv4[0].fromPoolRef.name: Required value"],
    );
}

#[tokio::test]
async fn pools_in_use_are_neither_deleted_nor_shrunk() {
    let harness = serve("wh-inuse", &[]).await;
    let env = &harness.env;
    capi_pool(env, "p", capi_spec(&["10.7.0.0/24"], 24)).await;
    claim(env, "a", "InClusterIPPool", "p").await;
    claim(env, "b", "InClusterIPPool", "p").await;
    for name in ["a", "b"] {
        wait_claim(env, name, "Ready", |c| c.status == "True").await;
    }
    let pools: Api<InClusterIPPool> = env.api();
    assert_denied(
        pools.delete("p", &DeleteParams::default()).await,
        &[
            "Pool has IPAddresses allocated. Cannot delete Pool until all IPAddresses have been removed.",
            "2 address(es) held by claim(s): a, b",
        ],
    );
    let (ok, output) = kubectl(&["delete", "inclusterippool", "p", "-n", env.name()], "");
    assert!(!ok && output.contains("Cannot delete Pool"), "{output}");

    let merge = |spec: serde_json::Value| Patch::Merge(json!({ "spec": spec }));
    let pp = PatchParams::default();
    assert_denied(
        pools
            .patch(
                "p",
                &pp,
                &merge(json!({"addresses": ["10.7.0.100-10.7.0.200"]})),
            )
            .await,
        &[
            "pool addresses do not contain allocated addresses: 10.7.0.1 (claim a), 10.7.0.2 (claim b)",
            "ipam.bitpool.dev/allow-shrink",
        ],
    );
    assert_denied(
        pools
            .patch("p", &pp, &merge(json!({"gateway": "10.7.0.2"})))
            .await,
        &["10.7.0.2 (claim b)"],
    );
    pools
        .patch(
            "p",
            &pp,
            &merge(json!({"excludedAddresses": ["10.7.0.200-10.7.0.254"]})),
        )
        .await
        .expect("shrinking around free addresses is fine");

    // The Metal3 dialect, and its immutable fields.
    let mut spec = metal3_spec("10.8.0.1", "10.8.0.9", 24);
    spec.pools.push(Metal3PoolRange {
        subnet: Some("10.8.1.0/24".into()),
        ..Default::default()
    });
    metal3_pool(env, "m3", spec).await;
    ipclaim(env, "m", "m3").await;
    let ipclaims: Api<IPClaim> = env.api();
    eventually("IPClaim m has an address", WAIT, || {
        let api = ipclaims.clone();
        async move { api.get("m").await.ok()?.status?.address.map(|_| ()) }
    })
    .await;
    let ippools: Api<IPPool> = env.api();
    assert_denied(
        ippools.delete("m3", &DeleteParams::default()).await,
        &["1 address(es) held by claim(s): m"],
    );
    assert_denied(
        ippools
            .patch("m3", &pp, &merge(json!({"namePrefix": "other"})))
            .await,
        &["spec.namePrefix: cannot be modified"],
    );
    assert_denied(
        ippools
            .patch(
                "m3",
                &pp,
                &merge(json!({"pools": [{"subnet": "10.8.1.0/24"}]})),
            )
            .await,
        &["10.8.0.1", "(claim m)"],
    );

    // clusterctl move's annotation lets the delete through; the finalizer still guards.
    pools.patch("p", &pp, &Patch::Merge(json!({"metadata": {"annotations": {"ipam.cluster.x-k8s.io/skip-validate-delete-webhook": ""}}}))).await.expect("annotate");
    pools
        .delete("p", &DeleteParams::default())
        .await
        .expect("delete with the skip annotation");
}

#[tokio::test]
async fn prefix_pools_are_validated_and_kept_while_in_use() {
    let harness = serve("wh-prefix", &[]).await;
    let env = &harness.env;
    let pools: Api<InClusterPrefixPool> = env.api();
    let pp = PostParams::default();
    let unaligned = InClusterPrefixPool {
        metadata: env.meta("unaligned"),
        spec: prefix_spec(&["fd00:30::1/62"], 64),
        status: None,
    };
    assert_denied(
        pools.create(&pp, &unaligned).await,
        &["prefixes[0]", "\"fd00:30::1/62\" is not network aligned"],
    );
    let globals: Api<GlobalInClusterPrefixPool> = Api::all(env.client.clone());
    let mut outside = GlobalInClusterPrefixPool {
        metadata: env.meta(&format!("{}-outside", env.name())),
        spec: GlobalInClusterPrefixPoolSpec {
            pool: prefix_spec(&["fd00:31::/48"], 64),
            namespace_selector: None,
        },
        status: None,
    };
    outside.metadata.namespace = None;
    outside.spec.pool.excluded_prefixes = vec!["fd00:99::/64".into()];
    assert_denied(
        globals.create(&pp, &outside).await,
        &["excludedPrefixes[0]", "is not inside the pool's prefixes"],
    );

    prefix_pool(env, "p", prefix_spec(&["fd00:30::/62"], 64)).await;
    let claims: Api<IPAddressClaim> = env.api();
    create(&claims, &claim_object(env, "a", "InClusterPrefixPool", "p")).await;
    wait_claim(env, "a", "Ready", |c| c.status == "True").await;
    for (requested, problem) in [
        ("fd00:30::1", "not a /64 sub-prefix"),
        (
            "fd00:31::/64",
            "fd00:31::/64 is not a sub-prefix of the pool",
        ),
    ] {
        let mut asking = claim_object(env, "asking", "InClusterPrefixPool", "p");
        asking.metadata.annotations =
            Some([("ipAddress".to_string(), requested.to_string())].into());
        assert_denied(claims.create(&pp, &asking).await, &[problem]);
    }
    let merge = |spec: serde_json::Value| Patch::Merge(json!({ "spec": spec }));
    let patch = PatchParams::default();
    assert_denied(
        pools
            .patch("p", &patch, &merge(json!({"allocationPrefixLength": 63})))
            .await,
        &["spec.allocationPrefixLength is immutable"],
    );
    assert_denied(
        pools
            .patch(
                "p",
                &patch,
                &merge(json!({"prefixes": ["fd00:30:0:2::/63"]})),
            )
            .await,
        &["fd00:30::/64 (claim a)", "ipam.bitpool.dev/allow-shrink"],
    );
    pools
        .patch(
            "p",
            &patch,
            &merge(json!({"excludedPrefixes": ["fd00:30:0:3::/64"]})),
        )
        .await
        .expect("excluding a free sub-prefix is fine");
    assert_denied(
        pools.delete("p", &DeleteParams::default()).await,
        &["Cannot delete Pool", "1 address(es) held by claim(s): a"],
    );
}

#[tokio::test]
async fn v1alpha1_and_v1alpha2_read_each_others_writes() {
    let harness = serve("wh-convert", &[]).await;
    let env = &harness.env;
    let old_form: Api<DynamicObject> =
        Api::namespaced_with(env.client.clone(), env.name(), &v1alpha1("InClusterIPPool"));
    let written = json!({"subnet": "10.5.0.0/24", "start": "10.5.0.10", "end": "10.5.0.20", "gateway": "10.5.0.1"});
    old_form
        .create(
            &PostParams::default(),
            &v1alpha1_pool(env, "old", written.clone()),
        )
        .await
        .expect("create at v1alpha1");

    let pools: Api<InClusterIPPool> = env.api();
    let current = pools.get("old").await.expect("read at v1alpha2");
    assert_eq!(
        current.spec.addresses,
        vec!["10.5.0.10-10.5.0.20".to_string()]
    );
    assert_eq!(
        (current.spec.prefix, current.spec.gateway.as_deref()),
        (24, Some("10.5.0.1"))
    );
    claim(env, "c", "InClusterIPPool", "old").await;
    wait_claim(env, "c", "Ready", |c| c.status == "True").await;
    assert_eq!(address_of(env, "c").await, "10.5.0.10");

    // A field only v1alpha2 has survives a v1alpha1 client's read-modify-write.
    let pp = PatchParams::default();
    pools
        .patch(
            "old",
            &pp,
            &Patch::Merge(json!({"spec": {"excludedAddresses": ["10.5.0.11"]}})),
        )
        .await
        .expect("patch at v1alpha2");
    // bitpool writes the pool's status meanwhile: a conflict is read again, as any client does.
    for attempt in 1.. {
        let mut seen = old_form.get("old").await.expect("read at v1alpha1");
        assert_eq!(seen.data["spec"], written, "the v1alpha1 form is kept");
        seen.labels_mut().insert("touched".into(), "yes".into());
        match old_form.replace("old", &PostParams::default(), &seen).await {
            Ok(_) => break,
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < 5 => continue,
            Err(e) => panic!("replace at v1alpha1: {e}"),
        }
    }
    let current = pools.get("old").await.expect("read at v1alpha2");
    assert_eq!(
        current.spec.excluded_addresses,
        vec!["10.5.0.11".to_string()],
        "not lost by the v1alpha1 write"
    );
    assert_eq!(
        current.labels().get("touched").map(String::as_str),
        Some("yes")
    );

    // A v1alpha1 change reaches v1alpha2, the v1alpha2-only field still there.
    old_form
        .patch(
            "old",
            &pp,
            &Patch::Merge(json!({"spec": {"end": "10.5.0.30"}})),
        )
        .await
        .expect("patch at v1alpha1");
    let current = pools.get("old").await.expect("read at v1alpha2");
    assert_eq!(
        current.spec.addresses,
        vec!["10.5.0.10-10.5.0.30".to_string()]
    );
    assert_eq!(
        current.spec.excluded_addresses,
        vec!["10.5.0.11".to_string()]
    );
    let (ok, output) = kubectl(
        &[
            "get",
            "inclusterippools.v1alpha1.ipam.cluster.x-k8s.io",
            "old",
            "-n",
            env.name(),
            "-o",
            "jsonpath={.spec.subnet} {.spec.end}",
        ],
        "",
    );
    // (kubectl also prints the API server's deprecation warning for v1alpha1.)
    assert!(
        ok && output.starts_with("10.5.0.0/24 10.5.0.30"),
        "{output}"
    );
    assert!(
        output.contains("v1alpha1 InClusterIPPool is deprecated"),
        "{output}"
    );
}

fn with_storage(mut crd: CustomResourceDefinition, storage: &str) -> CustomResourceDefinition {
    for version in &mut crd.spec.versions {
        version.storage = version.name == storage;
    }
    crd
}

async fn stored_versions(crds: &Api<CustomResourceDefinition>) -> Vec<String> {
    crds.get("inclusterippools.ipam.cluster.x-k8s.io")
        .await
        .expect("CRD")
        .status
        .and_then(|s| s.stored_versions)
        .unwrap_or_default()
}

/// An installation that ran the in-cluster provider before v0.1.0-alpha.3 stored its pools at
/// v1alpha1; bitpool's CRD applies over it, serves those pools, and the storage
/// migration of docs/using.md leaves v1alpha2 alone in `storedVersions`.
#[tokio::test]
async fn an_installation_that_stored_v1alpha1_upgrades_in_place() {
    let harness = serve("wh-upgrade", &[]).await;
    let env = &harness.env;
    let config = harness.served.client_config(bitpool::webhook::CONVERT_PATH);
    let mut crds_now = bitpool::crds::served();
    bitpool::crds::set_conversion(&mut crds_now, &config);
    let pool_crd = crds_now
        .into_iter()
        .find(|c| c.spec.names.kind == "InClusterIPPool")
        .expect("pool CRD");

    // The old installation: v1alpha1 is the storage version.
    support::install_crds(&env.client, &[with_storage(pool_crd.clone(), "v1alpha1")]).await;
    let old_form: Api<DynamicObject> =
        Api::namespaced_with(env.client.clone(), env.name(), &v1alpha1("InClusterIPPool"));
    old_form
        .create(
            &PostParams::default(),
            &v1alpha1_pool(env, "legacy", json!({"subnet": "10.6.0.0/28"})),
        )
        .await
        .expect("create at v1alpha1");
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    assert!(
        stored_versions(&crds)
            .await
            .contains(&"v1alpha1".to_string())
    );

    // bitpool's CRD over it.
    support::install_crds(&env.client, &[pool_crd]).await;
    let pools: Api<InClusterIPPool> = env.api();
    assert_eq!(
        pools
            .get("legacy")
            .await
            .expect("read at v1alpha2")
            .spec
            .addresses,
        vec!["10.6.0.1-10.6.0.14".to_string()]
    );
    claim(env, "c", "InClusterIPPool", "legacy").await;
    wait_claim(env, "c", "Ready", |c| c.status == "True").await;

    // The storage migration of docs/using.md: rewrite every pool, then drop v1alpha1. bitpool
    // writes the pools' status meanwhile, so a rewrite that loses the race reads again, as a
    // storage migrator does.
    let all: Api<InClusterIPPool> = Api::all(env.client.clone());
    for pool in all
        .list(&ListParams::default())
        .await
        .expect("list pools")
        .items
    {
        let api: Api<InClusterIPPool> =
            Api::namespaced(env.client.clone(), &pool.namespace().unwrap_or_default());
        let name = pool.name_any();
        eventually(
            &format!("pool {name} rewritten at v1alpha2"),
            WAIT,
            || async {
                let fresh = api.get(&name).await.ok()?;
                match api.replace(&name, &PostParams::default(), &fresh).await {
                    Ok(_) => Some(()),
                    Err(kube::Error::Api(s)) if s.code == 409 => None,
                    Err(e) => panic!("rewrite {name} at v1alpha2: {e}"),
                }
            },
        )
        .await;
    }
    crds.patch_status(
        "inclusterippools.ipam.cluster.x-k8s.io",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"storedVersions": ["v1alpha2"]}})),
    )
    .await
    .expect("drop v1alpha1 from storedVersions");
    assert_eq!(stored_versions(&crds).await, vec!["v1alpha2".to_string()]);
    assert_eq!(
        old_form
            .get("legacy")
            .await
            .expect("still readable at v1alpha1")
            .data["spec"],
        json!({"subnet": "10.6.0.0/28"})
    );
    assert_eq!(
        pools
            .get("legacy")
            .await
            .expect("read at v1alpha2")
            .spec
            .prefix,
        28
    );
}

#[tokio::test]
async fn a_rotated_certificate_is_served_without_restart() {
    let mut harness = serve("wh-rotate", &["--tls-min-version=VersionTLS13"]).await;
    harness.served.certs.ca_pem = harness.served.certs.rotate();
    // The API server trusts only the new CA from now on: a denial (not a TLS failure) proves
    // bitpool serves the new certificate.
    harness.registered = Registered::new(&harness.env, &harness.served).await;
    harness.registered.wait_active(&harness.env).await;
    assert!(harness.served.bitpool.is_running(), "no restart");
}

/// With no bitpool answering, writes that could strand allocated addresses are refused
/// (failurePolicy Fail) and Cluster API's claims still go through (Ignore).
#[tokio::test]
async fn failure_policies_hold_while_bitpool_is_down() {
    let mut harness = serve("wh-down", &[]).await;
    let env = &harness.env;
    capi_pool(env, "p", capi_spec(&["10.9.0.0/24"], 24)).await;
    claim(env, "a", "InClusterIPPool", "p").await;
    wait_claim(env, "a", "Ready", |c| c.status == "True").await;
    harness.served.bitpool.kill();

    let pools: Api<InClusterIPPool> = env.api();
    let refused = pools.delete("p", &DeleteParams::default()).await;
    match refused {
        Err(kube::Error::Api(e)) => assert!(
            e.message.contains("failed calling webhook"),
            "{}",
            e.message
        ),
        other => panic!("the delete must fail closed, got {other:?}"),
    }
    let grown = pools
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"addresses": ["10.9.0.0/23"]}})),
        )
        .await;
    assert!(grown.is_err(), "pool updates wait for bitpool");
    claim(env, "b", "InClusterIPPool", "p").await;
    assert!(
        env.api::<IPAddressClaim>().get("b").await.is_ok(),
        "claims are admitted without bitpool"
    );
    assert!(
        pools.get("p").await.is_ok(),
        "the pool and its addresses are untouched"
    );
    assert_eq!(address_of(env, "a").await, "10.9.0.1");
}

/// Without its certificate `run` stops at once and names the file (no listener without TLS).
#[tokio::test]
async fn a_missing_certificate_is_named_at_start() {
    let dir = support::root().join("target/test-certs/none");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_bitpool"))
        .args(["run", "--webhook-host=127.0.0.1"])
        .arg(format!("--webhook-port={}", support::process::free_port()))
        .arg(format!("--webhook-cert-dir={}", dir.display()))
        .env("KUBECONFIG", kubeconfig_path())
        .output();
    let output = tokio::time::timeout(std::time::Duration::from_secs(60), output)
        .await
        .expect("bitpool exits at once")
        .expect("run bitpool");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("{}/tls.crt", dir.display())),
        "{stderr}"
    );
}

fn metal3data_fixture(path: &str, namespace: &str) -> serde_json::Value {
    let path = support::root().join("tests/fixtures/roundtrip").join(path);
    let text = std::fs::read_to_string(&path).expect("read the fixture");
    serde_saphyr::from_str(&text.replace("NAMESPACE", namespace)).expect("parse the fixture")
}

fn metal3data_resource(kind: &str, version: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("infrastructure.cluster.x-k8s.io", version, kind),
        &format!("{}s", kind.to_lowercase()),
    )
}

/// The Metal3Data kinds as CAPM3 documents them at v1beta1, written at v1beta1 (stored at
/// v1beta2 through bitpool's conversion), read back unchanged at v1beta1 and in v1beta2's shape
/// at v1beta2 — `templateReference`, bond parameters and template indexes included.
#[tokio::test]
async fn metal3data_kinds_written_at_v1beta1_read_back_at_both_versions() {
    let harness = serve("wh-m3d", &[]).await;
    let env = &harness.env;
    for (file, kind) in [
        ("metal3datatemplate.yaml", "Metal3DataTemplate"),
        ("metal3data.yaml", "Metal3Data"),
        ("metal3dataclaim.yaml", "Metal3DataClaim"),
    ] {
        let old = metal3data_fixture(&format!("v1beta1/{file}"), env.name());
        let new = metal3data_fixture(file, env.name());
        let at = |version| {
            Api::<DynamicObject>::namespaced_with(
                env.client.clone(),
                env.name(),
                &metal3data_resource(kind, version),
            )
        };
        let object: DynamicObject = serde_json::from_value(old.clone()).expect("an object");
        let name = object.name_any();
        at("v1beta1")
            .create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("create {kind} at v1beta1: {e}"));
        if old.get("status").is_some() {
            at("v1beta1")
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": old["status"] })),
                )
                .await
                .unwrap_or_else(|e| panic!("{kind}: status at v1beta1: {e}"));
        }
        for (version, expected) in [("v1beta1", &old), ("v1beta2", &new)] {
            let read = at(version)
                .get(&name)
                .await
                .unwrap_or_else(|e| panic!("read {kind} at {version}: {e}"));
            for part in ["spec", "status"] {
                assert_eq!(
                    read.data[part], expected[part],
                    "{kind} at {version}: {part}"
                );
            }
        }
    }
    drop(harness);
}

/// Two thousand connections that never speak do not stop admission, and the server closes them
/// once the TLS handshake deadline has passed: idle and half-open connections cost nothing for
/// long.
#[tokio::test]
async fn idle_connections_neither_stop_admission_nor_stay() {
    let harness = serve("wh-idle", &[]).await;
    let env = &harness.env;
    let addr = format!("127.0.0.1:{}", harness.served.port);
    let mut idle = Vec::new();
    for _ in 0..2000 {
        idle.push(
            tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect to the webhook server"),
        );
    }
    let pools: Api<InClusterIPPool> = env.api();
    let bad = InClusterIPPool {
        metadata: env.meta("bad"),
        spec: capi_spec(&["not-an-ip"], 24),
        status: None,
    };
    assert_denied(
        pools.create(&PostParams::default(), &bad).await,
        &["spec: provided address is not a valid IP, range, nor CIDR"],
    );
    // Every idle connection is closed by the server: a read ends (EOF or reset).
    let closed = futures::future::join_all(idle.into_iter().map(|mut stream| async move {
        let mut byte = [0u8; 1];
        tokio::time::timeout(
            bitpool::net::http::HANDSHAKE_TIMEOUT + std::time::Duration::from_secs(20),
            tokio::io::AsyncReadExt::read(&mut stream, &mut byte),
        )
        .await
        .is_ok()
    }))
    .await;
    let open = closed.iter().filter(|c| !**c).count();
    assert_eq!(open, 0, "{open} idle connections were still open");
}

/// A client that acts as `user` (by impersonation, as the API server authenticates it).
async fn impersonating(user: &str) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(support::kubeconfig_path())
        .expect("read the kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("a usable kubeconfig");
    config.auth_info.impersonate = Some(user.into());
    config.auth_info.impersonate_groups = Some(vec!["system:authenticated".into()]);
    kube::Client::try_from(config).expect("a client")
}

/// Lets `user` create address objects of both kinds in the test's namespace, and nothing else.
async fn grant_address_writes(env: &Env, user: &str) {
    use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
    let role = Role {
        metadata: env.meta("address-writer"),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![CAPI_GROUP.into(), METAL3_GROUP.into()]),
            resources: Some(vec!["ipaddresses".into()]),
            verbs: vec!["create".into(), "get".into()],
            ..Default::default()
        }]),
    };
    create(&env.api(), &role).await;
    let binding = RoleBinding {
        metadata: env.meta("address-writer"),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: "address-writer".into(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "User".into(),
            name: user.into(),
            namespace: None,
        }]),
    };
    create(&env.api(), &binding).await;
}

/// A tenant who may write IPAddresses in its own namespace cannot make one for a pool bitpool
/// allocates from, of either kind: a shared global pool's address taken by hand, or a Metal3
/// pool's. bitpool's own objects pass (a claim is served), and so does the pool's owner's (here
/// the administrator, as `clusterctl move` writes them).
#[tokio::test]
async fn only_bitpool_and_a_pools_owners_make_its_address_objects() {
    let harness = serve("wh-writers", &[]).await;
    let env = &harness.env;
    let global = global_pool(env, "shared", capi_spec(&["10.91.0.0/28"], 24)).await;
    metal3_pool(env, "site", metal3_spec("10.92.0.10", "10.92.0.20", 24)).await;
    claim(env, "served", "GlobalInClusterIPPool", &global).await;
    wait_claim(env, "served", "served through the webhook", |c| {
        c.status == "True"
    })
    .await;

    let user = format!("tenant-{}", env.name());
    grant_address_writes(env, &user).await;
    let tenant = impersonating(&user).await;
    let capi_address = bitpool::api::capi::IPAddress {
        metadata: env.meta("by-hand"),
        spec: bitpool::api::capi::IPAddressSpec {
            claim_ref: bitpool::api::capi::LocalObjectName {
                name: "by-hand".into(),
            },
            pool_ref: bitpool::api::capi::IPPoolReference {
                name: global.clone(),
                kind: "GlobalInClusterIPPool".into(),
                api_group: CAPI_GROUP.into(),
            },
            address: "10.91.0.9".into(),
            prefix: 24,
            gateway: None,
        },
    };
    let theirs: Api<bitpool::api::capi::IPAddress> = Api::namespaced(tenant.clone(), env.name());
    assert_denied(
        theirs.create(&PostParams::default(), &capi_address).await,
        &[
            &format!("GlobalInClusterIPPool {global}"),
            "which bitpool allocates from",
            "create a claim",
        ],
    );
    let reference = |name: &str| k8s_openapi::api::core::v1::ObjectReference {
        name: Some(name.into()),
        namespace: Some(env.name().to_string()),
        ..Default::default()
    };
    let metal3_address = bitpool::api::metal3_ipam::Metal3IPAddress {
        metadata: env.meta("site-10-92-0-15"),
        spec: bitpool::api::metal3_ipam::Metal3IPAddressSpec {
            claim: reference("by-hand"),
            pool: reference("site"),
            address: "10.92.0.15".into(),
            prefix: Some(24),
            gateway: None,
            dns_servers: Vec::new(),
        },
    };
    let theirs: Api<bitpool::api::metal3_ipam::Metal3IPAddress> =
        Api::namespaced(tenant, env.name());
    assert_denied(
        theirs.create(&PostParams::default(), &metal3_address).await,
        &[&format!("IPPool {}/site", env.name())],
    );

    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let admin: Api<bitpool::api::capi::IPAddress> = env.api();
    admin
        .create(&dry_run, &capi_address)
        .await
        .expect("the pool's owner may write its address objects");
}

/// A pool's checks read what it has allocated from its ledger, not from a list of every address
/// object (which takes longer than the webhook's 10 s in a large cluster): an address reserved
/// in the ledger for a claim whose object is not created yet keeps the pool from being deleted,
/// and the message names that claim.
#[tokio::test]
async fn a_pools_checks_read_its_ledger() {
    let harness = serve("wh-ledger", &[]).await;
    let env = &harness.env;
    // Paused: bitpool's controllers leave its ledger as written here.
    let mut metadata = env.meta("p");
    metadata.annotations = Some([("cluster.x-k8s.io/paused".to_string(), String::new())].into());
    let pool = InClusterIPPool {
        metadata,
        spec: capi_spec(&["10.93.0.0/24"], 24),
        status: None,
    };
    let pools: Api<InClusterIPPool> = env.api();
    let pool = pools
        .create(&PostParams::default(), &pool)
        .await
        .expect("create the pool");
    let mut ledger = bitpool::ipam::ledger::Ledger::default();
    ledger.reserve(
        "10.93.0.5".parse().expect("an address"),
        bitpool::ipam::ledger::Reservation {
            claim_namespace: env.name().to_string(),
            claim_name: "in-flight".into(),
            claim_uid: "0b7d1c4e-0000-4000-8000-000000000001".into(),
            since: "2026-12-02T00:00:00Z".into(),
        },
    );
    bitpool::ipam::ledger::LedgerRef::new(
        env.client.clone(),
        env.name(),
        "InClusterIPPool",
        Some(env.name()),
        "p",
        pool.uid().expect("a UID"),
        None,
    )
    .create(&ledger)
    .await
    .expect("write the ledger");
    assert_denied(
        pools.delete("p", &DeleteParams::default()).await,
        &["1 address(es) held by claim(s): in-flight"],
    );
    let shrink = json!({"spec": {"addresses": ["10.93.0.100-10.93.0.200"]}});
    assert_denied(
        pools
            .patch("p", &PatchParams::default(), &Patch::Merge(&shrink))
            .await,
        &["10.93.0.5 (claim in-flight)"],
    );
}

/// A shared pool's `namespaceSelector` at admission: a selector that is not one is refused on the
/// pool, naming the field; a claim from a namespace the pool does not select is refused as kubectl
/// shows it, naming the pool, the selector and the namespace; labelled in, it is accepted.
#[tokio::test]
async fn claims_from_namespaces_a_shared_pool_does_not_select_are_refused() {
    let harness = serve("wh-tenancy", &[]).await;
    let env = &harness.env;
    let pp = PostParams::default();
    let globals: Api<GlobalInClusterIPPool> = Api::all(env.client.clone());
    let pool = |name: &str, selector: serde_json::Value| {
        let mut pool = GlobalInClusterIPPool {
            metadata: env.meta(&format!("{}-{name}", env.name())),
            spec: bitpool::api::capi_pools::GlobalInClusterIPPoolSpec {
                pool: capi_spec(&["10.90.0.10-10.90.0.20"], 24),
                namespace_selector: Some(serde_json::from_value(selector).expect("a selector")),
            },
            status: None,
        };
        pool.metadata.namespace = None;
        pool
    };
    let unknown_operator =
        json!({"matchExpressions": [{"key": "tenant", "operator": "Near", "values": ["x"]}]});
    assert_denied(
        globals.create(&pp, &pool("bad", unknown_operator)).await,
        &["spec.namespaceSelector"],
    );
    let tenant = env.name().to_string();
    let shared = pool("shared", json!({"matchLabels": {"tenant": tenant}}));
    assert_denied(
        globals.create(&pp, &shared).await,
        &["spec.namespaceSelector", "selects no namespace"],
    );
    // Once one namespace has the label, the pool is admitted; the claim's own still lacks it.
    let other = support::TestNamespace::new(&env.client, "wh-tenant").await;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone())
        .patch(
            &other.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"tenant": tenant}}})),
        )
        .await
        .expect("label a tenant's namespace");
    globals
        .create(&pp, &shared)
        .await
        .expect("a selector that selects a namespace is accepted");
    let name = shared.metadata.name.clone().unwrap_or_default();
    let manifest = format!(
        "apiVersion: ipam.cluster.x-k8s.io/v1beta2\nkind: IPAddressClaim\nmetadata:\n  name: outsider\n  namespace: {ns}\n  labels: {{{label}: {ns}}}\nspec:\n  poolRef: {{apiGroup: ipam.cluster.x-k8s.io, kind: GlobalInClusterIPPool, name: {name}}}\n",
        ns = env.name(),
        label = bitpool::api::labels::WATCH_FILTER,
    );
    let (applied, text) = kubectl(&["apply", "-f", "-"], &manifest);
    assert!(
        !applied,
        "an unselected namespace's claim was accepted: {text}"
    );
    assert!(
        text.contains("spec.poolRef")
            && text.contains(&format!("tenant={tenant}"))
            && text.contains(&format!("namespace {} is not one", env.name())),
        "{text}"
    );
    Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone())
        .patch(
            env.name(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"tenant": tenant}}})),
        )
        .await
        .expect("label the namespace in");
    let (applied, text) = kubectl(&["apply", "-f", "-"], &manifest);
    assert!(applied, "a selected namespace's claim was refused: {text}");
}
