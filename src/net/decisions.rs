//! Authorization decisions the servers remember for a while: a caller that repeats itself costs
//! the API server one review a minute, and a flood of distinct callers costs reviews, never
//! memory.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a decision is reused.
pub const DECISION_TTL: Duration = Duration::from_secs(60);
/// The most decisions remembered; beyond it the expired ones go, then all.
const MAX_DECISIONS: usize = 10_000;

/// Decisions by key, each for [`DECISION_TTL`].
pub struct Remembered<K, V> {
    entries: Mutex<HashMap<K, (Instant, V)>>,
}

impl<K, V> Default for Remembered<K, V> {
    fn default() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Hash + Eq, V: Clone> Remembered<K, V> {
    /// The decision about `key` made less than [`DECISION_TTL`] before `now`.
    pub fn get(&self, key: &K, now: Instant) -> Option<V> {
        let entries = self.entries.lock().ok()?;
        let (at, decision) = entries.get(key)?;
        (now.duration_since(*at) < DECISION_TTL).then(|| decision.clone())
    }

    /// Remembers `decision` about `key`, made at `now`; full, it first forgets expired ones.
    pub fn put(&self, key: K, now: Instant, decision: V) {
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        if entries.len() >= MAX_DECISIONS {
            entries.retain(|_, (at, _)| now.duration_since(*at) < DECISION_TTL);
            if entries.len() >= MAX_DECISIONS {
                entries.clear();
            }
        }
        entries.insert(key, (now, decision));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_lasts_its_time_and_the_memory_is_bounded() {
        let remembered = Remembered::<u32, bool>::default();
        let now = Instant::now();
        remembered.put(1, now, true);
        assert_eq!(remembered.get(&1, now), Some(true));
        assert_eq!(remembered.get(&1, now + DECISION_TTL), None);
        for key in 0..(MAX_DECISIONS as u32 + 10) {
            remembered.put(key, now, false);
        }
        let held = remembered.entries.lock().map(|e| e.len()).unwrap_or(0);
        assert!(held <= MAX_DECISIONS, "{held}");
    }
}
