//! Settle: the record read again, what no object explains swept, and transaction 2 (what was
//! created, released, or found leaked).

use std::collections::HashSet;
use std::net::IpAddr;

use super::apply::Applied;
use super::read::cached_claim;
use super::reserve::Reserved;
use super::{AddressIndex, ORPHAN_GRACE, Outcomes, Round, Sight, Told, keep_first};
use crate::ipam::Context;
use crate::ipam::dialect::{PoolDialect, Usage, fresh_pool_addresses};
use crate::ipam::kinds::{AnyClaim, ClaimKind};
use crate::ipam::ledger::commit::Start;
use crate::ipam::ledger::{Intent, Ledger, intent};
use crate::runtime::cached::Uid;
use crate::runtime::error::Error;
use crate::runtime::objects;

/// What the two ledger transactions and the object writes between them leave.
pub(super) struct Settled {
    pub(super) ledger: Ledger,
    pub(super) usage: Option<Usage>,
    /// Transaction 1, as committed, and its outcomes (its refusals tell when to look again).
    pub(super) first: Intent,
    pub(super) outcomes: Outcomes,
    /// Transaction 2, as committed.
    pub(super) second: Intent,
    /// The first ledger error: it does not hold up releases and is returned once they are done.
    pub(super) ledger_error: Option<Error>,
    /// What transaction 1, the object writes and transaction 2 left for the report, in order.
    pub(super) told: Told,
}

/// Settle: what no object explains swept, and transaction 2, from the record as transaction 1
/// left it (read again only when it did not). What is found unexplained is judged against a
/// fresh list of the address objects, newer than the record; if the record changed since, the
/// server refuses transaction 2's first write and what was judged leaked waits for a later
/// reconcile ([`Start::Read`]).
pub(super) async fn settle<P: PoolDialect>(
    round: &Round<'_, P>,
    reserved: Reserved<'_, P>,
    applied: Applied,
) -> Settled {
    let (pool, ctx, spec_error) = (round.pool, round.ctx, &round.spec_error);
    let observed = &round.observed;
    let Reserved {
        session,
        first,
        outcomes,
        stored,
        mut ledger_error,
        told,
        ..
    } = reserved;
    let Applied {
        mut second,
        found,
        orphans_deleted,
        told: applied_told,
    } = applied;
    let mut told = told.then(applied_told);
    let known = match stored {
        Some(stored) => Some(stored),
        None => keep_first(&mut ledger_error, session.read(false).await).flatten(),
    };
    // Before the list, every address would look unexplained.
    let sweep = observed.sight == Sight::Listed;
    if let Some(stored) = known.as_ref().filter(|_| sweep) {
        let unexplained = unexplained(pool, ctx, &stored.ledger, &observed.addresses).await;
        second.release_unbound = keep_first(&mut ledger_error, unexplained).unwrap_or_default();
        let unheld = unheld(pool, ctx, orphans_deleted).await;
        (second.release_unbound).extend(keep_first(&mut ledger_error, unheld).unwrap_or_default());
        let vanished = vanished_reservations(ctx, &stored.ledger).await;
        let vanished = keep_first(&mut ledger_error, vanished).unwrap_or_default();
        second.release_unlanded.extend(vanished);
    }
    let start = known.map_or(Start::Unread, Start::Read);
    let committed = session.commit(start, &second, false).await;
    let (ledger, usage) = match keep_first(&mut ledger_error, committed) {
        Some(committed) => {
            told.settle_found(pool, found, &committed.outcomes, spec_error);
            (committed.ledger, committed.usage)
        }
        None => Default::default(),
    };
    Settled {
        ledger,
        usage,
        first,
        outcomes,
        second,
        ledger_error,
        told,
    }
}

/// Reservations whose claim no longer exists (checked on the server once no create of theirs
/// can land any more, [`crate::ipam::ledger::IN_FLIGHT_BOUND`]): a claim deleted while its allocation was in
/// flight.
pub(super) async fn vanished_reservations(
    ctx: &Context,
    ledger: &Ledger,
) -> Result<Vec<String>, Error> {
    let now = objects::now().0.to_string();
    let mut vanished = Vec::new();
    for reservation in ledger.pending.values() {
        if !intent::no_create_can_land(reservation, &now) {
            continue;
        }
        // The few reservations' UIDs are parsed, rather than every claim's written out.
        let uid = Uid::of(&reservation.claim_uid);
        let (namespace, name) = (&reservation.claim_namespace, &reservation.claim_name);
        let cached = [ClaimKind::Capi, ClaimKind::Metal3]
            .into_iter()
            .any(|kind| {
                cached_claim(ctx, kind, namespace, name).is_some_and(|c| c.meta.uid == uid)
            });
        if cached {
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
/// leaked; not while a move brings the pool's objects in.
pub(super) async fn unexplained<P: PoolDialect>(
    pool: &P,
    ctx: &Context,
    ledger: &Ledger,
    addresses: &AddressIndex,
) -> Result<Vec<IpAddr>, Error> {
    let key = pool.key();
    // A pool that arrived by a move has objects still on their way.
    if crate::ipam::moving::arriving(pool.meta()) {
        return Ok(Vec::new());
    }
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
pub(super) async fn unheld<P: PoolDialect>(
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
