//! `clusterctl move`: a namespaced pool's ledger travels with the pool.
//!
//! clusterctl moves a namespace's pools, claims and address objects, but not the ledger (it
//! lives in bitpool's own namespace, out of tenants' reach), and the pool arrives with a new UID.
//! Rebuilt from the address objects as they arrive, the target's ledger would be fenced, and
//! until the last object has arrived it would not hold every address the moved objects take.
//! So the ledger goes with the pool, in three steps clusterctl already has:
//!
//! 1. **Block**: a namespaced pool in a namespace with Clusters carries clusterctl's
//!    [`BLOCK_MOVE_ANNOTATION`], so that a move waits for bitpool once it has paused the
//!    Clusters.
//! 2. **Hand over**: once every Cluster of the namespace is paused and no reservation can still
//!    land, bitpool writes the ledger's bitmaps onto the pool ([`HANDOVER_ANNOTATION`]) and lifts
//!    the block in the same patch. The pool goes on serving claims that no paused Cluster holds
//!    back, and each ledger write that adds an address is preceded by one that adds it to the
//!    hand-over ([`cover`]): a copy taken at any instant holds every address the ledger does. If
//!    the Clusters are unpaused without a move, the block comes back and the hand-over goes.
//! 3. **Arrive**: a pool whose hand-over names another pool's UID is a copy. Its ledger is
//!    created from the hand-over, with no fence (no bitpool process reserved anything in this
//!    pool), and the hand-over is replaced by [`MOVED_IN_ANNOTATION`], naming the Clusters that
//!    were paused. Until they are all here and unpaused (clusterctl's last step), addresses no
//!    object holds yet are not swept: their objects are still on their way.
//!
//! On the source, clusterctl marks each object [`DELETE_FOR_MOVE_ANNOTATION`] before deleting
//! it: such a pool's ledger is deleted with it and its deletion is not refused.
//!
//! Cluster-scoped pools are global objects to clusterctl: copied unless the target has one of
//! the name, and never deleted on the source. They are not handed over (two management clusters
//! would then serve one range); a copy is rebuilt from its address objects, fenced.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use serde::{Deserialize, Serialize};

use super::Context;
use super::dialect::PoolDialect;
use super::ledger;
use super::ledger::handover::{self, Handover, annotate};
use super::ledger::intent;
use super::ledger::{Ledger, Loaded};
pub use crate::api::clusterctl::{
    BLOCK_MOVE_ANNOTATION, DELETE_FOR_MOVE_ANNOTATION, HANDOVER_ANNOTATION, MOVED_IN_ANNOTATION,
};
use crate::runtime::error::Error;
use crate::runtime::objects;

/// How often a handed-over pool, or one waiting for reservations to land, looks again.
const RECHECK: Duration = Duration::from_secs(5);

/// What a moved pool waits for before it sweeps addresses no object holds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MovedIn {
    pub clusters: Vec<String>,
}

/// What the move steps are decided from.
#[derive(Debug, Default)]
pub struct Seen {
    pub pool_uid: String,
    /// Namespaced pools only are moved with their ledger.
    pub namespaced: bool,
    pub blocking: bool,
    pub leaving: bool,
    /// The pool is paused (`cluster.x-k8s.io/paused`): bitpool writes nothing on it.
    pub paused: bool,
    pub handover: Option<Handover>,
    pub moved_in: Option<MovedIn>,
    /// The Clusters of the pool's namespace, by name, and whether each is paused.
    pub clusters: BTreeMap<String, bool>,
}

/// The move step a pool is at.
#[derive(Debug, PartialEq)]
pub enum Step {
    /// Nothing to write: the pool is served as usual.
    Serve,
    /// Handed over here: served as usual, every new address covered by the hand-over first.
    HandedOver,
    /// Set (or lift) the block, and drop a hand-over written here.
    Block(bool),
    /// Hand the ledger over, for these Clusters.
    HandOver(Vec<String>),
    /// A copy: its ledger from the hand-over.
    Arrive(Handover),
    /// The move that brought the pool is over.
    Settle,
    /// clusterctl is deleting the pool after moving it: its ledger goes.
    Leave,
}

/// The move step of a pool (pure).
pub fn plan(seen: &Seen) -> Step {
    if seen.leaving {
        return Step::Leave;
    }
    // A paused pool takes no part: one that blocks a move keeps blocking it until resumed.
    if seen.paused {
        return Step::Serve;
    }
    if let Some(handover) = seen
        .handover
        .as_ref()
        .filter(|h| h.pool_uid != seen.pool_uid)
    {
        return Step::Arrive(handover.clone());
    }
    if let Some(moved_in) = &seen.moved_in {
        let over = moved_in
            .clusters
            .iter()
            .all(|c| seen.clusters.get(c) == Some(&false));
        return if over { Step::Settle } else { Step::Serve };
    }
    let handed_over = seen.handover.is_some();
    let all_paused = !seen.clusters.is_empty() && seen.clusters.values().all(|paused| *paused);
    match (seen.namespaced && !seen.clusters.is_empty(), all_paused) {
        (true, true) if handed_over => Step::HandedOver,
        (true, true) => Step::HandOver(seen.clusters.keys().cloned().collect()),
        (true, false) if !seen.blocking || handed_over => Step::Block(true),
        (false, _) if seen.blocking || handed_over => Step::Block(false),
        _ => Step::Serve,
    }
}

/// Whether sweeps of addresses no object holds wait: the pool's objects are still arriving.
pub fn arriving(meta: &kube::api::ObjectMeta) -> bool {
    annotation(meta, MOVED_IN_ANNOTATION).is_some()
}

/// Whether a move of the pool is under way: handed over, arriving or leaving.
pub fn under_way(meta: &kube::api::ObjectMeta) -> bool {
    arriving(meta) || leaving(meta) || annotation(meta, HANDOVER_ANNOTATION).is_some()
}

/// Whether clusterctl is deleting this object after moving it.
pub fn leaving(meta: &kube::api::ObjectMeta) -> bool {
    annotation(meta, DELETE_FOR_MOVE_ANNOTATION).is_some()
}

fn annotation<'a>(meta: &'a kube::api::ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// What a pool's annotations and its namespace's Clusters say. An unreadable hand-over or mark
/// is taken as absent: it is rewritten or removed by the step that follows.
fn seen<P: PoolDialect>(pool: &P, ctx: &Context) -> Seen {
    let meta = pool.meta();
    let namespace = pool.namespace();
    let parse = |key: &str| annotation(meta, key);
    let clusters = match (&namespace, &ctx.clusters) {
        (Some(ns), Some(clusters)) => clusters
            .state()
            .iter()
            .filter(|c| c.metadata.namespace.as_deref() == Some(ns.as_str()))
            .filter_map(|c| Some((c.metadata.name.clone()?, objects::cluster_is_paused(c))))
            .collect(),
        _ => BTreeMap::new(),
    };
    Seen {
        pool_uid: pool.uid().unwrap_or_default(),
        namespaced: namespace.is_some(),
        blocking: parse(BLOCK_MOVE_ANNOTATION).is_some(),
        leaving: leaving(meta),
        paused: objects::is_paused(meta),
        handover: parse(HANDOVER_ANNOTATION).and_then(|text| serde_json::from_str(text).ok()),
        moved_in: parse(MOVED_IN_ANNOTATION).and_then(|text| serde_json::from_str(text).ok()),
        clusters,
    }
}

/// Takes the pool's move step; `Some` when the reconcile ends here.
pub async fn step<P: PoolDialect>(pool: &P, ctx: &Arc<Context>) -> Result<Option<Action>, Error> {
    let seen = seen(pool, ctx);
    match plan(&seen) {
        Step::Serve | Step::HandedOver => Ok(None),
        Step::Block(block) => {
            let changes = serde_json::json!({
                BLOCK_MOVE_ANNOTATION: block.then_some(""),
                HANDOVER_ANNOTATION: null,
            });
            annotate(pool, ctx, changes).await?;
            Ok(None)
        }
        Step::HandOver(clusters) => hand_over(pool, ctx, seen.pool_uid, clusters).await,
        Step::Arrive(handover) => {
            handover::arrive(pool, ctx, &handover).await?;
            let moved_in = MovedIn {
                clusters: handover.clusters,
            };
            let changes = serde_json::json!({
                HANDOVER_ANNOTATION: null,
                MOVED_IN_ANNOTATION: serde_json::to_string(&moved_in).unwrap_or_default(),
            });
            annotate(pool, ctx, changes).await?;
            tracing::info!(pool = %pool.key().describe(), "the pool arrived by clusterctl move; its ledger came with it");
            Ok(None)
        }
        Step::Settle => {
            annotate(pool, ctx, serde_json::json!({MOVED_IN_ANNOTATION: null})).await?;
            Ok(None)
        }
        Step::Leave => {
            ledger::forget(pool, ctx).await?;
            tracing::info!(pool = %pool.key().describe(), "the pool was moved away by clusterctl; its ledger here is deleted");
            // clusterctl strips the finalizers itself; one that did not is let go here.
            if pool.meta().deletion_timestamp.is_some() {
                let api = pool.api_for(ctx.client.clone());
                objects::remove_finalizer(&api, pool, P::FINALIZER).await?;
            }
            Ok(Some(Action::await_change()))
        }
    }
}

/// Writes the ledger onto the pool and lifts the block, once no reservation can still land (a
/// create that lands after clusterctl has listed the namespace would not be moved).
async fn hand_over<P: PoolDialect>(
    pool: &P,
    ctx: &Arc<Context>,
    pool_uid: String,
    clusters: Vec<String>,
) -> Result<Option<Action>, Error> {
    let ledger_ref = ledger::ledger_of(pool, ctx);
    let ledger = match ledger_ref.load().await? {
        Loaded::Found(stored) => stored.ledger,
        Loaded::Missing => Ledger::default(),
        // Left for the engine to rebuild once the Clusters are unpaused; the move waits.
        Loaded::Untrusted { reason, .. } => {
            tracing::warn!(pool = %pool.key().describe(), %reason, "not handing over a ledger that cannot be trusted");
            return Ok(Some(Action::requeue(RECHECK)));
        }
    };
    let now = objects::now().0.to_string();
    if !ledger
        .pending
        .values()
        .all(|r| intent::no_create_can_land(r, &now))
    {
        return Ok(Some(Action::requeue(RECHECK)));
    }
    let handover = match Handover::of(&ledger, &pool_uid, clusters).encoded() {
        Ok(text) => text,
        Err(bytes) => {
            tracing::warn!(pool = %pool.key().describe(), bytes, "the pool's ledger is too large to travel with it; the move stays blocked");
            return Ok(Some(Action::requeue(RECHECK)));
        }
    };
    let changes = serde_json::json!({BLOCK_MOVE_ANNOTATION: null, HANDOVER_ANNOTATION: handover});
    annotate(pool, ctx, changes).await?;
    tracing::info!(pool = %pool.key().describe(), "every Cluster of the namespace is paused: the pool's ledger is handed over for clusterctl move");
    Ok(Some(Action::requeue(RECHECK)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handover(uid: &str) -> Handover {
        Handover::of(&Ledger::default(), uid, vec!["c1".into()])
    }

    fn seen(clusters: &[(&str, bool)]) -> Seen {
        Seen {
            pool_uid: "uid".into(),
            namespaced: true,
            clusters: clusters.iter().map(|(n, p)| (n.to_string(), *p)).collect(),
            ..Seen::default()
        }
    }

    #[test]
    fn a_pool_is_blocked_while_its_clusters_run_and_handed_over_once_all_are_paused() {
        let running = seen(&[("c1", false), ("c2", true)]);
        assert_eq!(plan(&running), Step::Block(true));
        let blocked = Seen {
            blocking: true,
            ..seen(&[("c1", false)])
        };
        assert_eq!(plan(&blocked), Step::Serve);
        let paused = Seen {
            blocking: true,
            ..seen(&[("c1", true), ("c2", true)])
        };
        assert_eq!(
            plan(&paused),
            Step::HandOver(vec!["c1".into(), "c2".into()])
        );
        let handed = Seen {
            handover: Some(handover("uid")),
            ..seen(&[("c1", true)])
        };
        assert_eq!(plan(&handed), Step::HandedOver);
        // Unpaused without a move: blocked again, the hand-over dropped.
        let resumed = Seen {
            handover: Some(handover("uid")),
            ..seen(&[("c1", false)])
        };
        assert_eq!(plan(&resumed), Step::Block(true));
    }

    #[test]
    fn pools_no_move_pauses_and_paused_pools_are_left_as_they_are() {
        assert_eq!(plan(&seen(&[])), Step::Serve);
        let left_blocked = Seen {
            blocking: true,
            ..seen(&[])
        };
        assert_eq!(plan(&left_blocked), Step::Block(false));
        let global = Seen {
            namespaced: false,
            ..seen(&[("c1", true)])
        };
        assert_eq!(plan(&global), Step::Serve);
        let paused = Seen {
            paused: true,
            blocking: true,
            ..seen(&[("c1", true)])
        };
        assert_eq!(plan(&paused), Step::Serve);
    }

    #[test]
    fn a_copy_arrives_then_settles_when_its_clusters_are_unpaused() {
        let copy = Seen {
            handover: Some(handover("source")),
            ..seen(&[])
        };
        assert_eq!(plan(&copy), Step::Arrive(handover("source")));
        let moved_in = |clusters| Seen {
            moved_in: Some(MovedIn {
                clusters: vec!["c1".into()],
            }),
            ..seen(clusters)
        };
        assert_eq!(plan(&moved_in(&[])), Step::Serve, "c1 not here yet");
        assert_eq!(plan(&moved_in(&[("c1", true)])), Step::Serve);
        assert_eq!(plan(&moved_in(&[("c1", false)])), Step::Settle);
        let leaving = Seen {
            leaving: true,
            handover: Some(handover("uid")),
            ..seen(&[("c1", true)])
        };
        assert_eq!(plan(&leaving), Step::Leave);
    }

    #[test]
    fn a_handover_carries_the_ledgers_addresses_and_no_reservation() {
        let mut ledger = Ledger::from_addresses(["10.0.0.1".parse().unwrap()]);
        ledger.insert("fd00::7".parse().unwrap());
        let text = serde_json::to_string(&Handover::of(&ledger, "u", vec![])).unwrap();
        let back: Handover = serde_json::from_str(&text).unwrap();
        let carried = back.ledger().unwrap();
        assert_eq!(
            carried.addresses().collect::<Vec<_>>(),
            ledger.addresses().collect::<Vec<_>>()
        );
        assert!(carried.pending.is_empty());
    }
}
