//! The claim and address kinds a pool serves, behind one interface: a CAPI IPAddressClaim or a
//! Metal3 IPClaim, answered by a CAPI IPAddress or a Metal3 IPAddress.

use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::Context;
use super::error::Error;
use super::intent::{ClaimId, Refusal};
use super::objects::{self, FinalizerPatch};
use crate::alloc::AllocError;
use crate::api::capi::{self, IPAddress, IPAddressClaim, LocalObjectName};
use crate::api::metal3_ipam::{self, IPClaim, Metal3IPAddress};

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
        address: IpAddr,
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
    pub async fn write_status(&self, ctx: &Context, outcome: &Outcome) -> Result<(), Error> {
        let ns = self.namespace();
        let patch = match self {
            AnyClaim::Capi(claim) => capi_status_patch(claim, outcome),
            AnyClaim::Metal3(claim) => metal3_status_patch(claim, outcome),
        };
        let Some(patch) = patch else { return Ok(()) };
        match self {
            AnyClaim::Capi(c) => {
                let api = Api::<IPAddressClaim>::namespaced(ctx.client.clone(), &ns);
                objects::merge_status(&api, &c.name_any(), patch).await
            }
            AnyClaim::Metal3(c) => {
                let api = Api::<IPClaim>::namespaced(ctx.client.clone(), &ns);
                objects::merge_status(&api, &c.name_any(), patch).await
            }
        }
    }
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
        .then(|| json!({ "status": { "addressRef": status.address_ref, "conditions": status.conditions } }))
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
            refusal: Refusal::Alloc(e),
            ..
        } => match e {
            AllocError::Exhausted => "Exhausted IP Pools".into(),
            AllocError::RequestedUnparseable { value } => {
                format!("Invalid ipAddress annotation {value:?}: not a valid IP address")
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
        Outcome::Failed(_) => "Failed to create associated IPAddress object".into(),
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

/// An existing address object.
#[derive(Clone, Debug)]
pub enum AnyAddress {
    Capi(Arc<IPAddress>),
    Metal3(Arc<Metal3IPAddress>),
}

impl AnyAddress {
    pub fn meta(&self) -> &ObjectMeta {
        match self {
            AnyAddress::Capi(a) => a.meta(),
            AnyAddress::Metal3(a) => a.meta(),
        }
    }

    pub fn name(&self) -> String {
        self.meta().name.clone().unwrap_or_default()
    }

    pub fn ip(&self) -> Option<IpAddr> {
        match self {
            AnyAddress::Capi(a) => a.spec.address.parse().ok(),
            AnyAddress::Metal3(a) => a.spec.address.parse().ok(),
        }
    }

    /// The kind of claim it answers, and that claim's name.
    pub fn claim(&self) -> (ClaimKind, String) {
        match self {
            AnyAddress::Capi(a) => (ClaimKind::Capi, a.spec.claim_ref.name.clone()),
            AnyAddress::Metal3(a) => (
                ClaimKind::Metal3,
                a.spec.claim.name.clone().unwrap_or_default(),
            ),
        }
    }

    /// Removes `finalizer`, deletes the object, and reports whether it is gone.
    pub async fn delete(&self, ctx: &Context, finalizer: &str) -> Result<bool, Error> {
        let ns = self.meta().namespace.clone().unwrap_or_default();
        match self {
            AnyAddress::Capi(a) => {
                delete_with(
                    &Api::<IPAddress>::namespaced(ctx.client.clone(), &ns),
                    &a.name_any(),
                    finalizer,
                )
                .await
            }
            AnyAddress::Metal3(a) => {
                delete_with(
                    &Api::<Metal3IPAddress>::namespaced(ctx.client.clone(), &ns),
                    &a.name_any(),
                    finalizer,
                )
                .await
            }
        }
    }
}

async fn delete_with<K>(api: &Api<K>, name: &str, finalizer: &str) -> Result<bool, Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if let Some(current) = api.get_opt(name).await.map_err(Error::Kube)? {
        if objects::remove_finalizer(api, &current, finalizer).await? == FinalizerPatch::Stale {
            return Ok(false);
        }
        match api.delete(name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => return Err(Error::Kube(e)),
        }
    }
    Ok(api.get_opt(name).await.map_err(Error::Kube)?.is_none())
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

    pub async fn create(&self, ctx: &Context) -> Result<Created, Error> {
        match self {
            NewAddress::Capi(object) => {
                let api: Api<IPAddress> =
                    Api::namespaced(ctx.client.clone(), &object.namespace().unwrap_or_default());
                create_or_compare(&api, &**object, |existing: &IPAddress| {
                    existing.spec.address == object.spec.address
                        && existing.spec.pool_ref == object.spec.pool_ref
                        && existing.spec.claim_ref == object.spec.claim_ref
                })
                .await
            }
            NewAddress::Metal3(object) => {
                let api: Api<Metal3IPAddress> =
                    Api::namespaced(ctx.client.clone(), &object.namespace().unwrap_or_default());
                create_or_compare(&api, &**object, |existing: &Metal3IPAddress| {
                    existing.spec.address == object.spec.address
                        && existing.spec.pool.name == object.spec.pool.name
                        && existing.spec.claim.name == object.spec.claim.name
                })
                .await
            }
        }
    }
}

async fn create_or_compare<K>(
    api: &Api<K>,
    object: &K,
    same: impl Fn(&K) -> bool,
) -> Result<Created, Error>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(Created::Confirmed),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let name = object.meta().name.clone().unwrap_or_default();
            let existing = api.get(&name).await.map_err(Error::Kube)?;
            if same(&existing) {
                Ok(Created::Confirmed)
            } else {
                Ok(Created::Conflict(format!(
                    "{} {name} already exists for another claim or pool",
                    K::kind(&())
                )))
            }
        }
        Err(e) => Err(Error::Kube(e)),
    }
}
