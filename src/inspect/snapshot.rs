//! What the operator commands read: every pool, claim, address object and ledger in scope, as
//! plain data. Reading is the only I/O of `bitpool pools|who-has|explain|check`; everything they
//! conclude is a pure function of a [`Snapshot`].

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, ListParams, ObjectMeta};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::alloc::AddressSpace;
use crate::api::capi::{IPAddress, IPAddressClaim};
use crate::api::capi_pools::{
    GlobalInClusterIPPool, GlobalInClusterPrefixPool, InClusterIPPool, InClusterPrefixPool,
};
use crate::api::metal3_ipam::{IPClaim, IPPool, Metal3IPAddress};
use crate::ipam::dialect::PoolSpace;
use crate::ipam::key::PoolKey;
use crate::ipam::kinds::AnyAddress;
use crate::ipam::ledger::{LEDGER_LABEL, Ledger, POOL_ANNOTATION, POOL_UID_ANNOTATION};
use crate::runtime::objects;

/// A pool of any kind bitpool serves.
#[derive(Clone, Debug)]
pub enum AnyPool {
    InCluster(InClusterIPPool),
    GlobalInCluster(GlobalInClusterIPPool),
    Prefix(InClusterPrefixPool),
    GlobalPrefix(GlobalInClusterPrefixPool),
    Metal3(IPPool),
}

/// Runs `$body` with `$pool` bound to the typed pool inside an [`AnyPool`].
macro_rules! with_pool {
    ($any:expr, $pool:ident => $body:expr) => {
        match $any {
            AnyPool::InCluster($pool) => $body,
            AnyPool::GlobalInCluster($pool) => $body,
            AnyPool::Prefix($pool) => $body,
            AnyPool::GlobalPrefix($pool) => $body,
            AnyPool::Metal3($pool) => $body,
        }
    };
}

/// A pool's own counts as its status reports them (int64, saturated).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatusCounts {
    pub total: Option<i64>,
    pub used: Option<i64>,
    pub free: Option<i64>,
    pub out_of_range: Option<i64>,
}

impl AnyPool {
    /// The pool's kind, namespace and name.
    pub fn key(&self) -> PoolKey {
        with_pool!(self, pool => pool.key())
    }

    /// The pool's metadata.
    pub fn meta(&self) -> &ObjectMeta {
        with_pool!(self, pool => pool.meta())
    }

    /// The pool's metadata, to change.
    pub fn meta_mut(&mut self) -> &mut ObjectMeta {
        with_pool!(self, pool => pool.meta_mut())
    }

    /// The pool's address space, or why its spec is invalid.
    pub fn space(&self) -> Result<AddressSpace, String> {
        with_pool!(self, pool => pool.space())
    }

    /// What an address object holds, in the numbers of the pool's space.
    pub fn held(&self, address: &AnyAddress) -> Option<IpAddr> {
        with_pool!(self, pool => pool.held(address))
    }

    /// A number of the pool's space as people read it (a prefix pool's sub-prefix).
    pub fn show(&self, held: IpAddr) -> String {
        with_pool!(self, pool => pool.show(held))
    }

    /// What the pool's ledger is written for (its `pool-uid` annotation).
    pub fn ledger_identity(&self) -> String {
        with_pool!(self, pool => pool.ledger_identity())
    }

    /// The pause annotation (a Metal3 pool is also paused by its Cluster, not read here).
    pub fn paused(&self) -> bool {
        objects::is_paused(self.meta())
    }

    /// Whether the pool is being deleted.
    pub fn deleting(&self) -> bool {
        self.meta().deletion_timestamp.is_some()
    }

    /// The conditions on the pool's status; none without one.
    pub fn conditions(&self) -> &[Condition] {
        let conditions = match self {
            AnyPool::InCluster(p) => p.status.as_ref().map(|s| &s.conditions),
            AnyPool::GlobalInCluster(p) => p.status.as_ref().map(|s| &s.conditions),
            AnyPool::Prefix(p) => p.status.as_ref().map(|s| &s.conditions),
            AnyPool::GlobalPrefix(p) => p.status.as_ref().map(|s| &s.conditions),
            AnyPool::Metal3(p) => p.status.as_ref().map(|s| &s.conditions),
        };
        conditions.map_or(&[], Vec::as_slice)
    }

    /// The condition of `type_`, if the pool has one.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions().iter().find(|c| c.type_ == type_)
    }

    /// The counts on the pool's status.
    pub fn status_counts(&self) -> StatusCounts {
        let capi = |status: Option<&crate::api::capi_pools::InClusterIPPoolStatus>| {
            status
                .and_then(|s| s.ip_addresses.as_ref())
                .map(|c| StatusCounts {
                    total: Some(c.total),
                    used: Some(c.used),
                    free: Some(c.free),
                    out_of_range: Some(c.out_of_range),
                })
                .unwrap_or_default()
        };
        match self {
            AnyPool::InCluster(p) => capi(p.status.as_ref()),
            AnyPool::GlobalInCluster(p) => capi(p.status.as_ref()),
            AnyPool::Prefix(p) => capi(p.status.as_ref()),
            AnyPool::GlobalPrefix(p) => capi(p.status.as_ref()),
            AnyPool::Metal3(p) => p
                .status
                .as_ref()
                .map(|s| StatusCounts {
                    total: s.capacity,
                    used: s.used_ip_count,
                    free: s.available_ip_count,
                    out_of_range: s.out_of_range_ip_count,
                })
                .unwrap_or_default(),
        }
    }

    /// The annotation naming this pool on its ledger: `<kind>/<namespace>/<name>`.
    pub fn ledger_key(&self) -> String {
        let key = self.key();
        format!(
            "{}/{}/{}",
            key.kind,
            key.namespace.as_deref().unwrap_or_default(),
            key.name
        )
    }
}

/// A pool's ledger as stored: where, for which pool object, and its record or why it does not
/// decode.
#[derive(Clone, Debug)]
pub struct StoredLedger {
    /// `<namespace>/<name>` of its ConfigMap.
    pub config_map: String,
    /// The `pool-uid` annotation: the pool (and numbering) it was written for.
    pub pool_identity: Option<String>,
    pub record: Result<Ledger, String>,
}

/// Which objects to read: one namespace's (and the cluster-scoped pools, which serve it), or
/// the whole cluster's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Scope {
    #[default]
    Cluster,
    Namespace(String),
}

impl Scope {
    fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        match self {
            Scope::Cluster => Api::all(client.clone()),
            Scope::Namespace(ns) => Api::namespaced(client.clone(), ns),
        }
    }
}

/// Everything the operator commands conclude from, read at one moment.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub scope: Scope,
    pub pools: Vec<AnyPool>,
    pub claims: Vec<IPAddressClaim>,
    pub ipclaims: Vec<IPClaim>,
    pub addresses: Vec<IPAddress>,
    pub metal3_addresses: Vec<Metal3IPAddress>,
    /// By the pool they name ([`AnyPool::ledger_key`]).
    pub ledgers: BTreeMap<String, StoredLedger>,
    /// Kinds whose CRD the cluster does not have (Metal3's, in a cluster without Metal3).
    pub absent_kinds: Vec<String>,
    /// When it was read, RFC 3339 on this machine's clock.
    pub read_at: String,
}

/// Why a snapshot could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot list {what}: {source}")]
pub struct ReadError {
    pub what: String,
    #[source]
    pub source: kube::Error,
}

impl Snapshot {
    /// Reads every object in `scope`, through `client`, one list per kind.
    pub async fn read(client: &Client, scope: Scope) -> Result<Self, ReadError> {
        let mut snapshot = Snapshot {
            read_at: k8s_openapi::jiff::Timestamp::now().to_string(),
            ..Snapshot::default()
        };
        let absent = &mut snapshot.absent_kinds;
        let capi = list::<InClusterIPPool>(&scope.api(client), absent).await?;
        let prefix = list::<InClusterPrefixPool>(&scope.api(client), absent).await?;
        let metal3 = list::<IPPool>(&scope.api(client), absent).await?;
        snapshot
            .pools
            .extend(capi.into_iter().map(AnyPool::InCluster));
        snapshot
            .pools
            .extend(prefix.into_iter().map(AnyPool::Prefix));
        snapshot
            .pools
            .extend(metal3.into_iter().map(AnyPool::Metal3));
        // Cluster-scoped pools serve every namespace: in a namespace's scope too.
        let absent = &mut snapshot.absent_kinds;
        let global = list::<GlobalInClusterIPPool>(&Api::all(client.clone()), absent).await?;
        let global_prefix =
            list::<GlobalInClusterPrefixPool>(&Api::all(client.clone()), absent).await?;
        snapshot
            .pools
            .extend(global.into_iter().map(AnyPool::GlobalInCluster));
        snapshot
            .pools
            .extend(global_prefix.into_iter().map(AnyPool::GlobalPrefix));
        let absent = &mut snapshot.absent_kinds;
        snapshot.claims = list(&scope.api(client), absent).await?;
        snapshot.ipclaims = list(&scope.api(client), absent).await?;
        snapshot.addresses = list(&scope.api(client), absent).await?;
        snapshot.metal3_addresses = list(&scope.api(client), absent).await?;
        snapshot.ledgers = read_ledgers(client).await?;
        snapshot.scope = scope;
        Ok(snapshot)
    }

    /// The pool `key` names, if it is in the snapshot.
    pub fn pool(&self, key: &PoolKey) -> Option<&AnyPool> {
        self.pools.iter().find(|p| &p.key() == key)
    }

    /// Whether the snapshot holds every address object `pool` can have: not so for a
    /// cluster-scoped pool read in one namespace's scope.
    pub fn sees_every_address_of(&self, pool: &AnyPool) -> bool {
        self.scope == Scope::Cluster || pool.key().namespace.is_some()
    }

    /// The ledger written for `pool` (one of an earlier pool of the same name is not).
    pub fn ledger_of(&self, pool: &AnyPool) -> Option<&StoredLedger> {
        self.ledgers
            .get(&pool.ledger_key())
            .filter(|l| l.pool_identity.as_deref() == Some(pool.ledger_identity().as_str()))
    }

    /// Every address object, of both APIs, that says it is from `key`.
    pub fn addresses_of(&self, key: &PoolKey) -> Vec<AnyAddress> {
        self.all_addresses()
            .into_iter()
            .filter(|a| a.is_of(key))
            .collect()
    }

    /// Every address object of both APIs.
    pub fn all_addresses(&self) -> Vec<AnyAddress> {
        let capi = self.addresses.iter().filter_map(AnyAddress::capi);
        let metal3 = self.metal3_addresses.iter().filter_map(AnyAddress::metal3);
        capi.chain(metal3).collect()
    }
}

/// Every object of kind `K` through `api`; none, and `K` noted as absent, when the cluster does
/// not have its CRD.
async fn list<K>(api: &Api<K>, absent: &mut Vec<String>) -> Result<Vec<K>, ReadError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(status)) if status.is_not_found() => {
            absent.push(format!("{}.{}", K::plural(&()), K::group(&())));
            Ok(Vec::new())
        }
        Err(source) => Err(ReadError {
            what: format!("{}.{}", K::plural(&()), K::group(&())),
            source,
        }),
    }
}

/// Every ledger ConfigMap in the cluster, by the pool it names.
async fn read_ledgers(client: &Client) -> Result<BTreeMap<String, StoredLedger>, ReadError> {
    let api: Api<ConfigMap> = Api::all(client.clone());
    let listed = api
        .list(&ListParams::default().labels(LEDGER_LABEL))
        .await
        .map_err(|source| ReadError {
            what: format!("ConfigMaps labelled {LEDGER_LABEL}"),
            source,
        })?;
    Ok(listed
        .items
        .iter()
        .filter_map(|config_map| {
            let annotation = |key: &str| config_map.annotations().get(key).cloned();
            let stored = StoredLedger {
                config_map: format!(
                    "{}/{}",
                    config_map.namespace().unwrap_or_default(),
                    config_map.name_any()
                ),
                pool_identity: annotation(POOL_UID_ANNOTATION),
                record: Ledger::from_config_map(config_map),
            };
            Some((annotation(POOL_ANNOTATION)?, stored))
        })
        .collect())
}
