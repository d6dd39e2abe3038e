//! CustomResourceDefinitions: bitpool's own and the pinned upstream ones, read and installed.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;

use super::env::root;

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
