//! Shared copies of values that repeat across cached objects (namespaces, finalizers, owner
//! kinds, pool references, gateways): a hundred thousand address objects of one pool then hold
//! one copy of its reference, not a hundred thousand. The sets themselves are where the values
//! are made ([`super::cached`]).

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::Hash;
use std::sync::{Arc, LazyLock, Mutex};

/// A set of shared values. Values no cached object holds any more are dropped when the set has
/// doubled since the last sweep, so it never outgrows twice what is in use.
pub struct Interner<T: ?Sized> {
    values: Mutex<Values<T>>,
}

struct Values<T: ?Sized> {
    set: HashSet<Arc<T>>,
    sweep_at: usize,
}

impl<T: ?Sized + Hash + Eq> Values<T> {
    /// Adds `shared`, first dropping the values nobody else holds once the set has doubled.
    fn insert(&mut self, shared: Arc<T>) -> Arc<T> {
        if self.set.len() >= self.sweep_at {
            self.set.retain(|v| Arc::strong_count(v) > 1);
            self.sweep_at = (self.set.len() * 2).max(FIRST_SWEEP);
        }
        self.set.insert(shared.clone());
        shared
    }
}

/// Below this many values the set is never swept.
const FIRST_SWEEP: usize = 1024;

impl<T: ?Sized + Hash + Eq> Interner<T> {
    /// An interner holding nothing yet.
    pub(super) fn new() -> Self {
        Self {
            values: Mutex::new(Values {
                set: HashSet::new(),
                sweep_at: FIRST_SWEEP,
            }),
        }
    }

    /// The shared copy of `value`, made with `make` when there is none yet.
    pub fn get<Q>(&self, value: &Q, make: impl FnOnce(&Q) -> Arc<T>) -> Arc<T>
    where
        Q: ?Sized + Hash + Eq,
        Arc<T>: Borrow<Q>,
    {
        let Ok(mut values) = self.values.lock() else {
            // A panic while the lock was held: share nothing rather than fail.
            return make(value);
        };
        match values.set.get(value) {
            Some(shared) => shared.clone(),
            None => values.insert(make(value)),
        }
    }

    /// The shared copy of a value equal to `value`: `value` itself when there is none yet.
    pub fn share(&self, value: T) -> Arc<T>
    where
        T: Sized,
    {
        let Ok(mut values) = self.values.lock() else {
            return Arc::new(value);
        };
        match values.set.get(&value) {
            Some(shared) => shared.clone(),
            None => values.insert(Arc::new(value)),
        }
    }

    /// How many values are shared now.
    pub fn len(&self) -> usize {
        self.values.lock().map(|v| v.set.len()).unwrap_or_default()
    }

    /// Whether it holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A label: key and value.
pub type Label = (Arc<str>, Arc<str>);

static STRINGS: LazyLock<Interner<str>> = LazyLock::new(Interner::new);

/// The shared copy of a string that repeats across objects.
pub fn string(value: &str) -> Arc<str> {
    STRINGS.get(value, |v: &str| Arc::from(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_share_one_copy() {
        let interner: Interner<str> = Interner::new();
        let a = interner.get("metal3", |v: &str| Arc::from(v));
        let b = interner.get("metal3", |v: &str| Arc::from(v));
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(interner.len(), 1);
    }

    /// Values nobody holds go at the sweep; values still held stay shared.
    #[test]
    fn unheld_values_are_swept_once_the_set_doubles() {
        let interner: Interner<str> = Interner::new();
        let kept = interner.get("kept", |v: &str| Arc::from(v));
        for i in 1..FIRST_SWEEP {
            interner.get(format!("gone-{i}").as_str(), |v: &str| Arc::from(v));
        }
        assert_eq!(interner.len(), FIRST_SWEEP);
        interner.get("next", |v: &str| Arc::from(v));
        assert_eq!(
            interner.len(),
            2,
            "only the held value and the new one remain"
        );
        assert!(Arc::ptr_eq(
            &kept,
            &interner.get("kept", |v: &str| Arc::from(v))
        ));
    }
}
