//! Cluster API kinds bitpool reads or writes but does not own in a CAPI deployment:
//! IPAddressClaim and IPAddress (`ipam.cluster.x-k8s.io/v1beta2`, the contract's storage version),
//! and the parts of Cluster and Machine (`cluster.x-k8s.io/v1beta2`) that bitpool reads.
//!
//! For standalone use without CAPI core, `bitpool crds --standalone` generates IPAddressClaim and
//! IPAddress CRDs from these types; a CAPI installation already has them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "ipam.cluster.x-k8s.io";
/// The IPAM contract's condition type on a claim.
pub const READY_CONDITION: &str = "Ready";

/// The reasons the contract allows on a claim's `Ready=False` condition.
pub mod reasons {
    pub const POOL_NOT_READY: &str = "PoolNotReady";
    pub const POOL_EXHAUSTED: &str = "PoolExhausted";
    pub const ALLOCATION_FAILED: &str = "AllocationFailed";
}

/// A typed reference to a pool, as the v1beta2 contract spells it (all three fields required).
#[derive(
    Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct IPPoolReference {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[schemars(length(min = 1, max = 63))]
    pub kind: String,
    #[serde(rename = "apiGroup")]
    #[schemars(length(min = 1, max = 253))]
    pub api_group: String,
}

/// A reference by name to an object in the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct LocalObjectName {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// IPAddressClaim: a request for one address from the pool in `spec.poolRef`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "ipam.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "IPAddressClaim",
    doc = "A request for one IP address from the pool named in spec.poolRef.",
    namespaced,
    status = "IPAddressClaimStatus",
    category = "cluster-api",
    printcolumn = r#"{"name":"Pool Name","type":"string","jsonPath":".spec.poolRef.name","description":"Name of the pool to allocate an address from"}"#,
    printcolumn = r#"{"name":"Pool Kind","type":"string","jsonPath":".spec.poolRef.kind","description":"Kind of the pool to allocate an address from"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp","description":"Time duration since creation of IPAddressClaim"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressClaimSpec {
    /// The Cluster this claim belongs to; pausing that Cluster pauses the claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub cluster_name: Option<String>,
    pub pool_ref: IPPoolReference,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressClaimStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::schema::conditions")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_ref: Option<LocalObjectName>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecated: Option<IPAddressClaimDeprecatedStatus>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct IPAddressClaimDeprecatedStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v1beta1: Option<IPAddressClaimV1Beta1Status>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct IPAddressClaimV1Beta1Status {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<V1Beta1Condition>,
}

/// The Cluster API v1beta1 condition shape, kept by v1beta2 objects under `status.deprecated`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct V1Beta1Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub severity: Option<String>,
    pub last_transition_time: Time,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// IPAddress: one allocated address, named and namespaced like its claim.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "ipam.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "IPAddress",
    doc = "One IP address allocated to an IPAddressClaim of the same name.",
    namespaced,
    category = "cluster-api",
    printcolumn = r#"{"name":"Address","type":"string","jsonPath":".spec.address","description":"Address"}"#,
    printcolumn = r#"{"name":"Pool Name","type":"string","jsonPath":".spec.poolRef.name","description":"Name of the pool the address is from"}"#,
    printcolumn = r#"{"name":"Pool Kind","type":"string","jsonPath":".spec.poolRef.kind","description":"Kind of the pool the address is from"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp","description":"Time duration since creation of IPAddress"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressSpec {
    pub claim_ref: LocalObjectName,
    pub pool_ref: IPPoolReference,
    #[schemars(length(min = 1, max = 39))]
    pub address: String,
    #[schemars(range(min = 0, max = 128))]
    pub prefix: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 39))]
    pub gateway: Option<String>,
}

/// The part of a CAPI Cluster that bitpool reads: whether it is paused.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Cluster",
    namespaced,
    schema = "disabled"
)]
pub struct ClusterSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
}

/// The part of a CAPI Machine that bitpool reads; its labels and annotations feed metaData.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Machine",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    #[serde(default)]
    pub cluster_name: String,
}
