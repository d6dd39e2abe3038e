//! Rust types for every Kubernetes kind bitpool serves or reads.
//!
//! Group, version, kind, scope and JSON field names follow upstream exactly, so that an existing
//! installation can switch to bitpool in place. Addresses stay `String` here: a malformed value must
//! reach the reconciler (which reports it on a condition) instead of breaking deserialization.

pub mod capi;
pub mod capi_pools;
pub mod clusterctl;
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
    /// The value of [`PAUSED`] that pauses every controller but bitpool: how Metal3DataTemplates
    /// (and the Metal3Data bitpool makes from them) are handed to bitpool while CAPM3, which
    /// cannot turn its own Metal3Data controllers off, runs beside it.
    pub const HANDED_TO_BITPOOL: &str = "bitpool";
    /// The provider label `clusterctl` and Metal3 put on provider-owned objects.
    pub const PROVIDER: &str = "cluster.x-k8s.io/provider";
    /// The CAPI label that limits a controller to objects labelled with its `--watch-filter` value.
    pub const WATCH_FILTER: &str = "cluster.x-k8s.io/watch-filter";
    /// The recommended label naming the tool that manages an object.
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
}

/// The field manager of bitpool's server-side applies, as `managedFields` name it.
pub const FIELD_MANAGER: &str = "bitpool";

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

/// Reads an optional field written as its zero value — `""`, or an object of such (CAPM3's
/// conversion from its v1beta2 storage writes unset references as `fromPoolRef: {kind: "",
/// name: ""}` and unset strings as `""`) — as unset, as CAPM3's own `!= ""` checks do.
pub(crate) fn unset_if_zero<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    fn is_zero(value: &serde_json::Value) -> bool {
        match value {
            serde_json::Value::Null => true,
            serde_json::Value::String(s) => s.is_empty(),
            serde_json::Value::Object(fields) => fields.values().all(is_zero),
            _ => false,
        }
    }
    match Option::<serde_json::Value>::deserialize(deserializer)? {
        Some(value) if !is_zero(&value) => serde_json::from_value(value)
            .map(Some)
            .map_err(serde::de::Error::custom),
        _ => Ok(None),
    }
}

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

impl AllocationStrategy {
    /// The allocation core's strategy for a spec's optional choice (unset: sequential).
    pub fn for_core(choice: Option<Self>) -> crate::alloc::Strategy {
        match choice {
            Some(AllocationStrategy::Random) => crate::alloc::Strategy::Random,
            Some(AllocationStrategy::Sequential) | None => crate::alloc::Strategy::Sequential,
        }
    }
}
