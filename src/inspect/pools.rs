//! `bitpool pools`: every pool with its exact counts (not the int64 of its status), the claims
//! waiting on it, whether it is Ready and why not, and with `--wide` its free ranges.

use std::collections::HashMap;
use std::net::IpAddr;

use serde::Serialize;

use super::snapshot::{AnyPool, Snapshot};
use crate::alloc::{AddressSpace, Counts};
use crate::ipam::key::PoolKey;
use crate::ipam::kinds::AnyClaim;

/// One pool as `bitpool pools` shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolRow {
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    /// Exact, where the status saturates at 2^63 − 1. Decimal text: JSON readers lose
    /// integers past 2^53.
    pub total: String,
    pub used: String,
    pub free: String,
    pub out_of_range: String,
    /// Claims naming the pool, not deleting, not served.
    pub pending_claims: usize,
    /// The Ready condition's status, `Unknown` before the pool has one.
    pub ready: String,
    /// Why it is not Ready (or paused), empty when it is.
    pub why: String,
    /// With `--wide`: the free addresses (sub-prefixes) as runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free_ranges: Option<Vec<String>>,
}

/// The rows of every pool in `snapshot`, ordered by kind, namespace and name.
pub fn pool_rows(snapshot: &Snapshot, wide: bool) -> Vec<PoolRow> {
    let pending = pending_claims(snapshot);
    let mut rows: Vec<PoolRow> = snapshot
        .pools
        .iter()
        .map(|pool| {
            let key = pool.key();
            let room = room(snapshot, pool);
            let counts = room.as_ref().map(|(counts, _)| *counts).unwrap_or_default();
            let (ready, why) = readiness(pool);
            PoolRow {
                kind: key.kind.to_string(),
                namespace: key.namespace.clone(),
                name: key.name.clone(),
                total: counts.total.to_string(),
                used: counts.used.to_string(),
                free: counts.free.to_string(),
                out_of_range: counts.out_of_range.to_string(),
                pending_claims: pending.get(&key).copied().unwrap_or(0),
                ready,
                why,
                free_ranges: wide.then(|| room.map(|(_, runs)| runs).unwrap_or_default()),
            }
        })
        .collect();
    rows.sort_by(|a, b| (&a.kind, &a.namespace, &a.name).cmp(&(&b.kind, &b.namespace, &b.name)));
    rows
}

/// The pool's space with what its address objects and its ledger hold marked used: what the
/// pool has left, exactly; `None` when its spec hands out nothing.
pub fn occupied(snapshot: &Snapshot, pool: &AnyPool) -> Option<AddressSpace> {
    let mut space = pool.space().ok()?;
    let key = pool.key();
    let held = snapshot
        .addresses_of(&key)
        .iter()
        .filter_map(|address| pool.held(address))
        .collect::<Vec<IpAddr>>();
    let recorded = snapshot
        .ledger_of(pool)
        .and_then(|stored| stored.record.as_ref().ok())
        .map(|ledger| ledger.addresses().collect::<Vec<_>>())
        .unwrap_or_default();
    space.mark_all_used(held.into_iter().chain(recorded));
    Some(space)
}

/// The pool's exact counts and free runs ([`occupied`]).
fn room(snapshot: &Snapshot, pool: &AnyPool) -> Option<(Counts, Vec<String>)> {
    let space = occupied(snapshot, pool)?;
    let runs = space
        .free_runs()
        .map(|(first, last)| match first == last {
            true => pool.show(first),
            false => format!("{}-{}", pool.show(first), pool.show(last)),
        })
        .collect();
    Some((space.counts(), runs))
}

/// The Ready condition's status, and why the pool is not serving when it is not.
fn readiness(pool: &AnyPool) -> (String, String) {
    let ready = pool.condition("Ready");
    let status = ready.map_or_else(|| "Unknown".to_string(), |c| c.status.clone());
    let mut why = Vec::new();
    if pool.deleting() {
        why.push("deleting".to_string());
    }
    if pool.paused() {
        why.push(format!("paused ({})", crate::api::labels::PAUSED));
    }
    if let Some(condition) = ready.filter(|c| c.status != "True") {
        why.push(format!("{}: {}", condition.reason, condition.message));
    }
    if let (Err(error), None) = (pool.space(), ready) {
        why.push(format!("invalid spec: {error}"));
    }
    (status, why.join("; "))
}

/// How many claims of each pool wait for an address.
pub fn pending_claims(snapshot: &Snapshot) -> HashMap<PoolKey, usize> {
    let mut pending = HashMap::new();
    for claim in waiting_claims(snapshot) {
        if let Some(key) = claim.pool_key() {
            *pending.entry(key).or_insert(0) += 1;
        }
    }
    pending
}

/// Claims of both kinds that are not deleting and hold no address.
fn waiting_claims(snapshot: &Snapshot) -> impl Iterator<Item = AnyClaim> + '_ {
    let capi = snapshot
        .claims
        .iter()
        .filter(|c| !super::claim_served(c))
        .filter_map(AnyClaim::capi);
    let metal3 = snapshot
        .ipclaims
        .iter()
        .filter(|c| c.status.as_ref().and_then(|s| s.address.as_ref()).is_none())
        .filter_map(AnyClaim::metal3);
    capi.chain(metal3).filter(|c| !c.deleting())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspect::fixtures::*;

    fn row<'a>(rows: &'a [PoolRow], name: &str) -> &'a PoolRow {
        rows.iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no row {name} in {rows:?}"))
    }

    #[test]
    fn counts_what_objects_and_ledger_hold_and_the_claims_waiting() {
        let mut snapshot = settled();
        snapshot.claims.push(claim("waiting", "p"));
        // Reserved in the ledger, its object not created yet: taken all the same.
        let pool = snapshot.pools[0].clone();
        snapshot.ledgers = [ledger(&pool, &["10.0.0.1", "10.0.0.2", "10.0.0.3"])].into();
        let rows = pool_rows(&snapshot, true);
        let p = row(&rows, "p");
        assert_eq!(
            (p.total.as_str(), p.used.as_str(), p.free.as_str()),
            ("254", "3", "251")
        );
        assert_eq!(p.pending_claims, 1);
        assert_eq!(
            p.free_ranges.as_deref(),
            Some(&["10.0.0.4-10.0.0.254".to_string()][..])
        );
    }

    /// The status saturates at 2^63 − 1; the command shows what the pool really holds.
    #[test]
    fn counts_are_exact_past_what_the_status_can_say() {
        let mut snapshot = settled();
        snapshot.pools = vec![capi_pool("p", &["::/0"], 0)];
        let rows = pool_rows(&snapshot, false);
        let p = row(&rows, "p");
        let total: u128 = p.total.parse().expect("a decimal count");
        let free: u128 = p.free.parse().expect("a decimal count");
        assert!(total > i64::MAX as u128, "{total}");
        assert_eq!(
            total,
            u128::MAX,
            "every address of ::/0 but the unspecified one"
        );
        assert_eq!(free, total, "no IPv6 address of the pool is held");
        assert_eq!(p.free_ranges, None, "only with --wide");
    }

    #[test]
    fn an_invalid_pool_says_why_and_counts_nothing() {
        let mut snapshot = settled();
        snapshot.pools = vec![capi_pool("p", &["10.0.0.300"], 24)];
        let rows = pool_rows(&snapshot, true);
        let p = row(&rows, "p");
        assert_eq!((p.total.as_str(), p.ready.as_str()), ("0", "Unknown"));
        assert!(p.why.starts_with("invalid spec: "), "{}", p.why);
        assert_eq!(p.free_ranges.as_deref(), Some(&[][..]));
    }
}
