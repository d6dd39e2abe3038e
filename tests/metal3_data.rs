//! The Metal3Data reconciler against a real API server, with upstream's Machine, Metal3Machine and
//! BareMetalHost CRDs: a template referencing a Metal3 IPPool (by name and by annotation) and an
//! InClusterIPPool (by `fromPoolRef`), served by real `bitpool run` processes.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bitpool::api::capi::{IPAddress, IPAddressClaim};
use bitpool::api::capi_pools::InClusterIPPool;
use bitpool::api::metal3_data::{
    DATA_FINALIZER, DATA_NAME_LABEL, Metal3Data, Metal3DataClaim, Metal3DataTemplate,
    POOL_NAME_LABEL, SECRET_TYPE,
};
use bitpool::api::metal3_ipam::{IPClaim, IPPool, Metal3IPAddress};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};
use support::{Bitpool, Env, eventually};

const WAIT: Duration = Duration::from_secs(90);
const CLUSTER: &str = "test1";

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

struct Fixture {
    env: Env,
}

impl Fixture {
    async fn new(prefix: &str) -> Self {
        Self {
            env: Env::new(prefix).await,
        }
    }

    fn ns(&self) -> &str {
        self.env.name()
    }

    fn dynamic(&self, resource: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.env.client.clone(), self.ns(), resource)
    }

    /// Labels every object of the test carries: the process's watch filter and the cluster.
    fn labels(&self) -> Value {
        json!({
            "cluster.x-k8s.io/watch-filter": self.ns(),
            "cluster.x-k8s.io/cluster-name": CLUSTER,
        })
    }

    async fn create<K>(&self, object: Value) -> K
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let object: K = serde_json::from_value(object).expect("test object matches its type");
        self.env
            .api::<K>()
            .create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("create {}: {e}", object.name_any()))
    }

    async fn create_dynamic(&self, resource: &ApiResource, object: Value) -> DynamicObject {
        let object: DynamicObject = serde_json::from_value(object).expect("dynamic object");
        self.dynamic(resource)
            .create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("create {}: {e}", object.name_any()))
    }

    /// The Cluster, a Metal3 IPPool, an annotation-named Metal3 IPPool and an InClusterIPPool
    /// with DNS.
    async fn pools(&self, m3_prealloc: Value, capi_prealloc: Value) {
        let ns = self.ns();
        // CAPI claims name their Cluster and wait for it (the contract).
        self.create_dynamic(
            &resource("cluster.x-k8s.io", "v1beta2", "Cluster", "clusters"),
            json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": {"name": CLUSTER, "namespace": ns},
                "spec": {"paused": false},
            }),
        )
        .await;
        self.create::<IPPool>(json!({
            "metadata": {"name": "m3pool", "namespace": ns, "labels": self.labels()},
            "spec": {
                "clusterName": CLUSTER, "namePrefix": "m3",
                "pools": [{"start": "192.168.111.100", "end": "192.168.111.120"}],
                "prefix": 24, "gateway": "192.168.111.1", "dnsServers": ["192.168.111.1"],
                "preAllocations": m3_prealloc,
            }
        }))
        .await;
        self.create::<IPPool>(json!({
            "metadata": {"name": "annpool", "namespace": ns, "labels": self.labels()},
            "spec": {
                "namePrefix": "ann",
                "pools": [{"start": "172.16.0.10", "end": "172.16.0.20"}],
                "prefix": 16, "gateway": "172.16.0.1",
            }
        }))
        .await;
        self.create::<InClusterIPPool>(json!({
            "metadata": {"name": "capipool", "namespace": ns, "labels": self.labels()},
            "spec": {
                "addresses": ["10.0.0.10-10.0.0.30"], "prefix": 24, "gateway": "10.0.0.1",
                "dnsServers": ["10.0.0.53"], "preAllocations": capi_prealloc,
            }
        }))
        .await;
    }

    /// A template written for CAPM3 (at v1beta2), plus a network on the InClusterIPPool by `fromPoolRef` (its
    /// DNS servers by bitpool's `dnsFromPoolRef`) and one on a pool named by a BareMetalHost
    /// annotation.
    async fn template(&self) {
        let capi_ref = json!({"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "capipool"});
        self.create::<Metal3DataTemplate>(json!({
            "metadata": {"name": "workers", "namespace": self.ns(), "labels": self.labels()},
            "spec": {
                "clusterName": CLUSTER,
                "metaData": {
                    "objectNames": [{"key": "name", "object": "machine"}],
                    "indexes": [{"key": "index", "offset": 100, "step": 1, "prefix": "node"}],
                    "ipAddressesFromPool": [
                        {"key": "ip", "name": "m3pool", "apiGroup": "ipam.metal3.io", "kind": "IPPool"},
                        {"key": "capi_ip", "name": "capipool", "apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool"},
                    ],
                    "dnsServersFromPool": [
                        {"key": "dns", "name": "m3pool", "apiGroup": "", "kind": ""},
                        {"key": "capi_dns", "name": "capipool", "apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool"},
                    ],
                },
                "networkData": {
                    "links": {"ethernets": [{"type": "phy", "id": "enp1s0", "mtu": 1500, "macAddress": {"fromHostInterface": "enp1s0"}}]},
                    "networks": {"ipv4": [
                        {"id": "prov", "link": "enp1s0", "ipAddressFromIPPool": "m3pool",
                         "routes": [{"network": "0.0.0.0", "prefix": 0, "gateway": {"fromIPPool": "m3pool"}}]},
                        {"id": "capi", "link": "enp1s0", "fromPoolRef": capi_ref,
                         "routes": [{"network": "10.1.0.0", "prefix": 16, "gateway": {"fromPoolRef": capi_ref}, "services": {"dns": ["8.8.8.8"], "dnsFromPoolRef": capi_ref}}]},
                        {"id": "ann", "link": "enp1s0", "fromPoolAnnotation": {"object": "baremetalhost", "annotation": "example.com/pool"}},
                    ]},
                    "services": {"dnsFromIPPool": "m3pool"},
                },
            }
        }))
        .await;
    }

    /// A BareMetalHost with one NIC, as the baremetal-operator reports it.
    async fn host(&self, name: &str, mac: &str) {
        let bmh = resource("metal3.io", "v1alpha1", "BareMetalHost", "baremetalhosts");
        self.create_dynamic(&bmh, json!({
            "apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
            "metadata": {"name": name, "namespace": self.ns(), "annotations": {"example.com/pool": "annpool"}},
            "spec": {"online": true},
        }))
        .await;
        let status = json!({"status": {
            "errorCount": 0, "errorMessage": "", "operationalStatus": "OK", "poweredOn": true,
            "provisioningFailCount": 0, "provisioning": {"ID": "", "state": "provisioned"},
            "hardware": {"nics": [{"name": "enp1s0", "mac": mac}]},
        }});
        self.dynamic(&bmh)
            .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
            .await
            .expect("BareMetalHost status");
    }

    /// A CAPI Machine, its Metal3Machine on `host`, and the Metal3DataClaim CAPM3 would create.
    async fn machine(&self, name: &str, host: &str) {
        self.machine_on(name, host, "workers").await;
    }

    async fn machine_on(&self, name: &str, host: &str, template: &str) {
        let uid = self.metal3_machine(name, host).await;
        self.data_claim_on(name, &uid, template).await;
    }

    /// A CAPI Machine and its Metal3Machine on `host`; returns the Metal3Machine's UID.
    async fn metal3_machine(&self, name: &str, host: &str) -> String {
        let ns = self.ns();
        let machine = self
            .create_dynamic(
                &resource("cluster.x-k8s.io", "v1beta2", "Machine", "machines"),
                json!({
                    "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                    "metadata": {"name": format!("machine-{name}"), "namespace": ns, "labels": self.labels()},
                    "spec": {"clusterName": CLUSTER, "bootstrap": {"dataSecretName": "none"},
                             "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3Machine", "name": name}},
                }),
            )
            .await;
        let m3m = self
            .create_dynamic(
                &resource("infrastructure.cluster.x-k8s.io", "v1beta1", "Metal3Machine", "metal3machines"),
                json!({
                    "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3Machine",
                    "metadata": {
                        "name": name, "namespace": ns, "labels": self.labels(),
                        "annotations": {"metal3.io/BareMetalHost": format!("{ns}/{host}")},
                        "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                                             "name": machine.name_any(), "uid": machine.uid(), "controller": true}],
                    },
                    "spec": {"dataTemplate": {"name": "workers"}},
                }),
            )
            .await;
        m3m.uid().expect("the server sets a UID")
    }

    /// The Metal3DataClaim CAPM3 creates for a Metal3Machine.
    async fn data_claim(&self, name: &str, metal3_machine_uid: &str) {
        self.data_claim_on(name, metal3_machine_uid, "workers")
            .await;
    }

    async fn data_claim_on(&self, name: &str, metal3_machine_uid: &str, template: &str) {
        self.create::<Metal3DataClaim>(json!({
            "metadata": {
                "name": name, "namespace": self.ns(), "labels": self.labels(),
                "ownerReferences": [{"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3Machine",
                                     "name": name, "uid": metal3_machine_uid, "controller": true}],
            },
            "spec": {"template": {"name": template}},
        }))
        .await;
    }

    /// Waits until the claim's Metal3Data is ready; returns it.
    async fn ready_data(&self, claim: &str) -> Metal3Data {
        let claims = self.env.api::<Metal3DataClaim>();
        let datas = self.env.api::<Metal3Data>();
        eventually(&format!("Metal3Data of {claim} ready"), WAIT, || async {
            let claim = claims.get(claim).await.ok()?;
            let name = claim.status?.rendered_data?.name?;
            let data = datas.get(&name).await.ok()?;
            data.status
                .as_ref()
                .is_some_and(|s| s.ready)
                .then_some(data)
        })
        .await
    }

    async fn secret_text(&self, name: &str, key: &str) -> String {
        let secret = self
            .env
            .api::<Secret>()
            .get(name)
            .await
            .expect("secret exists");
        assert_eq!(secret.type_.as_deref(), Some(SECRET_TYPE));
        assert_eq!(
            secret
                .labels()
                .get("cluster.x-k8s.io/cluster-name")
                .map(String::as_str),
            Some(CLUSTER)
        );
        let bytes = secret
            .data
            .and_then(|d| d.get(key).cloned())
            .expect("secret key");
        String::from_utf8(bytes.0).expect("utf-8")
    }

    async fn metal3_address(&self, claim: &str) -> String {
        let claim = self.env.api::<IPClaim>().get(claim).await.expect("IPClaim");
        let name = claim
            .status
            .and_then(|s| s.address)
            .and_then(|a| a.name)
            .expect("allocated");
        self.env
            .api::<Metal3IPAddress>()
            .get(&name)
            .await
            .expect("IPAddress")
            .spec
            .address
    }

    async fn capi_address(&self, claim: &str) -> String {
        let claim = self
            .env
            .api::<IPAddressClaim>()
            .get(claim)
            .await
            .expect("IPAddressClaim");
        let name = claim
            .status
            .and_then(|s| s.address_ref)
            .map(|a| a.name)
            .expect("allocated");
        self.env
            .api::<IPAddress>()
            .get(&name)
            .await
            .expect("IPAddress")
            .spec
            .address
    }

    async fn gone<K>(&self, name: &str)
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let api = self.env.api::<K>();
        eventually(&format!("{name} gone"), WAIT, || async {
            matches!(api.get_opt(name).await, Ok(None)).then_some(())
        })
        .await
    }
}

/// The networkData CAPM3 writes for this template, from the addresses the host got.
fn expected_network_data(mac: &str, m3: &str, capi: &str, ann: &str) -> String {
    format!(
        "links:
- ethernet_mac_address: {mac}
  id: enp1s0
  mtu: 1500
  type: phy
networks:
- id: prov
  ip_address: {m3}
  link: enp1s0
  netmask: 255.255.255.0
  routes:
  - gateway: 192.168.111.1
    netmask: 0.0.0.0
    network: 0.0.0.0
    services: []
  type: ipv4
- id: capi
  ip_address: {capi}
  link: enp1s0
  netmask: 255.255.255.0
  routes:
  - gateway: 10.0.0.1
    netmask: 255.255.0.0
    network: 10.1.0.0
    services:
    - address: 8.8.8.8
      type: dns
    - address: 10.0.0.53
      type: dns
  type: ipv4
- id: ann
  ip_address: {ann}
  link: enp1s0
  netmask: 255.255.0.0
  routes: []
  type: ipv4
services:
- address: 192.168.111.1
  type: dns
"
    )
}

#[tokio::test]
async fn three_hosts_get_rendered_data_from_metal3_and_in_cluster_pools_and_release_it() {
    let f = Fixture::new("m3data").await;
    let _bitpool = Bitpool::start(f.ns(), &[]);
    f.pools(json!({}), json!({})).await;
    f.template().await;
    for i in 0..3 {
        f.host(&format!("node-{i}"), &format!("00:5c:52:31:3a:0{i}"))
            .await;
        f.machine(&format!("m3m-{i}"), &format!("node-{i}")).await;
    }

    let mut seen = BTreeSet::new();
    for i in 0..3 {
        let claim = format!("m3m-{i}");
        let data = f.ready_data(&claim).await;
        let name = data.name_any();
        assert!(
            ["workers-0", "workers-1", "workers-2"].contains(&name.as_str()),
            "{name}"
        );
        assert_eq!(
            data.spec.index.to_string(),
            name.trim_start_matches("workers-")
        );
        assert!(data.finalizers().iter().any(|f| f == DATA_FINALIZER));
        let owners: Vec<&str> = data
            .owner_references()
            .iter()
            .map(|o| o.kind.as_str())
            .collect();
        assert_eq!(
            owners,
            ["Metal3DataTemplate", "Metal3DataClaim", "Metal3Machine"]
        );

        // One claim per pool, of the kind the pool needs, named after the Metal3Data.
        let m3 = f.metal3_address(&format!("{name}-m3pool")).await;
        let ann = f.metal3_address(&format!("{name}-annpool")).await;
        let capi = f.capi_address(&format!("{name}-capipool")).await;
        for address in [&m3, &ann, &capi] {
            assert!(seen.insert(address.clone()), "{address} handed out twice");
        }
        let ipclaim = f
            .env
            .api::<IPClaim>()
            .get(&format!("{name}-m3pool"))
            .await
            .unwrap();
        assert!(ipclaim.finalizers().iter().any(|f| f == DATA_FINALIZER));
        assert_eq!(ipclaim.owner_references()[0].uid, data.uid().unwrap());
        assert_eq!(
            ipclaim.labels().get(POOL_NAME_LABEL).map(String::as_str),
            Some("m3pool")
        );

        let network = f
            .secret_text(&format!("{claim}-networkdata"), "networkData")
            .await;
        assert_eq!(
            network,
            expected_network_data(&format!("00:5c:52:31:3a:0{i}"), &m3, &capi, &ann)
        );
        let meta = f
            .secret_text(&format!("{claim}-metadata"), "metaData")
            .await;
        assert_eq!(
            meta,
            format!(
                "capi_dns: 10.0.0.53\ncapi_ip: {capi}\ndns: 192.168.111.1\nindex: node{}\nip: {m3}\nname: machine-{claim}\nproviderid: {}/node-{i}/{claim}\n",
                100 + data.spec.index,
                f.ns()
            )
        );
    }
    let templates = f.env.api::<Metal3DataTemplate>();
    let indexes = eventually("template indexes", WAIT, || async {
        let t = templates.get("workers").await.ok()?;
        let indexes: BTreeMap<String, i64> = t
            .status?
            .indexes
            .into_iter()
            .map(|e| (e.name, e.index))
            .collect();
        (indexes.len() == 3).then_some(indexes)
    })
    .await;
    assert_eq!(
        indexes.values().copied().collect::<BTreeSet<_>>(),
        BTreeSet::from([0, 1, 2])
    );

    // Deleting a host's claim releases its index and every IP claim, annotation pool included.
    let index_of_1 = indexes["m3m-1"];
    let data_1 = format!("workers-{index_of_1}");
    let m3_address_1 = f.metal3_address(&format!("{data_1}-m3pool")).await;
    f.env
        .api::<Metal3DataClaim>()
        .delete("m3m-1", &DeleteParams::default())
        .await
        .expect("delete claim");
    f.gone::<Metal3DataClaim>("m3m-1").await;
    f.gone::<Metal3Data>(&data_1).await;
    f.gone::<IPClaim>(&format!("{data_1}-m3pool")).await;
    f.gone::<IPClaim>(&format!("{data_1}-annpool")).await;
    f.gone::<IPAddressClaim>(&format!("{data_1}-capipool"))
        .await;
    let address_name = format!("m3-{}", m3_address_1.replace('.', "-"));
    f.gone::<Metal3IPAddress>(&address_name).await;
    eventually("index released", WAIT, || async {
        let t = templates.get("workers").await.ok()?;
        (!t.status?.indexes.iter().any(|e| e.name == "m3m-1")).then_some(())
    })
    .await;

    // A new host takes the lowest free index. Its secrets exist already (a re-provisioned host):
    // they are kept as they are, never re-rendered.
    for (name, key) in [
        ("m3m-3-metadata", "metaData"),
        ("m3m-3-networkdata", "networkData"),
    ] {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": f.ns(), "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER}},
            "type": SECRET_TYPE,
            "stringData": {key: "rendered: earlier\n"},
        }))
        .unwrap();
        f.env
            .api::<Secret>()
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }
    f.host("node-3", "00:5c:52:31:3a:03").await;
    f.machine("m3m-3", "node-3").await;
    let data = f.ready_data("m3m-3").await;
    assert_eq!(data.spec.index, index_of_1);
    assert_eq!(
        f.secret_text("m3m-3-metadata", "metaData").await,
        "rendered: earlier\n"
    );
    assert_eq!(
        f.secret_text("m3m-3-networkdata", "networkData").await,
        "rendered: earlier\n"
    );

    // The template stays while Metal3Data use it, and goes with the last one.
    templates
        .delete("workers", &DeleteParams::default())
        .await
        .expect("delete template");
    let claims = f.env.api::<Metal3DataClaim>();
    assert!(templates.get_opt("workers").await.unwrap().is_some());
    for claim in ["m3m-0", "m3m-2", "m3m-3"] {
        claims
            .delete(claim, &DeleteParams::default())
            .await
            .expect("delete claim");
    }
    f.gone::<Metal3DataTemplate>("workers").await;
    eventually("no IP claim left", WAIT, || async {
        let ipclaims = f
            .env
            .api::<IPClaim>()
            .list(&Default::default())
            .await
            .ok()?;
        let capi = f
            .env
            .api::<IPAddressClaim>()
            .list(&Default::default())
            .await
            .ok()?;
        (ipclaims.items.is_empty() && capi.items.is_empty()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn host_keyed_claims_keep_preallocated_addresses_through_a_rolling_replacement() {
    let f = Fixture::new("m3prealloc").await;
    let _bitpool = Bitpool::start(f.ns(), &["--enable-bmh-name-based-preallocation"]);
    f.pools(
        json!({"node-0-m3pool": "192.168.111.115", "node-1-m3pool": "192.168.111.116", "node-2-m3pool": "192.168.111.117"}),
        json!({"node-0-capipool": "10.0.0.25", "node-1-capipool": "10.0.0.26", "node-2-capipool": "10.0.0.27"}),
    )
    .await;
    f.template().await;
    for i in 0..3 {
        f.host(&format!("node-{i}"), &format!("00:5c:52:31:3a:1{i}"))
            .await;
        f.machine(&format!("m3m-{i}"), &format!("node-{i}")).await;
    }
    let mut first = BTreeMap::new();
    for i in 0..3 {
        let data = f.ready_data(&format!("m3m-{i}")).await;
        // Claims of both kinds are named after the host and labelled for release.
        let m3 = f.metal3_address(&format!("node-{i}-m3pool")).await;
        let capi = f.capi_address(&format!("node-{i}-capipool")).await;
        assert_eq!(m3, format!("192.168.111.11{}", 5 + i));
        assert_eq!(capi, format!("10.0.0.2{}", 5 + i));
        let claim = f
            .env
            .api::<IPAddressClaim>()
            .get(&format!("node-{i}-capipool"))
            .await
            .unwrap();
        assert_eq!(claim.labels().get(DATA_NAME_LABEL), Some(&data.name_any()));
        assert_eq!(
            claim.labels().get(POOL_NAME_LABEL).map(String::as_str),
            Some("capipool")
        );
        first.insert(i, (data.name_any(), m3, capi));
    }

    // Rolling replacement of node-0 with surge: the new Metal3Machine's data waits while the
    // old one still owns the host's claims (never taken over), then gets the same addresses.
    f.machine("m3m-0-new", "node-0").await;
    let datas = f.env.api::<Metal3Data>();
    let new_data = eventually("the new Metal3Data", WAIT, || async {
        let claim = f.env.api::<Metal3DataClaim>().get("m3m-0-new").await.ok()?;
        let name = claim.status?.rendered_data?.name?;
        datas.get(&name).await.ok()
    })
    .await;
    let old_data = &first[&0].0;
    let held = f.env.api::<IPClaim>().get("node-0-m3pool").await.unwrap();
    assert_eq!(held.labels().get(DATA_NAME_LABEL), Some(old_data));
    assert!(!new_data.status.as_ref().is_some_and(|s| s.ready));

    f.env
        .api::<Metal3DataClaim>()
        .delete("m3m-0", &DeleteParams::default())
        .await
        .expect("delete the old claim");
    let replaced = f.ready_data("m3m-0-new").await;
    assert_eq!(replaced.name_any(), new_data.name_any());
    let m3 = f.metal3_address("node-0-m3pool").await;
    let capi = f.capi_address("node-0-capipool").await;
    assert_eq!(
        (m3.as_str(), capi.as_str()),
        (first[&0].1.as_str(), first[&0].2.as_str())
    );
    let network = f.secret_text("m3m-0-new-networkdata", "networkData").await;
    assert!(
        network.contains(&format!("ip_address: {m3}\n")),
        "{network}"
    );
    assert!(
        network.contains(&format!("ip_address: {capi}\n")),
        "{network}"
    );
}

#[tokio::test]
async fn a_template_error_is_reported_on_the_metal3_data() {
    let f = Fixture::new("m3dataerr").await;
    let _bitpool = Bitpool::start(f.ns(), &[]);
    f.pools(json!({}), json!({})).await;
    // The same pool name as a CAPI pool and (by a name-only field) a Metal3 pool.
    f.create::<Metal3DataTemplate>(json!({
        "metadata": {"name": "workers", "namespace": f.ns(), "labels": f.labels()},
        "spec": {
            "clusterName": CLUSTER,
            "metaData": {"ipAddressesFromPool": [{"key": "ip", "name": "capipool", "apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool"}]},
            "networkData": {"services": {"dnsFromIPPool": "capipool"}},
        }
    }))
    .await;
    f.host("node-0", "00:5c:52:31:3a:20").await;
    f.machine("m3m-0", "node-0").await;
    let datas = f.env.api::<Metal3Data>();
    let message = eventually("an error message", WAIT, || async {
        datas.get("workers-0").await.ok()?.status?.error_message
    })
    .await;
    assert!(
        message.contains("multiple references with the same name but different resource types"),
        "{message}"
    );
    assert!(
        f.env
            .api::<IPClaim>()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

/// A Metal3DataClaim whose last change came while its template was cached hears nothing of its
/// own when the template leaves the cache: deleted while its template is paused (which serves
/// nobody), it is released once the template is gone from the process's view.
#[tokio::test]
async fn a_deleting_data_claim_is_released_when_its_template_goes_without_releasing_it() {
    let f = Fixture::new("m3data-left").await;
    let template = |name: &str| {
        json!({
            "metadata": {"name": name, "namespace": f.ns(), "labels": f.labels()},
            "spec": {"clusterName": CLUSTER, "metaData": {}, "networkData": {}},
        })
    };
    let first = Bitpool::start(f.ns(), &[]);
    f.create::<Metal3DataTemplate>(template("paused")).await;
    f.create::<Metal3DataClaim>(json!({
        "metadata": {"name": "left", "namespace": f.ns(), "labels": f.labels()},
        "spec": {"template": {"name": "paused"}},
    }))
    .await;
    let (claims, templates) = (
        f.env.api::<Metal3DataClaim>(),
        f.env.api::<Metal3DataTemplate>(),
    );
    let protected = |name: &'static str| {
        let templates = templates.clone();
        async move {
            let template = templates.get_opt(name).await.ok()??;
            (!template.finalizers().is_empty()).then_some(())
        }
    };
    eventually("the claim protected", WAIT, || async {
        let claim = claims.get_opt("left").await.ok()??;
        (!claim.finalizers().is_empty()).then_some(())
    })
    .await;
    eventually("the template protected", WAIT, || protected("paused")).await;
    // Paused and deleted while no process runs: the next one sees both from its start.
    drop(first);
    let patch = |value: Value| Patch::Merge(json!({ "metadata": value }));
    templates
        .patch(
            "paused",
            &PatchParams::default(),
            &patch(json!({"annotations": {"cluster.x-k8s.io/paused": ""}})),
        )
        .await
        .expect("pause the template");
    claims
        .delete("left", &DeleteParams::default())
        .await
        .expect("delete the claim");
    let _bitpool = Bitpool::start(f.ns(), &[]);
    // Reconciles run once every cache is in: a template protected means the claim was judged
    // with its template cached.
    f.create::<Metal3DataTemplate>(template("marker")).await;
    eventually("the marker template protected", WAIT, || {
        protected("marker")
    })
    .await;
    let waiting = claims.get("left").await.expect("the claim waits");
    assert!(waiting.metadata.deletion_timestamp.is_some());
    // Out of the process's watch filter, the template leaves its cache with a deletion alone
    // (a deleted template's last change may still trigger its claims; this has none).
    templates
        .patch(
            "paused",
            &PatchParams::default(),
            &patch(json!({"labels": {"cluster.x-k8s.io/watch-filter": null}})),
        )
        .await
        .expect("take the template out of the watch filter");
    f.gone::<Metal3DataClaim>("left").await;
}

#[tokio::test]
async fn two_racing_processes_and_a_kill_mid_burst_give_each_claim_one_index_and_one_data() {
    let f = Fixture::new("m3datarace").await;
    const HOSTS: usize = 10;
    f.pools(json!({}), json!({})).await;
    f.template().await;
    let mut uids = vec![];
    for i in 0..HOSTS {
        f.host(&format!("node-{i}"), &format!("00:5c:52:31:3b:{i:02}"))
            .await;
        uids.push(
            f.metal3_machine(&format!("m3m-{i}"), &format!("node-{i}"))
                .await,
        );
    }
    let mut doomed = Bitpool::start(f.ns(), &[]);
    let _survivor = Bitpool::start(f.ns(), &[]);
    // The burst: every claim at once, both processes racing for indexes and addresses.
    let fixture = &f;
    futures::future::join_all(
        uids.iter()
            .enumerate()
            .map(|(i, uid)| async move { fixture.data_claim(&format!("m3m-{i}"), uid).await }),
    )
    .await;
    let kill_at = 1 + rand::random::<u32>() as usize % 4;
    let datas = f.env.api::<Metal3Data>();
    let ready_at_kill = eventually("the first Metal3Data", WAIT, || async {
        let list = datas.list(&Default::default()).await.ok()?;
        (list.items.len() >= kill_at).then(|| {
            list.items
                .iter()
                .filter(|d| d.status.as_ref().is_some_and(|s| s.ready))
                .count()
        })
    })
    .await;
    doomed.kill();
    assert!(
        ready_at_kill < HOSTS,
        "the kill came after the burst; the test proved nothing"
    );

    let mut claims_of_data = BTreeMap::new();
    for i in 0..HOSTS {
        let data = f.ready_data(&format!("m3m-{i}")).await;
        assert_eq!(
            data.spec.claim.name.as_deref(),
            Some(format!("m3m-{i}").as_str())
        );
        claims_of_data.insert(data.spec.index, data.name_any());
    }
    let all = datas.list(&Default::default()).await.unwrap().items;
    assert_eq!(
        all.len(),
        HOSTS,
        "one Metal3Data per claim: {:?}",
        all.iter().map(|d| d.name_any()).collect::<Vec<_>>()
    );
    assert_eq!(
        claims_of_data.keys().copied().collect::<Vec<_>>(),
        (0..HOSTS as i64).collect::<Vec<_>>(),
        "indexes are 0..{HOSTS}, each once"
    );
    let mut addresses = BTreeSet::new();
    for data in claims_of_data.values() {
        for address in [
            f.metal3_address(&format!("{data}-m3pool")).await,
            f.metal3_address(&format!("{data}-annpool")).await,
            f.capi_address(&format!("{data}-capipool")).await,
        ] {
            assert!(
                addresses.insert(address.clone()),
                "{address} handed out twice"
            );
        }
    }
    let ipclaims = f
        .env
        .api::<IPClaim>()
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    let capi_claims = f
        .env
        .api::<IPAddressClaim>()
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    assert_eq!(
        (ipclaims.len(), capi_claims.len()),
        (2 * HOSTS, HOSTS),
        "one claim per pool and host"
    );
}

#[tokio::test]
async fn exhausted_pools_are_reported_on_the_metal3_data_and_retried() {
    let f = Fixture::new("m3dataexhaust").await;
    let _bitpool = Bitpool::start(f.ns(), &[]);
    f.pools(json!({}), json!({})).await;
    f.create::<IPPool>(json!({
        "metadata": {"name": "tiny-m3", "namespace": f.ns(), "labels": f.labels()},
        "spec": {"namePrefix": "tiny", "pools": [{"start": "192.168.200.10", "end": "192.168.200.10"}], "prefix": 24},
    }))
    .await;
    f.create::<Metal3DataTemplate>(json!({
        "metadata": {"name": "tiny", "namespace": f.ns(), "labels": f.labels()},
        "spec": {
            "clusterName": CLUSTER,
            "metaData": {"ipAddressesFromPool": [{"key": "ip", "name": "tiny-m3", "apiGroup": "ipam.metal3.io", "kind": "IPPool"}]},
        }
    }))
    .await;
    for i in 0..2 {
        f.host(&format!("node-{i}"), &format!("00:5c:52:31:3c:0{i}"))
            .await;
        f.machine_on(&format!("m3m-{i}"), &format!("node-{i}"), "tiny")
            .await;
        if i == 0 {
            f.ready_data("m3m-0").await;
        }
    }
    let claims = f.env.api::<Metal3DataClaim>();
    let datas = f.env.api::<Metal3Data>();
    let message = eventually("the exhaustion message", WAIT, || async {
        let name = claims
            .get("m3m-1")
            .await
            .ok()?
            .status?
            .rendered_data?
            .name?;
        datas.get(&name).await.ok()?.status?.error_message
    })
    .await;
    assert_eq!(
        message,
        "IP Allocation for tiny-m3 failed : Exhausted IP Pools"
    );

    // Upstream leaves this Metal3Data failed for good; here the address freed by m3m-0 serves it.
    claims
        .delete("m3m-0", &DeleteParams::default())
        .await
        .expect("delete claim");
    let data = f.ready_data("m3m-1").await;
    assert_eq!(data.status.and_then(|s| s.error_message), None);
    let meta = f.secret_text("m3m-1-metadata", "metaData").await;
    assert!(meta.starts_with("ip: 192.168.200.10\n"), "{meta}");
}

/// A finalizer of someone else's, holding a Metal3Data back after bitpool released it.
const HOLD: &str = "example.com/hold";

/// A `bitpool run` serving the fixture's namespace with its metrics open, once they answer, and
/// their endpoints.
async fn start_with_metrics(f: &Fixture) -> (Bitpool, support::ops::Endpoints) {
    let endpoints = support::ops::Endpoints::new();
    let args = endpoints.args(false);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let bitpool = Bitpool::start(f.ns(), &args);
    support::wait::wait_listening(endpoints.diagnostics, "the metrics endpoint").await;
    (bitpool, endpoints)
}

/// How many Metal3DataTemplate reconciles the process has run.
async fn template_reconciles(endpoints: &support::ops::Endpoints) -> f64 {
    let metrics = endpoints.metrics().await;
    let series = r#"bitpool_reconcile_duration_seconds_count{controller="Metal3DataTemplate"}"#;
    support::ops::sample(&metrics, series).unwrap_or(0.0)
}

/// Once the template controller has done what the last changes asked (no reconcile for a
/// second), checks that it does nothing for `window` in which nothing changes: no template
/// looks again on a timer. Returns the reconciles so far.
async fn assert_templates_idle(endpoints: &support::ops::Endpoints, window: Duration) -> f64 {
    let settled = eventually("the template controller done", WAIT, || async {
        let before = template_reconciles(endpoints).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        (template_reconciles(endpoints).await == before).then_some(before)
    })
    .await;
    tokio::time::sleep(window).await;
    assert_eq!(
        template_reconciles(endpoints).await,
        settled,
        "Metal3DataTemplates reconciled while nothing changed"
    );
    settled
}

/// A template deleted while its Metal3Data is held by a foreign finalizer waits for it without
/// looking again, and goes once the Metal3Data does (a removal shared watches do not report).
#[tokio::test]
async fn a_deleting_template_waits_for_its_last_metal3_data_without_polling() {
    let f = Fixture::new("m3data-wait").await;
    let (_bitpool, endpoints) = start_with_metrics(&f).await;
    f.create::<Metal3DataTemplate>(json!({
        "metadata": {"name": "doomed", "namespace": f.ns(), "labels": f.labels()},
        "spec": {"clusterName": CLUSTER, "metaData": {}, "networkData": {}},
    }))
    .await;
    f.host("node-0", "00:5c:52:31:3d:00").await;
    f.machine_on("m3m-0", "node-0", "doomed").await;
    let data = f.ready_data("m3m-0").await;
    let (datas, templates) = (f.env.api::<Metal3Data>(), f.env.api::<Metal3DataTemplate>());
    let mut finalizers = data.finalizers().to_vec();
    finalizers.push(HOLD.to_string());
    let hold = json!({"metadata": {
        "finalizers": finalizers, "resourceVersion": data.resource_version(),
    }});
    datas
        .patch(
            &data.name_any(),
            &PatchParams::default(),
            &Patch::Merge(hold),
        )
        .await
        .expect("hold the Metal3Data");
    templates
        .delete("doomed", &DeleteParams::default())
        .await
        .expect("delete the template");
    f.env
        .api::<Metal3DataClaim>()
        .delete("m3m-0", &DeleteParams::default())
        .await
        .expect("delete the claim");
    f.gone::<Metal3DataClaim>("m3m-0").await;
    eventually("the Metal3Data released but held", WAIT, || async {
        let data = datas.get_opt(&data.name_any()).await.ok()??;
        (data.metadata.deletion_timestamp.is_some() && data.finalizers() == [HOLD]).then_some(())
    })
    .await;

    assert_templates_idle(&endpoints, Duration::from_secs(5)).await;
    let waiting = templates.get("doomed").await.expect("the template waits");
    assert!(waiting.metadata.deletion_timestamp.is_some());

    let release = json!({"metadata": {"finalizers": null}});
    datas
        .patch(
            &data.name_any(),
            &PatchParams::default(),
            &Patch::Merge(release),
        )
        .await
        .expect("let the Metal3Data go");
    f.gone::<Metal3DataTemplate>("doomed").await;
}

/// A template paused by its Cluster waits without looking again, and is served once the Cluster
/// is unpaused (which changes no template).
#[tokio::test]
async fn a_template_paused_by_its_cluster_waits_without_polling_and_is_served_once_unpaused() {
    let f = Fixture::new("m3data-unpause").await;
    let cluster = resource("cluster.x-k8s.io", "v1beta2", "Cluster", "clusters");
    f.create_dynamic(
        &cluster,
        json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": CLUSTER, "namespace": f.ns()},
            "spec": {"paused": true},
        }),
    )
    .await;
    let (_bitpool, endpoints) = start_with_metrics(&f).await;
    f.create::<Metal3DataTemplate>(json!({
        "metadata": {"name": "held", "namespace": f.ns(), "labels": f.labels()},
        "spec": {"clusterName": CLUSTER, "metaData": {}, "networkData": {}},
    }))
    .await;
    f.host("node-0", "00:5c:52:31:3e:00").await;
    f.machine_on("m3m-0", "node-0", "held").await;
    eventually("the paused template looked at", WAIT, || async {
        (template_reconciles(&endpoints).await >= 1.0).then_some(())
    })
    .await;

    // Longer than the 30 s after which a paused template used to look again.
    assert_templates_idle(&endpoints, Duration::from_secs(31)).await;
    let template = f.env.api::<Metal3DataTemplate>().get("held").await;
    assert!(template.expect("the template").finalizers().is_empty());
    let claim = f.env.api::<Metal3DataClaim>().get("m3m-0").await;
    let bound = claim
        .expect("the claim")
        .status
        .and_then(|s| s.rendered_data);
    assert!(bound.is_none(), "served while paused: {bound:?}");

    let unpause = json!({"spec": {"paused": false}});
    f.dynamic(&cluster)
        .patch(CLUSTER, &PatchParams::default(), &Patch::Merge(unpause))
        .await
        .expect("unpause the Cluster");
    let data = f.ready_data("m3m-0").await;
    assert_eq!(data.name_any(), "held-0");
}

/// Upstream's in-cluster provider serving the test namespace (webhooks, probes and metrics off).
fn in_cluster_provider(ns: &str) -> support::stack::Manager {
    let args: Vec<String> = [
        "--namespace",
        ns,
        "--webhook-port=0",
        "--health-probe-bind-address=0",
        "--diagnostics-address=0",
        "--insecure-diagnostics",
    ]
    .map(String::from)
    .to_vec();
    let kubeconfig = support::kubeconfig_path().as_path();
    support::stack::Manager::start("in-cluster", ns, &args, &[("KUBECONFIG", kubeconfig)])
}

/// Metal3's ip-address-manager serving the test namespace (it always serves its webhooks:
/// on a port of its own with a certificate made here, and nothing calls them).
fn metal3_ipam(ns: &str) -> support::stack::Manager {
    let certs = support::webhook::Certs::generate(&format!("{ns}-metal3-ipam"));
    let args = vec![
        "--namespace".to_string(),
        ns.to_string(),
        format!("--webhook-port={}", support::process::free_port()),
        format!("--webhook-cert-dir={}", certs.dir.display()),
        "--health-addr=0".into(),
        "--diagnostics-address=0".into(),
        "--insecure-diagnostics".into(),
    ];
    let kubeconfig = support::kubeconfig_path().as_path();
    support::stack::Manager::start("metal3-ipam", ns, &args, &[("KUBECONFIG", kubeconfig)])
}

/// The Metal3Data of `template`'s claim, once its `status.errorMessage` satisfies `check`.
async fn data_with_error(
    fixture: &Fixture,
    template: &str,
    what: &str,
    check: impl Fn(Option<&str>) -> bool,
) -> Metal3Data {
    let datas = fixture.env.api::<Metal3Data>();
    eventually(
        &format!("the Metal3Data of {template}: {what}"),
        WAIT * 2,
        || async {
            let list = datas.list(&Default::default()).await.ok()?;
            list.items.into_iter().find(|d| {
                d.spec.template.name.as_deref() == Some(template)
                    && check(d.status.as_ref().and_then(|s| s.error_message.as_deref()))
            })
        },
    )
    .await
}

/// Beside other IPAM providers (upstream's in-cluster provider and Metal3's ip-address-manager
/// as the IPAMs, bitpool with `--controllers metal3-data` alone): a template whose pool reference
/// names a kind no provider serves, and one whose provider is not running yet, leave their
/// Metal3Data saying so in `status.errorMessage` and an Event once the claim has had no answer
/// for the stated time; the message goes when a provider answers, and the host is rendered.
#[tokio::test]
async fn a_pool_kind_no_provider_serves_is_reported_on_the_metal3_data() {
    let fixture = Fixture::new("m3d-unanswered").await;
    let ns = fixture.ns().to_string();
    fixture.pools(json!({}), json!({})).await;
    let capi_ref =
        json!({"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "capipool"});
    let mistyped =
        json!({"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPol", "name": "vips"});
    for (name, network) in [("workers", capi_ref), ("typo", mistyped)] {
        fixture
            .create::<Metal3DataTemplate>(json!({
                "metadata": {"name": name, "namespace": &ns, "labels": fixture.labels()},
                "spec": {
                    "clusterName": CLUSTER,
                    "networkData": {
                        "links": {"ethernets": [{"type": "phy", "id": "enp1s0", "macAddress": {"fromHostInterface": "enp1s0"}}]},
                        "networks": {"ipv4": [
                            {"id": "prov", "link": "enp1s0", "ipAddressFromIPPool": "m3pool"},
                            {"id": "capi", "link": "enp1s0", "fromPoolRef": network},
                        ]},
                    },
                }
            }))
            .await;
    }
    let _metal3_ipam = metal3_ipam(&ns);
    let _bitpool = Bitpool::start(&ns, &["--controllers", "metal3-data"]);
    fixture.host("host-0", "00:00:00:00:00:01").await;
    fixture.host("host-1", "00:00:00:00:00:02").await;
    let uid = fixture.metal3_machine("m0", "host-0").await;
    fixture.data_claim_on("m0", &uid, "workers").await;
    let uid = fixture.metal3_machine("m1", "host-1").await;
    fixture.data_claim_on("m1", &uid, "typo").await;

    let unanswered = |claim: &'static str, serves: &'static str| {
        move |error: Option<&str>| {
            error.is_some_and(|e| {
                e.contains("no IPAM provider has answered IPAddressClaim")
                    && e.contains(claim)
                    && e.contains(serves)
                    && e.contains("60 s")
            })
        }
    };
    let waiting = data_with_error(
        &fixture,
        "workers",
        "no provider has answered the claim on capipool",
        unanswered(
            "capipool",
            "InClusterIPPool of API group ipam.cluster.x-k8s.io",
        ),
    )
    .await;
    let mistyped = data_with_error(
        &fixture,
        "typo",
        "no provider serves the mistyped kind",
        unanswered("vips", "InClusterIPPol of API group ipam.cluster.x-k8s.io"),
    )
    .await;
    for data in [&waiting, &mistyped] {
        support::wait::wait_event_about(&fixture.env, &data.name_any(), "ClaimUnanswered").await;
        assert!(!data.status.as_ref().is_some_and(|s| s.ready));
    }

    // The provider of InClusterIPPools starts: it answers, the message goes, the host is rendered.
    let _in_cluster = in_cluster_provider(&ns);
    let ready = data_with_error(&fixture, "workers", "served and cleared", |e| e.is_none()).await;
    let ready = eventually("the workers' Metal3Data ready", WAIT, || async {
        let data = fixture
            .env
            .api::<Metal3Data>()
            .get(&ready.name_any())
            .await
            .ok()?;
        data.status
            .as_ref()
            .is_some_and(|s| s.ready)
            .then_some(data)
    })
    .await;
    let network = fixture.secret_text("m0-networkdata", "networkData").await;
    let address = fixture
        .capi_address(&format!("{}-capipool", ready.name_any()))
        .await;
    assert!(
        network.contains(&format!("ip_address: {address}")),
        "{network}"
    );
    // The mistyped reference is still unanswered, and still said.
    let still = data_with_error(
        &fixture,
        "typo",
        "still unanswered",
        unanswered("vips", "InClusterIPPol"),
    )
    .await;
    assert_eq!(still.name_any(), mistyped.name_any());
}
