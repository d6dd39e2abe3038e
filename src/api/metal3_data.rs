//! CAPM3's Metal3DataTemplate, Metal3Data and Metal3DataClaim at
//! `infrastructure.cluster.x-k8s.io/v1beta2` (what CAPM3 1.13 and later store, and bitpool's
//! storage version), with pool references by `apiGroup`/`kind`. v1beta1 is served too, through
//! [`crate::webhook::convert::metal3data`]; its schema is derived from these types
//! ([`crate::crds`]).

use k8s_openapi::api::core::v1::SecretReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of the Metal3Data kinds (and of CAPM3's other kinds).
pub const GROUP: &str = "infrastructure.cluster.x-k8s.io";

/// On a Metal3DataTemplate: held while any Metal3Data is rendered from it.
pub const TEMPLATE_FINALIZER: &str = "metal3datatemplate.infrastructure.cluster.x-k8s.io";
/// On a Metal3Data, and on the IP claims it creates.
pub const DATA_FINALIZER: &str = "metal3data.infrastructure.cluster.x-k8s.io";
/// On a Metal3DataClaim: held until its Metal3Data is released.
pub const DATA_CLAIM_FINALIZER: &str = "metal3dataclaim.infrastructure.cluster.x-k8s.io";
/// Put on a Metal3DataClaim by the Metal3Machine that created it.
pub const METAL3_MACHINE_FINALIZER: &str = "metal3machine.infrastructure.cluster.x-k8s.io";
/// On the IP claims of a Metal3Data: the Metal3Data's name.
pub const DATA_NAME_LABEL: &str = "infrastructure.cluster.x-k8s.io/data-name";
/// On the IP claims of a Metal3Data: the name of the pool they take from.
pub const POOL_NAME_LABEL: &str = "infrastructure.cluster.x-k8s.io/pool-name";
/// The type of the rendered metaData and networkData secrets.
pub const SECRET_TYPE: &str = "infrastructure.cluster.x-k8s.io/secret";
/// On a Metal3Data kind's object: what one version could not hold, kept by the conversion
/// webhook as `{"version": <apiVersion it is restored to>, "fields": {<JSON pointer>: <value>}}`.
pub const CONVERSION_DATA_ANNOTATION: &str = "ipam.bitpool.dev/conversion-data";

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Metal3DataTemplate",
    doc = "How to render the metaData and networkData of each host of a cluster.",
    namespaced,
    status = "Metal3DataTemplateStatus",
    category = "cluster-api",
    shortname = "m3dt",
    shortname = "m3datatemplate",
    shortname = "m3datatemplates",
    shortname = "metal3dt",
    shortname = "metal3datatemplate",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".metadata.labels.cluster\\.x-k8s\\.io/cluster-name","description":"Cluster to which this template belongs"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp","description":"Time duration since creation of Metal3DataTemplate"}"#
)]
#[serde(rename_all = "camelCase")]
/// Metal3DataTemplate: how to render each host's metaData and networkData.
pub struct Metal3DataTemplateSpec {
    /// The Cluster the template belongs to; empty for a template shared by several clusters
    /// (CAPM3 1.14).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta_data: Option<MetaData>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_data: Option<NetworkData>,
}

/// What a Metal3DataTemplate holds: the index given to each claim.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Metal3DataTemplateStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_updated: Option<Time>,
    /// The index of each claim's Metal3Data.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub indexes: Vec<IndexEntry>,
}

/// The index given to one Metal3DataClaim.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct IndexEntry {
    /// The Metal3DataClaim.
    pub name: String,
    pub index: i64,
}

/// The objects a metaData or MAC source can read from.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TemplateObject {
    Machine,
    Metal3Machine,
    BareMetalHost,
}

/// The metaData keys to render, by where each value comes from.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetaData {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub strings: Vec<MetaDataString>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub object_names: Vec<MetaDataObjectName>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub indexes: Vec<MetaDataIndex>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<MetaDataNamespace>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_addresses_from_pool: Vec<FromPool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefixes_from_pool: Vec<FromPool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateways_from_pool: Vec<FromPool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns_servers_from_pool: Vec<FromPool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from_host_interfaces: Vec<MetaDataHostInterface>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from_labels: Vec<MetaDataFromLabel>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from_annotations: Vec<MetaDataFromAnnotation>,
}

/// A metaData key with a fixed value.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct MetaDataString {
    pub key: String,
    pub value: String,
}

/// A metaData key set to the name of one of the objects.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct MetaDataObjectName {
    pub key: String,
    pub object: TemplateObject,
}

/// Rendered as `prefix + (offset + index * step) + suffix`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct MetaDataIndex {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 1))]
    pub step: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suffix: Option<String>,
}

/// A metaData key set to the Metal3Machine's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct MetaDataNamespace {
    pub key: String,
}

/// A metaData value taken from a pool. Empty `apiGroup`/`kind` mean a Metal3 IPPool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FromPool {
    pub key: String,
    pub name: String,
    #[serde(default)]
    pub api_group: String,
    #[serde(default)]
    pub kind: String,
}

/// A metaData key set to the MAC address of a host interface, or of the boot interface.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetaDataHostInterface {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    #[serde(
        rename = "fromBootMAC",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub from_boot_mac: Option<bool>,
}

/// A metaData key set to the value of a label of one of the objects.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct MetaDataFromLabel {
    pub key: String,
    pub object: TemplateObject,
    pub label: String,
}

/// A metaData key set to the value of an annotation of one of the objects.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct MetaDataFromAnnotation {
    pub key: String,
    pub object: TemplateObject,
    pub annotation: String,
}

/// The networkData to render: links, networks and DNS services.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct NetworkData {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub links: Option<NetworkLinks>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub networks: Option<Networks>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<NetworkServices<AnyFamily>>,
}

/// The network links: ethernets, bonds and VLANs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct NetworkLinks {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ethernets: Vec<EthernetLink>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bonds: Vec<BondLink>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vlans: Vec<VlanLink>,
}

/// The type of an ethernet link.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EthernetType {
    Bridge,
    Dvs,
    #[serde(rename = "hw_veb")]
    HwVeb,
    Hyperv,
    Ovs,
    Tap,
    Vhostuser,
    Vif,
    Phy,
}

/// Where a link's MAC address comes from; exactly one field is expected.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MacAddressSource {
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::unset_if_zero"
    )]
    pub string: Option<String>,
    /// A NIC name in the BareMetalHost's `status.hardware.nics`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::unset_if_zero"
    )]
    pub from_host_interface: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::unset_if_zero"
    )]
    pub from_annotation: Option<FromAnnotation>,
}

/// A value read from an annotation of one of the objects.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct FromAnnotation {
    pub object: TemplateObject,
    pub annotation: String,
}

/// An ethernet link.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EthernetLink {
    #[serde(rename = "type")]
    pub type_: EthernetType,
    pub id: String,
    #[serde(default = "default_mtu")]
    #[schemars(range(max = 9000), extend("default" = 1500))]
    pub mtu: i32,
    pub mac_address: MacAddressSource,
    /// Interface name to set (cloud-init rename).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 15), pattern(r"^[a-zA-Z][a-zA-Z0-9._-]*$"))]
    pub name: Option<String>,
}

fn default_mtu() -> i32 {
    1500
}

/// The bonding mode of a bond link.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum BondMode {
    #[serde(rename = "balance-rr")]
    BalanceRr,
    #[serde(rename = "active-backup")]
    ActiveBackup,
    #[serde(rename = "balance-xor")]
    BalanceXor,
    #[serde(rename = "broadcast")]
    Broadcast,
    #[serde(rename = "balance-tlb")]
    BalanceTlb,
    #[serde(rename = "balance-alb")]
    BalanceAlb,
    #[serde(rename = "802.3ad")]
    Ieee8023ad,
}

/// The transmit hash policy of a bond link.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum BondXmitHashPolicy {
    #[serde(rename = "layer2")]
    Layer2,
    #[serde(rename = "layer3+4")]
    Layer3Plus4,
    #[serde(rename = "layer2+3")]
    Layer2Plus3,
}

/// A bond link over other links.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BondLink {
    pub bond_mode: BondMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::schema::optional_enum::<BondXmitHashPolicy>")]
    pub bond_xmit_hash_policy: Option<BondXmitHashPolicy>,
    pub id: String,
    #[serde(default = "default_mtu")]
    #[schemars(range(max = 9000), extend("default" = 1500))]
    pub mtu: i32,
    pub mac_address: MacAddressSource,
    /// Extra `bond_<name>` keys of the rendered link, kept as written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parameters: Vec<BondParameter>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bond_links: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 15), pattern(r"^[a-zA-Z][a-zA-Z0-9._-]*$"))]
    pub name: Option<String>,
}

/// One `bond_<name>: <value>` of a rendered bond.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct BondParameter {
    pub name: String,
    #[serde(default)]
    #[schemars(schema_with = "super::schema::preserve_unknown")]
    pub value: serde_json::Value,
}

/// A VLAN link over another link.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VlanLink {
    #[serde(rename = "vlanID")]
    #[schemars(range(max = 4096))]
    pub vlan_id: i32,
    pub id: String,
    #[serde(default = "default_mtu")]
    #[schemars(range(max = 9000), extend("default" = 1500))]
    pub mtu: i32,
    pub mac_address: MacAddressSource,
    pub vlan_link: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 15), pattern(r"^[a-zA-Z][a-zA-Z0-9._-]*$"))]
    pub name: Option<String>,
}

/// The networks: static by family, and DHCP or SLAAC.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct Networks {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ipv4: Vec<StaticNetwork<Ipv4>>,
    #[serde(rename = "ipv4DHCP", default, skip_serializing_if = "Vec::is_empty")]
    pub ipv4_dhcp: Vec<DynamicNetwork<Ipv4>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ipv6: Vec<StaticNetwork<Ipv6>>,
    #[serde(rename = "ipv6DHCP", default, skip_serializing_if = "Vec::is_empty")]
    pub ipv6_dhcp: Vec<DynamicNetwork<Ipv6>>,
    #[serde(rename = "ipv6SLAAC", default, skip_serializing_if = "Vec::is_empty")]
    pub ipv6_slaac: Vec<DynamicNetwork<Ipv6>>,
}

/// The address family a network, route or DNS list belongs to: it sets the address pattern and
/// the largest prefix length the CRD accepts, as upstream's separate v4 and v6 types do.
pub trait AddressFamily:
    Clone + std::fmt::Debug + Default + PartialEq + JsonSchema + 'static
{
    fn address_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema;
    fn max_prefix() -> i32;

    fn address_list_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "array", "items": Self::address_schema(generator) })
    }

    fn prefix_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "integer", "maximum": Self::max_prefix() })
    }
}

macro_rules! address_family {
    ($(#[$doc:meta])* $name:ident, $pattern:path, $max_prefix:expr) => {
        $(#[$doc])*
        ///
        /// An [`AddressFamily`]: the schema of its addresses and its largest prefix length.
        #[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
        pub struct $name;

        impl AddressFamily for $name {
            fn address_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({ "type": "string", "pattern": $pattern() })
            }
            fn max_prefix() -> i32 {
                $max_prefix
            }
        }
    };
}

address_family!(
    /// IPv4 networks and their routes.
    Ipv4,
    super::schema::ipv4_address_pattern,
    32
);
address_family!(
    /// IPv6 networks and their routes.
    Ipv6,
    super::schema::ipv6_address_pattern,
    128
);
address_family!(
    /// The template-wide DNS services, which take either family.
    AnyFamily,
    super::schema::ip_address_pattern,
    128
);

/// A reference to a pool of any kind; empty `apiGroup` means a Metal3 IPPool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-map-type" = "atomic"))]
pub struct PoolRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_group: Option<String>,
    /// Required at v1beta1; at v1beta2 an empty kind (with an empty group) means a Metal3
    /// IPPool, as for [`FromPool`].
    #[serde(default)]
    pub kind: String,
    pub name: String,
}

/// A pool named by an annotation (`<namespace>/<name>` or a bare name) on one of the objects.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct FromPoolAnnotation {
    pub object: TemplateObject,
    pub annotation: String,
}

/// An `ipv4` or `ipv6` network with an address from a pool: by name (a Metal3 IPPool), by
/// `fromPoolRef` (any kind), or by annotation.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", bound = "")]
#[schemars(bound = "F: AddressFamily")]
pub struct StaticNetwork<F: AddressFamily> {
    pub id: String,
    pub link: String,
    #[serde(
        rename = "ipAddressFromIPPool",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::unset_if_zero"
    )]
    pub ip_address_from_ip_pool: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::unset_if_zero"
    )]
    pub from_pool_ref: Option<PoolRef>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::unset_if_zero"
    )]
    pub from_pool_annotation: Option<FromPoolAnnotation>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<NetworkRoute<F>>,
}

/// A DHCP or SLAAC network.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(bound = "")]
#[schemars(bound = "F: AddressFamily")]
pub struct DynamicNetwork<F: AddressFamily> {
    pub id: String,
    pub link: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<NetworkRoute<F>>,
}

/// A route of a network.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", bound = "")]
#[schemars(bound = "F: AddressFamily")]
pub struct NetworkRoute<F: AddressFamily> {
    #[schemars(schema_with = "F::address_schema")]
    pub network: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "F::prefix_schema")]
    pub prefix: Option<i32>,
    pub gateway: NetworkGateway<F>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<NetworkServices<F>>,
}

/// A route's gateway: static, or from a pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", bound = "")]
#[schemars(bound = "F: AddressFamily")]
pub struct NetworkGateway<F: AddressFamily> {
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::unset_if_zero"
    )]
    #[schemars(schema_with = "F::address_schema")]
    pub string: Option<String>,
    #[serde(
        rename = "fromIPPool",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::unset_if_zero"
    )]
    pub from_ip_pool: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::unset_if_zero"
    )]
    pub from_pool_ref: Option<PoolRef>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::unset_if_zero"
    )]
    pub from_pool_annotation: Option<FromPoolAnnotation>,
    #[serde(skip)]
    pub family: std::marker::PhantomData<F>,
}

/// DNS servers, static, from a Metal3 IPPool by name, or from a pool of any kind.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", bound = "")]
#[schemars(bound = "F: AddressFamily")]
pub struct NetworkServices<F: AddressFamily> {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "F::address_list_schema")]
    pub dns: Vec<String>,
    #[serde(
        rename = "dnsFromIPPool",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::unset_if_zero"
    )]
    pub dns_from_ip_pool: Option<String>,
    /// bitpool extension: the DNS servers of a pool of any kind, e.g. an InClusterIPPool's
    /// `dnsServers` (a name-only `dnsFromIPPool` always means a Metal3 IPPool).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::unset_if_zero"
    )]
    pub dns_from_pool_ref: Option<PoolRef>,
    #[serde(skip)]
    pub family: std::marker::PhantomData<F>,
}

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Metal3Data",
    doc = "The rendered metaData and networkData of one host.",
    namespaced,
    status = "Metal3DataStatus",
    category = "cluster-api",
    shortname = "m3d",
    shortname = "m3data",
    shortname = "m3datas",
    shortname = "metal3d",
    shortname = "metal3data",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp","description":"Time duration since creation of Metal3Data"}"#
)]
#[serde(rename_all = "camelCase")]
/// Metal3Data: one host's rendered data, named `<template>-<index>`.
pub struct Metal3DataSpec {
    #[serde(default)]
    pub index: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta_data: Option<SecretReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_data: Option<SecretReference>,
    #[serde(default)]
    pub claim: Metal3ObjectRef,
    #[serde(default)]
    pub template: Metal3ObjectRef,
}

/// Whether a Metal3Data is rendered, or why not.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Metal3DataStatus {
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ready: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
}

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Metal3DataClaim",
    doc = "A request by a Metal3Machine for rendered data from a Metal3DataTemplate.",
    namespaced,
    status = "Metal3DataClaimStatus",
    category = "cluster-api",
    shortname = "m3dc",
    shortname = "m3dataclaim",
    shortname = "m3dataclaims",
    shortname = "metal3dc",
    shortname = "metal3dataclaim",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp","description":"Time duration since creation of Metal3DataClaim"}"#
)]
/// Metal3DataClaim: a Metal3Machine's request for rendered data from a template.
pub struct Metal3DataClaimSpec {
    #[serde(default)]
    pub template: Metal3ObjectRef,
}

/// An object of the same namespace (v1beta2's narrowing of v1beta1's `ObjectReference`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct Metal3ObjectRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// The Metal3Data rendered for a claim, or why there is none.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Metal3DataClaimStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rendered_data: Option<Metal3ObjectRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A template network as CAPM3 1.13 serves it at v1beta1, converted from its v1beta2
    /// storage: unset references and strings come back as zero values.
    #[test]
    fn zero_values_from_capm3_conversion_read_as_unset() {
        let network: StaticNetwork<Ipv4> = serde_json::from_value(serde_json::json!({
            "id": "provisioning", "link": "enp1s0", "ipAddressFromIPPool": "provisioning",
            "fromPoolRef": {"kind": "", "name": ""},
            "routes": [{"network": "0.0.0.0", "services": {},
                        "gateway": {"fromIPPool": "provisioning", "fromPoolRef": {"kind": "", "name": ""}, "string": ""}}],
        }))
        .expect("the converted network reads");
        assert_eq!(network.from_pool_ref, None);
        assert_eq!(
            network.ip_address_from_ip_pool.as_deref(),
            Some("provisioning")
        );
        let gateway = &network.routes[0].gateway;
        assert_eq!((&gateway.from_pool_ref, &gateway.string), (&None, &None));
        assert_eq!(gateway.from_ip_pool.as_deref(), Some("provisioning"));

        let mac: MacAddressSource = serde_json::from_value(
            serde_json::json!({"fromHostInterface": "enp1s0", "string": ""}),
        )
        .expect("the converted MAC source reads");
        assert_eq!(
            (mac.string, mac.from_host_interface.as_deref()),
            (None, Some("enp1s0"))
        );

        // A reference that is set but incomplete is still read, and reported where it is used.
        let partial: StaticNetwork<Ipv4> = serde_json::from_value(serde_json::json!({
            "id": "n", "link": "l", "fromPoolRef": {"kind": "InClusterIPPool", "name": ""},
        }))
        .expect("reads");
        assert_eq!(
            partial.from_pool_ref.map(|r| r.kind).as_deref(),
            Some("InClusterIPPool")
        );
    }
}
