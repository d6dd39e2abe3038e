//! The claims a pool serves, of either API, behind one type: read, fetched, patched.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::api::Api;

use crate::api::capi::IPAddressClaim;
use crate::api::metal3_ipam::IPClaim;
use crate::ipam::Context;
use crate::ipam::key::PoolKey;
use crate::ipam::ledger::intent::ClaimId;
use crate::runtime::cached::{ClaimObject, IpamApi};
use crate::runtime::error::{Call, Error, Verb};
use crate::runtime::objects::{self, FinalizerPatch};

use super::status::{Outcome, capi_status_patch, metal3_status_patch, shows_allocated};

/// Which API a claim is of: Cluster API's IPAddressClaim or Metal3's IPClaim.
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

impl AnyClaim {
    /// An IPAddressClaim read from the server; `None` without a name or namespace.
    pub fn capi(object: &IPAddressClaim) -> Option<Self> {
        ClaimObject::of_capi(object).map(|c| Self(Arc::new(c)))
    }

    /// A Metal3 IPClaim read from the server; `None` without a name or namespace.
    pub fn metal3(object: &IPClaim) -> Option<Self> {
        ClaimObject::of_metal3(object).map(|c| Self(Arc::new(c)))
    }

    /// Which API the claim is of.
    pub fn kind(&self) -> ClaimKind {
        match self.api {
            IpamApi::Capi => ClaimKind::Capi,
            IpamApi::Metal3 => ClaimKind::Metal3,
        }
    }

    /// The claim's name.
    pub fn name(&self) -> String {
        self.meta.name.to_string()
    }

    /// The claim's namespace.
    pub fn namespace(&self) -> String {
        self.meta.namespace().to_string()
    }

    /// The claim's UID; `None` before it has one.
    pub fn uid(&self) -> Option<String> {
        Some(self.meta.uid.to_string()).filter(|uid| !uid.is_empty())
    }

    /// The claim as the ledger records it; `None` before it has a UID.
    pub fn id(&self) -> Option<ClaimId> {
        Some(ClaimId {
            uid: self.uid()?,
            namespace: self.namespace(),
            name: self.name(),
        })
    }

    /// The pool the claim names, if it is one bitpool serves.
    pub fn pool_key(&self) -> Option<PoolKey> {
        if self.pool_elsewhere() {
            return None;
        }
        PoolKey::of_ref(self.pool(), self.meta.namespace()).filter(|key| !key.name.is_empty())
    }

    /// Whether the claim names the pool `key`.
    pub fn is_of(&self, key: &PoolKey) -> bool {
        !self.pool_elsewhere() && key.is_named_by(self.pool(), Some(self.meta.namespace()))
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
            IpamApi::Capi => (self.spec_cluster_name())
                .filter(|n| !n.is_empty())
                .or_else(|| self.meta.label(crate::api::labels::CLUSTER_NAME)),
            IpamApi::Metal3 => None,
        }
    }

    /// Whether the claim is being deleted.
    pub fn deleting(&self) -> bool {
        self.meta.is_deleted()
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
            self.meta.namespace(),
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
        let version = meta.resource_version.to_string();
        let listed = objects::Finalizers {
            name: &meta.name,
            resource_version: &version,
            current: meta.finalizers().iter().map(|f| &**f),
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
        (!self.meta.labels().is_empty()).then(|| {
            (self.meta.labels().iter())
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
