//! Pools whose addresses meet. Upstream allows it on purpose (NAT, separate sites), so bitpool
//! serves them (unless `--refuse-overlapping-pools`), but never in silence: each pool involved
//! says which pools it meets and where, since its no-duplicate promise holds per pool only.

use std::net::IpAddr;

use crate::alloc::{AddressSpace, Family};
use crate::ipam::key::PoolKey;

/// The addresses a pool can hand out, as ranges of its family's values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Covered {
    pub family: Family,
    pub ranges: Vec<(u128, u128)>,
}

impl Covered {
    /// The addresses `space` hands out.
    pub fn of_space(space: &AddressSpace) -> Self {
        Self {
            family: space.family(),
            ranges: space.segments().map(|s| (s.first, s.last)).collect(),
        }
    }

    /// The first range both cover, if any.
    pub fn meets(&self, other: &Covered) -> Option<(u128, u128)> {
        if self.family != other.family {
            return None;
        }
        let mut common: Vec<(u128, u128)> = self
            .ranges
            .iter()
            .flat_map(|a| {
                other
                    .ranges
                    .iter()
                    .filter(move |b| a.0 <= b.1 && b.0 <= a.1)
                    .map(move |b| (a.0.max(b.0), a.1.min(b.1)))
            })
            .collect();
        common.sort_unstable();
        common.first().copied()
    }
}

/// Another pool that meets this one, and the first range they share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overlap {
    /// `Kind namespace/name`, as people read a pool.
    pub pool: String,
    pub first: IpAddr,
    pub last: IpAddr,
}

/// The pools among `others` that meet `own`, by name, each with its key.
pub fn find<C: std::borrow::Borrow<Covered>>(
    own: &Covered,
    others: impl IntoIterator<Item = (PoolKey, C)>,
) -> Vec<(PoolKey, Overlap)> {
    let mut found: Vec<(PoolKey, Overlap)> = others
        .into_iter()
        .filter_map(|(key, covered)| {
            let (first, last) = own.meets(covered.borrow())?;
            let overlap = Overlap {
                pool: key.describe(),
                first: own.family.address(first),
                last: own.family.address(last),
            };
            Some((key, overlap))
        })
        .collect();
    found.sort_by(|a, b| a.1.pool.cmp(&b.1.pool));
    found
}

/// What a pool says about the pools it meets.
pub fn message(overlaps: &[Overlap]) -> String {
    let named: Vec<String> = overlaps
        .iter()
        .map(|o| match o.first == o.last {
            true => format!("{} ({})", o.pool, o.first),
            false => format!("{} ({}-{})", o.pool, o.first, o.last),
        })
        .collect();
    format!(
        "the pool's addresses overlap those of {}: each pool hands out an address once, but two pools may hand out the same one",
        crate::runtime::objects::first_few(&named, ", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::key::PoolKind;

    fn v4(ranges: &[(&str, &str)]) -> Covered {
        let value = |s: &str| crate::alloc::family::to_value(s.parse().expect("test address"));
        Covered {
            family: Family::V4,
            ranges: ranges.iter().map(|(a, b)| (value(a), value(b))).collect(),
        }
    }

    #[test]
    fn pools_meet_where_their_ranges_do() {
        let own = v4(&[("10.77.0.1", "10.77.0.254")]);
        let key = |kind, name: &str| PoolKey {
            kind,
            namespace: Some("ns".into()),
            name: name.into(),
        };
        let others = vec![
            (
                key(PoolKind::Metal3IPPool, "c"),
                v4(&[("10.77.0.200", "10.77.1.10")]),
            ),
            (
                key(PoolKind::InClusterIPPool, "b"),
                v4(&[("10.77.0.0", "10.77.0.255")]),
            ),
            (
                key(PoolKind::InClusterIPPool, "far"),
                v4(&[("10.78.0.1", "10.78.0.9")]),
            ),
            (
                key(PoolKind::InClusterIPPool, "v6"),
                Covered {
                    family: Family::V6,
                    ranges: vec![(1, u128::MAX)],
                },
            ),
        ];
        let found: Vec<Overlap> = find(&own, others).into_iter().map(|(_, o)| o).collect();
        let shown: Vec<String> = found
            .iter()
            .map(|o| format!("{} {}-{}", o.pool, o.first, o.last))
            .collect();
        assert_eq!(
            shown,
            [
                "IPPool ns/c 10.77.0.200-10.77.0.254",
                "InClusterIPPool ns/b 10.77.0.1-10.77.0.254",
            ]
        );
        assert_eq!(
            message(&found[..1]),
            "the pool's addresses overlap those of IPPool ns/c (10.77.0.200-10.77.0.254): each pool hands out an address once, but two pools may hand out the same one"
        );
    }

    #[test]
    fn the_first_shared_range_is_named() {
        let own = v4(&[("10.0.0.50", "10.0.0.60"), ("10.0.0.1", "10.0.0.5")]);
        let other = v4(&[("10.0.0.5", "10.0.0.55")]);
        let (first, last) = own.meets(&other).expect("they meet");
        assert_eq!(Family::V4.address(first).to_string(), "10.0.0.5");
        assert_eq!(Family::V4.address(last).to_string(), "10.0.0.5");
    }
}
