//! The real clusterctl (built from the Go module proxy by hack/tools.sh) with the local
//! repository of hack/clusterctl-repo.sh: bitpool's release artifacts beside Cluster API core,
//! kubeadm, CAPM3 and Metal3 IPAM rendered from their own modules, on a plane of a test's own.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::Api;

use super::plane::Dedicated;
use super::{eventually, install_crds, read_crds, root};

/// A stand-in for cert-manager: its kinds, which is all clusterctl checks before it installs a
/// provider. Nothing issues certificates; the tests that serve webhooks bring their own.
pub async fn install_cert_manager_stand_in(client: &Client) {
    let stand_in = read_crds(&root().join("tests/fixtures/clusterctl/cert-manager-crds.yaml"));
    install_crds(client, &stand_in).await;
}

/// The output of a tool the test runs, failing the test with it when the tool fails.
pub fn run(command: &mut Command, what: &str) -> String {
    let output = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{what} failed:\n{text}");
    text
}

pub struct Clusterctl {
    bin: PathBuf,
    repository: PathBuf,
    config: PathBuf,
    kubeconfig: PathBuf,
    home: PathBuf,
}

impl Clusterctl {
    pub fn new(plane: &Dedicated) -> Self {
        let bin = super::hack_script("tools.sh", &["clusterctl"]);
        let repo = plane.dir.join("repository");
        let config = super::hack_script(
            "clusterctl-repo.sh",
            &[repo.to_str().expect("a UTF-8 path")],
        );
        let home = plane.dir.join("home");
        std::fs::create_dir_all(&home).expect("a home for clusterctl");
        Self {
            bin,
            repository: repo,
            config,
            kubeconfig: plane.kubeconfig.clone(),
            home,
        }
    }

    /// The local repository's folder (hack/clusterctl-repo.sh's OUT).
    pub fn repository(&self) -> &std::path::Path {
        &self.repository
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.bin);
        command
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .env("KUBECONFIG", &self.kubeconfig)
            // No version check against the internet, no user overrides.
            .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
            .env("HOME", &self.home)
            .env("XDG_CONFIG_HOME", &self.home);
        command
    }

    pub fn run(&self, args: &[&str]) -> String {
        run(
            &mut self.command(args),
            &format!("clusterctl {}", args.join(" ")),
        )
    }

    /// `clusterctl init`, once the namespace of the previous init's cert-manager check is gone
    /// (while it terminates, the check fails and clusterctl would download cert-manager).
    pub async fn init(&self, client: &Client, args: &[&str]) -> String {
        let namespaces: Api<Namespace> = Api::all(client.clone());
        eventually(
            "the cert-manager check's namespace to go",
            Duration::from_secs(90),
            || async {
                matches!(namespaces.get_opt("cert-manager-test").await, Ok(None)).then_some(())
            },
        )
        .await;
        let mut all = vec!["init"];
        all.extend_from_slice(args);
        self.run(&all)
    }
}
