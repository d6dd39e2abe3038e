//! bitpool beside the real CAPM3 manager (github.com/metal3-io/cluster-api-provider-metal3, built
//! from the Go module proxy by `hack/tools.sh capm3`), on a control plane of the test's own with
//! Cluster API's, CAPM3's and the BareMetalHost CRDs. CAPM3's CRDs convert through CAPM3's own
//! webhook server, as in a real installation. The tests play the parts nobody runs here: Cluster
//! API core (a Cluster whose infrastructure is ready, Machines with bootstrap data) and the
//! baremetal-operator (hosts that are `available`, with their NICs).
//!
//! Each test is one deployment mode of the "Metal3 clusters" section of docs/metal3.md.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, WebhookClientConfig,
};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use support::plane::Dedicated;
use support::process::free_port;
use support::stack::{Manager, manager_args};
use support::wait::wait_listening;
use support::webhook::{Certs, read_manifests, register};
use support::{Bitpool, dynamic, eventually, read_crds};

const NS: &str = "metal3";
const CLUSTER: &str = "test1";
const TEMPLATE: &str = "workers-template";
/// The Metal3 pool (an IPClaim per host, named `<host>-provisioning` with BMH-name preallocation).
const METAL3_POOL: &str = "provisioning";
/// The CAPI pool (an IPAddressClaim per Metal3Data, `<data>-baremetal`).
const CAPI_POOL: &str = "baremetal";
const HOSTS: [&str; 2] = ["node-0", "node-1"];
const WAIT: Duration = Duration::from_secs(120);

/// What the API server records as the field manager of bitpool's writes.
const BITPOOL: &str = "bitpool";

/// The preallocated provisioning address of host `i`.
fn preallocated(i: usize) -> String {
    format!("192.168.111.{}", 150 + i)
}

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

async fn patch_status(client: &Client, api_version: &str, kind: &str, name: &str, status: Value) {
    api(client, api_version, kind)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .unwrap_or_else(|e| panic!("status of {kind} {name}: {e}"));
}

/// CAPM3's manager with its webhook server (serving its CRDs' conversions) on 127.0.0.1.
/// Its log: `target/test-logs/capm3-<name>.log`.
fn start_capm3(kubeconfig: &std::path::Path, certs: &Certs, port: u16, name: &str) -> Manager {
    let mut args = manager_args(port, &certs.dir);
    args.push("--enable-bmh-name-based-preallocation".to_string());
    Manager::start("capm3", name, &args, &[("KUBECONFIG", kubeconfig)])
}

/// A control plane with Cluster API's, CAPM3's and BMO's CRDs, CAPM3 running, and bitpool's IPAM
/// CRDs (bitpool replaces Metal3's ip-address-manager).
struct Metal3Plane {
    client: Client,
    kubeconfig: PathBuf,
    /// CAPM3's webhook server.
    capm3_port: u16,
    _capm3: Manager,
    certs: Certs,
    _plane: Dedicated,
}

impl Metal3Plane {
    async fn start(name: &str) -> Self {
        let plane = Dedicated::start(name);
        let client = plane.client().await;
        let certs = Certs::generate(&format!("capm3-{name}"));
        let port = free_port();
        install_crds(&client, &certs, port).await;
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": NS}})).expect("a namespace"),
            )
            .await
            .expect("create the namespace");
        let capm3 = start_capm3(&plane.kubeconfig, &certs, port, name);
        wait_listening(
            port,
            "CAPM3's webhook server listens (log: target/test-logs/capm3-*.log)",
        )
        .await;
        Self {
            client,
            kubeconfig: plane.kubeconfig.clone(),
            capm3_port: port,
            _capm3: capm3,
            certs,
            _plane: plane,
        }
    }
}

/// Cluster API core's CRDs and BMO's as their modules ship them (no conversion webhook runs for
/// them here: every client speaks their storage version), CAPM3's with their conversion webhook
/// pointed at the CAPM3 process, and bitpool's CAPI pool and Metal3 IPAM CRDs.
async fn install_crds(client: &Client, certs: &Certs, port: u16) {
    let upstream = support::upstream_crds_dir();
    let mut crds: Vec<CustomResourceDefinition> = Vec::new();
    for folder in [
        "cluster-api",
        "cluster-api-provider-metal3",
        "baremetal-operator",
    ] {
        let mut files: Vec<_> = std::fs::read_dir(upstream.join(folder))
            .expect("read the CRD folder")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        files.sort();
        for file in files {
            let mut read = read_crds(&file);
            if folder == "cluster-api-provider-metal3" {
                for crd in &mut read {
                    let url = format!("https://127.0.0.1:{port}/convert");
                    crd.spec.conversion = Some(bitpool::crds::conversion_at(url, &certs.ca_pem));
                }
            }
            crds.extend(read);
        }
    }
    let capm3_kinds: BTreeSet<_> = crds
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    crds.extend(
        bitpool::crds::served()
            .into_iter()
            .filter(|c| !capm3_kinds.contains(c.metadata.name.as_deref().unwrap_or_default())),
    );
    support::install_crds(client, &crds).await;
}

/// The pools (bitpool's), the Cluster with its infrastructure ready (Cluster API core's part),
/// the Metal3Cluster, the template, and the hosts as BMO leaves them after inspection.
async fn create_cluster(client: &Client, hand_template_to_bitpool: bool) {
    create(
        client,
        json!({
            "apiVersion": "ipam.metal3.io/v1alpha1", "kind": "IPPool",
            "metadata": {"name": METAL3_POOL},
            "spec": {
                "clusterName": CLUSTER, "namePrefix": "test1-prov",
                "pools": [{"start": "192.168.111.100", "end": "192.168.111.199"}],
                "prefix": 24, "gateway": "192.168.111.1", "dnsServers": ["192.168.111.1"],
                "preAllocations": {
                    format!("{}-{METAL3_POOL}", HOSTS[0]): preallocated(0),
                    format!("{}-{METAL3_POOL}", HOSTS[1]): preallocated(1),
                },
            },
        }),
    )
    .await;
    create(
        client,
        json!({
            "apiVersion": "ipam.cluster.x-k8s.io/v1alpha2", "kind": "InClusterIPPool",
            "metadata": {"name": CAPI_POOL},
            "spec": {"addresses": ["10.0.0.10-10.0.0.20"], "prefix": 24, "gateway": "10.0.0.1"},
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
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": CLUSTER},
            "spec": {"infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3Cluster", "name": CLUSTER,
            }},
        }),
    )
    .await;
    patch_status(
        client,
        "cluster.x-k8s.io/v1beta2",
        "Cluster",
        CLUSTER,
        json!({
            "initialization": {"infrastructureProvisioned": true},
            "deprecated": {"v1beta1": {"conditions": [{
                "type": "InfrastructureReady", "status": "True",
                "lastTransitionTime": "2026-12-01T00:00:00Z",
            }]}},
        }),
    )
    .await;
    create(
        client,
        json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3Cluster",
            "metadata": {"name": CLUSTER, "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER}},
            "spec": {"controlPlaneEndpoint": {"host": "192.168.111.249", "port": 6443}, "noCloudProvider": true},
        }),
    )
    .await;
    let mut template = template();
    if hand_template_to_bitpool {
        template["metadata"]["annotations"] = json!({"cluster.x-k8s.io/paused": "bitpool"});
    }
    create(client, template).await;
    for (i, host) in HOSTS.iter().enumerate() {
        create_host(client, i, host).await;
    }
}

/// The worked example of CAPM3's documentation, plus a second NIC on the CAPI pool: a Metal3
/// pool by name (network, route gateway, DNS) and a CAPI pool by `fromPoolRef`.
fn template() -> Value {
    let capi_pool =
        json!({"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": CAPI_POOL});
    json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3DataTemplate",
        "metadata": {"name": TEMPLATE, "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER}},
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
                    {"type": "phy", "id": "enp1s0", "mtu": 1500, "macAddress": {"fromHostInterface": "enp1s0"}},
                    {"type": "phy", "id": "enp2s0", "mtu": 1500, "macAddress": {"fromHostInterface": "enp2s0"}},
                ]},
                "networks": {"ipv4": [
                    {"id": "provisioning", "link": "enp1s0", "ipAddressFromIPPool": METAL3_POOL,
                     "routes": [{"network": "0.0.0.0", "prefix": 0, "gateway": {"fromIPPool": METAL3_POOL}}]},
                    {"id": "baremetal", "link": "enp2s0", "fromPoolRef": capi_pool,
                     "routes": [{"network": "10.1.0.0", "prefix": 16, "gateway": {"fromPoolRef": capi_pool}}]},
                ]},
                "services": {"dnsFromIPPool": METAL3_POOL},
            },
        },
    })
}

fn mac(host: usize, nic: usize) -> String {
    format!("00:5c:52:31:{host:02x}:{nic:02x}")
}

async fn create_host(client: &Client, i: usize, host: &str) {
    create(
        client,
        json!({
            "apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
            "metadata": {"name": host},
            "spec": {"online": true, "bootMACAddress": mac(i, 1)},
        }),
    )
    .await;
    patch_status(
        client,
        "metal3.io/v1alpha1",
        "BareMetalHost",
        host,
        json!({
            "errorCount": 0, "errorMessage": "", "operationalStatus": "OK", "poweredOn": false,
            "provisioning": {"ID": format!("ironic-{host}"), "state": "available"},
            "hardware": {"nics": [
                {"name": "enp1s0", "mac": mac(i, 1)},
                {"name": "enp2s0", "mac": mac(i, 2)},
            ]},
        }),
    )
    .await;
}

/// A Machine and its Metal3Machine, as a MachineSet makes them.
async fn create_machine(client: &Client, name: &str) {
    let machine = create(
        client,
        json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER}},
            "spec": {
                "clusterName": CLUSTER,
                "bootstrap": {"dataSecretName": "bootstrap-data"},
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3Machine", "name": format!("m3-{name}")},
            },
        }),
    )
    .await;
    create(
        client,
        json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3Machine",
            "metadata": {
                "name": format!("m3-{name}"),
                "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER},
                "ownerReferences": [{
                    "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "name": name,
                    "uid": machine.uid().expect("a uid"), "controller": true, "blockOwnerDeletion": true,
                }],
            },
            "spec": {
                "image": {"url": "http://172.22.0.1/images/node.qcow2", "checksum": "http://172.22.0.1/images/node.qcow2.sha256sum", "checksumType": "sha256", "format": "qcow2"},
                "dataTemplate": {"name": TEMPLATE},
            },
        }),
    )
    .await;
}

/// What a Metal3Machine ended up with: its host, and the addresses its rendered networkData gives
/// each network.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rendered {
    host: String,
    addresses: BTreeMap<String, String>,
}

/// Waits until `m3m`'s host carries the secrets rendered for it (CAPM3 attaches them when the
/// Metal3Data is ready), and reads them.
async fn rendered(client: &Client, m3m: &str) -> Rendered {
    let v1beta2 = "infrastructure.cluster.x-k8s.io/v1beta2";
    let (host, network_secret) = eventually(
        &format!("the host of {m3m} carries its rendered secrets"),
        WAIT,
        || async {
            let machine = get(client, v1beta2, "Metal3Machine", m3m).await?;
            let host = machine
                .metadata
                .annotations
                .as_ref()?
                .get("metal3.io/BareMetalHost")?
                .rsplit('/')
                .next()?
                .to_string();
            let bmh = get(client, "metal3.io/v1alpha1", "BareMetalHost", &host).await?;
            let network = bmh.data["spec"]["networkData"]["name"]
                .as_str()?
                .to_string();
            let meta = bmh.data["spec"]["metaData"]["name"].as_str()?;
            (network == format!("{m3m}-networkdata") && meta == format!("{m3m}-metadata"))
                .then_some((host, network))
        },
    )
    .await;
    let secret = Api::<Secret>::namespaced(client.clone(), NS)
        .get(&network_secret)
        .await
        .expect("the networkData secret");
    let text = secret
        .data
        .as_ref()
        .and_then(|d| d.get("networkData"))
        .map(|b| String::from_utf8_lossy(&b.0).to_string())
        .expect("a networkData key");
    let network: Value = serde_saphyr::from_str(&text).expect("networkData is YAML");
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
    Rendered { host, addresses }
}

/// The managers that wrote each object of `kind` (the main resource and, apart, its status).
async fn writers(
    client: &Client,
    api_version: &str,
    kind: &str,
) -> BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> {
    list(client, api_version, kind)
        .await
        .into_iter()
        .map(|o| {
            let (mut main, mut status) = (BTreeSet::new(), BTreeSet::new());
            for entry in o.metadata.managed_fields.iter().flatten() {
                let manager = entry.manager.clone().unwrap_or_default();
                match entry.subresource.as_deref() {
                    Some("status") => status.insert(manager),
                    _ => main.insert(manager),
                };
            }
            (o.name_any(), (main, status))
        })
        .collect()
}

/// The part of each writer: bitpool alone writes the IP claims' status and the addresses; the
/// Metal3Data and their secrets are not bitpool's in `capm3_renders` mode, and only bitpool's
/// otherwise.
async fn assert_one_writer_each(client: &Client, capm3_renders: bool) {
    for (version, kind) in [
        ("ipam.metal3.io/v1alpha1", "IPClaim"),
        ("ipam.cluster.x-k8s.io/v1beta2", "IPAddressClaim"),
    ] {
        for (name, (_, status)) in writers(client, version, kind).await {
            assert_eq!(
                status,
                BTreeSet::from([BITPOOL.to_string()]),
                "{kind} {name}: status writers"
            );
        }
    }
    for (version, kind) in [
        ("ipam.metal3.io/v1alpha1", "IPAddress"),
        ("ipam.cluster.x-k8s.io/v1beta2", "IPAddress"),
    ] {
        for (name, (main, _)) in writers(client, version, kind).await {
            assert_eq!(
                main,
                BTreeSet::from([BITPOOL.to_string()]),
                "{kind} {name} ({version}): writers"
            );
        }
    }
    let datas = writers(
        client,
        "infrastructure.cluster.x-k8s.io/v1beta2",
        "Metal3Data",
    )
    .await;
    assert!(!datas.is_empty(), "Metal3Data were rendered");
    let secrets = writers(client, "v1", "Secret").await;
    let rendered = secrets
        .into_iter()
        .filter(|(name, _)| name.ends_with("-metadata") || name.ends_with("-networkdata"));
    for (what, (main, status)) in datas
        .into_iter()
        .map(|(name, w)| (format!("Metal3Data {name}"), w))
        .chain(rendered.map(|(name, w)| (format!("Secret {name}"), w)))
    {
        let by_bitpool = main.contains(BITPOOL) || status.contains(BITPOOL);
        if capm3_renders {
            assert!(!by_bitpool, "{what} is CAPM3's: {main:?} {status:?}");
        } else {
            // CAPM3 created none of them and never wrote to one.
            assert_eq!(
                main,
                BTreeSet::from([BITPOOL.to_string()]),
                "{what}: writers"
            );
            assert!(
                status.iter().all(|m| m == BITPOOL),
                "{what}: status writers {status:?}"
            );
        }
    }
}

/// Deletes a Machine's Metal3Machine and then the Machine, as Cluster API's machine controller
/// does on scale down, and waits until CAPM3 has let go of the host and the Metal3Data is gone.
async fn scale_down(client: &Client, machine: &str, host: &str) {
    let m3m = format!("m3-{machine}");
    let v1beta2 = "infrastructure.cluster.x-k8s.io/v1beta2";
    api(client, v1beta2, "Metal3Machine")
        .delete(&m3m, &DeleteParams::default())
        .await
        .expect("delete the Metal3Machine");
    eventually(&format!("{m3m} is gone"), WAIT, || async {
        get(client, v1beta2, "Metal3Machine", &m3m)
            .await
            .is_none()
            .then_some(())
    })
    .await;
    api(client, "cluster.x-k8s.io/v1beta2", "Machine")
        .delete(machine, &DeleteParams::default())
        .await
        .expect("delete the Machine");
    eventually(
        &format!("{host} is released, its claims and Metal3Data gone"),
        WAIT,
        || async {
            let bmh = get(client, "metal3.io/v1alpha1", "BareMetalHost", host).await?;
            let claims = list(client, "ipam.metal3.io/v1alpha1", "IPClaim").await;
            let datas = list(client, v1beta2, "Metal3Data").await;
            (bmh.data["spec"]["consumerRef"].is_null()
                && !claims.iter().any(|c| c.name_any().starts_with(host))
                && datas.len() == 1)
                .then_some(())
        },
    )
    .await;
}

/// Creates two machines, checks what CAPM3 attached to their hosts, scales one down and up again,
/// and checks that the host kept its addresses and that each object had one writer.
async fn two_machines_scale_down_and_up(client: &Client, capm3_renders: bool) {
    create_cluster(client, !capm3_renders).await;
    create_machine(client, "worker-a").await;
    create_machine(client, "worker-b").await;
    let a = rendered(client, "m3-worker-a").await;
    let b = rendered(client, "m3-worker-b").await;
    for r in [&a, &b] {
        let host = HOSTS
            .iter()
            .position(|h| *h == r.host)
            .expect("one of the hosts");
        assert_eq!(
            r.addresses.get("provisioning"),
            Some(&preallocated(host)),
            "{r:?}"
        );
        let capi = r.addresses.get("baremetal").expect("a CAPI pool address");
        assert!(capi.starts_with("10.0.0."), "{r:?}");
    }
    assert_ne!(a.addresses["baremetal"], b.addresses["baremetal"]);
    assert_one_writer_each(client, capm3_renders).await;

    // Scale down and up: the new machine gets the freed host and the same addresses.
    scale_down(client, "worker-b", &b.host).await;
    create_machine(client, "worker-c").await;
    let c = rendered(client, "m3-worker-c").await;
    assert_eq!(
        (&c.host, &c.addresses),
        (&b.host, &b.addresses),
        "the host keeps its addresses"
    );
    assert_one_writer_each(client, capm3_renders).await;
    assert_nothing_written_at_rest(client).await;
}

/// The objects of the IPAM and the Metal3Data kinds, and the rendered secrets, by resourceVersion.
async fn versions(client: &Client) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (version, kind) in [
        ("ipam.metal3.io/v1alpha1", "IPPool"),
        ("ipam.metal3.io/v1alpha1", "IPClaim"),
        ("ipam.metal3.io/v1alpha1", "IPAddress"),
        ("ipam.cluster.x-k8s.io/v1alpha2", "InClusterIPPool"),
        ("ipam.cluster.x-k8s.io/v1beta2", "IPAddressClaim"),
        ("ipam.cluster.x-k8s.io/v1beta2", "IPAddress"),
        (
            "infrastructure.cluster.x-k8s.io/v1beta2",
            "Metal3DataTemplate",
        ),
        ("infrastructure.cluster.x-k8s.io/v1beta2", "Metal3DataClaim"),
        ("infrastructure.cluster.x-k8s.io/v1beta2", "Metal3Data"),
        ("v1", "Secret"),
    ] {
        for object in list(client, version, kind).await {
            let key = format!("{version} {kind} {}", object.name_any());
            out.insert(key, object.resource_version().unwrap_or_default());
        }
    }
    out
}

/// Settled, neither bitpool nor CAPM3 writes to these objects: watched for a little longer than
/// CAPM3's 30 s requeue of the objects it waits on.
async fn assert_nothing_written_at_rest(client: &Client) {
    // Settled first: the last status writes (pool counts, template indexes) land.
    let mut before = versions(client).await;
    let settle = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let now = versions(client).await;
        if now == before {
            break;
        }
        assert!(tokio::time::Instant::now() < settle, "never settled");
        before = now;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(31);
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = versions(client).await;
        let changed: Vec<_> = now
            .iter()
            .filter(|(k, v)| before.get(*k) != Some(*v))
            .map(|(k, _)| k)
            .collect();
        assert!(changed.is_empty(), "written at rest: {changed:?}");
    }
}

/// Mode "bitpool as the IPAM of a Metal3 cluster": CAPM3 renders the Metal3Data itself; its
/// IPClaims (named after the host: BMH-name preallocation) and its IPAddressClaims (a template
/// network on an InClusterIPPool by `fromPoolRef`) are served by bitpool's pools.
#[tokio::test]
async fn bitpool_serves_the_ip_claims_of_capm3_which_renders_the_data() {
    let plane = Metal3Plane::start("capm3-ipam").await;
    let client = plane.client.clone();
    let bitpool = Bitpool::start_in(
        &plane.kubeconfig,
        "capm3-ipam",
        &["--controllers=capi-ipam,metal3-ipam,migration-proxy"],
    );
    two_machines_scale_down_and_up(&client, true).await;
    drop(bitpool);
    drop(plane);
}

/// Mode "bitpool as the Metal3Data reconciler beside CAPM3": the template is handed to bitpool
/// (`cluster.x-k8s.io/paused: bitpool`), which CAPM3's data controllers honour as a pause; bitpool
/// allocates the indexes, makes the Metal3Data (handed over too), claims the addresses and
/// renders the secrets that CAPM3 then attaches to the hosts.
#[tokio::test]
async fn bitpool_renders_the_data_of_a_template_handed_over_beside_capm3() {
    let plane = Metal3Plane::start("capm3-data").await;
    let client = plane.client.clone();
    let bitpool = Bitpool::start_in(
        &plane.kubeconfig,
        "capm3-data",
        &["--enable-bmh-name-based-preallocation"],
    );
    two_machines_scale_down_and_up(&client, false).await;
    let datas = list(
        &client,
        "infrastructure.cluster.x-k8s.io/v1beta2",
        "Metal3Data",
    )
    .await;
    for data in datas {
        let marker = data.annotations().get("cluster.x-k8s.io/paused").cloned();
        assert_eq!(
            marker.as_deref(),
            Some("bitpool"),
            "{} is handed over",
            data.name_any()
        );
    }
    drop(bitpool);
    drop(plane);
}

/// What a Cluster names for its endpoint (`ipam.bitpool.dev/control-plane-endpoint-pool`).
const ENDPOINT_POOL: &str = bitpool::api::capi::ENDPOINT_POOL_ANNOTATION;
/// The pool of control-plane endpoints in the endpoint test: three addresses.
const VIPS: &str = "vips";

/// CAPM3's own admission webhooks (its module's `config/webhook/manifests.yaml`: among them the
/// Metal3Cluster validation that refuses an empty endpoint host) and bitpool's endpoint webhooks
/// (`config/webhook/endpoint`), each pointed at its process on 127.0.0.1.
async fn register_endpoint_webhooks(plane: &Metal3Plane, bitpool_port: u16) {
    let ca = plane.certs.ca_pem.clone();
    let at = |port: u16| {
        let ca = ca.clone();
        move |path: &str| WebhookClientConfig {
            url: Some(format!("https://127.0.0.1:{port}{path}")),
            ca_bundle: Some(ByteString(ca.clone().into_bytes())),
            service: None,
        }
    };
    let capm3 = read_manifests(&support::upstream_crds_dir().join("capm3-webhooks/manifests.yaml"));
    register(&plane.client, capm3, "capm3", at(plane.capm3_port), None).await;
    let ours = read_manifests(std::path::Path::new(
        "config/webhook/endpoint/manifests.yaml",
    ));
    register(
        &plane.client,
        ours,
        "bitpool-endpoint",
        at(bitpool_port),
        None,
    )
    .await;
}

/// A Cluster whose infrastructure is a `infra_kind` of its own name, naming `pool` for its
/// endpoint if given. Refused: the API server's message.
async fn create_endpoint_cluster(
    client: &Client,
    name: &str,
    infra_kind: &str,
    pool: Option<&str>,
) -> Result<DynamicObject, String> {
    let annotations = pool.map_or(json!({}), |p| json!({ ENDPOINT_POOL: p }));
    try_create(
        client,
        false,
        json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": infra_kind, "name": name,
            }},
        }),
    )
    .await
}

/// A Metal3Cluster without an endpoint, naming `pool` if given, as a user writes it.
async fn create_metal3_cluster(
    client: &Client,
    name: &str,
    pool: Option<&str>,
) -> Result<DynamicObject, String> {
    metal3_cluster(client, name, pool, false).await
}

/// [`create_metal3_cluster`], or only its dry run.
async fn metal3_cluster(
    client: &Client,
    name: &str,
    pool: Option<&str>,
    dry_run: bool,
) -> Result<DynamicObject, String> {
    let annotations = pool.map_or(json!({}), |p| json!({ ENDPOINT_POOL: p }));
    try_create(
        client,
        dry_run,
        json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3Cluster",
            "metadata": {"name": name, "annotations": annotations, "labels": {"cluster.x-k8s.io/cluster-name": name}},
            "spec": {"noCloudProvider": true},
        }),
    )
    .await
}

async fn try_create(
    client: &Client,
    dry_run: bool,
    object: Value,
) -> Result<DynamicObject, String> {
    let api_version = object["apiVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let kind = object["kind"].as_str().unwrap_or_default().to_string();
    let object: DynamicObject = serde_json::from_value(object).expect("a manifest");
    let params = PostParams {
        dry_run,
        ..Default::default()
    };
    api(client, &api_version, &kind)
        .create(&params, &object)
        .await
        .map_err(|e| e.to_string())
}

/// `host:port` of an object's `spec.controlPlaneEndpoint`.
fn endpoint(object: &DynamicObject) -> String {
    let endpoint = &object.data["spec"]["controlPlaneEndpoint"];
    format!(
        "{}:{}",
        endpoint["host"].as_str().unwrap_or_default(),
        endpoint["port"].as_i64().unwrap_or_default()
    )
}

/// The address of `cluster`'s endpoint claim, once it has one; asserts that the claim is the
/// Cluster's, made on the pool the Cluster named.
async fn endpoint_claim_address(client: &Client, cluster: &str) -> String {
    let uid = get(client, "cluster.x-k8s.io/v1beta2", "Cluster", cluster)
        .await
        .and_then(|c| c.uid())
        .expect("the Cluster");
    let claim_name = format!("{cluster}-control-plane-endpoint");
    let claim = eventually("the endpoint claim has an address", WAIT, || async {
        let claim = get(
            client,
            "ipam.cluster.x-k8s.io/v1beta2",
            "IPAddressClaim",
            &claim_name,
        )
        .await?;
        claim.data["status"]["addressRef"]["name"].as_str()?;
        Some(claim)
    })
    .await;
    let owners = claim.owner_references();
    assert!(
        owners.iter().any(|o| o.kind == "Cluster" && o.uid == uid),
        "the claim is owned by its Cluster: {owners:?}"
    );
    assert_eq!(claim.data["spec"]["poolRef"]["name"], VIPS);
    let address = get(
        client,
        "ipam.cluster.x-k8s.io/v1beta2",
        "IPAddress",
        &claim_name,
    )
    .await
    .expect("the claim's IPAddress");
    address.data["spec"]["address"]
        .as_str()
        .expect("an address")
        .to_string()
}

/// `pool`'s free count once it is `free`.
async fn wait_free(client: &Client, free: i64) {
    eventually(&format!("the pool has {free} free"), WAIT, || async {
        let pool = get(
            client,
            "ipam.cluster.x-k8s.io/v1alpha2",
            "InClusterIPPool",
            VIPS,
        )
        .await?;
        (pool.data["status"]["ipAddresses"]["free"].as_i64() == Some(free)).then_some(())
    })
    .await;
}

/// A claim of a machine's, on the endpoint pool.
async fn claim_for_a_machine(client: &Client, name: &str) {
    create(
        client,
        json!({
            "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
            "metadata": {"name": name},
            "spec": {"poolRef": {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": VIPS}},
        }),
    )
    .await;
}

/// Issue 30, item 4: a cluster's control-plane endpoint from a pool, with unmodified CAPM3 and
/// its own admission webhooks. A Metal3Cluster created without a host (which CAPM3's webhook
/// refuses) gets its Cluster's endpoint address from bitpool's mutating webhook; CAPM3
/// provisions it; the address is held by a claim the Cluster owns, never given to a machine, and
/// back in the pool when the Cluster goes. Bad annotations, missing and exhausted pools are
/// refused with the field; without the webhook, the Cluster is told by an Event and the claim's
/// status, and its endpoint is filled once an address is free.
#[tokio::test]
async fn a_clusters_endpoint_comes_from_a_pool_past_capm3s_own_webhook() {
    let plane = Metal3Plane::start("capm3-endpoint").await;
    let client = plane.client.clone();
    let port = free_port();
    let (port_arg, certs_arg) = (
        format!("--webhook-port={port}"),
        format!("--webhook-cert-dir={}", plane.certs.dir.display()),
    );
    let mut bitpool = Bitpool::start_in(
        &plane.kubeconfig,
        "capm3-endpoint",
        &[
            "--controllers=capi-ipam,metal3-ipam",
            &port_arg,
            "--webhook-host=127.0.0.1",
            &certs_arg,
        ],
    );
    wait_listening(port, "bitpool's webhook server listens").await;
    assert!(bitpool.is_running(), "bitpool runs");
    register_endpoint_webhooks(&plane, port).await;
    create(
        &client,
        json!({
            "apiVersion": "ipam.cluster.x-k8s.io/v1alpha2", "kind": "InClusterIPPool",
            "metadata": {"name": VIPS},
            "spec": {"addresses": ["10.9.0.100-10.9.0.102"], "prefix": 24, "gateway": "10.9.0.1"},
        }),
    )
    .await;
    wait_free(&client, 3).await;
    // The API server calls new webhook configurations after a moment; dry runs, which leave
    // nothing behind, until each webhook answers: CAPM3's refuses an empty host, bitpool's a
    // kind that is no pool kind (on a Metal3Cluster, and on a Cluster).
    let field = "metadata.annotations[ipam.bitpool.dev/control-plane-endpoint-pool]";
    eventually("the webhooks are called", WAIT, || async {
        let capm3 = metal3_cluster(&client, "probe", None, true).await.err()?;
        let ours = metal3_cluster(&client, "probe", Some("Nope/x"), true)
            .await
            .err()?;
        let cluster = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "probe", "annotations": {ENDPOINT_POOL: "Nope/x"}},
            "spec": {"infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3Cluster", "name": "probe",
            }},
        });
        let on_cluster = try_create(&client, true, cluster).await.err()?;
        (capm3.contains("denied the request")
            && !capm3.contains(field)
            && ours.contains(field)
            && on_cluster.contains(field))
        .then_some(())
    })
    .await;

    // A Metal3 cluster as clusterctl's template orders it: the Cluster names the pool, then its
    // Metal3Cluster comes without an endpoint.
    create_endpoint_cluster(&client, "c1", "Metal3Cluster", Some("InClusterIPPool/vips"))
        .await
        .expect("the Cluster is admitted");
    let m3c = create_metal3_cluster(&client, "c1", None)
        .await
        .expect("the Metal3Cluster is admitted past CAPM3's webhook");
    let vip = endpoint_claim_address(&client, "c1").await;
    assert_eq!(endpoint(&m3c), format!("{vip}:6443"));
    assert_eq!(vip, "10.9.0.100", "the pool's first address");
    // bitpool fills the Cluster's endpoint too (where Cluster API core would copy it).
    eventually("the Cluster's endpoint is filled", WAIT, || async {
        let cluster = get(&client, "cluster.x-k8s.io/v1beta2", "Cluster", "c1").await?;
        (endpoint(&cluster) == format!("{vip}:6443")).then_some(())
    })
    .await;
    // CAPM3 provisions the Metal3Cluster once its Cluster owns it (Cluster API core's part).
    let cluster = get(&client, "cluster.x-k8s.io/v1beta2", "Cluster", "c1")
        .await
        .expect("the Cluster");
    api(
        &client,
        "infrastructure.cluster.x-k8s.io/v1beta1",
        "Metal3Cluster",
    )
    .patch(
        "c1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"ownerReferences": [{
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "name": "c1",
            "uid": cluster.uid().expect("a uid"), "controller": true, "blockOwnerDeletion": true,
        }]}})),
    )
    .await
    .expect("own the Metal3Cluster");
    eventually("CAPM3 provisions the Metal3Cluster", WAIT, || async {
        let m3c = get(
            &client,
            "infrastructure.cluster.x-k8s.io/v1beta2",
            "Metal3Cluster",
            "c1",
        )
        .await?;
        (m3c.data["status"]["initialization"]["provisioned"] == true).then_some(())
    })
    .await;

    // The annotation on the Metal3Cluster itself; a machine's claim on the same pool gets the
    // last address, never an endpoint's.
    create_endpoint_cluster(&client, "c2", "Metal3Cluster", None)
        .await
        .expect("the Cluster is admitted");
    let m3c = create_metal3_cluster(&client, "c2", Some("InClusterIPPool/vips"))
        .await
        .expect("the Metal3Cluster is admitted");
    assert_eq!(endpoint(&m3c), "10.9.0.101:6443");
    claim_for_a_machine(&client, "machine-0").await;
    let machine = eventually("the machine's claim has an address", WAIT, || async {
        let a = get(
            &client,
            "ipam.cluster.x-k8s.io/v1beta2",
            "IPAddress",
            "machine-0",
        )
        .await?;
        a.data["spec"]["address"].as_str().map(str::to_string)
    })
    .await;
    assert_eq!(machine, "10.9.0.102");
    wait_free(&client, 0).await;

    // Refused, naming the annotation and the rule.
    let refusals = [
        (
            create_endpoint_cluster(&client, "c3", "Metal3Cluster", Some("InClusterIPPool/vips"))
                .await,
            "InClusterIPPool vips has no free address",
        ),
        (
            create_endpoint_cluster(&client, "c4", "Metal3Cluster", Some("InClusterIPPool/gone"))
                .await,
            "InClusterIPPool gone does not exist in namespace metal3",
        ),
        (
            create_endpoint_cluster(
                &client,
                "c5",
                "Metal3Cluster",
                Some("InClusterPrefixPool/vips"),
            )
            .await,
            "is not an address pool kind",
        ),
        (
            create_metal3_cluster(&client, "lonely", Some("InClusterIPPool/vips")).await,
            "no Cluster in namespace metal3 has Metal3Cluster lonely as its infrastructureRef",
        ),
    ];
    for (result, rule) in refusals {
        let message = result.expect_err("refused");
        assert!(
            message.contains(field) && message.contains(rule),
            "{message}"
        );
    }

    // The Cluster goes: its claim (collected with it) gives the address back.
    api(&client, "cluster.x-k8s.io/v1beta2", "Cluster")
        .delete("c1", &DeleteParams::default())
        .await
        .expect("delete the Cluster");
    eventually("the endpoint claim goes with its Cluster", WAIT, || async {
        let claim = get(
            &client,
            "ipam.cluster.x-k8s.io/v1beta2",
            "IPAddressClaim",
            "c1-control-plane-endpoint",
        )
        .await;
        claim.is_none().then_some(())
    })
    .await;
    wait_free(&client, 1).await;

    // Without bitpool's Cluster webhook: a Cluster of any infrastructure naming an exhausted pool
    // is told why it waits, and gets its endpoint once an address is free.
    claim_for_a_machine(&client, "machine-1").await;
    wait_free(&client, 0).await;
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let bitpool_validating = validating
        .list(&Default::default())
        .await
        .expect("list webhook configurations")
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .find(|n| n.starts_with("bitpool-endpoint"))
        .expect("bitpool's validating webhook");
    validating
        .delete(&bitpool_validating, &DeleteParams::default())
        .await
        .expect("remove bitpool's validating webhook");
    let admitted = eventually(
        "the Cluster is admitted without the webhook",
        WAIT,
        || async {
            create_endpoint_cluster(&client, "c6", "DockerCluster", Some("InClusterIPPool/vips"))
                .await
                .ok()
        },
    )
    .await;
    let uid = admitted.uid().expect("a uid");
    eventually("an Event says why the endpoint waits", WAIT, || async {
        let events: Api<Event> = Api::namespaced(client.clone(), NS);
        let events = events.list(&Default::default()).await.ok()?;
        events
            .items
            .into_iter()
            .find(|e| {
                e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid.as_str())
                    && e.reason.as_deref() == Some("ControlPlaneEndpointPending")
                    && e.note
                        .as_deref()
                        .is_some_and(|n| n.contains("no free address"))
            })
            .map(|_| ())
    })
    .await;
    let pending = get(
        &client,
        "ipam.cluster.x-k8s.io/v1beta2",
        "IPAddressClaim",
        "c6-control-plane-endpoint",
    )
    .await
    .expect("the endpoint claim");
    let ready = pending.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .cloned()
        .unwrap_or_default();
    assert_eq!(ready["reason"], "PoolExhausted", "{ready}");
    api(&client, "ipam.cluster.x-k8s.io/v1beta2", "IPAddressClaim")
        .delete("machine-1", &DeleteParams::default())
        .await
        .expect("release the machine's address");
    eventually(
        "the Cluster's endpoint is filled once an address is free",
        WAIT,
        || async {
            let cluster = get(&client, "cluster.x-k8s.io/v1beta2", "Cluster", "c6").await?;
            (endpoint(&cluster) == "10.9.0.100:6443").then_some(())
        },
    )
    .await;
    assert_eq!(endpoint_claim_address(&client, "c6").await, "10.9.0.100");
    assert!(bitpool.is_running(), "bitpool still runs");
    drop(bitpool);
    drop(plane);
}
