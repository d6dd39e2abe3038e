//! Read: the pool's claims (from the caches, oldest first, new ones given their finalizer) and
//! their address objects, and what a stale cache must not decide alone, read from the server:
//! objects of claims the cache shows none for, and objects whose claim may be gone.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

use super::{AddressIndex, BATCH, ClaimKey, Sight, address_key, claim_key, in_parallel, usable};
use crate::api::capi::IPAddressClaim;
use crate::ipam::Context;
use crate::ipam::dialect::{PoolDialect, fresh_pool_addresses};
use crate::ipam::kinds::{AnyAddress, AnyClaim, ClaimKind, FetchError, Outcome};
use crate::ipam::ledger::Session;
use crate::ipam::ledger::intent::Refusal;
use crate::ipam::moving;
use crate::ipam::tenancy::{self, Tenancy};
use crate::runtime::cached::ClaimObject;
use crate::runtime::error::Error;
use crate::runtime::objects::{self, FinalizerPatch};

/// The claim `namespace/name` of `kind` as the caches hold it, whichever pool it names: a look-up
/// of the few claims a reconcile asks about, where a map of the pool's every claim would be
/// built and dropped each time.
pub(super) fn cached_claim(
    ctx: &Context,
    kind: ClaimKind,
    namespace: &str,
    name: &str,
) -> Option<AnyClaim> {
    let cache = match kind {
        ClaimKind::Capi => &ctx.claims,
        ClaimKind::Metal3 => &ctx.ipclaims,
    };
    cache.get(namespace, name).map(AnyClaim::from)
}

/// Whether a claim may be acted on now: not paused, and its Cluster (if it names one) neither
/// paused nor, for a live claim, missing.
pub(super) fn claim_may_proceed(claim: &AnyClaim, ctx: &Context) -> bool {
    if claim.paused() {
        return false;
    }
    let (Some(cluster), Some(clusters)) = (claim.cluster_name(), &ctx.clusters) else {
        return true; // no Cluster named, or no Cluster API core installed
    };
    match clusters.get(&ObjectRef::new(cluster).within(&claim.namespace())) {
        Some(c) => !objects::cluster_is_paused(&c),
        // The contract: wait for the Cluster, but let deletions proceed without it.
        None => claim.deleting(),
    }
}

/// What one reconcile reads before it decides anything.
pub(super) struct Observed {
    pub(super) claims: Selected,
    /// The pool's address objects in the cache, by claim (one each: see [`index_by_claim`]).
    pub(super) addresses: AddressIndex,
    /// Claims' second objects.
    pub(super) extras: Vec<AnyAddress>,
    /// Which address object each claim's status names.
    pub(super) named: HashMap<ClaimKey, Arc<str>>,
    /// Objects of live claims the cache shows none usable for, read from the server by the
    /// names their status or this process's memory give.
    pub(super) known: AddressIndex,
    /// Objects of deleting claims the cache shows none for, read from the server.
    pub(super) fresh: Option<AddressIndex>,
    /// Objects whose claim is gone, checked on the server.
    pub(super) orphaned: Vec<AnyAddress>,
    pub(super) sight: Sight,
    /// The namespaces of live claims the pool's `namespaceSelector` leaves out, and the
    /// selector as people read it.
    pub(super) outside: Option<Outside>,
}

/// Claims' namespaces a pool does not serve.
pub(super) struct Outside {
    pub(super) selector: String,
    pub(super) namespaces: HashSet<Arc<str>>,
}

/// The namespaces of `claims` that `pool`'s tenancy leaves out; `None` when it serves every
/// namespace (or its selector is invalid: then it serves nothing at all). A namespace the cache
/// does not hold yet is left out until it does (its arrival triggers the pool again).
pub(super) fn outside<P: PoolDialect>(
    pool: &P,
    ctx: &Context,
    claims: &Selected,
) -> Option<Outside> {
    let tenancy = pool.tenancy().ok()?;
    if tenancy == Tenancy::Everyone {
        return None;
    }
    // Each namespace judged once, however many claims it has.
    let mut namespaces: HashSet<Arc<str>> = claims
        .live
        .iter()
        .map(|c| c.meta.namespace().clone())
        .collect();
    namespaces.retain(|ns| {
        !ctx.namespace(ns)
            .is_some_and(|n| tenancy.admits(tenancy::labels(&n)))
    });
    Some(Outside {
        selector: tenancy.describe(),
        namespaces,
    })
}

/// Reads the pool's claims and address objects: from the caches, and from the server where a
/// lagging cache could make the plan allocate twice or finish a claim too early. `None` when
/// there is nothing to do before the address objects are listed.
pub(super) async fn observe<P: PoolDialect>(
    pool: &P,
    ctx: &Arc<Context>,
    deleting: bool,
    sight: Sight,
) -> Result<Option<Observed>, Error> {
    match sight {
        Sight::Listed => observe_listed(pool, ctx, deleting).await.map(Some),
        Sight::Unlisted | Sight::Arriving => observe_unlisted(pool, ctx, sight).await,
    }
}

/// Whether the pool may serve claims before its address objects are listed: its objects are
/// named after their claims, and it is neither being deleted nor moving (which read them).
pub(super) fn may_serve_unlisted<P: PoolDialect>(pool: &P) -> bool {
    P::OBJECTS_NAMED_AFTER_CLAIMS
        && pool.meta().deletion_timestamp.is_none()
        && !moving::under_way(pool.meta())
}

/// Before the address objects are listed: the live claims whose status names no object (of
/// those that arrived since the process began to watch, before the claims are listed too), if
/// there are any and the pool's ledger is whole and unfenced (a record that may lack something
/// is repaired from the objects, which are not there yet).
async fn observe_unlisted<P: PoolDialect>(
    pool: &P,
    ctx: &Arc<Context>,
    sight: Sight,
) -> Result<Option<Observed>, Error> {
    let candidates = match sight {
        Sight::Arriving => pool.arriving_claims(ctx),
        Sight::Listed | Sight::Unlisted => pool.claims(ctx),
    };
    // Chosen before they are sorted: a restarted pool may have 100,000 claims, nearly all served.
    let unserved = |c: &AnyClaim| !c.deleting() && c.status_address().is_none();
    let mut unserved: Vec<AnyClaim> = candidates.into_iter().filter(unserved).collect();
    if sight == Sight::Arriving && !unserved.is_empty() {
        unserved = arrived_as_they_are(pool, ctx, unserved).await;
    }
    if unserved.is_empty() {
        return Ok(None);
    }
    // The ledger before the finalizers: claims are served in the order of their versions, which
    // a finalizer patch changes, and patched in parallel they come out in any order. A reconcile
    // that adds them must go on to serve the claims in the order they were made.
    let stored = Session::open(pool, ctx, None).read(false).await?;
    if !stored.is_some_and(|s| s.ledger.whole_and_unfenced()) {
        return Ok(None);
    }
    let claims = select_from(pool, ctx, false, unserved).await?;
    if claims.live.is_empty() {
        return Ok(None);
    }
    let outside = outside(pool, ctx, &claims);
    Ok(Some(Observed {
        claims,
        addresses: AddressIndex::new(),
        extras: Vec::new(),
        named: HashMap::new(),
        known: AddressIndex::new(),
        fresh: None,
        orphaned: Vec::new(),
        sight,
        outside,
    }))
}

/// Those of `arrived` that the server still shows live and unserved, as it shows them. The
/// changes may be followed from well before now (where the last process left them,
/// [`crate::runtime::resume`]): a claim first seen as made may have been served since, in a
/// change still on its way. Read once each, only for the claims about to be served early.
async fn arrived_as_they_are<P: PoolDialect>(
    pool: &P,
    ctx: &Arc<Context>,
    arrived: Vec<AnyClaim>,
) -> Vec<AnyClaim> {
    let key = pool.key();
    let reads = in_parallel(arrived, |claim| async move {
        let api: Api<IPAddressClaim> = Api::namespaced(ctx.client.clone(), claim.meta.namespace());
        match api.get_opt(&claim.meta.name).await {
            Ok(found) => found.as_ref().and_then(ClaimObject::of_capi),
            Err(e) => {
                tracing::debug!(claim = %claim.meta.name, error = %e,
                    "cannot read an arrived claim: it waits for the list");
                None
            }
        }
    })
    .await;
    (reads.into_iter().flatten())
        .map(|claim| AnyClaim::from(Arc::new(claim)))
        .filter(|c| c.is_of(&key) && !c.deleting() && c.status_address().is_none())
        .collect()
}

/// Everything, with the address objects from the caches.
async fn observe_listed<P: PoolDialect>(
    pool: &P,
    ctx: &Arc<Context>,
    deleting: bool,
) -> Result<Observed, Error> {
    let claims = select_claims(pool, ctx, deleting).await?;
    let named: HashMap<ClaimKey, Arc<str>> = claims
        .live
        .iter()
        .chain(&claims.releasing)
        .filter_map(|c| Some((claim_key(c), c.status_address()?.clone())))
        .collect();
    let (addresses, extras) = index_by_claim(pool.addresses(ctx, None), &named);
    // A lagging watch may not show an object a claim already has: its status names it, or
    // this process just created it. Those are read before anything is allocated.
    let unserved: Vec<AnyClaim> = claims
        .live
        .iter()
        .filter(|c| {
            let cached = addresses.get(&claim_key(c));
            !cached.is_some_and(|object| usable(pool, c, object))
        })
        .cloned()
        .collect();
    let known = known_objects_of(pool, ctx, &unserved).await?;
    // A stale cache may miss a just-created object of a deleting claim: ask before finishing it.
    let missing: Vec<AnyClaim> = claims
        .releasing
        .iter()
        .filter(|c| !addresses.contains_key(&claim_key(c)))
        .cloned()
        .collect();
    let fresh = match missing.is_empty() {
        true => None,
        false => Some(fresh_objects_of(pool, ctx, missing).await?),
    };
    let orphaned = orphaned_objects(ctx, &addresses).await?;
    let outside = outside(pool, ctx, &claims);
    Ok(Observed {
        claims,
        addresses,
        extras,
        named,
        known,
        fresh,
        orphaned,
        sight: Sight::Listed,
        outside,
    })
}

pub(super) struct Selected {
    /// Live claims with the finalizer, ready to be served.
    pub(super) live: Vec<AnyClaim>,
    /// Deleting claims whose release may proceed now.
    pub(super) releasing: Vec<AnyClaim>,
    /// Earliest end of an address-reuse grace period still running.
    pub(super) grace_wait: Option<Duration>,
    /// Some claims were left for the next batch, or changed under a finalizer patch: reconcile
    /// again at once.
    pub(super) again: bool,
}

/// When a claim was created, as precisely as the API server says: its creation second, then
/// the order the server recorded claims in (`resourceVersion`, an etcd revision here). For a
/// claim not yet changed since its creation, which is every claim still waiting for its first
/// address, that is its creation order, as upstream's single worker sees it; kind, namespace
/// and name break the remaining ties (a version that is not a number sorts after the rest).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Age {
    created: Option<k8s_openapi::jiff::Timestamp>,
    unordered: bool,
    recorded: u64,
    kind: ClaimKind,
    namespace: Arc<str>,
    name: Arc<str>,
}

/// Claims are served oldest first. Sort with `sort_by_cached_key`: a pool's every claim is
/// sorted on each reconcile, and the key parses a number.
pub(crate) fn age(claim: &AnyClaim) -> Age {
    let recorded = claim.meta.resource_version.number();
    Age {
        created: claim.meta.created(),
        unordered: recorded.is_none(),
        recorded: recorded.unwrap_or_default(),
        kind: claim.kind(),
        namespace: claim.meta.namespace().clone(),
        name: claim.meta.name.clone(),
    }
}

/// The pool's claims, oldest first, with finalizers added to new ones.
pub(super) async fn select_claims<P: PoolDialect>(
    pool: &P,
    ctx: &Arc<Context>,
    deleting_pool: bool,
) -> Result<Selected, Error> {
    select_from(pool, ctx, deleting_pool, pool.claims(ctx)).await
}

/// [`select_claims`] of `claims` only.
async fn select_from<P: PoolDialect>(
    pool: &P,
    ctx: &Arc<Context>,
    deleting_pool: bool,
    mut claims: Vec<AnyClaim>,
) -> Result<Selected, Error> {
    // The reuse grace period does not hold up the release of a pool that is being deleted.
    let grace = pool.reuse_grace().filter(|_| !deleting_pool);
    let now = objects::now().0;
    claims.sort_by_cached_key(age);
    let mut selected = Selected {
        live: Vec::new(),
        releasing: Vec::new(),
        grace_wait: None,
        again: false,
    };
    let mut need_finalizer = Vec::new();
    for claim in claims {
        if !claim_may_proceed(&claim, ctx) {
            continue;
        }
        let finalizer = P::claim_finalizer(claim.kind());
        match claim.meta.deleted() {
            Some(deleted) => {
                if !claim.meta.has_finalizer(finalizer) {
                    continue;
                }
                let elapsed = objects::elapsed(deleted.0, now);
                match grace.filter(|g| *g > elapsed) {
                    Some(g) => {
                        let wait = g - elapsed;
                        selected.grace_wait =
                            Some(selected.grace_wait.map_or(wait, |w| w.min(wait)));
                    }
                    None if selected.releasing.len() < BATCH => selected.releasing.push(claim),
                    None => selected.again = true,
                }
            }
            None if claim.meta.has_finalizer(finalizer) => selected.live.push(claim),
            None if need_finalizer.len() < BATCH => need_finalizer.push(claim),
            None => selected.again = true,
        }
    }
    for (claim, patched) in add_claim_finalizers::<P>(ctx, need_finalizer).await? {
        match patched {
            FinalizerPatch::Done => selected.live.push(claim),
            // Changed since the cache saw it: its watch event may already have been handled.
            FinalizerPatch::Stale => selected.again = true,
        }
    }
    // Oldest first: the finalizer patches above complete in any order.
    selected.live.sort_by_cached_key(age);
    Ok(selected)
}

/// Adds the pool kind's claim finalizer to each of `claims`, in parallel.
pub(super) async fn add_claim_finalizers<P: PoolDialect>(
    ctx: &Arc<Context>,
    claims: Vec<AnyClaim>,
) -> Result<Vec<(AnyClaim, FinalizerPatch)>, Error> {
    let added = in_parallel(claims, |claim| {
        let ctx = ctx.clone();
        async move {
            let result = claim
                .set_finalizer(&ctx, P::claim_finalizer(claim.kind()), true)
                .await;
            (claim, result)
        }
    })
    .await;
    added
        .into_iter()
        .map(|(claim, result)| Ok((claim, result?)))
        .collect()
}

/// A paused pool serves and releases nothing, but still protects every live claim it has seen
/// with its finalizer (as upstream does before it looks at the pause): a claim deleted while
/// the pool is paused then waits for the pool instead of vanishing with its address held.
/// Claims it has not served say why they wait.
pub(super) async fn protect_claims<P: PoolDialect>(
    pool: &P,
    ctx: &Arc<Context>,
) -> Result<Action, Error> {
    let told = tell_paused(pool, ctx).await?;
    let unprotected: Vec<AnyClaim> = pool
        .claims(ctx)
        .into_iter()
        .filter(|c| {
            !c.deleting()
                && !c.meta.has_finalizer(P::claim_finalizer(c.kind()))
                && claim_may_proceed(c, ctx)
        })
        .take(BATCH)
        .collect();
    let protected = unprotected.len();
    let stale = add_claim_finalizers::<P>(ctx, unprotected)
        .await?
        .iter()
        .any(|(_, patched)| *patched == FinalizerPatch::Stale);
    tracing::debug!(pool = %pool.key().describe(), told, protected, "paused pool: its claims wait");
    Ok(match stale {
        true => Action::requeue(Duration::from_millis(200)),
        false => Action::await_change(),
    })
}

/// Writes "the pool is paused" on each live claim of the pool that has no address (a claim
/// that already says so is not written again); how many claims were told.
async fn tell_paused<P: PoolDialect>(pool: &P, ctx: &Arc<Context>) -> Result<usize, Error> {
    let paused = Outcome::Refused {
        refusal: Refusal::Paused,
        pool: pool.key().describe(),
        spec_error: None,
    };
    let waiting = pool
        .claims(ctx)
        .into_iter()
        .filter(|c| !c.deleting() && c.status_address_name().is_none())
        .filter(|c| claim_may_proceed(c, ctx))
        .take(BATCH);
    let mut told = 0;
    for claim in waiting {
        claim.write_status(ctx, &paused).await?;
        told += 1;
    }
    Ok(told)
}

pub(super) fn index_addresses(addresses: Vec<AnyAddress>) -> AddressIndex {
    index_by_claim(addresses, &HashMap::new()).0
}

/// The address objects by claim, and the claims' second objects. A Metal3 pool names its
/// objects after the address, so nothing but bitpool stops a claim from getting two (a watch
/// that lagged, a crash between a create and the status naming it): the claim keeps the one
/// its status names (`named`: claim → object name), else the oldest; the others are extras.
pub(super) fn index_by_claim(
    addresses: Vec<AnyAddress>,
    named: &HashMap<ClaimKey, Arc<str>>,
) -> (AddressIndex, Vec<AnyAddress>) {
    let rank = |a: &AnyAddress| {
        let is_named = named.get(&address_key(a)) == Some(&a.meta.name);
        let created = a.meta.created();
        (!is_named, created, a.meta.name.clone())
    };
    // One pass: ranks are compared only where a claim has two objects, which is rare.
    let mut index = AddressIndex::with_capacity(addresses.len());
    let mut extras = Vec::new();
    for address in addresses {
        match index.entry(address_key(&address)) {
            std::collections::hash_map::Entry::Occupied(mut kept) => {
                if rank(&address) < rank(kept.get()) {
                    extras.push(kept.insert(address));
                } else {
                    extras.push(address);
                }
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(address);
            }
        }
    }
    extras.sort_by_cached_key(rank);
    (index, extras)
}

/// The address objects of `claims` whose names are known without the cache (their status, or
/// this process's memory of what it created), read from the server; only objects of this pool
/// and of that claim count.
pub(super) async fn known_objects_of<P: PoolDialect>(
    pool: &P,
    ctx: &Context,
    claims: &[AnyClaim],
) -> Result<AddressIndex, Error> {
    let known: Vec<(AnyClaim, String)> = claims
        .iter()
        .filter_map(|claim| {
            let uid = claim.uid()?;
            let name = claim
                .status_address_name()
                .or_else(|| ctx.recently_created_address(&uid))?;
            Some((claim.clone(), name))
        })
        .collect();
    if known.is_empty() {
        return Ok(AddressIndex::new());
    }
    let key = pool.key();
    let read = in_parallel(known, |(claim, name)| async move {
        let found = claim.fetch_address_named(ctx, &name).await;
        (claim_key(&claim), found)
    })
    .await;
    let mut index = AddressIndex::new();
    for (claim, found) in read {
        if let Some(object) = found?
            && object.pool_key().as_ref() == Some(&key)
            && address_key(&object) == claim
        {
            index.insert(claim, object);
        }
    }
    Ok(index)
}

/// The address objects of `claims` read from the server: each by its name, in parallel, or when
/// a name is not known, every object of the pool (a list: the exception).
pub(super) async fn fresh_objects_of<P: PoolDialect>(
    pool: &P,
    ctx: &Context,
    claims: Vec<AnyClaim>,
) -> Result<AddressIndex, Error> {
    let key = pool.key();
    let read = in_parallel(
        claims,
        |claim| async move { claim.fetch_address(ctx).await },
    )
    .await;
    let mut found = Vec::new();
    for result in read {
        match result {
            Ok(address) => found.extend(address),
            Err(FetchError::Api(e)) => return Err(e),
            Err(FetchError::NameUnknown) => {
                return Ok(index_addresses(fresh_pool_addresses(pool, ctx).await?));
            }
        }
    }
    // Only objects of this pool count (a name may be taken by another pool's object).
    found.retain(|a| a.pool_key().as_ref() == Some(&key));
    Ok(index_addresses(found))
}

/// Address objects of the pool whose claim is gone (checked on the server, at most a batch at a
/// time, in parallel): left behind by a crash between a claim's release and its address object's
/// deletion, or created from a stale view of a claim that was being deleted.
pub(super) async fn orphaned_objects(
    ctx: &Context,
    addresses: &AddressIndex,
) -> Result<Vec<AnyAddress>, Error> {
    let suspects: Vec<(ClaimKey, AnyAddress)> = addresses
        .iter()
        .filter(|(key, address)| {
            let owner = address.claim_uid();
            // Not cached, or cached with another UID than the object's owner.
            cached_claim(ctx, key.kind, &key.namespace, &key.name)
                .is_none_or(|claim| owner.is_some_and(|o| *o != claim.meta.uid))
        })
        // Only then the mutex of recent deletions: most objects of a pool have their claim.
        .filter(|(_, address)| !ctx.recently_deleted_address(&address.meta.uid))
        .take(BATCH)
        .map(|(key, address)| (key.clone(), address.clone()))
        .collect();
    let checked = in_parallel(suspects, |(claim, address)| async move {
        let current = AnyClaim::fetch(ctx, claim.kind, &claim.namespace, &claim.name).await;
        (address, current)
    })
    .await;
    let mut orphaned = Vec::new();
    for (address, current) in checked {
        let owner = address.claim_uid();
        let alive = current?.is_some_and(|uid| owner.is_none_or(|o| o.to_string() == uid));
        if !alive {
            orphaned.push(address);
        }
    }
    Ok(orphaned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::metal3_ipam;
    use kube::api::ObjectMeta;

    fn claim(namespace: &str, name: &str, second: i64, version: &str) -> AnyClaim {
        let mut claim = crate::api::capi::IPAddressClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                resource_version: Some(version.into()),
                creation_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::from_second(second).expect("a time"),
                )),
                ..Default::default()
            },
            spec: Default::default(),
            status: None,
        };
        claim.metadata.uid = Some(format!("{namespace}/{name}"));
        AnyClaim::capi(&claim).expect("named and namespaced")
    }

    /// Within one second, claims are served in the order the server recorded them, whatever
    /// their namespaces and names; an older second always goes first.
    #[test]
    fn claims_are_served_in_creation_order() {
        let cases = [
            // (namespace, name, creation second, resourceVersion), in the expected order.
            vec![
                ("ns-z", "test", 10, "100"),
                ("ns-a", "test-second", 10, "101"),
            ],
            vec![("b", "later-name", 10, "9"), ("a", "a", 10, "10")],
            vec![("z", "z", 9, "500"), ("a", "a", 10, "100")],
            vec![("a", "a", 10, "7"), ("a", "b", 10, "not-a-number")],
        ];
        for expected in cases {
            let mut claims: Vec<AnyClaim> = expected
                .iter()
                .rev()
                .map(|(ns, name, second, version)| claim(ns, name, *second, version))
                .collect();
            claims.sort_by_cached_key(age);
            let order: Vec<String> = claims.iter().map(AnyClaim::name).collect();
            let want: Vec<String> = expected.iter().map(|(_, n, _, _)| n.to_string()).collect();
            assert_eq!(order, want);
        }
    }

    fn metal3_object(claim: &str, ip: &str, second: i64) -> AnyAddress {
        let reference = |name: &str| k8s_openapi::api::core::v1::ObjectReference {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            ..Default::default()
        };
        AnyAddress::metal3(&metal3_ipam::Metal3IPAddress {
            metadata: ObjectMeta {
                name: Some(format!("p-{}", ip.replace('.', "-"))),
                namespace: Some("ns".into()),
                creation_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::from_second(second).expect("a time"),
                )),
                ..Default::default()
            },
            spec: metal3_ipam::Metal3IPAddressSpec {
                claim: reference(claim),
                pool: reference("p"),
                address: ip.into(),
                prefix: None,
                gateway: None,
                dns_servers: Vec::new(),
            },
        })
        .expect("a named, namespaced object")
    }

    /// A claim with two objects keeps the one its status names, else the oldest; the other is
    /// an extra. One object per claim is no extra, whatever the order.
    #[test]
    fn a_claims_second_object_is_an_extra() {
        let key = |claim: &str| ClaimKey {
            kind: ClaimKind::Metal3,
            namespace: "ns".into(),
            name: claim.into(),
        };
        let objects = || {
            vec![
                metal3_object("c", "10.0.0.2", 20),
                metal3_object("c", "10.0.0.1", 10),
                metal3_object("d", "10.0.0.3", 5),
            ]
        };
        let cases = [
            (
                "no status: the oldest",
                HashMap::new(),
                "p-10-0-0-1",
                "p-10-0-0-2",
            ),
            (
                "the status names the newer",
                HashMap::from([(key("c"), "p-10-0-0-2".into())]),
                "p-10-0-0-2",
                "p-10-0-0-1",
            ),
            (
                "the status names an object that is not there",
                HashMap::from([(key("c"), "p-10-0-0-9".into())]),
                "p-10-0-0-1",
                "p-10-0-0-2",
            ),
        ];
        for (case, named, kept, extra) in cases {
            let (index, extras) = index_by_claim(objects(), &named);
            assert_eq!(index[&key("c")].name(), kept, "{case}");
            assert_eq!(index[&key("d")].name(), "p-10-0-0-3", "{case}");
            let extras: Vec<String> = extras.iter().map(AnyAddress::name).collect();
            assert_eq!(extras, [extra], "{case}");
        }
    }
}
