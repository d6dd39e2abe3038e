//! The pool engine: one reconcile per pool, whatever its dialect, serving all of the pool's
//! claims in a batch, in named phases, one file each. Each phase takes what the one before
//! returned and returns its own; none shares a mutable batch with another:
//!
//! 1. [`read`] → `Observed`: the pool's claims and their address objects, from the caches
//!    and, where a stale cache must not decide, from the server;
//! 2. [`plan`] → `Plan`: what the reconcile does, decided from what was read with no client
//!    and no await (table-tested): transaction 1, the creates and deletes, what to tell;
//! 3. [`reserve`] → `Reserved`: transaction 1 on the ledger (reservations, binds,
//!    confirmations) in the reconcile's ledger session, after repairing a record that lost
//!    something;
//! 4. [`apply`] → `Applied`: address objects created and deleted, and transaction 2 as far as
//!    those writes decide it;
//! 5. [`settle`] → `Settled`: the record read again, what no object explains swept,
//!    and transaction 2 (what was created, released or leaked);
//! 6. [`report`] → `Action`: existing objects adopted, claim finalizers and statuses, the pool's
//!    status, Events, metrics and the next check.
//!
//! What each phase leaves the report to write and tell is its `Told`, taken in phase order.
//! What differs between the in-cluster provider's pools and Metal3's IPPool is the
//! [`PoolDialect`]; the engine, the ledger and the allocation core are shared.

mod apply;
mod plan;
mod read;
mod report;
mod reserve;
mod settle;

pub(crate) use read::age;

#[cfg(test)]
mod scenarios;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, stream};
use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::Context;
use super::dialect::{Outcomes, PoolDialect};
use super::kinds::{AnyAddress, AnyClaim, ClaimKind, Outcome};
use super::{moving, spec};
use crate::runtime::error::Error;
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

/// Re-check of a pool looked at before its claims or address objects were listed: the first
/// reconcile after the lists does what that one left.
const UNLISTED_RECHECK: Duration = Duration::from_secs(1);

/// What a reconcile sees of the pool's claims and address objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sight {
    /// The watch caches hold them, however late: every claim is served, released and checked.
    Listed,
    /// They are still being listed (the process has just started; 100,000 take seconds). The
    /// ledger is the authority on what is taken, so new claims, whose status names no object,
    /// are served from a whole, unfenced ledger as though no object were cached, which a
    /// lagging cache already is ([`read::may_serve_unlisted`]). Releases, sweeps, orphans,
    /// claims whose object turns up, and the pool's status wait for the list.
    Unlisted,
    /// The claims are still being listed too: as [`Self::Unlisted`], for the claims made or
    /// changed since the process began to watch ([`crate::runtime::arrivals`]). Those claims
    /// are true but not all there are, and nothing above is decided from what they lack.
    Arriving,
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

/// A claim, as its address objects name it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ClaimKey {
    kind: ClaimKind,
    // Shared with the cached objects: every reconcile keys each of the pool's claims.
    namespace: Arc<str>,
    name: Arc<str>,
}

/// The pool's address objects, one per claim.
type AddressIndex = HashMap<ClaimKey, AnyAddress>;

/// The claim an address object names.
fn address_key(address: &AnyAddress) -> ClaimKey {
    ClaimKey {
        kind: address.claim_kind(),
        namespace: address.meta.namespace().clone(),
        name: address.claim.clone(),
    }
}

fn claim_key(claim: &AnyClaim) -> ClaimKey {
    ClaimKey {
        kind: claim.kind(),
        namespace: claim.meta.namespace().clone(),
        name: claim.meta.name.clone(),
    }
}

/// Whether `claim`'s status names `object`: then bitpool made it for the claim.
fn vouches(claim: &AnyClaim, object: &AnyAddress) -> bool {
    claim.status_address() == Some(&object.meta.name)
}

/// A claim as a pool's status names its holder (Metal3's `status.allocations`).
type Holder = (ClaimKind, Arc<str>);

/// A change to who holds what, in the order the phases made it.
enum Holding {
    Holds(Holder, IpAddr),
    LetGo(Holder),
}

/// What a phase leaves for the report to write and tell: each phase returns its own, and the
/// report takes them all in phase order.
#[derive(Default)]
struct Told {
    statuses: Vec<(AnyClaim, Outcome)>,
    /// Claims whose address is released: their finalizer goes.
    finished: Vec<AnyClaim>,
    /// Existing address objects lacking owners, finalizer or labels, with the patch that adds them.
    adoptions: Vec<(AnyAddress, serde_json::Value)>,
    /// Who came to hold what, or let it go (kept only where the pool's status names holders).
    holdings: Vec<Holding>,
    /// Address objects bitpool did not make, which hold nothing for it: the report names them.
    foreign: Vec<AnyAddress>,
    /// The soonest this pool must be reconciled again.
    next: Option<Duration>,
}

impl Told {
    fn again_within(&mut self, after: Duration) {
        self.next = Some(self.next.map_or(after, |n| n.min(after)));
    }

    /// `claim` holds `ip` after this reconcile (kept only where the pool's status names holders).
    fn holds<P: PoolDialect>(&mut self, claim: &AnyClaim, ip: IpAddr) {
        if P::STATUS_NAMES_HOLDERS {
            let holder = (claim.kind(), claim.meta.name.clone());
            self.holdings.push(Holding::Holds(holder, ip));
        }
    }

    /// `holder` holds nothing after this reconcile.
    fn lets_go<P: PoolDialect>(&mut self, holder: Holder) {
        if P::STATUS_NAMES_HOLDERS {
            self.holdings.push(Holding::LetGo(holder));
        }
    }

    /// `later`, told by a later phase, after this.
    fn then(mut self, later: Told) -> Self {
        self.statuses.extend(later.statuses);
        self.finished.extend(later.finished);
        self.adoptions.extend(later.adoptions);
        self.holdings.extend(later.holdings);
        self.foreign.extend(later.foreign);
        if let Some(next) = later.next {
            self.again_within(next);
        }
        self
    }
}

/// One reconcile of a pool, phase by phase (see the module's documentation): each phase takes
/// what the one before returned.
pub async fn reconcile<P: PoolDialect>(pool: Arc<P>, ctx: Arc<Context>) -> Result<Action, Error> {
    let pool = &*pool;
    let sight = match (P::claims_listed(&ctx), P::addresses_listed(&ctx)) {
        (true, true) => Sight::Listed,
        (true, false) if read::may_serve_unlisted(pool) => Sight::Unlisted,
        (false, _) if read::may_serve_unlisted(pool) => Sight::Arriving,
        _ => return Ok(Action::requeue(UNLISTED_RECHECK)),
    };
    if let Some(action) = gate(pool, &ctx).await? {
        return Ok(action);
    }
    let deleting = pool.meta().deletion_timestamp.is_some();
    let (base, spec_error) = match base_space(pool, deleting) {
        Ok(base) => (Some(base), None),
        Err(problem) => (None, Some(problem)),
    };
    let mut timeline = Timeline::start();
    let Some(observed) = read::observe(pool, &ctx, deleting, sight).await? else {
        return Ok(Action::requeue(UNLISTED_RECHECK));
    };
    let plan = plan::plan(pool, &observed, base.as_ref());
    timeline.mark("read");
    let round = Round {
        pool,
        ctx: &ctx,
        observed,
        base,
        spec_error,
    };
    let plan::Plan {
        first,
        creates,
        deletes,
        unkept,
        found,
        shared,
        holders,
        told: planned,
    } = plan;
    let reclaimed = unkept.orphaned.len();
    let reserved = reserve::reserve(&round, first, found).await;
    timeline.mark("reserve");
    let applied = apply::apply(&round, creates, deletes, unkept, &reserved).await?;
    timeline.mark("apply");
    let settled = settle::settle(&round, reserved, applied).await;
    timeline.mark("settle");
    report::count(pool, &ctx, &settled, &round.observed.claims);
    let changed = report::Changed::of(&settled, reclaimed);
    let planned = report::Reported {
        shared,
        holders,
        told: planned,
    };
    let action = report::report(&round, planned, settled).await;
    timeline.mark("report");
    changed.log(pool, &timeline);
    action
}

/// How long each phase of a reconcile took, for its log line: where a batch's time goes.
struct Timeline {
    last: std::time::Instant,
    phases: Vec<(&'static str, Duration)>,
}

impl Timeline {
    fn start() -> Self {
        Self {
            last: std::time::Instant::now(),
            phases: Vec::with_capacity(4),
        }
    }

    /// Ends `phase` now.
    fn mark(&mut self, phase: &'static str) {
        let now = std::time::Instant::now();
        self.phases.push((phase, now - self.last));
        self.last = now;
    }
}

impl std::fmt::Display for Timeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (phase, took)) in self.phases.iter().enumerate() {
            let gap = if i == 0 { "" } else { " " };
            write!(f, "{gap}{phase} {} ms", took.as_millis())?;
        }
        Ok(())
    }
}

/// What the phases after the plan work from: the pool, the context, what was read, and the
/// pool's empty address space (or why it has none).
struct Round<'a, P> {
    pool: &'a P,
    ctx: &'a Arc<Context>,
    observed: read::Observed,
    base: Option<spec::Base>,
    spec_error: Option<String>,
}

/// What stops a reconcile before it reads anything: a move under way ([`moving`]), a paused
/// pool (which only protects its claims), a paused Cluster, a pool being deleted that is
/// already let go, and the pool's own finalizer and metadata.
async fn gate<P: PoolDialect>(pool: &P, ctx: &Arc<Context>) -> Result<Option<Action>, Error> {
    if let Some(action) = moving::step(pool, ctx).await? {
        return Ok(Some(action));
    }
    if objects::is_paused(pool.meta()) {
        return read::protect_claims(pool, ctx).await.map(Some);
    }
    // A paused Cluster pauses everything of its own, finalizers too (as upstream).
    if pool.paused_by_cluster(ctx) {
        return Ok(Some(Action::requeue(Duration::from_secs(30))));
    }
    // A pool being deleted still releases its claims' addresses, but hands out none.
    let deleting = pool.meta().deletion_timestamp.is_some();
    if deleting && !objects::has_finalizer(pool.meta(), P::FINALIZER) {
        return Ok(Some(Action::await_change()));
    }
    if !deleting && prepare_pool(pool, ctx).await? == FinalizerPatch::Stale {
        return Ok(Some(Action::requeue(Duration::from_millis(200))));
    }
    Ok(None)
}

/// Whether `object` serves `claim` as the plan takes it: it holds an address of the pool, and
/// if it is going, bitpool made it for the claim (its address stays the claim's until it is
/// gone). A claim with no such object gets a reservation.
fn usable<P: PoolDialect>(pool: &P, claim: &AnyClaim, object: &AnyAddress) -> bool {
    claim.id().is_some()
        && pool.held(object).is_some()
        && (!object.deleting() || vouches(claim, object))
}

/// The pool's empty address space, or why there is none (an invalid spec, a pool being deleted).
fn base_space<P: PoolDialect>(pool: &P, deleting: bool) -> Result<spec::Base, String> {
    if deleting {
        return Err("the pool is being deleted".to_string());
    }
    // An invalid selector makes the pool invalid: it must not serve namespaces it meant to shut out.
    pool.tenancy()?;
    Ok(spec::Base {
        space: pool.space()?,
        spec: spec::SpecFingerprint {
            uid: pool.uid().unwrap_or_default(),
            generation: pool.meta().generation.unwrap_or_default(),
        },
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
