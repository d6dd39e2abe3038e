//! The pool engine: one reconcile per pool, whatever its dialect, serving all of the pool's
//! claims in a batch:
//! 1. dereference: the pool, its claims and their address objects (from the watch caches);
//! 2. finalizers on new claims;
//! 3. one ledger transaction: allocate for claims without an address, bind addresses that are
//!    about to lose their object, confirm and release (see [`super::ledger`]);
//! 4. apply: create and delete address objects;
//! 5. a second transaction confirming what was created and freeing what was deleted;
//! 6. claim and pool status.
//!
//! What differs between the in-cluster provider's pools and Metal3's IPPool is the
//! [`PoolDialect`]; the engine, the ledger and the allocation core are shared.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Debug;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Context;
use super::duplicates::{self, SharedAddress};
use super::intent::{self, Found, Intent, Refusal, Request};
use super::key::{PoolKey, PoolKind};
use super::kinds::{AnyAddress, AnyClaim, ClaimKind, Created, FetchError, NewAddress, Outcome};
use super::ledger::{self, Ledger, LedgerRef};
use super::overlaps::{self, Covered, Overlap};
use super::transaction;
use crate::alloc::{self, AddressSpace, Lease};
use crate::api::{capi, metal3_ipam};
use crate::ops::events::Reason;
use crate::runtime::error::{Call, Error, Verb};
use crate::runtime::objects::{self, FinalizerPatch};

/// How many API calls of one kind a reconcile runs at once.
const PARALLEL_CALLS: usize = 16;
/// How many claims one reconcile allocates for, and how many it releases: a backlog of any
/// size is served in batches, each committed at once and followed by the next without waiting.
const BATCH: usize = 500;
/// How long an address with neither reservation nor object must stay so before a fresh list
/// decides it is leaked (an address object removed by force, or a crash mid-release).
const ORPHAN_GRACE: Duration = Duration::from_secs(30);
/// Re-check of a pool whose claims wait for a free address.
const EXHAUSTED_RECHECK: Duration = Duration::from_secs(30);

/// What a pool's status reports, taken from its address space after a transaction.
pub struct Usage {
    pub counts: alloc::Counts,
    /// A few of the allocated addresses the pool no longer contains.
    pub outside: Vec<IpAddr>,
}

impl Usage {
    pub fn of(space: &AddressSpace) -> Self {
        let counts = space.counts();
        let outside = if counts.out_of_range > 0 {
            space
                .used_addresses()
                .filter(|a| !space.contains(*a))
                .take(5)
                .collect()
        } else {
            Vec::new()
        };
        Self { counts, outside }
    }
}

/// Everything a pool's status is written from.
pub struct Report<'a> {
    pub usage: Option<&'a Usage>,
    pub ledger: &'a Ledger,
    pub spec_error: Option<&'a str>,
    /// Claim name → address, for the claims that hold one.
    pub holders: &'a BTreeMap<(ClaimKind, String), IpAddr>,
    /// Addresses the pool's objects hold for more than one claim.
    pub shared: &'a [SharedAddress],
    /// Other pools whose addresses meet this one's.
    pub overlaps: &'a [Overlap],
}

/// What a pool kind brings to the engine. Everything here is synchronous and pure over the
/// pool and the caches; the engine does the I/O.
pub trait PoolDialect:
    Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Serialize + Send + Sync + 'static
{
    const FINALIZER: &'static str;
    const KIND: PoolKind;
    /// The address kinds this pool's addresses can be of. Only Metal3 IPPools hold Metal3
    /// IPAddresses, and a cluster that runs no Metal3 controller need not have their CRD.
    const ADDRESS_KINDS: AddressKinds = AddressKinds::Capi;

    fn key(&self) -> PoolKey {
        PoolKey {
            kind: Self::KIND,
            namespace: self.namespace(),
            name: self.name_any(),
        }
    }
    /// An API through which this very object is read and patched.
    fn api_for(&self, client: Client) -> Api<Self>;
    /// Where the pool's ledger lives: beside a namespaced pool, in the ledger namespace for a
    /// cluster-scoped one.
    fn ledger_namespace(&self, ctx: &Context) -> String {
        self.namespace()
            .unwrap_or_else(|| ctx.settings.ledger_namespace.clone())
    }
    /// What the pool's ledger is written for: the pool's UID, and for a pool whose space
    /// numbers something other than addresses, what gives the numbers their meaning.
    fn ledger_identity(&self) -> String {
        self.uid().unwrap_or_default()
    }
    /// The pool's address space, or why its spec is invalid.
    fn space(&self) -> Result<AddressSpace, String>;
    /// The addresses the pool hands out (none when its spec is invalid).
    fn covered(&self) -> Option<Covered> {
        self.space().ok().map(|space| Covered::of_space(&space))
    }
    /// What an address object holds, as the pool's space numbers it (the address itself,
    /// except in prefix pools).
    fn held(&self, address: &AnyAddress) -> Option<IpAddr> {
        address.ip()
    }
    /// A held address as people read it, in messages and events.
    fn show(&self, held: IpAddr) -> String {
        held.to_string()
    }
    /// The address `claim` asks for (its `ipAddress` annotation) in the space's terms, or why it
    /// names nothing the pool could hand out.
    fn requested(&self, claim: &AnyClaim) -> Result<Option<String>, alloc::AllocError> {
        Ok(claim.requested())
    }
    /// A refusal as people read it (addresses in the pool's own terms).
    fn explain(&self, refusal: Refusal) -> Refusal {
        refusal
    }
    /// How long a released address stays reserved.
    fn reuse_grace(&self) -> Option<Duration> {
        None
    }
    /// Whether the pool is paused beyond its own annotation (Metal3: its Cluster).
    fn paused_by_cluster(&self, _ctx: &Context) -> bool {
        false
    }
    /// A metadata patch the pool needs (labels and owners for its Cluster), if any.
    fn metadata_patch(&self, _ctx: &Context) -> Option<serde_json::Value> {
        None
    }
    /// The claims naming this pool.
    fn claims(&self, ctx: &Context) -> Vec<AnyClaim>;
    /// The claim finalizer, per claim kind.
    fn claim_finalizer(kind: ClaimKind) -> &'static str;
    /// The address finalizer, per claim kind.
    fn address_finalizer(kind: ClaimKind) -> &'static str;
    /// The pool's address objects, from the caches or `fresh` (read from the server).
    fn addresses(&self, ctx: &Context, fresh: Option<&FreshAddresses>) -> Vec<AnyAddress>;
    /// The address object `claim` gets for `lease`, or why none can be written.
    fn new_address(&self, claim: &AnyClaim, lease: &Lease) -> Result<NewAddress, String>;
    /// Why no address object of `family` could be written for `claim` (an invalid name), found
    /// before an address is allocated for it.
    fn address_name_problem(&self, _claim: &AnyClaim, _family: alloc::Family) -> Option<String> {
        None
    }
    /// The `preAllocations` key that names `claim`.
    fn preallocation_key(&self, claim: &AnyClaim) -> String {
        claim.name()
    }
    /// The pool's status patch from `report`, or `None` when nothing changed.
    fn status_patch(&self, report: &Report) -> Option<serde_json::Value>;
    /// The metadata an existing IPAddress of a CAPI `claim` must carry (owners, finalizer,
    /// cluster label), as [`Self::new_address`] writes it: an object made by hand or restored
    /// from a backup is given them, as upstream does. `None` for Metal3 claims.
    fn address_metadata(&self, claim: &AnyClaim, object: &AnyAddress) -> Option<ObjectMeta> {
        let (AnyClaim::Capi(_), AnyAddress::Capi(_)) = (claim, object) else {
            return None;
        };
        // Only the metadata is kept: the lease's values do not matter.
        let lease = Lease {
            address: object.ip()?,
            prefix: 0,
            gateway: None,
            dns_servers: Vec::new(),
        };
        match self.new_address(claim, &lease).ok()? {
            NewAddress::Capi(address) => Some(address.metadata),
            NewAddress::Metal3(_) => None,
        }
    }
}

/// Address objects read from the server (not a cache), for decisions a stale cache must not make.
pub struct FreshAddresses {
    pub capi: Vec<Arc<capi::IPAddress>>,
    pub metal3: Vec<Arc<metal3_ipam::Metal3IPAddress>>,
}

/// Which address kinds a pool's addresses can be of, and so which are read for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressKinds {
    /// IPAddresses of the Cluster API contract only.
    Capi,
    /// Metal3 IPAddresses as well (Metal3 IPPools serve both claim kinds).
    CapiAndMetal3,
}

/// Every address object of `namespace` (all namespaces for `None`) of `kinds`, read from the
/// server. Metal3 pools are namespaced: there are no Metal3 addresses of a cluster-scoped pool.
pub async fn fresh_addresses(
    client: &kube::Client,
    namespace: Option<&str>,
    kinds: AddressKinds,
) -> Result<FreshAddresses, kube::Error> {
    listed_addresses(client, namespace, kinds, &Default::default()).await
}

/// [`fresh_addresses`] as `params` list them (at most `params.limit` of each kind, say).
pub async fn listed_addresses(
    client: &kube::Client,
    namespace: Option<&str>,
    kinds: AddressKinds,
    params: &kube::api::ListParams,
) -> Result<FreshAddresses, kube::Error> {
    let capi: Api<capi::IPAddress> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let capi = capi.list(params).await?.items;
    let metal3 = match (namespace, kinds) {
        (Some(ns), AddressKinds::CapiAndMetal3) => {
            Api::<metal3_ipam::Metal3IPAddress>::namespaced(client.clone(), ns)
                .list(params)
                .await?
                .items
        }
        _ => Vec::new(),
    };
    Ok(FreshAddresses {
        capi: capi.into_iter().map(Arc::new).collect(),
        metal3: metal3.into_iter().map(Arc::new).collect(),
    })
}

pub(super) async fn fresh_pool_addresses<P: PoolDialect>(
    pool: &P,
    ctx: &Context,
) -> Result<Vec<AnyAddress>, Error> {
    let key = pool.key();
    let fresh = fresh_addresses(&ctx.client, key.namespace.as_deref(), P::ADDRESS_KINDS)
        .await
        .call_on(Verb::List, format!("address objects of {}", key.describe()))?;
    Ok(pool.addresses(ctx, Some(&fresh)))
}

pub type Outcomes = BTreeMap<String, Result<Lease, Refusal>>;

/// Runs `f` over `items`, at most [`PARALLEL_CALLS`] at a time.
async fn in_parallel<T, R, F, Fut>(items: Vec<T>, f: F) -> Vec<R>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = R>,
{
    stream::iter(items.into_iter().map(f))
        .buffer_unordered(PARALLEL_CALLS)
        .collect()
        .await
}

/// Whether a claim may be acted on now: not paused, and its Cluster (if it names one) neither
/// paused nor, for a live claim, missing.
fn claim_may_proceed(claim: &AnyClaim, ctx: &Context) -> bool {
    if objects::is_paused(claim.meta()) {
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

struct Selected {
    /// Live claims with the finalizer, ready to be served.
    live: Vec<AnyClaim>,
    /// Deleting claims whose release may proceed now.
    releasing: Vec<AnyClaim>,
    /// Earliest end of an address-reuse grace period still running.
    grace_wait: Option<Duration>,
    /// Every claim naming the pool, as (kind, namespace, name) → UID.
    all: HashMap<ClaimKey, String>,
    /// Some claims were left for the next batch, or changed under a finalizer patch: reconcile
    /// again at once.
    again: bool,
}

/// When a claim was created, as precisely as the API server says: its creation second, then
/// the order the server recorded claims in (`resourceVersion`, an etcd revision here). For a
/// claim not yet changed since its creation, which is every claim still waiting for its first
/// address, that is its creation order, as upstream's single worker sees it; kind, namespace
/// and name break the remaining ties (a version that is not a number sorts after the rest).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Age {
    created: Option<k8s_openapi::jiff::Timestamp>,
    unordered: bool,
    recorded: u64,
    kind: ClaimKind,
    namespace: String,
    name: String,
}

/// Claims are served oldest first.
fn age(claim: &AnyClaim) -> Age {
    let recorded = claim
        .meta()
        .resource_version
        .as_deref()
        .and_then(|v| v.parse::<u64>().ok());
    Age {
        created: claim.meta().creation_timestamp.as_ref().map(|t| t.0),
        unordered: recorded.is_none(),
        recorded: recorded.unwrap_or_default(),
        kind: claim.kind(),
        namespace: claim.namespace(),
        name: claim.name(),
    }
}

/// The pool's claims, oldest first, with finalizers added to new ones.
async fn select_claims<P: PoolDialect>(
    pool: &P,
    ctx: &Arc<Context>,
    deleting_pool: bool,
) -> Result<Selected, Error> {
    // The reuse grace period does not hold up the release of a pool that is being deleted.
    let grace = pool.reuse_grace().filter(|_| !deleting_pool);
    let now = objects::now().0;
    let mut claims = pool.claims(ctx);
    claims.sort_by_key(age);
    let mut selected = Selected {
        live: Vec::new(),
        releasing: Vec::new(),
        grace_wait: None,
        all: claims
            .iter()
            .map(|c| (claim_key(c), c.meta().uid.clone().unwrap_or_default()))
            .collect(),
        again: false,
    };
    let mut need_finalizer = Vec::new();
    for claim in claims {
        if !claim_may_proceed(&claim, ctx) {
            continue;
        }
        let finalizer = P::claim_finalizer(claim.kind());
        match &claim.meta().deletion_timestamp {
            Some(deleted) => {
                if !objects::has_finalizer(claim.meta(), finalizer) {
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
            None if objects::has_finalizer(claim.meta(), finalizer) => selected.live.push(claim),
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
    selected.live.sort_by_key(age);
    Ok(selected)
}

/// Adds the pool kind's claim finalizer to each of `claims`, in parallel.
async fn add_claim_finalizers<P: PoolDialect>(
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
async fn protect_claims<P: PoolDialect>(pool: &P, ctx: &Arc<Context>) -> Result<Action, Error> {
    let unprotected: Vec<AnyClaim> = pool
        .claims(ctx)
        .into_iter()
        .filter(|c| {
            !c.deleting()
                && !objects::has_finalizer(c.meta(), P::claim_finalizer(c.kind()))
                && claim_may_proceed(c, ctx)
        })
        .take(BATCH)
        .collect();
    let stale = add_claim_finalizers::<P>(ctx, unprotected)
        .await?
        .iter()
        .any(|(_, patched)| *patched == FinalizerPatch::Stale);
    Ok(match stale {
        true => Action::requeue(Duration::from_millis(200)),
        false => Action::await_change(),
    })
}

type ClaimKey = (ClaimKind, String, String);
type AddressIndex = HashMap<ClaimKey, AnyAddress>;

fn address_key(address: &AnyAddress) -> ClaimKey {
    let (kind, claim) = address.claim();
    let namespace = address.meta().namespace.clone().unwrap_or_default();
    (kind, namespace, claim)
}

fn index_addresses(addresses: Vec<AnyAddress>) -> AddressIndex {
    index_by_claim(addresses, &HashMap::new()).0
}

/// The address objects by claim, and the claims' second objects. A Metal3 pool names its
/// objects after the address, so nothing but bitpool stops a claim from getting two (a watch
/// that lagged, a crash between a create and the status naming it): the claim keeps the one
/// its status names (`named`: claim → object name), else the oldest; the others are extras.
fn index_by_claim(
    mut addresses: Vec<AnyAddress>,
    named: &HashMap<ClaimKey, String>,
) -> (AddressIndex, Vec<AnyAddress>) {
    let rank = |a: &AnyAddress| {
        let is_named = named.get(&address_key(a)) == Some(&a.name());
        let created = a.meta().creation_timestamp.as_ref().map(|t| t.0);
        (!is_named, created, a.name())
    };
    addresses.sort_by_cached_key(rank);
    let mut index = AddressIndex::new();
    let mut extras = Vec::new();
    for address in addresses {
        match index.entry(address_key(&address)) {
            std::collections::hash_map::Entry::Occupied(_) => extras.push(address),
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(address);
            }
        }
    }
    (index, extras)
}

/// Addresses the live objects of more than one claim hold (one object per claim: a claim's
/// second objects are another matter, see [`index_by_claim`]).
fn shared_addresses<P: PoolDialect>(pool: &P, addresses: &AddressIndex) -> Vec<SharedAddress> {
    duplicates::shared(
        addresses
            .values()
            .filter(|a| a.meta().deletion_timestamp.is_none())
            .filter_map(|a| Some((pool.held(a)?, a.describe()))),
    )
}

/// Says so when the pool's objects hold an address for more than one claim: the log, an Event
/// and the metric (the status says it too, where the pool kind has conditions).
fn report_shared<P: PoolDialect>(pool: &P, ctx: &Context, shared: &[SharedAddress]) {
    ctx.ops
        .metrics
        .pool_duplicated(&pool_labels(&pool.key()), shared.len());
    if shared.is_empty() {
        return;
    }
    let message = duplicates::message(shared, |a| pool.show(a));
    tracing::error!(pool = %pool.key().describe(), "{message}");
    ctx.ops
        .events
        .publish(pool.object_ref(&()), Reason::DuplicateAddress, message);
}

/// Says so when address objects name the pool with addresses it did not hand out (made by hand,
/// or by another provider): the log and an Event. Nothing is adopted, fenced or freed for them.
fn report_foreign<P: PoolDialect>(pool: &P, ctx: &Context, foreign: &[AnyAddress]) {
    let named: BTreeMap<String, String> = foreign
        .iter()
        .filter_map(|a| Some((a.describe(), pool.show(pool.held(a)?))))
        .collect();
    let Some((first, address)) = named.iter().next() else {
        return;
    };
    let message = format!(
        "{} address object(s) name this pool with an address it did not hand out (for example {first}, {address}): bitpool did not make them, and neither adopts nor frees an address for them",
        named.len()
    );
    tracing::warn!(pool = %pool.key().describe(), "{message}");
    ctx.ops
        .events
        .publish(pool.object_ref(&()), Reason::ForeignAddress, message);
}

/// The pools of one kind that hand out addresses, by key, from their cache.
pub fn covered_pools<Q: PoolDialect>(
    store: &Store<Q>,
) -> impl Iterator<Item = (PoolKey, Covered)> + use<Q> {
    store
        .state()
        .into_iter()
        .filter(|p| p.meta().deletion_timestamp.is_none())
        .filter_map(|p| Some((p.key(), p.covered()?)))
}

/// Other pools, of every kind, whose addresses meet this one's (from the caches).
fn overlapping_pools<P: PoolDialect>(pool: &P, ctx: &Context) -> Vec<Overlap> {
    let Some(own) = pool.covered() else {
        return Vec::new();
    };
    let key = pool.key();
    let others = covered_pools(&ctx.pools)
        .chain(covered_pools(&ctx.global_pools))
        .chain(covered_pools(&ctx.prefix_pools))
        .chain(covered_pools(&ctx.global_prefix_pools))
        .chain(covered_pools(&ctx.ippools))
        .filter(|(other, _)| *other != key)
        .map(|(other, covered)| (other.describe(), covered));
    overlaps::find(&own, others)
}

/// Says so when the pool meets others: an Event and the metric (and the status, where the
/// pool kind has conditions).
fn report_overlaps<P: PoolDialect>(pool: &P, ctx: &Context, overlaps: &[Overlap]) {
    ctx.ops
        .metrics
        .pool_overlaps(&pool_labels(&pool.key()), overlaps.len());
    if !overlaps.is_empty() {
        let message = overlaps::message(overlaps);
        ctx.ops
            .events
            .publish(pool.object_ref(&()), Reason::PoolsOverlap, message);
    }
}

/// Whether `claim`'s status names `object`: then bitpool made it for the claim.
fn vouches(claim: &AnyClaim, object: &AnyAddress) -> bool {
    claim.status_address_name().as_deref() == Some(object.name().as_str())
}

fn claim_key(claim: &AnyClaim) -> ClaimKey {
    (claim.kind(), claim.namespace(), claim.name())
}

/// What one reconcile of a pool does, built up phase by phase.
#[derive(Default)]
struct Batch {
    /// Transaction 1: allocate, bind what is about to lose its address object, confirm.
    first: Intent,
    /// Transaction 2: confirm what was created, free what was released, reclaim leaks.
    second: Intent,
    to_create: Vec<AnyClaim>,
    to_delete: Vec<(AnyClaim, AnyAddress)>,
    /// Address objects whose claim is gone.
    orphaned: Vec<AnyAddress>,
    /// Second address objects of live or releasing claims (see [`index_by_claim`]).
    duplicates: Vec<AnyAddress>,
    /// Addresses the live objects of more than one claim hold: they stay allocated, and the
    /// report says so.
    shared: Vec<SharedAddress>,
    /// What the orphaned objects held, once they are deleted: freed only if a fresh list shows
    /// no other object holding it (a hand-made object may name another claim's address).
    orphans_deleted: Vec<IpAddr>,
    /// Claims whose address is released: their finalizer goes.
    finished: Vec<AnyClaim>,
    /// Existing address objects lacking owners, finalizer or labels, with the patch that adds them.
    to_adopt: Vec<(AnyAddress, serde_json::Value)>,
    /// Which address object each claim's status names.
    named: HashMap<ClaimKey, String>,
    /// Objects of live claims that their status does not name, judged by transaction 1 (or 2,
    /// for one met by a create) before the claim is served with them ([`intent::Found`]).
    found_first: Vec<(AnyClaim, AnyAddress)>,
    found_second: Vec<(AnyClaim, AnyAddress)>,
    /// Address objects bitpool did not make, which hold nothing for it: the report names them.
    foreign: Vec<AnyAddress>,
    statuses: Vec<(AnyClaim, Outcome)>,
    /// Who holds what after this reconcile (claim kind and name → address), for the status.
    holders: BTreeMap<(ClaimKind, String), IpAddr>,
    /// The soonest this pool must be reconciled again.
    next: Option<Duration>,
}

impl Batch {
    fn again_within(&mut self, after: Duration) {
        self.next = Some(self.next.map_or(after, |n| n.min(after)));
    }
}

pub async fn reconcile<P: PoolDialect>(pool: Arc<P>, ctx: Arc<Context>) -> Result<Action, Error> {
    if objects::is_paused(pool.meta()) {
        return protect_claims(&*pool, &ctx).await;
    }
    // A paused Cluster pauses everything of its own, finalizers too (as upstream).
    if pool.paused_by_cluster(&ctx) {
        return Ok(Action::requeue(Duration::from_secs(30)));
    }
    // A pool being deleted still releases its claims' addresses, but hands out none.
    let deleting = pool.meta().deletion_timestamp.is_some();
    if deleting && !objects::has_finalizer(pool.meta(), P::FINALIZER) {
        return Ok(Action::await_change());
    }
    if !deleting && prepare_pool(&*pool, &ctx).await? == FinalizerPatch::Stale {
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    let (base, spec_error) = base_space(&*pool, deleting);

    // Read and plan.
    let claims = select_claims(&*pool, &ctx, deleting).await?;
    let named = claims
        .live
        .iter()
        .chain(&claims.releasing)
        .filter_map(|c| Some((claim_key(c), c.status_address_name()?)))
        .collect();
    let (addresses, extras) = index_by_claim(pool.addresses(&ctx, None), &named);
    let mut batch = plan(&*pool, &ctx, &claims, &addresses, base.as_ref()).await?;
    batch.named = named;
    batch.duplicates = second_objects::<P>(&claims, extras);
    batch.orphaned = orphaned_objects(&ctx, &claims, &addresses).await?;

    // Commit, apply, commit.
    let done = transact(
        &*pool,
        &ctx,
        &mut batch,
        &claims,
        &addresses,
        base.as_ref(),
        &spec_error,
    )
    .await?;

    adopt_addresses(&ctx, &mut batch).await?;

    // Report.
    let key = pool.key();
    let finished = std::mem::take(&mut batch.finished);
    finish_claims(&ctx, &key, finished, P::claim_finalizer).await?;
    let statuses = std::mem::take(&mut batch.statuses);
    write_statuses(&ctx, &key, pool.object_ref(&()), statuses).await;
    if let Some(e) = done.ledger_error {
        return Err(e);
    }
    if deleting {
        return finish_pool_deletion(&*pool, &ctx).await;
    }
    let overlaps = overlapping_pools(&*pool, &ctx);
    let report = Report {
        usage: done.usage.as_ref(),
        ledger: &done.ledger,
        spec_error: spec_error.as_deref(),
        holders: &batch.holders,
        shared: &batch.shared,
        overlaps: &overlaps,
    };
    report_shared(&*pool, &ctx, &batch.shared);
    report_foreign(&*pool, &ctx, &batch.foreign);
    report_overlaps(&*pool, &ctx, &overlaps);
    if let Some(patch) = pool.status_patch(&report) {
        let api = pool.api_for(ctx.client.clone());
        objects::merge_status(&api, &pool.name_any(), patch).await?;
        if let Some(problem) = &spec_error {
            let note = format!("the pool hands out no address: {problem}");
            ctx.ops
                .events
                .publish(pool.object_ref(&()), Reason::InvalidSpec, note);
        }
    }
    let next = next_check(&batch, &done, &claims, &ctx, &key);
    tracing::debug!(pool = %key.describe(), next = ?next, "pool checked");
    Ok(Action::requeue(next))
}

/// The pool's empty address space, or why there is none (an invalid spec, a pool being deleted).
fn base_space<P: PoolDialect>(
    pool: &P,
    deleting: bool,
) -> (Option<transaction::Base>, Option<String>) {
    if deleting {
        return (None, Some("the pool is being deleted".to_string()));
    }
    let fingerprint = (
        pool.uid().unwrap_or_default(),
        pool.meta().generation.unwrap_or_default(),
    );
    match pool.space() {
        Ok(space) => (Some((space, fingerprint)), None),
        Err(e) => (None, Some(e)),
    }
}

/// What the two ledger transactions and the object writes between them leave.
struct Transacted {
    ledger: Ledger,
    usage: Option<Usage>,
    outcomes: Outcomes,
    /// The first ledger error: it does not hold up releases and is returned once they are done.
    ledger_error: Option<Error>,
}

/// Transaction 1, the address objects it calls for, then transaction 2.
async fn transact<P: PoolDialect>(
    pool: &P,
    ctx: &Arc<Context>,
    batch: &mut Batch,
    claims: &Selected,
    addresses: &AddressIndex,
    base: Option<&transaction::Base>,
    spec_error: &Option<String>,
) -> Result<Transacted, Error> {
    let deleting = pool.meta().deletion_timestamp.is_some();
    let ledger_ref = transaction::ledger_of(pool, ctx);
    let mut ledger_error = None;
    let live_objects = addresses
        .values()
        .any(|a| a.meta().deletion_timestamp.is_none());
    let create = !deleting && live_objects;
    let repaired = repair_record(pool, ctx, &ledger_ref, addresses, create, batch).await;
    let known = keep_first(&mut ledger_error, repaired).flatten();

    let create = !deleting && !batch.first.allocate.is_empty();
    let first =
        transaction::commit(&ledger_ref, pool, ctx, (base, known), &batch.first, create).await;
    let first = keep_first(&mut ledger_error, first).map(|(_, _, outcomes, _)| outcomes);
    // Unjudged (the commit failed), a found object serves nobody this time.
    if let Some(outcomes) = &first {
        let found = std::mem::take(&mut batch.found_first);
        batch.settle_found(pool, found, outcomes, spec_error);
    }
    let outcomes = first.unwrap_or_default();
    let committed = Instant::now();
    let reclaimed_objects = batch.orphaned.len();
    create_addresses(pool, ctx, batch, &outcomes, committed, spec_error).await;
    for (found, (claim, _)) in batch.second.found.iter_mut().zip(&batch.found_second) {
        found.shared = addresses.values().any(|other| {
            address_key(other) != claim_key(claim)
                && other.meta().deletion_timestamp.is_none()
                && pool.held(other) == Some(found.address)
        });
    }
    delete_addresses(pool, ctx, batch).await?;

    // Read again, not the ledger the first commit wrote: what is found unexplained is judged
    // against a fresh list of the address objects, which must not be older than the ledger.
    let current = transaction::load(&ledger_ref, pool, ctx, false).await;
    let known = keep_first(&mut ledger_error, current).flatten();
    if let Some(stored) = &known {
        let unexplained = unexplained(pool, ctx, &stored.ledger, addresses).await;
        batch.second.release_unbound =
            keep_first(&mut ledger_error, unexplained).unwrap_or_default();
        let orphans = std::mem::take(&mut batch.orphans_deleted);
        let unheld = unheld(pool, ctx, orphans).await;
        batch
            .second
            .release_unbound
            .extend(keep_first(&mut ledger_error, unheld).unwrap_or_default());
        let vanished = vanished_reservations(ctx, &stored.ledger, claims).await;
        let vanished = keep_first(&mut ledger_error, vanished).unwrap_or_default();
        batch.second.release_unlanded.extend(vanished);
    }
    let second =
        transaction::commit(&ledger_ref, pool, ctx, (base, known), &batch.second, false).await;
    let (ledger, usage) = match keep_first(&mut ledger_error, second) {
        Some((ledger, usage, outcomes, _)) => {
            let found = std::mem::take(&mut batch.found_second);
            batch.settle_found(pool, found, &outcomes, spec_error);
            (ledger, usage)
        }
        None => Default::default(),
    };
    let metrics = &ctx.ops.metrics;
    metrics.allocated(P::KIND.as_str(), batch.second.confirm.len());
    let released = batch.second.release.len()
        + batch.second.release_claims.len()
        + batch.second.release_unbound.len();
    metrics.released(P::KIND.as_str(), released);
    if let Some(usage) = &usage {
        metrics.pool_usage(&pool_labels(&pool.key()), &usage.counts);
    }
    if !batch.first.allocate.is_empty() || !batch.second.is_empty() || reclaimed_objects > 0 {
        tracing::info!(
            pool = %pool.key().describe(),
            pending = batch.first.allocate.len(),
            created = batch.second.confirm.len(),
            released = batch.second.release_claims.len(),
            reclaimed = batch.second.release_unbound.len() + reclaimed_objects,
            "reconciled"
        );
    }
    Ok(Transacted {
        ledger,
        usage,
        outcomes,
        ledger_error,
    })
}

/// `result`'s value, remembering its error in `first` unless an earlier one is there.
fn keep_first<T>(first: &mut Option<Error>, result: Result<T, Error>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(e) => {
            first.get_or_insert(e);
            None
        }
    }
}

/// The pool's own finalizer and metadata.
async fn prepare_pool<P: PoolDialect>(pool: &P, ctx: &Context) -> Result<FinalizerPatch, Error> {
    let api = pool.api_for(ctx.client.clone());
    if objects::add_finalizer(&api, pool, P::FINALIZER).await? == FinalizerPatch::Stale {
        return Ok(FinalizerPatch::Stale);
    }
    if let Some(patch) = pool.metadata_patch(ctx) {
        objects::merge_patch(&api, &pool.name_any(), patch).await?;
    }
    Ok(FinalizerPatch::Done)
}

/// Transaction 1 and the work around it, from the selected claims and the cached addresses.
async fn plan<P: PoolDialect>(
    pool: &P,
    ctx: &Context,
    claims: &Selected,
    addresses: &AddressIndex,
    base: Option<&transaction::Base>,
) -> Result<Batch, Error> {
    let mut batch = Batch {
        holders: addresses
            .iter()
            .filter_map(|((kind, _, claim), a)| Some(((*kind, claim.clone()), pool.held(a)?)))
            .collect(),
        ..Default::default()
    };
    if claims.again {
        batch.again_within(Duration::ZERO);
    }
    // An address another claim's object holds too stays allocated when this one goes.
    batch.shared = shared_addresses(pool, addresses);
    let mut unserved = Vec::new();
    for claim in &claims.live {
        let held = addresses.get(&claim_key(claim));
        if !held.is_some_and(|object| batch.plan_held(pool, claim, object)) {
            unserved.push(claim.clone());
        }
    }
    // A lagging watch may not show an object a claim already has: its status names it, or this
    // process just created it. Those are read from the server before anything is allocated.
    let known = known_objects_of(pool, ctx, &unserved).await?;
    for claim in unserved {
        let held = known.get(&claim_key(&claim));
        if !held.is_some_and(|object| batch.plan_held(pool, &claim, object)) {
            batch.plan_allocation(pool, &claim, base);
        }
    }
    plan_releases(pool, ctx, &mut batch, claims, addresses).await?;
    Ok(batch)
}

impl Batch {
    /// A live claim with its address object: confirmed (and the object adopted where it lacks
    /// owners or finalizer), or bound while the object goes. An object the claim's status does
    /// not name is confirmed only if transaction 1 finds that the address is the claim's. False
    /// when the object holds no address of the pool's.
    fn plan_held<P: PoolDialect>(
        &mut self,
        pool: &P,
        claim: &AnyClaim,
        object: &AnyAddress,
    ) -> bool {
        let (Some(id), Some(ip)) = (claim.id(), pool.held(object)) else {
            return false;
        };
        let vouched = vouches(claim, object);
        if object.meta().deletion_timestamp.is_some() {
            // Its address stays the claim's while the object goes, if bitpool gave it.
            if vouched {
                self.first.bind.push((ip, id));
            }
            return vouched;
        }
        if !vouched {
            let shared = self.shared.iter().any(|s| s.address == ip);
            self.first.found.push(Found {
                address: ip,
                claim: id,
                shared,
            });
            self.found_first.push((claim.clone(), object.clone()));
            return true;
        }
        self.first.confirm.push((ip, id.uid));
        self.serve_with(pool, claim, object, ip);
        true
    }

    /// `claim` is served with `object`, which holds `ip`.
    fn serve_with<P: PoolDialect>(
        &mut self,
        pool: &P,
        claim: &AnyClaim,
        object: &AnyAddress,
        ip: IpAddr,
    ) {
        let adoption = pool
            .address_metadata(claim, object)
            .and_then(|desired| objects::adoption_patch(object.meta(), &desired));
        if let Some(patch) = adoption {
            self.to_adopt.push((object.clone(), patch));
        }
        self.holders.insert((claim.kind(), claim.name()), ip);
        self.statuses.push((
            claim.clone(),
            Outcome::Allocated {
                address_name: object.name(),
                address: pool.show(ip),
            },
        ));
    }

    /// The claims whose objects a transaction judged ([`intent::Found`]): served with them, or
    /// told why not. Confirming again what the transaction confirmed changes nothing.
    fn settle_found<P: PoolDialect>(
        &mut self,
        pool: &P,
        found: Vec<(AnyClaim, AnyAddress)>,
        outcomes: &Outcomes,
        spec_error: &Option<String>,
    ) {
        for (claim, object) in found {
            let (Some(uid), Some(ip)) = (claim.meta().uid.clone(), pool.held(&object)) else {
                continue;
            };
            match outcomes.get(&uid) {
                Some(Err(refusal @ Refusal::NotHanded { .. })) => {
                    self.foreign.push(object);
                    let refused = Outcome::Refused {
                        refusal: refusal.clone(),
                        pool: pool.key().describe(),
                        spec_error: spec_error.clone(),
                    };
                    self.statuses.push((claim, refused));
                }
                _ => self.serve_with(pool, &claim, &object, ip),
            }
        }
    }

    /// A live claim without an address object: a request in transaction 1, or why it cannot
    /// have one.
    fn plan_allocation<P: PoolDialect>(
        &mut self,
        pool: &P,
        claim: &AnyClaim,
        base: Option<&transaction::Base>,
    ) {
        let Some(id) = claim.id() else { return };
        let problem = base.and_then(|(space, _)| pool.address_name_problem(claim, space.family()));
        if let Some(problem) = problem {
            return self
                .statuses
                .push((claim.clone(), Outcome::Failed(problem)));
        }
        if self.to_create.len() >= BATCH {
            return self.again_within(Duration::ZERO);
        }
        let requested = match pool.requested(claim) {
            Ok(requested) => requested,
            Err(e) => {
                let refused = Outcome::Refused {
                    refusal: Refusal::Alloc(e),
                    pool: pool.key().describe(),
                    spec_error: None,
                };
                return self.statuses.push((claim.clone(), refused));
            }
        };
        self.to_create.push(claim.clone());
        self.first.allocate.push(Request {
            preallocation_key: pool.preallocation_key(claim),
            claim: id,
            requested,
        });
    }
}

/// The address objects of `claims` whose names are known without the cache (their status, or
/// this process's memory of what it created), read from the server; only objects of this pool
/// and of that claim count.
async fn known_objects_of<P: PoolDialect>(
    pool: &P,
    ctx: &Context,
    claims: &[AnyClaim],
) -> Result<AddressIndex, Error> {
    let known: Vec<(AnyClaim, String)> = claims
        .iter()
        .filter_map(|claim| {
            let uid = claim.meta().uid.as_deref()?;
            let name = claim
                .status_address_name()
                .or_else(|| ctx.recently_created_address(uid))?;
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

/// Deleting claims: each address object goes (its address bound to the claim until then), or,
/// where none is left, the claim is done.
async fn plan_releases<P: PoolDialect>(
    pool: &P,
    ctx: &Context,
    batch: &mut Batch,
    claims: &Selected,
    addresses: &AddressIndex,
) -> Result<(), Error> {
    // A stale cache may miss a just-created address object: ask the server before concluding.
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
    let shared: HashSet<IpAddr> = batch.shared.iter().map(|s| s.address).collect();
    for claim in &claims.releasing {
        let Some(id) = claim.id() else { continue };
        let object = addresses
            .get(&claim_key(claim))
            .or_else(|| fresh.as_ref()?.get(&claim_key(claim)));
        match object.and_then(|a| Some((pool.held(a)?, a))) {
            Some((ip, a)) => {
                // An object the claim's status does not name may be someone else's making:
                // what it holds is freed after it goes only if no other object holds it.
                if !shared.contains(&ip) && vouches(claim, a) {
                    batch.first.bind.push((ip, id));
                }
                batch.to_delete.push((claim.clone(), a.clone()));
            }
            None => {
                // No object of the claim was seen: one may still be on its way.
                batch.first.release_unlanded.push(id.uid);
                batch.finished.push(claim.clone());
            }
        }
    }
    Ok(())
}

/// The extra objects of claims this reconcile serves or releases: they go, and their addresses
/// with them once a fresh list shows no other object holding them. Extras of claims it does not
/// act on (paused, unknown) wait, and so does one being deleted that bitpool no longer holds.
fn second_objects<P: PoolDialect>(claims: &Selected, extras: Vec<AnyAddress>) -> Vec<AnyAddress> {
    let acted_on: HashSet<ClaimKey> = claims
        .live
        .iter()
        .chain(&claims.releasing)
        .map(claim_key)
        .collect();
    extras
        .into_iter()
        .filter(|a| {
            let held = objects::has_finalizer(a.meta(), P::address_finalizer(a.claim().0));
            acted_on.contains(&address_key(a)) && (a.meta().deletion_timestamp.is_none() || held)
        })
        .collect()
}

/// Gives existing address objects the owners, finalizer and labels they lack. One changed
/// meanwhile is patched again from the next reconcile's view.
async fn adopt_addresses(ctx: &Context, batch: &mut Batch) -> Result<(), Error> {
    let patches = std::mem::take(&mut batch.to_adopt);
    let results = in_parallel(patches, |(address, patch)| async move {
        let result = address.merge_patch(ctx, patch).await;
        if result.is_ok() {
            tracing::info!(object = %address.describe(), "adopted: owners, finalizer and labels added");
        }
        result
    })
    .await;
    for result in results {
        match result {
            Ok(()) => {}
            Err(e)
                if e.status()
                    .is_some_and(|s| s.is_conflict() || s.is_not_found()) =>
            {
                batch.again_within(Duration::ZERO);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The address objects of `claims` read from the server: each by its name, in parallel, or when
/// a name is not known, every object of the pool (a list: the exception).
async fn fresh_objects_of<P: PoolDialect>(
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

/// Creates the address objects of the reservations just committed, and records the outcomes.
/// Nothing is created once [`ledger::CREATE_WINDOW`] has passed since the commit (a process that
/// lost the record may be rebuilding it) or once shutdown has begun: the next reconcile commits
/// again and resumes with the same reservations.
async fn create_addresses<P: PoolDialect>(
    pool: &P,
    ctx: &Arc<Context>,
    batch: &mut Batch,
    outcomes: &Outcomes,
    committed: Instant,
    spec_error: &Option<String>,
) {
    let key = pool.key();
    let deadline = committed + ledger::CREATE_WINDOW;
    let mut creations: Vec<(AnyClaim, Lease, Result<NewAddress, String>)> = Vec::new();
    for claim in std::mem::take(&mut batch.to_create) {
        let Some(outcome) = claim.id().and_then(|id| outcomes.get(&id.uid)) else {
            continue;
        };
        match outcome {
            Ok(lease) => creations.push((
                claim.clone(),
                lease.clone(),
                pool.new_address(&claim, lease),
            )),
            Err(Refusal::Deferred) => batch.again_within(Duration::ZERO),
            Err(refusal) => batch.statuses.push((
                claim,
                Outcome::Refused {
                    refusal: pool.explain(refusal.clone()),
                    pool: key.describe(),
                    spec_error: spec_error.clone(),
                },
            )),
        }
    }
    let created = in_parallel(creations, |(claim, lease, object)| {
        let ctx = ctx.clone();
        async move {
            let result = match &object {
                _ if ctx.shutting_down() || Instant::now() >= deadline => None,
                Ok(object) => Some(object.create(&ctx, &claim, deadline.into()).await),
                Err(problem) => Some(Ok(Created::Conflict(problem.clone()))),
            };
            (claim, lease, object.map(|o| o.name()).ok(), result)
        }
    })
    .await;
    for (claim, lease, object_name, result) in created {
        batch.record_creation(pool, ctx, claim, &lease, object_name, result);
    }
}

impl Batch {
    /// What creating `claim`'s address object for `lease` means for transaction 2 and the
    /// claim's status; `None` when it was not attempted (left for the next reconcile).
    fn record_creation<P: PoolDialect>(
        &mut self,
        pool: &P,
        ctx: &Context,
        claim: AnyClaim,
        lease: &Lease,
        object_name: Option<String>,
        result: Option<Result<Created, Error>>,
    ) {
        let Some(uid) = claim.meta().uid.clone() else {
            return;
        };
        let address = match result {
            None => return self.again_within(Duration::ZERO),
            Some(Ok(Created::Confirmed)) => {
                // Only objects not named after their claim need remembering: a second create
                // of one that is meets the first (409).
                if let Some(name) = object_name.as_ref().filter(|n| **n != claim.name()) {
                    ctx.created_address(&uid, name);
                }
                lease.address
            }
            Some(Ok(Created::Own(existing))) => {
                // The claim's object existed with another address (a cache that had not seen
                // it, or an object someone else made): the new reservation is not needed, and
                // transaction 2 judges whether that address is the claim's.
                self.second.release.push((lease.address, uid.clone()));
                let (Some(address), Some(id)) = (pool.held(&existing), claim.id()) else {
                    let message = format!("{} holds no address", existing.describe());
                    return self.statuses.push((claim, Outcome::Failed(message)));
                };
                // Whether another claim's object holds it is filled in from the index.
                self.second.found.push(Found {
                    address,
                    claim: id,
                    shared: false,
                });
                return self.found_second.push((claim, existing));
            }
            Some(Ok(Created::Conflict(message))) => {
                // The name is taken by another object: this reservation is not needed.
                self.second.release.push((lease.address, uid));
                return self.statuses.push((claim, Outcome::Failed(message)));
            }
            Some(Err(e)) => {
                tracing::warn!(
                    pool = %pool.key().describe(),
                    claim = %claim.describe(),
                    error = %e,
                    "creating the address object failed; retrying"
                );
                self.again_within(Duration::from_secs(1));
                let message = format!("creating the address object failed: {e}");
                return self.statuses.push((claim, Outcome::Failed(message)));
            }
        };
        self.second.confirm.push((address, uid));
        self.holders.insert((claim.kind(), claim.name()), address);
        self.statuses.push((
            claim,
            Outcome::Allocated {
                address_name: object_name.unwrap_or_default(),
                address: pool.show(address),
            },
        ));
    }
}

/// Deletes the address objects of released claims and of claims that are gone.
async fn delete_addresses<P: PoolDialect>(
    pool: &P,
    ctx: &Arc<Context>,
    batch: &mut Batch,
) -> Result<(), Error> {
    let deletions = in_parallel(std::mem::take(&mut batch.to_delete), |(claim, address)| {
        let ctx = ctx.clone();
        async move {
            let gone = address
                .delete(&ctx, P::address_finalizer(claim.kind()))
                .await;
            (claim, address, gone)
        }
    })
    .await;
    for (claim, address, gone) in deletions {
        if gone? {
            ctx.deleted_address(address.meta().uid.as_deref().unwrap_or_default());
            if !vouches(&claim, &address) {
                batch.orphans_deleted.extend(pool.held(&address));
            }
            batch.second.release_claims.extend(claim.meta().uid.clone());
            batch.holders.remove(&(claim.kind(), claim.name()));
            batch.finished.push(claim);
        } else {
            batch.again_within(Duration::from_secs(1));
        }
    }
    let orphans = std::mem::take(&mut batch.orphaned);
    for address in delete_unkept(pool, ctx, batch, orphans).await? {
        tracing::warn!(address = %address.describe(), "deleted an address object whose claim is gone");
        batch.holders.remove(&address.claim());
    }
    let duplicates = std::mem::take(&mut batch.duplicates);
    for address in delete_unkept(pool, ctx, batch, duplicates).await? {
        let (_, claim) = address.claim();
        tracing::warn!(address = %address.describe(), %claim, "deleted a second address object of a claim; the claim keeps its first");
    }
    Ok(())
}

/// Deletes address objects no claim keeps (orphans, a claim's second objects): what each held
/// is freed once a fresh list shows no other object holding it. Returns those deleted.
async fn delete_unkept<P: PoolDialect>(
    pool: &P,
    ctx: &Arc<Context>,
    batch: &mut Batch,
    objects: Vec<AnyAddress>,
) -> Result<Vec<AnyAddress>, Error> {
    let deletions = in_parallel(objects, |address| {
        let ctx = ctx.clone();
        async move {
            let gone = address
                .delete(&ctx, P::address_finalizer(address.claim().0))
                .await;
            (address, gone)
        }
    })
    .await;
    let mut deleted = Vec::new();
    for (address, gone) in deletions {
        match (gone?, pool.held(&address)) {
            (true, Some(ip)) => {
                ctx.deleted_address(address.meta().uid.as_deref().unwrap_or_default());
                batch.orphans_deleted.push(ip);
                deleted.push(address);
            }
            _ => batch.again_within(Duration::from_secs(1)),
        }
    }
    Ok(deleted)
}

async fn finish_claims(
    ctx: &Arc<Context>,
    key: &PoolKey,
    finished: Vec<AnyClaim>,
    finalizer: fn(ClaimKind) -> &'static str,
) -> Result<(), Error> {
    let removals = in_parallel(finished, |claim| {
        let ctx = ctx.clone();
        async move {
            let result = claim
                .set_finalizer(&ctx, finalizer(claim.kind()), false)
                .await;
            (claim, result)
        }
    })
    .await;
    for (claim, removal) in removals {
        if let Err(e) = removal {
            tracing::warn!(pool = %key.describe(), claim = %claim.describe(), error = %e, "releasing the claim's finalizer failed");
            return Err(e);
        }
        let note = format!("the address went back to {}", key.describe());
        ctx.ops
            .events
            .publish(claim.object_ref(), Reason::AddressReleased, note);
    }
    Ok(())
}

/// Writes the claims' statuses; a status that changed is also told as an Event.
async fn write_statuses(
    ctx: &Arc<Context>,
    key: &PoolKey,
    pool: ObjectReference,
    statuses: Vec<(AnyClaim, Outcome)>,
) {
    let writes = in_parallel(statuses, |(claim, outcome)| {
        let ctx = ctx.clone();
        async move {
            let result = claim.write_status(&ctx, &outcome).await;
            (claim, outcome, result)
        }
    })
    .await;
    let mut newly_exhausted = 0;
    for (claim, outcome, write) in writes {
        match write {
            Ok(true) => {
                if let Some(Reason::PoolExhausted) = claim_event(ctx, key, &claim, &outcome) {
                    newly_exhausted += 1;
                }
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(pool = %key.describe(), claim = %claim.describe(), error = %e, "claim status not written; retrying later")
            }
        }
    }
    if newly_exhausted > 0 {
        let note = format!("no free address for {newly_exhausted} new claim(s)");
        ctx.ops.events.publish(pool, Reason::PoolExhausted, note);
    }
}

/// Tells a claim's new status as an Event; says which.
fn claim_event(
    ctx: &Context,
    key: &PoolKey,
    claim: &AnyClaim,
    outcome: &Outcome,
) -> Option<Reason> {
    let (reason, note) = match outcome {
        Outcome::Allocated { address, .. } => (
            Reason::AddressAllocated,
            format!("allocated {address} from {}", key.describe()),
        ),
        Outcome::Refused {
            refusal: Refusal::Alloc(alloc::AllocError::Exhausted),
            pool,
            ..
        } => (
            Reason::PoolExhausted,
            format!("{pool} has no free address; the claim waits for one"),
        ),
        _ => return None,
    };
    ctx.ops.events.publish(claim.object_ref(), reason, note);
    Some(reason)
}

/// When to look at the pool again.
fn next_check(
    batch: &Batch,
    done: &Transacted,
    claims: &Selected,
    ctx: &Context,
    key: &PoolKey,
) -> Duration {
    let outcomes = &done.outcomes;
    let mut next = batch.next.unwrap_or(ctx.settings.sync_period);
    let waiting = |refusal: fn(&Refusal) -> bool| {
        outcomes
            .values()
            .any(|o| o.as_ref().err().is_some_and(refusal))
    };
    let exhausted = waiting(|r| matches!(r, Refusal::Alloc(alloc::AllocError::Exhausted)));
    let freed = !batch.second.release.is_empty()
        || !batch.second.release_claims.is_empty()
        || !batch.second.release_unbound.is_empty();
    if exhausted && freed {
        // Claims refused for exhaustion in the first transaction get what the second freed.
        next = next.min(Duration::from_millis(100));
    } else if exhausted {
        // A release normally triggers a reconcile by its events; this is the safety net.
        next = next.min(EXHAUSTED_RECHECK);
    }
    if waiting(|r| matches!(r, Refusal::Fenced { .. })) {
        next = next.min(Duration::from_secs(5));
    }
    if let Some(wait) = claims.grace_wait {
        next = next.min(wait);
    }
    if ctx.orphan_watch(key).is_some() {
        next = next.min(ORPHAN_GRACE);
    }
    if !batch.first.release_unlanded.is_empty() || !done.ledger.pending.is_empty() {
        // A reservation left is completed by its claim's next reconcile, or, its claim gone,
        // freed once no create of it can land: whichever event comes, this one does.
        next = next.min(ledger::IN_FLIGHT_BOUND);
    }
    next
}

/// What the ledger must learn from the live address objects. Every address bitpool hands out
/// is reserved in the record before its object is created, so an object the record does not
/// list means one of two things. Where the record is not known to be whole (restored from a
/// backup, rebuilt, or written before bitpool marked whole records) or lacks the object a
/// claim's status names, the record lost something: the live objects are adopted and the
/// rebuild fence starts. Otherwise someone else made the object: it is adopted by nothing,
/// fences nothing, and the report names it. When a fence is over, a fresh list is adopted and
/// the fence ends. Returns the ledger as read, for the first commit to start from.
async fn repair_record<P: PoolDialect>(
    pool: &P,
    ctx: &Context,
    ledger_ref: &LedgerRef,
    addresses: &AddressIndex,
    create: bool,
    batch: &mut Batch,
) -> Result<Option<ledger::Stored>, Error> {
    let Some(stored) = transaction::load(ledger_ref, pool, ctx, create).await? else {
        return Ok(None);
    };
    let ledger = &stored.ledger;
    let fenced = ledger.rebuilt_at.is_some();
    let fence_over = fenced && ledger.fenced_until(&objects::now().0.to_string()).is_none();
    let whole = ledger.whole() && !fenced;
    let named = &batch.named;
    let served = |a: &AnyAddress| named.get(&address_key(a)) == Some(&a.name());
    // Objects this process deleted are not live, though a lagging cache still lists them (a
    // mass deletion would otherwise list the namespace once per reconcile).
    let unlisted: Vec<&AnyAddress> = addresses
        .values()
        .filter(|a| !ctx.recently_deleted_address(a.meta().uid.as_deref().unwrap_or_default()))
        .filter(|a| pool.held(a).is_some_and(|ip| !ledger.contains(ip)))
        .collect();
    let lost = !unlisted.is_empty() && (!whole || unlisted.iter().any(|a| served(a)));
    if !fence_over && !lost && (whole || fenced) {
        batch.foreign.extend(unlisted.into_iter().cloned());
        return Ok(Some(stored));
    }
    let fresh = fresh_pool_addresses(pool, ctx).await?;
    let (adopt, foreign): (Vec<&AnyAddress>, Vec<&AnyAddress>) = fresh
        .iter()
        .filter(|a| pool.held(a).is_some_and(|ip| !ledger.contains(ip)))
        .partition(|a| !whole || served(a));
    batch.foreign.extend(foreign.into_iter().cloned());
    let intent = &mut batch.first;
    intent.adopt = adopt.iter().filter_map(|a| pool.held(a)).collect();
    if let (false, Some(first)) = (fence_over, intent.adopt.first()) {
        intent.fence = Some(format!(
            "{} did not list {} live address object(s) of the pool (for example {first})",
            ledger_ref.describe(),
            intent.adopt.len()
        ));
    }
    intent.end_fence = fence_over;
    // Judged against a fresh list, with no fence to follow: the record is whole.
    if fence_over || intent.fence.is_none() {
        intent.whole_in = ledger.uid.clone();
    }
    Ok(Some(stored))
}

/// Address objects of the pool whose claim is gone (checked on the server, at most a batch at a
/// time, in parallel): left behind by a crash between a claim's release and its address object's
/// deletion, or created from a stale view of a claim that was being deleted.
async fn orphaned_objects(
    ctx: &Context,
    claims: &Selected,
    addresses: &AddressIndex,
) -> Result<Vec<AnyAddress>, Error> {
    let suspects: Vec<(ClaimKey, AnyAddress)> = addresses
        .iter()
        .filter(|(key, address)| {
            let owner = address.claim_uid();
            // Unknown here, or known with another UID than the object's owner.
            claims
                .all
                .get(*key)
                .is_none_or(|uid| owner.as_ref().is_some_and(|o| o != uid))
        })
        // Only then the lock: most objects of a pool have their claim.
        .filter(|(_, address)| {
            let uid = address.meta().uid.as_deref().unwrap_or_default();
            !ctx.recently_deleted_address(uid)
        })
        .take(BATCH)
        .map(|(key, address)| (key.clone(), address.clone()))
        .collect();
    let checked = in_parallel(suspects, |((kind, namespace, name), address)| async move {
        let current = AnyClaim::fetch(ctx, kind, &namespace, &name).await;
        (address, current)
    })
    .await;
    let mut orphaned = Vec::new();
    for (address, current) in checked {
        let owner = address.claim_uid();
        let alive = current?.is_some_and(|uid| owner.as_ref().is_none_or(|o| *o == uid));
        if !alive {
            orphaned.push(address);
        }
    }
    Ok(orphaned)
}

/// Reservations whose claim no longer exists (checked on the server once no create of theirs
/// can land any more, [`ledger::IN_FLIGHT_BOUND`]): a claim deleted while its allocation was in
/// flight.
async fn vanished_reservations(
    ctx: &Context,
    ledger: &Ledger,
    claims: &Selected,
) -> Result<Vec<String>, Error> {
    let known: HashSet<&String> = claims.all.values().collect();
    let now = objects::now().0.to_string();
    let mut vanished = Vec::new();
    for reservation in ledger.pending.values() {
        let old = intent::no_create_can_land(reservation, &now);
        if known.contains(&reservation.claim_uid) || !old {
            continue;
        }
        let mut alive = false;
        for kind in [ClaimKind::Capi, ClaimKind::Metal3] {
            let uid = AnyClaim::fetch(
                ctx,
                kind,
                &reservation.claim_namespace,
                &reservation.claim_name,
            )
            .await?;
            alive |= uid.as_ref() == Some(&reservation.claim_uid);
        }
        if !alive {
            vanished.push(reservation.claim_uid.clone());
        }
    }
    Ok(vanished)
}

/// Addresses the ledger holds with neither a reservation nor an object. Once that has been
/// seen for [`ORPHAN_GRACE`], a fresh list of the pool's address objects decides which are
/// leaked.
async fn unexplained<P: PoolDialect>(
    pool: &P,
    ctx: &Context,
    ledger: &Ledger,
    addresses: &AddressIndex,
) -> Result<Vec<IpAddr>, Error> {
    let key = pool.key();
    let held: HashSet<IpAddr> = addresses.values().filter_map(|a| pool.held(a)).collect();
    let unexplained = |ip: &IpAddr, held: &HashSet<IpAddr>| {
        !held.contains(ip) && !ledger.pending.contains_key(&ip.to_string())
    };
    if !ledger.addresses().any(|ip| unexplained(&ip, &held)) {
        ctx.forget_orphans(&key);
        return Ok(Vec::new());
    }
    if ctx.orphan_watch_start(&key).elapsed() < ORPHAN_GRACE {
        return Ok(Vec::new());
    }
    let fresh: HashSet<IpAddr> = fresh_pool_addresses(pool, ctx)
        .await?
        .iter()
        .filter_map(|a| pool.held(a))
        .collect();
    let leaked: Vec<IpAddr> = ledger
        .addresses()
        .filter(|ip| unexplained(ip, &fresh))
        .collect();
    if !leaked.is_empty() {
        tracing::warn!(pool = %key.describe(), count = leaked.len(), "releasing addresses that no object holds");
    }
    ctx.forget_orphans(&key);
    Ok(leaked)
}

/// Which of `addresses` no address object of the pool holds, by a fresh list (none is taken
/// when there is nothing to check).
async fn unheld<P: PoolDialect>(
    pool: &P,
    ctx: &Context,
    addresses: Vec<IpAddr>,
) -> Result<Vec<IpAddr>, Error> {
    if addresses.is_empty() {
        return Ok(addresses);
    }
    let held: HashSet<IpAddr> = fresh_pool_addresses(pool, ctx)
        .await?
        .iter()
        .filter_map(|a| pool.held(a))
        .collect();
    Ok(addresses
        .into_iter()
        .filter(|ip| !held.contains(ip))
        .collect())
}

/// A pool being deleted keeps its finalizer while any address object refers to it, unless it
/// carries the skip annotation (for `clusterctl move`).
async fn finish_pool_deletion<P: PoolDialect>(pool: &P, ctx: &Context) -> Result<Action, Error> {
    let api = pool.api_for(ctx.client.clone());
    let skip = pool
        .annotations()
        .contains_key(crate::api::capi_pools::SKIP_DELETE_CHECK_ANNOTATION);
    let in_use = fresh_pool_addresses(pool, ctx).await?.len();
    if in_use > 0 && !skip {
        let message = format!(
            "waiting for {in_use} address(es) of the pool to be released before deleting it"
        );
        let condition =
            objects::condition("Ready", false, "Deleting", message, pool.meta().generation);
        let patch = serde_json::json!({ "status": { "conditions": [condition] } });
        // Metal3 IPPools have no conditions; their status rejects nothing but ignores it.
        let _ = api
            .patch_status(
                &pool.name_any(),
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await;
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    transaction::forget(pool, ctx).await?;
    objects::remove_finalizer(&api, pool, P::FINALIZER).await?;
    ctx.ops.metrics.forget_pool(&pool_labels(&pool.key()));
    Ok(Action::await_change())
}

/// A pool as its metrics name it.
fn pool_labels(key: &PoolKey) -> crate::ops::metrics::PoolLabels {
    crate::ops::metrics::PoolLabels {
        kind: key.kind.to_string(),
        namespace: key.namespace.clone().unwrap_or_default(),
        name: key.name.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        AnyClaim::Capi(Arc::new(claim))
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
            claims.sort_by_key(age);
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
        AnyAddress::Metal3(Arc::new(metal3_ipam::Metal3IPAddress {
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
        }))
    }

    /// A claim with two objects keeps the one its status names, else the oldest; the other is
    /// an extra. One object per claim is no extra, whatever the order.
    #[test]
    fn a_claims_second_object_is_an_extra() {
        let key = |claim: &str| (ClaimKind::Metal3, "ns".to_string(), claim.to_string());
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
                HashMap::from([(key("c"), "p-10-0-0-2".to_string())]),
                "p-10-0-0-2",
                "p-10-0-0-1",
            ),
            (
                "the status names an object that is not there",
                HashMap::from([(key("c"), "p-10-0-0-9".to_string())]),
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
