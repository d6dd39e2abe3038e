//! Pool specs as the allocation core reads them: plain conversions, shared by the engine, the
//! webhook's rules and `bitpool migrate`.

use crate::alloc::{self, AddressSpace, Metal3Entry, Metal3Pool};
use crate::api::AllocationStrategy;
use crate::api::capi_pools::{InClusterIPPoolSpec, InClusterPrefixPoolSpec};
use crate::api::metal3_ipam::IPPoolSpec;

/// The allocation core's view of a pool spec.
pub fn capi_pool(spec: &InClusterIPPoolSpec) -> alloc::CapiPool {
    alloc::CapiPool {
        addresses: spec.addresses.clone(),
        prefix: i64::from(spec.prefix),
        gateway: spec.gateway.clone(),
        excluded_addresses: spec.excluded_addresses.clone(),
        allocate_reserved: spec.allocate_reserved_ip_addresses,
        pre_allocations: spec.pre_allocations.clone(),
        strategy: AllocationStrategy::for_core(spec.allocation_strategy),
        dns_servers: spec.dns_servers.clone(),
        subnets: spec
            .subnets
            .iter()
            .map(|s| alloc::CapiSubnet {
                addresses: s.addresses.clone(),
                prefix: i64::from(s.prefix),
                gateway: s.gateway.clone(),
                dns_servers: s.dns_servers.clone(),
            })
            .collect(),
    }
}

/// The allocation core's view of a prefix pool spec.
pub fn prefix_pool(spec: &InClusterPrefixPoolSpec) -> alloc::PrefixPool {
    alloc::PrefixPool {
        prefixes: spec.prefixes.clone(),
        allocation_prefix_length: i64::from(spec.allocation_prefix_length),
        excluded_prefixes: spec.excluded_prefixes.clone(),
        gateway: spec.gateway.clone(),
        pre_allocations: spec.pre_allocations.clone(),
        strategy: AllocationStrategy::for_core(spec.allocation_strategy),
    }
}

/// The allocation core's view of an IPPool spec.
pub fn metal3_pool(spec: &IPPoolSpec) -> Metal3Pool {
    Metal3Pool {
        entries: spec
            .pools
            .iter()
            .map(|e| Metal3Entry {
                start: e.start.clone(),
                end: e.end.clone(),
                subnet: e.subnet.clone(),
                prefix: e.prefix.map(i64::from),
                gateway: e.gateway.clone(),
                dns_servers: e.dns_servers.clone(),
            })
            .collect(),
        prefix: spec.prefix.map(i64::from),
        gateway: spec.gateway.clone(),
        dns_servers: spec.dns_servers.clone(),
        pre_allocations: spec.pre_allocations.clone(),
        strategy: AllocationStrategy::for_core(spec.allocation_strategy),
    }
}

/// Which spec of which pool a space was built from: a new spec means a new space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecFingerprint {
    pub uid: String,
    pub generation: i64,
}

/// A pool's empty address space and the spec it was built from.
pub struct Base {
    pub space: AddressSpace,
    pub spec: SpecFingerprint,
}
