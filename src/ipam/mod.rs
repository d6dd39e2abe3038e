//! The IPAM engine: pools of every kind serving claims of both APIs, one batch per pool.
//!
//! - [`engine`]: the pool engine, whatever its dialect, as named phases;
//! - [`dialect`]: what a pool kind brings to the engine;
//! - [`capi`]: its InClusterIPPool / GlobalInClusterIPPool dialect;
//! - [`prefix`]: its InClusterPrefixPool / GlobalInClusterPrefixPool dialect (sub-prefixes);
//! - [`metal3`]: its Metal3 IPPool dialect (IPClaims and IPAddressClaims from one space);
//! - [`key`]: the pool kinds and which pool an object belongs to;
//! - [`kinds`]: the claim and address kinds behind one interface;
//! - [`ledger`]: the per-pool record that makes the API server the judge of every allocation:
//!   its format, the pure transaction applied to it, and how it is read, rebuilt and committed;
//! - [`duplicates`] and [`overlaps`]: addresses held twice and pools that meet, as pure
//!   functions;
//! - [`moving`]: a pool's ledger handed over with the pool by `clusterctl move`;
//! - [`proxy`]: Metal3 IPPools that serve their IPClaims from a CAPI pool (migration);
//! - [`claims`]: claims of either kind whose pool does not exist;
//! - [`spec`]: pool specs as the allocation core reads them;
//! - [`sweep`]: ledgers whose pool went without its finalizer;
//! - [`controllers`]: what wakes each IPAM controller (its pools, their claims and addresses,
//!   the pools they meet, namespaces, Clusters);
//! - [`context`]: the runtime's context and what the engine remembers between reconciles.

pub mod capi;
pub mod claims;
pub mod context;
pub mod controllers;
pub mod coverage;
pub mod dialect;
pub mod duplicates;
pub mod engine;
pub mod key;
pub mod kinds;
pub mod ledger;
pub mod metal3;
pub mod moving;
pub mod overlaps;
pub mod prefix;
pub mod proxy;
pub mod spec;
pub mod sweep;
pub mod tenancy;

pub use context::{CachedSpace, Context};
