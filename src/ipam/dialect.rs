//! What a pool kind brings to the engine ([`PoolDialect`]), what its status is written from,
//! and the pool's address objects read fresh from the server.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, ObjectMeta};
use kube::{Client, Resource, ResourceExt};

use crate::alloc::{self, AddressSpace, Lease};
use crate::api::{capi, capi_pools, metal3_ipam};
use crate::ipam::Context;
use crate::ipam::duplicates::SharedAddress;
use crate::ipam::key::{PoolKey, PoolKind};
use crate::ipam::kinds::{AnyAddress, AnyClaim, ClaimKind, NewAddress};
use crate::ipam::ledger::Ledger;
use crate::ipam::ledger::intent::Refusal;
use crate::ipam::overlaps::{Covered, Overlap};
use crate::runtime::cached::{AddressObject, ClaimObject, IpamApi};
use crate::runtime::error::{Call, Error, Verb};
use crate::runtime::index::Index;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// What a pool's status reports, taken from its address space after a transaction.
pub struct Usage {
    pub counts: alloc::Counts,
    /// A few of the allocated addresses the pool no longer contains.
    pub outside: Vec<IpAddr>,
}

impl Usage {
    /// What the status reports of `space`.
    pub fn of(space: &AddressSpace) -> Self {
        let counts = space.counts();
        let outside = if counts.out_of_range > 0 {
            space
                .used_addresses()
                .filter(|a| !space.contains(*a))
                .take(5)
                .collect()
        } else {
            Vec::new()
        };
        Self { counts, outside }
    }
}

/// Everything a pool's status is written from.
pub struct Report<'a> {
    pub usage: Option<&'a Usage>,
    pub ledger: &'a Ledger,
    pub spec_error: Option<&'a str>,
    /// Claim name → address, for the claims that hold one; empty unless the dialect's
    /// [`PoolStatus::STATUS_NAMES_HOLDERS`].
    pub holders: &'a BTreeMap<(ClaimKind, Arc<str>), IpAddr>,
    /// Addresses the pool's objects hold for more than one claim.
    pub shared: &'a [SharedAddress],
    /// Other pools whose addresses meet this one's.
    pub overlaps: &'a [Overlap],
    /// How many namespaces the pool's `namespaceSelector` selects.
    pub reach: super::tenancy::Reach,
}

/// What a pool kind is: its kind and key, its address space and what its objects hold, and
/// which claims and address objects are its. Everything here is synchronous and pure over the
/// pool and the caches; the engine does the I/O.
pub trait PoolSpace:
    Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Serialize + Send + Sync + 'static
{
    /// The pool's finalizer: Cluster API's, which every kind but Metal3's IPPool has.
    const FINALIZER: &'static str = capi_pools::POOL_FINALIZER;
    const KIND: PoolKind;
    /// The address kinds this pool's addresses can be of. Only Metal3 IPPools hold Metal3
    /// IPAddresses, and a cluster that runs no Metal3 controller need not have their CRD.
    const ADDRESS_KINDS: AddressKinds = AddressKinds::Capi;
    /// Whether each claim's address object is named after the claim: then a create for a claim
    /// that has an object already meets it (409) whatever a cache shows, and the engine may
    /// serve new claims before the address objects are listed.
    const OBJECTS_NAMED_AFTER_CLAIMS: bool = true;

    fn key(&self) -> PoolKey {
        PoolKey {
            kind: Self::KIND,
            namespace: self.namespace(),
            name: self.name_any(),
        }
    }
    /// Where the pool's ledger lives: beside a namespaced pool, in the ledger namespace for a
    /// cluster-scoped one.
    fn ledger_namespace(&self, ctx: &Context) -> String {
        self.namespace()
            .unwrap_or_else(|| ctx.settings.ledger_namespace.clone())
    }
    /// What the pool's ledger is written for: the pool's UID, and for a pool whose space
    /// numbers something other than addresses, what gives the numbers their meaning.
    fn ledger_identity(&self) -> String {
        self.uid().unwrap_or_default()
    }
    /// Whether the watch caches hold every claim this kind's pools can have: their initial
    /// lists have arrived.
    fn claims_listed(ctx: &Context) -> bool {
        ctx.claims.is_ready()
            && (Self::ADDRESS_KINDS == AddressKinds::Capi || ctx.ipclaims.is_ready())
    }
    /// Whether the watch caches hold every address object this kind's pools can have: their
    /// initial lists have arrived.
    fn addresses_listed(ctx: &Context) -> bool {
        ctx.addresses.is_ready()
            && (Self::ADDRESS_KINDS == AddressKinds::Capi || ctx.metal3_addresses.is_ready())
    }
    /// The pool's address space, or why its spec is invalid.
    fn space(&self) -> Result<AddressSpace, String>;
    /// The addresses the pool hands out (none when its spec is invalid).
    fn covered(&self) -> Option<Covered> {
        self.space().ok().map(|space| Covered::of_space(&space))
    }
    /// What an address object holds, as the pool's space numbers it (the address itself,
    /// except in prefix pools).
    fn held(&self, address: &AnyAddress) -> Option<IpAddr> {
        address.ip()
    }
    /// A held address as people read it, in messages and events.
    fn show(&self, held: IpAddr) -> String {
        held.to_string()
    }
    /// The address `claim` asks for (its `ipAddress` annotation) in the space's terms, or why it
    /// names nothing the pool could hand out.
    fn requested(&self, claim: &AnyClaim) -> Result<Option<String>, alloc::AllocError> {
        Ok(claim.requested())
    }
    /// A refusal as people read it (addresses in the pool's own terms).
    fn explain(&self, refusal: Refusal) -> Refusal {
        refusal
    }
    /// Which namespaces' claims the pool serves (a cluster-scoped pool's `namespaceSelector`),
    /// or why its selector is not one.
    fn tenancy(&self) -> Result<super::tenancy::Tenancy, String> {
        Ok(super::tenancy::Tenancy::Everyone)
    }
    /// How long a released address stays reserved.
    fn reuse_grace(&self) -> Option<Duration> {
        None
    }
    /// Whether the pool is paused beyond its own annotation (Metal3: its Cluster).
    fn paused_by_cluster(&self, _ctx: &Context) -> bool {
        false
    }
    /// The claims naming this pool: by default the IPAddressClaims whose `poolRef` names it,
    /// as the Cluster API contract has it.
    fn claims(&self, ctx: &Context) -> Vec<AnyClaim> {
        let key = self.key();
        cached_claims(&ctx.claims, &key)
    }
    /// The pool's claims made or changed since the process began to watch, while the claims
    /// are still being listed ([`Index::arrivals_of`]).
    fn arriving_claims(&self, ctx: &Context) -> Vec<AnyClaim> {
        let key = self.key();
        of_pool(ctx.claims.arrivals_of(key.namespace.as_deref()), &key)
    }
    /// The pool's address objects, from the caches or `fresh` (read from the server): by
    /// default the IPAddresses whose `poolRef` names it.
    fn addresses(&self, ctx: &Context, fresh: Option<&FreshAddresses>) -> Vec<AnyAddress> {
        let key = self.key();
        match fresh {
            Some(fresh) => fresh
                .capi
                .iter()
                .filter(|a| a.is_of(&key))
                .cloned()
                .collect(),
            None => cached_addresses(&ctx.addresses, &key),
        }
    }
    /// The `preAllocations` key that names `claim`.
    fn preallocation_key(&self, claim: &AnyClaim) -> String {
        claim.name()
    }
}

/// How a pool kind's objects are named and written: the pool itself, its address objects, and
/// the finalizers on them.
pub trait PoolWrites: PoolSpace {
    /// An API through which this very object is read and patched.
    fn api_for(&self, client: Client) -> Api<Self>;
    /// A metadata patch the pool needs (labels and owners for its Cluster), if any.
    fn metadata_patch(&self, _ctx: &Context) -> Option<serde_json::Value> {
        None
    }
    /// The claim finalizer, per claim kind (by default the Cluster API contract's).
    fn claim_finalizer(_kind: ClaimKind) -> &'static str {
        capi_pools::CLAIM_FINALIZER
    }
    /// The address finalizer, per claim kind (by default the Cluster API contract's).
    fn address_finalizer(_kind: ClaimKind) -> &'static str {
        capi_pools::ADDRESS_FINALIZER
    }
    /// The address object `claim` gets for `lease`, or why none can be written.
    fn new_address(&self, claim: &AnyClaim, lease: &Lease) -> Result<NewAddress, String>;
    /// Why no address object of `family` could be written for `claim` (an invalid name), found
    /// before an address is allocated for it.
    fn address_name_problem(&self, _claim: &AnyClaim, _family: alloc::Family) -> Option<String> {
        None
    }
    /// The metadata an existing IPAddress of a CAPI `claim` must carry (owners, finalizer,
    /// cluster label), as [`Self::new_address`] writes it: an object made by hand or restored
    /// from a backup is given them, as upstream does. `None` for Metal3 claims.
    fn address_metadata(&self, claim: &AnyClaim, object: &AnyAddress) -> Option<ObjectMeta> {
        let (IpamApi::Capi, IpamApi::Capi) = (claim.api, object.api) else {
            return None;
        };
        // Only the metadata is kept: the lease's values do not matter.
        let lease = Lease {
            address: object.ip()?,
            prefix: 0,
            gateway: None,
            dns_servers: Vec::new(),
        };
        match self.new_address(claim, &lease).ok()? {
            NewAddress::Capi(address) => Some(address.metadata),
            NewAddress::Metal3(_) => None,
        }
    }
}

/// How a pool kind reports its status.
pub trait PoolStatus: PoolSpace {
    /// Whether the pool's status names every claim with its address ([`Report::holders`]):
    /// Metal3's `status.allocations`. Other pools' reconciles do not gather them.
    const STATUS_NAMES_HOLDERS: bool = false;
    /// The pool's status patch from `report`, or `None` when nothing changed.
    fn status_patch(&self, report: &Report) -> Option<serde_json::Value>;
}

/// Everything a pool kind brings to the engine: what it is, how its objects are written and how
/// its status is reported. Every type with the three is one.
pub trait PoolDialect: PoolSpace + PoolWrites + PoolStatus {}

impl<T: PoolSpace + PoolWrites + PoolStatus> PoolDialect for T {}

/// The claims of `cache` that name the pool `key` (a namespaced pool is named only from its
/// own namespace: only that one is read).
pub fn cached_claims(cache: &Index<ClaimObject>, key: &PoolKey) -> Vec<AnyClaim> {
    of_pool(cache.state_of(key.namespace.as_deref()), key)
}

/// Those of `claims` that name the pool `key`.
fn of_pool(claims: Vec<Arc<ClaimObject>>, key: &PoolKey) -> Vec<AnyClaim> {
    (claims.into_iter())
        .map(AnyClaim::from)
        .filter(|c| c.is_of(key))
        .collect()
}

/// The address objects of the pool `key` in `cache` (of its namespace, for a namespaced pool).
pub fn cached_addresses(cache: &Index<AddressObject>, key: &PoolKey) -> Vec<AnyAddress> {
    let of_pool = |a: &Arc<AddressObject>| key.is_named_by(a.pool(), Some(a.meta.namespace()));
    cache
        .state_of(key.namespace.as_deref())
        .into_iter()
        .filter(of_pool)
        .map(AnyAddress::from)
        .collect()
}

/// Address objects read from the server (not a cache), for decisions a stale cache must not make.
pub struct FreshAddresses {
    pub capi: Vec<AnyAddress>,
    pub metal3: Vec<AnyAddress>,
}

impl FreshAddresses {
    /// Both kinds.
    pub fn all(self) -> impl Iterator<Item = AnyAddress> {
        self.capi.into_iter().chain(self.metal3)
    }
}

/// Which address kinds a pool's addresses can be of, and so which are read for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressKinds {
    /// IPAddresses of the Cluster API contract only.
    Capi,
    /// Metal3 IPAddresses as well (Metal3 IPPools serve both claim kinds).
    CapiAndMetal3,
}

/// Every address object of `namespace` (all namespaces for `None`) of `kinds`, read from the
/// server. Metal3 pools are namespaced: there are no Metal3 addresses of a cluster-scoped pool.
pub async fn fresh_addresses(
    client: &kube::Client,
    namespace: Option<&str>,
    kinds: AddressKinds,
) -> Result<FreshAddresses, kube::Error> {
    listed_addresses(client, namespace, kinds, &Default::default()).await
}

/// [`fresh_addresses`] as `params` list them (at most `params.limit` of each kind, say).
pub async fn listed_addresses(
    client: &kube::Client,
    namespace: Option<&str>,
    kinds: AddressKinds,
    params: &kube::api::ListParams,
) -> Result<FreshAddresses, kube::Error> {
    let capi: Api<capi::IPAddress> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let capi = capi.list(params).await?.items;
    let metal3 = match (namespace, kinds) {
        (Some(ns), AddressKinds::CapiAndMetal3) => {
            Api::<metal3_ipam::Metal3IPAddress>::namespaced(client.clone(), ns)
                .list(params)
                .await?
                .items
        }
        _ => Vec::new(),
    };
    Ok(FreshAddresses {
        capi: capi.iter().filter_map(AnyAddress::capi).collect(),
        metal3: metal3.iter().filter_map(AnyAddress::metal3).collect(),
    })
}

/// `pool`'s address objects, read from the server rather than a cache.
pub async fn fresh_pool_addresses<P: PoolDialect>(
    pool: &P,
    ctx: &Context,
) -> Result<Vec<AnyAddress>, Error> {
    let key = pool.key();
    let fresh = fresh_addresses(&ctx.client, key.namespace.as_deref(), P::ADDRESS_KINDS)
        .await
        .call_on(Verb::List, format!("address objects of {}", key.describe()))?;
    Ok(pool.addresses(ctx, Some(&fresh)))
}

/// Each request's lease or refusal, by claim UID, as a transaction leaves them.
pub type Outcomes = BTreeMap<String, Result<Lease, Refusal>>;
