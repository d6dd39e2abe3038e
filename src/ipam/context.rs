//! The pool engine's context: the runtime's, which every subsystem shares, and what the engine
//! remembers between reconciles of this process (cached address spaces, the last ledger records,
//! orphan timers, address objects it created or deleted while the watches catch up).

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::runtime::reflector::Store;

use super::coverage::Coverage;
use super::key::{PoolKey, PoolKind};
use super::ledger::memory::Records;
use super::spec::SpecFingerprint;
use crate::runtime;
use crate::runtime::cached::Uid;

/// How long an address object this process deleted or created is remembered; a watch lagging
/// longer costs a check on the server per object, nothing worse.
const DELETED_MEMORY: Duration = Duration::from_secs(300);

/// A pool's address space as of one ledger version, so that the next reconcile need not rebuild
/// it from every allocated address.
pub struct CachedSpace {
    /// The spec it was built from.
    pub pool: SpecFingerprint,
    pub ledger_version: String,
    pub space: crate::alloc::AddressSpace,
}

/// What the engine remembers between reconciles.
#[derive(Default)]
struct Memory {
    orphan_since: Mutex<HashMap<PoolKey, Instant>>,
    spaces: Mutex<HashMap<PoolKey, CachedSpace>>,
    /// Address objects this process deleted (UID → when), until the watch has caught up: a
    /// lagging cache still lists them, and they need no check on the server.
    deleted_addresses: Mutex<HashMap<Uid, Instant>>,
    /// Address objects this process created (claim UID → object name, when), until a watch
    /// lagging behind them (a relist after an API server restart) must have caught up: a claim
    /// whose object the cache does not show yet is not given a second one.
    created_addresses: Mutex<HashMap<String, (String, Instant)>>,
}

/// What every reconcile of the IPAM controllers reads: the shared runtime context (through
/// `Deref`) and the engine's memory.
pub struct Context {
    shared: Arc<runtime::Context>,
    memory: Memory,
    /// What each pool covers and which pools meet, shared with the controllers' triggers.
    pub coverage: Arc<Coverage>,
    /// The last record of each pool's ledger this process read or wrote.
    pub records: Records,
}

impl Deref for Context {
    type Target = runtime::Context;

    fn deref(&self) -> &runtime::Context {
        &self.shared
    }
}

impl AsRef<runtime::Context> for Context {
    fn as_ref(&self) -> &runtime::Context {
        &self.shared
    }
}

impl Context {
    /// The engine's context around the runtime's, remembering nothing yet.
    pub fn new(shared: Arc<runtime::Context>) -> Self {
        Self {
            shared,
            memory: Memory::default(),
            coverage: Arc::default(),
            records: Records::default(),
        }
    }

    /// Which pool serves claims that name `key`: the one answer every controller asks.
    /// False when no pool of a kind bitpool serves exists under that name.
    pub fn pool_exists(&self, key: &PoolKey) -> bool {
        pool_cached(&self.shared, key)
    }

    /// The cached space of `key` if it was built for this pool spec and this ledger version.
    pub fn take_space(
        &self,
        key: &PoolKey,
        pool: &SpecFingerprint,
        ledger_version: Option<&str>,
    ) -> Option<crate::alloc::AddressSpace> {
        let cached = self.memory.spaces.lock().ok()?.remove(key)?;
        (&cached.pool == pool && Some(cached.ledger_version.as_str()) == ledger_version)
            .then_some(cached.space)
    }

    /// Keeps `cached` as `key`'s space for the next reconcile.
    pub fn keep_space(&self, key: &PoolKey, cached: CachedSpace) {
        if let Ok(mut spaces) = self.memory.spaces.lock() {
            spaces.insert(key.clone(), cached);
        }
    }

    /// Since when the pool `key` has held addresses no object explains, if it does.
    pub fn orphan_watch(&self, key: &PoolKey) -> Option<Instant> {
        self.memory.orphan_since.lock().ok()?.get(key).copied()
    }

    /// Since when the pool `key` has held addresses no object explains, starting now if it did not.
    pub fn orphan_watch_start(&self, key: &PoolKey) -> Instant {
        match self.memory.orphan_since.lock() {
            Ok(mut map) => *map.entry(key.clone()).or_insert_with(Instant::now),
            Err(_) => Instant::now(),
        }
    }

    /// Remembers that this process deleted the address object with UID `uid`.
    pub fn deleted_address(&self, uid: &Uid) {
        if let Ok(mut map) = self.memory.deleted_addresses.lock() {
            // Amortised: the old entries go whenever the map has doubled.
            if map.len() >= 1024 && map.len().is_power_of_two() {
                map.retain(|_, at| at.elapsed() < DELETED_MEMORY);
            }
            map.insert(uid.clone(), Instant::now());
        }
    }

    /// Whether this process deleted the address object with UID `uid` not long ago.
    pub fn recently_deleted_address(&self, uid: &Uid) -> bool {
        self.memory
            .deleted_addresses
            .lock()
            .is_ok_and(|map| map.get(uid).is_some_and(|at| at.elapsed() < DELETED_MEMORY))
    }

    /// Remembers that this process created the address object `name` for the claim `claim_uid`.
    pub fn created_address(&self, claim_uid: &str, name: &str) {
        if let Ok(mut map) = self.memory.created_addresses.lock() {
            if map.len() >= 1024 && map.len().is_power_of_two() {
                map.retain(|_, (_, at)| at.elapsed() < DELETED_MEMORY);
            }
            map.insert(claim_uid.to_string(), (name.to_string(), Instant::now()));
        }
    }

    /// The address object this process created for the claim `claim_uid` not long ago.
    pub fn recently_created_address(&self, claim_uid: &str) -> Option<String> {
        let map = self.memory.created_addresses.lock().ok()?;
        let (name, at) = map.get(claim_uid)?;
        (at.elapsed() < DELETED_MEMORY).then(|| name.clone())
    }

    /// The pool `key` holds no unexplained address any more.
    pub fn forget_orphans(&self, key: &PoolKey) {
        if let Ok(mut map) = self.memory.orphan_since.lock() {
            map.remove(key);
        }
    }
}

/// Whether the pool `key` is in the caches of `shared`.
pub fn pool_cached(shared: &runtime::Context, key: &PoolKey) -> bool {
    fn cached<K>(store: &Store<K>, key: &PoolKey) -> bool
    where
        K: kube::Resource<DynamicType = ()> + Clone + 'static,
    {
        key.object_ref::<K>()
            .is_some_and(|r| store.get(&r).is_some())
    }
    match key.kind {
        PoolKind::InClusterIPPool => cached(&shared.pools, key),
        PoolKind::GlobalInClusterIPPool => cached(&shared.global_pools, key),
        PoolKind::InClusterPrefixPool => cached(&shared.prefix_pools, key),
        PoolKind::GlobalInClusterPrefixPool => cached(&shared.global_prefix_pools, key),
        PoolKind::Metal3IPPool => {
            shared.settings.groups.metal3_kinds() && cached(&shared.ippools, key)
        }
    }
}
