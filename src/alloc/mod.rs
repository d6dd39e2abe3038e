//! The allocation core: pool specs become address spaces, and addresses are chosen from them.
//! Plain functions over plain data, no Kubernetes and no I/O.
//!
//! - [`pool`]: the two pool dialects (in-cluster provider and Metal3) and their rules.
//! - [`prefix`]: prefix pools, whose sub-prefixes are numbered so that an address space serves
//!   them.
//! - [`space`]: [`AddressSpace`], where an address is chosen, released and counted.
//! - [`set`]: the roaring-bitmap used set and the free-run index behind it.
//! - [`family`]: addresses as integers, and the textual forms of pool entries.

pub mod error;
pub mod family;
pub mod pool;
pub mod prefix;
pub mod set;
pub mod space;

pub use error::{AllocError, SpecError};
pub use family::{Family, parse_address, parse_subnet};
pub use pool::{CapiPool, CapiSubnet, Layout, Metal3Entry, Metal3Pool, Strategy};
pub use prefix::{Numbering, PrefixPool};
pub use space::{AddressSpace, Counts, Lease, Marked};
