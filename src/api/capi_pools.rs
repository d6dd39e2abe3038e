//! bitpool's CAPI pools: InClusterIPPool (namespaced) and GlobalInClusterIPPool (cluster-scoped),
//! `ipam.cluster.x-k8s.io/v1alpha2`, field for field the in-cluster provider's, plus optional
//! extensions (`preAllocations`, `allocationStrategy`, `dnsServers`, `subnets`,
//! `status.conditions`) that leave upstream manifests valid unchanged.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::AllocationStrategy;

/// On a claim served by a CAPI pool: held until its address is released.
pub const CLAIM_FINALIZER: &str = "ipam.cluster.x-k8s.io/ReleaseAddress";
/// On an IPAddress: held until its claim releases it.
pub const ADDRESS_FINALIZER: &str = "ipam.cluster.x-k8s.io/ProtectAddress";
/// On a pool: held while any address is allocated from it.
pub const POOL_FINALIZER: &str = "ipam.cluster.x-k8s.io/ProtectPool";
/// On a cluster-scoped pool: the namespace whose claims bare `preAllocations` keys (`<name>`)
/// name. Without it only `<namespace>/<name>` keys name a claim: a bare key would go to
/// whichever namespace first claimed that name.
pub const PREALLOCATION_NAMESPACE_ANNOTATION: &str = "ipam.bitpool.dev/preallocation-namespace";
/// Lets `clusterctl move` delete a pool that still has addresses.
pub const SKIP_DELETE_CHECK_ANNOTATION: &str = "ipam.cluster.x-k8s.io/skip-validate-delete-webhook";
/// On a v1alpha1 or v1alpha2 pool: what the other version has no place for, kept by the
/// conversion webhook as the in-cluster provider (and Cluster API) keep it.
pub const CONVERSION_DATA_ANNOTATION: &str = "cluster.x-k8s.io/conversion-data";
/// On an InClusterIPPool that `bitpool migrate` wrote: the Metal3 IPPool it replaces.
pub const MIGRATED_FROM_ANNOTATION: &str = "ipam.bitpool.dev/migrated-from";

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "ipam.cluster.x-k8s.io",
    version = "v1alpha2",
    kind = "InClusterIPPool",
    doc = "InClusterIPPool is a namespaced pool of IP addresses for IPAddressClaims of its namespace.",
    namespaced,
    status = "InClusterIPPoolStatus",
    category = "cluster-api",
    printcolumn = r#"{"name":"Addresses","type":"string","jsonPath":".spec.addresses","description":"List of addresses, to allocate from"}"#,
    printcolumn = r#"{"name":"Total","type":"integer","jsonPath":".status.ipAddresses.total","description":"Count of IPs configured for the pool"}"#,
    printcolumn = r#"{"name":"Free","type":"integer","jsonPath":".status.ipAddresses.free","description":"Count of unallocated IPs in the pool"}"#,
    printcolumn = r#"{"name":"Used","type":"integer","jsonPath":".status.ipAddresses.used","description":"Count of allocated IPs in the pool"}"#,
    printcolumn = r#"{"name":"Out Of Range","type":"integer","jsonPath":".status.ipAddresses.outOfRange","description":"Count of allocated IPs the pool no longer contains"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status","description":"Whether the pool serves claims"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp","description":"Time since the pool was created"}"#
)]
#[serde(rename_all = "camelCase")]
/// The spec both CAPI pool kinds share.
pub struct InClusterIPPoolSpec {
    /// Addresses to hand out: single IPs, ranges `a-b`, or CIDRs (host bits are ignored).
    pub addresses: Vec<String>,
    /// The prefix length given to every address of the pool.
    #[schemars(range(min = 0, max = 128))]
    pub prefix: i32,
    /// The gateway; never handed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// Addresses never handed out (same forms as `addresses`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excluded_addresses: Vec<String>,
    /// Hand out the network address (and on IPv4 the broadcast address) of the inferred subnet.
    #[serde(
        rename = "allocateReservedIPAddresses",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub allocate_reserved_ip_addresses: bool,
    /// Seconds a released address stays reserved before it can be handed out again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub address_reuse_grace_period_seconds: Option<i32>,
    /// bitpool extension: claim name → the address that claim always gets. Reserved up front.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "super::schema::pre_allocations")]
    pub pre_allocations: BTreeMap<String, String>,
    /// bitpool extension: `sequential` (default, the lowest free address) or `random`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::schema::optional_enum::<AllocationStrategy>")]
    pub allocation_strategy: Option<AllocationStrategy>,
    /// bitpool extension: DNS servers rendered for networks on this pool (the CAPI contract has none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 45)))]
    pub dns_servers: Vec<String>,
    /// bitpool extension: further subnets of the pool, each with its own addresses, prefix,
    /// gateway and DNS servers (`addresses`, `prefix`, `gateway` and `dnsServers` are the
    /// first). Addresses are handed out lowest first across all of them; an IPAddress carries
    /// the prefix and gateway of the subnet its address is in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub subnets: Vec<PoolSubnet>,
}

impl InClusterIPPoolSpec {
    /// The DNS servers that go with `address`: those of the subnet it is in, else the pool's
    /// (the CAPI contract carries no DNS, so renderers read them from the pool).
    pub fn dns_servers_for(&self, address: &str) -> &[String] {
        use crate::alloc::family::{parse_address, parse_entry, to_value};
        let Some(value) = parse_address(address).map(to_value) else {
            return &self.dns_servers;
        };
        let holds =
            |entry: &String| parse_entry(entry).is_ok_and(|r| r.first <= value && value <= r.last);
        self.subnets
            .iter()
            .find(|s| !s.dns_servers.is_empty() && s.addresses.iter().any(holds))
            .map_or(&self.dns_servers, |s| &s.dns_servers)
    }
}

/// One further subnet of an InClusterIPPool or GlobalInClusterIPPool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolSubnet {
    /// Addresses to hand out in this subnet: single IPs, ranges `a-b`, or CIDRs; all inside
    /// `<lowest address>/<prefix>`.
    #[schemars(length(min = 1, max = 256), inner(length(max = 91)))]
    pub addresses: Vec<String>,
    /// The prefix length of this subnet's addresses.
    #[schemars(range(min = 0, max = 128))]
    pub prefix: i32,
    /// This subnet's gateway, inside it (or an IPv6 link-local address); never handed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// DNS servers rendered for addresses of this subnet; the pool's `dnsServers` when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 45)))]
    pub dns_servers: Vec<String>,
}

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "ipam.cluster.x-k8s.io",
    version = "v1alpha2",
    kind = "GlobalInClusterIPPool",
    doc = "GlobalInClusterIPPool is a cluster-scoped pool of IP addresses for IPAddressClaims of every namespace.",
    status = "InClusterIPPoolStatus",
    category = "cluster-api",
    printcolumn = r#"{"name":"Addresses","type":"string","jsonPath":".spec.addresses","description":"List of addresses, to allocate from"}"#,
    printcolumn = r#"{"name":"Total","type":"integer","jsonPath":".status.ipAddresses.total","description":"Count of IPs configured for the pool"}"#,
    printcolumn = r#"{"name":"Free","type":"integer","jsonPath":".status.ipAddresses.free","description":"Count of unallocated IPs in the pool"}"#,
    printcolumn = r#"{"name":"Used","type":"integer","jsonPath":".status.ipAddresses.used","description":"Count of allocated IPs in the pool"}"#,
    printcolumn = r#"{"name":"Out Of Range","type":"integer","jsonPath":".status.ipAddresses.outOfRange","description":"Count of allocated IPs the pool no longer contains"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status","description":"Whether the pool serves claims"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp","description":"Time since the pool was created"}"#
)]
#[serde(rename_all = "camelCase")]
/// GlobalInClusterIPPool: the same pool, cluster-scoped, serving claims of every namespace.
pub struct GlobalInClusterIPPoolSpec {
    #[serde(flatten)]
    pub pool: InClusterIPPoolSpec,
    /// bitpool extension: the namespaces whose claims may take addresses from this pool (a
    /// label selector over Namespaces). Unset or empty: every namespace, as upstream. A claim
    /// of a namespace it does not select is refused (`Ready=False`, `NamespaceNotSelected`);
    /// addresses already held stay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
}

/// What a pool holds: its address counts and conditions.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InClusterIPPoolStatus {
    #[serde(
        rename = "ipAddresses",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub ip_addresses: Option<IPAddressCounts>,
    /// bitpool extension: `Ready`, False with a reason when the spec is invalid.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::schema::conditions")]
    pub conditions: Vec<Condition>,
}

/// Address counts; a value beyond int64 (an IPv6 pool) is reported as `i64::MAX`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressCounts {
    pub total: i64,
    pub free: i64,
    pub used: i64,
    pub out_of_range: i64,
}

/// The pools at `v1alpha1`, the in-cluster provider's first API (before v0.1.0-alpha.3), still
/// served so that installations that stored it, and manifests written for it, keep working. The
/// API server converts through bitpool's webhook (`webhook::convert::pools`).
pub mod v1alpha1 {
    use kube::CustomResource;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    use super::InClusterIPPoolStatus;

    #[derive(
        CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema,
    )]
    #[kube(
        group = "ipam.cluster.x-k8s.io",
        version = "v1alpha1",
        kind = "InClusterIPPool",
        doc = "InClusterIPPool at v1alpha1 (deprecated): a subnet, a start-end range, or addresses.",
        namespaced,
        status = "InClusterIPPoolStatus",
        category = "cluster-api",
        deprecated,
        printcolumn = r#"{"name":"Subnet","type":"string","jsonPath":".spec.subnet","description":"Subnet to allocate IPs from"}"#,
        printcolumn = r#"{"name":"First","type":"string","jsonPath":".spec.start","description":"First address of the range to allocate from"}"#,
        printcolumn = r#"{"name":"Last","type":"string","jsonPath":".spec.end","description":"Last address of the range to allocate from"}"#,
        printcolumn = r#"{"name":"Addresses","type":"string","jsonPath":".spec.addresses","description":"List of addresses, within the subnet, to allocate from"}"#,
        printcolumn = r#"{"name":"Total","type":"integer","jsonPath":".status.ipAddresses.total","description":"Count of IPs configured for the pool"}"#,
        printcolumn = r#"{"name":"Free","type":"integer","jsonPath":".status.ipAddresses.free","description":"Count of unallocated IPs in the pool"}"#,
        printcolumn = r#"{"name":"Used","type":"integer","jsonPath":".status.ipAddresses.used","description":"Count of allocated IPs in the pool"}"#
    )]
    #[serde(rename_all = "camelCase")]
    /// The v1alpha1 spec: a subnet, or a `start`–`end` range, or addresses.
    pub struct InClusterIPPoolSpec {
        /// Addresses that can be assigned (single IPs, ranges, CIDRs).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub addresses: Vec<String>,
        /// The subnet to assign addresses from; `start` and `end` default to its second and
        /// second-last addresses.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub subnet: Option<String>,
        /// The first address that can be assigned.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub start: Option<String>,
        /// The last address that can be assigned.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub end: Option<String>,
        /// The network prefix; from the subnet when unset.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(range(max = 128))]
        pub prefix: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub gateway: Option<String>,
    }

    #[derive(
        CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema,
    )]
    #[kube(
        group = "ipam.cluster.x-k8s.io",
        version = "v1alpha1",
        kind = "GlobalInClusterIPPool",
        doc = "GlobalInClusterIPPool at v1alpha1 (deprecated): a subnet, a start-end range, or addresses.",
        status = "InClusterIPPoolStatus",
        category = "cluster-api",
        deprecated,
        printcolumn = r#"{"name":"Subnet","type":"string","jsonPath":".spec.subnet","description":"Subnet to allocate IPs from"}"#,
        printcolumn = r#"{"name":"First","type":"string","jsonPath":".spec.start","description":"First address of the range to allocate from"}"#,
        printcolumn = r#"{"name":"Last","type":"string","jsonPath":".spec.end","description":"Last address of the range to allocate from"}"#,
        printcolumn = r#"{"name":"Total","type":"integer","jsonPath":".status.ipAddresses.total","description":"Count of IPs configured for the pool"}"#,
        printcolumn = r#"{"name":"Free","type":"integer","jsonPath":".status.ipAddresses.free","description":"Count of unallocated IPs in the pool"}"#,
        printcolumn = r#"{"name":"Used","type":"integer","jsonPath":".status.ipAddresses.used","description":"Count of allocated IPs in the pool"}"#
    )]
    /// GlobalInClusterIPPool at v1alpha1 (deprecated).
    pub struct GlobalInClusterIPPoolSpec {
        #[serde(flatten)]
        pub pool: InClusterIPPoolSpec,
    }
}

/// Upstream's allocation length when a prefix pool's spec leaves it out.
fn default_allocation_prefix_length() -> i32 {
    64
}

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "ipam.cluster.x-k8s.io",
    version = "v1alpha2",
    kind = "InClusterPrefixPool",
    doc = "InClusterPrefixPool is a namespaced pool of prefixes handing out sub-prefixes to IPAddressClaims of its namespace.",
    namespaced,
    status = "InClusterIPPoolStatus",
    category = "cluster-api",
    printcolumn = r#"{"name":"Prefixes","type":"string","jsonPath":".spec.prefixes","description":"List of prefixes to allocate sub-prefixes from"}"#,
    printcolumn = r#"{"name":"Total","type":"integer","jsonPath":".status.ipAddresses.total","description":"Count of allocatable sub-prefixes in the pool"}"#,
    printcolumn = r#"{"name":"Free","type":"integer","jsonPath":".status.ipAddresses.free","description":"Count of unallocated sub-prefixes in the pool"}"#,
    printcolumn = r#"{"name":"Used","type":"integer","jsonPath":".status.ipAddresses.used","description":"Count of allocated sub-prefixes in the pool"}"#,
    printcolumn = r#"{"name":"Out Of Range","type":"integer","jsonPath":".status.ipAddresses.outOfRange","description":"Count of allocated sub-prefixes the pool no longer allocates"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status","description":"Whether the pool serves claims"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp","description":"Time since the pool was created"}"#
)]
#[serde(rename_all = "camelCase")]
/// The spec both CAPI prefix pool kinds share (the in-cluster provider's v1.1 API), plus the
/// same optional extensions as the address pools (`preAllocations`, `allocationStrategy`).
pub struct InClusterPrefixPoolSpec {
    /// Network-aligned CIDRs (IPv6, or with bitpool IPv4 too) that sub-prefixes are cut from.
    pub prefixes: Vec<String>,
    /// The length of every sub-prefix handed out; at least each prefix's own length.
    #[serde(default = "default_allocation_prefix_length")]
    #[schemars(range(min = 1, max = 128))]
    pub allocation_prefix_length: i32,
    /// IPs, ranges `a-b` or CIDRs: a sub-prefix overlapping any of them is never handed out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excluded_prefixes: Vec<String>,
    /// Carried unchanged to every IPAddress; it keeps no sub-prefix from being handed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// bitpool extension: claim name → the sub-prefix (`network/length` or its network address)
    /// that claim always gets. Reserved up front.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "super::schema::pre_allocations")]
    pub pre_allocations: BTreeMap<String, String>,
    /// bitpool extension: `sequential` (default, the lowest free sub-prefix) or `random`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::schema::optional_enum::<AllocationStrategy>")]
    pub allocation_strategy: Option<AllocationStrategy>,
}

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "ipam.cluster.x-k8s.io",
    version = "v1alpha2",
    kind = "GlobalInClusterPrefixPool",
    doc = "GlobalInClusterPrefixPool is a cluster-scoped pool of prefixes handing out sub-prefixes to IPAddressClaims of every namespace.",
    status = "InClusterIPPoolStatus",
    category = "cluster-api",
    printcolumn = r#"{"name":"Prefixes","type":"string","jsonPath":".spec.prefixes","description":"List of prefixes to allocate sub-prefixes from"}"#,
    printcolumn = r#"{"name":"Total","type":"integer","jsonPath":".status.ipAddresses.total","description":"Count of allocatable sub-prefixes in the pool"}"#,
    printcolumn = r#"{"name":"Free","type":"integer","jsonPath":".status.ipAddresses.free","description":"Count of unallocated sub-prefixes in the pool"}"#,
    printcolumn = r#"{"name":"Used","type":"integer","jsonPath":".status.ipAddresses.used","description":"Count of allocated sub-prefixes in the pool"}"#,
    printcolumn = r#"{"name":"Out Of Range","type":"integer","jsonPath":".status.ipAddresses.outOfRange","description":"Count of allocated sub-prefixes the pool no longer allocates"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status","description":"Whether the pool serves claims"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp","description":"Time since the pool was created"}"#
)]
#[serde(rename_all = "camelCase")]
/// GlobalInClusterPrefixPool: the same pool, cluster-scoped, serving claims of every namespace.
pub struct GlobalInClusterPrefixPoolSpec {
    #[serde(flatten)]
    pub pool: InClusterPrefixPoolSpec,
    /// bitpool extension: the namespaces whose claims may take addresses from this pool (a
    /// label selector over Namespaces). Unset or empty: every namespace, as upstream. A claim
    /// of a namespace it does not select is refused (`Ready=False`, `NamespaceNotSelected`);
    /// addresses already held stay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
}
