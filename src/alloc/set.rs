//! The two structures an address space is made of: a roaring bitmap of addresses (the used
//! set: exact counts, membership, compact serialization) and an ordered map of free runs (the
//! allocation index: the lowest free address, or any given one, in O(log n)).

use std::collections::BTreeMap;

use roaring::RoaringTreemap;

/// A set of 128-bit addresses: a roaring treemap of the low 64 bits per distinct high 64 bits.
/// An IPv4 pool or an IPv6 /64 has one high half, so this is one roaring bitmap in practice.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AddressSet {
    halves: BTreeMap<u64, RoaringTreemap>,
}

fn split(value: u128) -> (u64, u64) {
    ((value >> 64) as u64, value as u64)
}

impl AddressSet {
    /// Adds `value`; false if it was there already.
    pub fn insert(&mut self, value: u128) -> bool {
        let (high, low) = split(value);
        self.halves.entry(high).or_default().insert(low)
    }

    /// Removes `value`; false if it was not there.
    pub fn remove(&mut self, value: u128) -> bool {
        let (high, low) = split(value);
        let Some(half) = self.halves.get_mut(&high) else {
            return false;
        };
        let removed = half.remove(low);
        if half.is_empty() {
            self.halves.remove(&high);
        }
        removed
    }

    /// Whether the set holds `value`.
    pub fn contains(&self, value: u128) -> bool {
        let (high, low) = split(value);
        self.halves
            .get(&high)
            .is_some_and(|half| half.contains(low))
    }

    /// How many values the set holds.
    pub fn len(&self) -> u128 {
        self.halves
            .values()
            .map(|half| u128::from(half.len()))
            .sum()
    }

    /// Whether the set holds no value.
    pub fn is_empty(&self) -> bool {
        self.halves.is_empty()
    }

    /// Ascending.
    pub fn iter(&self) -> impl Iterator<Item = u128> + '_ {
        self.halves.iter().flat_map(|(high, half)| {
            half.iter()
                .map(move |low| (u128::from(*high) << 64) | u128::from(low))
        })
    }

    /// Builds the set from ascending values in one pass.
    pub fn from_sorted(values: &[u128]) -> Self {
        let mut set = Self::default();
        let mut start = 0;
        while start < values.len() {
            let high = split(values[start]).0;
            let end = start + values[start..].partition_point(|v| split(*v).0 == high);
            let lows = values[start..end].iter().map(|v| split(*v).1);
            // Ascending input, so from_sorted_iter cannot fail; fall back to inserts regardless.
            let half =
                RoaringTreemap::from_sorted_iter(lows.clone()).unwrap_or_else(|_| lows.collect());
            set.halves.insert(high, half);
            start = end;
        }
        set
    }
}

/// Why a serialized [`AddressSet`] could not be read.
#[derive(Debug, thiserror::Error)]
#[error("malformed address set: {0}")]
pub struct DecodeError(String);

impl AddressSet {
    /// The length of [`Self::to_bytes`], without building it.
    pub fn encoded_len(&self) -> usize {
        self.halves
            .values()
            .map(|half| 16 + half.serialized_size())
            .sum()
    }

    /// A compact binary form: per high half, its 8 bytes, the length of its roaring encoding
    /// (8 bytes), then the portable roaring serialization of its low halves.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (high, half) in &self.halves {
            out.extend_from_slice(&high.to_be_bytes());
            let mut body = Vec::with_capacity(half.serialized_size());
            // Writing into a Vec cannot fail.
            let _ = half.serialize_into(&mut body);
            out.extend_from_slice(&(body.len() as u64).to_be_bytes());
            out.extend_from_slice(&body);
        }
        out
    }

    /// Reads the form [`Self::to_bytes`] writes.
    pub fn from_bytes(mut bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut set = Self::default();
        let take = |n: usize, bytes: &mut &[u8]| -> Result<Vec<u8>, DecodeError> {
            if bytes.len() < n {
                return Err(DecodeError(format!(
                    "truncated: wanted {n} bytes, {} left",
                    bytes.len()
                )));
            }
            let (head, tail) = bytes.split_at(n);
            *bytes = tail;
            Ok(head.to_vec())
        };
        while !bytes.is_empty() {
            let high = u64::from_be_bytes(
                take(8, &mut bytes)?
                    .try_into()
                    .map_err(|_| DecodeError("high".into()))?,
            );
            let len = u64::from_be_bytes(
                take(8, &mut bytes)?
                    .try_into()
                    .map_err(|_| DecodeError("length".into()))?,
            );
            let len =
                usize::try_from(len).map_err(|_| DecodeError(format!("length {len} too large")))?;
            let body = take(len, &mut bytes)?;
            let half = RoaringTreemap::deserialize_from(&body[..])
                .map_err(|e| DecodeError(e.to_string()))?;
            if !half.is_empty() {
                set.halves.insert(high, half);
            }
        }
        Ok(set)
    }
}

/// Disjoint, non-adjacent inclusive runs `first..=last`, keyed by `first`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FreeRuns {
    runs: BTreeMap<u128, u128>,
}

impl FreeRuns {
    /// From ascending, disjoint runs.
    pub fn from_sorted(runs: impl IntoIterator<Item = (u128, u128)>) -> Self {
        let mut merged: Vec<(u128, u128)> = Vec::new();
        for (first, last) in runs {
            match merged.last_mut() {
                Some((_, prev_last)) if prev_last.checked_add(1) == Some(first) => {
                    *prev_last = last
                }
                _ => merged.push((first, last)),
            }
        }
        Self {
            runs: merged.into_iter().collect(),
        }
    }

    /// The run containing `value`.
    fn run_of(&self, value: u128) -> Option<(u128, u128)> {
        self.runs
            .range(..=value)
            .next_back()
            .filter(|(_, last)| **last >= value)
            .map(|(first, last)| (*first, *last))
    }

    /// Whether `value` is free.
    pub fn contains(&self, value: u128) -> bool {
        self.run_of(value).is_some()
    }

    /// The lowest free value.
    pub fn first(&self) -> Option<u128> {
        self.runs.keys().next().copied()
    }

    /// The lowest free value in `first..=last`.
    pub fn first_in(&self, first: u128, last: u128) -> Option<u128> {
        if self.contains(first) {
            return Some(first);
        }
        self.runs
            .range(first..=last)
            .next()
            .map(|(start, _)| *start)
    }

    /// Marks `value` as taken; false when it was not free.
    pub fn take(&mut self, value: u128) -> bool {
        let Some((first, last)) = self.run_of(value) else {
            return false;
        };
        self.runs.remove(&first);
        if first < value {
            self.runs.insert(first, value - 1);
        }
        if value < last {
            self.runs.insert(value + 1, last);
        }
        true
    }

    /// Marks `value` as free again, merging it with its neighbours; false when it was free.
    pub fn give_back(&mut self, value: u128) -> bool {
        if self.contains(value) {
            return false;
        }
        let mut first = value;
        let mut last = value;
        if let Some(prev) = value.checked_sub(1).and_then(|p| self.run_of(p)) {
            self.runs.remove(&prev.0);
            first = prev.0;
        }
        if let Some(next_last) = value.checked_add(1).and_then(|n| self.runs.remove(&n)) {
            last = next_last;
        }
        self.runs.insert(first, last);
        true
    }

    /// Ascending runs.
    pub fn iter(&self) -> impl Iterator<Item = (u128, u128)> + '_ {
        self.runs.iter().map(|(first, last)| (*first, *last))
    }

    /// Number of runs (not addresses).
    pub fn run_count(&self) -> usize {
        self.runs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_set_spans_high_halves() {
        let mut set = AddressSet::default();
        for v in [5u128, 1 << 70, (1 << 70) + 3, u128::MAX] {
            assert!(set.insert(v));
        }
        assert!(!set.insert(5));
        assert_eq!(set.len(), 4);
        assert!(set.contains(1 << 70) && !set.contains(6));
        assert_eq!(
            set.iter().collect::<Vec<_>>(),
            vec![5, 1 << 70, (1 << 70) + 3, u128::MAX]
        );
        assert!(set.remove(u128::MAX) && !set.remove(u128::MAX));
        assert_eq!(AddressSet::from_sorted(&[5, 1 << 70, (1 << 70) + 3]), set);
    }

    #[test]
    fn address_sets_survive_serialization_and_reject_garbage() {
        let mut set = AddressSet::default();
        for v in (0..70_000u128).chain([1 << 100, u128::MAX]) {
            set.insert(v);
        }
        let bytes = set.to_bytes();
        assert!(
            bytes.len() < 20_000,
            "70,000 consecutive addresses encode small ({} bytes)",
            bytes.len()
        );
        assert_eq!(AddressSet::from_bytes(&bytes).expect("round trip"), set);
        assert_eq!(
            AddressSet::from_bytes(&[]).expect("empty"),
            AddressSet::default()
        );
        assert!(AddressSet::from_bytes(&bytes[..bytes.len() - 1]).is_err());
        assert!(
            AddressSet::from_bytes(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 1, 2, 3])
                .is_err()
        );
    }

    #[test]
    fn free_runs_split_and_merge() {
        let mut runs = FreeRuns::from_sorted([(10, 19), (20, 20), (30, 39)]);
        assert_eq!(runs.iter().collect::<Vec<_>>(), vec![(10, 20), (30, 39)]);
        assert!(runs.take(15) && !runs.take(15));
        assert_eq!(runs.first_in(15, 39), Some(16));
        assert!(runs.take(10));
        assert_eq!(runs.first(), Some(11));
        assert!(runs.give_back(15) && runs.give_back(10) && !runs.give_back(12));
        assert_eq!(runs.iter().collect::<Vec<_>>(), vec![(10, 20), (30, 39)]);
        assert_eq!(runs.first_in(21, 29), None);
        let mut edge = FreeRuns::from_sorted([(0, u128::MAX)]);
        assert!(
            edge.take(0) && edge.take(u128::MAX) && edge.give_back(u128::MAX) && edge.give_back(0)
        );
        assert_eq!(edge.iter().collect::<Vec<_>>(), vec![(0, u128::MAX)]);
    }
}
