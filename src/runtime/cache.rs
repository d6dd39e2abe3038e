//! The watch caches every subsystem reads: one watch per kind feeds a shared reflector store
//! (used as an index) and the triggers of every controller that cares about the kind.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, future};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use super::cached::{AddressObject, ClaimObject};
use super::context::{Context, Settings};
use super::index::{Cached, Index};
use super::lean::Lean;
use super::resume::{Followed, ResumeRecord};
use super::trigger;
use super::watched::Watched;
use crate::api::capi::{Cluster, IPAddress, IPAddressClaim};
use crate::api::capi_pools::{
    GlobalInClusterIPPool, GlobalInClusterPrefixPool, InClusterIPPool, InClusterPrefixPool,
};
use crate::api::labels::WATCH_FILTER;
use crate::api::metal3_data::{Metal3Data, Metal3DataClaim, Metal3DataTemplate};
use crate::api::metal3_ipam::{IPClaim, IPPool, Metal3IPAddress};

/// Events buffered per subscriber of a shared watch.
const SUBSCRIBE_BUFFER: usize = 1024;

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

fn watch_config(settings: &Settings, filtered: bool) -> watcher::Config {
    let config = watcher::Config::default().any_semantic();
    match (&settings.watch_filter, filtered) {
        (Some(value), true) => config.labels(&format!("{WATCH_FILTER}={value}")),
        _ => config,
    }
}

/// Tells that objects may have left some caches: deleted, or missing from a list after the
/// watch broke. A store's subscribers hear of changes only, so whatever judges an object by
/// what another cache holds (a claim by whether its pool is cached) listens to this as well.
#[derive(Clone)]
pub(crate) struct Removals(Arc<tokio::sync::watch::Sender<()>>);

impl Removals {
    fn new() -> Self {
        Self(Arc::new(tokio::sync::watch::Sender::new(())))
    }

    fn tell(&self) {
        self.0.send_modify(|_| {});
    }

    /// One item per removal from the first poll on (earlier ones are in what the first lists
    /// deliver); removals that come while the last is being handled are told once.
    pub(crate) fn stream(&self) -> impl futures::Stream<Item = ()> + Send + 'static {
        let receiver = self.0.subscribe();
        futures::stream::unfold((receiver, true), |(mut receiver, first)| async move {
            if first {
                receiver.mark_unchanged();
            }
            receiver.changed().await.ok()?;
            Some(((), (receiver, false)))
        })
    }
}

/// A shared cache of `K` kept by one watch, and a way to subscribe to its changes.
pub(crate) struct Shared<K: Resource<DynamicType = ()> + Clone + 'static> {
    pub(crate) store: Store<K>,
    writer: Option<reflector::store::Writer<K>>,
    driver: Option<tokio::task::JoinHandle<()>>,
    removals: Option<Removals>,
}

impl<K> Shared<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    ObjectRef<K>: Hash + Eq,
{
    /// An empty cache, filled once its watch starts.
    pub(crate) fn new() -> Self {
        let (store, writer) = reflector::store_shared(SUBSCRIBE_BUFFER);
        Self {
            store,
            writer: Some(writer),
            driver: None,
            removals: None,
        }
    }

    /// The same, telling `removals` whenever objects may have left it.
    fn telling(removals: &Removals) -> Self {
        let mut shared = Self::new();
        shared.removals = Some(removals.clone());
        shared
    }

    /// The cache's changes, for a controller's triggers (see [`trigger::eager`]).
    pub(crate) fn subscribe(&self) -> Option<impl futures::Stream<Item = Arc<K>> + Send + 'static> {
        Some(trigger::eager(self.writer.as_ref()?.subscribe()?))
    }

    /// Starts the watch that fills the cache (after every subscriber is registered).
    fn start(&mut self, api: Api<K>, config: watcher::Config) {
        let Some(writer) = self.writer.take() else {
            return;
        };
        let kind = K::kind(&()).to_string();
        let removals = self.removals.clone();
        let stream = watcher(api, config)
            .default_backoff()
            .modify(strip)
            .reflect_shared(writer)
            .for_each(move |event| {
                match event {
                    Err(e) => {
                        tracing::warn!(kind = %kind, error = %e, "watch failed; retrying");
                    }
                    // A list replaces the store: what it lacks is gone without a Delete.
                    Ok(watcher::Event::Delete(_) | watcher::Event::InitDone) => {
                        if let Some(removals) = &removals {
                            removals.tell();
                        }
                    }
                    Ok(_) => {}
                }
                future::ready(())
            });
        self.driver = Some(tokio::spawn(stream));
    }
}

/// How long the address objects' list waits for the claims' at most (a claim list that keeps
/// failing must not keep the address objects out).
const ADDRESS_LIST_DELAY: Duration = Duration::from_secs(10);

/// Completes once `index` holds its first list, or after `limit`.
fn listed_or_after<T: Cached>(
    index: &Index<T>,
    limit: Duration,
) -> impl Future<Output = ()> + Send + 'static {
    let index = index.clone();
    async move {
        let _ = tokio::time::timeout(limit, index.wait_until_ready()).await;
    }
}

/// What no reconcile reads, dropped before an object enters a cache: managed fields (often most
/// of an object's size) and kubectl's copy of the last applied object.
fn strip<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Drop for Shared<K> {
    fn drop(&mut self) {
        if let Some(driver) = &self.driver {
            driver.abort();
        }
    }
}

/// `<Kind> <namespace>/<name>` (or `<Kind> <name>`), naming an object in logs and retry counts.
pub(crate) fn describe<K: Resource<DynamicType = ()>>(object: &K) -> String {
    let name = object.meta().name.as_deref().unwrap_or_default();
    match object.meta().namespace.as_deref() {
        Some(ns) => format!("{} {ns}/{name}", K::kind(&())),
        None => format!("{} {name}", K::kind(&())),
    }
}

async fn crd_exists(client: &Client, name: &str) -> bool {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    matches!(crds.get_opt(name).await, Ok(Some(_)))
}

/// One shared cache per watched kind.
pub(crate) struct Caches {
    pub(crate) claims: Watched<IPAddressClaim, ClaimObject>,
    pub(crate) addresses: Watched<IPAddress, AddressObject>,
    pub(crate) ipclaims: Watched<IPClaim, ClaimObject>,
    pub(crate) metal3_addresses: Watched<Metal3IPAddress, AddressObject>,
    pub(crate) clusters: Option<Shared<Cluster>>,
    pub(crate) pools: Shared<InClusterIPPool>,
    pub(crate) global_pools: Shared<GlobalInClusterIPPool>,
    pub(crate) prefix_pools: Shared<InClusterPrefixPool>,
    pub(crate) global_prefix_pools: Shared<GlobalInClusterPrefixPool>,
    pub(crate) ippools: Shared<IPPool>,
    /// Pools of any kind that left their cache.
    pub(crate) pools_removed: Removals,
    /// Metal3DataTemplates that left theirs.
    pub(crate) templates_removed: Removals,
    /// Metal3Data that left theirs.
    pub(crate) datas_removed: Removals,
    pub(crate) data_templates: Shared<Metal3DataTemplate>,
    pub(crate) datas: Shared<Metal3Data>,
    pub(crate) data_claims: Shared<Metal3DataClaim>,
    /// Their labels decide which claims a global pool with a `namespaceSelector` serves.
    pub(crate) namespaces: Shared<Namespace>,
}

impl Caches {
    /// Empty caches; Clusters are cached only where Cluster API core is installed.
    pub(crate) async fn new(client: &Client) -> Self {
        let clusters = crd_exists(client, "clusters.cluster.x-k8s.io")
            .await
            .then(Shared::new);
        if clusters.is_none() {
            tracing::info!(
                "Cluster API core is not installed: claims are never paused through a Cluster"
            );
        }
        let (pools_removed, templates_removed) = (Removals::new(), Removals::new());
        let datas_removed = Removals::new();
        Self {
            // New claims are served before 100,000 claims are listed (`ipam::engine`).
            claims: Watched::new(ClaimObject::of_capi).with_arrivals(),
            addresses: Watched::new(AddressObject::of_capi),
            ipclaims: Watched::new(ClaimObject::of_metal3),
            metal3_addresses: Watched::new(AddressObject::of_metal3),
            clusters,
            pools: Shared::telling(&pools_removed),
            global_pools: Shared::telling(&pools_removed),
            prefix_pools: Shared::telling(&pools_removed),
            global_prefix_pools: Shared::telling(&pools_removed),
            ippools: Shared::telling(&pools_removed),
            pools_removed,
            data_templates: Shared::telling(&templates_removed),
            templates_removed,
            datas: Shared::telling(&datas_removed),
            datas_removed,
            data_claims: Shared::new(),
            namespaces: Shared::new(),
        }
    }

    /// What every reconcile shares, reading these caches.
    pub(crate) fn context(
        &self,
        client: &Client,
        settings: &Settings,
        ops: Arc<crate::ops::Ops>,
    ) -> Context {
        Context {
            client: client.clone(),
            settings: settings.clone(),
            claims: self.claims.index.clone(),
            addresses: self.addresses.index.clone(),
            clusters: self.clusters.as_ref().map(|c| c.store.clone()),
            pools: self.pools.store.clone(),
            global_pools: self.global_pools.store.clone(),
            prefix_pools: self.prefix_pools.store.clone(),
            global_prefix_pools: self.global_prefix_pools.store.clone(),
            ippools: self.ippools.store.clone(),
            ipclaims: self.ipclaims.index.clone(),
            metal3_addresses: self.metal3_addresses.index.clone(),
            data_templates: self.data_templates.store.clone(),
            datas: self.datas.store.clone(),
            data_claims: self.data_claims.store.clone(),
            namespaces: self.namespaces.store.clone(),
            ops,
            state: Default::default(),
        }
    }

    /// The record the claims' watch resumes from and how far it has followed their changes
    /// (once [`Self::start`]ed), and the collection's version now: what the claims' resume
    /// record is kept from ([`super::resume::keep`]).
    pub(crate) fn claims_followed(
        &self,
        client: &Client,
        settings: &Settings,
    ) -> (
        Option<Followed>,
        impl Future<Output = Option<String>> + use<>,
    ) {
        let claims: Api<Lean<IPAddressClaim>> = api(client, settings.namespace.as_deref());
        let config = watch_config(settings, true);
        let now = async move { super::arrivals::current_version(&claims, &config).await };
        (self.claims.followed(), now)
    }

    /// Starts the watches (after every controller subscribed). Kinds of a group that is off may
    /// have no CRD: their caches stay empty and unwatched. The address objects are listed after
    /// the claims: the pool engine serves new claims before the address objects are in, and a
    /// server busy listing both would deliver the claims later.
    pub(crate) fn start(&mut self, client: &Client, settings: &Settings) {
        let ns = settings.namespace.as_deref();
        let (filtered, unfiltered) = (watch_config(settings, true), watch_config(settings, false));
        self.claims.resume_from(ResumeRecord::of(settings));
        self.claims.start(api(client, ns), filtered.clone());
        let claims_listed = listed_or_after(&self.claims.index, ADDRESS_LIST_DELAY);
        self.addresses
            .start_after(api(client, ns), unfiltered.clone(), claims_listed);
        if let Some(clusters) = self.clusters.as_mut() {
            clusters.start(api(client, ns), unfiltered.clone());
        }
        self.pools.start(api(client, ns), filtered.clone());
        self.global_pools
            .start(Api::all(client.clone()), filtered.clone());
        self.prefix_pools.start(api(client, ns), filtered.clone());
        self.global_prefix_pools
            .start(Api::all(client.clone()), filtered.clone());
        // Not filtered by label (namespaces are not labelled for bitpool); one namespace's
        // process needs only its own.
        let namespaces = match ns {
            Some(ns) => watcher::Config::default()
                .any_semantic()
                .fields(&format!("metadata.name={ns}")),
            None => watcher::Config::default().any_semantic(),
        };
        self.namespaces.start(Api::all(client.clone()), namespaces);
        let groups = settings.groups;
        if groups.metal3_kinds() {
            self.ipclaims.start(api(client, ns), filtered.clone());
            let claims_listed = listed_or_after(&self.claims.index, ADDRESS_LIST_DELAY);
            self.metal3_addresses
                .start_after(api(client, ns), unfiltered, claims_listed);
            self.ippools.start(api(client, ns), filtered.clone());
        }
        if groups.metal3_data {
            self.data_templates.start(api(client, ns), filtered.clone());
            self.datas.start(api(client, ns), filtered.clone());
            self.data_claims.start(api(client, ns), filtered);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    /// Removals told before the first look are not told again (the first lists carry them);
    /// later ones are, several at once as one.
    #[tokio::test]
    async fn removals_are_told_from_the_first_look_on_and_coalesced() {
        let removals = Removals::new();
        let mut stream = Box::pin(removals.stream());
        removals.tell();
        assert!(
            stream.next().now_or_never().is_none(),
            "told before the first look"
        );
        removals.tell();
        removals.tell();
        assert_eq!(stream.next().now_or_never(), Some(Some(())));
        assert!(
            stream.next().now_or_never().is_none(),
            "two removals told once"
        );
        removals.tell();
        assert_eq!(stream.next().await, Some(()));
    }
}
