//! The claim and address kinds a pool serves, behind one interface: a CAPI IPAddressClaim or a
//! Metal3 IPClaim, answered by a CAPI IPAddress or a Metal3 IPAddress.

use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio::time::Instant;

use super::Context;
use super::intent::{ClaimId, Refusal};
use crate::alloc::AllocError;
use crate::api::capi::{self, IPAddress, IPAddressClaim, LocalObjectName};
use crate::api::metal3_ipam::{self, IPClaim, Metal3IPAddress};
use crate::client::deadline::Deadline;
use crate::runtime::cached::{AddressApi, AddressObject};
use crate::runtime::error::{Call, Error, Verb, object_of};
use crate::runtime::objects::{self, FinalizerPatch};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClaimKind {
    /// `ipam.cluster.x-k8s.io` IPAddressClaim, answered by an IPAddress of that group.
    Capi,
    /// `ipam.metal3.io` IPClaim, answered by a Metal3 IPAddress.
    Metal3,
}

#[derive(Clone, Debug)]
pub enum AnyClaim {
    Capi(Arc<IPAddressClaim>),
    Metal3(Arc<IPClaim>),
}

/// What a claim's status should say after a reconcile.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Allocated {
        address_name: String,
        /// As people read it (a prefix pool's sub-prefix with its length).
        address: String,
    },
    Refused {
        refusal: Refusal,
        pool: String,
        spec_error: Option<String>,
    },
    /// The address object could not be written.
    Failed(String),
}

impl AnyClaim {
    pub fn meta(&self) -> &ObjectMeta {
        match self {
            AnyClaim::Capi(c) => c.meta(),
            AnyClaim::Metal3(c) => c.meta(),
        }
    }

    pub fn kind(&self) -> ClaimKind {
        match self {
            AnyClaim::Capi(_) => ClaimKind::Capi,
            AnyClaim::Metal3(_) => ClaimKind::Metal3,
        }
    }

    pub fn name(&self) -> String {
        self.meta().name.clone().unwrap_or_default()
    }

    pub fn namespace(&self) -> String {
        self.meta().namespace.clone().unwrap_or_default()
    }

    pub fn id(&self) -> Option<ClaimId> {
        Some(ClaimId {
            uid: self.meta().uid.clone()?,
            namespace: self.meta().namespace.clone()?,
            name: self.meta().name.clone()?,
        })
    }

    /// The `ipAddress` annotation (Metal3's, honoured on both kinds).
    pub fn requested(&self) -> Option<String> {
        self.meta()
            .annotations
            .as_ref()?
            .get(metal3_ipam::REQUESTED_ADDRESS_ANNOTATION)
            .cloned()
    }

    /// The claim's own Cluster (CAPI claims only; a Metal3 claim follows its pool's).
    pub fn cluster_name(&self) -> Option<&str> {
        match self {
            AnyClaim::Capi(c) => objects::cluster_name(c.spec.cluster_name.as_deref(), c.meta()),
            AnyClaim::Metal3(_) => None,
        }
    }

    pub fn deleting(&self) -> bool {
        self.meta().deletion_timestamp.is_some()
    }

    /// `<Kind> <namespace>/<name>`, for logs.
    pub fn describe(&self) -> String {
        match self {
            AnyClaim::Capi(c) => crate::runtime::cache::describe(&**c),
            AnyClaim::Metal3(c) => crate::runtime::cache::describe(&**c),
        }
    }

    /// The UID of the claim of `kind` named `namespace/name` on the server now, if it exists.
    pub async fn fetch(
        ctx: &Context,
        kind: ClaimKind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<String>, Error> {
        let meta = match kind {
            ClaimKind::Capi => {
                let api = Api::<IPAddressClaim>::namespaced(ctx.client.clone(), namespace);
                let found = api.get_metadata_opt(name).await;
                found.call(Verb::Get, &api, name)?.map(|m| m.metadata)
            }
            ClaimKind::Metal3 => {
                let api = Api::<IPClaim>::namespaced(ctx.client.clone(), namespace);
                let found = api.get_metadata_opt(name).await;
                found.call(Verb::Get, &api, name)?.map(|m| m.metadata)
            }
        };
        Ok(meta.and_then(|m| m.uid))
    }

    /// Makes `finalizer` present on the claim or absent from it.
    pub async fn set_finalizer(
        &self,
        ctx: &Context,
        finalizer: &str,
        present: bool,
    ) -> Result<FinalizerPatch, Error> {
        let ns = self.namespace();
        match self {
            AnyClaim::Capi(c) => {
                let api = Api::namespaced(ctx.client.clone(), &ns);
                objects::set_finalizer(&api, &**c, finalizer, present).await
            }
            AnyClaim::Metal3(c) => {
                let api = Api::namespaced(ctx.client.clone(), &ns);
                objects::set_finalizer(&api, &**c, finalizer, present).await
            }
        }
    }

    /// Writes the outcome in the claim's own terms: the contract's Ready condition on a CAPI
    /// claim, upstream's `status.address` and `errorMessage` strings on a Metal3 claim.
    /// Writes the claim's status for `outcome`; false when it already said so.
    pub async fn write_status(&self, ctx: &Context, outcome: &Outcome) -> Result<bool, Error> {
        let ns = self.namespace();
        let patch = match self {
            AnyClaim::Capi(claim) => capi_status_patch(claim, outcome),
            AnyClaim::Metal3(claim) => metal3_status_patch(claim, outcome),
        };
        let Some(patch) = patch else {
            return Ok(false);
        };
        match self {
            AnyClaim::Capi(c) => {
                let api = Api::<IPAddressClaim>::namespaced(ctx.client.clone(), &ns);
                objects::merge_status(&api, &c.name_any(), patch).await?;
            }
            AnyClaim::Metal3(c) => {
                let api = Api::<IPClaim>::namespaced(ctx.client.clone(), &ns);
                objects::merge_status(&api, &c.name_any(), patch).await?;
            }
        }
        Ok(true)
    }

    /// The name of the address object the claim's status names, if it names one.
    pub fn status_address_name(&self) -> Option<String> {
        match self {
            AnyClaim::Capi(c) => Some(c.status.as_ref()?.address_ref.as_ref()?.name.clone()),
            AnyClaim::Metal3(c) => c.status.as_ref()?.address.as_ref()?.name.clone(),
        }
        .filter(|name| !name.is_empty())
    }

    /// The claim's address object read from the server, when its name is known without a list:
    /// the one its status names, else (a CAPI claim) the one named after it, as CAPI pools name
    /// them. A Metal3 pool names its objects after the address: a claim whose status names none
    /// has no name to read.
    pub async fn fetch_address(&self, ctx: &Context) -> Result<Option<AnyAddress>, FetchError> {
        let named_after_claim = match self {
            AnyClaim::Capi(c) => {
                (c.spec.pool_ref.api_group != metal3_ipam::GROUP).then(|| c.name_any())
            }
            AnyClaim::Metal3(_) => None,
        };
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
        match self {
            AnyClaim::Capi(_) => {
                let api = Api::<IPAddress>::namespaced(ctx.client.clone(), &ns);
                let found = objects::get_optional(&api, name).await?;
                Ok(found.as_ref().and_then(AnyAddress::capi))
            }
            AnyClaim::Metal3(_) => {
                let api = Api::<Metal3IPAddress>::namespaced(ctx.client.clone(), &ns);
                let found = objects::get_optional(&api, name).await?;
                Ok(found.as_ref().and_then(AnyAddress::metal3))
            }
        }
    }

    /// The claim as an Event's `regarding`.
    pub fn object_ref(&self) -> k8s_openapi::api::core::v1::ObjectReference {
        match self {
            AnyClaim::Capi(c) => c.object_ref(&()),
            AnyClaim::Metal3(c) => c.object_ref(&()),
        }
    }
}

fn ledger_full_message(pool: &str, bytes: usize) -> String {
    format!(
        "{pool} hands out no new address: its allocation record takes {} KiB of the {} KiB it may, because its addresses are scattered over a vast space (requested addresses across many /64s); release addresses, or serve further claims from another pool",
        bytes / 1024,
        super::ledger::MAX_BITMAP_BYTES / 1024
    )
}

fn not_handed_message(pool: &str, address: &std::net::IpAddr, why: &str) -> String {
    format!(
        "the claim's address object names {address}, which {pool} did not hand to this claim ({why}): bitpool did not make that object; delete it and the claim is served"
    )
}

fn fenced_message(pool: &str, until: &str) -> String {
    format!(
        "{pool} rebuilt its allocation record from its address objects; new addresses are handed out from {until}, when nothing can still be in flight"
    )
}

/// The Ready condition's reason and message for a refusal (the contract's three reasons).
fn capi_reason(outcome: &Outcome) -> (&'static str, String) {
    match outcome {
        Outcome::Refused {
            refusal: Refusal::PoolInvalid,
            pool,
            spec_error,
        } => (
            capi::reasons::POOL_NOT_READY,
            format!(
                "{pool} is not ready: {}",
                spec_error.as_deref().unwrap_or("invalid spec")
            ),
        ),
        Outcome::Refused {
            refusal: Refusal::Alloc(AllocError::Exhausted),
            pool,
            ..
        } => (
            capi::reasons::POOL_EXHAUSTED,
            format!("{pool} has no free address; the claim is retried when one is released"),
        ),
        Outcome::Refused {
            refusal: Refusal::Alloc(e),
            ..
        } => (capi::reasons::ALLOCATION_FAILED, e.to_string()),
        Outcome::Refused {
            refusal: Refusal::Fenced { until },
            pool,
            ..
        } => (capi::reasons::POOL_NOT_READY, fenced_message(pool, until)),
        Outcome::Refused {
            refusal: Refusal::Paused,
            pool,
            ..
        } => (capi::reasons::POOL_NOT_READY, paused_message(pool)),
        Outcome::Refused {
            refusal: Refusal::Deferred,
            pool,
            ..
        } => (
            capi::reasons::POOL_NOT_READY,
            format!("{pool} is serving earlier claims; this one is next"),
        ),
        Outcome::Refused {
            refusal: Refusal::LedgerFull { bytes },
            pool,
            ..
        } => (
            capi::reasons::POOL_EXHAUSTED,
            ledger_full_message(pool, *bytes),
        ),
        Outcome::Refused {
            refusal: Refusal::NotHanded { address, why },
            pool,
            ..
        } => (
            capi::reasons::ALLOCATION_FAILED,
            not_handed_message(pool, address, why),
        ),
        Outcome::Failed(message) => (capi::reasons::ALLOCATION_FAILED, message.clone()),
        Outcome::Allocated { .. } => ("AddressAllocated", String::new()),
    }
}

fn capi_status_patch(claim: &IPAddressClaim, outcome: &Outcome) -> Option<serde_json::Value> {
    let mut status = claim.status.clone().unwrap_or_default();
    let condition = match outcome {
        Outcome::Allocated {
            address_name,
            address,
        } => {
            status.address_ref = Some(LocalObjectName {
                name: address_name.clone(),
            });
            objects::condition(
                capi::READY_CONDITION,
                true,
                "AddressAllocated",
                format!("allocated {address}"),
                claim.meta().generation,
            )
        }
        other => {
            let (reason, message) = capi_reason(other);
            objects::condition(
                capi::READY_CONDITION,
                false,
                reason,
                message,
                claim.meta().generation,
            )
        }
    };
    let ref_changed =
        claim.status.as_ref().and_then(|s| s.address_ref.as_ref()) != status.address_ref.as_ref();
    let condition_changed = objects::set_condition(&mut status.conditions, condition);
    (ref_changed || condition_changed)
        .then(|| capi::claim_status_patch(status.address_ref.as_ref(), &status.conditions))
}

fn paused_message(pool: &str) -> String {
    format!(
        "{pool} is paused (annotation {}): it hands out no address until the annotation is removed",
        crate::api::labels::PAUSED
    )
}

/// Upstream's `errorMessage` strings, which existing tooling matches on.
fn metal3_error(outcome: &Outcome) -> Option<String> {
    Some(match outcome {
        Outcome::Allocated { .. } => return None,
        Outcome::Refused {
            refusal: Refusal::PoolInvalid,
            pool,
            spec_error,
        } => {
            format!(
                "{pool} is not ready: {}",
                spec_error.as_deref().unwrap_or("invalid spec")
            )
        }
        Outcome::Refused {
            refusal: Refusal::Fenced { until },
            pool,
            ..
        } => fenced_message(pool, until),
        // Neither is a failure, and Metal3 consumers read any errorMessage as one.
        Outcome::Refused {
            refusal: Refusal::Deferred | Refusal::Paused,
            ..
        } => return None,
        Outcome::Refused {
            refusal: Refusal::LedgerFull { bytes },
            pool,
            ..
        } => ledger_full_message(pool, *bytes),
        Outcome::Refused {
            refusal: Refusal::NotHanded { address, why },
            pool,
            ..
        } => not_handed_message(pool, address, why),
        Outcome::Refused {
            refusal: Refusal::Alloc(e),
            ..
        } => match e {
            AllocError::Exhausted => "Exhausted IP Pools".into(),
            AllocError::RequestedUnparseable { value } => {
                format!("Invalid ipAddress annotation {value:?}: not a valid IP address")
            }
            AllocError::RequestedNotASubPrefix { value, length } => {
                format!("Invalid ipAddress annotation {value:?}: not a /{length} sub-prefix")
            }
            AllocError::ConflictsWithPreAllocation { .. } => {
                "PreAllocation and requested ip address are conflicting".into()
            }
            AllocError::RequestedOutsidePool { .. }
            | AllocError::RequestedInUse { .. }
            | AllocError::RequestedPreallocated { .. } => "Requested IP not available".into(),
            AllocError::PreAllocatedInUse { .. } => "Pre-allocated IP not available".into(),
            AllocError::PreAllocationOutOfBounds { .. } => "Pre-allocated IP out of bounds".into(),
        },
        // Upstream's words first, which tooling matches; then what exactly is wrong.
        Outcome::Failed(reason) => {
            format!("Failed to create associated IPAddress object: {reason}")
        }
    })
}

fn metal3_status_patch(claim: &IPClaim, outcome: &Outcome) -> Option<serde_json::Value> {
    let current = claim.status.clone().unwrap_or_default();
    let address = match outcome {
        Outcome::Allocated { address_name, .. } => Some(ObjectReference {
            name: Some(address_name.clone()),
            namespace: claim.namespace(),
            ..Default::default()
        }),
        _ => current.address.clone(),
    };
    let error = metal3_error(outcome);
    let unchanged = current.error_message == error
        && current.address.as_ref().and_then(|a| a.name.as_ref())
            == address.as_ref().and_then(|a| a.name.as_ref());
    (!unchanged).then(|| json!({ "status": { "address": address, "errorMessage": error } }))
}

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
            AddressApi::Capi => ClaimKind::Capi,
            AddressApi::Metal3 => ClaimKind::Metal3,
        }
    }

    /// The pool the object says it is from.
    pub fn pool_key(&self) -> Option<super::key::PoolKey> {
        super::key::PoolKey::of_ref(&self.pool, &self.meta.namespace)
            .filter(|key| !key.name.is_empty())
    }

    /// Whether the object says it is from the pool `key`.
    pub fn is_of(&self, key: &super::key::PoolKey) -> bool {
        key.is_named_by(&self.pool, Some(&self.meta.namespace))
    }

    pub fn name(&self) -> String {
        self.meta.name.to_string()
    }

    pub fn namespace(&self) -> &str {
        &self.meta.namespace
    }

    pub fn uid(&self) -> String {
        self.meta.uid.to_string()
    }

    pub fn deleting(&self) -> bool {
        self.meta.deleted.is_some()
    }

    pub fn ip(&self) -> Option<IpAddr> {
        self.address.parse().ok()
    }

    /// `<Kind> <namespace>/<name>`, for logs.
    pub fn describe(&self) -> String {
        let kind = match self.api {
            AddressApi::Capi => "IPAddress",
            AddressApi::Metal3 => "IPAddress.ipam.metal3.io",
        };
        format!("{kind} {}/{}", self.meta.namespace, self.meta.name)
    }

    /// The UID of the claim it was created for (from its owner references).
    pub fn claim_uid(&self) -> Option<String> {
        let kind = match self.api {
            AddressApi::Capi => "IPAddressClaim",
            AddressApi::Metal3 => "IPClaim",
        };
        self.meta
            .owners
            .iter()
            .find(|o| &*o.kind == kind)
            .map(|o| o.uid.to_string())
    }

    /// The kind of claim it answers, and that claim's name.
    pub fn claim(&self) -> (ClaimKind, String) {
        (self.claim_kind(), self.claim.to_string())
    }

    /// Merge-patches the object (its metadata).
    pub async fn merge_patch(&self, ctx: &Context, patch: serde_json::Value) -> Result<(), Error> {
        let (ns, name) = (self.namespace(), &*self.meta.name);
        match self.api {
            AddressApi::Capi => {
                let api = Api::<IPAddress>::namespaced(ctx.client.clone(), ns);
                objects::merge_patch(&api, name, patch).await
            }
            AddressApi::Metal3 => {
                let api = Api::<Metal3IPAddress>::namespaced(ctx.client.clone(), ns);
                objects::merge_patch(&api, name, patch).await
            }
        }
    }

    /// Removes `finalizer`, deletes the object, and reports whether it is gone.
    pub async fn delete(&self, ctx: &Context, finalizer: &str) -> Result<bool, Error> {
        let (ns, name) = (self.namespace(), &*self.meta.name);
        match self.api {
            AddressApi::Capi => {
                let api = Api::<IPAddress>::namespaced(ctx.client.clone(), ns);
                delete_with(&api, name, finalizer).await
            }
            AddressApi::Metal3 => {
                let api = Api::<Metal3IPAddress>::namespaced(ctx.client.clone(), ns);
                delete_with(&api, name, finalizer).await
            }
        }
    }
}

async fn delete_with<K>(api: &Api<K>, name: &str, finalizer: &str) -> Result<bool, Error>
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
        let claim_uid = claim.meta().uid.as_deref();
        let owned_by_claim = |meta: &ObjectMeta| {
            meta.owner_references
                .iter()
                .flatten()
                .any(|o| Some(o.uid.as_str()) == claim_uid)
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

async fn create_or_compare<K>(
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
