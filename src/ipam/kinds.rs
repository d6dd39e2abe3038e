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
use super::key::PoolKey;
use crate::alloc::AllocError;
use crate::api::capi::{self, IPAddress, IPAddressClaim, LocalObjectName};
use crate::api::metal3_ipam::{self, IPClaim, Metal3IPAddress};
use crate::client::deadline::Deadline;
use crate::runtime::cached::{AddressObject, ClaimObject, IpamApi, Uid};
use crate::runtime::error::{Call, Error, Verb, object_of};
use crate::runtime::objects::{self, FinalizerPatch};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClaimKind {
    /// `ipam.cluster.x-k8s.io` IPAddressClaim, answered by an IPAddress of that group.
    Capi,
    /// `ipam.metal3.io` IPClaim, answered by a Metal3 IPAddress.
    Metal3,
}

/// A claim of either API, as the caches hold it.
#[derive(Clone, Debug, PartialEq)]
pub struct AnyClaim(Arc<ClaimObject>);

impl From<Arc<ClaimObject>> for AnyClaim {
    fn from(object: Arc<ClaimObject>) -> Self {
        Self(object)
    }
}

impl std::ops::Deref for AnyClaim {
    type Target = ClaimObject;
    fn deref(&self) -> &ClaimObject {
        &self.0
    }
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
    /// An IPAddressClaim read from the server; `None` without a name or namespace.
    pub fn capi(object: &IPAddressClaim) -> Option<Self> {
        ClaimObject::of_capi(object).map(|c| Self(Arc::new(c)))
    }

    /// A Metal3 IPClaim read from the server; `None` without a name or namespace.
    pub fn metal3(object: &IPClaim) -> Option<Self> {
        ClaimObject::of_metal3(object).map(|c| Self(Arc::new(c)))
    }

    pub fn kind(&self) -> ClaimKind {
        match self.api {
            IpamApi::Capi => ClaimKind::Capi,
            IpamApi::Metal3 => ClaimKind::Metal3,
        }
    }

    pub fn name(&self) -> String {
        self.meta.name.to_string()
    }

    pub fn namespace(&self) -> String {
        self.meta.namespace.to_string()
    }

    /// The claim's UID; `None` before it has one.
    pub fn uid(&self) -> Option<String> {
        Some(self.meta.uid.to_string()).filter(|uid| !uid.is_empty())
    }

    pub fn id(&self) -> Option<ClaimId> {
        Some(ClaimId {
            uid: self.uid()?,
            namespace: self.namespace(),
            name: self.name(),
        })
    }

    /// The pool the claim names, if it is one bitpool serves.
    pub fn pool_key(&self) -> Option<PoolKey> {
        if self.pool_elsewhere {
            return None;
        }
        PoolKey::of_ref(&self.pool, &self.meta.namespace).filter(|key| !key.name.is_empty())
    }

    /// Whether the claim names the pool `key`.
    pub fn is_of(&self, key: &PoolKey) -> bool {
        !self.pool_elsewhere && key.is_named_by(&self.pool, Some(&self.meta.namespace))
    }

    /// Whether the claim's status already says it holds `address` (as the pool shows it)
    /// through the object `address_name`: writing that allocation would change nothing.
    pub fn shows_allocated(&self, address_name: &str, address: &str) -> bool {
        shows_allocated(self, address_name, address)
    }

    /// The `ipAddress` annotation (Metal3's, honoured on both kinds).
    pub fn requested(&self) -> Option<String> {
        self.requested_address().map(str::to_string)
    }

    /// The claim's own Cluster (CAPI claims only; a Metal3 claim follows its pool's): its
    /// `spec.clusterName`, else its cluster-name label.
    pub fn cluster_name(&self) -> Option<&str> {
        match self.api {
            IpamApi::Capi => (self.cluster_name.as_deref())
                .filter(|n| !n.is_empty())
                .or_else(|| self.meta.label(crate::api::labels::CLUSTER_NAME)),
            IpamApi::Metal3 => None,
        }
    }

    pub fn deleting(&self) -> bool {
        self.meta.deleted.is_some()
    }

    fn kind_name(&self) -> String {
        match self.api {
            IpamApi::Capi => IPAddressClaim::kind(&()).to_string(),
            IpamApi::Metal3 => IPClaim::kind(&()).to_string(),
        }
    }

    /// `<Kind> <namespace>/<name>`, for logs.
    pub fn describe(&self) -> String {
        format!(
            "{} {}/{}",
            self.kind_name(),
            self.meta.namespace,
            self.meta.name
        )
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
        let (ns, meta) = (self.namespace(), &self.meta);
        let listed = objects::Finalizers {
            name: &meta.name,
            resource_version: &meta.resource_version,
            current: meta.finalizers.iter().map(|f| &**f),
        };
        match self.api {
            IpamApi::Capi => {
                let api = Api::<IPAddressClaim>::namespaced(ctx.client.clone(), &ns);
                listed.set(&api, finalizer, present).await
            }
            IpamApi::Metal3 => {
                let api = Api::<IPClaim>::namespaced(ctx.client.clone(), &ns);
                listed.set(&api, finalizer, present).await
            }
        }
    }

    /// Writes the outcome in the claim's own terms: the contract's Ready condition on a CAPI
    /// claim, upstream's `status.address` and `errorMessage` strings on a Metal3 claim.
    /// Writes the claim's status for `outcome`; false when it already said so.
    pub async fn write_status(&self, ctx: &Context, outcome: &Outcome) -> Result<bool, Error> {
        let patch = match self.api {
            IpamApi::Capi => capi_status_patch(self, outcome),
            IpamApi::Metal3 => metal3_status_patch(self, outcome),
        };
        let Some(patch) = patch else {
            return Ok(false);
        };
        self.patch_status(ctx, patch).await?;
        Ok(true)
    }

    /// Merge-patches the claim's status.
    pub async fn patch_status(&self, ctx: &Context, patch: serde_json::Value) -> Result<(), Error> {
        let (ns, name) = (self.namespace(), &*self.meta.name);
        match self.api {
            IpamApi::Capi => {
                let api = Api::<IPAddressClaim>::namespaced(ctx.client.clone(), &ns);
                objects::merge_status(&api, name, patch).await
            }
            IpamApi::Metal3 => {
                let api = Api::<IPClaim>::namespaced(ctx.client.clone(), &ns);
                objects::merge_status(&api, name, patch).await
            }
        }
    }

    /// Deletes the claim (a claim already gone is no error).
    pub async fn delete(&self, ctx: &Context) -> Result<(), Error> {
        let (ns, name) = (self.namespace(), &*self.meta.name);
        match self.api {
            IpamApi::Capi => {
                let api = Api::<IPAddressClaim>::namespaced(ctx.client.clone(), &ns);
                objects::delete_ignoring_missing(&api, name).await
            }
            IpamApi::Metal3 => {
                let api = Api::<IPClaim>::namespaced(ctx.client.clone(), &ns);
                objects::delete_ignoring_missing(&api, name).await
            }
        }
    }

    /// The name of the address object the claim's status names, if it names one.
    pub fn status_address_name(&self) -> Option<String> {
        self.status_address().map(|name| name.to_string())
    }

    /// [`Self::status_address_name`], shared with the cache.
    pub fn status_address(&self) -> Option<&Arc<str>> {
        self.address.as_ref().filter(|name| !name.is_empty())
    }

    /// The claim's address object read from the server, when its name is known without a list:
    /// the one its status names, else (a CAPI claim) the one named after it, as CAPI pools name
    /// them. A Metal3 pool names its objects after the address: a claim whose status names none
    /// has no name to read.
    pub async fn fetch_address(&self, ctx: &Context) -> Result<Option<AnyAddress>, FetchError> {
        let named_after_claim = (self.api == IpamApi::Capi
            && *self.pool.api_group != *metal3_ipam::GROUP)
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

    /// A reference to the claim as its address object's owner; `None` before it has a UID.
    pub fn owner_reference(
        &self,
        controller: bool,
    ) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
        let reference = self.object_ref();
        Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: reference.api_version?,
                kind: reference.kind?,
                name: reference.name?,
                uid: reference.uid?,
                controller: Some(controller),
                block_owner_deletion: Some(true),
            },
        )
    }

    /// The claim's labels as Kubernetes spells them (`None` when it has none).
    pub fn labels(&self) -> Option<std::collections::BTreeMap<String, String>> {
        (!self.meta.labels.is_empty()).then(|| {
            (self.meta.labels.iter())
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
    }

    /// The claim as an Event's `regarding`.
    pub fn object_ref(&self) -> ObjectReference {
        let api_version = match self.api {
            IpamApi::Capi => IPAddressClaim::api_version(&()),
            IpamApi::Metal3 => IPClaim::api_version(&()),
        };
        ObjectReference {
            api_version: Some(api_version.to_string()),
            kind: Some(self.kind_name()),
            name: Some(self.name()),
            namespace: Some(self.namespace()),
            uid: Some(self.meta.uid.to_string()).filter(|uid| !uid.is_empty()),
            ..Default::default()
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
        Outcome::Refused {
            refusal:
                Refusal::NamespaceNotSelected {
                    namespace,
                    selector,
                },
            pool,
            ..
        } => (
            capi::reasons::NAMESPACE_NOT_SELECTED,
            not_selected_message(pool, namespace, selector),
        ),
        Outcome::Failed(message) => (capi::reasons::ALLOCATION_FAILED, message.clone()),
        Outcome::Allocated { .. } => (ALLOCATED_REASON, String::new()),
    }
}

/// The reason of a served CAPI claim's `Ready` condition.
const ALLOCATED_REASON: &str = "AddressAllocated";
/// Its message, before the address.
const ALLOCATED_MESSAGE: &str = "allocated ";

/// Whether `claim`'s status already says it holds `address` through the object `address_name`,
/// so that its status patch for that allocation would be `None`. Answered without building the
/// status: a reconcile asks it of every claim the pool serves.
fn shows_allocated(claim: &ClaimObject, address_name: &str, address: &str) -> bool {
    if claim.address.as_deref() != Some(address_name) {
        return false;
    }
    match claim.api {
        IpamApi::Metal3 => claim.error_message().is_none(),
        IpamApi::Capi => (claim.conditions.iter())
            .find(|c| &*c.head.type_ == capi::READY_CONDITION)
            .is_some_and(|c| {
                &*c.head.status == "True"
                    && &*c.head.reason == ALLOCATED_REASON
                    && c.message.strip_prefix(ALLOCATED_MESSAGE) == Some(address)
                    && c.observed_generation == claim.generation
            }),
    }
}

fn capi_status_patch(claim: &ClaimObject, outcome: &Outcome) -> Option<serde_json::Value> {
    let current = claim.address.as_deref().map(|name| LocalObjectName {
        name: name.to_string(),
    });
    let mut address_ref = current.clone();
    let mut conditions = claim.conditions();
    let condition = match outcome {
        Outcome::Allocated {
            address_name,
            address,
        } => {
            address_ref = Some(LocalObjectName {
                name: address_name.clone(),
            });
            objects::condition(
                capi::READY_CONDITION,
                true,
                ALLOCATED_REASON,
                format!("{ALLOCATED_MESSAGE}{address}"),
                claim.generation,
            )
        }
        other => {
            let (reason, message) = capi_reason(other);
            objects::condition(
                capi::READY_CONDITION,
                false,
                reason,
                message,
                claim.generation,
            )
        }
    };
    let ref_changed = current != address_ref;
    let condition_changed = objects::set_condition(&mut conditions, condition);
    (ref_changed || condition_changed)
        .then(|| capi::claim_status_patch(address_ref.as_ref(), &conditions))
}

/// Why a claim of `namespace` gets nothing from a pool whose selector leaves it out.
pub fn not_selected_message(pool: &str, namespace: &str, selector: &str) -> String {
    format!(
        "{pool} serves only namespaces its spec.namespaceSelector ({selector}) selects, and namespace {namespace} is not one: label the namespace, or claim from another pool"
    )
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
            refusal:
                Refusal::NamespaceNotSelected {
                    namespace,
                    selector,
                },
            pool,
            ..
        } => not_selected_message(pool, namespace, selector),
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
            // No upstream words for it: upstream hands such an address another entry's prefix.
            e @ AllocError::ReservedOutsidePool { .. } => e.to_string(),
        },
        // Upstream's words first, which tooling matches; then what exactly is wrong.
        Outcome::Failed(reason) => {
            format!("Failed to create associated IPAddress object: {reason}")
        }
    })
}

fn metal3_status_patch(claim: &ClaimObject, outcome: &Outcome) -> Option<serde_json::Value> {
    let current = claim.address.as_deref();
    let address_name = match outcome {
        Outcome::Allocated { address_name, .. } => Some(address_name.as_str()),
        _ => current,
    };
    let error = metal3_error(outcome);
    let unchanged = claim.error_message() == error.as_deref() && current == address_name;
    let address = address_name.map(|name| ObjectReference {
        name: Some(name.to_string()),
        namespace: Some(claim.meta.namespace.to_string()),
        ..Default::default()
    });
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
            IpamApi::Capi => ClaimKind::Capi,
            IpamApi::Metal3 => ClaimKind::Metal3,
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
            IpamApi::Capi => "IPAddress",
            IpamApi::Metal3 => "IPAddress.ipam.metal3.io",
        };
        format!("{kind} {}/{}", self.meta.namespace, self.meta.name)
    }

    /// The UID of the claim it was created for (from its owner references).
    pub fn claim_uid(&self) -> Option<&Uid> {
        let kind = match self.api {
            IpamApi::Capi => "IPAddressClaim",
            IpamApi::Metal3 => "IPClaim",
        };
        self.meta
            .owners
            .iter()
            .find(|o| &*o.kind == kind)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::capi::{IPAddressClaimSpec, IPAddressClaimStatus, IPPoolReference};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn claim(conditions: Vec<Condition>, address: Option<&str>) -> ClaimObject {
        let mut object = IPAddressClaim::new(
            "c",
            IPAddressClaimSpec {
                cluster_name: None,
                pool_ref: IPPoolReference {
                    name: "p".into(),
                    kind: "InClusterIPPool".into(),
                    api_group: capi::GROUP.into(),
                },
            },
        );
        object.metadata.namespace = Some("ns".into());
        object.status = Some(IPAddressClaimStatus {
            address_ref: address.map(|name| LocalObjectName { name: name.into() }),
            conditions,
            ..Default::default()
        });
        ClaimObject::of_capi(&object).expect("named and namespaced")
    }

    fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }
    }

    /// The status patch of a cached claim writes every condition it had (a merge patch replaces
    /// the list), and nothing when the claim already says so.
    #[test]
    fn a_status_patch_keeps_the_other_conditions() {
        let other = condition("Other", "False", "Elsewhere", "kept");
        let allocated = Outcome::Allocated {
            address_name: "c".into(),
            address: "10.0.0.4".into(),
        };
        let patch =
            capi_status_patch(&claim(vec![other.clone()], None), &allocated).expect("a change");
        let written = &patch["status"]["conditions"];
        assert_eq!(written.as_array().map(Vec::len), Some(2), "{patch}");
        assert_eq!(written[0]["type"], "Other");
        assert_eq!(written[0]["message"], "kept");
        assert_eq!(written[1]["type"], "Ready");
        assert_eq!(patch["status"]["addressRef"]["name"], "c");
        let ready = condition("Ready", "True", "AddressAllocated", "allocated 10.0.0.4");
        let served = claim(vec![other, ready], Some("c"));
        assert_eq!(capi_status_patch(&served, &allocated), None);
    }

    fn metal3_claim(address: Option<&str>, error: Option<&str>) -> ClaimObject {
        let object: IPClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "ipam.metal3.io/v1alpha1", "kind": "IPClaim",
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"pool": {"name": "p"}},
            "status": {"address": address.map(|name| serde_json::json!({"name": name, "namespace": "ns"})),
                       "errorMessage": error}
        }))
        .expect("a valid IPClaim");
        ClaimObject::of_metal3(&object).expect("named and namespaced")
    }

    /// The shortcut a reconcile takes for a served claim answers as the status patch does:
    /// `true` exactly where the patch of the allocation would be `None`.
    #[test]
    fn a_claim_shows_its_allocation_exactly_when_its_patch_is_empty() {
        let ready = |message: &str| condition("Ready", "True", "AddressAllocated", message);
        let mut other_generation = ready("allocated 10.0.0.4");
        other_generation.observed_generation = Some(2);
        let cases = [
            ("no status", claim(vec![], None)),
            ("the object named, no condition", claim(vec![], Some("c"))),
            (
                "served",
                claim(vec![ready("allocated 10.0.0.4")], Some("c")),
            ),
            (
                "another object named",
                claim(vec![ready("allocated 10.0.0.4")], Some("d")),
            ),
            (
                "another address",
                claim(vec![ready("allocated 10.0.0.5")], Some("c")),
            ),
            (
                "another generation",
                claim(vec![other_generation], Some("c")),
            ),
            (
                "not ready",
                claim(
                    vec![condition("Ready", "False", "PoolExhausted", "full")],
                    Some("c"),
                ),
            ),
            (
                "another reason",
                claim(
                    vec![condition("Ready", "True", "Other", "allocated 10.0.0.4")],
                    Some("c"),
                ),
            ),
            (
                "served, with another condition first",
                claim(
                    vec![
                        condition("Other", "False", "X", "y"),
                        ready("allocated 10.0.0.4"),
                    ],
                    Some("c"),
                ),
            ),
            ("Metal3, served", metal3_claim(Some("c"), None)),
            ("Metal3, no address", metal3_claim(None, None)),
            ("Metal3, another object", metal3_claim(Some("d"), None)),
            (
                "Metal3, an error left",
                metal3_claim(Some("c"), Some("Failed to allocate")),
            ),
        ];
        let allocated = Outcome::Allocated {
            address_name: "c".into(),
            address: "10.0.0.4".into(),
        };
        let mut served = Vec::new();
        for (what, claim) in &cases {
            let patch = match claim.api {
                IpamApi::Capi => capi_status_patch(claim, &allocated),
                IpamApi::Metal3 => metal3_status_patch(claim, &allocated),
            };
            let shows = shows_allocated(claim, "c", "10.0.0.4");
            assert_eq!(shows, patch.is_none(), "{what}: patch {patch:?}");
            if shows {
                served.push(*what);
            }
        }
        assert_eq!(
            served,
            [
                "served",
                "served, with another condition first",
                "Metal3, served"
            ]
        );
    }
}
