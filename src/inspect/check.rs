//! `bitpool check`: the invariants bitpool's own tests assert, checked on a live cluster —
//! no address held twice, every claim answered by at most one object, each pool's ledger equal
//! to its live address objects, no address object without its claim, no served claim without
//! its address object, no claim stuck deleting. It only reads.
//!
//! Work in flight looks like a fault for a moment (an address object listed before the ledger
//! that releases it was read), so the command reads twice and reports what both reads show:
//! [`confirmed`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde::Serialize;

use super::snapshot::{AnyPool, Snapshot};
use crate::ipam::dialect::PoolSpace;
use crate::ipam::kinds::{AnyAddress, AnyClaim, ClaimKind};

/// Which invariant a finding breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Rule {
    /// Two address objects of one pool hold the same address for different claims.
    HeldTwice,
    /// One claim is answered by more than one address object.
    ClaimAnsweredTwice,
    /// A live address object's address is not in its pool's ledger: the allocator could hand
    /// it out again.
    NotInLedger,
    /// The ledger lists an address no object holds and no reservation explains: it is lost to
    /// allocation until the ledger is rebuilt.
    LeakedInLedger,
    /// A pool with address objects has no ledger, or one that does not decode.
    LedgerUnusable,
    /// An address object whose claim is gone (or is another object of the same name).
    Orphan,
    /// A claim says it is served by an address object that does not exist.
    ServedWithoutAddress,
    /// A claim has been deleting for longer than the pool's grace period and the allowance.
    StuckDeleting,
}

/// One broken invariant, with the object it is about and what a person should look at.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    pub rule: Rule,
    /// `<kind> <namespace>/<name>` of the object it is about.
    pub subject: String,
    pub detail: String,
}

/// How long a claim may stay deleting beyond its pool's grace period before it counts as stuck.
pub const DEFAULT_STUCK_AFTER: Duration = Duration::from_secs(300);

/// Every broken invariant in `snapshot`. `stuck_after` is how long past its pool's grace period
/// a deleting claim may take.
pub fn findings(snapshot: &Snapshot, stuck_after: Duration) -> Vec<Finding> {
    let mut found = Vec::new();
    for pool in &snapshot.pools {
        pool_findings(snapshot, pool, &mut found);
    }
    orphans_and_doubles(snapshot, &mut found);
    served_without_address(snapshot, &mut found);
    stuck_deleting(snapshot, stuck_after, &mut found);
    found.sort_by(|a, b| (a.rule, &a.subject).cmp(&(b.rule, &b.subject)));
    found.dedup();
    found
}

/// The findings of `first` that `second`, read later, shows too: what work in flight explains
/// is gone by then.
pub fn confirmed(first: Vec<Finding>, second: &[Finding]) -> Vec<Finding> {
    first
        .into_iter()
        .filter(|f| {
            second
                .iter()
                .any(|s| s.rule == f.rule && s.subject == f.subject)
        })
        .collect()
}

fn pool_findings(snapshot: &Snapshot, pool: &AnyPool, found: &mut Vec<Finding>) {
    let key = pool.key();
    let objects = snapshot.addresses_of(&key);
    let mut holders: BTreeMap<IpAddr, Vec<&AnyAddress>> = BTreeMap::new();
    for object in &objects {
        if let Some(held) = pool.held(object) {
            holders.entry(held).or_default().push(object);
        }
    }
    for (held, objects) in &holders {
        let claims: BTreeSet<(ClaimKind, String)> = objects.iter().map(|o| o.claim()).collect();
        if claims.len() > 1 {
            found.push(Finding {
                rule: Rule::HeldTwice,
                subject: key.describe(),
                detail: format!(
                    "{} is held by {}",
                    pool.show(*held),
                    objects
                        .iter()
                        .map(|o| o.describe())
                        .collect::<Vec<_>>()
                        .join(" and ")
                ),
            });
        }
    }
    if !snapshot.sees_every_address_of(pool) {
        return;
    }
    let ledger = match snapshot
        .ledger_of(pool)
        .map(|stored| (stored, &stored.record))
    {
        Some((_, Ok(ledger))) => ledger,
        Some((stored, Err(error))) => {
            found.push(Finding {
                rule: Rule::LedgerUnusable,
                subject: key.describe(),
                detail: format!(
                    "its ledger ConfigMap {} does not decode: {error}",
                    stored.config_map
                ),
            });
            return;
        }
        None if objects.is_empty() => return,
        None => {
            found.push(Finding {
                rule: Rule::LedgerUnusable,
                subject: key.describe(),
                detail: format!(
                    "{} address object(s) but no ledger written for this pool (a ConfigMap labelled {})",
                    objects.len(),
                    crate::ipam::ledger::LEDGER_LABEL
                ),
            });
            return;
        }
    };
    for (held, objects) in &holders {
        if !ledger.contains(*held) {
            found.push(Finding {
                rule: Rule::NotInLedger,
                subject: objects[0].describe(),
                detail: format!(
                    "it holds {} of {}, which the pool's ledger does not list: the pool could hand it out again",
                    pool.show(*held),
                    key.describe()
                ),
            });
        }
    }
    for recorded in ledger.addresses() {
        if !holders.contains_key(&recorded) && !ledger.pending.contains_key(&recorded.to_string()) {
            found.push(Finding {
                rule: Rule::LeakedInLedger,
                subject: key.describe(),
                detail: format!(
                    "its ledger lists {} but no address object holds it and no reservation names it",
                    pool.show(recorded)
                ),
            });
        }
    }
}

fn claim_exists(
    snapshot: &Snapshot,
    kind: ClaimKind,
    namespace: &str,
    name: &str,
) -> Option<String> {
    match kind {
        ClaimKind::Capi => snapshot
            .claims
            .iter()
            .find(|c| c.namespace().as_deref() == Some(namespace) && c.name_any() == name)
            .map(|c| c.uid().unwrap_or_default()),
        ClaimKind::Metal3 => snapshot
            .ipclaims
            .iter()
            .find(|c| c.namespace().as_deref() == Some(namespace) && c.name_any() == name)
            .map(|c| c.uid().unwrap_or_default()),
    }
}

fn claim_kind_name(kind: ClaimKind) -> &'static str {
    match kind {
        ClaimKind::Capi => "IPAddressClaim",
        ClaimKind::Metal3 => "IPClaim",
    }
}

/// Address objects without their claim, and claims with two address objects.
fn orphans_and_doubles(snapshot: &Snapshot, found: &mut Vec<Finding>) {
    let mut answers: BTreeMap<(ClaimKind, String, String), Vec<String>> = BTreeMap::new();
    for object in snapshot.all_addresses() {
        let (kind, claim) = object.claim();
        let namespace = object.namespace().to_string();
        let claim_uid = claim_exists(snapshot, kind, &namespace, &claim);
        let owner_uid = object.claim_uid().map(|uid| uid.to_string());
        let gone = match (&claim_uid, &owner_uid) {
            (None, _) => Some(format!(
                "its {} {namespace}/{claim} does not exist",
                claim_kind_name(kind)
            )),
            (Some(live), Some(owner)) if live != owner => Some(format!(
                "it was made for an earlier {} {namespace}/{claim} (UID {owner}, now {live})",
                claim_kind_name(kind)
            )),
            _ => None,
        };
        if let Some(detail) = gone {
            found.push(Finding {
                rule: Rule::Orphan,
                subject: object.describe(),
                detail,
            });
        }
        answers
            .entry((kind, namespace, claim))
            .or_default()
            .push(object.describe());
    }
    for ((kind, namespace, claim), objects) in answers {
        if objects.len() > 1 {
            found.push(Finding {
                rule: Rule::ClaimAnsweredTwice,
                subject: format!("{} {namespace}/{claim}", claim_kind_name(kind)),
                detail: format!("answered by {}", objects.join(" and ")),
            });
        }
    }
}

/// Claims whose status names an address object that does not exist.
fn served_without_address(snapshot: &Snapshot, found: &mut Vec<Finding>) {
    let objects: BTreeSet<(ClaimKind, String, String)> = snapshot
        .all_addresses()
        .iter()
        .map(|a| (a.claim_kind(), a.namespace().to_string(), a.name()))
        .collect();
    let claims = claims_of_both_kinds(snapshot);
    for claim in claims.iter().filter(|c| !c.deleting()) {
        let Some(named) = claim.status_address_name() else {
            continue;
        };
        if !objects.contains(&(claim.kind(), claim.namespace(), named.clone())) {
            found.push(Finding {
                rule: Rule::ServedWithoutAddress,
                subject: claim.describe(),
                detail: format!("its status names address object {named}, which does not exist"),
            });
        }
    }
}

fn claims_of_both_kinds(snapshot: &Snapshot) -> Vec<AnyClaim> {
    let capi = snapshot.claims.iter().filter_map(AnyClaim::capi);
    let metal3 = snapshot.ipclaims.iter().filter_map(AnyClaim::metal3);
    capi.chain(metal3).collect()
}

/// Claims deleting for longer than their pool's grace period and `stuck_after`.
fn stuck_deleting(snapshot: &Snapshot, stuck_after: Duration, found: &mut Vec<Finding>) {
    let Ok(now) = snapshot.read_at.parse::<Timestamp>() else {
        return;
    };
    for claim in claims_of_both_kinds(snapshot) {
        let Some(deleted) = claim.meta.deleted() else {
            continue;
        };
        let grace = claim
            .pool_key()
            .and_then(|key| snapshot.pool(&key))
            .and_then(|pool| match pool {
                AnyPool::InCluster(p) => p.reuse_grace(),
                AnyPool::GlobalInCluster(p) => p.reuse_grace(),
                _ => None,
            })
            .unwrap_or_default();
        let since = deleted.0;
        let elapsed = now.duration_since(since).unsigned_abs();
        if elapsed > grace + stuck_after {
            found.push(Finding {
                rule: Rule::StuckDeleting,
                subject: claim.describe(),
                detail: format!(
                    "deleting since {since} ({} s); its finalizers: {}",
                    elapsed.as_secs(),
                    claim.meta.finalizers().join(", ")
                ),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspect::fixtures::*;
    use crate::inspect::snapshot::Scope;

    const STUCK: Duration = DEFAULT_STUCK_AFTER;

    fn rules(findings: &[Finding]) -> Vec<(Rule, &str)> {
        findings
            .iter()
            .map(|f| (f.rule, f.subject.as_str()))
            .collect()
    }

    #[test]
    fn a_settled_pool_breaks_nothing() {
        assert_eq!(findings(&settled(), STUCK), vec![]);
    }

    #[test]
    fn an_address_held_for_two_claims_is_found() {
        let mut snapshot = settled();
        snapshot.claims.push(served(claim("c", "p"), "c"));
        snapshot.addresses.push(address("c", "p", "c", "10.0.0.2"));
        let found = findings(&snapshot, STUCK);
        assert_eq!(
            rules(&found),
            [(Rule::HeldTwice, "InClusterIPPool tenant/p")]
        );
        assert!(
            found[0]
                .detail
                .contains("10.0.0.2 is held by IPAddress tenant/b and IPAddress tenant/c"),
            "{}",
            found[0].detail
        );
    }

    #[test]
    fn the_ledger_is_compared_with_the_live_objects_both_ways() {
        let mut snapshot = settled();
        let pool = snapshot.pools[0].clone();
        snapshot.ledgers = [ledger(&pool, &["10.0.0.1", "10.0.0.9"])].into();
        let found = findings(&snapshot, STUCK);
        assert_eq!(
            rules(&found),
            [
                (Rule::NotInLedger, "IPAddress tenant/b"),
                (Rule::LeakedInLedger, "InClusterIPPool tenant/p"),
            ]
        );
        assert!(found[1].detail.contains("10.0.0.9"), "{}", found[1].detail);
    }

    #[test]
    fn a_reservation_in_flight_is_not_a_leak() {
        let snapshot = reserved_in_flight();
        assert_eq!(findings(&snapshot, STUCK), vec![]);
    }

    #[test]
    fn a_pool_with_objects_and_no_usable_ledger_is_found() {
        let mut snapshot = settled();
        snapshot.ledgers.clear();
        assert_eq!(
            rules(&findings(&snapshot, STUCK)),
            [(Rule::LedgerUnusable, "InClusterIPPool tenant/p")]
        );
        // A ledger of an earlier pool of the same name is not this pool's.
        let mut earlier = settled();
        for stored in earlier.ledgers.values_mut() {
            stored.pool_identity = Some("uid-of-an-earlier-pool".into());
        }
        assert_eq!(
            rules(&findings(&earlier, STUCK)),
            [(Rule::LedgerUnusable, "InClusterIPPool tenant/p")]
        );
    }

    #[test]
    fn objects_without_their_claim_and_claims_with_two_objects_are_found() {
        let mut snapshot = settled();
        snapshot
            .claims
            .retain(|c| c.metadata.name.as_deref() != Some("b"));
        snapshot
            .addresses
            .push(address("a-2", "p", "a", "10.0.0.3"));
        let pool = snapshot.pools[0].clone();
        snapshot.ledgers = [ledger(&pool, &["10.0.0.1", "10.0.0.2", "10.0.0.3"])].into();
        assert_eq!(
            rules(&findings(&snapshot, STUCK)),
            [
                (Rule::ClaimAnsweredTwice, "IPAddressClaim tenant/a"),
                (Rule::Orphan, "IPAddress tenant/b"),
            ]
        );
        // The claim of that name now is another object than the one the address was made for.
        let mut recreated = settled();
        recreated.claims[1].metadata.uid = Some("uid-of-a-new-b".into());
        let found = findings(&recreated, STUCK);
        assert_eq!(rules(&found), [(Rule::Orphan, "IPAddress tenant/b")]);
        assert!(found[0].detail.contains("earlier"), "{}", found[0].detail);
    }

    #[test]
    fn a_served_claim_whose_object_is_gone_is_found() {
        let mut snapshot = settled();
        snapshot
            .addresses
            .retain(|a| a.metadata.name.as_deref() != Some("b"));
        let pool = snapshot.pools[0].clone();
        snapshot.ledgers = [ledger(&pool, &["10.0.0.1"])].into();
        assert_eq!(
            rules(&findings(&snapshot, STUCK)),
            [(Rule::ServedWithoutAddress, "IPAddressClaim tenant/b")]
        );
    }

    #[test]
    fn a_claim_deleting_past_grace_and_allowance_is_stuck() {
        let deleting_since = |seconds_before_now: i64, grace: Option<i32>| {
            let mut snapshot = settled();
            if let crate::inspect::AnyPool::InCluster(pool) = &mut snapshot.pools[0] {
                pool.spec.address_reuse_grace_period_seconds = grace;
            }
            let now: Timestamp = NOW.parse().expect("a time");
            let since = now - k8s_openapi::jiff::SignedDuration::from_secs(seconds_before_now);
            snapshot.claims[0].metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(since));
            rules(&findings(&snapshot, STUCK)).len()
        };
        assert_eq!(deleting_since(299, None), 0);
        assert_eq!(deleting_since(301, None), 1);
        assert_eq!(
            deleting_since(301, Some(600)),
            0,
            "within the reuse grace period"
        );
        assert_eq!(deleting_since(901, Some(600)), 1);
    }

    /// In one namespace's scope a cluster-scoped pool's other namespaces are not seen: its
    /// ledger is not compared with what is.
    #[test]
    fn a_global_pool_is_not_compared_with_one_namespace() {
        use crate::api::capi_pools::GlobalInClusterIPPool;
        let mut snapshot = settled();
        let mut global = GlobalInClusterIPPool::new("shared", Default::default());
        global.spec.pool.addresses = vec!["10.1.0.0/24".into()];
        global.spec.pool.prefix = 24;
        global.metadata.uid = Some("uid-shared".into());
        let global = crate::inspect::AnyPool::GlobalInCluster(global);
        let (key, stored) = ledger(&global, &["10.1.0.7"]);
        snapshot.pools.push(global);
        snapshot.ledgers.insert(key, stored);
        snapshot.scope = Scope::Namespace(NS.into());
        assert_eq!(findings(&snapshot, STUCK), vec![]);
        snapshot.scope = Scope::Cluster;
        assert_eq!(
            rules(&findings(&snapshot, STUCK)),
            [(Rule::LeakedInLedger, "GlobalInClusterIPPool shared")]
        );
    }

    #[test]
    fn only_what_both_reads_show_is_reported() {
        let finding = |rule, subject: &str| Finding {
            rule,
            subject: subject.into(),
            detail: "first read".into(),
        };
        let first = vec![
            finding(Rule::Orphan, "IPAddress tenant/x"),
            finding(Rule::NotInLedger, "IPAddress tenant/y"),
        ];
        let second = vec![Finding {
            detail: "second read".into(),
            ..finding(Rule::NotInLedger, "IPAddress tenant/y")
        }];
        assert_eq!(
            confirmed(first, &second),
            vec![finding(Rule::NotInLedger, "IPAddress tenant/y")]
        );
    }
}
