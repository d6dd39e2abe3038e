//! Hosts rendered: a fleet of Machines on BareMetalHosts, each with a Metal3DataTemplate that
//! takes an address from a Metal3 IPPool and one from an InClusterIPPool, timed from the
//! Machines' creation until every Metal3Data is ready with both its secrets. CAPM3's manager
//! runs in each setup (it associates hosts and claims their data); who serves the pools and
//! who renders differs:
//! - upstream: CAPM3 renders, Metal3's ip-address-manager serves the Metal3 pool and the
//!   in-cluster provider the CAPI pool;
//! - CAPM3 with bitpool: CAPM3 renders, bitpool serves both pools;
//! - bitpool: bitpool renders (the template is handed over to it) and serves both pools.
//!
//! The kubelet and the baremetal-operator are not needed: the hosts are created as the
//! operator leaves them after inspection, and nothing here waits for provisioning.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::provider::{Kind, Provider, Running, Serving};
use crate::workload::{Load, list_all};

const CLUSTER: &str = "fleet";
const TEMPLATE: &str = "fleet-workers";
const METAL3_POOL: &str = "provisioning";
const CAPI_POOL: &str = "baremetal";
const CAPI: &str = "cluster.x-k8s.io/v1beta2";
const CAPM3: &str = "infrastructure.cluster.x-k8s.io/v1beta1";
const BMO: &str = "metal3.io/v1alpha1";

/// Who serves the pools and who renders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setup {
    Upstream,
    Capm3WithBitpool,
    Bitpool,
}

impl Setup {
    /// Every setup, in the order they run.
    pub const ALL: [Self; 3] = [Self::Upstream, Self::Capm3WithBitpool, Self::Bitpool];

    fn describe(self) -> &'static str {
        match self {
            Self::Upstream => "CAPM3 renders; metal3-ipam and in-cluster serve",
            Self::Capm3WithBitpool => "CAPM3 renders; bitpool serves",
            Self::Bitpool => "bitpool renders and serves",
        }
    }

    fn slug(self) -> &'static str {
        match self {
            Self::Upstream => "upstream",
            Self::Capm3WithBitpool => "capm3-bitpool",
            Self::Bitpool => "bitpool",
        }
    }
}

/// The client rate limits the upstream managers run with: their defaults (CAPM3 and Metal3's
/// ip-address-manager 20 requests/s), or bitpool's (`--kube-api-qps=500 --kube-api-burst=1000`;
/// the in-cluster provider has no such flag and keeps its defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limits {
    Defaults,
    Bitpools,
}

impl Limits {
    fn describe(self) -> &'static str {
        match self {
            Self::Defaults => "defaults",
            Self::Bitpools => "bitpool's",
        }
    }

    /// `provider` with these limits.
    fn apply(self, provider: &Provider) -> Provider {
        match self {
            Self::Defaults => provider.clone(),
            Self::Bitpools => provider.at_bitpool_limits(),
        }
    }
}

/// The managers a setup may run.
pub struct Managers {
    pub bitpool: Provider,
    pub capm3: Provider,
    pub metal3_ipam: Provider,
    pub in_cluster: Provider,
}

impl Managers {
    /// Who serves the pools and renders (besides CAPM3, which runs in every setup).
    fn serving(&self, setup: Setup, limits: Limits) -> Vec<Provider> {
        let providers = match setup {
            Setup::Upstream => vec![&self.metal3_ipam, &self.in_cluster],
            Setup::Capm3WithBitpool | Setup::Bitpool => vec![&self.bitpool],
        };
        providers.into_iter().map(|p| limits.apply(p)).collect()
    }
}

/// What one setup measured.
pub struct HostsRow {
    setup: Setup,
    limits: Limits,
    hosts: usize,
    rendered: Duration,
    /// CPU seconds of who serves the pools (and renders, for bitpool), from the Machines'
    /// creation until every host is rendered; their peak memory summed.
    serving_cpu: f64,
    serving_peak_rss_mib: f64,
    capm3_cpu: f64,
    duplicates: usize,
    /// Hosts whose networkData lacks an address of either pool's network.
    misses: usize,
}

impl HostsRow {
    /// Whether the setup handed an address out twice or left a host without one.
    pub fn failed(&self) -> bool {
        self.duplicates > 0 || self.misses > 0
    }
}

/// The rows as a Markdown table.
pub fn table(rows: &[HostsRow]) -> String {
    let mut out = String::from(
        "| setup | upstream client limits | hosts | every host rendered (s) | hosts/s | IPAM (+ rendering) CPU s | its peak RSS MiB | CAPM3 CPU s | duplicates | misses |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.0} | {:.1} | {} | {} |\n",
            r.setup.describe(),
            r.limits.describe(),
            r.hosts,
            r.rendered.as_secs_f64(),
            r.hosts as f64 / r.rendered.as_secs_f64().max(1e-9),
            r.serving_cpu,
            r.serving_peak_rss_mib,
            r.capm3_cpu,
            r.duplicates,
            r.misses,
        ));
    }
    out
}

/// Runs the hosts scenario: each setup renders Metal3Data for the same hosts.
pub struct HostsRunner<'a> {
    pub load: &'a Load,
    pub managers: Managers,
    pub kubeconfig: PathBuf,
    pub logs: PathBuf,
    pub upstream_crds: PathBuf,
    pub limit: Duration,
}

impl HostsRunner<'_> {
    /// Every setup with `hosts` hosts, the upstream managers at their default client limits,
    /// then at bitpool's; one after the other, each in a namespace of its own.
    pub async fn measure(&self, hosts: usize) -> Result<Vec<HostsRow>, String> {
        let serving = Serving::new(&self.logs.join("capm3-certs"))?;
        self.install_crds(&serving).await?;
        let mut rows = Vec::new();
        for (limits, setup) in [Limits::Defaults, Limits::Bitpools]
            .into_iter()
            .flat_map(|l| Setup::ALL.map(|s| (l, s)))
        {
            eprintln!(
                "load: {hosts} hosts rendered, {} (upstream client limits: {})",
                setup.describe(),
                limits.describe()
            );
            let row = self.run(setup, limits, hosts, &serving).await?;
            eprintln!(
                "load: {:.1} s, IPAM CPU {:.1} s, CAPM3 CPU {:.1} s, {} duplicates, {} misses",
                row.rendered.as_secs_f64(),
                row.serving_cpu,
                row.capm3_cpu,
                row.duplicates,
                row.misses
            );
            rows.push(row);
        }
        Ok(rows)
    }

    /// Cluster API's, CAPM3's (converted by the CAPM3 process on `serving`'s port), the
    /// baremetal-operator's and the in-cluster provider's CRDs as their modules ship them, and
    /// bitpool's Metal3 IPAM CRDs.
    async fn install_crds(&self, serving: &Serving) -> Result<(), String> {
        let mut crds = Vec::new();
        for folder in [
            "cluster-api",
            "cluster-api-provider-metal3",
            "baremetal-operator",
            "in-cluster",
        ] {
            let dir = self.upstream_crds.join(folder);
            let entries = std::fs::read_dir(&dir)
                .map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
            let mut files: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
            files.sort();
            for file in files {
                let mut read = read_crds(&file)?;
                if folder == "cluster-api-provider-metal3" {
                    for crd in &mut read {
                        let url = format!("https://127.0.0.1:{}/convert", serving.port);
                        let conversion = bitpool::crds::conversion_at(url, &serving.certs.ca_pem);
                        crd.spec.conversion = Some(conversion);
                    }
                }
                crds.extend(read);
            }
        }
        let names: Vec<String> = crds
            .iter()
            .filter_map(|c| c.metadata.name.clone())
            .collect();
        crds.extend(
            bitpool::crds::served().into_iter().filter(|crd| {
                !names.contains(crd.metadata.name.as_ref().unwrap_or(&String::new()))
            }),
        );
        bitpool::crds::apply(&self.load.client, &crds, Duration::from_secs(120))
            .await
            .map_err(|e| format!("cannot install the CRDs: {e}"))
    }

    async fn run(
        &self,
        setup: Setup,
        limits: Limits,
        hosts: usize,
        serving: &Serving,
    ) -> Result<HostsRow, String> {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let tuned = match limits {
            Limits::Defaults => "",
            Limits::Bitpools => "-tuned",
        };
        let namespace = format!("load-hosts-{}{tuned}-{stamp}", setup.slug());
        self.load.ensure_namespace(&namespace).await?;
        let log = |name: &str| self.logs.join(format!("{namespace}-{name}.log"));
        let mut capm3 =
            limits
                .apply(&self.managers.capm3)
                .start(&self.kubeconfig, &log("capm3"), serving)?;
        serving.listening(&mut capm3, self.limit).await?;
        let mut others = Vec::new();
        for provider in self.managers.serving(setup, limits) {
            let own = Serving::new(
                &self
                    .logs
                    .join(format!("{namespace}-{}-certs", provider.slug())),
            )?;
            others.push(provider.start(&self.kubeconfig, &log(&provider.slug()), &own)?);
        }
        let fleet = Fleet {
            load: self.load,
            namespace: &namespace,
        };
        fleet.create(setup, hosts).await?;
        fleet.pools_taken_up(&mut others, self.limit).await?;
        let cpu = |running: &[Running]| -> Result<f64, String> {
            running.iter().map(|r| Ok(r.usage()?.cpu_seconds)).sum()
        };
        let (serving_before, capm3_before) = (cpu(&others)?, capm3.usage()?.cpu_seconds);
        let started = Instant::now();
        fleet.machines(hosts).await?;
        fleet
            .rendered(hosts, &mut capm3, &mut others, self.limit)
            .await?;
        let rendered = started.elapsed();
        let serving_cpu = cpu(&others)? - serving_before;
        let capm3_cpu = capm3.usage()?.cpu_seconds - capm3_before;
        let serving_peak_rss_mib = others
            .iter()
            .map(|r| Ok(r.usage()?.peak_rss_mib))
            .sum::<Result<f64, String>>()?;
        let duplicates = fleet.duplicates().await?;
        let misses = fleet.misses(hosts).await?;
        // CAPM3 still serves its kinds' conversions while the namespace goes.
        fleet.tear_down(self.limit).await?;
        capm3.stop();
        for other in &mut others {
            other.stop();
        }
        Ok(HostsRow {
            setup,
            limits,
            hosts,
            rendered,
            serving_cpu,
            serving_peak_rss_mib,
            capm3_cpu,
            duplicates,
            misses,
        })
    }
}

/// The CRDs of one multi-document YAML file.
pub fn read_crds(file: &Path) -> Result<Vec<CustomResourceDefinition>, String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    serde_saphyr::from_multiple(&text).map_err(|e| format!("cannot parse {}: {e}", file.display()))
}

/// The objects of one setup's namespace.
struct Fleet<'a> {
    load: &'a Load,
    namespace: &'a str,
}

/// `apiVersion` and `kind` as the dynamic API wants them.
fn resource(api_version: &str, kind: &str) -> ApiResource {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

impl Fleet<'_> {
    fn api(&self, api_version: &str, kind: &str) -> kube::Api<DynamicObject> {
        self.load.api(self.namespace, &resource(api_version, kind))
    }

    async fn create(&self, setup: Setup, hosts: usize) -> Result<(), String> {
        let template = template(setup == Setup::Bitpool);
        for object in [pools(hosts), fixtures(), vec![template]].concat() {
            self.make(object).await?;
        }
        self.load.each((0..hosts).collect(), |i| self.host(i)).await
    }

    async fn make(&self, object: Value) -> Result<DynamicObject, String> {
        let api_version = object["apiVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let kind = object["kind"].as_str().unwrap_or_default().to_string();
        let status = object.get("status").cloned();
        let object: DynamicObject = serde_json::from_value(object)
            .map_err(|e| format!("a {kind} the load command made is not an object: {e}"))?;
        let name = object.metadata.name.clone().unwrap_or_default();
        let api = self.api(&api_version, &kind);
        let made = api
            .create(&PostParams::default(), &object)
            .await
            .map_err(|e| format!("cannot create {kind} {}/{name}: {e}", self.namespace))?;
        if let Some(status) = status {
            api.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .map_err(|e| format!("cannot write the status of {kind} {name}: {e}"))?;
        }
        Ok(made)
    }

    async fn host(&self, i: usize) -> Result<(), kube::Error> {
        let api = self.api(BMO, "BareMetalHost");
        let (host, status) = host(i);
        let name = format!("host-{i:04}");
        match api.create(&PostParams::default(), &from_json(host)?).await {
            Err(kube::Error::Api(e)) if e.is_already_exists() => {}
            other => drop(other?),
        }
        let status = Patch::Merge(json!({ "status": status }));
        api.patch_status(&name, &PatchParams::default(), &status)
            .await
            .map(drop)
    }

    /// A Machine and its Metal3Machine per host, as a MachineSet makes them.
    async fn machines(&self, hosts: usize) -> Result<(), String> {
        self.load
            .each((0..hosts).collect(), |i| async move {
                let name = format!("worker-{i:04}");
                let machine = match self
                    .api(CAPI, "Machine")
                    .create(&PostParams::default(), &from_json(machine(&name))?)
                    .await
                {
                    Err(kube::Error::Api(e)) if e.is_already_exists() => {
                        self.api(CAPI, "Machine").get(&name).await?
                    }
                    other => other?,
                };
                let uid = machine.metadata.uid.unwrap_or_default();
                let m3m = from_json(metal3_machine(&name, &uid))?;
                match self
                    .api(CAPM3, "Metal3Machine")
                    .create(&PostParams::default(), &m3m)
                    .await
                {
                    Err(kube::Error::Api(e)) if e.is_already_exists() => Ok(()),
                    other => other.map(drop),
                }
            })
            .await
    }

    /// Whether each pool has been taken up (its finalizer, or its status counts).
    async fn pools_taken_up(&self, running: &mut [Running], limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            let metal3 = self
                .api("ipam.metal3.io/v1alpha1", "IPPool")
                .get(METAL3_POOL)
                .await;
            let capi = self
                .api("ipam.cluster.x-k8s.io/v1alpha2", "InClusterIPPool")
                .get(CAPI_POOL)
                .await;
            let taken = metal3.is_ok_and(|p| p.metadata.finalizers.is_some_and(|f| !f.is_empty()))
                && capi.is_ok_and(|p| p.data.pointer("/status/ipAddresses").is_some());
            if taken {
                return Ok(());
            }
            alive(running)?;
            if Instant::now() > deadline {
                return Err(format!("the pools were not taken up within {limit:?}"));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Waits until every Metal3Data is ready and both its secrets exist.
    async fn rendered(
        &self,
        hosts: usize,
        capm3: &mut Running,
        others: &mut [Running],
        limit: Duration,
    ) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        let secrets = self.load.api(self.namespace, &resource("v1", "Secret"));
        loop {
            let datas = list_all(&self.api(CAPM3, "Metal3Data")).await?;
            let ready = datas
                .iter()
                .filter(|d| d.data.pointer("/status/ready") == Some(&Value::Bool(true)))
                .count();
            let names: Vec<String> = list_all(&secrets)
                .await?
                .into_iter()
                .filter_map(|s| s.metadata.name)
                .collect();
            let with_secrets = datas
                .iter()
                .filter(|d| {
                    ["/spec/metaData/name", "/spec/networkData/name"]
                        .iter()
                        .all(|field| {
                            d.data
                                .pointer(field)
                                .and_then(Value::as_str)
                                .is_some_and(|n| names.iter().any(|s| s == n))
                        })
                })
                .count();
            if ready == hosts && with_secrets == hosts {
                return Ok(());
            }
            alive(std::slice::from_mut(capm3))?;
            alive(others)?;
            if Instant::now() > deadline {
                return Err(format!(
                    "not every host rendered within {limit:?}: {} Metal3Data, {ready} ready, {with_secrets} with both secrets, of {hosts}",
                    datas.len()
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Hosts (of `hosts`) whose networkData does not give the provisioning network an address
    /// of the Metal3 pool and the baremetal network one of the CAPI pool.
    async fn misses(&self, hosts: usize) -> Result<usize, String> {
        let networks = pool_networks(hosts);
        let secrets: kube::Api<Secret> =
            kube::Api::namespaced(self.load.client.clone(), self.namespace);
        let secrets = secrets
            .list(&Default::default())
            .await
            .map_err(|e| format!("cannot list the secrets of {}: {e}", self.namespace))?;
        let rendered = secrets
            .items
            .iter()
            .filter_map(|s| s.data.as_ref()?.get("networkData"))
            .filter(|data| {
                let text = String::from_utf8_lossy(&data.0);
                let Ok(network) = serde_saphyr::from_str::<Value>(&text) else {
                    return false;
                };
                networks.iter().all(|(id, subnet)| {
                    network["networks"].as_array().is_some_and(|all| {
                        all.iter().any(|n| {
                            n["id"].as_str() == Some(id)
                                && n["ip_address"]
                                    .as_str()
                                    .and_then(|ip| ip.parse::<IpAddr>().ok())
                                    .is_some_and(|ip| subnet.contains(&ip))
                        })
                    })
                })
            })
            .count();
        Ok(hosts.saturating_sub(rendered))
    }

    /// Address objects (of both kinds) whose address another one in the namespace also has.
    async fn duplicates(&self) -> Result<usize, String> {
        let mut holders: BTreeMap<IpAddr, usize> = BTreeMap::new();
        for api_version in ["ipam.metal3.io/v1alpha1", "ipam.cluster.x-k8s.io/v1beta2"] {
            for address in list_all(&self.api(api_version, "IPAddress")).await? {
                let ip = address
                    .data
                    .pointer("/spec/address")
                    .and_then(Value::as_str);
                if let Some(ip) = ip.and_then(|ip| ip.parse().ok()) {
                    *holders.entry(ip).or_default() += 1;
                }
            }
        }
        Ok(holders.values().map(|n| n - 1).sum())
    }

    /// The namespace deleted, and the finalizers of its objects dropped until it is gone: no
    /// baremetal-operator runs to deprovision the hosts, and a manager adds no finalizer to an
    /// object being deleted.
    async fn tear_down(&self, limit: Duration) -> Result<(), String> {
        let kinds = [
            (CAPI, "Cluster"),
            (CAPI, "Machine"),
            (CAPM3, "Metal3Cluster"),
            (CAPM3, "Metal3Machine"),
            (CAPM3, "Metal3DataTemplate"),
            (CAPM3, "Metal3DataClaim"),
            (CAPM3, "Metal3Data"),
            (BMO, "BareMetalHost"),
            ("ipam.metal3.io/v1alpha1", "IPPool"),
            ("ipam.metal3.io/v1alpha1", "IPClaim"),
            ("ipam.metal3.io/v1alpha1", "IPAddress"),
            ("ipam.cluster.x-k8s.io/v1alpha2", "InClusterIPPool"),
            ("ipam.cluster.x-k8s.io/v1beta2", "IPAddressClaim"),
            ("ipam.cluster.x-k8s.io/v1beta2", "IPAddress"),
        ];
        let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
            kube::Api::all(self.load.client.clone());
        let _ = namespaces.delete(self.namespace, &Default::default()).await;
        let deadline = Instant::now() + limit;
        while namespaces
            .get_opt(self.namespace)
            .await
            .map_err(|e| format!("cannot read namespace {}: {e}", self.namespace))?
            .is_some()
        {
            if Instant::now() > deadline {
                return Err(format!(
                    "namespace {} not gone within {limit:?}",
                    self.namespace
                ));
            }
            for (api_version, kind) in kinds {
                self.drop_finalizers(api_version, kind).await?;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Ok(())
    }

    async fn drop_finalizers(&self, api_version: &str, kind: &str) -> Result<(), String> {
        let none = Patch::Merge(json!({"metadata": {"finalizers": null}}));
        let api = self.api(api_version, kind);
        let held: Vec<String> = list_all(&api)
            .await?
            .into_iter()
            .filter(|o| {
                o.metadata
                    .finalizers
                    .as_ref()
                    .is_some_and(|f| !f.is_empty())
            })
            .filter_map(|o| o.metadata.name)
            .collect();
        self.load
            .each(held, |name| {
                let (api, none) = (api.clone(), &none);
                async move {
                    match api.patch(&name, &PatchParams::default(), none).await {
                        Err(kube::Error::Api(e)) if e.is_not_found() => Ok(()),
                        other => other.map(drop),
                    }
                }
            })
            .await
    }
}

fn alive(running: &mut [Running]) -> Result<(), String> {
    match running.iter_mut().find_map(Running::exited) {
        Some(exit) => Err(exit),
        None => Ok(()),
    }
}

fn from_json(object: Value) -> Result<DynamicObject, kube::Error> {
    serde_json::from_value(object).map_err(kube::Error::SerdeError)
}

/// The prefix length of both pools: room for every host, twice over.
fn pool_prefix(hosts: usize) -> u8 {
    let room = u32::try_from(hosts.max(128)).unwrap_or(u32::MAX / 2);
    u8::try_from(32 - (room * 2).next_power_of_two().trailing_zeros()).unwrap_or(8)
}

/// Each network of the template and the subnet its addresses must come from.
fn pool_networks(hosts: usize) -> [(&'static str, ipnet::IpNet); 2] {
    let prefix = pool_prefix(hosts);
    let net = |base: [u8; 4]| {
        ipnet::IpNet::V4(
            ipnet::Ipv4Net::new(base.into(), prefix)
                .unwrap_or_else(|_| unreachable!("a prefix of at most 32")),
        )
    };
    [
        ("provisioning", net([172, 22, 0, 0])),
        ("baremetal", net([10, 40, 0, 0])),
    ]
}

/// A Metal3 pool (as CAPM3's documentation writes one) and a CAPI pool, each with room for
/// every host.
fn pools(hosts: usize) -> Vec<Value> {
    let prefix = pool_prefix(hosts);
    vec![
        json!({
            "apiVersion": "ipam.metal3.io/v1alpha1", "kind": "IPPool",
            "metadata": {"name": METAL3_POOL},
            "spec": {
                "clusterName": CLUSTER, "namePrefix": "fleet-prov",
                "pools": [{"subnet": format!("172.22.0.0/{prefix}")}],
                "prefix": prefix, "gateway": "172.22.0.1", "dnsServers": ["172.22.0.1"],
            },
        }),
        json!({
            "apiVersion": "ipam.cluster.x-k8s.io/v1alpha2", "kind": "InClusterIPPool",
            "metadata": {"name": CAPI_POOL},
            "spec": {"addresses": [format!("10.40.0.0/{prefix}")], "prefix": prefix, "gateway": "10.40.0.1"},
        }),
    ]
}

/// The bootstrap data, the Cluster with its infrastructure provisioned (Cluster API core's
/// part), and its Metal3Cluster.
fn fixtures() -> Vec<Value> {
    let infrastructure = json!({"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3Cluster", "name": CLUSTER});
    vec![
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "worker-bootstrap"},
            "stringData": {"value": "#cloud-config\n", "format": "cloud-config"},
        }),
        json!({
            "apiVersion": CAPI, "kind": "Cluster",
            "metadata": {"name": CLUSTER},
            "spec": {"infrastructureRef": infrastructure},
            "status": {
                "initialization": {"infrastructureProvisioned": true},
                "deprecated": {"v1beta1": {"conditions": [{
                    "type": "InfrastructureReady", "status": "True",
                    "lastTransitionTime": "2026-12-01T00:00:00Z",
                }]}},
            },
        }),
        json!({
            "apiVersion": CAPM3, "kind": "Metal3Cluster",
            "metadata": {"name": CLUSTER, "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER}},
            "spec": {"controlPlaneEndpoint": {"host": "172.22.0.2", "port": 6443}, "noCloudProvider": true},
        }),
    ]
}

/// Two NICs: the provisioning network from the Metal3 pool (address, gateway, DNS), the
/// baremetal network from the CAPI pool; metaData with the machine's name, an index and the
/// provisioning address. Handed over to bitpool (`paused: bitpool`) when it renders.
fn template(bitpool_renders: bool) -> Value {
    let capi_pool =
        json!({"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": CAPI_POOL});
    let annotations = match bitpool_renders {
        true => json!({"cluster.x-k8s.io/paused": "bitpool"}),
        false => json!({}),
    };
    json!({
        "apiVersion": CAPM3, "kind": "Metal3DataTemplate",
        "metadata": {
            "name": TEMPLATE, "annotations": annotations,
            "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER},
        },
        "spec": {
            "clusterName": CLUSTER,
            "metaData": {
                "ipAddressesFromIPPool": [{"key": "provisioningIP", "name": METAL3_POOL, "apiGroup": "ipam.metal3.io", "kind": "IPPool"}],
                "objectNames": [{"key": "name", "object": "machine"}],
                "indexes": [{"key": "index", "offset": 0, "step": 1}],
            },
            "networkData": {
                "links": {"ethernets": [
                    {"type": "phy", "id": "eno1", "mtu": 1500, "macAddress": {"fromHostInterface": "eno1"}},
                    {"type": "phy", "id": "eno2", "mtu": 1500, "macAddress": {"fromHostInterface": "eno2"}},
                ]},
                "networks": {"ipv4": [
                    {"id": "provisioning", "link": "eno1", "ipAddressFromIPPool": METAL3_POOL,
                     "routes": [{"network": "0.0.0.0", "prefix": 0, "gateway": {"fromIPPool": METAL3_POOL}}]},
                    {"id": "baremetal", "link": "eno2", "fromPoolRef": capi_pool},
                ]},
                "services": {"dnsFromIPPool": METAL3_POOL},
            },
        },
    })
}

/// Host `i` and its status as the baremetal-operator leaves it after inspection.
fn host(i: usize) -> (Value, Value) {
    let mac = |nic: usize| format!("02:42:{:02x}:{:02x}:00:{nic:02x}", i / 256, i % 256);
    let name = format!("host-{i:04}");
    let host = json!({
        "apiVersion": BMO, "kind": "BareMetalHost",
        "metadata": {"name": name},
        "spec": {"online": true, "bootMACAddress": mac(1)},
    });
    let status = json!({
        "errorCount": 0, "errorMessage": "", "operationalStatus": "OK", "poweredOn": false,
        "provisioning": {"ID": format!("ironic-{name}"), "state": "available"},
        "hardware": {"nics": [{"name": "eno1", "mac": mac(1)}, {"name": "eno2", "mac": mac(2)}]},
    });
    (host, status)
}

fn machine(name: &str) -> Value {
    json!({
        "apiVersion": CAPI, "kind": "Machine",
        "metadata": {"name": name, "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER}},
        "spec": {
            "clusterName": CLUSTER,
            "bootstrap": {"dataSecretName": "worker-bootstrap"},
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3Machine", "name": name},
        },
    })
}

fn metal3_machine(name: &str, machine_uid: &str) -> Value {
    json!({
        "apiVersion": CAPM3, "kind": "Metal3Machine",
        "metadata": {
            "name": name,
            "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER},
            "ownerReferences": [{
                "apiVersion": CAPI, "kind": "Machine", "name": name, "uid": machine_uid,
                "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "image": {"url": "http://172.22.0.1/images/node.qcow2", "checksum": "http://172.22.0.1/images/node.qcow2.sha256sum", "checksumType": "sha256", "format": "qcow2"},
            "dataTemplate": {"name": TEMPLATE},
        },
    })
}

/// The peers' and CAPM3's kinds, for `main` to build [`Managers`].
pub fn managers(bitpool: &Path, capm3: &Path, metal3_ipam: &Path, in_cluster: &Path) -> Managers {
    Managers {
        bitpool: Provider::new(Kind::Bitpool, bitpool.to_path_buf()),
        capm3: Provider::new(Kind::Capm3, capm3.to_path_buf()),
        metal3_ipam: Provider::new(Kind::Metal3Ipam, metal3_ipam.to_path_buf()),
        in_cluster: Provider::new(Kind::InCluster, in_cluster.to_path_buf()),
    }
}
