//! Prefix pools (InClusterPrefixPool, GlobalInClusterPrefixPool): sub-prefixes of one length
//! handed out of the pool's prefixes.
//!
//! A sub-prefix is numbered by its network address shifted right by its host bits. The numbers
//! of one pool prefix form a plain range, so a prefix pool becomes an ordinary [`Layout`] over
//! numbers and the [`AddressSpace`] serves it unchanged: a /64 out of a /32 (2^32 candidates)
//! costs what one address costs, and the ledger's bitmap stays dense. [`Numbering`] converts
//! between sub-prefixes and their numbers at the edge.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::error::SpecError;
use super::family::{self, Family};
use super::pool::{
    FamilyCheck, Layout, LeaseParams, Order, Outside, Segment, Strategy, address, entry, normalize,
    place_pre_allocations, subtract,
};
use super::space::AddressSpace;

/// Upstream's allocation length when the spec leaves it out (or sets 0).
pub const DEFAULT_ALLOCATION_LENGTH: i64 = 64;

/// `allocationPrefixLength` as written, defaulted as upstream does.
pub fn effective_length(allocation_prefix_length: i64) -> i64 {
    match allocation_prefix_length {
        0 => DEFAULT_ALLOCATION_LENGTH,
        length => length,
    }
}

/// An InClusterPrefixPool or GlobalInClusterPrefixPool spec.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PrefixPool {
    /// Network-aligned CIDRs.
    pub prefixes: Vec<String>,
    /// The length of every sub-prefix handed out; 0 means [`DEFAULT_ALLOCATION_LENGTH`].
    pub allocation_prefix_length: i64,
    /// IPs, ranges or CIDRs: a sub-prefix overlapping any of them is never handed out.
    pub excluded_prefixes: Vec<String>,
    /// Carried to every IPAddress; it blocks nothing (as upstream).
    pub gateway: Option<String>,
    /// Claim name → a sub-prefix (`network/length`, or its network address).
    pub pre_allocations: BTreeMap<String, String>,
    pub strategy: Strategy,
}

/// How sub-prefixes of one length map to numbers and back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Numbering {
    pub family: Family,
    /// The allocation length.
    pub length: u8,
}

impl Numbering {
    fn host_bits(self) -> u8 {
        self.family.bits() - self.length
    }

    /// The number of the sub-prefix `network/length`, as an address of the pool's family (the
    /// form the address space and the ledger hold); `None` for another family or length, or a
    /// network address with host bits set.
    pub fn number(self, network: IpAddr, length: u8) -> Option<IpAddr> {
        let value = family::to_value(network);
        let host = self.host_bits();
        let aligned = host == 0 || value & ((1u128 << host) - 1) == 0;
        (Family::of(network) == self.family && length == self.length && aligned)
            .then(|| self.family.address(shift_down(value, host)))
    }

    /// The number of the sub-prefix that contains `address` (of the numbering's family): how
    /// an IPAddress of another length, or with host bits set, is held.
    pub fn containing(self, address: IpAddr) -> IpAddr {
        let value = family::to_value(address);
        self.family.address(shift_down(value, self.host_bits()))
    }

    /// The addresses sub-prefixes `first..=last` (numbers) cover: the first one's network
    /// address to the last one's last address, as values of the family.
    pub fn address_bounds(self, first: u128, last: u128) -> (u128, u128) {
        let host = self.host_bits();
        let last_host = shift_up(1, host).wrapping_sub(1);
        (shift_up(first, host), shift_up(last, host) | last_host)
    }

    /// The network address of sub-prefix `number`.
    pub fn network(self, number: IpAddr) -> IpAddr {
        let value = family::to_value(number);
        self.family.address(shift_up(value, self.host_bits()))
    }

    /// Sub-prefix `number` as people write it: `network/length`.
    pub fn sub_prefix(self, number: IpAddr) -> String {
        format!("{}/{}", self.network(number), self.length)
    }

    /// Reads a sub-prefix as a claim or a preallocation names it: `network/length` or the bare
    /// network address.
    pub fn parse(self, text: &str) -> Option<IpAddr> {
        match text.trim().split_once('/') {
            Some(_) => {
                let (family, value, length) = family::parse_subnet(text)?;
                self.number(family.address(value), length)
            }
            None => self.number(family::parse_address(text)?, self.length),
        }
    }
}

fn shift_down(value: u128, bits: u8) -> u128 {
    value.checked_shr(u32::from(bits)).unwrap_or(0)
}

fn shift_up(value: u128, bits: u8) -> u128 {
    value.checked_shl(u32::from(bits)).unwrap_or(0)
}

/// One `prefixes[]` entry, parsed.
struct Cidr {
    field: String,
    text: String,
    network: u128,
    length: u8,
}

/// The numbers each pool prefix holds; none may be longer than the allocation length.
fn number_ranges(prefixes: &[Cidr], numbering: Numbering) -> Result<Vec<(u128, u128)>, SpecError> {
    let host = numbering.host_bits();
    prefixes
        .iter()
        .map(|cidr| {
            if cidr.length > numbering.length {
                return Err(SpecError::AllocationLongerThanPrefix {
                    field: cidr.field.clone(),
                    value: cidr.text.clone(),
                    length: numbering.length,
                });
            }
            let (first, last) = numbering.family.subnet_bounds(cidr.network, cidr.length);
            Ok((shift_down(first, host), shift_down(last, host)))
        })
        .collect()
}

impl PrefixPool {
    /// The allocation length as the spec gives it, defaulted.
    pub fn effective_length(&self) -> i64 {
        effective_length(self.allocation_prefix_length)
    }

    /// The pool as an address space over sub-prefix numbers, and the numbering that names them.
    pub fn space(&self) -> Result<(AddressSpace, Numbering), SpecError> {
        let (layout, numbering) = self.layout()?;
        Ok((AddressSpace::new(layout), numbering))
    }

    /// Validates the spec (the webhook's and the reconciler's rules) and lays its sub-prefixes
    /// out as ranges of numbers, lowest first.
    pub fn layout(&self) -> Result<(Layout, Numbering), SpecError> {
        let mut families = FamilyCheck::default();
        let prefixes = self.parsed_prefixes(&mut families)?;
        let family = families.family.ok_or(SpecError::NoAddresses)?;
        let numbering = Numbering {
            family,
            length: self.allocation_length(family)?,
        };
        let pool = normalize(number_ranges(&prefixes, numbering)?);
        let excluded = self.excluded_numbers(&mut families, &pool, numbering)?;
        let gateway = self
            .gateway
            .as_deref()
            .filter(|g| !g.is_empty())
            .map(|g| address("gateway", g, &mut families))
            .transpose()?;
        let segments: Vec<Segment> = subtract(&pool, &normalize(excluded))
            .into_iter()
            .map(|(first, last)| Segment {
                first,
                last,
                params: 0,
            })
            .collect();
        let pre_allocations = self.pre_allocations(numbering, &segments)?;
        let layout = Layout {
            family,
            order: Order::Address,
            strategy: self.strategy,
            segments,
            params: vec![LeaseParams {
                prefix: numbering.length,
                gateway,
                dns_servers: Vec::new(),
            }],
            pre_allocations,
            pre_allocations_outside: BTreeMap::new(),
        };
        Ok((layout, numbering))
    }

    /// `prefixes[]`, parsed: each a network-aligned CIDR of the pool's one family.
    fn parsed_prefixes(&self, families: &mut FamilyCheck) -> Result<Vec<Cidr>, SpecError> {
        let mut parsed = Vec::new();
        for (i, text) in self.prefixes.iter().enumerate() {
            let field = format!("prefixes[{i}]");
            let value = text.clone();
            let Some((family, network, length)) = family::parse_subnet(text) else {
                return Err(SpecError::Unparseable { field, value });
            };
            families.check(&field, text, family)?;
            if family.subnet_bounds(network, length).0 != network {
                return Err(SpecError::NotNetworkAligned { field, value });
            }
            parsed.push(Cidr {
                field,
                text: value,
                network,
                length,
            });
        }
        Ok(parsed)
    }

    /// The numbers `excludedPrefixes[]` touch; each entry must lie inside the pool's prefixes.
    fn excluded_numbers(
        &self,
        families: &mut FamilyCheck,
        pool: &[(u128, u128)],
        numbering: Numbering,
    ) -> Result<Vec<(u128, u128)>, SpecError> {
        let host = numbering.host_bits();
        let mut excluded = Vec::new();
        for (i, text) in self.excluded_prefixes.iter().enumerate() {
            let field = format!("excludedPrefixes[{i}]");
            let range = entry(field.clone(), text)?;
            families.check(&field, text, range.family)?;
            let (first, last) = (shift_down(range.first, host), shift_down(range.last, host));
            if !pool.iter().any(|(a, b)| *a <= first && last <= *b) {
                let value = text.clone();
                return Err(SpecError::ExcludedOutsidePool { field, value });
            }
            excluded.push((first, last));
        }
        Ok(excluded)
    }

    fn allocation_length(&self, family: Family) -> Result<u8, SpecError> {
        let length = self.effective_length();
        u8::try_from(length)
            .ok()
            .filter(|l| (1..=family.bits()).contains(l))
            .ok_or(SpecError::InvalidAllocationLength { length, family })
    }

    fn pre_allocations(
        &self,
        numbering: Numbering,
        segments: &[Segment],
    ) -> Result<BTreeMap<String, u128>, SpecError> {
        let parse = |claim: &str, text: &str| {
            let number = numbering
                .parse(text)
                .ok_or_else(|| SpecError::NotASubPrefix {
                    field: format!("preAllocations[{claim}]"),
                    value: text.to_string(),
                    length: numbering.length,
                })?;
            Ok((family::to_value(number), numbering.network(number)))
        };
        place_pre_allocations(&self.pre_allocations, segments, Outside::Refuse, parse)
            .map(|(inside, _)| inside)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::{Strategy as Generate, *};
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;
    use crate::alloc::AllocError;

    fn pool(prefixes: &[&str], length: i64) -> PrefixPool {
        PrefixPool {
            prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
            allocation_prefix_length: length,
            ..Default::default()
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("test address")
    }

    /// Allocates `n` sub-prefixes in order and names them `network/length`.
    fn take(space: &mut AddressSpace, numbering: Numbering, n: usize) -> Vec<String> {
        let mut rng = StdRng::seed_from_u64(7);
        (0..n)
            .map(|i| {
                let lease = space
                    .allocate(&format!("claim-{i}"), None, &mut rng)
                    .expect("free sub-prefix");
                format!("{}/{}", numbering.network(lease.address), lease.prefix)
            })
            .collect()
    }

    #[test]
    fn an_address_is_held_as_the_sub_prefix_that_contains_it() {
        let numbering = Numbering {
            family: Family::V6,
            length: 64,
        };
        let fifth = numbering.parse("fd00:0:0:5::/64").expect("sub-prefix");
        assert_eq!(numbering.containing(ip("fd00:0:0:5::")), fifth);
        assert_eq!(numbering.containing(ip("fd00:0:0:5:1::9")), fifth);
        assert_ne!(numbering.containing(ip("fd00:0:0:6::")), fifth);
        assert_eq!(numbering.network(fifth), ip("fd00:0:0:5::"));
    }

    #[test]
    fn sub_prefix_numbers_cover_their_addresses() {
        let numbering = Numbering {
            family: Family::V4,
            length: 26,
        };
        let value = |text: &str| family::to_value(ip(text));
        let (first, last) = (value("0.0.0.1"), value("0.0.0.2"));
        assert_eq!(
            numbering.address_bounds(first, last),
            (value("0.0.0.64"), value("0.0.0.191"))
        );
        let whole = Numbering {
            family: Family::V6,
            length: 1,
        };
        assert_eq!(whole.address_bounds(1, 1), (1 << 127, u128::MAX));
    }

    #[test]
    fn sub_prefixes_come_lowest_first_and_a_64_is_the_default() {
        let (mut space, numbering) = pool(&["fd00:0:0:10::/60", "fd00::/62"], 0)
            .space()
            .expect("valid pool");
        assert_eq!(numbering.length, 64);
        assert_eq!(space.counts().total, 16 + 4);
        assert_eq!(
            take(&mut space, numbering, 6),
            [
                "fd00::/64",
                "fd00:0:0:1::/64",
                "fd00:0:0:2::/64",
                "fd00:0:0:3::/64",
                "fd00:0:0:10::/64",
                "fd00:0:0:11::/64"
            ]
        );
    }

    #[test]
    fn excluded_entries_block_every_sub_prefix_they_touch_and_the_gateway_blocks_nothing() {
        let mut spec = pool(&["10.0.0.0/24"], 28);
        spec.excluded_prefixes = vec!["10.0.0.17".into(), "10.0.0.40-10.0.0.49".into()];
        spec.gateway = Some("10.0.0.1".into());
        let (mut space, numbering) = spec.space().expect("valid pool");
        assert_eq!(space.counts().total, 16 - 3);
        assert_eq!(
            take(&mut space, numbering, 3),
            ["10.0.0.0/28", "10.0.0.64/28", "10.0.0.80/28"]
        );
        let lease = space
            .lease(numbering.parse("10.0.0.0/28").expect("sub-prefix"))
            .expect("in the pool");
        assert_eq!(lease.gateway, Some(ip("10.0.0.1")));
    }

    #[test]
    fn a_64_out_of_a_32_is_one_of_four_billion_candidates() {
        let (mut space, numbering) = pool(&["2001:db8::/32"], 64).space().expect("valid");
        assert_eq!(space.counts().total, 1 << 32);
        let mut rng = StdRng::seed_from_u64(1);
        for i in 0..1000 {
            space
                .allocate(&format!("c{i}"), None, &mut rng)
                .expect("free");
        }
        let counts = space.counts();
        assert_eq!((counts.used, counts.free), (1000, (1 << 32) - 1000));
        let next = space.allocate("next", None, &mut rng).expect("free");
        assert_eq!(numbering.network(next.address), ip("2001:db8:0:3e8::"));
    }

    #[test]
    fn sub_prefixes_are_named_by_network_and_length() {
        let numbering = Numbering {
            family: Family::V6,
            length: 64,
        };
        let five = numbering.parse("fd00:0:0:5::/64").expect("sub-prefix");
        assert_eq!(numbering.parse("fd00:0:0:5::"), Some(five));
        assert_eq!(numbering.network(five), ip("fd00:0:0:5::"));
        for wrong in [
            "fd00:0:0:5::/63",
            "fd00:0:0:5::1",
            "fd00:0:0:5::1/64",
            "10.0.0.0/24",
            "x",
        ] {
            assert_eq!(numbering.parse(wrong), None, "{wrong}");
        }
        let whole = Numbering {
            family: Family::V4,
            length: 32,
        };
        assert_eq!(
            whole.network(whole.parse("10.1.2.3").expect("a /32")),
            ip("10.1.2.3")
        );
    }

    #[test]
    fn preallocations_and_requests_name_sub_prefixes() {
        let mut spec = pool(&["fd00::/56"], 64);
        spec.pre_allocations = BTreeMap::from([
            ("host-a".to_string(), "fd00:0:0:7::/64".to_string()),
            ("host-b".to_string(), "fd00:0:0:9::".to_string()),
        ]);
        let (mut space, numbering) = spec.space().expect("valid pool");
        let mut rng = StdRng::seed_from_u64(3);
        let a = space
            .allocate("host-a", None, &mut rng)
            .expect("preallocated");
        assert_eq!(numbering.network(a.address), ip("fd00:0:0:7::"));
        assert_eq!(space.counts().reserved, 1, "host-b's is held for it");
        let requested = numbering
            .parse("fd00:0:0:9::/64")
            .expect("sub-prefix")
            .to_string();
        assert!(matches!(
            space.allocate("other", Some(&requested), &mut rng),
            Err(AllocError::RequestedPreallocated { .. })
        ));
    }

    #[test]
    fn invalid_specs_say_what_to_change() {
        let mut excluded = pool(&["fd00::/48"], 64);
        excluded.excluded_prefixes = vec!["fd01::/64".into()];
        let mut pre = pool(&["fd00::/48"], 64);
        pre.pre_allocations = BTreeMap::from([("h".to_string(), "fd00::1".to_string())]);
        let mut outside = pool(&["fd00::/48"], 64);
        outside.pre_allocations = BTreeMap::from([("h".to_string(), "fd01::".to_string())]);
        let cases: Vec<(PrefixPool, &str)> = vec![
            (pool(&[], 64), "the pool has no addresses"),
            (
                pool(&["fd00::1/48"], 64),
                "prefixes[0]: \"fd00::1/48\" is not network aligned",
            ),
            (
                pool(&["fd00::/48", "10.0.0.0/8"], 64),
                "prefixes[1]: \"10.0.0.0/8\" is IPv4",
            ),
            (
                pool(&["fd00::/48"], 40),
                "prefixes[0]: \"fd00::/48\" is longer than allocationPrefixLength 40",
            ),
            (
                pool(&["fd00::/48"], 129),
                "allocationPrefixLength 129 is not valid for IPv6",
            ),
            (
                pool(&["10.0.0.0/8"], 33),
                "allocationPrefixLength 33 is not valid for IPv4",
            ),
            (
                pool(&["10.0.0.0/8"], 64),
                "allocationPrefixLength 64 is not valid for IPv4 (1 to 32); 64 is the API's default, meant for IPv6: set allocationPrefixLength",
            ),
            (
                pool(&["fd00::"], 64),
                "prefixes[0]: \"fd00::\" is not a valid IP",
            ),
            (
                excluded,
                "excludedPrefixes[0]: \"fd01::/64\" is not inside the pool's prefixes",
            ),
            (
                pre,
                "preAllocations[h]: \"fd00::1\" is not a network address of a /64",
            ),
            (outside, "preAllocations[h]: fd01:: is not in the pool"),
        ];
        for (spec, expected) in cases {
            let error = spec.layout().expect_err(expected).to_string();
            assert!(
                error.starts_with(expected),
                "{error:?} should start with {expected:?}"
            );
        }
    }

    /// The model: every aligned block of the allocation length inside a pool prefix and clear of
    /// every exclusion, walked in order.
    fn model(prefixes: &[(u32, u8)], excluded: &[(u32, u32)], length: u8) -> BTreeSet<u32> {
        let size = 1u64 << (32 - length);
        let mut out = BTreeSet::new();
        for (network, prefix) in prefixes {
            let end = u64::from(*network) + (1u64 << (32 - prefix));
            let mut block = u64::from(*network);
            while block < end {
                let last = block + size - 1;
                let blocked = excluded
                    .iter()
                    .any(|(a, b)| u64::from(*a) <= last && block <= u64::from(*b));
                if !blocked {
                    out.insert(block as u32);
                }
                block += size;
            }
        }
        out
    }

    fn v4(value: u32) -> String {
        std::net::Ipv4Addr::from(value).to_string()
    }

    /// Pool prefixes (network, length), exclusions (first, last) and the allocation length.
    type Case = (Vec<(u32, u8)>, Vec<(u32, u32)>, u8);

    /// Pool prefixes inside 10.0.0.0/24 and an allocation length no shorter than any of them.
    fn case() -> impl Generate<Value = Case> {
        let base = 0x0a00_0000u32;
        let prefix = (24u8..=30).prop_flat_map(move |len| {
            (0u32..(1 << (len - 24))).prop_map(move |i| (base + (i << (32 - len)), len))
        });
        let excluded = (0u32..256, 0u32..8)
            .prop_map(move |(at, span)| (base + at, base + (at + span).min(255)));
        (
            proptest::collection::vec(prefix, 1..4),
            proptest::collection::vec(excluded, 0..4),
            24u8..=32,
        )
            .prop_filter("sub-prefixes no larger than a pool prefix", |(p, _, l)| {
                p.iter().all(|(_, len)| len <= l)
            })
    }

    fn spec_of(prefixes: &[(u32, u8)], excluded: &[(u32, u32)], length: u8) -> PrefixPool {
        PrefixPool {
            prefixes: prefixes
                .iter()
                .map(|(n, l)| format!("{}/{l}", v4(*n)))
                .collect(),
            allocation_prefix_length: i64::from(length),
            excluded_prefixes: excluded
                .iter()
                .map(|(a, b)| format!("{}-{}", v4(*a), v4(*b)))
                .collect(),
            ..Default::default()
        }
    }

    proptest! {
        #[test]
        fn sequential_allocation_walks_the_models_blocks(
            (prefixes, excluded, length) in case(),
            released in proptest::collection::vec(0usize..64, 0..8),
        ) {
            let expected = model(&prefixes, &excluded, length);
            // An exclusion that touches no pool prefix is refused instead.
            let inside = |(a, b): &(u32, u32)| prefixes.iter().any(|(n, l)| {
                let last = u64::from(*n) + (1u64 << (32 - l)) - 1;
                u64::from(*n) <= u64::from(*a) && u64::from(*b) <= last
            });
            let spec = spec_of(&prefixes, &excluded, length);
            if !excluded.iter().all(inside) {
                // Merged neighbours may still contain it; only refusals of real outsiders count.
                if let Err(e) = spec.layout() {
                    prop_assert!(matches!(e, SpecError::ExcludedOutsidePool { .. }), "{e}");
                }
                return Ok(());
            }
            let (mut space, numbering) = spec.space().expect("valid spec");
            prop_assert_eq!(space.counts().total, expected.len() as u128);
            let mut rng = StdRng::seed_from_u64(11);
            let mut got = Vec::new();
            for i in 0.. {
                match space.allocate(&format!("c{i}"), None, &mut rng) {
                    Ok(lease) => {
                        prop_assert_eq!(lease.prefix, length);
                        got.push(numbering.network(lease.address));
                    }
                    Err(e) => {
                        prop_assert_eq!(e, AllocError::Exhausted);
                        break;
                    }
                }
            }
            let walked: Vec<IpAddr> = expected.iter().map(|v| IpAddr::V4((*v).into())).collect();
            prop_assert_eq!(&got, &walked);
            // Released sub-prefixes come back lowest first.
            let mut back: BTreeSet<IpAddr> = BTreeSet::new();
            for r in released.iter().filter(|r| **r < got.len()) {
                let number = numbering.number(got[*r], length).expect("own sub-prefix");
                if space.release(number) {
                    back.insert(got[*r]);
                }
            }
            for network in back {
                let lease = space.allocate("again", None, &mut rng).expect("released");
                prop_assert_eq!(numbering.network(lease.address), network);
                space.release(lease.address);
                space.allocate(&format!("keep-{network}"), Some(&lease.address.to_string()), &mut rng)
                    .expect("requested the released one");
            }
        }

        #[test]
        fn random_allocation_hands_out_each_block_once(
            (prefixes, excluded, length) in case(),
            seed in any::<u64>(),
        ) {
            let mut spec = spec_of(&prefixes, &excluded, length);
            spec.strategy = super::Strategy::Random;
            let Ok((mut space, numbering)) = spec.space() else { return Ok(()) };
            let expected = model(&prefixes, &excluded, length);
            let mut rng = StdRng::seed_from_u64(seed);
            let mut got = BTreeSet::new();
            while let Ok(lease) = space.allocate(&format!("c{}", got.len()), None, &mut rng) {
                let IpAddr::V4(network) = numbering.network(lease.address) else {
                    return Err(TestCaseError::fail("not IPv4"));
                };
                prop_assert!(got.insert(u32::from(network)), "{network} twice");
            }
            prop_assert_eq!(got, expected);
        }
    }
}
