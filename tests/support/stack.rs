//! The whole Metal3 stack on a control plane of a test's own, as an operator installs it:
//! `clusterctl init --infrastructure metal3 --ipam bitpool-baremetal` with the real clusterctl and
//! the local repository of hack/clusterctl-repo.sh, and the baremetal-operator's own manifests.
//! No pod runs here, so each manager runs as a process on this machine instead of its Deployment
//! — Cluster API core, CAPM3 and the baremetal-operator (in its test mode: its fixture
//! provisioner walks hosts through registration, inspection and provisioning without Ironic),
//! all built from the Go module proxy by hack/tools.sh, and bitpool — each serving its webhooks
//! and conversions on 127.0.0.1, where the installed webhook configurations and CRDs are pointed.
//!
//! The one part played here is the kubelet ([`Kubelet`]): a Node for each provisioned host.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, WebhookClientConfig as ConversionClientConfig,
};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::clusterctl::{Clusterctl, install_cert_manager_stand_in};
use super::plane::Dedicated;
use super::process::free_port;
use super::wait::wait_listening;
use super::webhook::Certs;
use super::{Bitpool, hack_script, root};

/// The namespaces clusterctl and the baremetal-operator's manifests install each manager in,
/// with the tool that builds it (bitpool's is this crate's binary).
const CAPI: &str = "capi-system";
const CAPM3: &str = "capm3-system";
const BMO: &str = "baremetal-operator-system";
const BITPOOL: &str = "bitpool-system";

/// An upstream manager running as a process, killed when dropped. Its log:
/// `target/test-logs/<tool>-<name>.log`.
pub struct Manager {
    child: Child,
    pub log: PathBuf,
}

impl Manager {
    pub fn start(tool: &str, name: &str, args: &[String], env: &[(&str, &Path)]) -> Self {
        let bin = hack_script("tools.sh", &[tool]);
        let dir = root().join("target/test-logs");
        std::fs::create_dir_all(&dir).expect("create target/test-logs");
        let log = dir.join(format!("{tool}-{name}.log"));
        let file = std::fs::File::create(&log).expect("create the log");
        let child = Command::new(bin)
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_os_str())))
            .stdout(file.try_clone().expect("log handle"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("start {tool}: {e}"));
        Self { child, log }
    }

    /// Whether it is still running (a manager that exits at start says why in its log).
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The flags Cluster API core and CAPM3 (controller-runtime managers built alike) run with here:
/// webhooks on `port` with the certificates in `certs`, no probe or diagnostics servers.
pub fn manager_args(port: u16, certs: &Path) -> Vec<String> {
    vec![
        format!("--webhook-port={port}"),
        format!("--webhook-cert-dir={}", certs.display()),
        "--health-addr=0".to_string(),
        "--diagnostics-address=0".to_string(),
        "--insecure-diagnostics".to_string(),
        // Their CRD migrators would rewrite every object of their kinds at start: not the
        // subject here, and writers the tests would have to tell apart.
        "--skip-crd-migration-phases=StorageVersionMigration".to_string(),
        "--skip-crd-migration-phases=CleanupManagedFields".to_string(),
        "--v=2".to_string(),
    ]
}

/// What differs between the stacks of the scenarios.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// CAPM3's and bitpool's `--enable-bmh-name-based-preallocation`: IPClaims named after the
    /// host, so that a host keeps its addresses across machines.
    pub bmh_name_preallocation: bool,
    /// `bitpool run` arguments beyond the webhook server's.
    pub bitpool_args: Vec<String>,
}

pub struct Stack {
    pub name: String,
    pub client: Client,
    pub kubeconfig: PathBuf,
    pub clusterctl: Clusterctl,
    pub options: Options,
    /// The port of each manager's webhook server, by the namespace it is installed in.
    ports: BTreeMap<&'static str, u16>,
    managers: Vec<Manager>,
    bitpool: Option<Bitpool>,
    certs: Certs,
    pub plane: Dedicated,
}

impl Stack {
    /// A plane with the providers installed by clusterctl, every manager running, and bitpool.
    pub async fn start(name: &str, options: Options) -> Self {
        let plane = Dedicated::start(name);
        let client = plane.client().await;
        install_cert_manager_stand_in(&client).await;
        let clusterctl = Clusterctl::new(&plane);
        clusterctl
            .init(
                &client,
                &["--infrastructure", "metal3", "--ipam", "bitpool-baremetal"],
            )
            .await;
        apply_baremetal_operator(&client, &plane, &clusterctl).await;
        let certs = Certs::generate(&format!("stack-{name}"));
        let ports = BTreeMap::from([
            (CAPI, free_port()),
            (CAPM3, free_port()),
            (BMO, free_port()),
            (BITPOOL, free_port()),
        ]);
        serve_webhooks_locally(&client, &ports, &certs.ca_pem).await;
        let mut stack = Self {
            name: name.to_string(),
            client,
            kubeconfig: plane.kubeconfig.clone(),
            clusterctl,
            options,
            ports,
            managers: Vec::new(),
            bitpool: None,
            certs,
            plane,
        };
        stack.start_managers().await;
        stack.start_bitpool().await;
        stack
    }

    async fn start_managers(&mut self) {
        let kubeconfig = self.kubeconfig.clone();
        let certs = self.certs.dir.clone();
        let common = |port: u16| manager_args(port, &certs);
        let kube = [("KUBECONFIG", kubeconfig.as_path())];
        let capi = common(self.ports[CAPI]);
        self.managers
            .push(Manager::start("capi-core", &self.name, &capi, &kube));
        let mut capm3 = common(self.ports[CAPM3]);
        if self.options.bmh_name_preallocation {
            capm3.push("--enable-bmh-name-based-preallocation".to_string());
        }
        self.managers
            .push(Manager::start("capm3", &self.name, &capm3, &kube));
        // The baremetal-operator has no flag for its certificates: controller-runtime's default
        // folder, under the process's temporary directory.
        let tmp = self.certs.dir.join("bmo-tmp");
        let serving = tmp.join("k8s-webhook-server/serving-certs");
        std::fs::create_dir_all(&serving).expect("the baremetal-operator's cert folder");
        for file in ["tls.crt", "tls.key"] {
            std::fs::copy(self.certs.dir.join(file), serving.join(file)).expect("copy a cert");
        }
        let bmo = vec![
            "--test-mode".to_string(),
            format!("--webhook-port={}", self.ports[BMO]),
            "--health-addr=0".to_string(),
            "--metrics-addr=0".to_string(),
        ];
        let env = [
            ("KUBECONFIG", kubeconfig.as_path()),
            ("TMPDIR", tmp.as_path()),
        ];
        self.managers
            .push(Manager::start("bmo", &self.name, &bmo, &env));
        for (namespace, port) in [(CAPI, "capi-core"), (CAPM3, "capm3"), (BMO, "bmo")] {
            wait_listening(
                self.ports[namespace],
                &format!(
                    "{port}'s webhook server listens (log: target/test-logs/{port}-{}.log)",
                    self.name
                ),
            )
            .await;
        }
    }

    /// Starts bitpool (again, after [`Self::stop_bitpool`]).
    pub async fn start_bitpool(&mut self) {
        let mut args = vec![
            format!("--webhook-port={}", self.ports[BITPOOL]),
            format!("--webhook-cert-dir={}", self.certs.dir.display()),
        ];
        args.extend(self.options.bitpool_args.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut bitpool = Bitpool::start_in(&self.kubeconfig, &self.name, &args);
        wait_listening(
            self.ports[BITPOOL],
            "bitpool's webhook server listens (log: target/test-logs/bitpool-*.log)",
        )
        .await;
        // Whoever listens must be bitpool: one that could not take its port has exited.
        assert!(
            bitpool.is_running(),
            "bitpool exited at start (log: target/test-logs/bitpool-{}-*.log)",
            self.name
        );
        self.bitpool = Some(bitpool);
    }

    /// SIGKILL to bitpool: whatever it had in flight is cut off.
    pub fn kill_bitpool(&mut self) {
        if let Some(mut bitpool) = self.bitpool.take() {
            bitpool.kill();
        }
    }

    /// Every manager still runs (none exited on an error of its own).
    pub fn assert_managers_running(&mut self) {
        for manager in &mut self.managers {
            assert!(
                manager.running(),
                "a manager exited: {}",
                manager.log.display()
            );
        }
    }

    /// The plane's kubeconfig with its certificates inline, as a workload cluster's kubeconfig
    /// Secret holds it (the workload cluster is the management cluster itself here).
    pub fn inline_kubeconfig(&self) -> String {
        inline_kubeconfig(&self.kubeconfig)
    }
}

/// The baremetal-operator's manifests (its CRDs, webhook configuration and Deployment), as
/// `kubectl apply -k config/default` installs them.
async fn apply_baremetal_operator(client: &Client, plane: &Dedicated, clusterctl: &Clusterctl) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace =
        serde_json::from_value(json!({"metadata": {"name": BMO}})).expect("a namespace");
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create the baremetal-operator's namespace");
    let manifests = clusterctl.repository().join(format!(
        "baremetal-operator/{}/components.yaml",
        bmo_version()
    ));
    super::clusterctl::run(
        Command::new("kubectl")
            .args([
                "apply",
                "--server-side",
                "--field-manager=bmo-install",
                "-f",
            ])
            .arg(&manifests)
            .env("KUBECONFIG", &plane.kubeconfig),
        "kubectl apply the baremetal-operator's manifests",
    );
}

/// The baremetal-operator version hack/versions.env pins.
fn bmo_version() -> String {
    let output = Command::new("bash")
        .arg("-c")
        .arg(". hack/versions.env && echo \"$BITPOOL_BMO_VERSION\"")
        .current_dir(root())
        .output()
        .expect("read hack/versions.env");
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// Points every webhook configuration and CRD conversion that calls a Service in one of
/// `ports`' namespaces at that manager on 127.0.0.1, trusting `ca_pem`; removes the webhook
/// configurations of managers that do not run here (kubeadm's: no kubeadm object is made).
async fn serve_webhooks_locally(client: &Client, ports: &BTreeMap<&str, u16>, ca_pem: &str) {
    let url = |namespace: &str, path: Option<&str>, default: &str| {
        ports
            .get(namespace)
            .map(|port| format!("https://127.0.0.1:{port}{}", path.unwrap_or(default)))
    };
    let ca = ByteString(ca_pem.as_bytes().to_vec());
    let point = |config: &mut WebhookClientConfig| -> Option<bool> {
        let service = config.service.take()?;
        let Some(url) = url(&service.namespace, service.path.as_deref(), "/") else {
            return Some(false);
        };
        config.url = Some(url);
        config.ca_bundle = Some(ca.clone());
        Some(true)
    };
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    point_configurations(&validating, &point, |c| {
        c.webhooks
            .iter_mut()
            .flatten()
            .map(|w| &mut w.client_config)
            .collect()
    })
    .await;
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    point_configurations(&mutating, &point, |c| {
        c.webhooks
            .iter_mut()
            .flatten()
            .map(|w| &mut w.client_config)
            .collect()
    })
    .await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for mut crd in crds.list(&ListParams::default()).await.expect("list").items {
        let Some(config) = crd
            .spec
            .conversion
            .as_mut()
            .and_then(|c| c.webhook.as_mut())
            .and_then(|w| w.client_config.as_mut())
        else {
            continue;
        };
        let Some(service) = config.service.clone() else {
            continue;
        };
        let Some(url) = url(&service.namespace, service.path.as_deref(), "/convert") else {
            continue; // kubeadm's kinds: never read here
        };
        *config = ConversionClientConfig {
            url: Some(url),
            ca_bundle: Some(ca.clone()),
            service: None,
        };
        let name = crd.name_any();
        crds.replace(&name, &PostParams::default(), &crd)
            .await
            .unwrap_or_else(|e| panic!("point the conversion of {name} here: {e}"));
    }
}

/// Points the webhooks of every configuration of `api` here, or deletes a configuration that
/// calls a manager that does not run here.
async fn point_configurations<K>(
    api: &Api<K>,
    point: &dyn Fn(&mut WebhookClientConfig) -> Option<bool>,
    clients: fn(&mut K) -> Vec<&mut WebhookClientConfig>,
) where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    for mut config in api.list(&ListParams::default()).await.expect("list").items {
        let served: Vec<bool> = clients(&mut config).into_iter().filter_map(point).collect();
        let name = config.name_any();
        if served.iter().all(|s| *s) {
            api.replace(&name, &PostParams::default(), &config)
                .await
                .unwrap_or_else(|e| panic!("point webhook configuration {name} here: {e}"));
        } else {
            api.delete(&name, &DeleteParams::default())
                .await
                .unwrap_or_else(|e| panic!("delete webhook configuration {name}: {e}"));
        }
    }
}

/// A kubeconfig with its certificate files inline.
pub fn inline_kubeconfig(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("read the kubeconfig");
    let mut out = String::new();
    for line in text.lines() {
        let inlined = ["certificate-authority", "client-certificate", "client-key"]
            .iter()
            .find_map(|key| {
                let file = line.trim().strip_prefix(&format!("{key}: "))?;
                let bytes = std::fs::read(file).expect("read a kubeconfig file");
                let indent = &line[..line.len() - line.trim_start().len()];
                Some(format!("{indent}{key}-data: {}", base64(&bytes)))
            });
        out.push_str(&inlined.unwrap_or_else(|| line.to_string()));
        out.push('\n');
    }
    out
}

/// Base64, as a Secret's `data` carries bytes.
fn base64(bytes: &[u8]) -> String {
    let value = serde_json::to_value(ByteString(bytes.to_vec())).expect("bytes serialize");
    value.as_str().unwrap_or_default().to_string()
}

/// The API resource of a kind by its apiVersion (plurals as the Metal3 and Cluster API kinds
/// make them).
pub fn resource(api_version: &str, kind: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let lower = kind.to_lowercase();
    let plural = if lower.ends_with('s') {
        format!("{lower}es")
    } else {
        format!("{lower}s")
    };
    ApiResource::from_gvk_with_plural(&gvk, &plural)
}

/// The kubelets of the hosts: once the baremetal-operator says a host consumed by a
/// Metal3Machine is provisioned, a Ready Node for it, labelled with the host's UID as a Metal3
/// node image labels it (`metal3.io/uuid`), so that CAPM3 sets its providerID and Cluster API
/// finds it. Nodes are deleted by Cluster API when it deletes their Machine.
pub struct Kubelet {
    task: tokio::task::JoinHandle<()>,
}

impl Kubelet {
    /// The kubelets of hosts whose workload cluster is their management cluster itself.
    pub fn start(client: Client, namespace: &str) -> Self {
        Self::start_for(client.clone(), client, namespace)
    }

    /// The kubelets of `management`'s hosts, joining the cluster `workload` reaches (after a
    /// move the machines are managed elsewhere, and their Nodes stay where they were).
    pub fn start_for(management: Client, workload: Client, namespace: &str) -> Self {
        let namespace = namespace.to_string();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tick.tick().await;
                if let Err(e) = join_provisioned_hosts(&management, &workload, &namespace).await {
                    eprintln!("kubelet: {e}");
                }
            }
        });
        Self { task }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn join_provisioned_hosts(
    client: &Client,
    workload: &Client,
    namespace: &str,
) -> Result<(), kube::Error> {
    let machines: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &resource("infrastructure.cluster.x-k8s.io/v1beta2", "Metal3Machine"),
    );
    let hosts: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &resource("metal3.io/v1alpha1", "BareMetalHost"),
    );
    let nodes: Api<Node> = Api::all(workload.clone());
    for machine in machines.list(&ListParams::default()).await?.items {
        let name = machine.name_any();
        if machine.metadata.deletion_timestamp.is_some() || nodes.get_opt(&name).await?.is_some() {
            continue;
        }
        let Some(host) = machine
            .annotations()
            .get("metal3.io/BareMetalHost")
            .and_then(|h| h.rsplit('/').next())
        else {
            continue;
        };
        let Some(host) = hosts.get_opt(host).await? else {
            continue;
        };
        let state = host.data["status"]["provisioning"]["state"].as_str();
        if state != Some("provisioned") {
            continue;
        }
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {
                "metal3.io/uuid": host.uid().unwrap_or_default(),
                "kubernetes.io/hostname": name,
            }},
        }))
        .expect("a Node");
        nodes.create(&PostParams::default(), &node).await?;
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        // What Cluster API reads for a healthy Node: ready, and no pressure of any kind.
        let condition = |kind: &str, status: &str, reason: &str| {
            json!({
                "type": kind, "status": status, "reason": reason, "message": "played by the test",
                "lastHeartbeatTime": now, "lastTransitionTime": now,
            })
        };
        let status = json!({"status": {"conditions": [
            condition("Ready", "True", "KubeletReady"),
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID"),
        ]}});
        nodes
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
            .await?;
    }
    Ok(())
}
