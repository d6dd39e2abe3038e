//! What each pool covers, worked out once per spec, and which pools meet which, worked out again
//! only when some pool's coverage changes.
//!
//! Every reconcile reports the pools its own meets, and every change of a pool (each status
//! write) asks which pools meet it. Both once built the address space of every pool from its
//! spec: with 1,000 pools of one claim each, that was most of bitpool's CPU, a reconcile's cost
//! growing with the number of pools (BENCHMARKS.md, issue 54's target 3). A pool's coverage
//! depends on its spec alone, which its generation counts; here it is kept by the pool's UID
//! for the generation it was built from. [`Coverage::version`] moves whenever a pool's coverage
//! is first seen or changes, and the pools a pool meets are kept with the version they were
//! found at.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use kube::runtime::reflector::Store;

use super::dialect::PoolSpace;
use super::key::{PoolKey, PoolKind};
use super::overlaps::{Covered, Overlap};

/// What a pool's coverage is built from: its spec (as its generation counts it), and whether
/// it is going (a pool being deleted hands nothing out, so it meets no other).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Spec {
    generation: i64,
    deleting: bool,
}

impl Spec {
    fn of<P: PoolSpace>(pool: &P) -> Self {
        let meta = pool.meta();
        Self {
            generation: meta.generation.unwrap_or_default(),
            deleting: meta.deletion_timestamp.is_some(),
        }
    }
}

struct Entry {
    spec: Spec,
    covered: Option<Arc<Covered>>,
    /// What it covered before this spec, for the pools that met it then.
    before: Option<Arc<Covered>>,
    /// The pool kinds whose controllers have been told of this spec (a bit per kind).
    told: u8,
}

/// The pools one pool met, as found at a version.
struct Found {
    version: u64,
    overlaps: Vec<(PoolKey, Overlap)>,
}

#[derive(Default)]
struct Inner {
    /// Pool UID → its coverage.
    pools: HashMap<String, Entry>,
    version: u64,
    /// Pool UID → the pools it met.
    found: HashMap<String, Found>,
}

/// What changed in a pool's coverage, for the pools that met it before or meet it now.
pub struct Change {
    pub before: Option<Arc<Covered>>,
    pub now: Option<Arc<Covered>>,
}

impl Change {
    /// Whether a pool covering `theirs` met the changed pool before or meets it now.
    pub fn concerns(&self, theirs: &Covered) -> bool {
        [&self.before, &self.now]
            .into_iter()
            .flatten()
            .any(|covered| covered.meets(theirs).is_some())
    }
}

/// Every pool's coverage, and the pools each meets (see the module's documentation).
#[derive(Default)]
pub struct Coverage {
    inner: Mutex<Inner>,
}

fn kind_bit(kind: PoolKind) -> u8 {
    let at = PoolKind::ALL.iter().position(|k| *k == kind).unwrap_or(0);
    1 << at
}

impl Coverage {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // What is kept is a cache of pure functions of the pools: a panic elsewhere cannot
        // leave it wrong, only incomplete.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The version of every pool's coverage: it moves when one is first seen or changes.
    pub fn version(&self) -> u64 {
        self.lock().version
    }

    /// What `pool` covers (`None` for an invalid spec), built once per spec. A pool without a
    /// UID (never stored) is worked out and not kept.
    pub fn covered<P: PoolSpace>(&self, pool: &P) -> Option<Arc<Covered>> {
        let Some(uid) = pool.meta().uid.as_deref() else {
            return pool.covered().map(Arc::new);
        };
        let spec = Spec::of(pool);
        if let Some(entry) = self.lock().pools.get(uid).filter(|e| e.spec == spec) {
            return entry.covered.clone();
        }
        let covered = pool.covered().map(Arc::new);
        let mut inner = self.lock();
        let before = inner.pools.get(uid).and_then(|e| e.covered.clone());
        let entry = Entry {
            spec,
            covered: covered.clone(),
            before,
            told: 0,
        };
        inner.pools.insert(uid.to_string(), entry);
        inner.version += 1;
        covered
    }

    /// What changed in `changed`'s coverage, the first time the controller of `kind` asks about
    /// its present spec; `None` after (a status written changes no pool's coverage).
    pub fn change_for<X: PoolSpace>(&self, kind: PoolKind, changed: &X) -> Option<Change> {
        let now = self.covered(changed);
        let uid = changed.meta().uid.as_deref()?;
        let mut inner = self.lock();
        let entry = inner.pools.get_mut(uid)?;
        let bit = kind_bit(kind);
        if entry.told & bit != 0 {
            return None;
        }
        entry.told |= bit;
        Some(Change {
            before: entry.before.clone(),
            now,
        })
    }

    /// The pools of `store` that hand addresses out, with what they cover.
    pub fn pools_of<Q: PoolSpace>(&self, store: &Store<Q>) -> Vec<(PoolKey, Arc<Covered>)> {
        store
            .state()
            .iter()
            .filter(|p| p.meta().deletion_timestamp.is_none())
            .filter_map(|p| Some((p.key(), self.covered(&**p)?)))
            .collect()
    }

    /// The pools `pool` meets: kept from the last time they were found while no pool's coverage
    /// has changed since and each of them is still there (`exists`), else found again by
    /// `find`.
    pub fn meets<P: PoolSpace>(
        &self,
        pool: &P,
        exists: impl Fn(&PoolKey) -> bool,
        find: impl FnOnce() -> Vec<(PoolKey, Overlap)>,
    ) -> Vec<Overlap> {
        let Some(uid) = pool.meta().uid.as_deref() else {
            return find().into_iter().map(|(_, o)| o).collect();
        };
        let version = {
            let inner = self.lock();
            let kept = inner.found.get(uid).filter(|f| f.version == inner.version);
            if let Some(found) = kept.filter(|f| f.overlaps.iter().all(|(k, _)| exists(k))) {
                return found.overlaps.iter().map(|(_, o)| o.clone()).collect();
            }
            inner.version
        };
        let overlaps = find();
        let shown = overlaps.iter().map(|(_, o)| o.clone()).collect();
        // Kept at the version read before finding: a coverage that changed meanwhile moved it.
        let found = Found { version, overlaps };
        self.lock().found.insert(uid.to_string(), found);
        shown
    }

    /// Forgets the pools whose UIDs are not in `present` (those gone since).
    pub fn retain(&self, present: &HashSet<&str>) {
        let mut inner = self.lock();
        inner.pools.retain(|uid, _| present.contains(uid.as_str()));
        inner.found.retain(|uid, _| present.contains(uid.as_str()));
    }

    /// How many pools are kept.
    pub fn len(&self) -> usize {
        self.lock().pools.len()
    }

    /// Whether no pool is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::capi_pools::InClusterIPPool;

    fn pool(name: &str, uid: &str, generation: i64, addresses: &str) -> InClusterIPPool {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ipam.cluster.x-k8s.io/v1alpha2",
            "kind": "InClusterIPPool",
            "metadata": {"name": name, "namespace": "ns", "uid": uid, "generation": generation},
            "spec": {"addresses": [addresses], "prefix": 24},
        }))
        .expect("a test pool")
    }

    #[test]
    fn a_pools_coverage_is_built_once_per_spec() {
        let coverage = Coverage::default();
        let a = pool("a", "u-a", 1, "10.0.0.0/24");
        let first = coverage.covered(&a).expect("a valid pool");
        assert_eq!(coverage.version(), 1);
        let again = coverage.covered(&a).expect("a valid pool");
        assert!(Arc::ptr_eq(&first, &again), "kept, not built again");
        assert_eq!(coverage.version(), 1);
        let changed = pool("a", "u-a", 2, "10.0.1.0/24");
        let now = coverage.covered(&changed).expect("a valid pool");
        assert_ne!(first, now);
        assert_eq!(coverage.version(), 2);
    }

    #[test]
    fn each_controller_is_told_once_of_a_spec_with_what_it_covered_before() {
        let coverage = Coverage::default();
        let a = pool("a", "u-a", 1, "10.0.0.0/24");
        let told = coverage.change_for(PoolKind::InClusterIPPool, &a);
        assert!(told.is_some_and(|c| c.before.is_none() && c.now.is_some()));
        assert!(coverage.change_for(PoolKind::InClusterIPPool, &a).is_none());
        assert!(coverage.change_for(PoolKind::Metal3IPPool, &a).is_some());
        let moved = pool("a", "u-a", 2, "10.0.1.0/24");
        let change = coverage
            .change_for(PoolKind::InClusterIPPool, &moved)
            .expect("a new spec is told");
        let (before, beside_before) = (
            pool("b", "u-b", 1, "10.0.0.0/25"),
            pool("c", "u-c", 1, "10.0.1.0/25"),
        );
        let cover = |p: &InClusterIPPool| coverage.covered(p).expect("a valid pool");
        assert!(change.concerns(&cover(&before)), "met it before");
        assert!(change.concerns(&cover(&beside_before)), "meets it now");
        let far = pool("d", "u-d", 1, "10.9.0.0/24");
        assert!(!change.concerns(&cover(&far)));
    }

    #[test]
    fn the_pools_met_are_found_again_only_when_a_coverage_changed_or_one_is_gone() {
        let coverage = Coverage::default();
        let a = pool("a", "u-a", 1, "10.0.0.0/24");
        coverage.covered(&a);
        let b_key = PoolKey {
            kind: PoolKind::InClusterIPPool,
            namespace: Some("ns".into()),
            name: "b".into(),
        };
        let overlap = Overlap {
            pool: b_key.describe(),
            first: "10.0.0.1".parse().expect("test address"),
            last: "10.0.0.9".parse().expect("test address"),
        };
        let finds = std::cell::Cell::new(0);
        let find = || {
            finds.set(finds.get() + 1);
            vec![(b_key.clone(), overlap.clone())]
        };
        let there = |_: &PoolKey| true;
        assert_eq!(coverage.meets(&a, there, find), vec![overlap.clone()]);
        assert_eq!(coverage.meets(&a, there, find), vec![overlap.clone()]);
        assert_eq!(finds.get(), 1, "kept while nothing changed");
        coverage.covered(&pool("e", "u-e", 1, "10.5.0.0/24"));
        coverage.meets(&a, there, find);
        assert_eq!(finds.get(), 2, "found again after a coverage changed");
        coverage.meets(&a, |_| false, find);
        assert_eq!(finds.get(), 3, "found again when a pool met is gone");
        coverage.retain(&HashSet::from(["u-a"]));
        assert_eq!(coverage.len(), 1);
    }
}
