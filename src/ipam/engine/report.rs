//! Report: claim finalizers and statuses, the pool's status, Events and metrics, and when to
//! look at the pool again.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;

use super::apply::adopt_addresses;
use super::read::Selected;
use super::settle::Settled;
use super::{
    EXHAUSTED_RECHECK, Holder, Holding, ORPHAN_GRACE, Round, Sight, Told, UNLISTED_RECHECK,
    in_parallel,
};
use crate::alloc;
use crate::ipam::Context;
use crate::ipam::dialect::{PoolDialect, PoolSpace, Report, fresh_pool_addresses};
use crate::ipam::duplicates::{self, SharedAddress};
use crate::ipam::key::PoolKey;
use crate::ipam::kinds::{AnyAddress, AnyClaim, ClaimKind, Outcome, refusal_message};
use crate::ipam::ledger;
use crate::ipam::ledger::intent::Refusal;
use crate::ipam::overlaps::{self, Overlap};
use crate::ipam::tenancy::{self, Reach, Tenancy};
use crate::ops::events::Reason;
use crate::runtime::error::Error;
use crate::runtime::objects;

/// What the plan leaves for the report beside what it told: the addresses held twice and who
/// held what as the reconcile found it.
pub(super) struct Reported {
    pub(super) shared: Vec<SharedAddress>,
    pub(super) holders: BTreeMap<Holder, IpAddr>,
    pub(super) told: Told,
}

/// Report: existing objects adopted, claim finalizers and statuses, then (unless the pool is
/// going) the pool's status, Events and when to look again. A ledger error waits until the
/// releases are reported.
pub(super) async fn report<P: PoolDialect>(
    round: &Round<'_, P>,
    planned: Reported,
    done: Settled,
) -> Result<Action, Error> {
    let (pool, ctx) = (round.pool, round.ctx);
    let spec_error = round.spec_error.as_deref();
    let key = pool.key();
    let Settled {
        ledger,
        usage,
        first,
        outcomes,
        second,
        ledger_error,
        told,
    } = done;
    let mut told = planned.told.then(told);
    let adoptions = std::mem::take(&mut told.adoptions);
    adopt_addresses(ctx, adoptions, &mut told).await?;
    let Told {
        statuses,
        finished,
        holdings,
        foreign,
        next,
        ..
    } = told;
    finish_claims(
        ctx,
        &key,
        pool.object_ref(&()),
        finished,
        P::claim_finalizer,
    )
    .await?;
    write_statuses(ctx, &key, pool.object_ref(&()), statuses).await;
    if let Some(e) = ledger_error {
        return Err(e);
    }
    if round.observed.sight != Sight::Listed {
        // The pool's status (its counts, duplicates and overlaps) waits for the lists.
        tracing::debug!(pool = %key.describe(), sight = ?round.observed.sight, "claims served before every claim and address object was listed");
        let next = next.map_or(UNLISTED_RECHECK, |n| n.min(UNLISTED_RECHECK));
        return Ok(Action::requeue(next));
    }
    if pool.meta().deletion_timestamp.is_some() {
        return finish_pool_deletion(pool, ctx).await;
    }
    let overlaps = overlapping_pools(pool, ctx);
    let holders = hold(planned.holders, holdings);
    let report = Report {
        usage: usage.as_ref(),
        ledger: &ledger,
        spec_error,
        holders: &holders,
        shared: &planned.shared,
        overlaps: &overlaps,
        reach: reach(pool, ctx),
    };
    report_foreign(pool, ctx, &foreign);
    write_pool_status(pool, ctx, report).await?;
    let settled = Ledgered {
        ledger: &ledger,
        first: &first,
        outcomes: &outcomes,
        second: &second,
    };
    let next = next_check(next, settled, &round.observed.claims, ctx, &key);
    tracing::debug!(pool = %key.describe(), next = ?next, "pool checked");
    Ok(Action::requeue(next))
}

/// The pool's status, and what it says told as Events and metrics: addresses held twice, pools
/// that meet, an invalid spec.
async fn write_pool_status<P: PoolDialect>(
    pool: &P,
    ctx: &Context,
    report: Report<'_>,
) -> Result<(), Error> {
    report_shared(pool, ctx, report.shared);
    report_overlaps(pool, ctx, report.overlaps);
    if let Some(patch) = pool.status_patch(&report) {
        let api = pool.api_for(ctx.client.clone());
        objects::merge_status(&api, &pool.name_any(), patch).await?;
        if let Some(problem) = report.spec_error {
            let note = format!("the pool hands out no address: {problem}");
            ctx.ops
                .events
                .publish(pool.object_ref(&()), Reason::InvalidSpec, note);
        }
    }
    Ok(())
}

/// Who holds what after this reconcile: `found`, changed as the phases said.
fn hold(mut found: BTreeMap<Holder, IpAddr>, holdings: Vec<Holding>) -> BTreeMap<Holder, IpAddr> {
    for holding in holdings {
        match holding {
            Holding::Holds(holder, ip) => found.insert(holder, ip),
            Holding::LetGo(holder) => found.remove(&holder),
        };
    }
    found
}

/// What the two transactions left, as the last look at the pool reads it.
pub(super) struct Ledgered<'d> {
    ledger: &'d crate::ipam::ledger::Ledger,
    first: &'d crate::ipam::ledger::Intent,
    outcomes: &'d crate::ipam::dialect::Outcomes,
    second: &'d crate::ipam::ledger::Intent,
}

/// How many namespaces `pool`'s selector selects, as the namespace cache shows them; a process
/// that watches one namespace cannot say.
fn reach<P: PoolSpace>(pool: &P, ctx: &Context) -> Reach {
    // An invalid selector is the pool's InvalidSpec; no selector, no condition (and no walk
    // over the namespaces on every reconcile of every pool).
    let tenancy = match pool.tenancy() {
        Ok(Tenancy::Everyone) | Err(_) => return Reach::Everyone,
        Ok(selected) => selected,
    };
    if ctx.settings.namespace.is_some() {
        return Reach::Unknown;
    }
    let namespaces = ctx.namespaces.state();
    tenancy.reach(namespaces.iter().map(|n| tenancy::labels(n)))
}

/// What the two transactions did, as metrics, with the claims left waiting.
pub(super) fn count<P: PoolDialect>(pool: &P, ctx: &Context, done: &Settled, claims: &Selected) {
    let metrics = &ctx.ops.metrics;
    let waiting: Vec<&AnyClaim> = claims
        .live
        .iter()
        .filter(|c| {
            c.uid()
                .is_some_and(|uid| matches!(done.outcomes.get(&uid), Some(Err(_))))
        })
        .collect();
    let oldest = waiting
        .iter()
        .filter_map(|c| c.meta.created())
        .map(|t| t.as_second() as f64)
        .reduce(f64::min);
    metrics.pool_pending(&pool_labels(&pool.key()), waiting.len(), oldest);
    metrics.allocated(P::KIND.as_str(), done.second.confirm.len());
    let released = done.second.release.len()
        + done.second.release_claims.len()
        + done.second.release_unbound.len();
    metrics.released(P::KIND.as_str(), released);
    if let Some(usage) = &done.usage {
        metrics.pool_usage(&pool_labels(&pool.key()), &usage.counts);
    }
}

/// What a reconcile changed, for its one log line.
pub(super) struct Changed {
    pending: usize,
    created: usize,
    released: usize,
    reclaimed: usize,
}

impl Changed {
    pub(super) fn of(done: &Settled, reclaimed_objects: usize) -> Self {
        Self {
            pending: done.first.allocate.len(),
            created: done.second.confirm.len(),
            released: done.second.release_claims.len(),
            reclaimed: done.second.release_unbound.len() + reclaimed_objects,
        }
    }

    /// One line for a reconcile that changed something, with where its time went.
    pub(super) fn log<P: PoolSpace>(&self, pool: &P, timeline: &super::Timeline) {
        let changed = self.pending + self.created + self.released + self.reclaimed;
        if changed > 0 {
            tracing::info!(
                pool = %pool.key().describe(),
                pending = self.pending,
                created = self.created,
                released = self.released,
                reclaimed = self.reclaimed,
                phases = %timeline,
                "reconciled"
            );
        }
    }
}

/// Says so when the pool's objects hold an address for more than one claim: the log, an Event
/// and the metric (the status says it too, where the pool kind has conditions).
pub(super) fn report_shared<P: PoolSpace>(pool: &P, ctx: &Context, shared: &[SharedAddress]) {
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
pub(super) fn report_foreign<P: PoolSpace>(pool: &P, ctx: &Context, foreign: &[AnyAddress]) {
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

/// Other pools, of every kind, whose addresses meet this one's (from the caches, found again
/// only when some pool's coverage changed: [`crate::ipam::coverage`]).
pub(super) fn overlapping_pools<P: PoolSpace>(pool: &P, ctx: &Context) -> Vec<Overlap> {
    let coverage = &ctx.coverage;
    let Some(own) = coverage.covered(pool) else {
        return Vec::new();
    };
    let find = || {
        forget_gone_pools(ctx);
        let key = pool.key();
        let others = (coverage.pools_of(&ctx.pools).into_iter())
            .chain(coverage.pools_of(&ctx.global_pools))
            .chain(coverage.pools_of(&ctx.prefix_pools))
            .chain(coverage.pools_of(&ctx.global_prefix_pools))
            .chain(coverage.pools_of(&ctx.ippools))
            .filter(|(other, _)| *other != key);
        overlaps::find(&own, others)
    };
    coverage.meets(pool, |key| ctx.pool_exists(key), find)
}

/// Lets the coverage and the remembered ledgers forget pools that are gone, once either keeps
/// more than there are.
fn forget_gone_pools(ctx: &Context) {
    fn uids<Q: PoolSpace>(store: &Store<Q>) -> Vec<String> {
        (store.state().iter())
            .filter_map(|p| p.meta().uid.clone())
            .collect()
    }
    let there = ctx.pools.len()
        + ctx.global_pools.len()
        + ctx.prefix_pools.len()
        + ctx.global_prefix_pools.len()
        + ctx.ippools.len();
    let kept = ctx.coverage.len().max(ctx.records.len());
    if kept <= there + FORGET_BEYOND {
        return;
    }
    let all: Vec<String> = [
        uids(&ctx.pools),
        uids(&ctx.global_pools),
        uids(&ctx.prefix_pools),
        uids(&ctx.global_prefix_pools),
        uids(&ctx.ippools),
    ]
    .concat();
    let present = all.iter().map(String::as_str).collect();
    ctx.coverage.retain(&present);
    ctx.records.retain(&present);
}

/// How many gone pools the coverage may keep before it forgets them.
const FORGET_BEYOND: usize = 64;

/// Says so when the pool meets others: an Event and the metric (and the status, where the
/// pool kind has conditions).
pub(super) fn report_overlaps<P: PoolSpace>(pool: &P, ctx: &Context, overlaps: &[Overlap]) {
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

/// How many claims of one reconcile are told an Event each when their address is allocated or
/// released. More are told as one Event on the pool: in a burst an Event per claim costs the API
/// server a write each (a twentieth of its time in a burst of 10,000 claims) and tells no more
/// than the claims' statuses, and a released claim is gone right after its Event.
const EVENTS_PER_CLAIM_UP_TO: usize = 16;

/// Whom a reconcile tells that `claims` claims had their address allocated or released.
#[derive(Debug, PartialEq, Eq)]
enum Telling {
    EachClaim,
    /// One Event on the pool, counting them.
    Pool(usize),
}

fn telling(claims: usize) -> Telling {
    match claims {
        n if n > EVENTS_PER_CLAIM_UP_TO => Telling::Pool(n),
        _ => Telling::EachClaim,
    }
}

/// Removes the finalizer of claims whose address went back to the pool, and tells it.
pub(super) async fn finish_claims(
    ctx: &Arc<Context>,
    key: &PoolKey,
    pool: ObjectReference,
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
    let mut released = Vec::with_capacity(removals.len());
    for (claim, removal) in removals {
        if let Err(e) = removal {
            tracing::warn!(pool = %key.describe(), claim = %claim.describe(), error = %e, "releasing the claim's finalizer failed");
            return Err(e);
        }
        released.push(claim);
    }
    let events = &ctx.ops.events;
    match telling(released.len()) {
        Telling::EachClaim => {
            for claim in released {
                let note = format!("the address went back to {}", key.describe());
                events.publish(claim.object_ref(), Reason::AddressReleased, note);
            }
        }
        Telling::Pool(n) => {
            let note = format!("the addresses of {n} deleted claims went back to the pool");
            // Covered: a reconcile whose cache still shows them releases them again.
            let covered = released.iter().map(AnyClaim::object_ref);
            events.publish_covering(pool, Reason::AddressReleased, note, covered);
        }
    }
    Ok(())
}

/// Writes the claims' statuses; a status that changed is also told as an Event (allocations
/// in bulk as one, on the pool).
pub(super) async fn write_statuses(
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
    let mut changed = Vec::with_capacity(writes.len());
    for (claim, outcome, write) in writes {
        match write {
            Ok(true) => changed.push((claim, outcome)),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(pool = %key.describe(), claim = %claim.describe(), error = %e, "claim status not written; retrying later")
            }
        }
    }
    let (allocated, others): (Vec<_>, Vec<_>) = changed
        .into_iter()
        .partition(|(_, outcome)| matches!(outcome, Outcome::Allocated { .. }));
    let events = &ctx.ops.events;
    let told_each = match telling(allocated.len()) {
        Telling::EachClaim => allocated,
        Telling::Pool(n) => {
            let note = format!("allocated {n} addresses, one to each of {n} claims");
            let covered = allocated.iter().map(|(claim, _)| claim.object_ref());
            let reason = Reason::AddressAllocated;
            events.publish_covering(pool.clone(), reason, note, covered);
            Vec::new()
        }
    };
    let mut newly_exhausted = 0;
    for (claim, outcome) in told_each.iter().chain(&others) {
        if let Some(Reason::PoolExhausted) = claim_event(ctx, key, claim, outcome) {
            newly_exhausted += 1;
        }
    }
    if newly_exhausted > 0 {
        let note = format!("no free address for {newly_exhausted} new claim(s)");
        events.publish(pool, Reason::PoolExhausted, note);
    }
}

/// Tells a claim's new status as an Event; says which.
pub(super) fn claim_event(
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
            refusal: refusal @ Refusal::Alloc(alloc::AllocError::Exhausted),
            pool,
            spec_error,
        } => (
            Reason::PoolExhausted,
            refusal_message(pool, refusal, spec_error.as_deref()),
        ),
        Outcome::Refused {
            refusal: refusal @ Refusal::NamespaceNotSelected { .. },
            pool,
            spec_error,
        } => {
            let reason = Reason::NamespaceNotSelected;
            ctx.ops
                .metrics
                .claim_refused(key.kind.as_str(), reason.as_str());
            (
                reason,
                refusal_message(pool, refusal, spec_error.as_deref()),
            )
        }
        _ => return None,
    };
    ctx.ops.events.publish(claim.object_ref(), reason, note);
    Some(reason)
}

/// When to look at the pool again.
pub(super) fn next_check(
    told: Option<Duration>,
    done: Ledgered<'_>,
    claims: &Selected,
    ctx: &Context,
    key: &PoolKey,
) -> Duration {
    let outcomes = done.outcomes;
    let mut next = told.unwrap_or(ctx.settings.sync_period);
    let waiting = |refusal: fn(&Refusal) -> bool| {
        outcomes
            .values()
            .any(|o| o.as_ref().err().is_some_and(refusal))
    };
    let exhausted = waiting(|r| matches!(r, Refusal::Alloc(alloc::AllocError::Exhausted)));
    let freed = !done.second.release.is_empty()
        || !done.second.release_claims.is_empty()
        || !done.second.release_unbound.is_empty();
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
    if let Some(rebuilt) = done.ledger.rebuilt_at.as_deref() {
        // A fence that is over is ended, in the record and in the pool's status, by a
        // reconcile: one comes when the fence ends, not only at the sync period.
        if let Ok(rebuilt) = rebuilt.parse::<k8s_openapi::jiff::Timestamp>() {
            let passed = objects::elapsed(rebuilt, objects::now().0);
            next = next.min(ledger::REBUILD_FENCE.saturating_sub(passed) + Duration::from_secs(1));
        }
    }
    if !done.first.release_unlanded.is_empty() || !done.ledger.pending.is_empty() {
        // A reservation left is completed by its claim's next reconcile, or, its claim gone,
        // freed once no create of it can land: whichever event comes, this one does.
        next = next.min(ledger::IN_FLIGHT_BOUND);
    }
    next
}

/// A pool being deleted keeps its finalizer while any address object refers to it, unless it
/// carries the skip annotation or clusterctl's delete-for-move.
pub(super) async fn finish_pool_deletion<P: PoolDialect>(
    pool: &P,
    ctx: &Context,
) -> Result<Action, Error> {
    let api = pool.api_for(ctx.client.clone());
    let skip = pool
        .annotations()
        .contains_key(crate::api::capi_pools::SKIP_DELETE_CHECK_ANNOTATION)
        || crate::ipam::moving::leaving(pool.meta());
    let in_use = fresh_pool_addresses(pool, ctx).await?.len();
    if in_use > 0 && !skip {
        let message = format!(
            "waiting for {in_use} address(es) of the pool to be released before deleting it"
        );
        let condition =
            objects::condition("Ready", false, "Deleting", message, pool.meta().generation);
        let patch = serde_json::json!({ "status": { "conditions": [condition] } });
        // Metal3 IPPools have no conditions; their status rejects nothing but ignores it. The
        // wait is reported again on the next look, so a failed write costs nothing.
        let _ = objects::merge_status(&api, &pool.name_any(), patch).await;
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    ledger::forget(pool, ctx).await?;
    objects::remove_finalizer(&api, pool, P::FINALIZER).await?;
    ctx.ops.metrics.forget_pool(&pool_labels(&pool.key()));
    Ok(Action::await_change())
}

/// A pool as its metrics name it.
pub(super) fn pool_labels(key: &PoolKey) -> crate::ops::metrics::PoolLabels {
    crate::ops::metrics::PoolLabels {
        kind: key.kind.to_string(),
        namespace: key.namespace.clone().unwrap_or_default(),
        name: key.name.clone(),
    }
}
