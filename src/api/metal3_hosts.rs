//! The parts of Metal3Machine (CAPM3) and BareMetalHost (baremetal-operator) that the Metal3Data
//! reconciler reads. bitpool does not own these kinds; unknown fields are ignored when reading.

use k8s_openapi::api::core::v1::{ObjectReference, SecretReference};
use kube::CustomResource;
use kube::api::{ApiResource, GroupVersionKind, Object};
use serde::{Deserialize, Serialize};

/// Annotation on a Metal3Machine naming its BareMetalHost as `<namespace>/<name>`.
pub const BARE_METAL_HOST_ANNOTATION: &str = "metal3.io/BareMetalHost";

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta1",
    kind = "Metal3Machine",
    namespaced,
    status = "Metal3MachineStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
/// The part of a Metal3Machine's spec that the Metal3Data reconciler reads.
pub struct Metal3MachineSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_template: Option<ObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta_data: Option<SecretReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_data: Option<SecretReference>,
    #[serde(
        rename = "providerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
}

/// A Metal3Machine read at the version the API server serves (the fields read here are the same
/// at v1beta1 and v1beta2).
pub type AnyMetal3Machine = Object<Metal3MachineSpec, Metal3MachineStatus>;

/// Metal3Machine at `version`.
pub fn metal3_machine_resource(version: &str) -> ApiResource {
    let gvk = GroupVersionKind::gvk(crate::api::metal3_data::GROUP, version, "Metal3Machine");
    ApiResource::from_gvk_with_plural(&gvk, "metal3machines")
}

impl From<AnyMetal3Machine> for Metal3Machine {
    fn from(object: AnyMetal3Machine) -> Self {
        Metal3Machine {
            metadata: object.metadata,
            spec: object.spec,
            status: object.status,
        }
    }
}

/// The part of a Metal3Machine's status that the Metal3Data reconciler reads and writes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Metal3MachineStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rendered_data: Option<ObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta_data: Option<SecretReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_data: Option<SecretReference>,
}

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "metal3.io",
    version = "v1alpha1",
    kind = "BareMetalHost",
    namespaced,
    status = "BareMetalHostStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
/// The part of a BareMetalHost's spec that the Metal3Data reconciler reads.
pub struct BareMetalHostSpec {
    #[serde(
        rename = "bootMACAddress",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub boot_mac_address: Option<String>,
}

/// The part of a BareMetalHost's status that the Metal3Data reconciler reads.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct BareMetalHostStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware: Option<HardwareDetails>,
}

/// The hardware the host's inspection found.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct HardwareDetails {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<Nic>,
}

/// One network interface of a host: its name and MAC address.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Nic {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub mac: String,
}
