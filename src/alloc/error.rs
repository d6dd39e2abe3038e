//! Errors of the allocation core. Messages name the offending field and value so that a person
//! reading a condition knows what to change.

use std::net::IpAddr;

use super::family::Family;

/// Why a pool spec cannot be turned into an address space. The pool allocates nothing until the
/// spec is fixed; addresses already allocated from it are kept.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("{field}: {value:?} is not a valid IP, range, nor CIDR")]
    Unparseable { field: String, value: String },
    #[error("{field}: {value:?} is not a valid IP address")]
    InvalidAddress { field: String, value: String },
    #[error("{field}: range {value:?} ends before it starts")]
    ReversedRange { field: String, value: String },
    #[error(
        "{field}: {value:?} is {found} but the pool is {pool}; a pool holds one address family"
    )]
    MixedFamilies {
        field: String,
        value: String,
        found: Family,
        pool: Family,
    },
    #[error("the pool has no addresses")]
    NoAddresses,
    #[error(
        "{field}: {value:?} is outside the pool's subnet {subnet} (the lowest address of its list, and its prefix); addresses of another subnet go in spec.subnets"
    )]
    OutsideSubnet {
        field: String,
        value: String,
        subnet: String,
    },
    #[error("{field}: a subnet needs at least one address")]
    NoAddressesIn { field: String },
    #[error(
        "{field}: gateway {value} is outside its subnet {subnet}; a subnet's gateway is one of its own addresses (or an IPv6 link-local one)"
    )]
    GatewayOutsideSubnet {
        field: String,
        value: IpAddr,
        subnet: String,
    },
    #[error(
        "{field}: subnet {subnet} overlaps subnet {other_subnet} of {other}; a pool's subnets are apart"
    )]
    SubnetsOverlap {
        field: String,
        subnet: String,
        other: String,
        other_subnet: String,
    },
    #[error("{field}: prefix {prefix} is not valid for {family} (0 to {})", family.bits())]
    InvalidPrefix {
        field: String,
        prefix: i64,
        family: Family,
    },
    #[error("pools[{index}]: an entry needs a start or a subnet")]
    EntryWithoutStart { index: usize },
    #[error("{field}: {value:?} is not network aligned (its host bits are not zero)")]
    NotNetworkAligned { field: String, value: String },
    #[error(
        "allocationPrefixLength {length} is not valid for {family} (1 to {}){}",
        family.bits(),
        default_length_hint(*length, *family)
    )]
    InvalidAllocationLength { length: i64, family: Family },
    #[error(
        "{field}: {value:?} is longer than allocationPrefixLength {length}; sub-prefixes are cut from prefixes at least that large"
    )]
    AllocationLongerThanPrefix {
        field: String,
        value: String,
        length: u8,
    },
    #[error("{field}: {value:?} is not inside the pool's prefixes")]
    ExcludedOutsidePool { field: String, value: String },
    #[error("{field}: {value:?} is not a network address of a /{length} sub-prefix")]
    NotASubPrefix {
        field: String,
        value: String,
        length: u8,
    },
    #[error("preAllocations[{claim}]: {address} is not in the pool")]
    PreAllocationOutsidePool { claim: String, address: IpAddr },
    #[error("preAllocations: {address} is given to both {first:?} and {second:?}")]
    PreAllocationTwice {
        address: IpAddr,
        first: String,
        second: String,
    },
}

/// Why a claim got no address. Transient ones clear when the pool changes or an address frees.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    #[error("the pool has no free address")]
    Exhausted,
    #[error("requested address {value:?} is not a valid IP address")]
    RequestedUnparseable { value: String },
    #[error(
        "requested prefix {value:?} is not a /{length} sub-prefix (its network address, with or without the length)"
    )]
    RequestedNotASubPrefix { value: String, length: u8 },
    #[error("requested address {address} is not in the pool")]
    RequestedOutsidePool { address: IpAddr },
    #[error("requested address {address} is already in use")]
    RequestedInUse { address: IpAddr },
    #[error("requested address {address} is preallocated to claim {holder:?}")]
    RequestedPreallocated { address: IpAddr, holder: String },
    #[error("requested address {requested} conflicts with the preallocated address {preallocated}")]
    ConflictsWithPreAllocation {
        requested: IpAddr,
        preallocated: IpAddr,
    },
    #[error("preallocated address {address} is already in use")]
    PreAllocatedInUse { address: IpAddr },
    #[error("preallocated address {address} is not in the pool")]
    PreAllocationOutOfBounds { address: IpAddr },
    #[error(
        "address {address}, reserved for this claim before the pool changed, lies outside every subnet of the pool now, so it has no prefix or gateway to go with it; it stays reserved for the claim: put its range back in the pool, or delete the claim to release it"
    )]
    ReservedOutsidePool { address: IpAddr },
}

impl AllocError {
    /// The same refusal with every address it names passed through `f` (a prefix pool names
    /// sub-prefixes by their network addresses, not the numbers its space holds). Exhaustive: a
    /// new variant that names an address must say how it maps.
    pub fn map_addresses(self, f: impl Fn(IpAddr) -> IpAddr) -> Self {
        use AllocError::*;
        match self {
            Exhausted => Exhausted,
            RequestedUnparseable { value } => RequestedUnparseable { value },
            RequestedNotASubPrefix { value, length } => RequestedNotASubPrefix { value, length },
            RequestedOutsidePool { address } => RequestedOutsidePool {
                address: f(address),
            },
            RequestedInUse { address } => RequestedInUse {
                address: f(address),
            },
            RequestedPreallocated { address, holder } => RequestedPreallocated {
                address: f(address),
                holder,
            },
            ConflictsWithPreAllocation {
                requested,
                preallocated,
            } => ConflictsWithPreAllocation {
                requested: f(requested),
                preallocated: f(preallocated),
            },
            PreAllocatedInUse { address } => PreAllocatedInUse {
                address: f(address),
            },
            PreAllocationOutOfBounds { address } => PreAllocationOutOfBounds {
                address: f(address),
            },
            ReservedOutsidePool { address } => ReservedOutsidePool {
                address: f(address),
            },
        }
    }

    /// True when only the pool or its other claims can clear this (waiting helps); false when
    /// the claim itself must change.
    pub fn is_exhaustion(&self) -> bool {
        matches!(self, AllocError::Exhausted)
    }
}

/// The prefix pools' API defaults `allocationPrefixLength` to 64, an IPv6 length: an IPv4 pool
/// that leaves it out gets it, and is told what to set.
fn default_length_hint(length: i64, family: Family) -> &'static str {
    match (length, family) {
        (64, Family::V4) => {
            "; 64 is the API's default, meant for IPv6: set allocationPrefixLength to the length of the IPv4 sub-prefixes to hand out"
        }
        _ => "",
    }
}
