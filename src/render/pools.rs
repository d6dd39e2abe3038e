//! Which pools a template references: one entry per pool name, with its group and kind.
//!
//! Name-only fields (`ipAddressFromIPPool`, `fromIPPool`, `dnsFromIPPool`) and empty
//! `apiGroup`/`kind` mean a Metal3 IPPool. Rendering looks pools up by name, so one name used
//! with two different kinds is an error rather than a guess.

use std::collections::BTreeMap;

use super::{Host, RenderError};
use crate::api::metal3_data::{
    AddressFamily, FromPoolAnnotation, Metal3DataTemplateSpec, NetworkGateway, NetworkRoute,
    NetworkServices, PoolRef, StaticNetwork,
};
use crate::api::metal3_ipam;

/// Which claim kind a pool is served through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// `ipam.metal3.io/IPPool`: a Metal3 IPClaim.
    Metal3,
    /// Any other pool: a CAPI IPAddressClaim.
    Capi,
}

/// A pool reference with upstream's defaults applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolReference {
    pub api_group: String,
    pub kind: String,
    pub name: String,
}

impl PoolReference {
    /// A reference as a template gives it: an empty group or kind means Metal3's IPPool.
    pub fn new(api_group: Option<&str>, kind: &str, name: &str) -> Self {
        let api_group = api_group.filter(|g| !g.is_empty());
        let kind = Some(kind).filter(|k| !k.is_empty());
        Self {
            api_group: api_group.unwrap_or(metal3_ipam::GROUP).to_string(),
            kind: kind.unwrap_or("IPPool").to_string(),
            name: name.to_string(),
        }
    }

    /// A Metal3 IPPool named `name`.
    pub fn metal3(name: &str) -> Self {
        Self::new(None, "", name)
    }

    /// Which kind of pool it names.
    pub fn kind(&self) -> PoolKind {
        if self.api_group == metal3_ipam::GROUP && self.kind == "IPPool" {
            PoolKind::Metal3
        } else {
            PoolKind::Capi
        }
    }
}

impl From<&PoolRef> for PoolReference {
    fn from(r: &PoolRef) -> Self {
        Self::new(r.api_group.as_deref(), &r.kind, &r.name)
    }
}

#[derive(Default)]
struct Collected(BTreeMap<String, PoolReference>);

impl Collected {
    fn add(&mut self, reference: PoolReference) -> Result<(), RenderError> {
        if reference.name.is_empty() {
            return Ok(());
        }
        match self.0.get(&reference.name) {
            None => {
                self.0.insert(reference.name.clone(), reference);
                Ok(())
            }
            Some(existing) if *existing == reference => Ok(()),
            Some(existing) => Err(RenderError::ConflictingPoolReferences(format!(
                "pool {:?} is both {}/{} and {}/{}",
                reference.name,
                existing.api_group,
                existing.kind,
                reference.api_group,
                reference.kind
            ))),
        }
    }

    fn add_name(&mut self, name: Option<&String>) -> Result<(), RenderError> {
        match name {
            Some(name) => self.add(PoolReference::metal3(name)),
            None => Ok(()),
        }
    }

    fn add_services<F: AddressFamily>(
        &mut self,
        services: &NetworkServices<F>,
    ) -> Result<(), RenderError> {
        self.add_name(services.dns_from_ip_pool.as_ref())?;
        match &services.dns_from_pool_ref {
            Some(reference) => self.add(reference.into()),
            None => Ok(()),
        }
    }

    fn add_routes<F: AddressFamily>(
        &mut self,
        routes: &[NetworkRoute<F>],
        host: Option<&Host>,
    ) -> Result<(), RenderError> {
        for route in routes {
            if let Some(reference) = gateway_reference(&route.gateway, host)? {
                self.add(reference)?;
            }
            if let Some(services) = &route.services {
                self.add_services(services)?;
            }
        }
        Ok(())
    }

    fn add_network<F: AddressFamily>(
        &mut self,
        network: &StaticNetwork<F>,
        host: Option<&Host>,
    ) -> Result<(), RenderError> {
        if let Some(reference) = network_reference(network, host)? {
            self.add(reference)?;
        }
        self.add_routes(&network.routes, host)
    }
}

/// A pool named by an annotation; `None` without a host (annotation pools are then found through
/// the claims' owner references instead).
fn annotation_reference(
    source: &FromPoolAnnotation,
    host: Option<&Host>,
) -> Result<Option<PoolReference>, RenderError> {
    let Some(host) = host else {
        return Ok(None);
    };
    let value = host.annotation(source.object, &source.annotation);
    // `<namespace>/<name>` is accepted too; pools are always in the Metal3Data's namespace.
    let name = value.rsplit('/').next().unwrap_or_default();
    if name.is_empty() {
        return Err(RenderError::EmptyPoolAnnotation {
            annotation: source.annotation.clone(),
            object: super::to_json_string(&source.object),
        });
    }
    Ok(Some(PoolReference::metal3(name)))
}

/// The pool of an `ipv4`/`ipv6` network: annotation, then `fromPoolRef`, then the name.
fn network_reference<F: AddressFamily>(
    network: &StaticNetwork<F>,
    host: Option<&Host>,
) -> Result<Option<PoolReference>, RenderError> {
    if let Some(source) = &network.from_pool_annotation {
        return annotation_reference(source, host);
    }
    if let Some(reference) = network
        .from_pool_ref
        .as_ref()
        .filter(|r| !r.name.is_empty())
    {
        return Ok(Some(reference.into()));
    }
    Ok(network
        .ip_address_from_ip_pool
        .as_deref()
        .filter(|n| !n.is_empty())
        .map(PoolReference::metal3))
}

/// The pool a route's gateway comes from (none for a static or missing gateway).
fn gateway_reference<F: AddressFamily>(
    gateway: &NetworkGateway<F>,
    host: Option<&Host>,
) -> Result<Option<PoolReference>, RenderError> {
    if gateway.string.is_some() {
        return Ok(None);
    }
    if let Some(source) = &gateway.from_pool_annotation {
        return annotation_reference(source, host);
    }
    if let Some(reference) = gateway
        .from_pool_ref
        .as_ref()
        .filter(|r| !r.name.is_empty())
    {
        return Ok(Some(reference.into()));
    }
    Ok(gateway
        .from_ip_pool
        .as_deref()
        .filter(|n| !n.is_empty())
        .map(PoolReference::metal3))
}

/// The name under which a network's address is looked up.
pub fn network_pool<F: AddressFamily>(
    network: &StaticNetwork<F>,
    host: &Host,
) -> Result<String, RenderError> {
    network_reference(network, Some(host))?
        .map(|r| r.name)
        .ok_or_else(|| RenderError::NetworkWithoutPool(network.id.clone()))
}

/// The name under which a gateway is looked up, if it comes from a pool.
pub fn gateway_pool<F: AddressFamily>(
    gateway: &NetworkGateway<F>,
    host: &Host,
) -> Result<Option<String>, RenderError> {
    Ok(gateway_reference(gateway, Some(host))?.map(|r| r.name))
}

/// Every pool the template references, by name. Pools named by annotations need `host`.
pub fn referenced_pools(
    template: &Metal3DataTemplateSpec,
    host: Option<&Host>,
) -> Result<BTreeMap<String, PoolReference>, RenderError> {
    let mut pools = Collected::default();
    if let Some(meta) = &template.meta_data {
        for entry in meta
            .ip_addresses_from_pool
            .iter()
            .chain(&meta.prefixes_from_pool)
            .chain(&meta.gateways_from_pool)
            .chain(&meta.dns_servers_from_pool)
        {
            pools.add(PoolReference::new(
                Some(&entry.api_group),
                &entry.kind,
                &entry.name,
            ))?;
        }
    }
    if let Some(network) = &template.network_data {
        if let Some(networks) = &network.networks {
            for n in &networks.ipv4 {
                pools.add_network(n, host)?;
            }
            for n in &networks.ipv6 {
                pools.add_network(n, host)?;
            }
            for n in &networks.ipv4_dhcp {
                pools.add_routes(&n.routes, host)?;
            }
            for n in networks.ipv6_dhcp.iter().chain(&networks.ipv6_slaac) {
                pools.add_routes(&n.routes, host)?;
            }
        }
        if let Some(services) = &network.services {
            pools.add_services(services)?;
        }
    }
    Ok(pools.0)
}
