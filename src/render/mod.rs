//! Rendering of each host's metaData and networkData from a Metal3DataTemplate: pure functions
//! over plain data, in CAPM3's format (see [`goyaml`] for why the writer is hand-made).
//!
//! - [`pools`]: which pools a template references, and under which name each is looked up;
//! - [`meta_data`] and [`network_data`]: the two secrets' contents.

pub mod goyaml;
pub mod pools;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::api::metal3_data::{
    AddressFamily, MacAddressSource, MetaData, NetworkData, NetworkGateway, NetworkRoute,
    NetworkServices, StaticNetwork, TemplateObject,
};
use goyaml::Value;
pub use pools::{PoolKind, PoolReference, referenced_pools};

/// A rendering failure, worded for the Metal3Data's `status.errorMessage`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error("Pool not found in cache: {0}")]
    PoolNotFound(String),
    #[error("NICs list not populated")]
    NicsNotPopulated,
    #[error("NIC name not found {0}")]
    NicNotFound(String),
    #[error("bad MAC address: {0}")]
    BadMac(String),
    #[error("the BareMetalHost has no bootMACAddress")]
    NoBootMac,
    #[error("illegal params \"{params}\" into bond params blob into link id={link}")]
    IllegalBondParameters { params: String, link: String },
    #[error("annotation {annotation} not found or empty on {object}")]
    EmptyPoolAnnotation { annotation: String, object: String },
    #[error("multiple references with the same name but different resource types: {0}")]
    ConflictingPoolReferences(String),
    #[error(
        "network {0} names no pool: set fromPoolRef, ipAddressFromIPPool or fromPoolAnnotation"
    )]
    NetworkWithoutPool(String),
    #[error("invalid prefix {prefix} for pool {pool}")]
    BadPrefix { pool: String, prefix: i32 },
}

/// Name, labels and annotations of one of the objects a template can read from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ObjectFacts {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// Everything about one host that a template can refer to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Host {
    /// The Metal3Data's namespace.
    pub namespace: String,
    /// The Metal3Data's index.
    pub index: i64,
    pub metal3_machine: ObjectFacts,
    pub machine: ObjectFacts,
    pub bare_metal_host: ObjectFacts,
    /// `status.hardware.nics` as (name, MAC); `None` when the host has no hardware details.
    pub nics: Option<Vec<(String, String)>>,
    pub boot_mac: Option<String>,
}

impl Host {
    fn object(&self, object: TemplateObject) -> &ObjectFacts {
        match object {
            TemplateObject::Machine => &self.machine,
            TemplateObject::Metal3Machine => &self.metal3_machine,
            TemplateObject::BareMetalHost => &self.bare_metal_host,
        }
    }

    fn annotation(&self, object: TemplateObject, annotation: &str) -> String {
        self.object(object)
            .annotations
            .get(annotation)
            .cloned()
            .unwrap_or_default()
    }

    fn nic_mac(&self, name: &str) -> Result<String, RenderError> {
        let nics = self.nics.as_ref().ok_or(RenderError::NicsNotPopulated)?;
        nics.iter()
            .find(|(nic, _)| nic == name)
            .map(|(_, mac)| mac.clone())
            .ok_or_else(|| RenderError::NicNotFound(name.to_string()))
    }
}

/// What a host got from one pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolAddress {
    pub address: String,
    pub prefix: i32,
    pub gateway: String,
    pub dns_servers: Vec<String>,
}

/// Pool name → what the host got from it.
pub type PoolAddresses = BTreeMap<String, PoolAddress>;

fn pool<'a>(pools: &'a PoolAddresses, name: &str) -> Result<&'a PoolAddress, RenderError> {
    pools
        .get(name)
        .ok_or_else(|| RenderError::PoolNotFound(name.to_string()))
}

/// The `metaData` secret: a flat map of strings, `providerid` always included.
pub fn meta_data(
    template: &MetaData,
    host: &Host,
    pools: &PoolAddresses,
) -> Result<String, RenderError> {
    // Later sources override earlier ones under the same key, in CAPM3's order.
    let mut values: BTreeMap<String, String> = BTreeMap::new();
    for entry in &template.from_host_interfaces {
        let mac = if entry.from_boot_mac == Some(true) {
            host.boot_mac.clone().ok_or(RenderError::NoBootMac)?
        } else {
            host.nic_mac(entry.interface.as_deref().unwrap_or_default())?
        };
        values.insert(entry.key.clone(), mac);
    }
    for entry in &template.ip_addresses_from_pool {
        values.insert(entry.key.clone(), pool(pools, &entry.name)?.address.clone());
    }
    for entry in &template.prefixes_from_pool {
        values.insert(
            entry.key.clone(),
            pool(pools, &entry.name)?.prefix.to_string(),
        );
    }
    for entry in &template.gateways_from_pool {
        values.insert(entry.key.clone(), pool(pools, &entry.name)?.gateway.clone());
    }
    // Beyond CAPM3, which claims these pools but never renders them: the servers, comma-separated.
    for entry in &template.dns_servers_from_pool {
        values.insert(
            entry.key.clone(),
            pool(pools, &entry.name)?.dns_servers.join(","),
        );
    }
    for entry in &template.indexes {
        let step = match entry.step {
            Some(0) | None => 1,
            Some(step) => step,
        };
        let number = entry.offset.unwrap_or(0) + host.index * step;
        values.insert(
            entry.key.clone(),
            format!(
                "{}{number}{}",
                entry.prefix.as_deref().unwrap_or_default(),
                entry.suffix.as_deref().unwrap_or_default()
            ),
        );
    }
    for entry in &template.namespaces {
        values.insert(entry.key.clone(), host.namespace.clone());
    }
    for entry in &template.object_names {
        values.insert(entry.key.clone(), host.object(entry.object).name.clone());
    }
    for entry in &template.from_labels {
        let object = host.object(entry.object);
        let value = object.labels.get(&entry.label).cloned().unwrap_or_default();
        values.insert(entry.key.clone(), value);
    }
    for entry in &template.from_annotations {
        values.insert(
            entry.key.clone(),
            host.annotation(entry.object, &entry.annotation),
        );
    }
    for entry in &template.strings {
        values.insert(entry.key.clone(), entry.value.clone());
    }
    values.insert(
        "providerid".into(),
        format!(
            "{}/{}/{}",
            host.namespace, host.bare_metal_host.name, host.metal3_machine.name
        ),
    );
    Ok(goyaml::to_string(&Value::map(
        values.into_iter().map(|(k, v)| (k, Value::Str(v))),
    )))
}

/// The `networkData` secret: links, networks and services, laid out like OpenStack's
/// `network_data.json`.
pub fn network_data(
    template: &NetworkData,
    host: &Host,
    pools: &PoolAddresses,
) -> Result<String, RenderError> {
    let document = Value::map([
        ("links", links(template, host)?),
        ("networks", networks(template, host, pools)?),
        (
            "services",
            Value::Seq(match &template.services {
                Some(services) => dns_services(services, pools)?,
                None => vec![],
            }),
        ),
    ]);
    Ok(goyaml::to_string(&document))
}

/// The link's MAC address; `None` when no source is set (the link is then matched by name, as
/// CAPM3 does since MACs became optional).
fn mac_address(source: &MacAddressSource, host: &Host) -> Result<Option<String>, RenderError> {
    let mac = if let Some(mac) = &source.string {
        mac.clone()
    } else if let Some(interface) = &source.from_host_interface {
        host.nic_mac(interface)?
    } else if let Some(annotation) = &source.from_annotation {
        host.annotation(annotation.object, &annotation.annotation)
    } else {
        return Ok(None);
    };
    if is_mac(&mac) {
        Ok(Some(mac))
    } else {
        Err(RenderError::BadMac(mac))
    }
}

/// A link entry: the fixed keys, then `name` and the MAC when present.
fn link_entry(
    mut entry: Vec<(String, Value)>,
    name: Option<&String>,
    mac_key: &str,
    mac: Option<String>,
) -> Vec<(String, Value)> {
    if let Some(name) = name {
        entry.push(("name".into(), Value::str(name)));
    }
    if let Some(mac) = mac {
        entry.push((mac_key.into(), Value::Str(mac)));
    }
    entry
}

/// Six hexadecimal pairs separated by `:` or `-`.
fn is_mac(mac: &str) -> bool {
    let bytes = mac.as_bytes();
    bytes.len() == 17
        && bytes.iter().enumerate().all(|(i, b)| match i % 3 {
            2 => *b == b':' || *b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

fn to_json_string<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}

fn links(template: &NetworkData, host: &Host) -> Result<Value, RenderError> {
    let Some(links) = &template.links else {
        return Ok(Value::Seq(vec![]));
    };
    let mut rendered = vec![];
    for bond in &links.bonds {
        rendered.push(bond_link(bond, host)?);
    }
    for ethernet in &links.ethernets {
        let fixed = vec![
            (
                "type".to_string(),
                Value::Str(to_json_string(&ethernet.type_)),
            ),
            ("id".into(), Value::str(&ethernet.id)),
            ("mtu".into(), Value::Int(ethernet.mtu.into())),
        ];
        let mac = mac_address(&ethernet.mac_address, host)?;
        let entry = link_entry(fixed, ethernet.name.as_ref(), "ethernet_mac_address", mac);
        rendered.push(Value::Map(entry));
    }
    for vlan in &links.vlans {
        let fixed = vec![
            ("type".to_string(), Value::str("vlan")),
            ("id".into(), Value::str(&vlan.id)),
            ("mtu".into(), Value::Int(vlan.mtu.into())),
            ("vlan_id".into(), Value::Int(vlan.vlan_id.into())),
            ("vlan_link".into(), Value::str(&vlan.vlan_link)),
        ];
        let mac = mac_address(&vlan.mac_address, host)?;
        let entry = link_entry(fixed, vlan.name.as_ref(), "vlan_mac_address", mac);
        rendered.push(Value::Map(entry));
    }
    Ok(Value::Seq(rendered))
}

/// One bond of `links`: its fixed fields, then its parameters as `bond_<name>` (a parameter
/// that would overwrite a fixed field is refused, as CAPM3 refuses it).
fn bond_link(bond: &crate::api::metal3_data::BondLink, host: &Host) -> Result<Value, RenderError> {
    let fixed = vec![
        ("type".to_string(), Value::str("bond")),
        ("id".into(), Value::str(&bond.id)),
        ("mtu".into(), Value::Int(bond.mtu.into())),
        (
            "bond_mode".into(),
            Value::Str(to_json_string(&bond.bond_mode)),
        ),
        (
            "bond_xmit_hash_policy".into(),
            Value::Str(
                bond.bond_xmit_hash_policy
                    .as_ref()
                    .map(to_json_string)
                    .unwrap_or_default(),
            ),
        ),
        (
            "bond_links".into(),
            if bond.bond_links.is_empty() {
                Value::Null
            } else {
                Value::Seq(bond.bond_links.iter().map(Value::str).collect())
            },
        ),
    ];
    let mac = mac_address(&bond.mac_address, host)?;
    let mut entry = link_entry(fixed, bond.name.as_ref(), "ethernet_mac_address", mac);
    let mut illegal = vec![];
    // A name given twice takes its last value.
    let parameters: BTreeMap<&String, &serde_json::Value> = bond
        .parameters
        .iter()
        .map(|p| (&p.name, &p.value))
        .collect();
    for (name, value) in parameters {
        let key = format!("bond_{name}");
        if entry.iter().any(|(k, _)| *k == key) {
            illegal.push(name.clone());
        } else {
            entry.push((key, Value::from(value)));
        }
    }
    if !illegal.is_empty() {
        return Err(RenderError::IllegalBondParameters {
            params: illegal.join("\", \""),
            link: bond.id.clone(),
        });
    }
    Ok(Value::Map(entry))
}

fn networks(
    template: &NetworkData,
    host: &Host,
    pools: &PoolAddresses,
) -> Result<Value, RenderError> {
    let Some(networks) = &template.networks else {
        return Ok(Value::Seq(vec![]));
    };
    let mut rendered = vec![];
    for network in &networks.ipv4 {
        rendered.push(static_network("ipv4", network, host, pools, true)?);
    }
    for network in &networks.ipv6 {
        rendered.push(static_network("ipv6", network, host, pools, false)?);
    }
    let dynamic = |type_: &str, id: &str, link: &str, routes: Value| {
        Value::map([
            ("type", Value::str(type_)),
            ("id", Value::str(id)),
            ("link", Value::str(link)),
            ("routes", routes),
        ])
    };
    for network in &networks.ipv4_dhcp {
        let routes = routes(&network.routes, host, pools, true)?;
        rendered.push(dynamic("ipv4_dhcp", &network.id, &network.link, routes));
    }
    for network in &networks.ipv6_dhcp {
        let routes = routes(&network.routes, host, pools, false)?;
        rendered.push(dynamic("ipv6_dhcp", &network.id, &network.link, routes));
    }
    for network in &networks.ipv6_slaac {
        let routes = routes(&network.routes, host, pools, false)?;
        rendered.push(dynamic("ipv6_slaac", &network.id, &network.link, routes));
    }
    Ok(Value::Seq(rendered))
}

fn static_network<F: AddressFamily>(
    type_: &str,
    network: &StaticNetwork<F>,
    host: &Host,
    pools: &PoolAddresses,
    ipv4: bool,
) -> Result<Value, RenderError> {
    let pool_name = pools::network_pool(network, host)?;
    let address = pool(pools, &pool_name)?;
    let netmask = netmask(address.prefix, ipv4).ok_or_else(|| RenderError::BadPrefix {
        pool: pool_name.clone(),
        prefix: address.prefix,
    })?;
    Ok(Value::map([
        ("type", Value::str(type_)),
        ("id", Value::str(&network.id)),
        ("link", Value::str(&network.link)),
        ("netmask", Value::Str(netmask)),
        ("ip_address", Value::str(&address.address)),
        ("routes", routes(&network.routes, host, pools, ipv4)?),
    ]))
}

fn routes<F: AddressFamily>(
    routes: &[NetworkRoute<F>],
    host: &Host,
    pools: &PoolAddresses,
    ipv4: bool,
) -> Result<Value, RenderError> {
    let mut rendered = vec![];
    for route in routes {
        let prefix = route.prefix.unwrap_or(0);
        let netmask = netmask(prefix, ipv4).ok_or_else(|| RenderError::BadPrefix {
            pool: format!("route to {}", route.network),
            prefix,
        })?;
        let services = match &route.services {
            Some(services) => dns_services(services, pools)?,
            None => vec![],
        };
        rendered.push(Value::map([
            ("network", Value::str(&route.network)),
            ("netmask", Value::Str(netmask)),
            ("gateway", Value::Str(gateway(&route.gateway, host, pools)?)),
            ("services", Value::Seq(services)),
        ]));
    }
    Ok(Value::Seq(rendered))
}

fn gateway<F: AddressFamily>(
    gateway: &NetworkGateway<F>,
    host: &Host,
    pools: &PoolAddresses,
) -> Result<String, RenderError> {
    if let Some(address) = &gateway.string {
        return Ok(address.clone());
    }
    match pools::gateway_pool(gateway, host)? {
        Some(name) => Ok(pool(pools, &name)?.gateway.clone()),
        None => Ok(String::new()),
    }
}

fn dns_services<F: AddressFamily>(
    services: &NetworkServices<F>,
    pools: &PoolAddresses,
) -> Result<Vec<Value>, RenderError> {
    let mut servers: Vec<&String> = services.dns.iter().collect();
    if let Some(name) = &services.dns_from_ip_pool {
        servers.extend(&pool(pools, name)?.dns_servers);
    }
    if let Some(reference) = &services.dns_from_pool_ref {
        servers.extend(&pool(pools, &reference.name)?.dns_servers);
    }
    Ok(servers
        .into_iter()
        .map(|address| {
            Value::map([
                ("type", Value::str("dns")),
                ("address", Value::str(address)),
            ])
        })
        .collect())
}

/// A prefix length as a mask in address notation (`255.255.255.0`, `ffff:ffff::`).
pub fn netmask(prefix: i32, ipv4: bool) -> Option<String> {
    let bits = u32::try_from(prefix).ok()?;
    if ipv4 {
        let mask = u32::MAX.checked_shl(32 - bits.min(32)).unwrap_or(0);
        (bits <= 32).then(|| Ipv4Addr::from(if bits == 0 { 0 } else { mask }).to_string())
    } else {
        let mask = u128::MAX.checked_shl(128 - bits.min(128)).unwrap_or(0);
        (bits <= 128).then(|| Ipv6Addr::from(if bits == 0 { 0 } else { mask }).to_string())
    }
}
