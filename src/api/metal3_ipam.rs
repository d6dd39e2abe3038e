//! Metal3 IPAM kinds, `ipam.metal3.io/v1alpha1`: IPPool, IPClaim and IPAddress, as
//! metal3-io/ip-address-manager defines them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::AllocationStrategy;

/// The API group of Metal3's IPPool, IPClaim and IPAddress.
pub const GROUP: &str = "ipam.metal3.io";
/// The kind of Metal3's address pool.
pub const POOL_KIND: &str = "IPPool";

/// On an IPPool: held while any address is allocated from it.
pub const POOL_FINALIZER: &str = "ippool.ipam.metal3.io";
/// On an IPClaim: held until its address is released.
pub const CLAIM_FINALIZER: &str = "ipclaim.ipam.metal3.io";
/// On a Metal3 IPAddress: held until its claim releases it.
pub const ADDRESS_FINALIZER: &str = "ipaddress.ipam.metal3.io";
/// On a CAPI IPAddressClaim served by a Metal3 pool.
pub const CAPI_CLAIM_FINALIZER: &str = "ipam.metal3.io/ipaddressclaim";
/// On a CAPI IPAddress allocated from a Metal3 pool.
pub const CAPI_ADDRESS_FINALIZER: &str = "ipam.metal3.io/ipaddress";
/// Claim annotation requesting one specific address (Metal3 and CAPI claims alike).
pub const REQUESTED_ADDRESS_ANNOTATION: &str = "ipAddress";
/// The provider label value Metal3 puts on pools that name a Cluster.
pub const PROVIDER_LABEL_VALUE: &str = "ipam-metal3";

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "ipam.metal3.io",
    version = "v1alpha1",
    kind = "IPPool",
    doc = "Metal3 IP address ranges handed out to IPClaims and IPAddressClaims.",
    namespaced,
    status = "IPPoolStatus",
    category = "cluster-api",
    shortname = "ipp",
    shortname = "ippool",
    shortname = "m3ipp",
    shortname = "m3ippool",
    shortname = "m3ippools",
    shortname = "metal3ipp",
    shortname = "metal3ippool",
    shortname = "metal3ippools",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".metadata.labels.cluster\\.x-k8s\\.io/cluster-name","description":"Cluster to which this template belongs"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp","description":"Time duration since creation of Metal3IPPool"}"#,
    // Where metal3 ip-address-manager's pull request #1540 adds them, then bitpool's own.
    printcolumn = r#"{"name":"Capacity","type":"integer","jsonPath":".status.capacity","description":"Total allocatable IPs in the pool"}"#,
    printcolumn = r#"{"name":"Available IPs","type":"integer","jsonPath":".status.availableIPCount","description":"Unallocated IPs in the pool"}"#,
    printcolumn = r#"{"name":"Used IPs","type":"integer","jsonPath":".status.usedIPCount","description":"IPs held by claims, those outside the pool's ranges included"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status","description":"Whether the pool serves claims"}"#
)]
#[serde(rename_all = "camelCase")]
/// IPPool: address ranges, handed out to IPClaims (and CAPI IPAddressClaims) in declaration order.
pub struct IPPoolSpec {
    /// The Cluster this pool belongs to: labels, an owner reference, and pause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    /// Prefix of the IPAddress names (`<namePrefix>-<address>`); fixed after creation.
    #[schemars(length(min = 1))]
    pub name_prefix: String,
    /// Address ranges, consumed in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<Metal3PoolRange>,
    /// Pool-wide prefix length; an entry's own non-zero prefix wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 128))]
    pub prefix: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::schema::optional_ip_address")]
    pub gateway: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::schema::ip_address_list")]
    pub dns_servers: Vec<String>,
    /// Claim name → the address it always gets, reserved against every other claim.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "super::schema::ip_address_map")]
    pub pre_allocations: BTreeMap<String, String>,
    /// `sequential` (default) or `random`; fixed after creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "allocation_strategy_with_default")]
    pub allocation_strategy: Option<AllocationStrategy>,
    /// bitpool extension, for migration: serve this pool's IPClaims from a CAPI pool instead
    /// (bitpool's InClusterIPPool or any other provider's), through IPAddressClaims named like
    /// the IPClaims, mirroring each IPAddress back as the Metal3 IPAddress consumers read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_ref: Option<super::capi::IPPoolReference>,
}

impl IPPool {
    /// Whether the pool serves its claims from another pool (`spec.poolRef`, the migration
    /// proxy) rather than from its own ranges.
    pub fn proxies(&self) -> bool {
        self.spec.pool_ref.is_some()
    }
}

fn allocation_strategy_with_default(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<AllocationStrategy>();
    schema.insert("default".into(), "sequential".into());
    schema
}

/// One `pools[]` entry: `start`–`end`, `start` to the end of `subnet`, `subnet` alone, or an
/// open-ended `start`; its prefix, gateway and DNS servers override the pool-wide ones.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Metal3PoolRange {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::schema::optional_ip_address")]
    pub start: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::schema::optional_ip_address")]
    pub end: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::schema::optional_ip_subnet")]
    pub subnet: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 128))]
    pub prefix: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::schema::optional_ip_address")]
    pub gateway: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::schema::ip_address_list")]
    pub dns_servers: Vec<String>,
}

/// What an IPPool holds: its allocations, counts and conditions.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPPoolStatus {
    /// Changed only when the allocations change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_updated: Option<Time>,
    /// Claim name → allocated address (upstream's Go field `Allocations`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "super::schema::ip_address_map")]
    pub indexes: BTreeMap<String, String>,
    /// How many addresses the pool can hand out; left out when that passes int64 (a /64 or
    /// more). Named as metal3 ip-address-manager's pull request #1540 names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<i64>,
    /// How many of the pool's addresses no claim holds; left out with `capacity` (named as
    /// pull request #1540 names it).
    #[serde(
        rename = "availableIPCount",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub available_ip_count: Option<i64>,
    /// bitpool extension: how many addresses claims hold, those outside the pool's ranges
    /// (left by a shrink) included.
    #[serde(
        rename = "usedIPCount",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub used_ip_count: Option<i64>,
    /// bitpool extension: held addresses the pool's ranges no longer contain.
    #[serde(
        rename = "outOfRangeIPCount",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub out_of_range_ip_count: Option<i64>,
    /// bitpool extension: `Ready` (False with a reason when the pool hands out nothing), and
    /// `AddressesOverlap` while its addresses meet another pool's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::schema::conditions")]
    pub conditions: Vec<Condition>,
}

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "ipam.metal3.io",
    version = "v1alpha1",
    kind = "IPClaim",
    doc = "A Metal3 request for one IP address from the IPPool in spec.pool.",
    namespaced,
    status = "IPClaimStatus",
    category = "cluster-api",
    shortname = "ipc",
    shortname = "ipclaim",
    shortname = "m3ipc",
    shortname = "m3ipclaim",
    shortname = "m3ipclaims",
    shortname = "metal3ipc",
    shortname = "metal3ipclaim",
    shortname = "metal3ipclaims",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp","description":"Time duration since creation of Metal3IPClaim"}"#
)]
/// IPClaim: a request for one address from the IPPool in `spec.pool`.
pub struct IPClaimSpec {
    pub pool: ObjectReference,
}

/// What became of an IPClaim: its address, or why there is none.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPClaimStatus {
    /// The IPAddress allocated to this claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<ObjectReference>,
    /// Why no address could be allocated, in upstream's words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
}

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "ipam.metal3.io",
    version = "v1alpha1",
    kind = "IPAddress",
    doc = "One Metal3 IP address, named after its pool prefix and the address.",
    root = "Metal3IPAddress",
    namespaced,
    category = "metal3",
    shortname = "ipa",
    shortname = "ipaddress",
    shortname = "m3ipa",
    shortname = "m3ipaddress",
    shortname = "m3ipaddresses",
    shortname = "metal3ipa",
    shortname = "metal3ipaddress",
    shortname = "metal3ipaddresses",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp","description":"Time duration since creation of Metal3IPAddress"}"#
)]
#[serde(rename_all = "camelCase")]
/// Metal3's IPAddress (`ipam.metal3.io`), named `<namePrefix>-<address with . and : as ->`.
pub struct Metal3IPAddressSpec {
    pub claim: ObjectReference,
    pub pool: ObjectReference,
    #[schemars(schema_with = "super::schema::ip_address")]
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 128))]
    pub prefix: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::schema::optional_ip_address")]
    pub gateway: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::schema::ip_address_list")]
    pub dns_servers: Vec<String>,
}
