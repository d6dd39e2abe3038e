//! Apply: the address objects transaction 1 calls for are created (within the create window),
//! released and orphaned ones deleted, and existing ones adopted.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::plan::Unkept;
use super::reserve::Reserved;
use super::{Outcomes, Round, Sight, Told, address_key, claim_key, in_parallel, vouches};
use crate::alloc::Lease;
use crate::ipam::Context;
use crate::ipam::dialect::PoolDialect;
use crate::ipam::kinds::{AnyAddress, AnyClaim, Created, NewAddress, Outcome};
use crate::ipam::ledger;
use crate::ipam::ledger::intent::{Found, Intent, Refusal};
use crate::runtime::error::Error;

/// What the object writes leave: transaction 2 as far as they decide it, the objects a create
/// met (judged by transaction 2 before their claim is served with them), and what the orphans
/// and second objects deleted held.
#[derive(Default)]
pub(super) struct Applied {
    /// Transaction 2: confirm what was created, free what was released (the sweep adds leaks).
    pub(super) second: Intent,
    pub(super) found: Vec<(AnyClaim, AnyAddress)>,
    /// What the deleted orphans and second objects held: freed only if a fresh list shows no
    /// other object holding it.
    pub(super) orphans_deleted: Vec<IpAddr>,
    pub(super) told: Told,
}

/// Apply: the address objects of transaction 1's reservations created, then those of released
/// claims, orphans and second objects deleted.
pub(super) async fn apply<P: PoolDialect>(
    round: &Round<'_, P>,
    creates: Vec<AnyClaim>,
    deletes: Vec<(AnyClaim, AnyAddress)>,
    unkept: Unkept,
    reserved: &Reserved<'_, P>,
) -> Result<Applied, Error> {
    let (pool, ctx, spec_error) = (round.pool, round.ctx, &round.spec_error);
    let (outcomes, committed) = (&reserved.outcomes, reserved.committed);
    let mut applied = Applied::default();
    let creating = Creating {
        outcomes,
        committed,
        spec_error,
    };
    create_addresses(pool, ctx, &mut applied, creates, creating).await;
    if round.observed.sight != Sight::Listed {
        // Whether another claim's object holds the address of an object a create met needs the
        // objects: the claim waits for them (its new reservation is released all the same).
        applied.second.found.clear();
        applied.found.clear();
    }
    // Whether another claim's live object holds what a create met, for transaction 2.
    for (found, (claim, _)) in applied.second.found.iter_mut().zip(&applied.found) {
        found.shared = round.observed.addresses.values().any(|other| {
            address_key(other) != claim_key(claim)
                && !other.deleting()
                && pool.held(other) == Some(found.address)
        });
    }
    delete_addresses(pool, ctx, &mut applied, deletes).await?;
    delete_unkept_objects(pool, ctx, &mut applied, unkept).await?;
    Ok(applied)
}

/// Gives existing address objects the owners, finalizer and labels they lack. One changed
/// meanwhile is patched again from the next reconcile's view.
pub(super) async fn adopt_addresses(
    ctx: &Context,
    patches: Vec<(AnyAddress, serde_json::Value)>,
    told: &mut Told,
) -> Result<(), Error> {
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
                told.again_within(Duration::ZERO);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Creates the address objects of the reservations just committed, and records the outcomes.
/// Nothing is created once [`ledger::CREATE_WINDOW`] has passed since the commit (a process that
/// lost the record may be rebuilding it) or once shutdown has begun: the next reconcile commits
/// again and resumes with the same reservations.
/// What the creates of one reconcile go by: transaction 1's outcomes, when it was committed,
/// and why the pool's spec is invalid, if it is.
pub(super) struct Creating<'r> {
    outcomes: &'r Outcomes,
    committed: Instant,
    spec_error: &'r Option<String>,
}

pub(super) async fn create_addresses<P: PoolDialect>(
    pool: &P,
    ctx: &Arc<Context>,
    applied: &mut Applied,
    creates: Vec<AnyClaim>,
    creating: Creating<'_>,
) {
    let Creating {
        outcomes,
        committed,
        spec_error,
    } = creating;
    let key = pool.key();
    let deadline = committed + ledger::CREATE_WINDOW;
    let mut creations: Vec<(AnyClaim, Lease, Result<NewAddress, String>)> = Vec::new();
    for claim in creates {
        let Some(outcome) = claim.id().and_then(|id| outcomes.get(&id.uid)) else {
            continue;
        };
        match outcome {
            Ok(lease) => creations.push((
                claim.clone(),
                lease.clone(),
                pool.new_address(&claim, lease),
            )),
            Err(Refusal::Deferred) => applied.told.again_within(Duration::ZERO),
            Err(refusal) => applied.told.statuses.push((
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
        applied.record_creation(pool, ctx, claim, &lease, object_name, result);
    }
}

impl Applied {
    /// What creating `claim`'s address object for `lease` means for transaction 2 and the
    /// claim's status; `None` when it was not attempted (left for the next reconcile).
    pub(super) fn record_creation<P: PoolDialect>(
        &mut self,
        pool: &P,
        ctx: &Context,
        claim: AnyClaim,
        lease: &Lease,
        object_name: Option<String>,
        result: Option<Result<Created, Error>>,
    ) {
        let Some(uid) = claim.uid() else {
            return;
        };
        let address = match result {
            None => return self.told.again_within(Duration::ZERO),
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
                    return self.told.statuses.push((claim, Outcome::Failed(message)));
                };
                // Whether another claim's object holds it is filled in from the index.
                self.second.found.push(Found {
                    address,
                    claim: id,
                    shared: false,
                });
                return self.found.push((claim, existing));
            }
            Some(Ok(Created::Conflict(message))) => {
                // The name is taken by another object: this reservation is not needed.
                self.second.release.push((lease.address, uid));
                return self.told.statuses.push((claim, Outcome::Failed(message)));
            }
            Some(Err(e)) => {
                tracing::warn!(
                    pool = %pool.key().describe(),
                    claim = %claim.describe(),
                    error = %e,
                    "creating the address object failed; retrying"
                );
                self.told.again_within(Duration::from_secs(1));
                let message = format!("creating the address object failed: {e}");
                return self.told.statuses.push((claim, Outcome::Failed(message)));
            }
        };
        self.second.confirm.push((address, uid));
        self.told.holds::<P>(&claim, address);
        self.told.statuses.push((
            claim,
            Outcome::Allocated {
                address_name: object_name.unwrap_or_default(),
                address: pool.show(address),
            },
        ));
    }
}

/// Deletes the address objects of released claims and of claims that are gone.
pub(super) async fn delete_addresses<P: PoolDialect>(
    pool: &P,
    ctx: &Arc<Context>,
    applied: &mut Applied,
    deletes: Vec<(AnyClaim, AnyAddress)>,
) -> Result<(), Error> {
    let deletions = in_parallel(deletes, |(claim, address)| {
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
            ctx.deleted_address(&address.meta.uid);
            if !vouches(&claim, &address) {
                applied.orphans_deleted.extend(pool.held(&address));
            }
            applied.second.release_claims.extend(claim.uid());
            (applied.told).lets_go::<P>((claim.kind(), claim.meta.name.clone()));
            applied.told.finished.push(claim);
        } else {
            applied.told.again_within(Duration::from_secs(1));
        }
    }
    Ok(())
}

/// Deletes the orphans, then the claims' second objects.
async fn delete_unkept_objects<P: PoolDialect>(
    pool: &P,
    ctx: &Arc<Context>,
    applied: &mut Applied,
    unkept: Unkept,
) -> Result<(), Error> {
    for address in delete_unkept(pool, ctx, applied, unkept.orphaned).await? {
        tracing::warn!(address = %address.describe(), "deleted an address object whose claim is gone");
        (applied.told).lets_go::<P>((address.claim_kind(), address.claim.clone()));
    }
    for address in delete_unkept(pool, ctx, applied, unkept.duplicates).await? {
        let (_, claim) = address.claim();
        tracing::warn!(address = %address.describe(), %claim, "deleted a second address object of a claim; the claim keeps its first");
    }
    Ok(())
}

/// Deletes address objects no claim keeps (orphans, a claim's second objects): what each held
/// is freed once a fresh list shows no other object holding it. Returns those deleted.
pub(super) async fn delete_unkept<P: PoolDialect>(
    pool: &P,
    ctx: &Arc<Context>,
    applied: &mut Applied,
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
                ctx.deleted_address(&address.meta.uid);
                applied.orphans_deleted.push(ip);
                deleted.push(address);
            }
            _ => applied.told.again_within(Duration::from_secs(1)),
        }
    }
    Ok(deleted)
}
