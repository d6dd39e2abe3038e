//! A control plane of a test's own (hack/control-plane.sh on other ports and another state
//! folder), for tests that install cluster-wide things the shared plane's other tests must not
//! see: clusterctl's providers with their webhooks, bitpool's released components. Stopped when
//! dropped.

use std::path::PathBuf;
use std::process::Command;

use kube::Client;

use super::root;

pub struct Dedicated {
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
}

/// Two consecutive free ports (etcd's client and peer ports).
fn free_pair() -> u16 {
    loop {
        let port = super::process::free_port();
        if port < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
}

impl Dedicated {
    pub fn start(name: &str) -> Self {
        Self::start_with(name, "")
    }

    /// A plane whose kube-apiserver takes `apiserver_args` beside the script's own flags.
    pub fn start_with(name: &str, apiserver_args: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "bitpool-plane-{name}-{:08x}",
            rand::random::<u32>()
        ));
        let output = Command::new(root().join("hack/control-plane.sh"))
            .arg("up")
            .env("BITPOOL_CP_DIR", &dir)
            .env("BITPOOL_CP_PORT", super::process::free_port().to_string())
            .env("BITPOOL_ETCD_PORT", free_pair().to_string())
            .env("BITPOOL_APISERVER_ARGS", apiserver_args)
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("run hack/control-plane.sh up");
        assert!(
            output.status.success(),
            "a dedicated control plane did not start"
        );
        let kubeconfig = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim().to_string());
        Self { dir, kubeconfig }
    }

    pub async fn client(&self) -> Client {
        super::client_for(&self.kubeconfig).await
    }
}

impl Drop for Dedicated {
    fn drop(&mut self) {
        let _ = Command::new(root().join("hack/control-plane.sh"))
            .arg("down")
            .env("BITPOOL_CP_DIR", &self.dir)
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
