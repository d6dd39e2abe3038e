//! Rust types for every Kubernetes kind bitpool serves or reads.
//!
//! Group, version, kind, scope and JSON field names follow upstream exactly, so that an existing
//! installation can switch to bitpool in place. Addresses stay `String` here: a malformed value must
//! reach the reconciler (which reports it on a condition) instead of breaking deserialization.

pub mod capi;
pub mod capi_pools;
pub mod metal3_data;
pub mod metal3_hosts;
pub mod metal3_ipam;
mod schema;

/// Labels and annotations shared by several kinds (Cluster API conventions).
pub mod labels {
    /// The owning Cluster's name; also needed by `clusterctl move`.
    pub const CLUSTER_NAME: &str = "cluster.x-k8s.io/cluster-name";
    /// Pauses reconciliation of the object that carries it (and, on a Cluster, of its claims).
    pub const PAUSED: &str = "cluster.x-k8s.io/paused";
    /// The provider label `clusterctl` and Metal3 put on provider-owned objects.
    pub const PROVIDER: &str = "cluster.x-k8s.io/provider";
}

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a pool picks the next free address (`spec.allocationStrategy`, as Metal3 spells it).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AllocationStrategy {
    /// The first free address in pool order: upstream's behaviour.
    #[default]
    Sequential,
    /// Uniform over the free addresses.
    Random,
}
