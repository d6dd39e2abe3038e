//! Property tests: the allocation core against a plain model (a BTreeSet walk, the way upstream
//! computes it), for IPv4 and IPv6, both pool dialects, and random specs and operations.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use bitpool::alloc::Strategy as Allocation;
use bitpool::alloc::{
    AddressSpace, AllocError, CapiPool, CapiSubnet, Marked, Metal3Entry, Metal3Pool, family,
};
use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::StdRng;

/// Specs live in a 64-address window so that collisions, exhaustion and edges are common.
const WINDOW: u128 = 64;

#[derive(Clone, Copy, Debug)]
struct Base {
    v6: bool,
}

impl Base {
    fn start(self) -> u128 {
        if self.v6 {
            0xfd00_0000_0000_0000_0000_0000_0000_0000
        } else {
            0x0a00_0000
        }
    }
    fn bits(self) -> u8 {
        if self.v6 { 128 } else { 32 }
    }
    fn addr(self, offset: u128) -> IpAddr {
        let value = self.start() + offset;
        if self.v6 {
            IpAddr::V6(value.into())
        } else {
            IpAddr::V4((value as u32).into())
        }
    }
    fn text(self, offset: u128) -> String {
        self.addr(offset).to_string()
    }
    /// Uglier but equal spellings must behave the same (canonical comparison).
    fn padded_text(self, offset: u128) -> String {
        if self.v6 {
            format!("fd00:0000::{:04x}", offset)
        } else {
            self.text(offset)
        }
    }
}

#[derive(Clone, Debug)]
enum EntrySpec {
    Single(u128),
    Range(u128, u128),
    /// Offset and host bits (the CIDR has `bits - host_bits` prefix length).
    Cidr(u128, u8),
}

impl EntrySpec {
    fn text(&self, base: Base) -> String {
        match self {
            EntrySpec::Single(o) => base.text(*o),
            EntrySpec::Range(a, b) => format!("{}-{}", base.text(*a), base.text(*b)),
            EntrySpec::Cidr(o, host) => format!("{}/{}", base.text(*o), base.bits() - host),
        }
    }
    fn members(&self) -> Vec<u128> {
        match self {
            EntrySpec::Single(o) => vec![*o],
            EntrySpec::Range(a, b) => (*a..=*b).collect(),
            EntrySpec::Cidr(o, host) => {
                let size = 1u128 << host;
                let first = o / size * size;
                (first..first + size).collect()
            }
        }
    }
}

fn entry_spec() -> impl Strategy<Value = EntrySpec> {
    prop_oneof![
        (0..WINDOW).prop_map(EntrySpec::Single),
        (0..WINDOW, 0..WINDOW).prop_map(|(a, b)| EntrySpec::Range(a.min(b), a.max(b))),
        (0..WINDOW, 0u8..=5).prop_map(|(o, h)| EntrySpec::Cidr(o, h)),
    ]
}

#[derive(Clone, Debug)]
struct CapiCase {
    base: Base,
    entries: Vec<EntrySpec>,
    excluded: Vec<EntrySpec>,
    /// Host bits of the pool's prefix.
    prefix_host_bits: u8,
    gateway: Option<u128>,
    allocate_reserved: bool,
    pre: Vec<u128>,
}

fn capi_case() -> impl Strategy<Value = CapiCase> {
    (
        any::<bool>(),
        prop::collection::vec(entry_spec(), 1..4),
        prop::collection::vec(entry_spec(), 0..3),
        0u8..=8,
        prop::option::of(0..WINDOW),
        any::<bool>(),
        prop::collection::vec(0..WINDOW, 0..3),
    )
        .prop_map(
            |(v6, entries, excluded, prefix_host_bits, gateway, allocate_reserved, pre)| CapiCase {
                base: Base { v6 },
                entries,
                excluded,
                prefix_host_bits,
                gateway,
                allocate_reserved,
                pre,
            },
        )
}

impl CapiCase {
    fn spec(&self, strategy: Allocation) -> CapiPool {
        let b = self.base;
        CapiPool {
            addresses: self.entries.iter().map(|e| e.text(b)).collect(),
            prefix: i64::from(b.bits() - self.prefix_host_bits),
            gateway: self.gateway.map(|g| b.text(g)),
            excluded_addresses: self.excluded.iter().map(|e| e.text(b)).collect(),
            allocate_reserved: self.allocate_reserved,
            pre_allocations: self
                .pre
                .iter()
                .enumerate()
                .map(|(i, o)| (format!("p{i}"), b.padded_text(*o)))
                .collect(),
            strategy,
            dns_servers: vec![],
            subnets: vec![],
        }
    }

    /// Whether every entry lies in `<lowest address>/<prefix>` (else the spec is invalid, as
    /// upstream's webhook has it). The gateway may lie anywhere: upstream only keeps it out.
    fn in_one_subnet(&self) -> bool {
        let members: Vec<u128> = self.entries.iter().flat_map(EntrySpec::members).collect();
        let Some(lowest) = members.iter().min() else {
            return false;
        };
        let size = 1u128 << self.prefix_host_bits;
        let network = lowest / size * size;
        let inside = |o: &u128| network <= *o && *o < network + size;
        members.iter().all(inside)
    }

    /// The upstream algorithm, written out plainly over offsets.
    fn model_pool(&self) -> BTreeSet<u128> {
        let mut pool: BTreeSet<u128> = self.entries.iter().flat_map(EntrySpec::members).collect();
        let lowest = *pool.iter().next().expect("at least one entry");
        for e in &self.excluded {
            for m in e.members() {
                pool.remove(&m);
            }
        }
        if !self.allocate_reserved {
            // Offsets here are relative to a base aligned far beyond the window, so masking the
            // offset is masking the address.
            let size = 1u128 << self.prefix_host_bits;
            let network = lowest / size * size;
            pool.remove(&network);
            if !self.base.v6 {
                pool.remove(&(network + size - 1));
            }
        }
        if let Some(g) = self.gateway {
            pool.remove(&g);
        }
        pool
    }
}

#[derive(Clone, Debug)]
enum Op {
    Allocate(usize),
    Request(usize, u128),
    Release(u128),
    Mark(u128),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            4 => (0usize..10).prop_map(Op::Allocate),
            1 => (0usize..10, 0..WINDOW + 4).prop_map(|(c, o)| Op::Request(c, o)),
            2 => (0..WINDOW + 4).prop_map(Op::Release),
            1 => (0..WINDOW + 4).prop_map(Op::Mark),
        ],
        1..120,
    )
}

/// Claims 0..3 are the preallocated ones (`p0`..), the rest plain.
fn claim_name(index: usize, preallocated: usize) -> String {
    if index < preallocated {
        format!("p{index}")
    } else {
        format!("c{index}")
    }
}

struct Model {
    pool: BTreeSet<u128>,
    pre: BTreeMap<String, u128>,
    used: BTreeSet<u128>,
    out_of_range: BTreeSet<u128>,
}

impl Model {
    fn reserved_for_other(&self, claim: &str, offset: u128) -> bool {
        self.pre.iter().any(|(c, o)| *o == offset && c != claim)
    }

    fn is_free(&self, offset: u128) -> bool {
        self.pool.contains(&offset)
            && !self.used.contains(&offset)
            && !self.pre.values().any(|o| *o == offset)
    }

    fn allocate(&self, claim: &str, order: &[u128]) -> Result<u128, &'static str> {
        if let Some(p) = self.pre.get(claim) {
            return if self.used.contains(p) {
                Err("pre-in-use")
            } else {
                Ok(*p)
            };
        }
        order
            .iter()
            .copied()
            .find(|o| self.is_free(*o))
            .ok_or("exhausted")
    }

    fn request(&self, claim: &str, offset: u128) -> Result<u128, &'static str> {
        match self.pre.get(claim) {
            Some(p) if *p != offset => return Err("conflict"),
            _ => {}
        }
        if !self.pool.contains(&offset) {
            return Err("outside");
        }
        if self.reserved_for_other(claim, offset) {
            return Err("preallocated");
        }
        if self.used.contains(&offset) {
            return Err("in-use");
        }
        Ok(offset)
    }

    fn free_count(&self) -> u128 {
        let reserved_unused = self.pre.values().filter(|o| !self.used.contains(o)).count();
        (self.pool.len() - self.used.len() - reserved_unused) as u128
    }
}

fn error_kind(e: &AllocError) -> &'static str {
    match e {
        AllocError::Exhausted => "exhausted",
        AllocError::RequestedOutsidePool { .. } => "outside",
        AllocError::RequestedInUse { .. } => "in-use",
        AllocError::RequestedPreallocated { .. } => "preallocated",
        AllocError::ConflictsWithPreAllocation { .. } => "conflict",
        AllocError::PreAllocatedInUse { .. } => "pre-in-use",
        AllocError::RequestedUnparseable { .. } => "unparseable",
        AllocError::RequestedNotASubPrefix { .. } => "not-a-sub-prefix",
        AllocError::PreAllocationOutOfBounds { .. } => "pre-outside",
        AllocError::ReservedOutsidePool { .. } => "reserved-outside",
    }
}

/// Runs `ops` on the space and the model side by side. `order` is the model's pool order for
/// sequential allocation; `None` checks a random strategy (any free address is right).
fn run(
    space: &mut AddressSpace,
    model: &mut Model,
    base: Base,
    ops: &[Op],
    order: Option<&[u128]>,
) -> Result<(), TestCaseError> {
    let mut rng = StdRng::seed_from_u64(1);
    let offset_of = |a: IpAddr| family::to_value(a) - base.start();
    let preallocated = model.pre.len();
    for op in ops {
        match op {
            Op::Allocate(c) | Op::Request(c, _) => {
                let claim = claim_name(*c, preallocated);
                let (got, expected) = match op {
                    Op::Request(_, o) => {
                        let text = base.padded_text(*o);
                        (
                            space.allocate(&claim, Some(&text), &mut rng),
                            model.request(&claim, *o),
                        )
                    }
                    _ => {
                        let got = space.allocate(&claim, None, &mut rng);
                        let expected = match order {
                            Some(order) => model.allocate(&claim, order),
                            None => match (&got, model.pre.get(&claim)) {
                                // Random: any free address is right; check it is one.
                                (Ok(lease), None) => {
                                    let o = offset_of(lease.address);
                                    prop_assert!(
                                        model.is_free(o),
                                        "random gave a non-free address {}",
                                        lease.address
                                    );
                                    Ok(o)
                                }
                                _ => model.allocate(
                                    &claim,
                                    &model.pool.iter().copied().collect::<Vec<_>>(),
                                ),
                            },
                        };
                        (got, expected)
                    }
                };
                match (got, expected) {
                    (Ok(lease), Ok(o)) => {
                        prop_assert_eq!(lease.address, base.addr(o), "{:?}", op);
                        prop_assert!(
                            model.used.insert(o),
                            "address handed out twice: {}",
                            lease.address
                        );
                    }
                    (Err(e), Err(kind)) => prop_assert_eq!(error_kind(&e), kind, "{:?}", op),
                    (got, expected) => {
                        prop_assert!(false, "{:?}: got {:?}, model {:?}", op, got, expected)
                    }
                }
            }
            Op::Release(o) => {
                let expected = model.used.remove(o) || model.out_of_range.remove(o);
                prop_assert_eq!(space.release(base.addr(*o)), expected, "{:?}", op);
            }
            Op::Mark(o) => {
                let expected = if model.used.contains(o) || model.out_of_range.contains(o) {
                    Marked::AlreadyUsed
                } else if model.pool.contains(o) {
                    model.used.insert(*o);
                    Marked::InRange
                } else {
                    model.out_of_range.insert(*o);
                    Marked::OutOfRange
                };
                prop_assert_eq!(space.mark_used(base.addr(*o)), expected, "{:?}", op);
            }
        }
        let counts = space.counts();
        prop_assert_eq!(counts.total, model.pool.len() as u128);
        prop_assert_eq!(
            counts.used,
            (model.used.len() + model.out_of_range.len()) as u128
        );
        prop_assert_eq!(counts.out_of_range, model.out_of_range.len() as u128);
        prop_assert_eq!(counts.free, model.free_count());
    }
    // Whatever happened, a rebuild from the used addresses gives the same state.
    let used: Vec<IpAddr> = space.used_addresses().collect();
    let expected: Vec<IpAddr> = model
        .used
        .iter()
        .chain(&model.out_of_range)
        .map(|o| base.addr(*o))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    prop_assert_eq!(&used, &expected);
    Ok(())
}

/// What the spec error should be, if any, for preallocations the model finds invalid.
fn model_pre(case_pre: &[u128], pool: &BTreeSet<u128>) -> Option<BTreeMap<String, u128>> {
    let mut seen = BTreeSet::new();
    let mut pre = BTreeMap::new();
    for (i, o) in case_pre.iter().enumerate() {
        if !pool.contains(o) || !seen.insert(*o) {
            return None;
        }
        pre.insert(format!("p{i}"), *o);
    }
    Some(pre)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn capi_sequential_matches_the_model(case in capi_case(), ops in ops()) {
        let pool = case.model_pool();
        let built = AddressSpace::capi(&case.spec(Allocation::Sequential));
        if !case.in_one_subnet() {
            prop_assert!(built.is_err(), "a pool spanning subnets accepted");
            return Ok(());
        }
        let Some(pre) = model_pre(&case.pre, &pool) else {
            prop_assert!(built.is_err(), "invalid preallocations accepted");
            return Ok(());
        };
        let mut space = built.map_err(|e| TestCaseError::fail(format!("valid spec rejected: {e}")))?;
        let order: Vec<u128> = pool.iter().copied().collect();
        let mut model = Model { pool, pre, used: BTreeSet::new(), out_of_range: BTreeSet::new() };
        run(&mut space, &mut model, case.base, &ops, Some(&order))?;
    }

    #[test]
    fn capi_random_never_gives_a_taken_address(case in capi_case(), ops in ops()) {
        let pool = case.model_pool();
        let Some(pre) = model_pre(&case.pre, &pool).filter(|_| case.in_one_subnet()) else {
            return Ok(());
        };
        let mut space = AddressSpace::capi(&case.spec(Allocation::Random))
            .map_err(|e| TestCaseError::fail(format!("valid spec rejected: {e}")))?;
        let mut model = Model { pool, pre, used: BTreeSet::new(), out_of_range: BTreeSet::new() };
        run(&mut space, &mut model, case.base, &ops, None)?;
    }

    #[test]
    fn metal3_sequential_follows_declaration_order(
        v6 in any::<bool>(),
        ranges in prop::collection::vec((0..WINDOW, 0..WINDOW, any::<bool>()), 1..4),
        gateway in prop::option::of(0..WINDOW),
        ops in ops(),
    ) {
        let base = Base { v6 };
        // An entry is `start-end`, or (flag set) the /29 subnet around start, from its second address.
        let spans: Vec<(u128, u128)> = ranges.iter().map(|(a, b, subnet)| {
            if *subnet { (a / 8 * 8 + 1, a / 8 * 8 + 7) } else { (*a.min(b), *a.max(b)) }
        }).collect();
        let entries = ranges.iter().map(|(a, b, subnet)| {
            if *subnet {
                Metal3Entry { subnet: Some(format!("{}/{}", base.text(a / 8 * 8), base.bits() - 3)), ..Default::default() }
            } else {
                Metal3Entry { start: Some(base.text(*a.min(b))), end: Some(base.text(*a.max(b))), ..Default::default() }
            }
        }).collect();
        let spec = Metal3Pool {
            entries,
            prefix: Some(i64::from(base.bits()) - 8),
            gateway: gateway.map(|g| base.text(g)),
            ..Default::default()
        };
        let mut order = Vec::new();
        for (first, last) in &spans {
            for o in *first..=*last {
                if Some(o) != gateway && !order.contains(&o) {
                    order.push(o);
                }
            }
        }
        let built = AddressSpace::metal3(&spec);
        if order.is_empty() {
            prop_assert!(built.is_err());
            return Ok(());
        }
        let mut space = built.map_err(|e| TestCaseError::fail(format!("valid spec rejected: {e}")))?;
        let pool: BTreeSet<u128> = order.iter().copied().collect();
        let mut model = Model { pool, pre: BTreeMap::new(), used: BTreeSet::new(), out_of_range: BTreeSet::new() };
        run(&mut space, &mut model, base, &ops, Some(&order))?;
    }

    /// A pool of several subnets (each an 8-address block of the window, its own gateway):
    /// lowest first across all of them, each address handed out with its own subnet's prefix
    /// and gateway, exclusions and network/broadcast addresses per subnet kept out.
    #[test]
    fn capi_subnets_hand_out_lowest_first_with_their_own_parameters(
        v6 in any::<bool>(),
        subnets in prop::sample::subsequence((0..WINDOW / 8).collect::<Vec<u128>>(), 1..=3)
            .prop_shuffle()
            .prop_flat_map(|blocks| {
                let n = blocks.len();
                (
                    Just(blocks),
                    prop::collection::vec(prop::collection::vec((0u128..8, 0u128..8), 1..3), n),
                    prop::collection::vec(prop::option::of(0u128..8), n),
                )
            }),
        excluded in prop::collection::vec(entry_spec(), 0..3),
        allocate_reserved in any::<bool>(),
        ops in ops(),
    ) {
        let base = Base { v6 };
        let (blocks, entries, gateways) = subnets;
        let texts = |k: usize| -> Vec<String> {
            entries[k]
                .iter()
                .map(|(a, b)| EntrySpec::Range(blocks[k] * 8 + a.min(b), blocks[k] * 8 + a.max(b)).text(base))
                .collect()
        };
        let gateway = |k: usize| gateways[k].map(|g| blocks[k] * 8 + g);
        let prefix = i64::from(base.bits()) - 3;
        let spec = CapiPool {
            addresses: texts(0),
            prefix,
            gateway: gateway(0).map(|g| base.text(g)),
            excluded_addresses: excluded.iter().map(|e| e.text(base)).collect(),
            allocate_reserved,
            subnets: (1..blocks.len())
                .map(|k| CapiSubnet {
                    addresses: texts(k),
                    prefix,
                    gateway: gateway(k).map(|g| base.text(g)),
                    dns_servers: vec![],
                })
                .collect(),
            ..Default::default()
        };
        // The model: which subnet each address is in, then what is kept out.
        let mut subnet_of: BTreeMap<u128, usize> = BTreeMap::new();
        for (k, block) in blocks.iter().enumerate() {
            for (a, b) in &entries[k] {
                for o in block * 8 + a.min(b)..=block * 8 + a.max(b) {
                    subnet_of.insert(o, k);
                }
            }
            if !allocate_reserved {
                subnet_of.remove(&(block * 8));
                if !v6 {
                    subnet_of.remove(&(block * 8 + 7));
                }
            }
        }
        for k in 0..blocks.len() {
            if let Some(g) = gateway(k) {
                subnet_of.remove(&g);
            }
        }
        for e in &excluded {
            for m in e.members() {
                subnet_of.remove(&m);
            }
        }
        let built = AddressSpace::capi(&spec);
        let mut space = built.map_err(|e| TestCaseError::fail(format!("valid spec rejected: {e}")))?;
        let pool: BTreeSet<u128> = subnet_of.keys().copied().collect();
        let order: Vec<u128> = pool.iter().copied().collect();
        let mut model = Model { pool, pre: BTreeMap::new(), used: BTreeSet::new(), out_of_range: BTreeSet::new() };
        run(&mut space, &mut model, base, &ops, Some(&order))?;
        for o in &model.used {
            let lease = space.lease(base.addr(*o)).expect("a lease for an address of the pool");
            let k = subnet_of[o];
            prop_assert_eq!(i64::from(lease.prefix), prefix);
            prop_assert_eq!(lease.gateway, gateway(k).map(|g| base.addr(g)), "{} is in subnet {}", lease.address, k);
        }
    }

    /// No input panics or hangs: arbitrary text in every field, arbitrary prefixes.
    #[test]
    fn arbitrary_specs_never_panic(
        addresses in prop::collection::vec("[0-9a-f:./ -]{0,24}", 0..4),
        excluded in prop::collection::vec("[0-9a-f:./ -]{0,24}", 0..3),
        gateway in prop::option::of("[0-9a-f:.]{0,16}"),
        prefix in -4i64..200,
        requested in "[0-9a-f:.]{0,16}",
        reserved in any::<bool>(),
    ) {
        let pool = CapiPool { addresses, excluded_addresses: excluded, gateway, prefix, allocate_reserved: reserved, ..Default::default() };
        if let Ok(mut space) = AddressSpace::capi(&pool) {
            let mut rng = StdRng::seed_from_u64(3);
            let _ = space.allocate("a", None, &mut rng);
            let _ = space.allocate("b", Some(&requested), &mut rng);
            let _ = space.counts();
        }
        let m3 = Metal3Pool {
            entries: vec![Metal3Entry { start: Some(requested.clone()), subnet: Some(format!("{requested}/{prefix}")), ..Default::default() }],
            prefix: Some(prefix),
            ..Default::default()
        };
        if let Ok(mut space) = AddressSpace::metal3(&m3) {
            let _ = space.allocate("a", None, &mut StdRng::seed_from_u64(4));
        }
    }
}
