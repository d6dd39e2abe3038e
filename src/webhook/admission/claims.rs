//! The admission of claims (CAPI IPAddressClaims, Metal3 IPClaims), address objects (who
//! writes them, what stays fixed) and Metal3DataTemplates.

use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject};
use kube::core::admission::{AdmissionRequest, Operation};
use serde_json::Value;

use super::*;
use crate::api::capi::{self, IPPoolReference};
use crate::api::capi_pools::{GlobalInClusterIPPool, GlobalInClusterPrefixPool};
use crate::api::metal3_data::Metal3DataTemplate;
use crate::api::metal3_ipam::{self, IPClaim, Metal3IPAddress};
use crate::ipam::dialect::PoolSpace;
use crate::ipam::key::{PoolKey, PoolKind};
use crate::ipam::tenancy::{self, Tenancy};
use crate::webhook::rules::{self, Reference};
use crate::webhook::{Webhooks, writers};

impl Webhooks {
    /// A new address object of a pool bitpool serves comes from bitpool, or from someone who
    /// may change the pool ([`super::writers`]).
    pub(super) async fn address_writer(
        &self,
        request: &AdmissionRequest<DynamicObject>,
    ) -> Verdict {
        if request.operation != Operation::Create {
            return Ok(Vec::new());
        }
        let kind = request.kind.kind.as_str();
        let pool = if request.kind.group == metal3_ipam::GROUP {
            decode::<Metal3IPAddress>(kind, request.object.as_ref())?
                .and_then(|a| PoolKey::of_metal3_address(&a))
        } else {
            decode::<capi::IPAddress>(kind, request.object.as_ref())?
                .and_then(|a| PoolKey::of_address(&a))
        };
        let Some(pool) = pool else {
            return Ok(Vec::new());
        };
        let allowed = self
            .writers
            .may_write(&self.client, &request.user_info, &pool)
            .await
            .map_err(|source| AdmissionError::Read {
                what: format!("whether the writer may patch {}", pool.describe()),
                source,
            })?;
        Ok(match allowed {
            true => Vec::new(),
            false => vec![writers::refusal(kind, &describe(request), &pool)],
        })
    }

    pub(super) async fn ipclaim(&self, request: &AdmissionRequest<DynamicObject>) -> Verdict {
        let reference = |c: &IPClaim| Reference {
            name: c.spec.pool.name.clone().unwrap_or_default(),
            namespace: c.spec.pool.namespace.clone().filter(|s| !s.is_empty()),
            kind: c.spec.pool.kind.clone().filter(|s| !s.is_empty()),
        };
        let Some(new) = decode::<IPClaim>("IPClaim", request.object.as_ref())? else {
            return Ok(Vec::new());
        };
        let old = decode::<IPClaim>("IPClaim", request.old_object.as_ref())?;
        let mut problems = rules::ipclaim(old.as_ref().map(reference).as_ref(), &reference(&new));
        let key = PoolKey {
            kind: PoolKind::Metal3IPPool,
            namespace: reference(&new).namespace.or(request.namespace.clone()),
            name: reference(&new).name,
        };
        let pool = self.pool_layout(&key).await?;
        let requested = new
            .annotations()
            .get(metal3_ipam::REQUESTED_ADDRESS_ANNOTATION)
            .cloned();
        let unchanged = old.as_ref().is_some_and(|o| {
            o.annotations()
                .get(metal3_ipam::REQUESTED_ADDRESS_ANNOTATION)
                == requested.as_ref()
        });
        if unchanged {
            return Ok(problems);
        }
        problems.extend(rules::requested_address(
            requested.as_deref(),
            pool.as_ref(),
        ));
        Ok(problems)
    }

    /// Claims on bitpool's pools only: a pool name, and a requested address the pool has.
    pub(super) async fn capi_claim(&self, request: &AdmissionRequest<DynamicObject>) -> Verdict {
        // Read field by field: v1beta1 claims may leave `poolRef.apiGroup` out.
        let Some(claim) = request.object.as_ref() else {
            return Ok(Vec::new());
        };
        let text = |pointer: &str| {
            claim
                .data
                .pointer(pointer)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let (group, kind, name) = (
            text("/spec/poolRef/apiGroup"),
            text("/spec/poolRef/kind"),
            text("/spec/poolRef/name"),
        );
        let reference = IPPoolReference {
            name,
            kind,
            api_group: group,
        };
        let namespace = request.namespace.clone().unwrap_or_default();
        let Some(key) = PoolKey::of_ref(&reference, &namespace) else {
            return Ok(Vec::new());
        };
        if key.name.is_empty() {
            return Ok(vec!["spec.poolRef.name: cannot be empty".into()]);
        }
        if key.kind.is_global() && request.operation == Operation::Create {
            let refused = self.namespace_selected(&key, &namespace).await?;
            if !refused.is_empty() {
                return Ok(refused);
            }
        }
        let requested = claim
            .annotations()
            .get(metal3_ipam::REQUESTED_ADDRESS_ANNOTATION)
            .cloned();
        if key.kind.is_prefix() {
            let pool = self.prefix_pool_layout(&key).await?;
            return Ok(rules::requested_prefix(requested.as_deref(), pool.as_ref()));
        }
        let layout = self.pool_layout(&key).await?;
        Ok(rules::requested_address(
            requested.as_deref(),
            layout.as_ref(),
        ))
    }

    /// Whether the cluster-scoped pool `key` serves claims of `namespace` (its
    /// `namespaceSelector`); a pool that does not exist, or whose selector is invalid, is judged
    /// by the engine (which says so on the claim).
    async fn namespace_selected(&self, key: &PoolKey, namespace: &str) -> Verdict {
        let (client, what) = (self.client.clone(), key.describe());
        let tenancy = if key.kind.is_prefix() {
            tenancy_of::<GlobalInClusterPrefixPool>(&client, key, &what).await?
        } else {
            tenancy_of::<GlobalInClusterIPPool>(&client, key, &what).await?
        };
        let Some(Ok(tenancy)) = tenancy else {
            return Ok(Vec::new());
        };
        if tenancy == Tenancy::Everyone {
            return Ok(Vec::new());
        }
        // A namespace not found has no labels.
        let found = get(&Api::<Namespace>::all(client), namespace, "namespace")
            .await?
            .unwrap_or_default();
        Ok(rules::claim_namespace(
            &key.describe(),
            &tenancy,
            namespace,
            tenancy::labels(&found),
        ))
    }
}

/// The tenancy of the cluster-scoped pool `key`, read from the server (`None` if it is not
/// there).
async fn tenancy_of<P>(
    client: &kube::Client,
    key: &PoolKey,
    what: &str,
) -> Result<Option<Result<Tenancy, String>>, AdmissionError>
where
    P: PoolSpace + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let pool = get(&Api::<P>::all(client.clone()), &key.name, what).await?;
    Ok(pool.map(|p| p.tenancy()))
}

pub(super) fn metal3_address(request: &AdmissionRequest<DynamicObject>) -> Verdict {
    let new = decode::<Metal3IPAddress>("IPAddress", request.object.as_ref())?;
    let old = decode::<Metal3IPAddress>("IPAddress", request.old_object.as_ref())?;
    Ok(new
        .map(|n| rules::metal3_address(old.as_ref().map(|o| &o.spec), &n.spec))
        .unwrap_or_default())
}

pub(super) fn data_template(request: &AdmissionRequest<DynamicObject>) -> Verdict {
    let kind = "Metal3DataTemplate";
    let new = decode::<Metal3DataTemplate>(kind, request.object.as_ref())?;
    let old = decode::<Metal3DataTemplate>(kind, request.old_object.as_ref())?;
    Ok(new
        .map(|n| rules::data_template(old.as_ref().map(|o| &o.spec), &n.spec))
        .unwrap_or_default())
}
