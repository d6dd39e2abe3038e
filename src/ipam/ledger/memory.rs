//! A ledger as read from or written to the server, and the last one this process read or wrote
//! of each pool, so that a reconcile need not read the record again before its first
//! transaction.
//!
//! A remembered record is never trusted on its own: every write carries the version it was
//! read at, so the server refuses one computed from a record changed since (by another process,
//! a person, a restore). A judgment made from a remembered record is acted on only through such
//! a write: when it is refused, the reconcile judges again from a fresh read
//! ([`super::commit::Start::Remembered`]).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use super::record::Ledger;

/// A ledger as read from the server, with the version a replace must carry.
#[derive(Clone, Debug)]
pub struct Stored {
    pub ledger: Ledger,
    resource_version: Option<String>,
}

impl Stored {
    /// The ledger `ledger` as the server stores it at `resource_version`.
    pub fn new(ledger: Ledger, resource_version: Option<String>) -> Self {
        Self {
            ledger,
            resource_version,
        }
    }

    /// The server's version of this ledger (changes with every write, by anyone).
    pub fn version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }
}

/// Which ledger, of which pool: a pool made again under the same name is another pool.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RecordOf {
    /// The ledger's ConfigMap, as `namespace/name`.
    pub ledger: String,
    /// The identity of the pool it records (its UID).
    pub pool: String,
}

/// The last record this process read or wrote of each pool's ledger.
#[derive(Default)]
pub struct Records {
    last: Mutex<HashMap<RecordOf, Stored>>,
}

impl Records {
    /// Remembers `stored` as the latest record of `of` this process knows.
    pub fn remember(&self, of: &RecordOf, stored: &Stored) {
        if let Ok(mut last) = self.last.lock() {
            last.insert(of.clone(), stored.clone());
        }
    }

    /// The latest record of `of` this process read or wrote, if it remembers one.
    pub fn recall(&self, of: &RecordOf) -> Option<Stored> {
        self.last.lock().ok()?.get(of).cloned()
    }

    /// Forgets the record of `of` (it is gone, or changed by someone else).
    pub fn forget(&self, of: &RecordOf) {
        if let Ok(mut last) = self.last.lock() {
            last.remove(of);
        }
    }

    /// Forgets the records of pools whose UIDs are not in `present` (those gone since, while
    /// another process served them).
    pub fn retain(&self, present: &HashSet<&str>) {
        if let Ok(mut last) = self.last.lock() {
            last.retain(|of, _| present.contains(of.pool.as_str()));
        }
    }

    /// How many records are remembered.
    pub fn len(&self) -> usize {
        self.last.lock().map_or(0, |last| last.len())
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(pool: &str) -> RecordOf {
        RecordOf {
            ledger: "bitpool-system/inclusterippool.ns.a".to_string(),
            pool: pool.to_string(),
        }
    }

    #[test]
    fn a_record_is_recalled_for_its_own_pool_only() {
        let records = Records::default();
        let stored = Stored::new(Ledger::default(), Some("7".to_string()));
        records.remember(&of("uid-1"), &stored);
        assert_eq!(
            records
                .recall(&of("uid-1"))
                .and_then(|s| s.version().map(str::to_string)),
            Some("7".to_string())
        );
        // The same name for a pool made again: not its record.
        assert!(records.recall(&of("uid-2")).is_none());
        records.forget(&of("uid-1"));
        assert!(records.recall(&of("uid-1")).is_none());
        assert!(records.is_empty());
    }

    #[test]
    fn records_of_gone_pools_are_forgotten() {
        let records = Records::default();
        let stored = Stored::new(Ledger::default(), Some("7".to_string()));
        records.remember(&of("uid-1"), &stored);
        records.remember(&of("uid-2"), &stored);
        records.retain(&["uid-2"].into_iter().collect());
        assert!(records.recall(&of("uid-1")).is_none());
        assert!(records.recall(&of("uid-2")).is_some());
        assert_eq!(records.len(), 1);
    }
}
