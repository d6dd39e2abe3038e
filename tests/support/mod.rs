//! Shared set-up for the integration tests: a real API server ($KUBECONFIG, or the project's own
//! control plane started by `hack/control-plane.sh up`), CRDs, and one namespace per test.
#![allow(dead_code)] // each test binary uses a different part of this module

pub mod cut;
pub mod ipam;
pub mod ops;
pub mod plane;
pub mod webhook;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// Runs `hack/<name> <args>` (its progress on the test's stderr) and returns the path it prints:
/// what the scripts that build or render something (tools.sh, clusterctl-repo.sh) answer.
pub fn hack_script(name: &str, args: &[&str]) -> PathBuf {
    let output = std::process::Command::new(root().join("hack").join(name))
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("run hack/{name}: {e}"));
    assert!(output.status.success(), "hack/{name} {args:?} failed");
    PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

/// The repository root.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The upstream CRDs: `$BITPOOL_UPSTREAM_CRDS` when set, else the pinned upstream module versions
/// fetched (once, cached outside the checkout) by `hack/upstream-crds.sh`. Always `Some`: the
/// repository tests itself; the `Option` keeps the callers' early returns.
pub fn upstream_crds_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("BITPOOL_UPSTREAM_CRDS").filter(|d| !d.is_empty()) {
            return PathBuf::from(dir);
        }
        let output = std::process::Command::new(root().join("hack/upstream-crds.sh"))
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("run hack/upstream-crds.sh");
        assert!(output.status.success(), "hack/upstream-crds.sh failed");
        PathBuf::from(String::from_utf8_lossy(&output.stdout).trim().to_string())
    });
    assert!(dir.is_dir(), "upstream CRDs not found at {}", dir.display());
    dir.clone()
}

/// Reads one multi-document YAML file of CRDs.
pub fn read_crds(path: &Path) -> Vec<CustomResourceDefinition> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

/// The kubeconfig to use: $KUBECONFIG when set, else the local control plane's (started on demand).
pub fn kubeconfig_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(path) = std::env::var_os("KUBECONFIG").filter(|p| !p.is_empty()) {
            return PathBuf::from(path);
        }
        let output = std::process::Command::new(root().join("hack/control-plane.sh"))
            .arg("up")
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("run hack/control-plane.sh up");
        assert!(output.status.success(), "hack/control-plane.sh up failed");
        PathBuf::from(String::from_utf8_lossy(&output.stdout).trim().to_string())
    })
}

pub async fn client() -> Client {
    client_for(kubeconfig_path()).await
}

/// A client of the cluster of the kubeconfig at `path`.
pub async fn client_for(path: &Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(path)
        .unwrap_or_else(|e| panic!("read kubeconfig {}: {e}", path.display()));
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("usable kubeconfig");
    Client::try_from(config).expect("client")
}

/// Installs CRDs by server-side apply and waits until they are established.
pub async fn install_crds(client: &Client, crds: &[CustomResourceDefinition]) {
    bitpool::crds::apply(client, crds, Duration::from_secs(60))
        .await
        .expect("CRDs install and become established");
}

/// bitpool's own CRDs, plus the upstream CAPI IPAddressClaim/IPAddress/Cluster/Machine CRDs.
/// Returns false (test skipped) where the upstream CRDs are not available outside CI.
pub async fn install_all_crds(client: &Client) {
    let upstream = upstream_crds_dir();
    let mut crds = bitpool::crds::served();
    for file in [
        "cluster-api/ipam.cluster.x-k8s.io_ipaddressclaims.yaml",
        "cluster-api/ipam.cluster.x-k8s.io_ipaddresses.yaml",
        "cluster-api/cluster.x-k8s.io_clusters.yaml",
        "cluster-api/cluster.x-k8s.io_machines.yaml",
        "cluster-api-provider-metal3/infrastructure.cluster.x-k8s.io_metal3machines.yaml",
        "baremetal-operator/metal3.io_baremetalhosts.yaml",
    ] {
        crds.extend(read_crds(&upstream.join(file)));
    }
    install_crds(client, &crds).await;
}

/// A namespace of its own for one test, deleted when dropped (also when the test panics).
pub struct TestNamespace {
    pub name: String,
    /// The cluster it is in.
    kubeconfig: PathBuf,
}

impl TestNamespace {
    pub async fn new(client: &Client, prefix: &str) -> Self {
        Self::in_cluster(client, kubeconfig_path(), prefix).await
    }

    /// A namespace in the cluster of `kubeconfig` (whose client is `client`).
    pub async fn in_cluster(client: &Client, kubeconfig: &Path, prefix: &str) -> Self {
        let name = format!("{prefix}-{:08x}", rand::random::<u32>());
        let api: Api<Namespace> = Api::all(client.clone());
        let ns = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                labels: Some([("bitpool.test".to_string(), "true".to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        api.create(&PostParams::default(), &ns)
            .await
            .expect("create test namespace");
        Self {
            name,
            kubeconfig: kubeconfig.to_path_buf(),
        }
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let name = self.name.clone();
        let kubeconfig = self.kubeconfig.clone();
        run_to_completion(async move {
            let client = client_for(&kubeconfig).await;
            let api: Api<Namespace> = Api::all(client.clone());
            let _ = api.delete(&name, &DeleteParams::background()).await;
            release_finalizers(&client, &name).await;
        });
    }
}

/// Runs a cleanup future to completion from a `Drop`, which cannot await: on a thread with its
/// own runtime (the future must build its own client — the test's is served by the test's
/// runtime, which this blocks), so cleanup also runs when the test panics.
pub fn run_to_completion(cleanup: impl std::future::Future<Output = ()> + Send + 'static) {
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        if let Ok(runtime) = runtime {
            runtime.block_on(cleanup);
        }
    });
    let _ = thread.join();
}

/// The kinds whose objects carry bitpool's finalizers. With no bitpool left running after a
/// test, nothing else would remove them, and the namespace would stay Terminating forever.
fn finalized_kinds() -> Vec<kube::api::ApiResource> {
    use bitpool::api::{capi, capi_pools, metal3_data, metal3_ipam};
    vec![
        kube::api::ApiResource::erase::<capi::IPAddressClaim>(&()),
        kube::api::ApiResource::erase::<capi::IPAddress>(&()),
        kube::api::ApiResource::erase::<capi_pools::InClusterIPPool>(&()),
        kube::api::ApiResource::erase::<metal3_ipam::IPPool>(&()),
        kube::api::ApiResource::erase::<metal3_ipam::IPClaim>(&()),
        kube::api::ApiResource::erase::<metal3_ipam::Metal3IPAddress>(&()),
        kube::api::ApiResource::erase::<metal3_data::Metal3DataTemplate>(&()),
        kube::api::ApiResource::erase::<metal3_data::Metal3Data>(&()),
        kube::api::ApiResource::erase::<metal3_data::Metal3DataClaim>(&()),
    ]
}

/// Removes every finalizer from the objects of `finalized_kinds` in `namespace`.
async fn release_finalizers(client: &Client, namespace: &str) {
    use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
    let clear = Patch::Merge(serde_json::json!({ "metadata": { "finalizers": null } }));
    for resource in finalized_kinds() {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
        let Ok(list) = api.list(&ListParams::default()).await else {
            continue;
        };
        for object in list.items {
            if let Some(name) = object.metadata.name.as_deref() {
                let _ = api.patch(name, &PatchParams::default(), &clear).await;
            }
        }
    }
}

/// Polls `check` until it returns `Some`, or panics after `timeout` with `what` in the message.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A `bitpool run` process serving one test namespace (its claims and namespaced pools, and
/// global pools labelled with the same watch filter), killed when dropped.
pub struct Bitpool {
    child: Option<std::process::Child>,
    pub log: PathBuf,
}

impl Bitpool {
    /// Starts `bitpool run` limited to `namespace` (also its watch filter and ledger namespace).
    pub fn start(namespace: &str, extra_args: &[&str]) -> Self {
        let mut args = vec!["--namespace", namespace];
        args.extend_from_slice(extra_args);
        Self::spawn(namespace, &args)
    }

    /// Starts `bitpool run` limited to `namespace`, with its ledgers in `ledger_namespace`.
    pub fn start_with_ledger_namespace(namespace: &str, ledger_namespace: &str) -> Self {
        Self::spawn_with(namespace, ledger_namespace, &["--namespace", namespace])
    }

    /// Starts `bitpool run` over every namespace, for objects labelled with `filter` (which is
    /// also its ledger namespace).
    pub fn start_all_namespaces(filter: &str) -> Self {
        Self::spawn(filter, &[])
    }

    fn spawn(filter: &str, extra_args: &[&str]) -> Self {
        Self::spawn_with(filter, filter, extra_args)
    }

    fn spawn_with(filter: &str, ledger_namespace: &str, extra_args: &[&str]) -> Self {
        let mut args = vec!["--watch-filter", filter];
        args.extend_from_slice(extra_args);
        Self::spawn_in(kubeconfig_path(), filter, ledger_namespace, &args, &[])
    }

    /// Like [`Bitpool::start`], on a machine whose clock is off by `offset` (libfaketime's
    /// `FAKETIME`, e.g. `+120s` or `-400d`); the monotonic clock is left alone.
    pub fn start_with_clock(namespace: &str, offset: &str, extra_args: &[&str]) -> Self {
        let mut args = vec!["--watch-filter", namespace, "--namespace", namespace];
        args.extend_from_slice(extra_args);
        let library = faketime_library();
        let env = [
            ("LD_PRELOAD", library.as_str()),
            ("FAKETIME", offset),
            ("DONT_FAKE_MONOTONIC", "1"),
        ];
        Self::spawn_in(kubeconfig_path(), namespace, namespace, &args, &env)
    }

    /// Like [`Bitpool::start`], against the cluster of `kubeconfig` (a relay to the same API
    /// server, say).
    pub fn start_via(kubeconfig: &Path, namespace: &str, extra_args: &[&str]) -> Self {
        let mut args = vec!["--watch-filter", namespace, "--namespace", namespace];
        args.extend_from_slice(extra_args);
        Self::spawn_in(kubeconfig, namespace, namespace, &args, &[])
    }

    /// Starts `bitpool run` with `args` alone (no namespace or watch filter) against the
    /// cluster of `kubeconfig`, as a deployment runs it; `name` names its log.
    pub fn start_in(kubeconfig: &Path, name: &str, args: &[&str]) -> Self {
        Self::spawn_in(kubeconfig, name, "bitpool-system", args, &[])
    }

    fn spawn_in(
        kubeconfig: &Path,
        name: &str,
        ledger_namespace: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = root().join("target/test-logs");
        std::fs::create_dir_all(&dir).expect("create target/test-logs");
        let log = dir.join(format!("bitpool-{name}-{n}.log"));
        let file = std::fs::File::create(&log).expect("create log file");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_bitpool"))
            .args(["run", "--ledger-namespace", ledger_namespace])
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            // No webhooks unless a test asks for them (`--webhook-port=…` wins over this).
            .env("BITPOOL_WEBHOOK_PORT", "0")
            // Likewise no probe or metrics servers: many processes run side by side.
            .env("BITPOOL_HEALTH_ADDR", "0")
            .env("BITPOOL_DIAGNOSTICS_ADDRESS", "0")
            .env("RUST_LOG", "info,bitpool=debug,kube_runtime=debug")
            .envs(env.iter().copied())
            .stdout(file.try_clone().expect("log file handle"))
            .stderr(file)
            .spawn()
            .expect("start bitpool");
        Self {
            child: Some(child),
            log,
        }
    }

    /// SIGKILL: no shutdown, no cleanup, whatever API call was in flight is cut off.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, as Kubernetes stops a pod.
    pub fn terminate(&self) {
        if let Some(child) = &self.child {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
    }

    /// Waits up to `limit` for the process to exit; whether it did.
    pub fn wait_exit(&mut self, limit: Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        while std::time::Instant::now() < deadline {
            if !self.is_running() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// Whether the process is still running (it has not exited on an error).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for Bitpool {
    fn drop(&mut self) {
        self.kill();
    }
}

/// libfaketime's multithreaded library (Debian's libfaketime package), which hack/test.sh
/// installs; a test that needs it fails without it.
fn faketime_library() -> String {
    let found = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|dir| dir.path().join("faketime/libfaketimeMT.so.1"))
        .find(|path| path.exists());
    match found {
        Some(path) => path.display().to_string(),
        None => panic!("libfaketime is not installed (Debian: apt-get install libfaketime)"),
    }
}

/// A test's cluster handle and namespace, with objects labelled for its bitpool's watch filter.
pub struct Env {
    pub client: Client,
    pub ns: TestNamespace,
}

impl Env {
    /// With every CRD the tests use installed (a test fails when they cannot be).
    pub async fn new(prefix: &str) -> Self {
        let client = client().await;
        install_all_crds(&client).await;
        let ns = TestNamespace::new(&client, prefix).await;
        Self { client, ns }
    }

    /// A test namespace in the cluster of `kubeconfig` (a dedicated control plane).
    pub async fn in_cluster(kubeconfig: &Path, prefix: &str) -> Self {
        let client = client_for(kubeconfig).await;
        install_all_crds(&client).await;
        let ns = TestNamespace::in_cluster(&client, kubeconfig, prefix).await;
        Self { client, ns }
    }

    pub fn name(&self) -> &str {
        &self.ns.name
    }

    /// Metadata for an object of this test: its namespace and the watch-filter label.
    pub fn meta(&self, name: &str) -> kube::api::ObjectMeta {
        kube::api::ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(self.ns.name.clone()),
            labels: Some(
                [(
                    bitpool::runtime::WATCH_FILTER_LABEL.to_string(),
                    self.ns.name.clone(),
                )]
                .into(),
            ),
            ..Default::default()
        }
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), self.name())
    }

    /// The name of the ledger of this test's pool `kind`/`name` (tests run bitpool with the test
    /// namespace as its ledger namespace).
    pub fn ledger_name(&self, kind: &str, pool: &str) -> String {
        let namespace = (!kind.starts_with("Global")).then_some(self.name());
        bitpool::ipam::ledger::ledger_name(kind, namespace, pool)
    }

    /// The ledger of this test's pool `kind`/`name`, decoded; `None` when missing or unreadable.
    pub async fn ledger(&self, kind: &str, pool: &str) -> Option<bitpool::ipam::ledger::Ledger> {
        let api: Api<k8s_openapi::api::core::v1::ConfigMap> = self.api();
        let config_map = api.get_opt(&self.ledger_name(kind, pool)).await.ok()??;
        bitpool::ipam::ledger::Ledger::from_config_map(&config_map).ok()
    }
}
