//! What triggers each IPAM controller: a pool kind's controller is woken by its pools, by the
//! claims and address objects that name them (through the migration proxy too), by the pools
//! that meet them, by namespaces' labels and by Clusters' pause; the orphan claims' controllers
//! by pools that go. The wiring place ([`crate::manager`]) builds them; this file alone knows
//! what each listens to.

use std::hash::Hash;
use std::sync::Arc;

use kube::Resource;
use kube::runtime::Controller;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::api::capi::Cluster;
use crate::api::metal3_ipam::IPPool;
use crate::ipam::claims;
use crate::ipam::coverage::Coverage;
use crate::ipam::dialect::{PoolDialect, PoolSpace};
use crate::ipam::key::PoolKey;
use crate::ipam::kinds::{AnyAddress, AnyClaim};
use crate::ipam::tenancy::Tenancy;
use crate::runtime::Context;
use crate::runtime::cache::{Caches, Removals, Shared};
use crate::runtime::cached::ClaimObject;
use crate::runtime::index::Index;
use crate::runtime::selection::selection;
use crate::runtime::trigger::Triggers;

/// A controller of the claims of `index` that may be orphans ([`claims::may_be_orphan`]): its
/// store holds stand-ins for those alone, judged once the caches are complete, and all again
/// when this process becomes the leader or a pool leaves its cache (a claim whose last change
/// came while its pool was there is an orphan now, with no event of its own to say so).
pub(crate) fn orphan_controller<K>(
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

/// The Metal3 IPPool a proxy claim works for: the pool of the IPClaim that owns it.
fn proxied_for(ctx: &Context, claim: &ClaimObject) -> Option<PoolKey> {
    let owner = claim.meta.owners().find(|o| o.kind() == "IPClaim")?;
    let ipclaim = ctx.ipclaims.get(claim.meta.namespace(), &owner.name)?;
    AnyClaim::from(ipclaim).pool_key()
}

/// The Metal3 IPPools' controller, triggered too by the CAPI address pools they proxy to: a
/// proxying pool reports its target's counts, and meets no pool (so `meeting` never names it).
pub(crate) fn with_proxy_targets(
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

/// Maps a changed pool (of any kind) to the pools in `store` whose addresses met it before or
/// meet it now: once per spec, since a status written changes what no pool meets.
fn meeting<P, X>(
    store: &Store<P>,
    coverage: &Arc<Coverage>,
) -> impl Fn(Arc<X>) -> Vec<ObjectRef<P>> + Send + Sync + 'static
where
    P: PoolDialect,
    X: PoolDialect,
{
    let (store, coverage) = (store.clone(), coverage.clone());
    move |changed: Arc<X>| {
        let Some(change) = coverage.change_for(P::KIND, &*changed) else {
            return Vec::new();
        };
        let key = changed.key();
        (coverage.pools_of(&store).into_iter())
            .filter(|(other, theirs)| *other != key && change.concerns(theirs))
            .filter_map(|(other, _)| other.object_ref::<P>())
            .collect()
    }
}

/// A controller for one pool kind, triggered by its pools, the claims and address objects of
/// either API that name a pool of that kind, and the Clusters of those claims and pools (for
/// pause and unpause).
pub(crate) fn pool_controller<P>(
    pools: &Shared<P>,
    caches: &Caches,
    ctx: &Arc<Context>,
    coverage: &Arc<Coverage>,
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
                .get(address.meta.namespace(), &address.claim);
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
        .watches_shared_stream(caches.pools.subscribe()?, meeting(&pools.store, coverage))
        .watches_shared_stream(
            caches.global_pools.subscribe()?,
            meeting(&pools.store, coverage),
        )
        .watches_shared_stream(
            caches.prefix_pools.subscribe()?,
            meeting(&pools.store, coverage),
        )
        .watches_shared_stream(
            caches.global_prefix_pools.subscribe()?,
            meeting(&pools.store, coverage),
        )
        .watches_shared_stream(caches.ippools.subscribe()?, meeting(&pools.store, coverage));
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

/// The cluster-scoped pools whose `namespaceSelector` leaves some namespaces out (or cannot be
/// read): whom they serve follows namespaces' labels.
fn selecting_pools(ctx: &Context) -> impl Iterator<Item = PoolKey> {
    fn selecting<P: PoolSpace>(store: &Store<P>) -> Vec<PoolKey> {
        (store.state().iter())
            .filter(|p| p.tenancy() != Ok(Tenancy::Everyone))
            .map(|p| p.key())
            .collect()
    }
    let mut pools = selecting(&ctx.global_pools);
    pools.extend(selecting(&ctx.global_prefix_pools));
    pools.into_iter()
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
            Some(&**c.meta.namespace()) == namespace.as_deref()
                && c.cluster_name() == name.as_deref()
        })
        .filter_map(|c| c.pool_key())
        .collect();
    let of_pools: Vec<PoolKey> = (ctx.ippools.state().iter())
        .filter(|p| p.meta().namespace == namespace && p.spec.cluster_name == name)
        .map(|p| p.key())
        .collect();
    of_claims
        .into_iter()
        .chain(of_pools)
        .chain(namespace.map(|ns| pools_in(ctx, &ns)).into_iter().flatten())
}

/// The namespaced pools of `namespace`, of every kind: a move of the namespace pauses its
/// Clusters, and each pool hands its ledger over then ([`crate::ipam::moving`]).
fn pools_in(ctx: &Context, namespace: &str) -> Vec<PoolKey> {
    fn keys<P: PoolSpace>(store: &Store<P>, namespace: &str) -> Vec<PoolKey> {
        (store.state().iter())
            .filter(|p| p.meta().namespace.as_deref() == Some(namespace))
            .map(|p| p.key())
            .collect()
    }
    let mut pools = keys(&ctx.pools, namespace);
    pools.extend(keys(&ctx.prefix_pools, namespace));
    pools.extend(keys(&ctx.ippools, namespace));
    pools
}
