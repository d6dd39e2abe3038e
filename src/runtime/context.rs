//! What every reconcile shares: the client, the settings, the watch caches, and a little
//! process-wide state (retry counts, shutdown).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::runtime::reflector::{ObjectRef, Store};

use super::cached::{AddressObject, ClaimObject};
use super::error::{self, Error};
use super::index::Index;
use crate::api::capi::Cluster;
use crate::api::capi_pools::{
    GlobalInClusterIPPool, GlobalInClusterPrefixPool, InClusterIPPool, InClusterIPPoolSpec,
    InClusterIPPoolStatus, InClusterPrefixPool,
};
use crate::api::metal3_data::{Metal3Data, Metal3DataClaim, Metal3DataTemplate};
use crate::api::metal3_ipam::IPPool;

/// Which controllers a process runs (`--controllers`): a CAPI IPAM provider alone, the Metal3
/// IPAM beside it, the migration proxy, and the Metal3Data reconciler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Groups {
    /// InClusterIPPool, GlobalInClusterIPPool and the two prefix pools, and claims naming a
    /// missing pool of theirs.
    pub capi_ipam: bool,
    /// Metal3 IPPools serving IPClaims and IPAddressClaims from their own ranges.
    pub metal3_ipam: bool,
    /// Metal3 IPPools whose `spec.poolRef` names a CAPI pool: their IPClaims are served from it.
    pub migration_proxy: bool,
    /// Metal3DataTemplate, Metal3DataClaim and Metal3Data.
    pub metal3_data: bool,
}

impl Groups {
    /// Every controller group on.
    pub const ALL: Groups = Groups {
        capi_ipam: true,
        metal3_ipam: true,
        migration_proxy: true,
        metal3_data: true,
    };

    /// Whether the Metal3 IPAM kinds are read (Metal3Data claims addresses from IPPools).
    pub fn metal3_kinds(self) -> bool {
        self.metal3_ipam || self.migration_proxy || self.metal3_data
    }

    /// Whether Metal3 IPPools are reconciled at all (by the pool engine or the proxy).
    pub fn metal3_pools(self) -> bool {
        self.metal3_ipam || self.migration_proxy
    }

    /// The `--controllers` names of the groups that are on.
    pub fn names(self) -> Vec<&'static str> {
        [
            (self.capi_ipam, "capi-ipam"),
            (self.metal3_ipam, "metal3-ipam"),
            (self.migration_proxy, "migration-proxy"),
            (self.metal3_data, "metal3-data"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }
}

/// Settings of a running bitpool, from the command line.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Watch claims, addresses and namespaced pools of this namespace only.
    pub namespace: Option<String>,
    /// Reconcile only pools and claims labelled `cluster.x-k8s.io/watch-filter=<value>`.
    pub watch_filter: Option<String>,
    /// Where the pools' ledgers live.
    pub ledger_namespace: String,
    /// Name the Metal3Data's IP claims `<BareMetalHost>-<pool>`, so that a pool's preAllocations
    /// give each host the same address across re-provisioning.
    pub bmh_name_based_preallocation: bool,
    /// The version Metal3Machines are read at (the newest the API server serves).
    pub metal3_machine_version: &'static str,
    /// The controllers this process runs.
    pub groups: Groups,
    /// Reconciles running at once, per controller (0: no limit).
    pub concurrency: u16,
    /// How often every pool is checked again when nothing happens.
    pub sync_period: Duration,
}

impl Settings {
    /// The settings of a cluster-wide process with every group on, for unit tests.
    #[cfg(test)]
    pub fn for_tests() -> Self {
        Self {
            namespace: None,
            watch_filter: None,
            ledger_namespace: "bitpool-system".into(),
            bmh_name_based_preallocation: false,
            metal3_machine_version: "v1beta1",
            groups: Groups {
                capi_ipam: true,
                metal3_ipam: true,
                migration_proxy: true,
                metal3_data: true,
            },
            concurrency: 0,
            sync_period: Duration::from_secs(600),
        }
    }
}

/// Which watch caches a controller's reconciles wait for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    Everything,
    /// Every cache but the claims' and the address objects': the pool engine serves new claims
    /// of some pool kinds from their ledgers while those are still being listed (see
    /// `ipam::engine`), which at 100,000 objects takes the server tens of seconds.
    AllButClaimsAndAddresses,
}

/// What every reconcile reads: the client, the settings and the shared caches.
pub struct Context {
    pub client: Client,
    pub settings: Settings,
    pub claims: Index<ClaimObject>,
    pub addresses: Index<AddressObject>,
    /// `None` when Cluster API core is not installed (nothing can pause a claim then).
    pub clusters: Option<Store<Cluster>>,
    pub pools: Store<InClusterIPPool>,
    pub global_pools: Store<GlobalInClusterIPPool>,
    pub prefix_pools: Store<InClusterPrefixPool>,
    pub global_prefix_pools: Store<GlobalInClusterPrefixPool>,
    pub ippools: Store<IPPool>,
    pub ipclaims: Index<ClaimObject>,
    pub metal3_addresses: Index<AddressObject>,
    pub data_templates: Store<Metal3DataTemplate>,
    pub datas: Store<Metal3Data>,
    pub data_claims: Store<Metal3DataClaim>,
    /// The namespaces' labels, for the global pools' `namespaceSelector`.
    pub namespaces: Store<Namespace>,
    /// Metrics, Events and leadership.
    pub ops: std::sync::Arc<crate::ops::Ops>,
    pub state: ProcessState,
}

/// What a process remembers between reconciles, whatever it reconciles.
#[derive(Default)]
pub struct ProcessState {
    /// Consecutive failed reconciles per object (`<Kind> <namespace>/<name>`).
    failures: Mutex<HashMap<String, u32>>,
    shutdown: AtomicBool,
}

impl AsRef<Context> for Context {
    fn as_ref(&self) -> &Context {
        self
    }
}

/// An address pool of a kind bitpool serves under Cluster API's group (`InClusterIPPool`,
/// `GlobalInClusterIPPool`), as the cache holds it, whoever serves it.
pub struct CachedAddressPool {
    pub spec: InClusterIPPoolSpec,
    pub status: Option<InClusterIPPoolStatus>,
}

impl CachedAddressPool {
    /// Whether `api_group`/`kind` is one of the kinds above.
    pub fn is_kind(api_group: &str, kind: &str) -> bool {
        api_group == crate::api::capi::GROUP
            && matches!(kind, "InClusterIPPool" | "GlobalInClusterIPPool")
    }

    /// The DNS servers the pool gives `address` (the CAPI contract carries none): its subnet's,
    /// else the pool's own.
    pub fn dns_servers_for(&self, address: &str) -> Vec<String> {
        self.spec.dns_servers_for(address).to_vec()
    }
}

impl Context {
    /// The address pool `api_group`/`kind` `name` (a namespaced one in `namespace`), when it is
    /// of a kind in [`CachedAddressPool`] and cached.
    pub fn address_pool(
        &self,
        api_group: &str,
        kind: &str,
        name: &str,
        namespace: &str,
    ) -> Option<CachedAddressPool> {
        use crate::api::capi::GROUP;
        match (api_group == GROUP, kind) {
            (true, "InClusterIPPool") => self
                .pools
                .get(&ObjectRef::new(name).within(namespace))
                .map(|p| CachedAddressPool {
                    spec: p.spec.clone(),
                    status: p.status.clone(),
                }),
            (true, "GlobalInClusterIPPool") => {
                self.global_pools
                    .get(&ObjectRef::new(name))
                    .map(|p| CachedAddressPool {
                        spec: p.spec.pool.clone(),
                        status: p.status.clone(),
                    })
            }
            _ => None,
        }
    }

    /// Whether the Cluster `name` of `namespace` is known and paused.
    pub fn cluster_paused(&self, namespace: &str, name: &str) -> bool {
        self.clusters.as_ref().is_some_and(|clusters| {
            clusters
                .get(&ObjectRef::new(name).within(namespace))
                .is_some_and(|c| super::objects::cluster_is_paused(&c))
        })
    }

    /// Waits until every watch cache holds its initial list: a reconcile that ran before would
    /// take a claim whose address object is not cached yet for one without an address.
    pub async fn wait_for_caches(&self) {
        self.wait_for(Needs::Everything).await
    }

    /// Waits until the watch caches `needs` names hold their initial lists.
    pub async fn wait_for(&self, needs: Needs) {
        async fn ready<K: kube::Resource<DynamicType = ()> + Clone + 'static>(store: &Store<K>) {
            let started = std::time::Instant::now();
            let mut warn_after = Duration::from_secs(10);
            loop {
                // Polled: a store's readiness wakes only one of the tasks waiting for it (the
                // controllers' runners wait too), so a lone wait could sleep until its timeout.
                match tokio::time::timeout(Duration::from_millis(50), store.wait_until_ready())
                    .await
                {
                    // A dropped writer means the process is stopping.
                    Ok(_) => return,
                    Err(_) if started.elapsed() >= warn_after => {
                        tracing::warn!(kind = %K::kind(&()), waited = ?warn_after, "the watch cache has not received its initial list yet");
                        warn_after += Duration::from_secs(10);
                    }
                    Err(_) => {}
                }
            }
        }
        if needs == Needs::Everything {
            self.claims.wait_until_ready().await;
            self.addresses.wait_until_ready().await;
        }
        ready(&self.pools).await;
        ready(&self.global_pools).await;
        ready(&self.prefix_pools).await;
        ready(&self.global_prefix_pools).await;
        ready(&self.namespaces).await;
        let groups = self.settings.groups;
        if groups.metal3_kinds() {
            ready(&self.ippools).await;
            if needs == Needs::Everything {
                self.ipclaims.wait_until_ready().await;
                self.metal3_addresses.wait_until_ready().await;
            }
        }
        if groups.metal3_data {
            ready(&self.data_templates).await;
            ready(&self.datas).await;
            ready(&self.data_claims).await;
        }
        if let Some(clusters) = &self.clusters {
            ready(clusters).await;
        }
    }

    /// The namespace `name`, if the cache holds it.
    pub fn namespace(&self, name: &str) -> Option<std::sync::Arc<Namespace>> {
        self.namespaces.get(&ObjectRef::new(name))
    }

    /// Records a failed reconcile of `object` and says when to retry it: soon for transient
    /// errors, with exponential backoff for errors that wait for a person.
    pub fn failed(&self, object: &str, error: &Error) -> Option<Duration> {
        let failures = match self.state.failures.lock() {
            Ok(mut map) => {
                let count = map.entry(object.to_string()).or_insert(0);
                *count = count.saturating_add(1);
                *count
            }
            Err(_) => 1,
        };
        error::backoff(error.retry(), failures)
    }

    /// Records a successful reconcile of `object`: its next failure backs off from the start.
    pub fn succeeded(&self, object: &str) {
        if let Ok(mut map) = self.state.failures.lock() {
            map.remove(object);
        }
    }

    /// Stop taking new work: reconciles in flight finish without starting new writes.
    pub fn begin_shutdown(&self) {
        self.state.shutdown.store(true, Ordering::SeqCst);
    }

    /// Whether [`Self::begin_shutdown`] was called.
    pub fn shutting_down(&self) -> bool {
        self.state.shutdown.load(Ordering::SeqCst)
    }
}
