//! Which pool kind a run's pools are and which claim kind its claims are: Cluster API's
//! contract on an InClusterIPPool, Metal3's IPClaims on a Metal3 IPPool, or Cluster API claims
//! on a Metal3 IPPool (served from the same address space). The load command
//! reads and writes every kind as a dynamic object through the fields named here.

use std::net::IpAddr;

use bitpool::api::capi::{IPAddress, IPAddressClaim};
use bitpool::api::capi_pools::InClusterIPPool;
use bitpool::api::metal3_ipam::{IPClaim, IPPool, Metal3IPAddress};
use kube::api::{ApiResource, DynamicObject};
use serde_json::{Value, json};

use crate::workload::Pool;

/// Which claims a run makes, on which pools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    /// IPAddressClaims on InClusterIPPools (the in-cluster provider's ground).
    CapiOnInCluster,
    /// IPClaims on Metal3 IPPools (Metal3's ip-address-manager's ground).
    Metal3OnMetal3,
    /// IPAddressClaims on Metal3 IPPools (Metal3's ip-address-manager serves those too).
    CapiOnMetal3,
}

/// A JSON pointer into an object's body.
type Field = &'static str;

impl Flavour {
    /// The flavour as the report names it.
    pub fn describe(self) -> &'static str {
        match self {
            Self::CapiOnInCluster => "IPAddressClaims on InClusterIPPool",
            Self::Metal3OnMetal3 => "IPClaims on Metal3 IPPool",
            Self::CapiOnMetal3 => "IPAddressClaims on Metal3 IPPool",
        }
    }

    fn metal3_pool(self) -> bool {
        self != Self::CapiOnInCluster
    }

    fn metal3_claims(self) -> bool {
        self == Self::Metal3OnMetal3
    }

    /// The flavour's pool kind.
    pub fn pools(self) -> ApiResource {
        match self.metal3_pool() {
            true => ApiResource::erase::<IPPool>(&()),
            false => ApiResource::erase::<InClusterIPPool>(&()),
        }
    }

    /// The flavour's claim kind.
    pub fn claims(self) -> ApiResource {
        match self.metal3_claims() {
            true => ApiResource::erase::<IPClaim>(&()),
            false => ApiResource::erase::<IPAddressClaim>(&()),
        }
    }

    /// The kind of the address objects its claims are served with.
    pub fn addresses(self) -> ApiResource {
        match self.metal3_claims() {
            true => ApiResource::erase::<Metal3IPAddress>(&()),
            false => ApiResource::erase::<IPAddress>(&()),
        }
    }

    /// The pool object for `pool`: the whole network, its first address the gateway.
    pub fn pool_object(self, pool: &Pool) -> DynamicObject {
        let gateway = match pool.network.network() {
            IpAddr::V4(net) => IpAddr::V4((u32::from(net) + 1).into()),
            IpAddr::V6(net) => IpAddr::V6((u128::from(net) + 1).into()),
        };
        let prefix = pool.network.prefix_len();
        let spec = match self.metal3_pool() {
            true => json!({
                "namePrefix": pool.name,
                "pools": [{"subnet": pool.network.to_string()}],
                "prefix": prefix,
                "gateway": gateway.to_string(),
            }),
            false => json!({
                "addresses": [pool.network.to_string()],
                "prefix": prefix,
                "gateway": gateway.to_string(),
            }),
        };
        object(&self.pools(), &pool.name, json!({ "spec": spec }))
    }

    /// A claim named `name` on the pool named `pool` of namespace `namespace`.
    pub fn claim_object(self, namespace: &str, name: &str, pool: &str) -> DynamicObject {
        let pools = self.pools();
        let spec = match self.metal3_claims() {
            true => json!({ "pool": { "name": pool, "namespace": namespace } }),
            false => json!({
                "poolRef": { "name": pool, "kind": pools.kind, "apiGroup": pools.group },
            }),
        };
        object(&self.claims(), name, json!({ "spec": spec }))
    }

    /// Where a claim names its address object once it is served.
    fn claim_address_name(self) -> Field {
        match self.metal3_claims() {
            true => "/status/address/name",
            false => "/status/addressRef/name",
        }
    }

    fn claim_pool_name(self) -> Field {
        match self.metal3_claims() {
            true => "/spec/pool/name",
            false => "/spec/poolRef/name",
        }
    }

    /// The address object's claim and pool (its address is `/spec/address` in both kinds).
    fn address_claim_and_pool(self) -> (Field, Field) {
        match self.metal3_claims() {
            true => ("/spec/claim/name", "/spec/pool/name"),
            false => ("/spec/claimRef/name", "/spec/poolRef/name"),
        }
    }

    /// The name of the address object `claim` is served with, once it is.
    pub fn served_by(self, claim: &DynamicObject) -> Option<&str> {
        text(claim, self.claim_address_name()).filter(|name| !name.is_empty())
    }

    /// The name of the pool `claim` asks for.
    pub fn claim_pool(self, claim: &DynamicObject) -> Option<&str> {
        text(claim, self.claim_pool_name())
    }

    /// What an address object holds: its address, its claim's name and its pool's name.
    pub fn held(self, address: &DynamicObject) -> Option<Held<'_>> {
        let (claim, pool) = self.address_claim_and_pool();
        Some(Held {
            address: text(address, "/spec/address")?.parse().ok()?,
            claim: text(address, claim)?,
            pool: text(address, pool)?,
        })
    }

    /// Whether a provider has taken the pool up: a CAPI pool counts its addresses in its
    /// status; a Metal3 pool, whose upstream status has no counts, carries its finalizer.
    pub fn taken_up(self, pool: &DynamicObject) -> bool {
        match self.metal3_pool() {
            true => pool
                .metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| !f.is_empty()),
            false => pool.data.pointer("/status/ipAddresses").is_some(),
        }
    }
}

/// What one address object holds.
pub struct Held<'a> {
    pub address: IpAddr,
    pub claim: &'a str,
    pub pool: &'a str,
}

fn text(object: &DynamicObject, field: Field) -> Option<&str> {
    object.data.pointer(field).and_then(Value::as_str)
}

fn object(resource: &ApiResource, name: &str, body: Value) -> DynamicObject {
    DynamicObject::new(name, resource).data(body)
}
