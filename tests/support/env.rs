//! The cluster a test runs against: its kubeconfig ($KUBECONFIG, or the project's own control
//! plane started on demand), clients, and a namespace of the test's own with its objects'
//! metadata and ledgers.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use super::crds::install_all_crds;

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
            delete_global_pools(&client, &name).await;
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

/// Deletes the cluster-scoped pools labelled with the watch filter `namespace` (the global pools
/// of that namespace's test), their finalizers first: no bitpool is left to release them.
async fn delete_global_pools(client: &Client, namespace: &str) {
    use bitpool::api::capi_pools::{GlobalInClusterIPPool, GlobalInClusterPrefixPool};
    use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
    let labelled = ListParams::default().labels(&format!(
        "{}={namespace}",
        bitpool::api::labels::WATCH_FILTER
    ));
    let clear = Patch::Merge(serde_json::json!({ "metadata": { "finalizers": null } }));
    for resource in [
        kube::api::ApiResource::erase::<GlobalInClusterIPPool>(&()),
        kube::api::ApiResource::erase::<GlobalInClusterPrefixPool>(&()),
    ] {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let Ok(list) = api.list(&labelled).await else {
            continue;
        };
        for pool in list.items {
            if let Some(name) = pool.metadata.name.as_deref() {
                let _ = api.patch(name, &PatchParams::default(), &clear).await;
                let _ = api.delete(name, &DeleteParams::default()).await;
            }
        }
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
                    bitpool::api::labels::WATCH_FILTER.to_string(),
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
