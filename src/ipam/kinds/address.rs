//! The address objects of either API behind one type: read, deleted, and created for a claim.

use std::net::IpAddr;
use std::sync::Arc;

use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::{Resource, ResourceExt};
use tokio::time::Instant;

use crate::api::capi::IPAddress;
use crate::api::metal3_ipam::{self, Metal3IPAddress};
use crate::client::deadline::Deadline;
use crate::ipam::Context;
use crate::runtime::cached::{AddressObject, IpamApi, Uid};
use crate::runtime::error::{Call, Error, Verb, object_of};
use crate::runtime::objects::{self, FinalizerPatch};

use super::claim::{AnyClaim, ClaimKind};

/// Why a claim's address object could not be read by name.
#[derive(Debug)]
pub enum FetchError {
    /// The name is not known without listing the pool's objects.
    NameUnknown,
    Api(Error),
}

/// An existing address object of either API, as the caches hold it.
#[derive(Clone, Debug, PartialEq)]
pub struct AnyAddress(Arc<AddressObject>);

impl From<Arc<AddressObject>> for AnyAddress {
    fn from(object: Arc<AddressObject>) -> Self {
        Self(object)
    }
}

impl std::ops::Deref for AnyAddress {
    type Target = AddressObject;
    fn deref(&self) -> &AddressObject {
        &self.0
    }
}

impl AnyAddress {
    /// A CAPI IPAddress read from the server; `None` without a name or namespace.
    pub fn capi(object: &IPAddress) -> Option<Self> {
        AddressObject::of_capi(object).map(|a| Self(Arc::new(a)))
    }

    /// A Metal3 IPAddress read from the server; `None` without a name or namespace.
    pub fn metal3(object: &Metal3IPAddress) -> Option<Self> {
        AddressObject::of_metal3(object).map(|a| Self(Arc::new(a)))
    }

    /// The kind of claim it answers.
    pub fn claim_kind(&self) -> ClaimKind {
        match self.api {
            IpamApi::Capi => ClaimKind::Capi,
            IpamApi::Metal3 => ClaimKind::Metal3,
        }
    }

    /// The pool the object says it is from.
    pub fn pool_key(&self) -> Option<crate::ipam::key::PoolKey> {
        crate::ipam::key::PoolKey::of_ref(self.pool(), self.meta.namespace())
            .filter(|key| !key.name.is_empty())
    }

    /// Whether the object says it is from the pool `key`.
    pub fn is_of(&self, key: &crate::ipam::key::PoolKey) -> bool {
        key.is_named_by(self.pool(), Some(self.meta.namespace()))
    }

    /// The object's name.
    pub fn name(&self) -> String {
        self.meta.name.to_string()
    }

    /// The object's namespace.
    pub fn namespace(&self) -> &str {
        self.meta.namespace()
    }

    /// The object's UID.
    pub fn uid(&self) -> String {
        self.meta.uid.to_string()
    }

    /// Whether the object is being deleted.
    pub fn deleting(&self) -> bool {
        self.meta.is_deleted()
    }

    /// The address the object holds, if it parses.
    pub fn ip(&self) -> Option<IpAddr> {
        self.address.parse().ok()
    }

    /// `<Kind> <namespace>/<name>`, for logs.
    pub fn describe(&self) -> String {
        let kind = match self.api {
            IpamApi::Capi => "IPAddress",
            IpamApi::Metal3 => "IPAddress.ipam.metal3.io",
        };
        format!("{kind} {}/{}", self.meta.namespace(), self.meta.name)
    }

    /// The UID of the claim it was created for (from its owner references).
    pub fn claim_uid(&self) -> Option<&Uid> {
        let kind = match self.api {
            IpamApi::Capi => "IPAddressClaim",
            IpamApi::Metal3 => "IPClaim",
        };
        self.meta
            .owners()
            .find(|o| o.kind() == kind)
            .map(|o| &o.uid)
    }

    /// The kind of claim it answers, and that claim's name.
    pub fn claim(&self) -> (ClaimKind, String) {
        (self.claim_kind(), self.claim.to_string())
    }

    /// Merge-patches the object (its metadata).
    pub async fn merge_patch(&self, ctx: &Context, patch: serde_json::Value) -> Result<(), Error> {
        let (ns, name) = (self.namespace(), &*self.meta.name);
        match self.api {
            IpamApi::Capi => {
                let api = Api::<IPAddress>::namespaced(ctx.client.clone(), ns);
                objects::merge_patch(&api, name, patch).await
            }
            IpamApi::Metal3 => {
                let api = Api::<Metal3IPAddress>::namespaced(ctx.client.clone(), ns);
                objects::merge_patch(&api, name, patch).await
            }
        }
    }

    /// Removes `finalizer`, deletes the object, and reports whether it is gone.
    pub async fn delete(&self, ctx: &Context, finalizer: &str) -> Result<bool, Error> {
        let (ns, name) = (self.namespace(), &*self.meta.name);
        match self.api {
            IpamApi::Capi => {
                let api = Api::<IPAddress>::namespaced(ctx.client.clone(), ns);
                delete_with(&api, name, finalizer).await
            }
            IpamApi::Metal3 => {
                let api = Api::<Metal3IPAddress>::namespaced(ctx.client.clone(), ns);
                delete_with(&api, name, finalizer).await
            }
        }
    }
}

pub(super) async fn delete_with<K>(api: &Api<K>, name: &str, finalizer: &str) -> Result<bool, Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    // Deleting first answers with the object as it now is (finalizers hold it), so the finalizer
    // patch needs no read of its own: two round trips, not three.
    let held = match api.delete(name, &DeleteParams::background()).await {
        // A status: the object is gone.
        Ok(either::Either::Right(_)) => return Ok(true),
        Ok(either::Either::Left(held)) => held,
        Err(kube::Error::Api(status)) if status.is_not_found() => return Ok(true),
        Err(e) => return Err(Error::api(Verb::Delete, object_of(api, name), e)),
    };
    if !objects::has_finalizer(held.meta(), finalizer) {
        // Another finalizer holds it: not bitpool's to release.
        return Ok(false);
    }
    let remaining = held.finalizers().len() - 1;
    match objects::remove_finalizer(api, &held, finalizer).await? {
        FinalizerPatch::Done => Ok(remaining == 0),
        FinalizerPatch::Stale => Ok(false),
    }
}

/// An address object to create.
#[derive(Clone, Debug)]
pub enum NewAddress {
    Capi(Box<IPAddress>),
    Metal3(Box<Metal3IPAddress>),
}

/// What creating an address object found.
pub enum Created {
    /// It exists with the leased address, for this claim.
    Confirmed,
    /// The claim's own object already exists, with another address.
    Own(AnyAddress),
    /// An object of that name already holds something else; the message says what.
    Conflict(String),
}

impl NewAddress {
    /// The name the object is created with.
    pub fn name(&self) -> String {
        match self {
            NewAddress::Capi(a) => a.name_any(),
            NewAddress::Metal3(a) => a.name_any(),
        }
    }

    /// Creates the object for `claim`, abandoned at `deadline` (by the client and the API
    /// server); an existing one of that name is compared with it.
    pub async fn create(
        &self,
        ctx: &Context,
        claim: &AnyClaim,
        deadline: Instant,
    ) -> Result<Created, Error> {
        let claim_uid = claim.meta.uid.to_string();
        let owned_by_claim = |meta: &ObjectMeta| {
            !claim_uid.is_empty()
                && meta
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.uid == claim_uid)
        };
        match self {
            NewAddress::Capi(object) => {
                let api: Api<IPAddress> =
                    Api::namespaced(ctx.client.clone(), &object.namespace().unwrap_or_default());
                create_or_compare(&api, &**object, deadline, |existing: &IPAddress| {
                    let same_claim = existing.spec.pool_ref == object.spec.pool_ref
                        && existing.spec.claim_ref == object.spec.claim_ref;
                    match existing.spec.address.parse() {
                        _ if !same_claim => None,
                        _ if existing.spec.address == object.spec.address => {
                            Some(Created::Confirmed)
                        }
                        Ok::<IpAddr, _>(_) if owned_by_claim(existing.meta()) => {
                            AnyAddress::capi(existing).map(Created::Own)
                        }
                        _ => None,
                    }
                })
                .await
            }
            NewAddress::Metal3(object) => {
                let api: Api<Metal3IPAddress> =
                    Api::namespaced(ctx.client.clone(), &object.namespace().unwrap_or_default());
                create_or_compare(&api, &**object, deadline, |existing: &Metal3IPAddress| {
                    (existing.spec.address == object.spec.address
                        && existing.spec.pool.name == object.spec.pool.name
                        && existing.spec.claim.name == object.spec.claim.name)
                        .then_some(Created::Confirmed)
                })
                .await
            }
        }
    }
}

pub(super) async fn create_or_compare<K>(
    api: &Api<K>,
    object: &K,
    deadline: Instant,
    compare: impl Fn(&K) -> Option<Created>,
) -> Result<Created, Error>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let name = object.meta().name.clone().unwrap_or_default();
    let failed = |e| Error::api(Verb::Create, object_of(api, &name), e);
    let body = serde_json::to_vec(object).map_err(|e| failed(kube::Error::SerdeError(e)))?;
    let mut request = kube::core::Request::new(api.resource_url())
        .create(&PostParams::default(), body)
        .map_err(|e| failed(kube::Error::BuildRequest(e)))?;
    request.extensions_mut().insert(Deadline(deadline));
    match api.clone().into_client().request::<K>(request).await {
        Ok(_) => Ok(Created::Confirmed),
        Err(kube::Error::Api(status)) if status.is_already_exists() => {
            let existing = api.get(&name).await.call(Verb::Get, api, &name)?;
            Ok(compare(&existing).unwrap_or_else(|| {
                Created::Conflict(format!(
                    "{} {name} already exists for another claim or pool",
                    K::kind(&())
                ))
            }))
        }
        Err(e) => Err(failed(e)),
    }
}

/// Reading a claim's address object from the server.
impl AnyClaim {
    /// The claim's address object read from the server, when its name is known without a list:
    /// the one its status names, else (a CAPI claim) the one named after it, as CAPI pools name
    /// them. A Metal3 pool names its objects after the address: a claim whose status names none
    /// has no name to read.
    pub async fn fetch_address(&self, ctx: &Context) -> Result<Option<AnyAddress>, FetchError> {
        let named_after_claim = (self.api == IpamApi::Capi
            && *self.pool().api_group != *metal3_ipam::GROUP)
            .then(|| self.name());
        let name = self
            .status_address_name()
            .or(named_after_claim)
            .ok_or(FetchError::NameUnknown)?;
        self.fetch_address_named(ctx, &name)
            .await
            .map_err(FetchError::Api)
    }

    /// The address object `name` of the claim's kind in its namespace, read from the server.
    pub async fn fetch_address_named(
        &self,
        ctx: &Context,
        name: &str,
    ) -> Result<Option<AnyAddress>, Error> {
        let ns = self.namespace();
        match self.api {
            IpamApi::Capi => {
                let api = Api::<IPAddress>::namespaced(ctx.client.clone(), &ns);
                let found = objects::get_optional(&api, name).await?;
                Ok(found.as_ref().and_then(AnyAddress::capi))
            }
            IpamApi::Metal3 => {
                let api = Api::<Metal3IPAddress>::namespaced(ctx.client.clone(), &ns);
                let found = objects::get_optional(&api, name).await?;
                Ok(found.as_ref().and_then(AnyAddress::metal3))
            }
        }
    }
}
