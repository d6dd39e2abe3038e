//! The whole Metal3 stack around bitpool (tests/support/stack.rs): Cluster API core, CAPM3 and the
//! baremetal-operator, installed with clusterctl and running for real, take a cluster of bare-
//! metal hosts through its life — a control plane machine and a MachineDeployment deployed, rolled
//! onto a new template, scaled in and out, deleted — while bitpool serves the addresses, on a
//! control plane of each scenario's own; the pivot moves a running cluster with `clusterctl move`
//! to a second plane with the same providers. The test plays the kubelet alone ([`Kubelet`]).
//!
//! Throughout, a sampler lists every address object a few times a second: no address may be
//! held twice at any instant it sees, and no CAPI pool address may go to a new claim within the
//! pool's reuse grace period.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use support::stack::{Kubelet, Options, Stack};
use support::wait::eventually_every;
use support::{dynamic, eventually};

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
/// The pool of the cluster's control-plane endpoint, and its one address.
const ENDPOINT_POOL: &str = "vips";
const ENDPOINT: &str = "192.168.111.249";
const V1BETA2: &str = "infrastructure.cluster.x-k8s.io/v1beta2";
const CAPI: &str = "cluster.x-k8s.io/v1beta2";
const BMH: &str = "metal3.io/v1alpha1";
const CAPI_IPAM: &str = "ipam.cluster.x-k8s.io/v1beta2";
const CAPI_POOLS: &str = "ipam.cluster.x-k8s.io/v1alpha2";

fn api(client: &Client, api_version: &str, kind: &str) -> Api<DynamicObject> {
    dynamic::api(client, NS, api_version, kind)
}

async fn create(client: &Client, object: Value) -> DynamicObject {
    dynamic::create(client, NS, object).await
}

async fn get(client: &Client, api_version: &str, kind: &str, name: &str) -> Option<DynamicObject> {
    dynamic::get(client, NS, api_version, kind, name).await
}

async fn list(client: &Client, api_version: &str, kind: &str) -> Vec<DynamicObject> {
    dynamic::list(client, NS, api_version, kind).await
}

fn host(i: usize) -> String {
    format!("node-{i}")
}

/// One rack of the Metal3 pool: its own subnet, gateway and DNS servers, as Metal3 users lay
/// out pools of several L2 segments.
struct Rack {
    net: &'static str,
    start: u8,
    end: u8,
    prefix: u8,
    netmask: &'static str,
    gateway: &'static str,
    dns: &'static str,
}

/// The Metal3 pool's racks. The first takes the pool's own prefix, gateway and DNS servers; the
/// others give their entry's, the third a /25.
const RACKS: [Rack; 3] = [
    Rack {
        net: "192.168.111",
        start: 100,
        end: 199,
        prefix: 24,
        netmask: "255.255.255.0",
        gateway: "192.168.111.1",
        dns: "192.168.111.1",
    },
    Rack {
        net: "192.168.112",
        start: 100,
        end: 199,
        prefix: 24,
        netmask: "255.255.255.0",
        gateway: "192.168.112.1",
        dns: "192.168.112.53",
    },
    Rack {
        net: "192.168.113",
        start: 130,
        end: 250,
        prefix: 25,
        netmask: "255.255.255.128",
        gateway: "192.168.113.129",
        dns: "192.168.113.53",
    },
];

/// The Metal3 pool's entries, one a rack (the first's prefix, gateway and DNS are the pool's).
fn rack_entries() -> Value {
    let entries: Vec<Value> = RACKS
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut entry = json!({
                "start": format!("{}.{}", r.net, r.start), "end": format!("{}.{}", r.net, r.end),
            });
            if i > 0 {
                entry["prefix"] = json!(r.prefix);
                entry["gateway"] = json!(r.gateway);
                entry["dnsServers"] = json!([r.dns]);
            }
            entry
        })
        .collect();
    json!(entries)
}

/// The rack of a provisioning address.
fn rack_of(address: &str) -> Option<&'static Rack> {
    RACKS.iter().find(|r| {
        address
            .strip_prefix(r.net)
            .is_some_and(|rest| rest.starts_with('.'))
    })
}

/// The provisioning address preallocated to host `i` (BMH-name preallocation): hosts take the
/// racks in turn.
fn preallocated(i: usize) -> String {
    format!("{}.{}", RACKS[i % RACKS.len()].net, 150 + i)
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

/// Seven hosts, each with its BMC credentials in a Secret of its own (as Metal3 installations
/// make them: the baremetal-operator owns each host's Secret, and hosts sharing one would
/// re-register each other at every change of it), registered and inspected by the
/// baremetal-operator.
async fn enroll_hosts(client: &Client) {
    for i in 0..HOSTS {
        let credentials = format!("{}-bmc-secret", host(i));
        create(
            client,
            json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": credentials},
                "stringData": {"username": "admin", "password": "password"},
            }),
        )
        .await;
        create(
            client,
            json!({
                "apiVersion": BMH, "kind": "BareMetalHost",
                "metadata": {"name": host(i)},
                "spec": {
                    "online": true,
                    "bootMACAddress": format!("00:5c:52:31:3a:{i:02x}"),
                    "bmc": {"address": format!("ipmi://192.168.111.1:{}", 6230 + i), "credentialsName": credentials},
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
                "pools": rack_entries(),
                "prefix": RACKS[0].prefix, "gateway": RACKS[0].gateway, "dnsServers": [RACKS[0].dns],
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
    // The control-plane endpoint from a pool of its own (issue 30, item 4): the Cluster names
    // it, its Metal3Cluster comes without an endpoint, and bitpool's webhook (installed by
    // clusterctl) writes the pool's address there before CAPM3's refuses an empty host.
    create(
        client,
        json!({
            "apiVersion": "ipam.cluster.x-k8s.io/v1alpha2", "kind": "InClusterIPPool",
            "metadata": {"name": ENDPOINT_POOL},
            "spec": {"addresses": [ENDPOINT], "prefix": 24, "gateway": "192.168.111.1"},
        }),
    )
    .await;
    create(
        client,
        json!({
            "apiVersion": CAPI, "kind": "Cluster",
            "metadata": {"name": CLUSTER, "annotations": {
                bitpool::api::capi::ENDPOINT_POOL_ANNOTATION: format!("InClusterIPPool/{ENDPOINT_POOL}"),
            }},
            "spec": {"infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3Cluster", "name": CLUSTER,
            }},
        }),
    )
    .await;
    let m3c = create(
        client,
        json!({
            "apiVersion": V1BETA1, "kind": "Metal3Cluster",
            "metadata": {"name": CLUSTER, "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER}},
            "spec": {"noCloudProvider": true},
        }),
    )
    .await;
    assert_eq!(
        m3c.data["spec"]["controlPlaneEndpoint"],
        json!({"host": ENDPOINT, "port": 6443}),
        "the Metal3Cluster's endpoint comes from its pool"
    );
    eventually(
        "the Cluster's endpoint is the pool's address",
        WAIT,
        || async {
            let cluster = get(client, CAPI, "Cluster", CLUSTER).await?;
            let endpoint = &cluster.data["spec"]["controlPlaneEndpoint"];
            (endpoint == &json!({"host": ENDPOINT, "port": 6443})).then_some(())
        },
    )
    .await;
    let mut template = data_template(DATA_TEMPLATE, Provisioning::Metal3Pool);
    if mode.bitpool_renders {
        template["metadata"]["annotations"] = json!({"cluster.x-k8s.io/paused": "bitpool"});
    }
    create(client, template).await;
    create_control_plane(client).await;
    create(
        client,
        machine_template("workers-a", "node-a", DATA_TEMPLATE),
    )
    .await;
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
    let mut m3m =
        machine_template("control-plane", "node-a", DATA_TEMPLATE)["spec"]["template"].clone();
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

/// Where a data template's provisioning network takes its addresses from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Provisioning {
    /// The Metal3 IPPool, by name (`ipAddressFromIPPool`), as templates written for Metal3 IPAM do.
    Metal3Pool,
    /// The InClusterIPPool `bitpool migrate` made of it, by `fromPoolRef`.
    MigratedPool,
}

/// Two networks, the provisioning one (from the Metal3 pool or the pool migrated from it) and
/// one from the CAPI pool by `fromPoolRef`, on the fixture provisioner's two NICs.
fn data_template(name: &str, provisioning: Provisioning) -> Value {
    let capi_pool =
        json!({"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": CAPI_POOL});
    let migrated = json!({"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": METAL3_POOL});
    let (meta_pool, network, services) = match provisioning {
        Provisioning::Metal3Pool => (
            json!({"key": "provisioningIP", "name": METAL3_POOL, "apiGroup": "ipam.metal3.io", "kind": "IPPool"}),
            json!({"id": "provisioning", "link": "nic-1", "ipAddressFromIPPool": METAL3_POOL,
                   "routes": [{"network": "0.0.0.0", "prefix": 0, "gateway": {"fromIPPool": METAL3_POOL}}]}),
            json!({"dnsFromIPPool": METAL3_POOL}),
        ),
        // CAPM3 reads metaData's pool references as Metal3 IPPools whatever kind they name
        // (bitpool's renderer honours the kind): the migrated template leaves them out.
        Provisioning::MigratedPool => (
            json!(null),
            json!({"id": "provisioning", "link": "nic-1", "fromPoolRef": migrated,
                   "routes": [{"network": "0.0.0.0", "prefix": 0, "gateway": {"fromPoolRef": migrated}}]}),
            json!({"dns": ["192.168.111.1"]}),
        ),
    };
    json!({
        "apiVersion": V1BETA1, "kind": "Metal3DataTemplate",
        "metadata": {"name": name, "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER}},
        "spec": {
            "clusterName": CLUSTER,
            "metaData": {
                "ipAddressesFromIPPool": if meta_pool.is_null() { json!([]) } else { json!([meta_pool]) },
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
                    network,
                    {"id": "baremetal", "link": "nic-2", "fromPoolRef": capi_pool,
                     "routes": [{"network": "10.1.0.0", "prefix": 16, "gateway": {"fromPoolRef": capi_pool}}]},
                ]},
                "services": services,
            },
        },
    })
}

/// A Metal3MachineTemplate of `data`; `image` differs between templates, so that a change of
/// template rolls every machine.
fn machine_template(name: &str, image: &str, data: &str) -> Value {
    json!({
        "apiVersion": V1BETA1, "kind": "Metal3MachineTemplate",
        "metadata": {"name": name, "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER}},
        "spec": {"template": {"spec": {
            "image": {
                "url": format!("http://172.22.0.1/images/{image}.qcow2"),
                "checksum": format!("http://172.22.0.1/images/{image}.qcow2.sha256sum"),
                "checksumType": "sha256", "format": "qcow2",
            },
            "dataTemplate": {"name": data},
        }}},
    })
}

/// What a machine ended up with: its host, the address its rendered networkData gives each
/// network, and what goes with the provisioning address.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rendered {
    host: String,
    addresses: BTreeMap<String, String>,
    provisioning: Lease,
}

/// The provisioning network's netmask and default gateway, and the DNS servers of the host, as
/// CAPM3 rendered them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Lease {
    netmask: String,
    gateway: String,
    dns: Vec<String>,
}

impl Lease {
    /// What CAPM3 renders from `rack`: `dns` is the rack's for a template that takes DNS from
    /// the Metal3 pool, the template's fixed one otherwise.
    fn of(rack: &Rack, dns: Option<&str>) -> Self {
        Lease {
            netmask: rack.netmask.to_string(),
            gateway: rack.gateway.to_string(),
            dns: vec![dns.unwrap_or(rack.dns).to_string()],
        }
    }
}

/// The provisioning lease of a networkData document.
fn provisioning_lease(network: &Value) -> Lease {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let provisioning = network["networks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["id"] == "provisioning");
    let dns = network["services"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["type"] == "dns")
        .map(|s| text(&s["address"]))
        .collect();
    Lease {
        netmask: provisioning
            .map(|n| text(&n["netmask"]))
            .unwrap_or_default(),
        gateway: provisioning
            .map(|n| text(&n["routes"][0]["gateway"]))
            .unwrap_or_default(),
        dns,
    }
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
    let provisioning = provisioning_lease(&network);
    Some(Rendered {
        host,
        addresses,
        provisioning,
    })
}

/// Waits until the MachineDeployment has `replicas` machines, all of `template`, each Running
/// with its Node and its host's rendered data, and says all are available; returns what each
/// host was given.
async fn settled(client: &Client, replicas: usize, template: &str) -> BTreeMap<String, Rendered> {
    // Each look reads every machine, its Metal3Machine, host and secret: once a second is enough
    // for a state that takes minutes, and five stacks share two cores.
    eventually_every(
        &format!("{replicas} machines of {template} run, with their data rendered"),
        WAIT,
        Duration::from_secs(1),
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
            let right = match network.as_str() {
                "provisioning" => rack_of(address).is_some(),
                _ => address.starts_with("10.0.0."),
            };
            assert!(right, "{network}: {r:?}");
        }
    }
}

/// Lists every address object of both kinds a few times a second, and records any address held
/// twice in one pool at one instant, and the history of each CAPI pool address: which address
/// objects held it, for which claims, and when those claims were deleted.
struct Sampler {
    seen: Arc<Mutex<Samples>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default, Debug)]
struct Samples {
    rounds: usize,
    twice: Vec<String>,
    /// Address of the CAPI pool with a reuse grace period → its address objects by UID.
    capi_holders: BTreeMap<String, BTreeMap<String, Holder>>,
    /// IPAddressClaim UID → when its deletion was asked for, as first seen.
    claim_deleted: BTreeMap<String, Timestamp>,
}

/// An address object of either kind, as the sampler saw it.
#[derive(Debug)]
#[allow(dead_code)] // read by the failure message
struct AddressObject {
    kind: &'static str,
    name: String,
    pool: String,
    claim: String,
}

/// One CAPI address object: when it was made, and for which claim (by UID).
#[derive(Debug, Clone)]
struct Holder {
    created: Timestamp,
    claim: String,
}

impl Sampler {
    fn start(client: Client) -> Self {
        let seen = Arc::new(Mutex::new(Samples::default()));
        let out = seen.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(300));
            loop {
                tick.tick().await;
                let Ok(round) = sample(&client).await else {
                    continue;
                };
                out.lock().expect("samples").add(round);
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

    /// Fails if a CAPI pool address went to a new claim sooner than `grace` after the deletion of
    /// the claim that held it before; returns how many times an address was reused.
    fn assert_reuse_waited(&self, grace: Duration) -> usize {
        let samples = self.seen.lock().expect("samples");
        let mut reused = 0;
        for (address, holders) in &samples.capi_holders {
            let mut holders: Vec<&Holder> = holders.values().collect();
            holders.sort_by_key(|h| h.created);
            for pair in holders.windows(2) {
                let (before, after) = (pair[0], pair[1]);
                let deleted = samples.claim_deleted.get(&before.claim).unwrap_or_else(|| {
                    panic!("{address} went to a new claim while claim {} was never seen deleted: {holders:?}", before.claim)
                });
                // Both timestamps are whole seconds; the pool counts from the deletion's.
                let waited = after.created.duration_since(*deleted);
                assert!(
                    waited
                        >= SignedDuration::try_from(grace).expect("a duration")
                            - SignedDuration::from_secs(1),
                    "{address} reused {waited:?} after its claim's deletion, within the {grace:?} grace period: {holders:?}"
                );
                reused += 1;
            }
        }
        reused
    }
}

impl Samples {
    fn add(&mut self, round: Round) {
        self.rounds += 1;
        for (address, holders) in round.held {
            let claims: BTreeSet<&str> = holders.iter().map(|h| h.claim.as_str()).collect();
            if claims.len() > 1 {
                self.twice.push(format!("{address} held by {holders:?}"));
            }
        }
        for (address, uid, holder) in round.capi {
            self.capi_holders
                .entry(address)
                .or_default()
                .entry(uid)
                .or_insert(holder);
        }
        for (uid, deleted) in round.deleting_claims {
            self.claim_deleted.entry(uid).or_insert(deleted);
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What one listing of the address objects and CAPI claims shows.
struct Round {
    /// Address → the address objects holding it, of both kinds. The two pools of a scenario hand
    /// out disjoint ranges, and a Metal3 pool and the pool migrated from it share theirs: an
    /// address may be held by one claim only (through the proxy, its Metal3 IPAddress mirrors
    /// the IPAddress of the proxy claim of the same name).
    held: BTreeMap<String, Vec<AddressObject>>,
    /// Each CAPI address object: (address, its UID, what it holds the address for).
    capi: Vec<(String, String, Holder)>,
    /// IPAddressClaims being deleted: UID → deletion time.
    deleting_claims: Vec<(String, Timestamp)>,
}

async fn sample(client: &Client) -> Result<Round, kube::Error> {
    let mut round = Round {
        held: BTreeMap::new(),
        capi: Vec::new(),
        deleting_claims: Vec::new(),
    };
    for (version, pool_field, claim_field) in [
        ("ipam.metal3.io/v1alpha1", "pool", "claim"),
        (CAPI_IPAM, "poolRef", "claimRef"),
    ] {
        let objects = api(client, version, "IPAddress")
            .list(&ListParams::default())
            .await?
            .items;
        for object in objects {
            let claim = object.data["spec"][claim_field]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let pool = object.data["spec"][pool_field]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let address = object.data["spec"]["address"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if version == CAPI_IPAM && pool == CAPI_POOL {
                let claim = object
                    .owner_references()
                    .iter()
                    .find(|o| o.kind == "IPAddressClaim")
                    .map(|o| o.uid.clone())
                    .unwrap_or_default();
                let created = object
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0)
                    .unwrap_or_default();
                let uid = object.uid().unwrap_or_default();
                round
                    .capi
                    .push((address.clone(), uid, Holder { created, claim }));
            }
            round.held.entry(address).or_default().push(AddressObject {
                kind: version,
                name: object.name_any(),
                pool,
                claim,
            });
        }
    }
    let claims = api(client, CAPI_IPAM, "IPAddressClaim")
        .list(&ListParams::default())
        .await?
        .items;
    round.deleting_claims = claims
        .iter()
        .filter_map(|c| Some((c.uid()?, c.metadata.deletion_timestamp.as_ref()?.0)))
        .collect();
    Ok(round)
}

/// The kinds of what a Cluster of Metal3 machines is made of and holds (apiVersion, kind).
const CLUSTER_KINDS: [(&str, &str); 9] = [
    (CAPI, "Cluster"),
    (CAPI, "Machine"),
    (V1BETA2, "Metal3Machine"),
    (V1BETA2, "Metal3Data"),
    (V1BETA2, "Metal3DataClaim"),
    ("ipam.metal3.io/v1alpha1", "IPClaim"),
    ("ipam.metal3.io/v1alpha1", "IPAddress"),
    (CAPI_IPAM, "IPAddressClaim"),
    (CAPI_IPAM, "IPAddress"),
];

/// Whether the namespace holds no object of any of `kinds`.
async fn none_left(client: &Client, kinds: &[(&str, &str)]) -> bool {
    left(client, kinds).await.is_empty()
}

/// The namespace's objects of `kinds`: kind, name, and what holds a deleting one.
async fn left(client: &Client, kinds: &[(&str, &str)]) -> Vec<String> {
    let mut found = Vec::new();
    for (version, kind) in kinds {
        for object in list(client, version, kind).await {
            let deleting = match object.metadata.deletion_timestamp {
                Some(_) => format!(" deleting, finalizers {:?}", object.finalizers()),
                None => String::new(),
            };
            found.push(format!("{kind} {}{deleting}", object.name_any()));
        }
    }
    found
}

/// Deletes the Cluster and waits until everything of it is gone; the CAPI pool stays unless
/// it was deleted too.
async fn delete_cluster(client: &Client, capi_pool_deleted: bool) {
    api(client, CAPI, "Cluster")
        .delete(CLUSTER, &DeleteParams::default())
        .await
        .expect("delete the Cluster");
    // What is still there is said every 30 s, so that a wait that times out shows what held it.
    let started = std::time::Instant::now();
    let said = std::sync::atomic::AtomicU64::new(0);
    eventually(
        "the Cluster's machines, data, claims and addresses are gone",
        WAIT,
        || async {
            let left = left(client, &CLUSTER_KINDS).await;
            let period = started.elapsed().as_secs() / 30;
            if !left.is_empty() && period > said.swap(period, std::sync::atomic::Ordering::Relaxed)
            {
                eprintln!("after {:?}, still there: {left:?}", started.elapsed());
            }
            left.is_empty().then_some(())
        },
    )
    .await;
    // A Metal3 pool that names its Cluster is owned by it, as Metal3 IPAM makes it, and goes
    // with it (collected by the garbage collector); the CAPI pool belongs to no cluster and stays,
    // unless it was deleted while it held addresses: then it goes once they are released.
    eventually(
        "the Metal3 pool is gone; the CAPI pool stays, or goes if deleted",
        WAIT,
        || async {
            let metal3 = get(client, "ipam.metal3.io/v1alpha1", "IPPool", METAL3_POOL).await;
            let capi = get(client, CAPI_POOLS, "InClusterIPPool", CAPI_POOL).await;
            (metal3.is_none() && capi.is_none() == capi_pool_deleted).then_some(())
        },
    )
    .await;
}

/// Patches the MachineDeployment: a new template rolls its machines, new replicas scale it.
async fn patch_deployment(client: &Client, patch: Value) {
    api(client, CAPI, "MachineDeployment")
        .patch(
            DEPLOYMENT,
            &PatchParams::default(),
            &Patch::Merge(patch.clone()),
        )
        .await
        .unwrap_or_else(|e| panic!("patch MachineDeployment {DEPLOYMENT} with {patch}: {e}"));
}

/// Every host's provisioning address is the one preallocated to it.
fn assert_preallocated(rendered: &BTreeMap<String, Rendered>) {
    for (host, r) in rendered {
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

/// What each step of a scenario gave the hosts: distinct addresses from the right pools, each
/// host its preallocated one where hosts keep their addresses.
fn assert_given(mode: Mode, rendered: &BTreeMap<String, Rendered>) {
    assert_distinct(rendered);
    if mode.bmh_name_preallocation {
        assert_preallocated(rendered);
    }
}

/// Waits until the claims of both kinds are exactly those of the `machines` running (the
/// control plane's included): the claims of machines that are gone have been released.
async fn claims_follow_machines(client: &Client, machines: usize) {
    eventually(
        &format!("one claim of each kind for each of {machines} machines, no more"),
        WAIT,
        || async {
            let metal3 = list(client, "ipam.metal3.io/v1alpha1", "IPClaim").await;
            // Beside the Cluster's endpoint claim, which no machine has.
            let endpoint = bitpool::api::capi::ENDPOINT_CLAIM_LABEL;
            let capi = list(client, CAPI_IPAM, "IPAddressClaim").await;
            let capi = capi.iter().filter(|c| !c.labels().contains_key(endpoint));
            (metal3.len() == machines && capi.count() == machines).then_some(())
        },
    )
    .await;
}

/// A scenario's stack, with its kubelet and sampler running and its hosts available.
struct Scenario {
    name: String,
    mode: Mode,
    stack: Stack,
    client: Client,
    sampler: Sampler,
    started: std::time::Instant,
    _kubelet: Kubelet,
}

impl Scenario {
    async fn start(name: &str, mode: Mode) -> Self {
        let started = std::time::Instant::now();
        let stack = Stack::start(name, mode.options()).await;
        let client = stack.client.clone();
        create_namespace(&client).await;
        let kubelet = Kubelet::start(client.clone(), NS);
        let sampler = Sampler::start(client.clone());
        enroll_hosts(&client).await;
        let scenario = Self {
            name: name.to_string(),
            mode,
            stack,
            client,
            sampler,
            started,
            _kubelet: kubelet,
        };
        scenario.step("stack up and hosts available");
        scenario
    }

    /// Says how long the scenario has run when `what` is done (the timings of the closing note).
    fn step(&self, what: &str) {
        eprintln!("{}: {what} after {:?}", self.name, self.started.elapsed());
    }

    /// Waits until `replicas` machines of `template` run and checks what each host was given.
    async fn settled(&self, replicas: usize, template: &str) -> BTreeMap<String, Rendered> {
        let rendered = settled(&self.client, replicas, template).await;
        assert_given(self.mode, &rendered);
        rendered
    }

    /// Points the MachineDeployment at a new machine template of `data` and waits until every
    /// machine has been replaced (maxSurge 1), returning what each new host was given.
    async fn roll(
        &self,
        template: &str,
        data: &str,
        replicas: usize,
    ) -> BTreeMap<String, Rendered> {
        let roll = std::time::Instant::now();
        self.start_roll(template, data).await;
        let rendered = self.settled(replicas, template).await;
        eprintln!(
            "{}: {replicas} machines rolled in {:?}",
            self.name,
            roll.elapsed()
        );
        rendered
    }

    /// Points the MachineDeployment at a new machine template of `data`, which starts a roll.
    async fn start_roll(&self, template: &str, data: &str) {
        create(&self.client, machine_template(template, template, data)).await;
        patch_deployment(
            &self.client,
            json!({"spec": {"template": {"spec": {"infrastructureRef": {"name": template}}}}}),
        )
        .await;
    }

    /// Deletes the Cluster; then no address may have been held twice, and none of the CAPI pool
    /// reused within its grace period. Returns how many of its addresses were reused.
    async fn finish(self) -> usize {
        self.finish_with(false).await
    }

    /// The end of a scenario whose cluster was moved away: nothing was held twice here.
    async fn finish_moved(mut self) {
        let rounds = self.sampler.assert_never_twice();
        self.step(&format!("done, {rounds} samples on the source"));
        self.stack.assert_managers_running();
    }

    /// [`Self::finish`], the CAPI pool deleted (or not) on the way.
    async fn finish_with(mut self, capi_pool_deleted: bool) -> usize {
        delete_cluster(&self.client, capi_pool_deleted).await;
        let rounds = self.sampler.assert_never_twice();
        let reused = self
            .sampler
            .assert_reuse_waited(Duration::from_secs(REUSE_GRACE_SECONDS as u64));
        self.step(&format!(
            "done, {rounds} samples, {reused} CAPI addresses reused"
        ));
        self.stack.assert_managers_running();
        reused
    }
}

/// The life of a cluster of bare-metal hosts: five machines deployed from seven hosts (a control
/// plane machine takes one more), rolled onto a new template with maxSurge 1, scaled in to two
/// and out to six, and deleted — checking at each step what each host was given, and throughout
/// that no address is held twice and that CAPI pool addresses wait out their reuse grace period.
async fn lifecycle(name: &str, mode: Mode) {
    let scenario = Scenario::start(name, mode).await;
    let client = scenario.client.clone();
    create_cluster(&scenario.stack, mode, 5).await;
    scenario.settled(5, "workers-a").await;
    scenario.step("5 machines deployed");

    scenario.roll("workers-b", DATA_TEMPLATE, 5).await;
    claims_follow_machines(&client, 6).await;

    patch_deployment(&client, json!({"spec": {"replicas": 2}})).await;
    scenario.settled(2, "workers-b").await;
    claims_follow_machines(&client, 3).await;
    scenario.step("scaled in to 2");
    patch_deployment(&client, json!({"spec": {"replicas": 6}})).await;
    scenario.settled(6, "workers-b").await;
    scenario.step("scaled out to 6");

    let reused = scenario.finish().await;
    if !mode.bmh_name_preallocation {
        // Released addresses are the lowest free ones: the roll hands them out again.
        assert!(
            reused > 0,
            "no CAPI pool address was reused: the grace check saw nothing"
        );
    }
}

/// The Metal3 pool's allocations: IPClaim name → address.
async fn metal3_allocations(client: &Client) -> BTreeMap<String, String> {
    list(client, "ipam.metal3.io/v1alpha1", "IPAddress")
        .await
        .iter()
        .filter_map(|a| {
            Some((
                a.data["spec"]["claim"]["name"].as_str()?.to_string(),
                a.data["spec"]["address"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// The addresses of the migrated pool: claim name → address.
async fn migrated_allocations(client: &Client) -> BTreeMap<String, String> {
    pool_allocations(client, METAL3_POOL).await
}

/// The addresses of CAPI pool `pool`: claim name → address.
async fn pool_allocations(client: &Client, pool: &str) -> BTreeMap<String, String> {
    list(client, CAPI_IPAM, "IPAddress")
        .await
        .iter()
        .filter(|a| a.data["spec"]["poolRef"]["name"].as_str() == Some(pool))
        .filter_map(|a| {
            Some((
                a.data["spec"]["claimRef"]["name"].as_str()?.to_string(),
                a.data["spec"]["address"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// `bitpool migrate` as an operator runs it: `--check`, then `--apply`.
fn bitpool_migrate(stack: &Stack) {
    for extra in ["--check", "--apply"] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_bitpool"))
            .args(["migrate", "--namespace", NS, extra])
            .env("KUBECONFIG", &stack.kubeconfig)
            .output()
            .expect("run bitpool migrate");
        let report = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "bitpool migrate {extra}: {report}");
        if extra == "--check" {
            assert!(report.contains("every address kept"), "{report}");
        }
    }
}

/// How many IPClaims the Metal3 pool holds when it is migrated: the machines' and other
/// consumers'.
const MIGRATED_CLAIMS: usize = 50;

/// The seed's migration, both ways, on a running cluster with BMH-name preallocation and a
/// Metal3 pool of three racks. Without a node of its own rolled: `bitpool migrate` imports the
/// pool's 50 allocations into an InClusterIPPool and the Metal3 pool proxies to it
/// (`spec.poolRef`) while a MachineDeployment rolls — every host keeps what CAPM3 rendered for it,
/// and a machine added then gets its host's address and lease through the proxy. With a node
/// roll: a new data template takes the provisioning addresses from the InClusterIPPool directly,
/// and a MachineDeployment change rolls every machine onto it; the old claims, and the claims
/// imported for them, go.
async fn migration(name: &str) {
    let mode = Mode {
        bitpool_renders: false,
        bmh_name_preallocation: true,
    };
    let scenario = Scenario::start(name, mode).await;
    create_cluster(&scenario.stack, mode, 3).await;
    let deployed = scenario.settled(3, "workers-a").await;
    assert_leases(&deployed, None);
    scenario.step("3 machines deployed, one on each rack");
    let consumers = other_consumers(&scenario.client).await;
    migrate_during_a_roll(&scenario, &deployed).await;
    grow_through_the_proxy(&scenario).await;
    release_through_the_proxy(&scenario, &consumers).await;
    roll_onto_the_migrated_pool(&scenario).await;
    scenario.finish().await;
}

/// Every provisioning lease is its rack's: netmask, gateway and DNS servers (`dns` for a
/// template that names them itself).
fn assert_leases(rendered: &BTreeMap<String, Rendered>, dns: Option<&str>) {
    for r in rendered.values() {
        let address = &r.addresses["provisioning"];
        let rack = rack_of(address).unwrap_or_else(|| panic!("{address} of no rack: {r:?}"));
        assert_eq!(r.provisioning, Lease::of(rack, dns), "{r:?}");
    }
}

/// IPClaims beside the machines' (BMCs, switches, anything else the pool numbers), up to
/// [`MIGRATED_CLAIMS`]; returns their names once each is served.
async fn other_consumers(client: &Client) -> Vec<String> {
    let machines = metal3_allocations(client).await.len();
    let names: Vec<String> = (0..MIGRATED_CLAIMS - machines)
        .map(|i| format!("consumer-{i:02}"))
        .collect();
    for name in &names {
        create(
            client,
            json!({
                "apiVersion": "ipam.metal3.io/v1alpha1", "kind": "IPClaim",
                "metadata": {"name": name},
                "spec": {"pool": {"name": METAL3_POOL, "namespace": NS}},
            }),
        )
        .await;
    }
    eventually("the pool serves 50 claims", WAIT, || async {
        (metal3_allocations(client).await.len() == MIGRATED_CLAIMS).then_some(())
    })
    .await;
    names
}

/// Whether any of the two pools of the migration says its addresses overlap another's.
async fn overlap_said(client: &Client) -> Option<bool> {
    let mut said = false;
    for (api_version, kind) in [
        ("ipam.metal3.io/v1alpha1", "IPPool"),
        (CAPI_POOLS, "InClusterIPPool"),
    ] {
        let pool = get(client, api_version, kind, METAL3_POOL).await?;
        let conditions = pool.data["status"]["conditions"].as_array().cloned();
        said |= conditions
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "AddressesOverlap" && c["status"] == "True");
    }
    Some(said)
}

/// Waits until the proxying pool counts exactly what its IPClaims hold, and its capacity and
/// what is free are its target's.
async fn counts_exact(client: &Client) {
    eventually("the proxying pool's counts are exact", WAIT, || async {
        let held = metal3_allocations(client).await.len() as i64;
        let claims = list(client, "ipam.metal3.io/v1alpha1", "IPClaim")
            .await
            .len() as i64;
        let pool = get(client, "ipam.metal3.io/v1alpha1", "IPPool", METAL3_POOL).await?;
        let target = get(client, CAPI_POOLS, "InClusterIPPool", METAL3_POOL).await?;
        let (status, counts) = (&pool.data["status"], &target.data["status"]["ipAddresses"]);
        let exact = held == claims
            && status["usedIPCount"].as_i64() == Some(held)
            && counts["used"].as_i64() == Some(held)
            && status["capacity"] == counts["total"]
            && status["availableIPCount"] == counts["free"]
            && status["indexes"].as_object().map(|i| i.len() as i64) == Some(held);
        exact.then_some(())
    })
    .await;
}

/// `bitpool migrate` and the proxy while the MachineDeployment rolls onto a new machine
/// template (the same data): every host that runs a machine before and after renders the same
/// networkData, each new machine gets its host's address with its rack's lease, the counts are
/// exact, and neither pool says they overlap once the proxy serves.
async fn migrate_during_a_roll(scenario: &Scenario, deployed: &BTreeMap<String, Rendered>) {
    let client = &scenario.client;
    let control_plane = rendered(client, "control-plane").await;
    scenario.start_roll("workers-b", DATA_TEMPLATE).await;
    eventually("the roll has begun", WAIT, || async {
        let machines = list(client, V1BETA2, "Metal3Machine").await;
        machines
            .iter()
            .any(|m| {
                m.annotations()
                    .get("cluster.x-k8s.io/cloned-from-name")
                    .is_some_and(|t| t == "workers-b")
            })
            .then_some(())
    })
    .await;
    bitpool_migrate(&scenario.stack);
    api(client, "ipam.metal3.io/v1alpha1", "IPPool")
        .patch(
            METAL3_POOL,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"poolRef": {
                "apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": METAL3_POOL,
            }}})),
        )
        .await
        .expect("point the Metal3 pool at the migrated pool");
    scenario.step("migrated mid-roll");
    let rolled = scenario.settled(3, "workers-b").await;
    assert_leases(&rolled, None);
    // The provisioning network follows the host (BMH-name preallocation); the other network's
    // address is a new machine's, from a pool the migration does not touch.
    let provisioning = |r: &Rendered| (r.addresses["provisioning"].clone(), r.provisioning.clone());
    for (host, r) in &rolled {
        if let Some(before) = deployed.get(host) {
            assert_eq!(
                provisioning(r),
                provisioning(before),
                "{host} renders the provisioning network it rendered before the migration"
            );
        }
    }
    assert_eq!(rendered(client, "control-plane").await, control_plane);
    eventually(
        "every IPClaim is served through the proxy with the address it holds",
        WAIT,
        || async {
            let held = metal3_allocations(client).await;
            (held.len() == MIGRATED_CLAIMS && migrated_allocations(client).await == held)
                .then_some(())
        },
    )
    .await;
    counts_exact(client).await;
    eventually("neither pool says they overlap", WAIT, || async {
        (!overlap_said(client).await?).then_some(())
    })
    .await;
    scenario.step("rolled through the migration, every lease kept, counts exact");
}

/// A machine added through the proxy: its host's address, with its rack's lease.
async fn grow_through_the_proxy(scenario: &Scenario) {
    let client = &scenario.client;
    patch_deployment(client, json!({"spec": {"replicas": 4}})).await;
    let grown = scenario.settled(4, "workers-b").await;
    assert_leases(&grown, None);
    let proxied = metal3_allocations(client).await;
    assert_eq!(proxied, migrated_allocations(client).await);
    assert_eq!(proxied.len(), MIGRATED_CLAIMS + 1, "{proxied:?}");
    counts_exact(client).await;
    assert_eq!(overlap_said(client).await, Some(false));
    scenario.step("a machine added through the proxy");
}

/// The other consumers' IPClaims deleted: released through the proxy, the counts follow.
async fn release_through_the_proxy(scenario: &Scenario, consumers: &[String]) {
    let client = &scenario.client;
    let ipclaims = api(client, "ipam.metal3.io/v1alpha1", "IPClaim");
    for name in consumers {
        ipclaims
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete an IPClaim");
    }
    eventually("the consumers' addresses released", WAIT, || async {
        let held = metal3_allocations(client).await;
        (held.len() == MIGRATED_CLAIMS + 1 - consumers.len()
            && migrated_allocations(client).await == held)
            .then_some(())
    })
    .await;
    counts_exact(client).await;
    scenario.step("the other consumers released through the proxy");
}

/// A node roll onto a data template that takes the provisioning addresses from the migrated
/// pool directly: new addresses, not the hosts' preallocated ones, each held by a claim of the
/// machine's own; the old IPClaims and the claims imported for them go.
async fn roll_onto_the_migrated_pool(scenario: &Scenario) {
    let client = &scenario.client;
    create(
        client,
        data_template("workers-data-migrated", Provisioning::MigratedPool),
    )
    .await;
    let roll = std::time::Instant::now();
    scenario
        .start_roll("workers-migrated", "workers-data-migrated")
        .await;
    let rolled = settled(client, 4, "workers-migrated").await;
    assert_distinct(&rolled);
    // Gateway and netmask from the migrated pool's subnets; the template names its DNS.
    assert_leases(&rolled, Some(RACKS[0].dns));
    scenario.step(&format!(
        "4 machines rolled onto the migrated pool in {:?}",
        roll.elapsed()
    ));
    // Only the control plane machine, on the old template still, holds an IPClaim.
    let control_plane = rendered(client, "control-plane")
        .await
        .expect("the control plane's data");
    let left = vec![format!("{}-{METAL3_POOL}", control_plane.host)];
    eventually(
        "the old workers' IPClaims, and the claims imported for them, are gone",
        WAIT,
        || async {
            let old: Vec<String> = metal3_allocations(client).await.into_keys().collect();
            let imported = migrated_allocations(client).await;
            let imported: Vec<&String> =
                imported.keys().filter(|c| c.starts_with("node-")).collect();
            (old == left && imported == left.iter().collect::<Vec<_>>()).then_some(())
        },
    )
    .await;
    let migrated = migrated_allocations(client).await;
    for r in rolled.values() {
        let address = &r.addresses["provisioning"];
        assert!(
            migrated
                .iter()
                .any(|(claim, a)| a == address && !claim.starts_with("node-")),
            "{r:?} does not hold its address by a claim of its own on the migrated pool: {migrated:?}"
        );
    }
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_stack_bitpool_as_the_ipam_with_host_preallocation() {
    lifecycle(
        "stack-ipam",
        Mode {
            bitpool_renders: false,
            bmh_name_preallocation: true,
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_stack_bitpool_as_the_ipam_addresses_follow_machines() {
    lifecycle(
        "stack-ipam-free",
        Mode {
            bitpool_renders: false,
            bmh_name_preallocation: false,
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_stack_bitpool_renders_the_metal3_data_with_host_preallocation() {
    lifecycle(
        "stack-data",
        Mode {
            bitpool_renders: true,
            bmh_name_preallocation: true,
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_stack_migration_through_the_proxy_and_a_node_roll() {
    migration("stack-migrate").await;
}

/// Annotates (`Some`) or un-annotates (`None`) the CAPI pool `cluster.x-k8s.io/paused`.
async fn pause_capi_pool(client: &Client, value: Option<&str>) {
    api(client, CAPI_POOLS, "InClusterIPPool")
        .patch(
            CAPI_POOL,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"cluster.x-k8s.io/paused": value}}})),
        )
        .await
        .expect("pause or resume the CAPI pool");
}

/// Waits until a claim on the CAPI pool waits with `Ready=False` saying `why`; returns its name.
async fn claim_waiting(client: &Client, why: &str) -> String {
    eventually(
        &format!("a claim on the CAPI pool says it waits: {why}"),
        WAIT,
        || async {
            list(client, CAPI_IPAM, "IPAddressClaim")
                .await
                .into_iter()
                .find(|claim| {
                    let conditions = claim.data["status"]["conditions"].as_array();
                    conditions.into_iter().flatten().any(|c| {
                        c["type"] == "Ready"
                            && c["status"] == "False"
                            && c["reason"] == "PoolNotReady"
                            && c["message"].as_str().is_some_and(|m| m.contains(why))
                    })
                })
                .map(|claim| claim.name_any())
        },
    )
    .await
}

/// A running machine's host deprovisioned by hand (its image removed): CAPM3 gives the host its
/// image back, the baremetal-operator provisions it again, and the machine keeps every address
/// and its rendered data.
async fn deprovision_by_hand(scenario: &Scenario) {
    let client = &scenario.client;
    let before = settled(client, 3, "workers-b").await;
    let claims = pool_allocations(client, CAPI_POOL).await;
    let (host, given) = before.iter().next().expect("a machine");
    api(client, BMH, "BareMetalHost")
        .patch(
            host,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"image": null}})),
        )
        .await
        .expect("remove the host's image");
    // CAPM3 gives the image back at once; whether the baremetal-operator deprovisioned the host
    // before that is a race, and the states seen say which way it went.
    let states = Mutex::new(BTreeSet::new());
    eventually(
        &format!("{host} has its image back and is provisioned"),
        WAIT,
        || async {
            let bmh = get(client, BMH, "BareMetalHost", host).await?;
            let state = state(&bmh).map(str::to_string);
            states.lock().expect("states").extend(state.clone());
            let wanted = |url: Option<&str>| url.is_some_and(|u| u.ends_with("workers-b.qcow2"));
            (wanted(bmh.data["spec"]["image"]["url"].as_str())
                && wanted(bmh.data["status"]["provisioning"]["image"]["url"].as_str())
                && state.as_deref() == Some("provisioned"))
            .then_some(())
        },
    )
    .await;
    let states = states.into_inner().expect("states");
    let after = settled(client, 3, "workers-b").await;
    assert_eq!(after.get(host), Some(given), "{host} kept its data");
    assert_eq!(after, before);
    assert_eq!(pool_allocations(client, CAPI_POOL).await, claims);
    scenario.step(&format!(
        "{host} deprovisioned by hand ({states:?}) and provisioned again"
    ));
}

/// Deletes the validating webhook configuration that holds bitpool's pool webhook, as in an
/// installation without it.
async fn remove_pool_webhook(client: &Client) {
    let configurations: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let all = configurations
        .list(&ListParams::default())
        .await
        .expect("list the validating webhook configurations");
    let name = all
        .items
        .iter()
        .find(|c| {
            c.webhooks
                .iter()
                .flatten()
                .any(|w| w.name == "validation.inclusterippool.ipam.cluster.x-k8s.io")
        })
        .map(|c| c.name_any())
        .expect("bitpool's pool webhook is installed");
    configurations
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete webhook configuration {name}: {e}"));
}

/// How many machines of machine template `template` are running.
async fn running_of(client: &Client, template: &str) -> usize {
    let mut running = 0;
    for machine in list(client, CAPI, "Machine").await {
        let Some(m3m) = machine.data["spec"]["infrastructureRef"]["name"].as_str() else {
            continue;
        };
        let from = get(client, V1BETA2, "Metal3Machine", m3m)
            .await
            .and_then(|m| {
                m.annotations()
                    .get("cluster.x-k8s.io/cloned-from-name")
                    .cloned()
            });
        if machine.data["status"]["phase"] == "Running" && from.as_deref() == Some(template) {
            running += 1;
        }
    }
    running
}

/// Faults in the middle of rolls of three machines (bitpool as the IPAM, no preallocation): the
/// CAPI pool paused as a roll starts — the new machine's claim says why it waits, and the roll
/// goes on when the pause is lifted; bitpool killed (SIGKILL) and started again once the first
/// new machine runs; and the CAPI pool deleted as a second roll starts — the pool stays while it
/// holds addresses, the new claim says it is being deleted, and deleting the Cluster releases
/// everything, the pool last. No address is lost or held twice on the way.
async fn faults(name: &str) {
    let mode = Mode {
        bitpool_renders: false,
        bmh_name_preallocation: false,
    };
    let mut scenario = Scenario::start(name, mode).await;
    let client = scenario.client.clone();
    create_cluster(&scenario.stack, mode, 3).await;
    scenario.settled(3, "workers-a").await;
    let held = pool_allocations(&client, CAPI_POOL).await;
    scenario.step("3 machines deployed");

    pause_capi_pool(&client, Some("")).await;
    scenario.start_roll("workers-b", DATA_TEMPLATE).await;
    let waiting = claim_waiting(&client, "is paused (annotation cluster.x-k8s.io/paused)").await;
    assert_eq!(
        pool_allocations(&client, CAPI_POOL).await,
        held,
        "nothing moved while paused"
    );
    pause_capi_pool(&client, None).await;
    scenario.step(&format!("{waiting} waited on the paused pool"));

    eventually("the first new machine runs", WAIT, || async {
        (running_of(&client, "workers-b").await > 0).then_some(())
    })
    .await;
    scenario.stack.kill_bitpool();
    scenario.stack.start_bitpool().await;
    scenario.settled(3, "workers-b").await;
    claims_follow_machines(&client, 4).await;
    scenario.step("rolled with bitpool restarted half way");

    deprovision_by_hand(&scenario).await;

    let held = pool_allocations(&client, CAPI_POOL).await;
    scenario.start_roll("workers-c", DATA_TEMPLATE).await;
    let pools = api(&client, CAPI_POOLS, "InClusterIPPool");
    let refused = pools
        .delete(CAPI_POOL, &DeleteParams::default())
        .await
        .expect_err("the webhook refuses to delete a pool that holds addresses");
    let claim = held.keys().next().expect("a claim");
    assert!(
        refused
            .to_string()
            .contains("Cannot delete Pool until all IPAddresses have been removed")
            && refused.to_string().contains(claim.as_str()),
        "{refused}"
    );
    // Where the webhook is not installed, the pool is marked deleted but keeps its finalizer, and
    // every address it holds, until each is released.
    remove_pool_webhook(&client).await;
    // The API server learns of the removed webhook configuration through its own watch, so a
    // delete right after may still be refused by it; anything else is a failure.
    eventually(
        "the CAPI pool's deletion accepted without the webhook",
        WAIT,
        || async {
            match pools.delete(CAPI_POOL, &DeleteParams::default()).await {
                Ok(_) => Some(()),
                Err(e) if e.to_string().contains("validation.inclusterippool") => None,
                Err(e) => panic!("delete the CAPI pool: {e}"),
            }
        },
    )
    .await;
    let waiting = claim_waiting(&client, "the pool is being deleted").await;
    assert!(!held.contains_key(&waiting), "{waiting} is a new claim");
    let still = pool_allocations(&client, CAPI_POOL).await;
    assert!(
        held.iter()
            .all(|(claim, address)| still.get(claim) == Some(address)),
        "every address held before the pool's deletion is held still: {held:?} {still:?}"
    );
    let pool = get(&client, CAPI_POOLS, "InClusterIPPool", CAPI_POOL).await;
    assert!(
        pool.is_some_and(|p| p.metadata.deletion_timestamp.is_some()),
        "the pool stays while it holds addresses"
    );
    scenario.step(&format!("{waiting} waited on the deleted pool"));
    scenario.finish_with(true).await;
}

/// What every claim of either API holds: (claim kind, claim name) → address.
async fn all_allocations(client: &Client) -> BTreeMap<(&'static str, String), String> {
    let metal3 = metal3_allocations(client).await;
    let capi = list(client, CAPI_IPAM, "IPAddress").await;
    let capi = capi.iter().filter_map(|a| {
        Some((
            (
                "IPAddressClaim",
                a.data["spec"]["claimRef"]["name"].as_str()?.to_string(),
            ),
            a.data["spec"]["address"].as_str()?.to_string(),
        ))
    });
    metal3
        .into_iter()
        .map(|(claim, address)| (("IPClaim", claim), address))
        .chain(capi)
        .collect()
}

/// The step of Metal3's pivot guide that makes hosts move: clusterctl moves only the kinds whose
/// CRD carries its labels, and the baremetal-operator's manifests do not give them. A host moves
/// with what it owns (its BMC credentials), consumed by a machine or not.
async fn let_clusterctl_move_hosts(client: &Client) {
    Api::<CustomResourceDefinition>::all(client.clone())
        .patch(
            "baremetalhosts.metal3.io",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
                "clusterctl.cluster.x-k8s.io": "", "clusterctl.cluster.x-k8s.io/move-hierarchy": "",
            }}})),
        )
        .await
        .expect("label the BareMetalHost CRD for clusterctl move");
}

/// `clusterctl move` of the namespace from `source` to `target`, in a thread of its own; bitpool
/// on the target is killed and started again once the CAPI pool has arrived, while the move
/// goes on. Returns when the move is done.
async fn move_restarting_target_bitpool(source: &Stack, target: &mut Stack) -> std::time::Instant {
    let to = format!("--to-kubeconfig={}", target.kubeconfig.display());
    let mut command = source
        .clusterctl
        .command(&["move", "--namespace", NS, &to, "-v", "1"]);
    let mover = tokio::task::spawn_blocking(move || {
        support::clusterctl::run(&mut command, "clusterctl move")
    });
    let target_client = target.client.clone();
    let mid_move = eventually("the CAPI pool arrives on the target", WAIT, || async {
        if mover.is_finished() {
            return Some(false);
        }
        get(&target_client, CAPI_POOLS, "InClusterIPPool", CAPI_POOL)
            .await
            .map(|_| true)
    })
    .await;
    if mid_move {
        target.kill_bitpool();
        target.start_bitpool().await;
    }
    let output = mover.await.expect("clusterctl move ran");
    let moved = std::time::Instant::now();
    eprintln!("{output}");
    assert!(
        mid_move,
        "the move was over before bitpool could be restarted in its middle"
    );
    moved
}

/// A claim of each API made right after the move, on the moved pools: served without a fence.
async fn served_after_move(target: &Client, moved: std::time::Instant) -> Duration {
    create(
        target,
        json!({
            "apiVersion": CAPI_IPAM, "kind": "IPAddressClaim",
            "metadata": {"name": "after-move"},
            "spec": {"poolRef": {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": CAPI_POOL}},
        }),
    )
    .await;
    create(
        target,
        json!({
            "apiVersion": "ipam.metal3.io/v1alpha1", "kind": "IPClaim",
            "metadata": {"name": "after-move"},
            "spec": {"pool": {"name": METAL3_POOL}},
        }),
    )
    .await;
    eventually(
        "both claims made after the move are served",
        WAIT,
        || async {
            let held = all_allocations(target).await;
            let served = held.contains_key(&("IPAddressClaim", "after-move".into()))
                && held.contains_key(&("IPClaim", "after-move".into()));
            served.then_some(())
        },
    )
    .await;
    moved.elapsed()
}

/// The ledgers bitpool keeps on a plane: name → data.
async fn ledgers(client: &Client) -> BTreeMap<String, BTreeMap<String, String>> {
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), "bitpool-system")
        .list(&ListParams::default().labels("ipam.bitpool.dev/ledger"))
        .await
        .expect("list the ledgers")
        .items
        .into_iter()
        .map(|c| (c.name_any(), c.data.unwrap_or_default()))
        .collect()
}

/// Nothing of the cluster is left on the source: no object of the namespace of any kind the
/// move takes, and no ledger.
async fn source_keeps_nothing(source: &Client) {
    let moved = [
        (BMH, "BareMetalHost"),
        ("ipam.metal3.io/v1alpha1", "IPPool"),
        (CAPI_POOLS, "InClusterIPPool"),
    ];
    eventually(
        "the source keeps nothing of the moved cluster",
        WAIT,
        || async {
            let gone = none_left(source, &CLUSTER_KINDS).await && none_left(source, &moved).await;
            (gone && ledgers(source).await.is_empty()).then_some(())
        },
    )
    .await;
}

/// The pivot: a running cluster of three hosts (a control plane machine and two workers) moved
/// with `clusterctl move` from the plane it was made on to a second one with the same providers,
/// bitpool on the target restarted in the middle of it. On the target every claim keeps its
/// address, new claims are served at once (the ledgers came with the pools: no fence), and a
/// machine added gets fresh addresses; the source keeps nothing; no address is held twice on
/// either plane at any instant sampled.
async fn pivot(name: &str) {
    let mode = Mode {
        bitpool_renders: false,
        bmh_name_preallocation: false,
    };
    let source = Scenario::start(name, mode).await;
    let deployed = async {
        create_cluster(&source.stack, mode, 2).await;
        source.settled(2, "workers-a").await
    };
    let target_name = format!("{name}-target");
    let (mut target, _) = tokio::join!(Stack::start(&target_name, mode.options()), deployed);
    source.step("3 hosts running; the target plane is up");
    let target_client = target.client.clone();
    // The workload cluster stays where it is: the source plane holds its Nodes.
    let _kubelet = Kubelet::start_for(target_client.clone(), source.client.clone(), NS);
    let target_sampler = Sampler::start(target_client.clone());
    let before = all_allocations(&source.client).await;
    assert_eq!(
        before.len(),
        7,
        "two addresses for each of three hosts, and the control-plane endpoint's: {before:?}"
    );

    let_clusterctl_move_hosts(&source.client).await;
    let started = std::time::Instant::now();
    let moved = move_restarting_target_bitpool(&source.stack, &mut target).await;
    source.step(&format!("moved in {:?}", started.elapsed()));
    let served_in = served_after_move(&target_client, moved).await;
    source.step(&format!(
        "claims made after the move served {served_in:?} after it"
    ));
    for (name, data) in ledgers(&target_client).await {
        assert!(
            !data.contains_key("rebuiltAt"),
            "ledger {name} was rebuilt: {data:?}"
        );
    }
    assert!(
        served_in < Duration::from_secs(10),
        "claims made after the move waited {served_in:?}"
    );
    let mut after = all_allocations(&target_client).await;
    after.retain(|(_, claim), _| claim != "after-move");
    assert_eq!(after, before, "every claim keeps its address on the target");
    source_keeps_nothing(&source.client).await;
    source.step("the source keeps nothing");

    patch_deployment(&target_client, json!({"spec": {"replicas": 3}})).await;
    let scaled = settled(&target_client, 3, "workers-a").await;
    assert_distinct(&scaled);
    let old: BTreeSet<&String> = before.values().collect();
    let grown = all_allocations(&target_client).await;
    let fresh: Vec<&String> = grown.values().filter(|a| !old.contains(a)).collect();
    assert_eq!(
        fresh.len(),
        4,
        "the machine added and the claims made after the move: {grown:?}"
    );
    source.step("scaled out on the target");
    for (version, kind) in [
        (CAPI_IPAM, "IPAddressClaim"),
        ("ipam.metal3.io/v1alpha1", "IPClaim"),
    ] {
        api(&target_client, version, kind)
            .delete("after-move", &DeleteParams::default())
            .await
            .expect("delete a claim made after the move");
    }

    delete_cluster(&target_client, false).await;
    let rounds = target_sampler.assert_never_twice();
    source.step(&format!("done, {rounds} samples on the target"));
    target.assert_managers_running();
    source.finish_moved().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_stack_pivot_with_clusterctl_move() {
    pivot("stack-pivot").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_stack_faults_in_the_middle_of_rolls() {
    faults("stack-faults").await;
}
