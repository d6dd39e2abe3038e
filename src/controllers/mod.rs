//! The reconcilers and their wiring: one watch per kind feeds a shared cache (the reflector
//! stores, used as indexes) and triggers every controller that cares about it.
//!
//! - [`pool`]: the pool engine, one batch per pool, whatever its dialect;
//! - [`capi`]: its InClusterIPPool / GlobalInClusterIPPool dialect;
//! - [`prefix`]: its InClusterPrefixPool / GlobalInClusterPrefixPool dialect (sub-prefixes);
//! - [`metal3`]: its Metal3 IPPool dialect (IPClaims and IPAddressClaims from one space);
//! - [`proxy`]: Metal3 IPPools that serve their IPClaims from a CAPI pool (migration);
//! - [`claims`]: claims of either kind whose pool does not exist;
//! - the Metal3Data reconciler's controllers, from [`crate::metal3data`];
//! - [`ledger`], [`intent`] and [`transaction`]: the per-pool record that makes the API server
//!   the judge of every allocation, the pure transaction applied to it, and how it is read,
//!   rebuilt and committed;
//! - [`context`]: what every reconcile shares;
//! - [`kinds`]: the claim and address kinds behind one interface.

pub mod capi;
pub mod claims;
pub mod context;
pub mod duplicates;
pub mod error;
pub mod intent;
pub mod kinds;
pub mod ledger;
pub mod metal3;
pub mod objects;
pub mod overlaps;
pub mod pool;
pub mod prefix;
pub mod proxy;
pub mod transaction;
pub mod trigger;

use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, future};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

pub use context::{CachedSpace, Context, Groups, Settings};
pub use error::Error;

use crate::api::capi::{Cluster, IPAddress, IPAddressClaim};
use crate::api::capi_pools::{
    GlobalInClusterIPPool, GlobalInClusterPrefixPool, InClusterIPPool, InClusterPrefixPool,
};
use crate::api::metal3_data::{Metal3Data, Metal3DataClaim, Metal3DataTemplate};
use crate::api::metal3_ipam::{IPClaim, IPPool, Metal3IPAddress};
use crate::metal3data;
use pool::{PoolDialect, PoolKey};

/// The CAPI label that limits a controller to objects labelled with its `--watch-filter` value.
pub const WATCH_FILTER_LABEL: &str = "cluster.x-k8s.io/watch-filter";
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
        (Some(value), true) => config.labels(&format!("{WATCH_FILTER_LABEL}={value}")),
        _ => config,
    }
}

/// A shared cache of `K` kept by one watch, and a way to subscribe to its changes.
pub(crate) struct Shared<K: Resource<DynamicType = ()> + Clone + 'static> {
    pub(crate) store: Store<K>,
    writer: Option<reflector::store::Writer<K>>,
    driver: Option<tokio::task::JoinHandle<()>>,
}

impl<K> Shared<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    ObjectRef<K>: Hash + Eq,
{
    fn new() -> Self {
        let (store, writer) = reflector::store_shared(SUBSCRIBE_BUFFER);
        Self {
            store,
            writer: Some(writer),
            driver: None,
        }
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
        let stream = watcher(api, config)
            .default_backoff()
            .modify(strip)
            .reflect_shared(writer)
            .for_each(move |event| {
                if let Err(e) = event {
                    tracing::warn!(kind = %kind, error = %e, "watch failed; retrying");
                }
                future::ready(())
            });
        self.driver = Some(tokio::spawn(stream));
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

fn error_policy<K>(object: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action
where
    K: Resource<DynamicType = ()>,
{
    let described = describe(&*object);
    ctx.ops
        .metrics
        .reconcile_failed(&K::kind(&()), error.kind());
    let retry = ctx.failed(&described, error);
    tracing::warn!(
        object = %described,
        error = %error,
        error_kind = error.kind(),
        retry_in = ?retry,
        "reconcile failed"
    );
    match retry {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    }
}

/// Runs `reconcile` once the caches hold their initial lists, while this process leads and
/// unless shutdown has begun; resets the object's retry backoff when it succeeds. Losing the
/// lease drops the reconcile at once, as a crash would: every write is resumable.
async fn guarded<K, F, Fut>(
    object: Arc<K>,
    ctx: Arc<Context>,
    reconcile: F,
) -> Result<Action, Error>
where
    K: Resource<DynamicType = ()>,
    F: FnOnce(Arc<K>, Arc<Context>) -> Fut,
    Fut: Future<Output = Result<Action, Error>>,
{
    ctx.wait_for_caches().await;
    if ctx.shutting_down() || !ctx.ops.leadership.is_leading() {
        // A new leader reconciles everything when it takes over.
        return Ok(Action::await_change());
    }
    let described = describe(&*object);
    let started = std::time::Instant::now();
    let result = tokio::select! {
        result = reconcile(object, ctx.clone()) => result,
        _ = ctx.ops.leadership.lost() => {
            tracing::info!(object = %described, "reconcile dropped: this process stopped leading");
            return Ok(Action::await_change());
        }
    };
    ctx.ops.metrics.reconciled(&K::kind(&()), started.elapsed());
    if result.is_ok() {
        ctx.succeeded(&described);
    }
    result
}

async fn crd_exists(client: &Client, name: &str) -> bool {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    matches!(crds.get_opt(name).await, Ok(Some(_)))
}

/// One shared cache per watched kind.
pub(crate) struct Caches {
    pub(crate) claims: Shared<IPAddressClaim>,
    pub(crate) addresses: Shared<IPAddress>,
    pub(crate) ipclaims: Shared<IPClaim>,
    pub(crate) metal3_addresses: Shared<Metal3IPAddress>,
    clusters: Option<Shared<Cluster>>,
    pools: Shared<InClusterIPPool>,
    global_pools: Shared<GlobalInClusterIPPool>,
    prefix_pools: Shared<InClusterPrefixPool>,
    global_prefix_pools: Shared<GlobalInClusterPrefixPool>,
    ippools: Shared<IPPool>,
    data_templates: Shared<Metal3DataTemplate>,
    datas: Shared<Metal3Data>,
    data_claims: Shared<Metal3DataClaim>,
}

impl Caches {
    /// Empty caches; Clusters are cached only where Cluster API core is installed.
    async fn new(client: &Client) -> Self {
        let clusters = crd_exists(client, "clusters.cluster.x-k8s.io")
            .await
            .then(Shared::new);
        if clusters.is_none() {
            tracing::info!(
                "Cluster API core is not installed: claims are never paused through a Cluster"
            );
        }
        Self {
            claims: Shared::new(),
            addresses: Shared::new(),
            ipclaims: Shared::new(),
            metal3_addresses: Shared::new(),
            clusters,
            pools: Shared::new(),
            global_pools: Shared::new(),
            prefix_pools: Shared::new(),
            global_prefix_pools: Shared::new(),
            ippools: Shared::new(),
            data_templates: Shared::new(),
            datas: Shared::new(),
            data_claims: Shared::new(),
        }
    }

    /// What every reconcile shares, reading these caches.
    fn context(&self, client: &Client, settings: &Settings, ops: Arc<crate::ops::Ops>) -> Context {
        Context {
            client: client.clone(),
            settings: settings.clone(),
            claims: self.claims.store.clone(),
            addresses: self.addresses.store.clone(),
            clusters: self.clusters.as_ref().map(|c| c.store.clone()),
            pools: self.pools.store.clone(),
            global_pools: self.global_pools.store.clone(),
            prefix_pools: self.prefix_pools.store.clone(),
            global_prefix_pools: self.global_prefix_pools.store.clone(),
            ippools: self.ippools.store.clone(),
            ipclaims: self.ipclaims.store.clone(),
            metal3_addresses: self.metal3_addresses.store.clone(),
            data_templates: self.data_templates.store.clone(),
            datas: self.datas.store.clone(),
            data_claims: self.data_claims.store.clone(),
            ops,
            state: Default::default(),
        }
    }

    /// Starts the watches (after every controller subscribed). Kinds of a group that is off may
    /// have no CRD: their caches stay empty and unwatched.
    fn start(&mut self, client: &Client, settings: &Settings) {
        let ns = settings.namespace.as_deref();
        let (filtered, unfiltered) = (watch_config(settings, true), watch_config(settings, false));
        self.claims.start(api(client, ns), filtered.clone());
        self.addresses.start(api(client, ns), unfiltered.clone());
        if let Some(clusters) = self.clusters.as_mut() {
            clusters.start(api(client, ns), unfiltered.clone());
        }
        self.pools.start(api(client, ns), filtered.clone());
        self.global_pools
            .start(Api::all(client.clone()), filtered.clone());
        self.prefix_pools.start(api(client, ns), filtered.clone());
        self.global_prefix_pools
            .start(Api::all(client.clone()), filtered.clone());
        let groups = settings.groups;
        if groups.metal3_kinds() {
            self.ipclaims.start(api(client, ns), filtered.clone());
            self.metal3_addresses.start(api(client, ns), unfiltered);
            self.ippools.start(api(client, ns), filtered.clone());
        }
        if groups.metal3_data {
            self.data_templates.start(api(client, ns), filtered.clone());
            self.datas.start(api(client, ns), filtered.clone());
            self.data_claims.start(api(client, ns), filtered);
        }
    }
}

/// The controllers a process runs (`None` for those of a group that is off).
struct Controllers {
    in_cluster: Option<Controller<InClusterIPPool>>,
    global: Option<Controller<GlobalInClusterIPPool>>,
    prefix: Option<Controller<InClusterPrefixPool>>,
    global_prefix: Option<Controller<GlobalInClusterPrefixPool>>,
    metal3: Option<Controller<IPPool>>,
    orphan_claims: Option<Controller<IPAddressClaim>>,
    orphan_ipclaims: Option<Controller<IPClaim>>,
    templates: Option<Controller<Metal3DataTemplate>>,
    orphan_data_claims: Option<Controller<Metal3DataClaim>>,
    datas: Option<Controller<Metal3Data>>,
}

impl Controllers {
    /// Every controller of the groups that are on, subscribed to the caches it reads.
    fn new(
        caches: &Caches,
        ctx: &Arc<Context>,
        stopped: &tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        let config = ControllerConfig::default()
            .debounce(Duration::from_millis(100))
            .concurrency(ctx.settings.concurrency);
        let groups = ctx.settings.groups;
        let on = Switch {
            config: &config,
            stopped,
            ctx,
        };
        let orphan_claims = caches
            .claims
            .subscribe()
            .map(|trigger| Controller::for_shared_stream(trigger, caches.claims.store.clone()));
        let orphan_ipclaims = caches
            .ipclaims
            .subscribe()
            .map(|trigger| Controller::for_shared_stream(trigger, caches.ipclaims.store.clone()));
        let (templates, datas, data_claims) =
            (&caches.data_templates, &caches.datas, &caches.data_claims);
        Self {
            in_cluster: on.when(
                groups.capi_ipam,
                pool_controller(&caches.pools, caches, ctx),
            ),
            global: on.when(
                groups.capi_ipam,
                pool_controller(&caches.global_pools, caches, ctx),
            ),
            prefix: on.when(
                groups.capi_ipam,
                pool_controller(&caches.prefix_pools, caches, ctx),
            ),
            global_prefix: on.when(
                groups.capi_ipam,
                pool_controller(&caches.global_prefix_pools, caches, ctx),
            ),
            metal3: on.when(
                groups.metal3_pools(),
                pool_controller(&caches.ippools, caches, ctx),
            ),
            orphan_claims: on.when(groups.capi_ipam || groups.metal3_ipam, orphan_claims),
            orphan_ipclaims: on.when(groups.metal3_pools(), orphan_ipclaims),
            templates: on.when(
                groups.metal3_data,
                metal3data::template_controller(templates, datas, data_claims),
            ),
            orphan_data_claims: on.when(
                groups.metal3_data,
                metal3data::orphan_data_claim_controller(data_claims, templates, ctx),
            ),
            datas: on.when(
                groups.metal3_data,
                metal3data::data_controller(datas, data_claims, caches, ctx),
            ),
        }
    }

    /// Runs them all until they stop (at shutdown).
    async fn run(self, ctx: &Arc<Context>) {
        let ipam = future::join5(
            run_controller(self.in_cluster, pool::reconcile, ctx),
            run_controller(self.global, pool::reconcile, ctx),
            run_controller(self.prefix, pool::reconcile, ctx),
            run_controller(self.global_prefix, pool::reconcile, ctx),
            run_controller(self.metal3, proxy::reconcile, ctx),
        );
        let rest = future::join5(
            run_controller(self.orphan_claims, claims::reconcile, ctx),
            run_controller(self.orphan_ipclaims, claims::reconcile_ipclaim, ctx),
            run_controller(self.templates, metal3data::template::reconcile, ctx),
            run_controller(self.datas, metal3data::data::reconcile, ctx),
            run_controller(
                self.orphan_data_claims,
                metal3data::template::reconcile_claim,
                ctx,
            ),
        );
        future::join(ipam, rest).await;
    }
}

/// Turns a controller on (configured) or off, by its group.
struct Switch<'a> {
    config: &'a ControllerConfig,
    stopped: &'a tokio::sync::watch::Receiver<bool>,
    ctx: &'a Context,
}

impl Switch<'_> {
    fn when<K>(&self, group_on: bool, controller: Option<Controller<K>>) -> Option<Controller<K>>
    where
        K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    {
        controller
            .filter(|_| group_on)
            .map(|c| configure(c, self.config, self.stopped, self.ctx))
    }
}

/// Runs `controller` (if it is on) with `reconcile`, guarded, until it stops.
async fn run_controller<K, R, Fut>(
    controller: Option<Controller<K>>,
    reconcile: R,
    ctx: &Arc<Context>,
) where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    R: Fn(Arc<K>, Arc<Context>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Action, Error>> + Send + 'static,
{
    if let Some(controller) = controller {
        let run = controller.run(
            move |object, ctx| guarded(object, ctx, reconcile.clone()),
            error_policy,
            ctx.clone(),
        );
        drive(run).await;
    }
}

/// Runs every controller until `shutdown` completes.
pub async fn run(
    client: Client,
    settings: Settings,
    ops: Arc<crate::ops::Ops>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    if let Err(e) = transaction::ensure_namespace(&client, &settings.ledger_namespace).await {
        // Retried by every pool that needs its ledger.
        tracing::warn!(namespace = %settings.ledger_namespace, error = %e, "cannot create the ledger namespace yet");
    }
    let mut caches = Caches::new(&client).await;
    let ctx = Arc::new(caches.context(&client, &settings, ops));
    let synced = ctx.clone();
    tokio::spawn(async move {
        synced.wait_for_caches().await;
        synced.ops.mark_caches_synced();
        tracing::info!("watch caches synced");
    });
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let controllers = Controllers::new(&caches, &ctx, &stopped);
    caches.start(&client, &settings);

    let stopping = ctx.clone();
    let stop_on_shutdown = async move {
        shutdown.await;
        stopping.begin_shutdown();
        let _ = stop.send(true);
    };
    tracing::info!(namespace = ?settings.namespace, watch_filter = ?settings.watch_filter, groups = ?settings.groups, "controllers started");
    future::join(controllers.run(&ctx), stop_on_shutdown).await;
}

/// Every controller's settings: concurrency and debounce, stopping with the process, and a
/// reconcile of every object when this process becomes the leader (it skipped them before).
fn configure<K>(
    controller: Controller<K>,
    config: &ControllerConfig,
    stopped: &tokio::sync::watch::Receiver<bool>,
    ctx: &Context,
) -> Controller<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let mut stopped = stopped.clone();
    controller
        .with_config(config.clone())
        .reconcile_all_on(ctx.ops.leadership.gained())
        .graceful_shutdown_on(async move {
            let _ = stopped.wait_for(|s| *s).await;
        })
}

/// Runs a controller to its end (shutdown); failed reconciles were logged by [`error_policy`].
async fn drive<K: Resource>(
    results: impl futures::Stream<
        Item = Result<
            (ObjectRef<K>, Action),
            kube::runtime::controller::Error<Error, watcher::Error>,
        >,
    >,
) {
    results
        .for_each(|result| {
            if let Err(e) = result {
                tracing::debug!(error = %e, "controller event");
            }
            future::ready(())
        })
        .await;
}

/// The Metal3 IPPool a proxy claim works for: the pool of the IPClaim that owns it.
fn proxied_for(ctx: &Context, claim: &IPAddressClaim) -> Option<PoolKey> {
    let owner = claim
        .meta()
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "IPClaim")?;
    let ipclaim = ctx
        .ipclaims
        .get(&ObjectRef::new(&owner.name).within(claim.meta().namespace.as_deref()?))?;
    PoolKey::of_ipclaim(&ipclaim)
}

/// Maps a changed pool (of any kind) to the pools in `store` whose addresses meet its own.
fn meeting<P, X>(store: &Store<P>) -> impl Fn(Arc<X>) -> Vec<ObjectRef<P>> + Send + Sync + 'static
where
    P: PoolDialect,
    X: PoolDialect,
{
    let store = store.clone();
    move |changed: Arc<X>| {
        let Some(covered) = changed.covered() else {
            return Vec::new();
        };
        let key = changed.key();
        pool::covered_pools(&store)
            .filter(|(other, theirs)| *other != key && theirs.meets(&covered).is_some())
            .filter_map(|(other, _)| other.object_ref::<P>())
            .collect()
    }
}

/// A controller for one pool kind, triggered by its pools, the claims and address objects of
/// either API that name a pool of that kind, and the Clusters of those claims and pools (for
/// pause and unpause).
fn pool_controller<P>(
    pools: &Shared<P>,
    caches: &Caches,
    ctx: &Arc<Context>,
) -> Option<Controller<P>>
where
    P: PoolDialect,
    ObjectRef<P>: Hash + Eq,
{
    let (for_claims, for_addresses) = (ctx.clone(), ctx.clone());
    let mut controller = Controller::for_shared_stream(pools.subscribe()?, pools.store.clone())
        .watches_shared_stream(caches.claims.subscribe()?, move |claim| {
            let proxied_for = proxied_for(&for_claims, &claim);
            PoolKey::of_claim(&claim)
                .into_iter()
                .chain(proxied_for)
                .filter_map(|k| k.object_ref::<P>())
                .collect::<Vec<_>>()
        })
        .watches_shared_stream(caches.addresses.subscribe()?, move |address| {
            let claim = address.meta().namespace.as_ref().and_then(|ns| {
                for_addresses
                    .claims
                    .get(&ObjectRef::new(&address.spec.claim_ref.name).within(ns))
            });
            PoolKey::of_address(&address)
                .into_iter()
                .chain(claim.and_then(|c| proxied_for(&for_addresses, &c)))
                .filter_map(|k| k.object_ref::<P>())
                .collect::<Vec<_>>()
        })
        .watches_shared_stream(caches.ipclaims.subscribe()?, |claim| {
            PoolKey::of_ipclaim(&claim).and_then(|k| k.object_ref::<P>())
        })
        .watches_shared_stream(caches.metal3_addresses.subscribe()?, |address| {
            PoolKey::of_metal3_address(&address).and_then(|k| k.object_ref::<P>())
        })
        // A pool of any kind that comes, changes or goes: the pools it meets say so.
        .watches_shared_stream(caches.pools.subscribe()?, meeting(&pools.store))
        .watches_shared_stream(caches.global_pools.subscribe()?, meeting(&pools.store))
        .watches_shared_stream(caches.prefix_pools.subscribe()?, meeting(&pools.store))
        .watches_shared_stream(
            caches.global_prefix_pools.subscribe()?,
            meeting(&pools.store),
        )
        .watches_shared_stream(caches.ippools.subscribe()?, meeting(&pools.store));
    if let Some(clusters) = &caches.clusters {
        let ctx = ctx.clone();
        controller = controller.watches_shared_stream(clusters.subscribe()?, move |cluster| {
            let namespace = cluster.meta().namespace.clone();
            let name = cluster.meta().name.clone();
            let of_claims = ctx
                .claims
                .state()
                .into_iter()
                .filter(|c| {
                    c.meta().namespace == namespace
                        && objects::cluster_name(c.spec.cluster_name.as_deref(), c.meta())
                            == name.as_deref()
                })
                .filter_map(|c| PoolKey::of_claim(&c));
            let of_pools = ctx
                .ippools
                .state()
                .into_iter()
                .filter(|p| p.meta().namespace == namespace && p.spec.cluster_name == name)
                .filter_map(|p| {
                    Some(PoolKey {
                        kind: "IPPool".into(),
                        namespace: p.meta().namespace.clone(),
                        name: p.meta().name.clone()?,
                    })
                });
            of_claims
                .chain(of_pools)
                .filter_map(|k| k.object_ref::<P>())
                .collect::<Vec<_>>()
        });
    }
    Some(controller)
}
