//! Reserve: the record repaired where it lost something, then transaction 1 (reservations,
//! binds, confirmations) in the reconcile's ledger session.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use super::{AddressIndex, ClaimKey, Outcomes, Round, Told, address_key, keep_first};
use crate::ipam::Context;
use crate::ipam::dialect::{PoolDialect, fresh_pool_addresses};
use crate::ipam::kinds::{AnyAddress, AnyClaim};
use crate::ipam::ledger::commit::Start;
use crate::ipam::ledger::{self, Intent, Ledger, Session};
use crate::runtime::error::Error;
use crate::runtime::objects;

/// What transaction 1 left for the phases after it.
pub(super) struct Reserved<'a, P> {
    pub(super) session: Session<'a, P>,
    /// Transaction 1, as committed.
    pub(super) first: Intent,
    /// Each request's lease or refusal.
    pub(super) outcomes: Outcomes,
    /// The ledger as transaction 1 left it, for transaction 2 to start from.
    pub(super) stored: Option<ledger::Stored>,
    /// When it was committed: creates for its reservations start their window here.
    pub(super) committed: std::time::Instant,
    /// The first ledger error: it does not hold up releases and is returned once they are done.
    pub(super) ledger_error: Option<Error>,
    /// The claims whose objects it judged, served or told why not; objects bitpool did not make.
    pub(super) told: Told,
}

/// Reserve: the record repaired where it lost something, then transaction 1 (allocations,
/// binds, confirmations). Claims whose objects it judged are served or told why not.
pub(super) async fn reserve<'a, P: PoolDialect>(
    round: &'a Round<'_, P>,
    first: Intent,
    found: Vec<(AnyClaim, AnyAddress)>,
) -> Reserved<'a, P> {
    let (pool, ctx, spec_error) = (round.pool, round.ctx, &round.spec_error);
    let base = round.base.as_ref();
    let deleting = pool.meta().deletion_timestamp.is_some();
    let session = Session::open(pool, ctx, base);
    let mut ledger_error = None;
    let live_objects = round.observed.addresses.values().any(|a| !a.deleting());
    let repair = Repair {
        session: &session,
        named: &round.observed.named,
        create: !deleting && live_objects,
    };
    let create = !deleting && !first.allocate.is_empty();
    let mut transaction =
        first_transaction(round, &repair, first.clone(), create, Judged::FromMemory).await;
    if matches!(transaction.committed, Err(Error::LedgerOutdated { .. })) {
        // The record remembered from the last reconcile was changed by someone else: what was
        // judged from it is judged again, from the server's.
        transaction = first_transaction(round, &repair, first, create, Judged::FromServer).await;
    }
    let FirstTransaction {
        first,
        repaired,
        committed,
        mut told,
    } = transaction;
    keep_first(&mut ledger_error, repaired);
    let committed = keep_first(&mut ledger_error, committed);
    let stored = committed.as_ref().and_then(|c| c.stored.clone());
    let outcomes = committed.map(|committed| committed.outcomes);
    // Unjudged (the commit failed), a found object serves nobody this time.
    if let Some(outcomes) = &outcomes {
        told.settle_found(pool, found, outcomes, spec_error);
    }
    Reserved {
        session,
        first,
        outcomes: outcomes.unwrap_or_default(),
        stored,
        committed: std::time::Instant::now(),
        ledger_error,
        told,
    }
}

/// Transaction 1 as one attempt left it.
struct FirstTransaction {
    /// The intent, with what the repair added.
    first: Intent,
    /// The repair's error, if it failed.
    repaired: Result<(), Error>,
    committed: Result<ledger::Committed, Error>,
    told: Told,
}

/// The record repaired and transaction 1 committed, judged from the record `judged`.
async fn first_transaction<P: PoolDialect>(
    round: &Round<'_, P>,
    repair: &Repair<'_, '_, P>,
    mut first: Intent,
    create: bool,
    judged: Judged,
) -> FirstTransaction {
    let (pool, ctx) = (round.pool, round.ctx);
    let mut told = Told::default();
    let addresses = &round.observed.addresses;
    let repaired = repair_record(pool, ctx, repair, judged, addresses, &mut first, &mut told);
    let (repaired, start) = match repaired.await {
        Ok(start) => (Ok(()), start),
        Err(e) => (Err(e), Start::Unread),
    };
    let committed = repair.session.commit(start, &first, create).await;
    FirstTransaction {
        first,
        repaired,
        committed,
        told,
    }
}

/// Which record a reconcile's first transaction is judged from.
#[derive(Clone, Copy, Debug)]
pub(super) enum Judged {
    /// The one this process last read or wrote, if it remembers one (else the server's).
    FromMemory,
    /// The server's, read now.
    FromServer,
}

/// How the record is repaired: through the reconcile's session, knowing which object each
/// claim's status names, creating a missing ledger when `create`.
pub(super) struct Repair<'s, 'a, P> {
    session: &'s Session<'a, P>,
    named: &'s HashMap<ClaimKey, Arc<str>>,
    create: bool,
}

/// What the ledger must learn from the live address objects. Every address bitpool hands out
/// is reserved in the record before its object is created, so an object the record does not
/// list means one of two things. Where the record is not known to be whole (restored from a
/// backup, rebuilt, or written before bitpool marked whole records) or lacks the object a
/// claim's status names, the record lost something: the live objects are adopted and the
/// rebuild fence starts. Otherwise someone else made the object: it is adopted by nothing,
/// fences nothing, and the report names it. When a fence is over, a fresh list is adopted and
/// the fence ends. Returns the record it judged from (see [`Judged`]), for the first commit to
/// start from.
pub(super) async fn repair_record<P: PoolDialect>(
    pool: &P,
    ctx: &Context,
    repair: &Repair<'_, '_, P>,
    judged: Judged,
    addresses: &AddressIndex,
    intent: &mut Intent,
    told: &mut Told,
) -> Result<Start, Error> {
    let (session, named) = (repair.session, repair.named);
    let start = match judged {
        Judged::FromMemory => session.recall(repair.create).await?,
        Judged::FromServer => session
            .read(repair.create)
            .await?
            .map_or(Start::Unread, Start::Read),
    };
    let (Start::Read(stored) | Start::Remembered(stored)) = &start else {
        return Ok(start);
    };
    let ledger = &stored.ledger;
    let fenced = ledger.rebuilt_at.is_some();
    let fence_over = fenced && ledger.fenced_until(&objects::now().0.to_string()).is_none();
    let whole = ledger.whole_and_unfenced();
    let served = |a: &AnyAddress| named.get(&address_key(a)) == Some(&a.meta.name);
    // Objects this process deleted are not live, though a lagging cache still lists them (a
    // mass deletion would otherwise list the namespace once per reconcile).
    let unlisted: Vec<&AnyAddress> = addresses
        .values()
        .filter(|a| pool.held(a).is_some_and(|ip| !ledger.contains(ip)))
        .filter(|a| !ctx.recently_deleted_address(&a.meta.uid))
        .collect();
    let lost = !unlisted.is_empty() && (!whole || unlisted.iter().any(|a| served(a)));
    if !fence_over && !lost && (whole || fenced) {
        told.foreign.extend(unlisted.into_iter().cloned());
        return Ok(start);
    }
    let fresh = fresh_pool_addresses(pool, ctx).await?;
    // The list is newer than the record: an object another process created since the record
    // was read holds an address reserved since. What the record read again now lists was not lost.
    let again = session.read(false).await?;
    let (adopt, foreign): (Vec<&AnyAddress>, Vec<&AnyAddress>) = fresh
        .iter()
        .filter(|a| {
            pool.held(a)
                .is_some_and(|ip| unrecorded(ip, ledger, again.as_ref().map(|s| &s.ledger)))
        })
        .partition(|a| !whole || served(a));
    told.foreign.extend(foreign.into_iter().cloned());
    intent.adopt = adopt.iter().filter_map(|a| pool.held(a)).collect();
    if let (false, Some(first), Some(object)) = (fence_over, intent.adopt.first(), adopt.first()) {
        // Said by each reconcile that starts a fence, with what made the record look lost, so
        // that a fence nobody expected can be traced to the object that started it.
        tracing::warn!(
            pool = %pool.key().describe(),
            object = %object.describe(),
            named_by_its_claim = served(object),
            record_whole = whole,
            unlisted = intent.adopt.len(),
            "the pool's ledger does not list live address objects; adopting them and fencing the pool"
        );
        intent.fence = Some(format!(
            "{} did not list {} live address object(s) of the pool (for example {first})",
            session.describe(),
            intent.adopt.len()
        ));
    }
    intent.end_fence = fence_over;
    // Judged against a fresh list, with no fence to follow: the record is whole.
    if fence_over || intent.fence.is_none() {
        intent.whole_in = ledger.uid.clone();
    }
    Ok(start)
}

/// Whether `address`, held by an object listed after `before` was read and before `after`
/// was, is missing from the record: an address reserved after the first read is in the
/// second, and one freed before the second read was in the first (its object was live at the
/// list, and an address is freed only after its object goes).
fn unrecorded(address: IpAddr, before: &Ledger, after: Option<&Ledger>) -> bool {
    !before.contains(address) && after.is_none_or(|after| !after.contains(address))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holding(addresses: &[&str]) -> Ledger {
        Ledger::from_addresses(addresses.iter().map(|a| a.parse().expect("test address")))
    }

    #[test]
    fn only_what_both_reads_of_the_record_lack_was_lost() {
        let ip = |s: &str| s.parse::<IpAddr>().expect("test address");
        let (empty, with) = (holding(&[]), holding(&["10.0.0.1"]));
        // Reserved between the first read and the list: the second read has it.
        assert!(!unrecorded(ip("10.0.0.1"), &empty, Some(&with)));
        // Freed between the list and the second read: the first read had it.
        assert!(!unrecorded(ip("10.0.0.1"), &with, Some(&empty)));
        assert!(unrecorded(ip("10.0.0.1"), &empty, Some(&empty)));
        // A record deleted since is judged by the first read alone.
        assert!(unrecorded(ip("10.0.0.1"), &empty, None));
        assert!(!unrecorded(ip("10.0.0.1"), &with, None));
    }
}
