//! The cluster state the admission rules read, live from the API server: a pool's allocated
//! addresses (from its ledger or its address objects), the other pools' layouts, a pool by key.

use std::collections::HashMap;

use kube::api::{Api, DynamicObject, ListParams};
use kube::core::admission::AdmissionRequest;
use kube::{Client, ResourceExt};
use serde::de::DeserializeOwned;

use super::*;
use crate::alloc::{Layout, Numbering};
use crate::api::capi_pools::{
    GlobalInClusterIPPool, GlobalInClusterPrefixPool, InClusterIPPool, InClusterPrefixPool,
    InClusterPrefixPoolSpec,
};
use crate::api::metal3_ipam::IPPool;
use crate::ipam::dialect::{AddressKinds, listed_addresses};
use crate::ipam::key::{PoolKey, PoolKind};
use crate::ipam::ledger::{Ledger, LedgerRef, Loaded};
use crate::runtime::context::CachedAddressPool;
use crate::webhook::Webhooks;
use crate::webhook::rules::{self, Held};

/// How many address objects of each kind are read to name the claims of a recorded pool's
/// allocated addresses: a bound on the cost of a pool update or delete, whatever the pool's size.
const NAMING_PAGE: u32 = 500;

impl Webhooks {
    /// The addresses allocated from the pool of `request` (an update or delete), with the claims
    /// that hold them where known. A pool bitpool records is read from its ledger: one read of
    /// at most 1 MiB, whatever the number of addresses, and the claims named by its
    /// reservations and by the first [`NAMING_PAGE`] address objects. A prefix pool (whose
    /// record numbers sub-prefixes, not addresses) and a pool without a record yet (one the
    /// provider bitpool replaces left, not reconciled yet) are read from a list of their objects.
    pub(super) async fn held(
        &self,
        request: &AdmissionRequest<DynamicObject>,
        kind: PoolKind,
        namespace: Option<&str>,
    ) -> Result<Vec<Held>, AdmissionError> {
        let name = request.name.as_str();
        let uid = request
            .old_object
            .as_ref()
            .and_then(|o| o.metadata.uid.clone());
        let recorded = match uid {
            Some(uid) if !kind.is_prefix() => self.recorded(kind, namespace, name, uid).await?,
            _ => None,
        };
        let Some(ledger) = recorded else {
            return self
                .listed(kind, namespace, name, &ListParams::default())
                .await;
        };
        let page = ListParams::default().limit(NAMING_PAGE);
        let mut claims: HashMap<String, String> = self
            .listed(kind, namespace, name, &page)
            .await?
            .into_iter()
            .map(|h| (h.address, h.claim))
            .collect();
        for (address, reservation) in &ledger.pending {
            claims.insert(address.clone(), reservation.claim_name.clone());
        }
        Ok(ledger
            .addresses()
            .map(|ip| {
                let address = ip.to_string();
                let claim = claims.get(&address).cloned().unwrap_or_default();
                Held { address, claim }
            })
            .collect())
    }

    /// The pool's ledger, if there is one this pool wrote.
    async fn recorded(
        &self,
        kind: PoolKind,
        namespace: Option<&str>,
        name: &str,
        uid: String,
    ) -> Result<Option<Ledger>, AdmissionError> {
        let ledger = LedgerRef::new(
            self.client.clone(),
            &self.ledger_namespace,
            kind.as_str(),
            namespace,
            name,
            uid,
            None,
        );
        match ledger.load().await {
            Ok(Loaded::Found(stored)) => Ok(Some(stored.ledger)),
            Ok(Loaded::Missing | Loaded::Untrusted { .. }) => Ok(None),
            Err(e) => Err(AdmissionError::Ledger {
                ledger: ledger.describe(),
                reason: e.to_string(),
            }),
        }
    }

    /// The address objects of a pool, of both address kinds, as `params` list them.
    async fn listed(
        &self,
        kind: PoolKind,
        namespace: Option<&str>,
        name: &str,
        params: &ListParams,
    ) -> Result<Vec<Held>, AdmissionError> {
        let kinds = match kind.is_metal3() {
            true => AddressKinds::CapiAndMetal3,
            false => AddressKinds::Capi,
        };
        let fresh = listed_addresses(&self.client, namespace, kinds, params)
            .await
            .map_err(|source| AdmissionError::Read {
                what: "address objects".into(),
                source,
            })?;
        let key = PoolKey {
            kind,
            namespace: namespace.filter(|_| !kind.is_global()).map(str::to_string),
            name: name.to_string(),
        };
        Ok(fresh
            .all()
            .filter(|a| a.is_of(&key))
            .map(|a| Held {
                address: a.address.to_string(),
                claim: a.claim.to_string(),
            })
            .collect())
    }

    /// Every other pool's layout (valid ones), named `Kind namespace/name`.
    pub(super) async fn other_layouts(
        &self,
        kind: PoolKind,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Vec<(String, Layout)>, AdmissionError> {
        let capi = list_all::<InClusterIPPool>(&self.client, "InClusterIPPools").await?;
        let globals =
            list_all::<GlobalInClusterIPPool>(&self.client, "GlobalInClusterIPPools").await?;
        let ippools = list_all::<IPPool>(&self.client, "IPPools").await?;
        let prefix_pools =
            list_all::<InClusterPrefixPool>(&self.client, "InClusterPrefixPools").await?;
        let global_prefix_pools =
            list_all::<GlobalInClusterPrefixPool>(&self.client, "GlobalInClusterPrefixPools")
                .await?;
        let as_addresses = |spec: &InClusterPrefixPoolSpec| {
            rules::prefix_pool(spec).map(|valid| rules::prefix_addresses(&valid))
        };
        let prefix_pools = prefix_pools.into_iter().map(|p| {
            let layout = as_addresses(&p.spec);
            (
                PoolKind::InClusterPrefixPool,
                p.namespace(),
                p.name_any(),
                layout,
            )
        });
        let global_prefix_pools = global_prefix_pools.into_iter().map(|p| {
            let layout = as_addresses(&p.spec.pool);
            (
                PoolKind::GlobalInClusterPrefixPool,
                None,
                p.name_any(),
                layout,
            )
        });
        let capi = capi.into_iter().map(|p| {
            (
                PoolKind::InClusterIPPool,
                p.namespace(),
                p.name_any(),
                rules::capi_pool(&p.spec),
            )
        });
        let globals = globals.into_iter().map(|p| {
            (
                PoolKind::GlobalInClusterIPPool,
                None,
                p.name_any(),
                rules::capi_pool(&p.spec.pool),
            )
        });
        // A pool that proxies hands out its target's addresses, none of its own.
        let ippools = ippools.into_iter().filter(|p| !p.proxies()).map(|p| {
            (
                PoolKind::Metal3IPPool,
                p.namespace(),
                p.name_any(),
                rules::metal3_pool(&p.spec),
            )
        });
        Ok(capi
            .chain(globals)
            .chain(ippools)
            .chain(prefix_pools)
            .chain(global_prefix_pools)
            .filter(|(k, ns, n, _)| !(*k == kind && ns.as_deref() == namespace && n == name))
            .filter_map(|(k, ns, n, layout)| {
                let named = match ns {
                    Some(ns) => format!("{k} {ns}/{n}"),
                    None => format!("{k} {n}"),
                };
                Some((named, layout.ok()?))
            })
            .collect())
    }

    /// The layout and numbering of a prefix pool, if it exists and is valid.
    pub(super) async fn prefix_pool_layout(
        &self,
        key: &PoolKey,
    ) -> Result<Option<(Layout, Numbering)>, AdmissionError> {
        let (client, what) = (self.client.clone(), key.describe());
        let spec = match &key.namespace {
            Some(ns) => get(
                &Api::<InClusterPrefixPool>::namespaced(client, ns),
                &key.name,
                &what,
            )
            .await?
            .map(|p| p.spec),
            None => get(
                &Api::<GlobalInClusterPrefixPool>::all(client),
                &key.name,
                &what,
            )
            .await?
            .map(|p| p.spec.pool),
        };
        Ok(spec.and_then(|s| rules::prefix_pool(&s).ok()))
    }

    /// The layout of a bitpool pool, if it exists and is valid.
    pub(super) async fn pool_layout(
        &self,
        key: &PoolKey,
    ) -> Result<Option<Layout>, AdmissionError> {
        Ok(self.address_pool(key).await?.and_then(|p| p.layout()))
    }

    /// The address pool `key` (an `InClusterIPPool`, `GlobalInClusterIPPool` or Metal3
    /// `IPPool`), read from the API server; `None` when it does not exist (or names no pool).
    pub(in crate::webhook) async fn address_pool(
        &self,
        key: &PoolKey,
    ) -> Result<Option<AddressPool>, AdmissionError> {
        if key.name.is_empty() {
            return Ok(None);
        }
        let (client, namespace) = (
            self.client.clone(),
            key.namespace.as_deref().unwrap_or_default(),
        );
        let what = key.describe();
        Ok(match key.kind {
            PoolKind::InClusterIPPool => {
                let api = Api::<InClusterIPPool>::namespaced(client, namespace);
                get(&api, &key.name, &what).await?.map(|p| {
                    AddressPool::Capi(Box::new(CachedAddressPool {
                        spec: p.spec,
                        status: p.status,
                    }))
                })
            }
            PoolKind::GlobalInClusterIPPool => {
                let api = Api::<GlobalInClusterIPPool>::all(client);
                get(&api, &key.name, &what).await?.map(|p| {
                    AddressPool::Capi(Box::new(CachedAddressPool {
                        spec: p.spec.pool,
                        status: p.status,
                    }))
                })
            }
            // Prefix pools are no address pools: callers do not ask for them (read, as ever, as
            // a Metal3 IPPool, which answers that there is none).
            PoolKind::Metal3IPPool
            | PoolKind::InClusterPrefixPool
            | PoolKind::GlobalInClusterPrefixPool => get(
                &Api::<IPPool>::namespaced(client, namespace),
                &key.name,
                &what,
            )
            .await?
            .map(|p| AddressPool::Metal3(Box::new(p))),
        })
    }
}

/// An address pool as admission reads it, of any kind bitpool serves.
pub(in crate::webhook) enum AddressPool {
    /// An `InClusterIPPool` or `GlobalInClusterIPPool`.
    Capi(Box<CachedAddressPool>),
    Metal3(Box<IPPool>),
}

impl AddressPool {
    /// Its layout, if its spec is valid.
    fn layout(&self) -> Option<Layout> {
        match self {
            AddressPool::Capi(pool) => rules::capi_pool(&pool.spec).ok(),
            AddressPool::Metal3(pool) => rules::metal3_pool(&pool.spec).ok(),
        }
    }

    /// How many addresses it has free, by its status (`None` before a provider wrote one).
    pub(in crate::webhook) fn free(&self) -> Option<i64> {
        match self {
            AddressPool::Capi(pool) => pool.status.as_ref()?.ip_addresses.as_ref().map(|c| c.free),
            AddressPool::Metal3(pool) => pool.status.as_ref()?.available_ip_count,
        }
    }
}

/// `name`, or `None` when it does not exist; `what` names it in the error.
pub(in crate::webhook) async fn get<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
) -> Result<Option<K>, AdmissionError>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name)
        .await
        .map_err(|source| AdmissionError::Read {
            what: what.to_string(),
            source,
        })
}

/// Every object of kind `K`; `what` names them in the error.
pub(super) async fn list_all<K>(client: &Client, what: &str) -> Result<Vec<K>, AdmissionError>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    Api::<K>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|source| AdmissionError::Read {
            what: what.to_string(),
            source,
        })
}
