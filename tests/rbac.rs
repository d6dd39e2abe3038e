//! bitpool under exactly the RBAC it ships: the bare-metal bundle's components (as
//! hack/release.sh renders them, variables at their defaults) applied to a control plane of the
//! test's own, whose API server enforces OwnerReferencesPermissionEnforcement, and `bitpool run`
//! with the components' ServiceAccount token, as the Deployment runs it (leader election, secure
//! metrics). Every pool kind serves and releases claims of both kinds, and no request of bitpool's
//! is forbidden; what the role leaves out stays out of reach.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use bitpool::api::capi::IPAddressClaim;
use bitpool::api::metal3_ipam::{IPClaim, IPPool};
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams};
use support::build::*;
use support::ops::{Endpoints, bind_cluster_role, service_account, token, token_kubeconfig};
use support::plane::Dedicated;
use support::wait::*;
use support::{Env, eventually, root};

const NAMESPACE: &str = "bitpool-system";

/// `${VAR:=default}` → `default`, as clusterctl substitutes variables nobody set.
fn defaults(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('}') else {
            break;
        };
        let variable = &rest[start + 2..start + end];
        out.push_str(variable.split_once(":=").map_or("", |(_, d)| d));
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    out
}

/// The bundle's components applied with kubectl, less the webhook configurations (no pod runs
/// here to answer them; the webhook tests cover them).
/// `kubectl` against `plane`, failing the test when it fails.
fn kubectl(plane: &Dedicated, args: &[&str]) {
    let output = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", &plane.kubeconfig)
        .output()
        .expect("run kubectl");
    assert!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The release's files for the bare-metal bundle (rendered once per plane).
fn release_dir(plane: &Dedicated) -> PathBuf {
    plane.dir.join("release/ipam-bitpool-baremetal/v0.2.1")
}

fn apply_components(plane: &Dedicated) {
    let release = plane.dir.join("release");
    let status = Command::new(root().join("hack/release.sh"))
        .arg("v0.2.1")
        .arg(&release)
        .status()
        .expect("run hack/release.sh");
    assert!(status.success(), "hack/release.sh failed");
    let rendered = release_dir(plane).join("ipam-components.yaml");
    let text = std::fs::read_to_string(&rendered).expect("the rendered components");
    let applied = plane.dir.join("components.yaml");
    std::fs::write(&applied, defaults(&text)).expect("write the components");
    let path = applied.to_str().expect("a UTF-8 path");
    kubectl(plane, &["apply", "--server-side", "-f", path]);
    kubectl(
        plane,
        &[
            "delete",
            "validatingwebhookconfigurations,mutatingwebhookconfigurations",
            "-l",
            "cluster.x-k8s.io/provider=ipam-bitpool-baremetal",
        ],
    );
}

/// A kubeconfig that is the ServiceAccount `bitpool-manager`, as its pod would be.
async fn service_account_kubeconfig(plane: &Dedicated, client: &Client) -> PathBuf {
    let token = token(client, NAMESPACE, "bitpool-manager").await;
    let path = plane.dir.join("bitpool-manager.kubeconfig");
    token_kubeconfig(&plane.kubeconfig, &token, &path);
    path
}

struct Running {
    child: Child,
    log: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `bitpool run` with the Deployment's flags, as the ServiceAccount.
fn run_as(kubeconfig: &Path, endpoints: &Endpoints) -> Running {
    let dir = root().join("target/test-logs");
    std::fs::create_dir_all(&dir).expect("create target/test-logs");
    let log = dir.join("bitpool-rbac.log");
    let file = std::fs::File::create(&log).expect("create the log");
    let child = Command::new(env!("CARGO_BIN_EXE_bitpool"))
        .args([
            "run",
            "--controllers=capi-ipam,metal3-ipam,migration-proxy",
            "--leader-elect",
        ])
        .args(endpoints.args(true))
        .arg("--webhook-port=0")
        .env("KUBECONFIG", kubeconfig)
        .env("BITPOOL_LEDGER_NAMESPACE", NAMESPACE)
        .env("RUST_LOG", "info,bitpool=debug")
        .stdout(file.try_clone().expect("log handle"))
        .stderr(file)
        .spawn()
        .expect("start bitpool");
    Running { child, log }
}

/// Claims of both kinds on pools of every kind, and a Cluster's endpoint claim, served and
/// released.
async fn serve_every_pool_kind(env: &Env) {
    capi_pool(env, "capi", capi_spec(&["10.90.0.0/24"], 24)).await;
    let global = global_pool(env, "global", capi_spec(&["10.91.0.0/24"], 24)).await;
    metal3_pool(env, "m3", metal3_spec("10.92.0.10", "10.92.0.20", 24)).await;
    claim(env, "on-capi", "InClusterIPPool", "capi").await;
    claim(env, "on-global", "GlobalInClusterIPPool", &global).await;
    claim(env, "on-m3", "IPPool", "m3").await;
    ipclaim(env, "ipclaim-on-m3", "m3").await;
    for name in ["on-capi", "on-global", "on-m3"] {
        wait_claim(env, name, "served", |c| c.status == "True").await;
    }
    wait_ipclaim(env, "ipclaim-on-m3").await;
    let ipclaims: Api<IPClaim> = env.api();
    // A Cluster whose endpoint comes from a pool: its claim made, its endpoint patched.
    let clusters = support::dynamic::api(
        &env.client,
        env.name(),
        "cluster.x-k8s.io/v1beta2",
        "Cluster",
    );
    support::dynamic::create(
        &env.client,
        env.name(),
        serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "endpoint", "annotations": {
                bitpool::api::capi::ENDPOINT_POOL_ANNOTATION: "InClusterIPPool/capi",
            }},
            "spec": {"infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerCluster", "name": "endpoint",
            }},
        }),
    )
    .await;
    eventually("the Cluster's endpoint is filled", WAIT, || async {
        let cluster = clusters.get("endpoint").await.ok()?;
        let host = cluster.data["spec"]["controlPlaneEndpoint"]["host"].as_str()?;
        host.starts_with("10.90.0.").then_some(())
    })
    .await;
    clusters
        .delete("endpoint", &DeleteParams::default())
        .await
        .expect("delete the Cluster (its endpoint claim goes with it)");

    let claims: Api<IPAddressClaim> = env.api();
    for name in ["on-capi", "on-global", "on-m3"] {
        claims
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete a claim");
    }
    ipclaims
        .delete("ipclaim-on-m3", &DeleteParams::default())
        .await
        .expect("delete the IPClaim");
    eventually("every claim released", WAIT, || async {
        let left = claims.list(&ListParams::default()).await.ok()?.items.len()
            + ipclaims
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .len();
        (left == 0).then_some(())
    })
    .await;
    let globals: Api<bitpool::api::capi_pools::GlobalInClusterIPPool> =
        Api::all(env.client.clone());
    let _ = globals.delete(&global, &DeleteParams::default()).await;
}

#[tokio::test]
async fn the_shipped_service_account_serves_every_pool_kind_under_owner_reference_enforcement() {
    let plane = Dedicated::start("rbac");
    let admin = plane.client().await;
    let stand_in =
        support::read_crds(&root().join("tests/fixtures/clusterctl/cert-manager-crds.yaml"));
    support::install_crds(&admin, &stand_in).await;
    apply_components(&plane);
    let env = Env::in_cluster(&plane.kubeconfig, "tenant").await;
    let kubeconfig = service_account_kubeconfig(&plane, &admin).await;
    let endpoints = Endpoints::new();
    let bitpool = run_as(&kubeconfig, &endpoints);
    eventually("bitpool ready as its ServiceAccount", WAIT, || async {
        (endpoints.readyz().await.0 == 200).then_some(())
    })
    .await;

    serve_every_pool_kind(&env).await;

    // Secure metrics: bitpool may ask the API server about a caller the shipped role lets read.
    let scraper_token = service_account(&env, "scraper").await;
    bind_cluster_role(&env, "scraper", "bitpool-metrics-reader", "scraper").await;
    let metrics = eventually("the scraper reads /metrics", WAIT, || async {
        let (status, body) = endpoints.secure_metrics(Some(&scraper_token)).await;
        (status == 200).then_some(body)
    })
    .await;
    assert!(metrics.contains("bitpool_leader 1"), "{metrics}");

    let log = std::fs::read_to_string(&bitpool.log).unwrap_or_default();
    let forbidden: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("forbidden") || l.contains("Forbidden"))
        .collect();
    assert!(
        forbidden.is_empty(),
        "bitpool was refused under its own role:\n{}",
        forbidden.join("\n")
    );

    // Least privilege: what the bundle does not call, its account cannot do.
    let as_bitpool = support::client_for(&kubeconfig).await;
    let secrets: Api<Secret> = Api::namespaced(as_bitpool.clone(), env.name());
    let refused = secrets.list(&ListParams::default()).await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403),
        "the bundle's account may list Secrets: {refused:?}"
    );
    // Secrets are the Metal3Data reconciler's, which the bundle does not enable by default.
    let refused = secrets.get("rendered").await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403),
        "the bundle's account may read Secrets without metal3-data: {refused:?}"
    );
    let addon = release_dir(&plane).join("metal3-data-rbac.yaml");
    kubectl(
        &plane,
        &["apply", "-f", addon.to_str().expect("a UTF-8 path")],
    );
    eventually(
        "metal3-data-rbac.yaml lets the account read Secrets",
        WAIT,
        || async {
            matches!(secrets.get("rendered").await, Err(kube::Error::Api(s)) if s.code == 404)
                .then_some(())
        },
    )
    .await;
    let pools: Api<IPPool> = Api::namespaced(as_bitpool, env.name());
    let deleted = pools
        .delete("anything", &DeleteParams::default())
        .await
        .map(|_| ());
    assert!(
        matches!(&deleted, Err(kube::Error::Api(s)) if s.code == 403),
        "the bundle's account may delete IPPools: {deleted:?}"
    );
}
