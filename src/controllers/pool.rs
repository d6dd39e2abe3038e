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
use std::time::Duration;

use futures::{StreamExt, stream};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Client, Resource, ResourceExt};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Context;
use super::error::Error;
use super::intent::{self, Intent, Refusal, Request};
use super::kinds::{AnyAddress, AnyClaim, ClaimKind, Created, NewAddress, Outcome};
use super::ledger::{self, Ledger, LedgerRef, Stored};
use super::objects::{self, FinalizerPatch};
use crate::alloc::{self, AddressSpace, Lease};
use crate::api::capi::IPPoolReference;
use crate::api::{capi, metal3_ipam};

/// How many API calls of one kind a reconcile runs at once.
const PARALLEL_CALLS: usize = 16;
/// Ledger writes attempted before a reconcile gives up and retries later.
const LEDGER_ATTEMPTS: usize = 8;
/// How long an address with neither reservation nor object must stay so before a fresh list
/// decides it is leaked (an address object removed by force, or a crash mid-release).
const ORPHAN_GRACE: Duration = Duration::from_secs(30);
/// Periodic re-check of every pool, as a safety net for missed events.
const RESYNC: Duration = Duration::from_secs(600);
/// Re-check of a pool whose claims wait for a free address.
const EXHAUSTED_RECHECK: Duration = Duration::from_secs(30);

/// Which pool a claim or an address object belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolKey {
    pub kind: String,
    /// `None` for a cluster-scoped pool.
    pub namespace: Option<String>,
    pub name: String,
}

impl PoolKey {
    /// The bitpool pool a CAPI `poolRef` names, seen from an object in `namespace`.
    pub fn of_ref(pool_ref: &IPPoolReference, namespace: &str) -> Option<Self> {
        let namespace = match (pool_ref.api_group.as_str(), pool_ref.kind.as_str()) {
            (capi::GROUP, "InClusterIPPool") | (metal3_ipam::GROUP, metal3_ipam::POOL_KIND) => {
                Some(namespace.to_string())
            }
            (capi::GROUP, "GlobalInClusterIPPool") => None,
            _ => return None,
        };
        Some(Self {
            kind: pool_ref.kind.clone(),
            namespace,
            name: pool_ref.name.clone(),
        })
    }

    pub fn of_claim(claim: &capi::IPAddressClaim) -> Option<Self> {
        Self::of_ref(&claim.spec.pool_ref, &claim.namespace()?)
    }

    pub fn of_address(address: &capi::IPAddress) -> Option<Self> {
        Self::of_ref(&address.spec.pool_ref, &address.namespace()?)
    }

    /// The Metal3 IPPool an IPClaim names (always in the claim's own namespace: upstream
    /// serves no other).
    pub fn of_ipclaim(claim: &metal3_ipam::IPClaim) -> Option<Self> {
        let namespace = claim.namespace()?;
        let pool = &claim.spec.pool;
        if pool
            .namespace
            .as_ref()
            .is_some_and(|ns| !ns.is_empty() && *ns != namespace)
        {
            return None;
        }
        Some(Self {
            kind: metal3_ipam::POOL_KIND.to_string(),
            namespace: Some(namespace),
            name: pool.name.clone()?,
        })
    }

    pub fn of_metal3_address(address: &metal3_ipam::Metal3IPAddress) -> Option<Self> {
        Some(Self {
            kind: metal3_ipam::POOL_KIND.to_string(),
            namespace: Some(address.namespace()?),
            name: address.spec.pool.name.clone()?,
        })
    }

    /// The reconcile request for this pool, if it is of kind `P`.
    pub fn object_ref<P: Resource<DynamicType = ()>>(&self) -> Option<ObjectRef<P>> {
        (self.kind == P::kind(&())).then(|| {
            let r = ObjectRef::new(&self.name);
            match &self.namespace {
                Some(ns) => r.within(ns),
                None => r,
            }
        })
    }

    pub fn describe(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.kind, self.name),
            None => format!("{} {}", self.kind, self.name),
        }
    }
}

/// What a pool's status reports, taken from its address space after a transaction.
pub struct Usage {
    pub counts: alloc::Counts,
    /// A few of the allocated addresses the pool no longer contains.
    pub outside: Vec<IpAddr>,
}

impl Usage {
    fn of(space: &AddressSpace) -> Self {
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
}

/// What a pool kind brings to the engine. Everything here is synchronous and pure over the
/// pool and the caches; the engine does the I/O.
pub trait PoolDialect:
    Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Serialize + Send + Sync + 'static
{
    const FINALIZER: &'static str;

    fn key(&self) -> PoolKey {
        PoolKey {
            kind: Self::kind(&()).to_string(),
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
    /// The pool's address space, or why its spec is invalid.
    fn space(&self) -> Result<AddressSpace, String>;
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
    /// The address object `claim` gets for `lease`.
    fn new_address(&self, claim: &AnyClaim, lease: &Lease) -> Option<NewAddress>;
    /// The pool's status patch from `report`, or `None` when nothing changed.
    fn status_patch(&self, report: &Report) -> Option<serde_json::Value>;
}

/// Address objects read from the server (not a cache), for decisions a stale cache must not make.
pub struct FreshAddresses {
    pub capi: Vec<Arc<capi::IPAddress>>,
    pub metal3: Vec<Arc<metal3_ipam::Metal3IPAddress>>,
}

async fn fresh_addresses(ctx: &Context, namespace: Option<&str>) -> Result<FreshAddresses, Error> {
    let capi: Api<capi::IPAddress> = match namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let capi = capi
        .list(&Default::default())
        .await
        .map_err(Error::Kube)?
        .items;
    // Metal3 pools are namespaced: there are no Metal3 addresses of a cluster-scoped pool.
    let metal3 = match namespace {
        Some(ns) => {
            Api::<metal3_ipam::Metal3IPAddress>::namespaced(ctx.client.clone(), ns)
                .list(&Default::default())
                .await
                .map_err(Error::Kube)?
                .items
        }
        None => Vec::new(),
    };
    Ok(FreshAddresses {
        capi: capi.into_iter().map(Arc::new).collect(),
        metal3: metal3.into_iter().map(Arc::new).collect(),
    })
}

async fn fresh_pool_addresses<P: PoolDialect>(
    pool: &P,
    ctx: &Context,
) -> Result<Vec<AnyAddress>, Error> {
    let fresh = fresh_addresses(ctx, pool.key().namespace.as_deref()).await?;
    Ok(pool.addresses(ctx, Some(&fresh)))
}

fn ledger_of<P: PoolDialect>(pool: &P, ctx: &Context) -> Result<LedgerRef, Error> {
    let owner = objects::owner_reference(pool, false)
        .ok_or_else(|| Error::MissingNamespace(pool.name_any()))?;
    let kind = P::kind(&());
    Ok(LedgerRef::new(
        ctx.client.clone(),
        &pool.ledger_namespace(ctx),
        ledger::ledger_name(&kind, &pool.name_any()),
        owner,
        format!("{}.{}", kind.to_lowercase(), pool.name_any()),
    ))
}

/// Reads the ledger, creating it from the pool's address objects the first time.
async fn load_ledger<P: PoolDialect>(
    ledger_ref: &LedgerRef,
    pool: &P,
    ctx: &Context,
) -> Result<Stored, Error> {
    for _ in 0..LEDGER_ATTEMPTS {
        if let Some(stored) = ledger_ref.load().await? {
            return Ok(stored);
        }
        let existing = fresh_pool_addresses(pool, ctx).await?;
        let ledger = Ledger::from_addresses(existing.iter().filter_map(AnyAddress::ip));
        if let Some(stored) = ledger_ref.create(&ledger).await? {
            tracing::info!(pool = %pool.key().describe(), addresses = existing.len(), "created ledger");
            return Ok(stored);
        }
    }
    Err(Error::LedgerContention {
        ledger: ledger_ref.name.clone(),
        attempts: LEDGER_ATTEMPTS,
    })
}

type Outcomes = BTreeMap<String, Result<Lease, Refusal>>;

/// Applies `intent` to the server's ledger, retrying on conflicts with the fresh ledger.
/// `base` is the pool's empty address space and its fingerprint (`None` when the spec is
/// invalid); the space that mirrors the written ledger is kept for the next reconcile.
async fn commit<P: PoolDialect>(
    ledger_ref: &LedgerRef,
    pool: &P,
    ctx: &Context,
    base: Option<&(AddressSpace, (String, i64))>,
    intent: &Intent,
) -> Result<(Ledger, Option<Usage>, Outcomes), Error> {
    let key = pool.key();
    let mut rng = StdRng::from_os_rng();
    let now = objects::now().0.to_string();
    for _ in 0..LEDGER_ATTEMPTS {
        let stored = load_ledger(ledger_ref, pool, ctx).await?;
        let mut space = base.map(|(empty, fingerprint)| {
            ctx.take_space(&key, fingerprint, stored.version())
                .unwrap_or_else(|| {
                    let mut space = empty.clone();
                    space.mark_all_used(stored.ledger.addresses());
                    space
                })
        });
        let (next, outcomes) =
            intent::apply(&stored.ledger, space.as_mut(), intent, &now, &mut rng);
        let written = if next == stored.ledger {
            Some(stored)
        } else {
            ledger_ref.replace(&stored, &next).await?
        };
        let Some(written) = written else {
            tracing::debug!(pool = %key.describe(), "ledger changed under us; recomputing");
            continue;
        };
        let usage = space.as_ref().map(Usage::of);
        if let (Some(space), Some((_, fingerprint)), Some(version)) =
            (space, base, written.version())
        {
            ctx.keep_space(
                &key,
                super::CachedSpace {
                    pool: fingerprint.clone(),
                    ledger_version: version.to_string(),
                    space,
                },
            );
        }
        return Ok((next, usage, outcomes));
    }
    Err(Error::LedgerContention {
        ledger: ledger_ref.name.clone(),
        attempts: LEDGER_ATTEMPTS,
    })
}

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
        Some(c) => c.spec.paused != Some(true) && !objects::is_paused(c.meta()),
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
}

/// Claims are served oldest first (names break ties between claims of the same second).
fn age(
    claim: &AnyClaim,
) -> (
    Option<k8s_openapi::jiff::Timestamp>,
    ClaimKind,
    String,
    String,
) {
    (
        claim.meta().creation_timestamp.as_ref().map(|t| t.0),
        claim.kind(),
        claim.namespace(),
        claim.name(),
    )
}

/// The pool's claims, oldest first, with finalizers added to new ones.
async fn select_claims<P: PoolDialect>(
    pool: &P,
    ctx: &Arc<Context>,
    deleting_pool: bool,
) -> Result<Selected, Error> {
    // The reuse grace period does not hold up the release of a pool that is being deleted.
    let grace = pool.reuse_grace().filter(|_| !deleting_pool);
    let now = k8s_openapi::jiff::Timestamp::now();
    let mut claims = pool.claims(ctx);
    claims.sort_by_key(age);
    let mut selected = Selected {
        live: Vec::new(),
        releasing: Vec::new(),
        grace_wait: None,
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
                let elapsed = now.duration_since(deleted.0).unsigned_abs();
                match grace.filter(|g| *g > elapsed) {
                    Some(g) => {
                        let wait = g - elapsed;
                        selected.grace_wait =
                            Some(selected.grace_wait.map_or(wait, |w| w.min(wait)));
                    }
                    None => selected.releasing.push(claim),
                }
            }
            None if objects::has_finalizer(claim.meta(), finalizer) => selected.live.push(claim),
            None => need_finalizer.push(claim),
        }
    }
    let added = in_parallel(need_finalizer, |claim| {
        let ctx = ctx.clone();
        async move {
            let result = claim
                .set_finalizer(&ctx, P::claim_finalizer(claim.kind()), true)
                .await;
            (claim, result)
        }
    })
    .await;
    for (claim, result) in added {
        if result? == FinalizerPatch::Done {
            selected.live.push(claim);
        }
    }
    // Oldest first: the finalizer patches above complete in any order.
    selected.live.sort_by_key(age);
    Ok(selected)
}

type AddressIndex = HashMap<(ClaimKind, String, String), AnyAddress>;

fn index_addresses(addresses: Vec<AnyAddress>) -> AddressIndex {
    addresses
        .into_iter()
        .map(|a| {
            let (kind, claim) = a.claim();
            (
                (kind, a.meta().namespace.clone().unwrap_or_default(), claim),
                a,
            )
        })
        .collect()
}

fn claim_key(claim: &AnyClaim) -> (ClaimKind, String, String) {
    (claim.kind(), claim.namespace(), claim.name())
}

pub async fn reconcile<P: PoolDialect>(pool: Arc<P>, ctx: Arc<Context>) -> Result<Action, Error> {
    let key = pool.key();
    if objects::is_paused(pool.meta()) {
        return Ok(Action::await_change());
    }
    if pool.paused_by_cluster(&ctx) {
        return Ok(Action::requeue(Duration::from_secs(30)));
    }
    let pool_api = pool.api_for(ctx.client.clone());
    let ledger_ref = ledger_of(&*pool, &ctx)?;
    // A pool being deleted still releases its claims' addresses, but hands out none.
    let deleting = pool.meta().deletion_timestamp.is_some();
    if deleting && !objects::has_finalizer(pool.meta(), P::FINALIZER) {
        return Ok(Action::await_change());
    }
    if !deleting {
        if objects::add_finalizer(&pool_api, &*pool, P::FINALIZER).await? == FinalizerPatch::Stale {
            return Ok(Action::requeue(Duration::from_millis(200)));
        }
        if let Some(patch) = pool.metadata_patch(&ctx) {
            pool_api
                .patch(
                    &pool.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(patch),
                )
                .await
                .map_err(Error::Kube)?;
        }
    }

    let fingerprint = (
        pool.uid().unwrap_or_default(),
        pool.meta().generation.unwrap_or_default(),
    );
    let (space, spec_error) = if deleting {
        (None, Some("the pool is being deleted".to_string()))
    } else {
        match pool.space() {
            Ok(space) => (Some((space, fingerprint)), None),
            Err(e) => (None, Some(e)),
        }
    };

    let claims = select_claims(&*pool, &ctx, deleting).await?;
    let addresses = index_addresses(pool.addresses(&ctx, None));

    // Transaction 1: allocate, bind what is about to lose its address object, confirm what exists.
    let mut first = Intent::default();
    let mut to_create = Vec::new();
    for claim in &claims.live {
        let Some(id) = claim.id() else { continue };
        match addresses
            .get(&claim_key(claim))
            .and_then(|a| Some((a.ip()?, a)))
        {
            Some((ip, object)) if object.meta().deletion_timestamp.is_some() => {
                first.bind.push((ip, id))
            }
            Some((ip, _)) => first.confirm.push((ip, id.uid)),
            None => {
                to_create.push(claim.clone());
                first.allocate.push(Request {
                    claim: id,
                    requested: claim.requested(),
                });
            }
        }
    }
    let mut to_delete = Vec::new();
    let mut released_without_address = Vec::new();
    // A stale cache may miss a just-created address object: ask the server before concluding.
    let fresh = if claims
        .releasing
        .iter()
        .any(|c| !addresses.contains_key(&claim_key(c)))
    {
        Some(index_addresses(fresh_pool_addresses(&*pool, &ctx).await?))
    } else {
        None
    };
    for claim in &claims.releasing {
        let Some(id) = claim.id() else { continue };
        let object = addresses
            .get(&claim_key(claim))
            .or_else(|| fresh.as_ref()?.get(&claim_key(claim)));
        match object.and_then(|a| Some((a.ip()?, a))) {
            Some((ip, a)) => {
                first.bind.push((ip, id));
                to_delete.push((claim.clone(), a.clone()));
            }
            None => {
                first.release_claims.push(id.uid);
                released_without_address.push(claim.clone());
            }
        }
    }
    first.adopt = adoptable(&*pool, &ctx, &ledger_ref, &addresses).await?;
    let (_, _, outcomes) = commit(&ledger_ref, &*pool, &ctx, space.as_ref(), &first).await?;

    // Apply: create address objects for new reservations, delete those of released claims.
    let mut statuses: Vec<(AnyClaim, Outcome)> = Vec::new();
    // Who holds what after this reconcile: every address object, plus what is created below,
    // minus what is released.
    let mut holders: BTreeMap<(ClaimKind, String), IpAddr> = addresses
        .iter()
        .filter_map(|((kind, _, claim), a)| Some(((*kind, claim.clone()), a.ip()?)))
        .collect();
    let mut second = Intent::default();
    let creations: Vec<(AnyClaim, Lease, Option<NewAddress>)> = to_create
        .into_iter()
        .filter_map(|claim| match outcomes.get(&claim.id()?.uid)? {
            Ok(lease) => {
                let object = pool.new_address(&claim, lease);
                Some((claim, lease.clone(), object))
            }
            Err(refusal) => {
                statuses.push((
                    claim,
                    Outcome::Refused {
                        refusal: refusal.clone(),
                        pool: key.describe(),
                        spec_error: spec_error.clone(),
                    },
                ));
                None
            }
        })
        .collect();
    let created = in_parallel(creations, |(claim, lease, object)| {
        let ctx = ctx.clone();
        async move {
            let result = match &object {
                Some(object) => object.create(&ctx).await,
                None => Ok(Created::Conflict(
                    "the claim has no name or namespace".into(),
                )),
            };
            (claim, lease, object.map(|o| o.name()), result)
        }
    })
    .await;
    for (claim, lease, object_name, result) in created {
        let Some(uid) = claim.meta().uid.clone() else {
            continue;
        };
        match result {
            Ok(Created::Confirmed) => {
                second.confirm.push((lease.address, uid));
                holders.insert((claim.kind(), claim.name()), lease.address);
                statuses.push((
                    claim,
                    Outcome::Allocated {
                        address_name: object_name.unwrap_or_default(),
                        address: lease.address,
                    },
                ));
            }
            Ok(Created::Conflict(message)) => {
                // The name is taken by another object: this reservation is not needed.
                second.release.push((lease.address, uid));
                statuses.push((claim, Outcome::Failed(message)));
            }
            Err(e) => {
                tracing::warn!(claim = %claim.name(), error = %e, "creating the address object failed; retrying");
                statuses.push((
                    claim,
                    Outcome::Failed(format!("creating the address object failed: {e}")),
                ));
            }
        }
    }
    for claim in &claims.live {
        if let Some((address, ip)) = addresses
            .get(&claim_key(claim))
            .and_then(|a| Some((a, a.ip()?)))
        {
            holders.insert((claim.kind(), claim.name()), ip);
            statuses.push((
                claim.clone(),
                Outcome::Allocated {
                    address_name: address.name(),
                    address: ip,
                },
            ));
        }
    }

    let deletions = in_parallel(to_delete, |(claim, address)| {
        let ctx = ctx.clone();
        async move {
            let gone = address
                .delete(&ctx, P::address_finalizer(claim.kind()))
                .await;
            (claim, gone)
        }
    })
    .await;
    let mut finished = released_without_address;
    let mut waiting_for_deletion = false;
    for (claim, gone) in deletions {
        if gone? {
            second.release_claims.extend(claim.meta().uid.clone());
            holders.remove(&(claim.kind(), claim.name()));
            finished.push(claim);
        } else {
            waiting_for_deletion = true;
        }
    }

    // Transaction 2: confirm what was created, free what was released, reclaim leaks.
    second.release_unbound = orphans(&*pool, &ctx, &ledger_ref, &addresses).await?;
    let (ledger, usage, _) = commit(&ledger_ref, &*pool, &ctx, space.as_ref(), &second).await?;
    if !first.allocate.is_empty() || !second.is_empty() {
        tracing::info!(
            pool = %key.describe(),
            pending = first.allocate.len(),
            created = second.confirm.len(),
            released = second.release_claims.len(),
            reclaimed = second.release_unbound.len(),
            "reconciled"
        );
    }

    let removals = in_parallel(finished, |claim| {
        let ctx = ctx.clone();
        async move {
            claim
                .set_finalizer(&ctx, P::claim_finalizer(claim.kind()), false)
                .await
        }
    })
    .await;
    for removal in removals {
        removal?;
    }
    let writes = in_parallel(statuses, |(claim, outcome)| {
        let ctx = ctx.clone();
        async move { claim.write_status(&ctx, &outcome).await }
    })
    .await;
    for write in writes {
        if let Err(e) = write {
            tracing::warn!(pool = %key.describe(), error = %e, "claim status not written; retrying later");
        }
    }

    if deleting {
        return finish_pool_deletion(&*pool, &pool_api, &ctx, &ledger_ref).await;
    }
    let report = Report {
        usage: usage.as_ref(),
        ledger: &ledger,
        spec_error: spec_error.as_deref(),
        holders: &holders,
    };
    if let Some(patch) = pool.status_patch(&report) {
        objects::merge_status(&pool_api, &pool.name_any(), patch).await?;
    }

    let mut next = RESYNC;
    // Claims refused for exhaustion in the first transaction get the addresses freed in the
    // second one at once, instead of waiting for another event to trigger a reconcile.
    let exhausted = outcomes
        .values()
        .any(|o| matches!(o, Err(Refusal::Alloc(alloc::AllocError::Exhausted))));
    let freed = !second.release.is_empty()
        || !second.release_claims.is_empty()
        || !second.release_unbound.is_empty();
    if exhausted && freed {
        next = Duration::from_millis(100);
    } else if exhausted {
        // A release normally triggers a reconcile by its events; this is the safety net.
        next = next.min(EXHAUSTED_RECHECK);
    }
    if let Some(wait) = claims.grace_wait {
        next = next.min(wait);
    }
    if waiting_for_deletion {
        next = next.min(Duration::from_secs(1));
    }
    if ctx.orphan_watch(&key).is_some() {
        next = next.min(ORPHAN_GRACE);
    }
    Ok(Action::requeue(next))
}

/// Address objects of the pool the ledger does not list, verified on the server (an address
/// that another provider allocated before bitpool took over, for example).
async fn adoptable<P: PoolDialect>(
    pool: &P,
    ctx: &Context,
    ledger_ref: &LedgerRef,
    addresses: &AddressIndex,
) -> Result<Vec<IpAddr>, Error> {
    let ledger = load_ledger(ledger_ref, pool, ctx).await?.ledger;
    if addresses
        .values()
        .filter_map(AnyAddress::ip)
        .all(|ip| ledger.contains(ip))
    {
        return Ok(Vec::new());
    }
    let fresh = fresh_pool_addresses(pool, ctx).await?;
    Ok(fresh
        .iter()
        .filter_map(AnyAddress::ip)
        .filter(|ip| !ledger.contains(*ip))
        .collect())
}

/// Addresses the ledger holds with neither a reservation nor an object. Once that has been
/// seen for [`ORPHAN_GRACE`], a fresh list of the pool's address objects decides which are
/// leaked.
async fn orphans<P: PoolDialect>(
    pool: &P,
    ctx: &Context,
    ledger_ref: &LedgerRef,
    addresses: &AddressIndex,
) -> Result<Vec<IpAddr>, Error> {
    let key = pool.key();
    let ledger = load_ledger(ledger_ref, pool, ctx).await?.ledger;
    let held: HashSet<IpAddr> = addresses.values().filter_map(AnyAddress::ip).collect();
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
        .filter_map(AnyAddress::ip)
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

/// A pool being deleted keeps its finalizer while any address object refers to it, unless it
/// carries the skip annotation (for `clusterctl move`).
async fn finish_pool_deletion<P: PoolDialect>(
    pool: &P,
    api: &Api<P>,
    ctx: &Context,
    ledger_ref: &LedgerRef,
) -> Result<Action, Error> {
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
    // The ledger goes with the pool (it is owned by it); delete it now rather than wait for GC.
    let ledgers: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(ctx.client.clone(), &ledger_ref.namespace);
    match ledgers
        .delete(&ledger_ref.name, &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(Error::Kube(e)),
    }
    objects::remove_finalizer(api, pool, P::FINALIZER).await?;
    Ok(Action::await_change())
}
