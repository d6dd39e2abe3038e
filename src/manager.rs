//! The one place that knows every subsystem: it builds the caches and the shared context, the
//! IPAM engine's and the Metal3Data reconciler's controllers on them, and runs them all.

use std::hash::Hash;
use std::sync::Arc;

use futures::future;
use kube::runtime::Controller;
use kube::runtime::controller::Config as ControllerConfig;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource};

use crate::api::capi::{Cluster, IPAddressClaim};
use crate::api::capi_pools::{
    GlobalInClusterIPPool, GlobalInClusterPrefixPool, InClusterIPPool, InClusterPrefixPool,
};
use crate::api::metal3_data::{Metal3Data, Metal3DataClaim, Metal3DataTemplate};
use crate::api::metal3_ipam::{IPClaim, IPPool};
use crate::endpoint;
use crate::ipam::dialect::{PoolDialect, PoolSpace};
use crate::ipam::engine;
use crate::ipam::key::{PoolKey, PoolKind};
use crate::ipam::kinds::{AnyAddress, AnyClaim};
use crate::ipam::{self, claims, ledger, proxy};
use crate::metal3data;
use crate::runtime::cache::{Caches, Removals, Shared};
use crate::runtime::cached::ClaimObject;
use crate::runtime::context::Needs;
use crate::runtime::controller::{Switch, run_controller};
use crate::runtime::index::Index;
use crate::runtime::selection::selection;
use crate::runtime::trigger::{DEBOUNCE, Triggers};
use crate::runtime::{Context, Settings};

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
    endpoints: Option<Controller<Cluster>>,
}

impl Controllers {
    /// Every controller of the groups that are on, subscribed to the caches it reads.
    fn new(
        caches: &Caches,
        ctx: &Arc<Context>,
        stopped: &tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        let config = ControllerConfig::default()
            .debounce(DEBOUNCE)
            .concurrency(ctx.settings.concurrency);
        let groups = ctx.settings.groups;
        let on = Switch {
            config: &config,
            stopped,
            ctx,
        };
        let orphan_claims = orphan_controller(
            &caches.claims.index,
            &caches.pools_removed,
            ctx,
            claims::capi_stand_in,
        );
        let orphan_ipclaims = orphan_controller(
            &caches.ipclaims.index,
            &caches.pools_removed,
            ctx,
            claims::metal3_stand_in,
        );
        let (datas, data_claims) = (&caches.datas, &caches.data_claims);
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
                pool_controller(&caches.ippools, caches, ctx)
                    .and_then(|c| with_proxy_targets(c, caches, ctx)),
            ),
            orphan_claims: on.when(groups.capi_ipam || groups.metal3_ipam, Some(orphan_claims)),
            orphan_ipclaims: on.when(groups.metal3_pools(), Some(orphan_ipclaims)),
            templates: on.when(
                groups.metal3_data,
                metal3data::template_controller(caches, ctx),
            ),
            orphan_data_claims: on.when(
                groups.metal3_data,
                metal3data::orphan_data_claim_controller(data_claims, caches, ctx),
            ),
            datas: on.when(
                groups.metal3_data,
                metal3data::data_controller(datas, data_claims, caches, ctx),
            ),
            endpoints: on.when(
                groups.capi_ipam || groups.metal3_pools(),
                endpoint_controller(caches, ctx),
            ),
        }
    }

    /// Runs them all until they stop (at shutdown): the IPAM engine's on its context, the
    /// Metal3Data reconciler's on the shared one.
    async fn run(self, ctx: &Arc<Context>, ipam_ctx: &Arc<ipam::Context>) {
        // The CAPI pool kinds serve new claims while the claims and address objects are being
        // listed.
        let (early, all) = (Needs::AllButClaimsAndAddresses, Needs::Everything);
        let ipam = future::join5(
            run_controller(self.in_cluster, early, engine::reconcile, ipam_ctx),
            run_controller(self.global, early, engine::reconcile, ipam_ctx),
            run_controller(self.prefix, early, engine::reconcile, ipam_ctx),
            run_controller(self.global_prefix, early, engine::reconcile, ipam_ctx),
            run_controller(self.metal3, all, proxy::reconcile, ipam_ctx),
        );
        let rest = future::join5(
            run_controller(self.orphan_claims, all, claims::reconcile, ipam_ctx),
            run_controller(
                self.orphan_ipclaims,
                all,
                claims::reconcile_ipclaim,
                ipam_ctx,
            ),
            run_controller(self.templates, all, metal3data::template::reconcile, ctx),
            run_controller(self.datas, all, metal3data::data::reconcile, ctx),
            run_controller(
                self.orphan_data_claims,
                all,
                metal3data::template::reconcile_claim,
                ctx,
            ),
        );
        let endpoints = run_controller(self.endpoints, all, endpoint::controller::reconcile, ctx);
        future::join3(ipam, rest, endpoints).await;
    }
}

/// Runs every controller until `shutdown` completes.
pub async fn run(
    client: Client,
    settings: Settings,
    ops: Arc<crate::ops::Ops>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    if let Err(e) = ledger::ensure_namespace(&client, &settings.ledger_namespace).await {
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
    tracing::info!(version = crate::VERSION, commit = crate::COMMIT, namespace = ?settings.namespace, watch_filter = ?settings.watch_filter, groups = ?settings.groups, "controllers started");
    let ipam_ctx = Arc::new(ipam::Context::new(ctx.clone()));
    tokio::spawn(ipam::sweep::run(ipam_ctx.clone()));
    future::join(controllers.run(&ctx, &ipam_ctx), stop_on_shutdown).await;
}

/// A controller of the claims of `index` that may be orphans ([`claims::may_be_orphan`]): its
/// store holds stand-ins for those alone, judged once the caches are complete, and all again
/// when this process becomes the leader or a pool leaves its cache (a claim whose last change
/// came while its pool was there is an orphan now, with no event of its own to say so).
fn orphan_controller<K>(
    index: &Index<ClaimObject>,
    pools_removed: &Removals,
    ctx: &Arc<Context>,
    stand_in: fn(&ClaimObject) -> K,
) -> Controller<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (ready, judged) = (ctx.clone(), ctx.clone());
    let (store, triggers) = selection(
        index,
        async move { ready.wait_for_caches().await },
        futures::stream::select(ctx.ops.leadership.gained(), pools_removed.stream()),
        move |claim| claims::may_be_orphan(&judged, claim),
        stand_in,
    );
    Controller::for_shared_stream(triggers, store)
}

/// The Clusters that name an endpoint pool ([`endpoint`]), triggered by their changes and those
/// of their endpoint claims and the claims' address objects. `None` without Cluster API core.
fn endpoint_controller(caches: &Caches, ctx: &Arc<Context>) -> Option<Controller<Cluster>> {
    let clusters = caches.clusters.as_ref()?;
    let cluster_of = |claim: &ClaimObject| {
        let cluster = endpoint::reference::cluster_of_claim(|key| claim.meta.label(key))?;
        Some(ObjectRef::<Cluster>::new(cluster).within(&claim.meta.namespace))
    };
    let claims = ctx.claims.clone();
    let triggers = Triggers::new()
        .with(
            caches
                .claims
                .index
                .requests(move |claim| cluster_of(&claim)),
        )
        .with(caches.addresses.index.requests(move |address| {
            let claim = claims.get(&address.meta.namespace, &address.claim)?;
            cluster_of(&claim)
        }));
    let controller = Controller::for_shared_stream(clusters.subscribe()?, clusters.store.clone())
        .reconcile_on(triggers.stream());
    Some(controller)
}

/// The Metal3 IPPool a proxy claim works for: the pool of the IPClaim that owns it.
fn proxied_for(ctx: &Context, claim: &ClaimObject) -> Option<PoolKey> {
    let owner = claim.meta.owners.iter().find(|o| &*o.kind == "IPClaim")?;
    let ipclaim = ctx.ipclaims.get(&claim.meta.namespace, &owner.name)?;
    AnyClaim::from(ipclaim).pool_key()
}

/// The Metal3 IPPools' controller, triggered too by the CAPI address pools they proxy to: a
/// proxying pool reports its target's counts, and meets no pool (so `meeting` never names it).
fn with_proxy_targets(
    controller: Controller<IPPool>,
    caches: &Caches,
    ctx: &Arc<Context>,
) -> Option<Controller<IPPool>> {
    Some(
        controller
            .watches_shared_stream(caches.pools.subscribe()?, proxies_of(ctx))
            .watches_shared_stream(caches.global_pools.subscribe()?, proxies_of(ctx)),
    )
}

/// Maps a changed CAPI pool to the Metal3 IPPools whose `spec.poolRef` names it.
fn proxies_of<X: PoolDialect>(
    ctx: &Arc<Context>,
) -> impl Fn(Arc<X>) -> Vec<ObjectRef<IPPool>> + Send + Sync + 'static {
    let ctx = ctx.clone();
    move |changed: Arc<X>| {
        let key = changed.key();
        ctx.ippools
            .state()
            .into_iter()
            .filter(|p| {
                p.spec.pool_ref.as_ref().is_some_and(|target| {
                    target.api_group == crate::api::capi::GROUP
                        && target.kind == key.kind.as_str()
                        && target.name == key.name
                        && (key.namespace.is_none() || key.namespace == p.meta().namespace)
                })
            })
            .map(|p| ObjectRef::from_obj(&*p))
            .collect()
    }
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
        engine::covered_pools(&store)
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
    let triggers = Triggers::new()
        .with(caches.claims.index.requests(move |claim| {
            let proxied_for = proxied_for(&for_claims, &claim);
            AnyClaim::from(claim)
                .pool_key()
                .into_iter()
                .chain(proxied_for)
                .filter_map(|k| k.object_ref::<P>())
                .collect::<Vec<_>>()
        }))
        .with(caches.addresses.index.requests(move |address| {
            let claim = for_addresses
                .claims
                .get(&address.meta.namespace, &address.claim);
            let address = AnyAddress::from(address);
            address
                .pool_key()
                .into_iter()
                .chain(claim.and_then(|c| proxied_for(&for_addresses, &c)))
                .filter_map(|k| k.object_ref::<P>())
                .collect::<Vec<_>>()
        }))
        .with(caches.ipclaims.index.requests(|claim| {
            AnyClaim::from(claim)
                .pool_key()
                .and_then(|k| k.object_ref::<P>())
        }))
        .with(caches.metal3_addresses.index.requests(|address| {
            AnyAddress::from(address)
                .pool_key()
                .and_then(|k| k.object_ref::<P>())
        }));
    let mut controller = Controller::for_shared_stream(pools.subscribe()?, pools.store.clone())
        .reconcile_on(triggers.stream())
        // A pool of any kind that comes, changes or goes: the pools it meets say so.
        .watches_shared_stream(caches.pools.subscribe()?, meeting(&pools.store))
        .watches_shared_stream(caches.global_pools.subscribe()?, meeting(&pools.store))
        .watches_shared_stream(caches.prefix_pools.subscribe()?, meeting(&pools.store))
        .watches_shared_stream(
            caches.global_prefix_pools.subscribe()?,
            meeting(&pools.store),
        )
        .watches_shared_stream(caches.ippools.subscribe()?, meeting(&pools.store));
    // A namespace labelled or unlabelled: the global pools that select namespaces decide again.
    let selecting = ctx.clone();
    controller = controller.watches_shared_stream(caches.namespaces.subscribe()?, move |_| {
        selecting_pools(&selecting)
            .filter_map(|k| k.object_ref::<P>())
            .collect::<Vec<_>>()
    });
    if let Some(clusters) = &caches.clusters {
        let ctx = ctx.clone();
        controller = controller.watches_shared_stream(clusters.subscribe()?, move |cluster| {
            pools_of_cluster(&ctx, &cluster)
                .filter_map(|k| k.object_ref::<P>())
                .collect::<Vec<_>>()
        });
    }
    Some(controller)
}

/// The cluster-scoped pools with a `namespaceSelector`: whom they serve follows namespaces' labels.
fn selecting_pools(ctx: &Context) -> impl Iterator<Item = PoolKey> {
    let global = ctx
        .global_pools
        .state()
        .into_iter()
        .filter(|p| p.spec.namespace_selector.is_some())
        .map(|p| p.key());
    let global_prefix = ctx
        .global_prefix_pools
        .state()
        .into_iter()
        .filter(|p| p.spec.namespace_selector.is_some())
        .map(|p| p.key());
    global.chain(global_prefix).collect::<Vec<_>>().into_iter()
}

/// The pools a Cluster's pause and unpause concern: those its claims name, the namespaced pools
/// of its namespace (a move hands them over), and the Metal3 IPPools that name it.
fn pools_of_cluster(ctx: &Context, cluster: &Cluster) -> impl Iterator<Item = PoolKey> {
    let namespace = cluster.meta().namespace.clone();
    let name = cluster.meta().name.clone();
    let of_claims: Vec<PoolKey> = ctx
        .claims
        .state()
        .into_iter()
        .map(AnyClaim::from)
        .filter(|c| {
            Some(&*c.meta.namespace) == namespace.as_deref() && c.cluster_name() == name.as_deref()
        })
        .filter_map(|c| c.pool_key())
        .collect();
    let of_pools: Vec<PoolKey> = ctx
        .ippools
        .state()
        .into_iter()
        .filter(|p| p.meta().namespace == namespace && p.spec.cluster_name == name)
        .filter_map(|p| {
            Some(PoolKey {
                kind: PoolKind::Metal3IPPool,
                namespace: p.meta().namespace.clone(),
                name: p.meta().name.clone()?,
            })
        })
        .collect();
    of_claims
        .into_iter()
        .chain(of_pools)
        .chain(namespace.map(|ns| pools_in(ctx, &ns)).into_iter().flatten())
}

/// The namespaced pools of `namespace`, of every kind: a move of the namespace pauses its
/// Clusters, and each pool hands its ledger over then ([`ipam::moving`]).
fn pools_in(ctx: &Context, namespace: &str) -> Vec<PoolKey> {
    fn keys<K>(store: &Store<K>, kind: PoolKind, namespace: &str) -> Vec<PoolKey>
    where
        K: kube::Resource<DynamicType = ()> + Clone + 'static,
    {
        store
            .state()
            .iter()
            .filter(|p| p.meta().namespace.as_deref() == Some(namespace))
            .filter_map(|p| {
                Some(PoolKey {
                    kind,
                    namespace: Some(namespace.to_string()),
                    name: p.meta().name.clone()?,
                })
            })
            .collect()
    }
    let mut pools = keys(&ctx.pools, PoolKind::InClusterIPPool, namespace);
    pools.extend(keys(
        &ctx.prefix_pools,
        PoolKind::InClusterPrefixPool,
        namespace,
    ));
    pools.extend(keys(&ctx.ippools, PoolKind::Metal3IPPool, namespace));
    pools
}
