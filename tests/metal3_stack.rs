//! The whole Metal3 stack around bitpool (tests/support/stack.rs): Cluster API core, CAPM3 and the
//! baremetal-operator, installed with clusterctl and running for real, deploy a cluster of bare-
//! metal hosts — a control plane machine and a MachineDeployment — and delete it, while bitpool
//! serves the addresses, on a control plane of the test's own. The test plays the kubelet alone
//! ([`Kubelet`]).
//!
//! Throughout, a sampler lists every address object a few times a second: no address may be
//! held twice at any instant it sees.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use support::eventually;
use support::stack::{Kubelet, Options, Stack, resource};

const NS: &str = "metal3";
const CLUSTER: &str = "fleet";
const DEPLOYMENT: &str = "workers";
const DATA_TEMPLATE: &str = "workers-data";
/// The Metal3 pool and the CAPI pool the template's two networks take their addresses from.
const METAL3_POOL: &str = "provisioning";
const CAPI_POOL: &str = "baremetal";
const HOSTS: usize = 7;
/// How long the CAPI pool keeps a released address before it hands it out again.
const REUSE_GRACE_SECONDS: i64 = 20;
/// Hosts are registered, inspected and provisioned by the baremetal-operator's fixture
/// provisioner, which requeues every 10 s; a roll of five machines takes several minutes.
const WAIT: Duration = Duration::from_secs(600);

const V1BETA1: &str = "infrastructure.cluster.x-k8s.io/v1beta1";
const V1BETA2: &str = "infrastructure.cluster.x-k8s.io/v1beta2";
const CAPI: &str = "cluster.x-k8s.io/v1beta2";
const BMH: &str = "metal3.io/v1alpha1";

fn api(client: &Client, api_version: &str, kind: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), NS, &resource(api_version, kind))
}

async fn create(client: &Client, object: Value) -> DynamicObject {
    let api_version = object["apiVersion"]
        .as_str()
        .expect("apiVersion")
        .to_string();
    let kind = object["kind"].as_str().expect("kind").to_string();
    let object: DynamicObject = serde_json::from_value(object).expect("a manifest");
    api(client, &api_version, &kind)
        .create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("create {kind} {}: {e}", object.name_any()))
}

async fn list(client: &Client, api_version: &str, kind: &str) -> Vec<DynamicObject> {
    api(client, api_version, kind)
        .list(&ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("list {kind}: {e}"))
        .items
}

async fn get(client: &Client, api_version: &str, kind: &str, name: &str) -> Option<DynamicObject> {
    api(client, api_version, kind)
        .get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("get {kind} {name}: {e}"))
}

fn host(i: usize) -> String {
    format!("node-{i}")
}

/// The provisioning address preallocated to host `i` (BMH-name preallocation).
fn preallocated(i: usize) -> String {
    format!("192.168.111.{}", 150 + i)
}

/// Which mode bitpool runs in, and whether addresses follow hosts.
#[derive(Clone, Copy, Debug)]
struct Mode {
    /// bitpool renders the Metal3Data (the template is handed to it); otherwise CAPM3 does, and
    /// bitpool is the IPAM.
    bitpool_renders: bool,
    bmh_name_preallocation: bool,
}

impl Mode {
    fn options(self) -> Options {
        let mut bitpool_args = Vec::new();
        if self.bitpool_renders {
            if self.bmh_name_preallocation {
                bitpool_args.push("--enable-bmh-name-based-preallocation".to_string());
            }
        } else {
            bitpool_args.push("--controllers=capi-ipam,metal3-ipam,migration-proxy".to_string());
        }
        Options {
            bmh_name_preallocation: self.bmh_name_preallocation,
            bitpool_args,
        }
    }
}

async fn create_namespace(client: &Client) {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NS}})).expect("a namespace"),
        )
        .await
        .expect("create the namespace");
}

/// Seven hosts with their BMC credentials, registered and inspected by the baremetal-operator.
async fn enroll_hosts(client: &Client) {
    create(
        client,
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "bmc-credentials"},
            "stringData": {"username": "admin", "password": "password"},
        }),
    )
    .await;
    for i in 0..HOSTS {
        create(
            client,
            json!({
                "apiVersion": BMH, "kind": "BareMetalHost",
                "metadata": {"name": host(i)},
                "spec": {
                    "online": true,
                    "bootMACAddress": format!("00:5c:52:31:3a:{i:02x}"),
                    "bmc": {"address": format!("ipmi://192.168.111.1:{}", 6230 + i), "credentialsName": "bmc-credentials"},
                },
            }),
        )
        .await;
    }
    eventually(
        "every host is available (registered and inspected)",
        WAIT,
        || async {
            let hosts = list(client, BMH, "BareMetalHost").await;
            (hosts.len() == HOSTS && hosts.iter().all(|h| state(h) == Some("available")))
                .then_some(())
        },
    )
    .await;
}

fn state(host: &DynamicObject) -> Option<&str> {
    host.data["status"]["provisioning"]["state"].as_str()
}

/// The pools, the Cluster with its Metal3Cluster and workload kubeconfig, the data template and
/// the machine template, and a MachineDeployment of `replicas`.
async fn create_cluster(stack: &Stack, mode: Mode, replicas: i64) {
    let client = &stack.client;
    let pre_allocations: BTreeMap<String, String> = (0..HOSTS)
        .map(|i| (format!("{}-{METAL3_POOL}", host(i)), preallocated(i)))
        .collect();
    create(
        client,
        json!({
            "apiVersion": "ipam.metal3.io/v1alpha1", "kind": "IPPool",
            "metadata": {"name": METAL3_POOL},
            "spec": {
                "clusterName": CLUSTER, "namePrefix": "fleet-prov",
                "pools": [{"start": "192.168.111.100", "end": "192.168.111.199"}],
                "prefix": 24, "gateway": "192.168.111.1", "dnsServers": ["192.168.111.1"],
                "preAllocations": if mode.bmh_name_preallocation { json!(pre_allocations) } else { json!({}) },
            },
        }),
    )
    .await;
    create(
        client,
        json!({
            "apiVersion": "ipam.cluster.x-k8s.io/v1alpha2", "kind": "InClusterIPPool",
            "metadata": {"name": CAPI_POOL},
            "spec": {
                "addresses": ["10.0.0.10-10.0.0.40"], "prefix": 24, "gateway": "10.0.0.1",
                "addressReuseGracePeriodSeconds": REUSE_GRACE_SECONDS,
            },
        }),
    )
    .await;
    create(
        client,
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "bootstrap-data"},
            "stringData": {"value": "#cloud-config\n", "format": "cloud-config"},
        }),
    )
    .await;
    create(
        client,
        json!({
            "apiVersion": "v1", "kind": "Secret", "type": "cluster.x-k8s.io/secret",
            "metadata": {"name": format!("{CLUSTER}-kubeconfig"), "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER}},
            "stringData": {"value": stack.inline_kubeconfig()},
        }),
    )
    .await;
    create(
        client,
        json!({
            "apiVersion": CAPI, "kind": "Cluster",
            "metadata": {"name": CLUSTER},
            "spec": {"infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3Cluster", "name": CLUSTER,
            }},
        }),
    )
    .await;
    create(
        client,
        json!({
            "apiVersion": V1BETA1, "kind": "Metal3Cluster",
            "metadata": {"name": CLUSTER, "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER}},
            "spec": {"controlPlaneEndpoint": {"host": "192.168.111.249", "port": 6443}, "noCloudProvider": true},
        }),
    )
    .await;
    let mut template = data_template();
    if mode.bitpool_renders {
        template["metadata"]["annotations"] = json!({"cluster.x-k8s.io/paused": "bitpool"});
    }
    create(client, template).await;
    create_control_plane(client).await;
    create(client, machine_template("workers-a", "node-a")).await;
    create(
        client,
        json!({
            "apiVersion": CAPI, "kind": "MachineDeployment",
            "metadata": {"name": DEPLOYMENT, "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER}},
            "spec": {
                "clusterName": CLUSTER,
                "replicas": replicas,
                "selector": {"matchLabels": {"cluster.x-k8s.io/deployment-name": DEPLOYMENT}},
                "rollout": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}},
                "template": {
                    "metadata": {"labels": {"cluster.x-k8s.io/deployment-name": DEPLOYMENT}},
                    "spec": {
                        "clusterName": CLUSTER,
                        "bootstrap": {"dataSecretName": "bootstrap-data"},
                        "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3MachineTemplate", "name": "workers-a"},
                    },
                },
            },
        }),
    )
    .await;
}

/// The control plane: one Machine of its own on a host (no control plane provider runs here);
/// Cluster API counts the control plane initialized once it has a Node, and only then are the
/// workers' Nodes healthy.
async fn create_control_plane(client: &Client) {
    let machine = create(
        client,
        json!({
            "apiVersion": CAPI, "kind": "Machine",
            "metadata": {"name": "control-plane", "labels": {
                "cluster.x-k8s.io/cluster-name": CLUSTER, "cluster.x-k8s.io/control-plane": "",
            }},
            "spec": {
                "clusterName": CLUSTER,
                "bootstrap": {"dataSecretName": "bootstrap-data"},
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3Machine", "name": "control-plane"},
            },
        }),
    )
    .await;
    let mut m3m = machine_template("control-plane", "node-a")["spec"]["template"].clone();
    m3m["apiVersion"] = json!(V1BETA1);
    m3m["kind"] = json!("Metal3Machine");
    m3m["metadata"] = json!({
        "name": "control-plane",
        "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER},
        "ownerReferences": [{
            "apiVersion": CAPI, "kind": "Machine", "name": "control-plane",
            "uid": machine.uid().expect("a uid"), "controller": true, "blockOwnerDeletion": true,
        }],
    });
    create(client, m3m).await;
}

/// Two networks, one from each pool: a Metal3 pool by name (address, route gateway, DNS) and a
/// CAPI pool by `fromPoolRef`, on the fixture provisioner's two NICs.
fn data_template() -> Value {
    let capi_pool =
        json!({"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": CAPI_POOL});
    json!({
        "apiVersion": V1BETA1, "kind": "Metal3DataTemplate",
        "metadata": {"name": DATA_TEMPLATE, "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER}},
        "spec": {
            "clusterName": CLUSTER,
            "metaData": {
                "ipAddressesFromIPPool": [{"key": "provisioningIP", "name": METAL3_POOL, "apiGroup": "ipam.metal3.io", "kind": "IPPool"}],
                "objectNames": [{"key": "name", "object": "machine"}],
                "indexes": [{"key": "index", "offset": 0, "step": 1}],
                "prefixesFromIPPool": [], "gatewaysFromIPPool": [], "dnsServersFromIPPool": [],
            },
            "networkData": {
                "links": {"ethernets": [
                    {"type": "phy", "id": "nic-1", "mtu": 1500, "macAddress": {"fromHostInterface": "nic-1"}},
                    {"type": "phy", "id": "nic-2", "mtu": 1500, "macAddress": {"fromHostInterface": "nic-2"}},
                ]},
                "networks": {"ipv4": [
                    {"id": "provisioning", "link": "nic-1", "ipAddressFromIPPool": METAL3_POOL,
                     "routes": [{"network": "0.0.0.0", "prefix": 0, "gateway": {"fromIPPool": METAL3_POOL}}]},
                    {"id": "baremetal", "link": "nic-2", "fromPoolRef": capi_pool,
                     "routes": [{"network": "10.1.0.0", "prefix": 16, "gateway": {"fromPoolRef": capi_pool}}]},
                ]},
                "services": {"dnsFromIPPool": METAL3_POOL},
            },
        },
    })
}

/// A Metal3MachineTemplate; `image` differs between templates, so that a change of template
/// rolls every machine.
fn machine_template(name: &str, image: &str) -> Value {
    json!({
        "apiVersion": V1BETA1, "kind": "Metal3MachineTemplate",
        "metadata": {"name": name, "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER}},
        "spec": {"template": {"spec": {
            "image": {
                "url": format!("http://172.22.0.1/images/{image}.qcow2"),
                "checksum": format!("http://172.22.0.1/images/{image}.qcow2.sha256sum"),
                "checksumType": "sha256", "format": "qcow2",
            },
            "dataTemplate": {"name": DATA_TEMPLATE},
        }}},
    })
}

/// What a machine ended up with: its host, and the address its rendered networkData gives each
/// network.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rendered {
    host: String,
    addresses: BTreeMap<String, String>,
}

/// Reads what the host of Metal3Machine `m3m` was given, once it carries its rendered secrets.
async fn rendered(client: &Client, m3m: &str) -> Option<Rendered> {
    let machine = get(client, V1BETA2, "Metal3Machine", m3m).await?;
    let host = machine
        .annotations()
        .get("metal3.io/BareMetalHost")?
        .rsplit('/')
        .next()?
        .to_string();
    let bmh = get(client, BMH, "BareMetalHost", &host).await?;
    let network = bmh.data["spec"]["networkData"]["name"].as_str()?;
    if network != format!("{m3m}-networkdata") {
        return None;
    }
    let secret = Api::<Secret>::namespaced(client.clone(), NS)
        .get_opt(network)
        .await
        .ok()??;
    let text = secret
        .data
        .as_ref()?
        .get("networkData")
        .map(|b| String::from_utf8_lossy(&b.0).to_string())?;
    let network: Value = serde_saphyr::from_str(&text).ok()?;
    let addresses = network["networks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| {
            Some((
                n["id"].as_str()?.to_string(),
                n["ip_address"].as_str()?.to_string(),
            ))
        })
        .collect();
    Some(Rendered { host, addresses })
}

/// Waits until the MachineDeployment has `replicas` machines, all of `template`, each Running
/// with its Node and its host's rendered data, and says all are available; returns what each
/// host was given.
async fn settled(client: &Client, replicas: usize, template: &str) -> BTreeMap<String, Rendered> {
    eventually(
        &format!("{replicas} machines of {template} run, with their data rendered"),
        WAIT,
        || async {
            let machines: Vec<_> = list(client, CAPI, "Machine")
                .await
                .into_iter()
                .filter(|m| {
                    m.labels()
                        .get("cluster.x-k8s.io/deployment-name")
                        .map(String::as_str)
                        == Some(DEPLOYMENT)
                })
                .collect();
            if machines.len() != replicas {
                return None;
            }
            let mut by_host = BTreeMap::new();
            for machine in &machines {
                let running = machine.data["status"]["phase"].as_str() == Some("Running");
                let m3m = machine.data["spec"]["infrastructureRef"]["name"].as_str()?;
                let m3m_object = get(client, V1BETA2, "Metal3Machine", m3m).await?;
                let from = m3m_object
                    .annotations()
                    .get("cluster.x-k8s.io/cloned-from-name")
                    .cloned();
                if !running || from.as_deref() != Some(template) {
                    return None;
                }
                let data = rendered(client, m3m).await?;
                by_host.insert(data.host.clone(), data);
            }
            let deployment = get(client, CAPI, "MachineDeployment", DEPLOYMENT).await?;
            let available = deployment.data["status"]["availableReplicas"].as_i64();
            (by_host.len() == replicas && available == Some(replicas as i64)).then_some(by_host)
        },
    )
    .await
}

/// Every address rendered is distinct and from the right pool.
fn assert_distinct(rendered: &BTreeMap<String, Rendered>) {
    let mut seen = BTreeSet::new();
    for r in rendered.values() {
        for (network, address) in &r.addresses {
            assert!(
                seen.insert(address.clone()),
                "{address} twice: {rendered:?}"
            );
            let prefix = if network == "provisioning" {
                "192.168.111."
            } else {
                "10.0.0."
            };
            assert!(address.starts_with(prefix), "{network}: {r:?}");
        }
    }
}

/// Lists every address object of both kinds a few times a second, and records any address held
/// twice in one pool at one instant, and when each claim first held each address.
struct Sampler {
    seen: Arc<Mutex<Samples>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default, Debug)]
struct Samples {
    rounds: usize,
    twice: Vec<String>,
}

impl Sampler {
    fn start(client: Client) -> Self {
        let seen = Arc::new(Mutex::new(Samples::default()));
        let out = seen.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(300));
            loop {
                tick.tick().await;
                let Ok(round) = held(&client).await else {
                    continue;
                };
                let mut samples = out.lock().expect("samples");
                samples.rounds += 1;
                for ((pool, address), holders) in round {
                    if holders.len() > 1 {
                        samples
                            .twice
                            .push(format!("{address} of {pool} held by {holders:?}"));
                    }
                }
            }
        });
        Self { seen, task }
    }

    /// Fails if any address was held twice; returns how many rounds were sampled.
    fn assert_never_twice(&self) -> usize {
        let samples = self.seen.lock().expect("samples");
        assert!(samples.twice.is_empty(), "held twice: {:?}", samples.twice);
        samples.rounds
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// (pool, address) → the address objects holding it, of both kinds.
async fn held(client: &Client) -> Result<BTreeMap<(String, String), Vec<String>>, kube::Error> {
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for (version, kind, pool_field) in [
        ("ipam.metal3.io/v1alpha1", "IPAddress", "pool"),
        ("ipam.cluster.x-k8s.io/v1beta2", "IPAddress", "poolRef"),
    ] {
        let objects = api(client, version, kind)
            .list(&ListParams::default())
            .await?
            .items;
        for object in objects {
            let pool = object.data["spec"][pool_field]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let address = object.data["spec"]["address"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            out.entry((pool, address))
                .or_default()
                .push(format!("{version} {}", object.name_any()));
        }
    }
    Ok(out)
}

/// Deletes the Cluster and waits until everything of it is gone but the CAPI pool.
async fn delete_cluster(client: &Client) {
    api(client, CAPI, "Cluster")
        .delete(CLUSTER, &DeleteParams::default())
        .await
        .expect("delete the Cluster");
    eventually(
        "the Cluster's machines, data, claims and addresses are gone",
        WAIT,
        || async {
            for (version, kind) in [
                (CAPI, "Cluster"),
                (CAPI, "Machine"),
                (V1BETA2, "Metal3Machine"),
                (V1BETA2, "Metal3Data"),
                (V1BETA2, "Metal3DataClaim"),
                ("ipam.metal3.io/v1alpha1", "IPClaim"),
                ("ipam.metal3.io/v1alpha1", "IPAddress"),
                ("ipam.cluster.x-k8s.io/v1beta2", "IPAddressClaim"),
                ("ipam.cluster.x-k8s.io/v1beta2", "IPAddress"),
            ] {
                if !list(client, version, kind).await.is_empty() {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    // A Metal3 pool that names its Cluster is owned by it, as Metal3 IPAM makes it, and goes
    // with it; the CAPI pool belongs to no cluster and stays.
    assert!(
        get(client, "ipam.metal3.io/v1alpha1", "IPPool", METAL3_POOL)
            .await
            .is_none()
    );
    assert!(
        get(
            client,
            "ipam.cluster.x-k8s.io/v1alpha2",
            "InClusterIPPool",
            CAPI_POOL
        )
        .await
        .is_some()
    );
}

/// Deploys five machines from seven hosts (a control plane machine takes one more) and deletes
/// the Cluster, checking what each host was given.
async fn deploy_and_delete(name: &str, mode: Mode) {
    let started = std::time::Instant::now();
    let mut stack = Stack::start(name, mode.options()).await;
    let client = stack.client.clone();
    create_namespace(&client).await;
    let _kubelet = Kubelet::start(client.clone(), NS);
    let sampler = Sampler::start(client.clone());
    enroll_hosts(&client).await;
    eprintln!(
        "{name}: stack up and hosts available after {:?}",
        started.elapsed()
    );

    create_cluster(&stack, mode, 5).await;
    let deployed = settled(&client, 5, "workers-a").await;
    assert_distinct(&deployed);
    if mode.bmh_name_preallocation {
        for (host, r) in &deployed {
            let i: usize = host
                .trim_start_matches("node-")
                .parse()
                .expect("a host index");
            assert_eq!(
                r.addresses.get("provisioning"),
                Some(&preallocated(i)),
                "{r:?}"
            );
        }
    }
    eprintln!("{name}: 5 machines deployed after {:?}", started.elapsed());

    delete_cluster(&client).await;
    let rounds = sampler.assert_never_twice();
    eprintln!(
        "{name}: done after {:?}, {rounds} samples",
        started.elapsed()
    );
    stack.assert_managers_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bitpool_as_the_ipam_of_capm3_with_host_preallocation() {
    deploy_and_delete(
        "stack-ipam",
        Mode {
            bitpool_renders: false,
            bmh_name_preallocation: true,
        },
    )
    .await;
}
