//! Objects as the caches hold them: what bitpool reads of them and nothing else, with the values
//! that repeat across objects shared ([`super::intern`]). A cached address object takes a
//! fraction of the object kube decodes (whose metadata alone is 360 bytes before its strings);
//! `tests/cache_memory.rs` pins how much.
//!
//! The metadata every cached object has is in `meta.rs`, the claims in `claim.rs`; what objects
//! have alike (a pool's reference and network, a namespace's labels and finalizers, a
//! condition's reason) is shared through an interner per kind of value.

use std::sync::{Arc, LazyLock};

use super::intern::{self, Interner};
use crate::api::capi::{IPAddress, IPPoolReference};
use crate::api::metal3_ipam::{self, Metal3IPAddress};

mod claim;
mod meta;
#[cfg(test)]
mod tests;

pub use claim::{CachedCondition, ClaimObject, ConditionHead, RareClaimFields};
pub use meta::{Meta, Owner, OwnerKind, Stamp, Uid, Version};

/// Which API a claim or address object is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IpamApi {
    /// `ipam.cluster.x-k8s.io` IPAddressClaim and IPAddress.
    Capi,
    /// `ipam.metal3.io` IPClaim and IPAddress.
    Metal3,
}

/// An address object of either API, as the caches hold it.
#[derive(Clone, Debug, PartialEq)]
pub struct AddressObject {
    pub api: IpamApi,
    pub meta: Meta,
    /// `spec.address` as written (it may not parse).
    pub address: Box<str>,
    /// The claim it answers, by name (shared with the object's own name, or its owner's).
    pub claim: Arc<str>,
    /// What the addresses of a pool have alike.
    network: Arc<AddressNetwork>,
}

/// The pool an address object is from and the network it gives, shared by the addresses of a
/// pool.
#[derive(Debug, PartialEq, Eq, Hash)]
struct AddressNetwork {
    pool: IPPoolReference,
    prefix: Option<i32>,
    gateway: Option<Arc<str>>,
    dns_servers: Box<[Arc<str>]>,
}

impl AddressObject {
    fn new(
        api: IpamApi,
        meta: Meta,
        (address, claim): (&str, &str),
        network: AddressNetwork,
    ) -> Self {
        // The claim's name is the object's (CAPI pools) or its controller owner's (Metal3).
        let shared = std::iter::once(&meta.name)
            .chain(meta.controller().map(|o| &o.name))
            .find(|name| ***name == *claim)
            .cloned();
        let claim = shared.unwrap_or_else(|| Arc::from(claim));
        Self {
            api,
            meta,
            address: address.into(),
            claim,
            network: NETWORKS.share(network),
        }
    }

    /// A CAPI IPAddress as cached; `None` without a name or namespace.
    pub fn of_capi(object: &IPAddress) -> Option<Self> {
        let spec = &object.spec;
        let network = AddressNetwork {
            pool: spec.pool_ref.clone(),
            prefix: Some(spec.prefix),
            gateway: spec.gateway.as_deref().map(intern::string),
            dns_servers: Box::new([]),
        };
        Some(Self::new(
            IpamApi::Capi,
            Meta::of(&object.metadata)?,
            (&spec.address, &spec.claim_ref.name),
            network,
        ))
    }

    /// A Metal3 IPAddress as cached; `None` without a name or namespace.
    pub fn of_metal3(object: &Metal3IPAddress) -> Option<Self> {
        let spec = &object.spec;
        let network = AddressNetwork {
            pool: IPPoolReference {
                name: spec.pool.name.clone().unwrap_or_default(),
                kind: "IPPool".into(),
                api_group: metal3_ipam::GROUP.into(),
            },
            prefix: spec.prefix,
            gateway: spec.gateway.as_deref().map(intern::string),
            dns_servers: spec.dns_servers.iter().map(|d| intern::string(d)).collect(),
        };
        Some(Self::new(
            IpamApi::Metal3,
            Meta::of(&object.metadata)?,
            (
                &spec.address,
                spec.claim.name.as_deref().unwrap_or_default(),
            ),
            network,
        ))
    }

    /// The pool it is from. A Metal3 address's pool is given as a Metal3 IPPool reference, with
    /// an empty name when the object names none.
    pub fn pool(&self) -> &IPPoolReference {
        &self.network.pool
    }

    /// `spec.prefix`.
    pub fn prefix(&self) -> Option<i32> {
        self.network.prefix
    }

    /// `spec.gateway`.
    pub fn gateway(&self) -> Option<&str> {
        self.network.gateway.as_deref()
    }

    /// `spec.dnsServers` (Metal3 addresses).
    pub fn dns_servers(&self) -> &[Arc<str>] {
        &self.network.dns_servers
    }
}

/// Networks address objects give, one copy each.
static NETWORKS: LazyLock<Interner<AddressNetwork>> = LazyLock::new(Interner::new);

impl super::index::Cached for AddressObject {
    fn namespace(&self) -> &Arc<str> {
        self.meta.namespace()
    }
    fn name(&self) -> &Arc<str> {
        &self.meta.name
    }
}
