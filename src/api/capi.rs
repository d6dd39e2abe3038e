//! Cluster API kinds bitpool reads or writes but does not own in a CAPI deployment:
//! IPAddressClaim and IPAddress (`ipam.cluster.x-k8s.io`), and the parts of Cluster and Machine
//! (`cluster.x-k8s.io`) that bitpool reads.
//!
//! They are spoken at the version the installed Cluster API serves: v1beta2 (CAPI 1.11 and later)
//! or v1beta1 (CAPI 1.9 and 1.10), chosen once at start-up ([`select_contract_version`]). The two
//! differ in the shape of claim conditions ([`claim_status_patch`] writes each) and in v1beta1's
//! optional `poolRef.apiGroup`; the fields bitpool uses are the same.
//!
//! For standalone use without CAPI core, `bitpool crds --standalone` generates IPAddressClaim and
//! IPAddress CRDs (v1beta2) from these types; a CAPI installation already has them.

use std::borrow::Cow;
use std::sync::OnceLock;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use schemars::JsonSchema;
use serde::ser::SerializeStruct;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Value, json};

/// The Cluster API version of IPAddressClaim, IPAddress, Cluster and Machine this process uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ContractVersion {
    /// Cluster API 1.9 and 1.10.
    V1Beta1,
    /// Cluster API 1.11 and later.
    #[default]
    V1Beta2,
}

impl ContractVersion {
    /// The version as it appears in `apiVersion`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1Beta1 => "v1beta1",
            Self::V1Beta2 => "v1beta2",
        }
    }
}

/// Set once, before any of these kinds is read: the version is a property of the installed
/// Cluster API, fixed for the life of the process (an upgrade of CAPI keeps v1beta1 served).
static CONTRACT: OnceLock<ContractVersion> = OnceLock::new();

/// The version in use: the one selected at start-up, v1beta2 until then.
pub fn contract_version() -> ContractVersion {
    CONTRACT.get().copied().unwrap_or_default()
}

/// Fixes the version for this process; the version already fixed if there is one.
pub fn select_contract_version(version: ContractVersion) -> Result<(), ContractVersion> {
    CONTRACT.set(version).map_err(|_| contract_version())
}

/// The API group of IPAddressClaim, IPAddress and the CAPI pools.
pub const GROUP: &str = "ipam.cluster.x-k8s.io";
/// The API group of Cluster and Machine.
pub const CLUSTER_GROUP: &str = "cluster.x-k8s.io";
/// On a Cluster or a Metal3Cluster: the pool its control-plane endpoint comes from, as
/// `<kind>/<name>` (`InClusterIPPool/vips`, `GlobalInClusterIPPool/vips`, `IPPool/vips`).
pub const ENDPOINT_POOL_ANNOTATION: &str = "ipam.bitpool.dev/control-plane-endpoint-pool";
/// On the claims bitpool makes for an endpoint (`kubectl get ipaddressclaims -l …` lists them).
pub const ENDPOINT_CLAIM_LABEL: &str = "ipam.bitpool.dev/control-plane-endpoint";
/// The IPAM contract's condition type on a claim.
pub const READY_CONDITION: &str = "Ready";

/// The reasons the contract allows on a claim's `Ready=False` condition.
pub mod reasons {
    /// The pool cannot serve the claim now: its spec is invalid, it is paused, or it is busy.
    pub const POOL_NOT_READY: &str = "PoolNotReady";
    /// The pool has no free address left.
    pub const POOL_EXHAUSTED: &str = "PoolExhausted";
    /// The allocation failed for a reason a person must fix (the message says which).
    pub const ALLOCATION_FAILED: &str = "AllocationFailed";
    /// bitpool's: a global pool's `namespaceSelector` leaves the claim's namespace out.
    pub const NAMESPACE_NOT_SELECTED: &str = "NamespaceNotSelected";
}

// Read from v1beta1 too, where `apiGroup` is optional (missing reads as empty: no group).
/// A typed reference to a pool, as the v1beta2 contract spells it (all three fields required).
#[derive(Serialize, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
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

/// What an IPAddressClaim asks for.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressClaimSpec {
    /// The Cluster this claim belongs to; pausing that Cluster pauses the claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub cluster_name: Option<String>,
    pub pool_ref: IPPoolReference,
}

// A claim's status as bitpool works with it: the v1beta2 shape. Read from either version (see
// its `Deserialize`); written by `claim_status_patch`.
/// What became of an IPAddressClaim: the address allocated to it, and its conditions.
#[derive(Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
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

/// Status fields of older Cluster API versions, kept for their readers.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct IPAddressClaimDeprecatedStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v1beta1: Option<IPAddressClaimV1Beta1Status>,
}

/// The claim's conditions in the Cluster API v1beta1 shape.
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

/// One allocated address.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
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

/// The part of a CAPI Cluster that bitpool reads: whether it is paused, and its control-plane
/// endpoint (filled from a pool when the Cluster names one: [`crate::endpoint`]).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
    /// Its infrastructure cluster (a Metal3Cluster takes its endpoint from its Cluster's pool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_ref: Option<InfrastructureReference>,
}

/// The kind and name of a Cluster's infrastructure cluster (both versions have these two).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct InfrastructureReference {
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
}

/// Where a cluster's API server listens (the same shape in v1beta1 and v1beta2).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ApiEndpoint {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
}

/// The part of a CAPI Machine that bitpool reads; its labels and annotations feed metaData.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    #[serde(default)]
    pub cluster_name: String,
}

/// A namespaced Cluster API kind at the [`contract_version`] of this process.
macro_rules! contract_kind {
    ($(#[$doc:meta])* $kind:ident, $group:expr, $plural:literal, $spec:ty $(, status: $status:ty)?) => {
        $(#[$doc])*
        ///
        /// Read and written at the [`contract_version`] of this process.
        #[derive(Deserialize, Clone, Debug, Default, PartialEq)]
        pub struct $kind {
            #[serde(default)]
            pub metadata: ObjectMeta,
            pub spec: $spec,
            $(#[serde(default)]
            pub status: Option<$status>,)?
        }

        impl $kind {
            /// An object named `name` with `spec`, everything else unset.
            pub fn new(name: &str, spec: $spec) -> Self {
                let mut object = Self { spec, ..Default::default() };
                object.metadata.name = Some(name.to_string());
                object
            }
        }

        impl kube::Resource for $kind {
            type DynamicType = ();
            type Scope = k8s_openapi::NamespaceResourceScope;
            fn kind(_: &()) -> Cow<'_, str> {
                stringify!($kind).into()
            }
            fn group(_: &()) -> Cow<'_, str> {
                $group.into()
            }
            fn version(_: &()) -> Cow<'_, str> {
                contract_version().as_str().into()
            }
            fn plural(_: &()) -> Cow<'_, str> {
                $plural.into()
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }

        impl Serialize for $kind {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut object = serializer.serialize_struct(stringify!($kind), 5)?;
                let api_version = <Self as kube::Resource>::api_version(&());
                object.serialize_field("apiVersion", &api_version)?;
                object.serialize_field("kind", stringify!($kind))?;
                object.serialize_field("metadata", &self.metadata)?;
                object.serialize_field("spec", &self.spec)?;
                $(if let Some(status) = &self.status {
                    let status: &$status = status;
                    object.serialize_field("status", status)?;
                })?
                object.end()
            }
        }
    };
}

contract_kind!(
    /// IPAddressClaim: a request for one address from the pool in `spec.poolRef`.
    IPAddressClaim, GROUP, "ipaddressclaims", IPAddressClaimSpec, status: IPAddressClaimStatus
);
contract_kind!(
    /// IPAddress: one allocated address, named and namespaced like its claim.
    IPAddress, GROUP, "ipaddresses", IPAddressSpec
);
contract_kind!(
    /// The part of a CAPI Cluster that bitpool reads.
    Cluster, CLUSTER_GROUP, "clusters", ClusterSpec
);
contract_kind!(
    /// The part of a CAPI Machine that bitpool reads.
    Machine, CLUSTER_GROUP, "machines", MachineSpec
);

/// The CRDs of IPAddressClaim and IPAddress at v1beta2, for running without Cluster API core.
pub mod schema {
    use kube::CustomResource;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    use super::IPAddressClaimStatus;

    #[derive(
        CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema,
    )]
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
    /// IPAddressClaim: a request for one address from the pool in `spec.poolRef`.
    pub struct IPAddressClaimSpec {
        #[serde(flatten)]
        pub spec: super::IPAddressClaimSpec,
    }

    #[derive(
        CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema,
    )]
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
    /// IPAddress: one allocated address, named and namespaced like its claim.
    pub struct IPAddressSpec {
        #[serde(flatten)]
        pub spec: super::IPAddressSpec,
    }

    /// The schemas of v1beta1 and v1alpha1 (Cluster API before 1.11): references with optional
    /// fields, v1beta1 conditions, the metav1 ones under `status.v1beta2`. The CRDs serve them
    /// so that installations that stored them can take bitpool's CRDs.
    pub mod older {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
        use kube::CustomResource;
        use schemars::JsonSchema;
        use serde::{Deserialize, Serialize};

        use super::super::V1Beta1Condition;

        /// A reference to a pool by kind and name, with an optional API group.
        #[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
        #[serde(rename_all = "camelCase")]
        pub struct TypedLocalReference {
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub api_group: Option<String>,
            pub kind: String,
            pub name: String,
        }

        /// A reference by name to an object in the same namespace.
        #[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
        pub struct LocalReference {
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub name: Option<String>,
        }

        #[derive(
            CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema,
        )]
        #[kube(
            group = "ipam.cluster.x-k8s.io",
            version = "v1beta1",
            kind = "IPAddressClaim",
            namespaced,
            status = "ClaimStatus"
        )]
        #[serde(rename_all = "camelCase")]
        /// What an IPAddressClaim asks for.
        pub struct ClaimSpec {
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub cluster_name: Option<String>,
            pub pool_ref: TypedLocalReference,
        }

        /// What became of an IPAddressClaim: the address allocated to it, and its conditions.
        #[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
        #[serde(rename_all = "camelCase")]
        pub struct ClaimStatus {
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub address_ref: Option<LocalReference>,
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            pub conditions: Vec<V1Beta1Condition>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub v1beta2: Option<ClaimV1Beta2Status>,
        }

        /// The claim's conditions in the metav1 shape.
        #[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
        pub struct ClaimV1Beta2Status {
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            #[schemars(schema_with = "crate::api::schema::conditions")]
            pub conditions: Vec<Condition>,
        }

        #[derive(
            CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema,
        )]
        #[kube(
            group = "ipam.cluster.x-k8s.io",
            version = "v1beta1",
            kind = "IPAddress",
            namespaced
        )]
        #[serde(rename_all = "camelCase")]
        /// One allocated address.
        pub struct AddressSpec {
            pub claim_ref: LocalReference,
            pub pool_ref: TypedLocalReference,
            pub address: String,
            pub prefix: i32,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub gateway: Option<String>,
        }
    }
}

impl<'de> Deserialize<'de> for IPPoolReference {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            name: String,
            kind: String,
            #[serde(rename = "apiGroup", default)]
            api_group: Option<String>,
        }
        let wire = Wire::deserialize(deserializer)?;
        Ok(Self {
            name: wire.name,
            kind: wire.kind,
            api_group: wire.api_group.unwrap_or_default(),
        })
    }
}

impl<'de> Deserialize<'de> for IPAddressClaimStatus {
    /// Either version's status: v1beta2 keeps metav1 conditions in `conditions`; v1beta1 keeps
    /// them in `v1beta2.conditions` and its own shape (reason and message optional, a severity)
    /// in `conditions`, which is read when nothing else is there.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Wire {
            #[serde(default)]
            conditions: Vec<WireCondition>,
            #[serde(default)]
            address_ref: Option<LocalObjectName>,
            #[serde(default)]
            deprecated: Option<IPAddressClaimDeprecatedStatus>,
            #[serde(default)]
            v1beta2: Option<WireConditions>,
        }
        #[derive(Deserialize)]
        struct WireConditions {
            #[serde(default)]
            conditions: Vec<WireCondition>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct WireCondition {
            #[serde(rename = "type")]
            type_: String,
            status: String,
            #[serde(default)]
            reason: Option<String>,
            #[serde(default)]
            message: Option<String>,
            last_transition_time: Time,
            #[serde(default)]
            observed_generation: Option<i64>,
        }
        let wire = Wire::deserialize(deserializer)?;
        let conditions = match wire.v1beta2 {
            Some(v1beta2) if !v1beta2.conditions.is_empty() => v1beta2.conditions,
            _ => wire.conditions,
        };
        Ok(Self {
            conditions: conditions
                .into_iter()
                .map(|c| Condition {
                    type_: c.type_,
                    status: c.status,
                    reason: c.reason.unwrap_or_default(),
                    message: c.message.unwrap_or_default(),
                    last_transition_time: c.last_transition_time,
                    observed_generation: c.observed_generation,
                })
                .collect(),
            address_ref: wire.address_ref,
            deprecated: wire.deprecated,
        })
    }
}

/// The status patch that sets a claim's `addressRef` and conditions, in the shape of the
/// [`contract_version`]: at v1beta1 the conditions go to `v1beta2.conditions` as they are and to
/// `conditions` in Cluster API's v1beta1 shape (with a severity when not True).
pub fn claim_status_patch(
    address_ref: Option<&LocalObjectName>,
    conditions: &[Condition],
) -> Value {
    let mut status = json!({ "conditions": conditions });
    if let Some(address_ref) = address_ref {
        status["addressRef"] = json!(address_ref);
    }
    if contract_version() == ContractVersion::V1Beta1 {
        status["v1beta2"] = json!({ "conditions": conditions });
        status["conditions"] = conditions.iter().map(v1beta1_condition).collect();
    }
    json!({ "status": status })
}

fn v1beta1_condition(condition: &Condition) -> Value {
    let mut out = json!({
        "type": condition.type_,
        "status": condition.status,
        "lastTransitionTime": condition.last_transition_time,
    });
    if condition.status != "True" {
        // Cluster API's severities: Error where a person must act, Warning where waiting helps.
        let severity = if condition.reason == reasons::ALLOCATION_FAILED {
            "Error"
        } else {
            "Warning"
        };
        out["severity"] = severity.into();
    }
    if !condition.reason.is_empty() {
        out["reason"] = condition.reason.clone().into();
    }
    if !condition.message.is_empty() {
        out["message"] = condition.message.clone().into();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_of_either_version_are_read() {
        let v1beta1: IPAddressClaim = serde_json::from_value(json!({
            "apiVersion": "ipam.cluster.x-k8s.io/v1beta1", "kind": "IPAddressClaim",
            "metadata": {"name": "c"},
            "spec": {"poolRef": {"kind": "InClusterIPPool", "name": "p"}},
            "status": {"addressRef": {"name": "c"}, "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"}
            ]}
        }))
        .expect("v1beta1 claim without apiGroup or reason");
        assert_eq!(v1beta1.spec.pool_ref.api_group, "");
        let status = v1beta1.status.expect("status");
        assert_eq!(
            (
                status.conditions[0].status.as_str(),
                status.conditions[0].reason.as_str()
            ),
            ("True", "")
        );
        let with_both: IPAddressClaimStatus = serde_json::from_value(json!({
            "conditions": [{"type": "Ready", "status": "False", "severity": "Warning", "lastTransitionTime": "2026-12-01T00:00:00Z"}],
            "v1beta2": {"conditions": [{"type": "Ready", "status": "False", "reason": "PoolExhausted", "message": "m", "lastTransitionTime": "2026-12-01T00:00:00Z", "observedGeneration": 2}]}
        }))
        .expect("status");
        assert_eq!(
            with_both.conditions[0].reason, "PoolExhausted",
            "the metav1 copy wins"
        );
    }

    #[test]
    fn v1beta1_conditions_carry_a_severity_and_no_empty_reason() {
        let time: Time = serde_json::from_value(json!("2026-12-01T00:00:00Z")).expect("time");
        let failed = Condition {
            type_: READY_CONDITION.into(),
            status: "False".into(),
            reason: reasons::ALLOCATION_FAILED.into(),
            message: "bad".into(),
            last_transition_time: time.clone(),
            observed_generation: Some(1),
        };
        let shaped = v1beta1_condition(&failed);
        assert_eq!(
            (shaped["severity"].as_str(), shaped["reason"].as_str()),
            (Some("Error"), Some("AllocationFailed"))
        );
        assert!(shaped.get("observedGeneration").is_none());
        let ready = Condition {
            status: "True".into(),
            reason: String::new(),
            ..failed
        };
        let shaped = v1beta1_condition(&ready);
        assert!(
            shaped.get("severity").is_none() && shaped.get("reason").is_none(),
            "{shaped}"
        );
    }
}
