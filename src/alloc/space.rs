//! An address space: where an address is chosen.

use std::collections::BTreeMap;
use std::net::IpAddr;

use rand::Rng;

use super::error::{AllocError, SpecError};
use super::family::{self, Family};
use super::pool::{CapiPool, Layout, LeaseParams, Metal3Pool, Order, Segment, Strategy};
use super::set::{AddressSet, FreeRuns};

/// An allocated address and what goes with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub address: IpAddr,
    pub prefix: u8,
    pub gateway: Option<IpAddr>,
    pub dns_servers: Vec<IpAddr>,
}

/// Exact counts. `free` is what a new claim without a preallocation can still get.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Addresses the pool can hand out (after exclusions, reserved addresses and gateways).
    pub total: u128,
    /// Allocated addresses, inside the pool or not.
    pub used: u128,
    pub free: u128,
    /// Allocated addresses that the pool no longer contains.
    pub out_of_range: u128,
    /// Preallocated addresses whose claim has not taken them yet.
    pub reserved: u128,
}

/// What [`AddressSpace::mark_used`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marked {
    InRange,
    OutOfRange,
    AlreadyUsed,
    OtherFamily,
}

/// Rejection sampling tries before random allocation walks the free runs instead.
const RANDOM_TRIES: usize = 64;
/// Random allocation spreads over this many times the addresses in use (see
/// [`AddressSpace::random_window`]).
pub const RANDOM_SPREAD: u128 = 64;
/// ... and over at least this many addresses: pools up to a /16 are always random throughout.
pub const RANDOM_MIN_WINDOW: u128 = 1 << 16;

/// A pool's addresses: which are free, used, reserved for a claim, or allocated but outside the
/// pool. Allocation and release cost O(log n) in the number of used addresses; memory grows
/// with what is used and excluded, never with the pool's size.
#[derive(Clone, Debug)]
pub struct AddressSpace {
    layout: Layout,
    /// Indexes of `layout.segments`, ascending by address.
    by_address: Vec<usize>,
    /// `offsets[i]`: how many addresses come before segment `i` in pool order.
    offsets: Vec<u128>,
    total: u128,
    free: FreeRuns,
    used: AddressSet,
    out_of_range: AddressSet,
    /// Preallocated address → its claim.
    reserved: BTreeMap<u128, String>,
}

impl AddressSpace {
    /// The space of a CAPI pool, or why its spec is invalid.
    pub fn capi(pool: &CapiPool) -> Result<Self, SpecError> {
        Ok(Self::new(pool.layout()?))
    }

    /// The space of a Metal3 IPPool, or why its spec is invalid.
    pub fn metal3(pool: &Metal3Pool) -> Result<Self, SpecError> {
        Ok(Self::new(pool.layout()?))
    }

    /// The space of `layout`, nothing allocated yet.
    pub fn new(layout: Layout) -> Self {
        let mut by_address: Vec<usize> = (0..layout.segments.len()).collect();
        by_address.sort_by_key(|i| layout.segments[*i].first);
        let mut offsets = Vec::with_capacity(layout.segments.len());
        let mut total: u128 = 0;
        for segment in &layout.segments {
            offsets.push(total);
            total = total.saturating_add(segment.size());
        }
        let reserved: BTreeMap<u128, String> = layout
            .pre_allocations
            .iter()
            .map(|(claim, value)| (*value, claim.clone()))
            .collect();
        let mut space = Self {
            layout,
            by_address,
            offsets,
            total,
            free: FreeRuns::default(),
            used: AddressSet::default(),
            out_of_range: AddressSet::default(),
            reserved,
        };
        space.rebuild_free();
        space
    }

    /// The pool's address family.
    pub fn family(&self) -> Family {
        self.layout.family
    }

    /// The ranges of values the pool hands out, in pool order.
    pub fn segments(&self) -> impl Iterator<Item = &crate::alloc::pool::Segment> + '_ {
        self.layout.segments.iter()
    }

    /// How the pool picks the next free address.
    pub fn strategy(&self) -> Strategy {
        self.layout.strategy
    }

    fn segment_of(&self, value: u128) -> Option<&Segment> {
        let position = self
            .by_address
            .partition_point(|i| self.layout.segments[*i].first <= value);
        let segment = &self.layout.segments[self.by_address[position.checked_sub(1)?]];
        (value <= segment.last).then_some(segment)
    }

    /// The value of `address` when it is of this pool's family.
    fn value(&self, address: IpAddr) -> Option<u128> {
        (Family::of(address) == self.layout.family).then(|| family::to_value(address))
    }

    /// Whether the pool contains `address` (allocated or not).
    pub fn contains(&self, address: IpAddr) -> bool {
        self.value(address)
            .is_some_and(|v| self.segment_of(v).is_some())
    }

    /// Whether a claim without a preallocation could get `address` now.
    pub fn is_free(&self, address: IpAddr) -> bool {
        self.value(address).is_some_and(|v| self.free.contains(v))
    }

    /// Whether `address` is allocated, inside the pool or not.
    pub fn is_used(&self, address: IpAddr) -> bool {
        self.value(address)
            .is_some_and(|v| self.used.contains(v) || self.out_of_range.contains(v))
    }

    /// The address preallocated to `claim`, if any.
    pub fn preallocation(&self, claim: &str) -> Option<IpAddr> {
        self.layout
            .pre_allocations
            .get(claim)
            .map(|v| self.layout.family.address(*v))
    }

    /// The lease `address` gets in this pool (prefix, gateway, DNS of its entry).
    pub fn lease(&self, address: IpAddr) -> Option<Lease> {
        let value = self.value(address)?;
        let params = &self.layout.params[self.segment_of(value)?.params];
        Some(self.lease_with(value, params))
    }

    fn lease_with(&self, value: u128, params: &LeaseParams) -> Lease {
        Lease {
            address: self.layout.family.address(value),
            prefix: params.prefix,
            gateway: params.gateway,
            dns_servers: params.dns_servers.clone(),
        }
    }

    /// The pool's counts as they stand.
    pub fn counts(&self) -> Counts {
        let reserved = self
            .reserved
            .keys()
            .filter(|v| !self.used.contains(**v))
            .count() as u128;
        let in_range = self.used.len();
        let out_of_range = self.out_of_range.len();
        Counts {
            total: self.total,
            used: in_range + out_of_range,
            free: self.total.saturating_sub(in_range).saturating_sub(reserved),
            out_of_range,
            reserved,
        }
    }

    /// Allocates an address for `claim`: its preallocation, else `requested` (the claim's
    /// `ipAddress` annotation), else one chosen by the pool's strategy.
    pub fn allocate(
        &mut self,
        claim: &str,
        requested: Option<&str>,
        rng: &mut impl Rng,
    ) -> Result<Lease, AllocError> {
        let preallocated = self.layout.pre_allocations.get(claim).copied();
        let family = self.layout.family;
        if let Some(outside) = self.layout.pre_allocations_outside.get(claim) {
            return Err(AllocError::PreAllocationOutOfBounds {
                address: family.address(*outside),
            });
        }
        let value = match (requested, preallocated) {
            (Some(text), _) => {
                let address = family::parse_address(text).ok_or_else(|| {
                    AllocError::RequestedUnparseable {
                        value: text.to_string(),
                    }
                })?;
                let value = self
                    .value(address)
                    .ok_or(AllocError::RequestedOutsidePool { address })?;
                if let Some(pre) = preallocated.filter(|pre| *pre != value) {
                    return Err(AllocError::ConflictsWithPreAllocation {
                        requested: address,
                        preallocated: family.address(pre),
                    });
                }
                if self.segment_of(value).is_none() {
                    return Err(AllocError::RequestedOutsidePool { address });
                }
                match self.reserved.get(&value) {
                    Some(holder) if holder != claim => {
                        return Err(AllocError::RequestedPreallocated {
                            address,
                            holder: holder.clone(),
                        });
                    }
                    Some(_) if self.used.contains(value) => {
                        return Err(AllocError::RequestedInUse { address });
                    }
                    Some(_) => {}
                    None if !self.free.take(value) => {
                        return Err(AllocError::RequestedInUse { address });
                    }
                    None => {}
                }
                value
            }
            (None, Some(pre)) => {
                if self.used.contains(pre) {
                    return Err(AllocError::PreAllocatedInUse {
                        address: family.address(pre),
                    });
                }
                pre
            }
            (None, None) => {
                let value = match self.layout.strategy {
                    Strategy::Sequential => self.first_free(),
                    Strategy::Random => self.random_free(rng),
                }
                .ok_or(AllocError::Exhausted)?;
                self.free.take(value);
                value
            }
        };
        // Every branch above chose a value inside a segment; an address outside them all gets
        // no other subnet's prefix and gateway.
        let address = family.address(value);
        let lease = self
            .lease(address)
            .ok_or(AllocError::ReservedOutsidePool { address })?;
        self.used.insert(value);
        Ok(lease)
    }

    /// The first free address in pool order.
    fn first_free(&self) -> Option<u128> {
        match self.layout.order {
            Order::Address => self.free.first(),
            Order::Declaration => self
                .layout
                .segments
                .iter()
                .find_map(|s| self.free.first_in(s.first, s.last)),
        }
    }

    /// A free address, uniform over the free addresses of the [`Self::random_window`]: rejection
    /// sampling, which takes few tries unless the pool is nearly full, then an exact pick among
    /// all free runs.
    fn random_free(&self, rng: &mut impl Rng) -> Option<u128> {
        let counts = self.counts();
        let free = counts.free;
        if free == 0 {
            return None;
        }
        let window = self.random_window(counts.used);
        for _ in 0..RANDOM_TRIES {
            let ordinal = rng.random_range(0..window);
            let segment = self.offsets.partition_point(|o| *o <= ordinal) - 1;
            let value = self.layout.segments[segment].first + (ordinal - self.offsets[segment]);
            if self.free.contains(value) {
                return Some(value);
            }
        }
        let mut k = rng.random_range(0..free);
        for (first, last) in self.free.iter() {
            let size = (last - first).saturating_add(1);
            if k < size {
                return Some(first + k);
            }
            k -= size;
        }
        None
    }

    /// How many addresses, in pool order from the first, random allocation picks among: the
    /// whole pool, unless it is larger than [`RANDOM_SPREAD`] times the addresses in use (and
    /// than [`RANDOM_MIN_WINDOW`]). Uniform over a range that grows with use, no address is
    /// predictable, and the used addresses stay dense enough for the ledger's bitmap to take
    /// about two bytes each; scattered over a /64 they would take about twenty, and 100,000 of
    /// them would not fit in a ConfigMap.
    pub fn random_window(&self, used: u128) -> u128 {
        used.saturating_add(1)
            .saturating_mul(RANDOM_SPREAD)
            .max(RANDOM_MIN_WINDOW)
            .min(self.total)
    }

    /// Returns `address` to the pool (to its claim's reservation if it is preallocated).
    /// False when it was not allocated.
    pub fn release(&mut self, address: IpAddr) -> bool {
        let Some(value) = self.value(address) else {
            return false;
        };
        if self.out_of_range.remove(value) {
            return true;
        }
        if !self.used.remove(value) {
            return false;
        }
        if !self.reserved.contains_key(&value) {
            self.free.give_back(value);
        }
        true
    }

    /// Records an existing allocation (an IPAddress found at start-up), also when the pool no
    /// longer contains it: such an address counts as out of range until released.
    pub fn mark_used(&mut self, address: IpAddr) -> Marked {
        let Some(value) = self.value(address) else {
            return Marked::OtherFamily;
        };
        if self.used.contains(value) || self.out_of_range.contains(value) {
            return Marked::AlreadyUsed;
        }
        if self.segment_of(value).is_none() {
            self.out_of_range.insert(value);
            return Marked::OutOfRange;
        }
        self.used.insert(value);
        self.free.take(value);
        Marked::InRange
    }

    /// [`Self::mark_used`] for many addresses at once, in one pass (start-up rebuilds).
    pub fn mark_all_used(&mut self, addresses: impl IntoIterator<Item = IpAddr>) {
        let family = self.layout.family;
        let mut values: Vec<u128> = addresses
            .into_iter()
            .filter(|a| Family::of(*a) == family)
            .map(family::to_value)
            .chain(self.used.iter())
            .chain(self.out_of_range.iter())
            .collect();
        values.sort_unstable();
        values.dedup();
        let (in_range, outside): (Vec<u128>, Vec<u128>) = values
            .into_iter()
            .partition(|v| self.segment_of(*v).is_some());
        self.used = AddressSet::from_sorted(&in_range);
        self.out_of_range = AddressSet::from_sorted(&outside);
        self.rebuild_free();
    }

    /// Free runs = segments − used − reserved, in one ascending pass.
    fn rebuild_free(&mut self) {
        let mut taken: Vec<u128> = self
            .used
            .iter()
            .chain(self.reserved.keys().copied())
            .collect();
        taken.sort_unstable();
        taken.dedup();
        let mut runs = Vec::new();
        let mut next_taken = 0;
        for index in &self.by_address {
            let segment = self.layout.segments[*index];
            let mut cursor = Some(segment.first);
            while next_taken < taken.len() && taken[next_taken] < segment.first {
                next_taken += 1;
            }
            while let Some(start) = cursor {
                match taken.get(next_taken).filter(|t| **t <= segment.last) {
                    Some(&t) => {
                        if t > start {
                            runs.push((start, t - 1));
                        }
                        next_taken += 1;
                        cursor = if t < segment.last { Some(t + 1) } else { None };
                    }
                    None => {
                        runs.push((start, segment.last));
                        cursor = None;
                    }
                }
            }
        }
        self.free = FreeRuns::from_sorted(runs);
    }

    /// Every allocated address, inside the pool or not, ascending.
    pub fn used_addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        let family = self.layout.family;
        let mut all: Vec<u128> = self.used.iter().chain(self.out_of_range.iter()).collect();
        all.sort_unstable();
        all.into_iter().map(move |v| family.address(v))
    }

    /// The free addresses as ascending runs `(first, last)`: what an operator reads as the
    /// pool's room.
    pub fn free_runs(&self) -> impl Iterator<Item = (IpAddr, IpAddr)> + '_ {
        let family = self.layout.family;
        self.free
            .iter()
            .map(move |(first, last)| (family.address(first), family.address(last)))
    }

    /// Number of free runs: what allocation cost depends on (logarithmically).
    pub fn free_run_count(&self) -> usize {
        self.free.run_count()
    }
}
