//! Time per allocation at several fill levels, bitpool against the upstream algorithm, and the
//! time to rebuild a space from existing addresses. `cargo bench --bench allocator`.
//!
//! Each fill level has scattered holes: `n + n/10` addresses are allocated, then every eleventh
//! one is released, so `n` are used and allocation must find the holes first.

use std::hint::black_box;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use bitpool::alloc::{AddressSpace, CapiPool, PrefixPool, family};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

const FILLS: [usize; 3] = [1_000, 10_000, 65_536];

struct Pool {
    name: &'static str,
    spec: CapiPool,
}

fn pools() -> [Pool; 2] {
    let pool = |name, cidr: &str, prefix| Pool {
        name,
        spec: CapiPool {
            addresses: vec![cidr.to_string()],
            prefix,
            ..Default::default()
        },
    };
    [
        pool("ipv4", "10.0.0.0/12", 12),
        pool("ipv6", "fd00:1:2:3::/64", 64),
    ]
}

/// A space with `n` used addresses and `n/10` holes among them, and the list of used addresses.
fn filled(spec: &CapiPool, n: usize) -> (AddressSpace, Vec<IpAddr>) {
    fill(
        AddressSpace::capi(spec).expect("benchmark pool is valid"),
        n,
    )
}

/// `space` with `n` used addresses and `n/10` holes among them, and the list of used addresses.
fn fill(mut space: AddressSpace, n: usize) -> (AddressSpace, Vec<IpAddr>) {
    let mut rng = StdRng::seed_from_u64(1);
    let holes = n / 10;
    let mut used = Vec::with_capacity(n + holes);
    for _ in 0..n + holes {
        used.push(
            space
                .allocate("fill", None, &mut rng)
                .expect("pool is large enough")
                .address,
        );
    }
    let mut kept = Vec::with_capacity(n);
    let mut released = 0;
    for (i, address) in used.into_iter().enumerate() {
        if released < holes && i % 11 == 5 {
            space.release(address);
            released += 1;
        } else {
            kept.push(address);
        }
    }
    (space, kept)
}

/// The upstream algorithm: build the in-use set from the list, then walk the pool from its start.
fn list_and_scan(pool_first: u128, pool_last: u128, used: &[u128]) -> Option<u128> {
    let mut in_use = used.to_vec();
    in_use.sort_unstable();
    in_use.dedup();
    let mut candidate = pool_first;
    loop {
        if in_use.binary_search(&candidate).is_err() {
            return Some(candidate);
        }
        if candidate == pool_last {
            return None;
        }
        candidate += 1;
    }
}

/// Runs `allocate` `iters` times in chunks of at most `chunk`, timing only the allocations;
/// `undo` restores the fill level after each chunk. A chunk no larger than the number of holes
/// keeps every allocation at the fill level being measured.
fn timed_chunks<S>(
    iters: u64,
    chunk: u64,
    state: &mut S,
    mut allocate: impl FnMut(&mut S) -> IpAddr,
    undo: impl Fn(&mut S, IpAddr),
) -> Duration {
    let mut total = Duration::ZERO;
    let mut remaining = iters;
    let mut taken = Vec::with_capacity(chunk as usize);
    while remaining > 0 {
        let chunk = remaining.min(chunk);
        let start = Instant::now();
        for _ in 0..chunk {
            taken.push(black_box(allocate(state)));
        }
        total += start.elapsed();
        for address in taken.drain(..) {
            undo(state, address);
        }
        remaining -= chunk;
    }
    total
}

/// One allocation from `space` (filled by [`fill`] with `n`), as bench `bitpool/<n>`.
fn bitpool_allocation(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    n: usize,
    space: &AddressSpace,
) {
    let chunk = (n / 10) as u64;
    group.bench_with_input(BenchmarkId::new("bitpool", n), &n, |b, _| {
        let mut rng = StdRng::seed_from_u64(2);
        b.iter_custom(|iters| {
            let mut state = space.clone();
            timed_chunks(
                iters,
                chunk,
                &mut state,
                |s| {
                    s.allocate("bench", None, &mut rng)
                        .expect("holes are free")
                        .address
                },
                |s, a| {
                    s.release(a);
                },
            )
        })
    });
}

/// A /64 out of a /32 (2^32 candidates) with 100,000 /64s used.
fn prefix_allocation(c: &mut Criterion) {
    let mut group = c.benchmark_group("prefix_64_of_32");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(3));
    let spec = PrefixPool {
        prefixes: vec!["2001:db8::/32".into()],
        allocation_prefix_length: 64,
        ..Default::default()
    };
    let (space, _) = spec.space().expect("benchmark pool is valid");
    let n = 100_000;
    let (space, _) = fill(space, n);
    bitpool_allocation(&mut group, n, &space);
    group.finish();
}

fn allocation(c: &mut Criterion) {
    for pool in pools() {
        let mut group = c.benchmark_group(pool.name);
        group
            .sample_size(20)
            .measurement_time(Duration::from_secs(3));
        for n in FILLS {
            let (space, used) = filled(&pool.spec, n);
            let chunk = (n / 10) as u64;
            bitpool_allocation(&mut group, n, &space);

            let range =
                family::parse_entry(&pool.spec.addresses[0]).expect("benchmark pool is valid");
            let used_values: Vec<u128> = used.iter().map(|a| family::to_value(*a)).collect();
            let fam = range.family;
            group.bench_with_input(BenchmarkId::new("baseline", n), &n, |b, _| {
                b.iter_custom(|iters| {
                    let mut list = used_values.clone();
                    timed_chunks(
                        iters,
                        chunk,
                        &mut list,
                        |list| {
                            let value = list_and_scan(range.first + 1, range.last, list)
                                .expect("holes are free");
                            list.push(value);
                            fam.address(value)
                        },
                        |list, a| {
                            let value = family::to_value(a);
                            if let Some(i) = list.iter().rposition(|v| *v == value) {
                                list.swap_remove(i);
                            }
                        },
                    )
                })
            });
        }
        group.finish();
    }
}

fn rebuild(c: &mut Criterion) {
    let mut group = c.benchmark_group("rebuild");
    group.sample_size(20);
    let spec = &pools()[0].spec;
    let (_, mut used) = filled(spec, 100_000);
    // IPAddresses come from the API server in no useful order.
    used.shuffle(&mut StdRng::seed_from_u64(3));
    group.bench_function(BenchmarkId::from_parameter(100_000), |b| {
        b.iter(|| {
            let mut space = AddressSpace::capi(spec).expect("benchmark pool is valid");
            space.mark_all_used(used.iter().copied());
            black_box(space.counts())
        })
    });
    group.finish();
}

criterion_group!(benches, allocation, prefix_allocation, rebuild);
criterion_main!(benches);
