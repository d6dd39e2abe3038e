//! bitpool: IP address management for bare-metal Kubernetes management clusters.
//!
//! - [`alloc`]: the allocation core, where an address is chosen (no Kubernetes in it).
//! - [`api`]: the Kubernetes kinds bitpool serves and reads, with upstream names.
//! - [`crds`]: the CustomResourceDefinitions generated from those types.
//! - [`runtime`]: what every subsystem runs on: watch caches, triggers, the shared context, how
//!   a controller runs, errors and their retry policy, small object operations.
//! - [`ipam`]: the IPAM engine: pools of every kind, their ledgers, the migration proxy.
//! - [`manager`]: the one place that knows every subsystem, and wires and runs them.
//! - [`endpoint`]: a cluster's control-plane endpoint from a pool.
//! - [`metal3data`]: the Metal3Data reconciler (templates, indexes, claims, rendered secrets).
//! - [`render`]: a host's metaData and networkData from its template, as CAPM3 writes them.
//! - [`migrate`]: Metal3 IPPools to InClusterIPPools without changing an address.
//! - [`webhook`]: the admission and conversion webhooks.
//! - [`ops`]: health probes, metrics, leader election and Events.
//! - [`rbac`]: the RBAC rules each controller group needs.
//! - [`net`]: the HTTP(S) listener and TLS the servers share.
//! - [`cli`]: the `bitpool` command line.

pub mod alloc;
pub mod api;
pub mod cli;
pub mod client;
pub mod crds;
pub mod endpoint;
pub mod inspect;
pub mod ipam;
pub mod manager;
pub mod metal3data;
pub mod migrate;
pub mod net;
pub mod ops;
pub mod rbac;
pub mod render;
pub mod runtime;
pub mod webhook;

/// The release this build is (`v0.2.1`, set by release builds; `v0.2.1-dev` otherwise: build.rs).
pub const VERSION: &str = env!("BITPOOL_BUILD_VERSION");
/// The commit this build was made from, 12 hex digits, or "unknown" (build.rs).
pub const COMMIT: &str = env!("BITPOOL_BUILD_COMMIT");
/// What `bitpool --version` prints after the name.
pub const VERSION_AND_COMMIT: &str = concat!(
    env!("BITPOOL_BUILD_VERSION"),
    " (commit ",
    env!("BITPOOL_BUILD_COMMIT"),
    ")"
);
