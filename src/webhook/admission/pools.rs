//! The admission of pools: a spec's rules, a cluster-scoped pool's `namespaceSelector`, what
//! an update or a deletion may do to the addresses allocated from it.

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DynamicObject, ObjectMeta};
use kube::core::admission::{AdmissionRequest, Operation};

use super::state::list_all;
use super::*;
use crate::api::capi_pools::{
    GlobalInClusterIPPool, GlobalInClusterPrefixPool, InClusterIPPool, InClusterIPPoolSpec,
    InClusterPrefixPool, InClusterPrefixPoolSpec, SKIP_DELETE_CHECK_ANNOTATION, v1alpha1,
};
use crate::api::metal3_ipam::IPPool;
use crate::ipam::key::PoolKind;
use crate::ipam::moving;
use crate::ipam::tenancy::{self, Reach, Tenancy};
use crate::webhook::Webhooks;
use crate::webhook::rules;

/// The request's object (or old object) as an address pool of `kind` (an `InClusterIPPool` or
/// `GlobalInClusterIPPool`): its metadata and spec.
pub(super) fn ip_pool_of(
    kind: PoolKind,
    object: Option<&DynamicObject>,
) -> Result<Option<(ObjectMeta, InClusterIPPoolSpec)>, AdmissionError> {
    let name = kind.as_str();
    Ok(if kind.is_global() {
        decode::<GlobalInClusterIPPool>(name, object)?.map(|p| (p.metadata, p.spec.pool))
    } else {
        decode::<InClusterIPPool>(name, object)?.map(|p| (p.metadata, p.spec))
    })
}

/// The request's object (or old object) as a prefix pool of `kind` (an `InClusterPrefixPool` or
/// `GlobalInClusterPrefixPool`): its metadata and spec.
pub(super) fn prefix_pool_of(
    kind: PoolKind,
    object: Option<&DynamicObject>,
) -> Result<Option<(ObjectMeta, InClusterPrefixPoolSpec)>, AdmissionError> {
    let name = kind.as_str();
    Ok(if kind.is_global() {
        decode::<GlobalInClusterPrefixPool>(name, object)?.map(|p| (p.metadata, p.spec.pool))
    } else {
        decode::<InClusterPrefixPool>(name, object)?.map(|p| (p.metadata, p.spec))
    })
}

/// The `namespaceSelector` of a cluster-scoped pool's object in the request (`old`: before the
/// change), if it has one.
fn selector_of(request: &AdmissionRequest<DynamicObject>, old: bool) -> Option<&serde_json::Value> {
    let object = match old {
        true => request.old_object.as_ref(),
        false => request.object.as_ref(),
    }?;
    object
        .data
        .pointer("/spec/namespaceSelector")
        .filter(|s| !s.is_null())
}

impl Webhooks {
    /// A cluster-scoped pool's `namespaceSelector` that is no selector (an unknown operator, `In`
    /// without values), refused naming the field rather than read as "everyone"; and one that,
    /// set or changed, selects no namespace that exists (the pool would serve nobody).
    async fn selector_problems(
        &self,
        request: &AdmissionRequest<DynamicObject>,
        kind: PoolKind,
    ) -> Verdict {
        let Some(selector) = selector_of(request, false).filter(|_| kind.is_global()) else {
            return Ok(Vec::new());
        };
        let parsed = serde_json::from_value(selector.clone())
            .map_err(|e| format!("spec.namespaceSelector: {e}"))
            .and_then(|s: LabelSelector| Tenancy::of(Some(&s)));
        let tenancy = match parsed {
            Ok(tenancy) => tenancy,
            Err(problem) => return Ok(vec![problem]),
        };
        if selector_of(request, true) == Some(selector) {
            return Ok(Vec::new()); // unchanged: namespaces come and go after it was admitted
        }
        let namespaces: Vec<Namespace> = list_all(&self.client, "namespaces").await?;
        Ok(
            match tenancy.reach(namespaces.iter().map(tenancy::labels)) {
                Reach::Selects {
                    selector,
                    namespaces: 0,
                } => vec![tenancy::selects_nothing(&selector)],
                _ => Vec::new(),
            },
        )
    }
}

impl Webhooks {
    /// A pool of any kind: its deletion judged alike, an update that leaves its spec as it was
    /// let through, anything else by its kind's rules.
    pub(super) async fn pool(
        &self,
        request: &AdmissionRequest<DynamicObject>,
        kind: PoolKind,
    ) -> Verdict {
        if request.operation == Operation::Delete {
            return self
                .pool_delete(request, kind, request.namespace.clone())
                .await;
        }
        if spec_unchanged(request) {
            return Ok(Vec::new());
        }
        if kind.is_metal3() {
            self.metal3_pool(request, kind).await
        } else if kind.is_prefix() {
            self.prefix_pool(request, kind).await
        } else {
            self.capi_pool(request, kind).await
        }
    }

    async fn capi_pool(
        &self,
        request: &AdmissionRequest<DynamicObject>,
        kind: PoolKind,
    ) -> Verdict {
        let spec_of = |o| Ok(ip_pool_of(kind, o)?.map(|(_, spec)| spec));
        let namespace = request.namespace.clone();
        let mut problems = self.selector_problems(request, kind).await?;
        if request.kind.version == "v1alpha1"
            && let Some(object) = &request.object
            && let Ok(spec) =
                serde_json::from_value::<v1alpha1::InClusterIPPoolSpec>(object.data["spec"].clone())
        {
            problems.extend(rules::v1alpha1_pool(&spec));
        }
        let Some(spec) = spec_of(request.object.as_ref())? else {
            return Ok(problems);
        };
        let layout = match rules::capi_pool(&spec) {
            Ok(layout) => layout,
            Err(found) => {
                problems.extend(found);
                return Ok(problems);
            }
        };
        if request.operation == Operation::Update
            && !annotated_true(request.object.as_ref(), rules::ALLOW_SHRINK_ANNOTATION)
        {
            let old = spec_of(request.old_object.as_ref())?.and_then(|s| rules::capi_pool(&s).ok());
            let held = self.held(request, kind, namespace.as_deref()).await?;
            problems.extend(rules::shrink(&held, old.as_ref(), &layout));
        }
        if self.refuse_overlap {
            let others = self
                .other_layouts(kind, namespace.as_deref(), &request.name)
                .await?;
            problems.extend(rules::overlaps(&layout, &others));
        }
        Ok(problems)
    }

    async fn prefix_pool(
        &self,
        request: &AdmissionRequest<DynamicObject>,
        kind: PoolKind,
    ) -> Verdict {
        let spec_of = |o| Ok(prefix_pool_of(kind, o)?.map(|(_, spec)| spec));
        let namespace = request.namespace.clone();
        let Some(spec) = spec_of(request.object.as_ref())? else {
            return Ok(Vec::new());
        };
        let mut problems = self.selector_problems(request, kind).await?;
        let (layout, numbering) = match rules::prefix_pool(&spec) {
            Ok(valid) => valid,
            Err(found) => {
                problems.extend(found);
                return Ok(problems);
            }
        };
        if let Some(old) = spec_of(request.old_object.as_ref())? {
            let held = self.held(request, kind, namespace.as_deref()).await?;
            let allow_shrink =
                annotated_true(request.object.as_ref(), rules::ALLOW_SHRINK_ANNOTATION);
            problems.extend(rules::prefix_pool_update(
                &held,
                &old,
                (&layout, numbering),
                allow_shrink,
            ));
        }
        if self.refuse_overlap {
            let others = self
                .other_layouts(kind, namespace.as_deref(), &request.name)
                .await?;
            let addresses = rules::prefix_addresses(&(layout, numbering));
            problems.extend(rules::overlaps(&addresses, &others));
        }
        Ok(problems)
    }

    async fn metal3_pool(
        &self,
        request: &AdmissionRequest<DynamicObject>,
        kind: PoolKind,
    ) -> Verdict {
        let namespace = request.namespace.clone();
        let Some(new) = decode::<IPPool>(kind.as_str(), request.object.as_ref())? else {
            return Ok(Vec::new());
        };
        let layout = match rules::metal3_pool(&new.spec) {
            Ok(layout) => layout,
            Err(problems) => return Ok(problems),
        };
        let mut problems = Vec::new();
        if let Some(old) = decode::<IPPool>(kind.as_str(), request.old_object.as_ref())? {
            problems.extend(rules::metal3_pool_update(&old.spec, &new.spec));
            let indexes = old.status.map(|s| s.indexes).unwrap_or_default();
            problems.extend(rules::metal3_indexes_in_bounds(&indexes, &layout));
            if !annotated_true(request.object.as_ref(), rules::ALLOW_SHRINK_ANNOTATION) {
                let old_layout = rules::metal3_pool(&old.spec).ok();
                let held = self.held(request, kind, namespace.as_deref()).await?;
                problems.extend(rules::shrink(&held, old_layout.as_ref(), &layout));
            }
        }
        if self.refuse_overlap && !new.proxies() {
            let others = self
                .other_layouts(kind, namespace.as_deref(), &request.name)
                .await?;
            problems.extend(rules::overlaps(&layout, &others));
        }
        Ok(problems)
    }

    /// A pool with allocated addresses stays, unless `clusterctl move` says otherwise or its
    /// namespace is being deleted (then everything in it goes, and the pool's finalizer keeps
    /// it until its addresses are released).
    async fn pool_delete(
        &self,
        request: &AdmissionRequest<DynamicObject>,
        kind: PoolKind,
        namespace: Option<String>,
    ) -> Verdict {
        let moved = [
            SKIP_DELETE_CHECK_ANNOTATION,
            moving::DELETE_FOR_MOVE_ANNOTATION,
        ];
        if moved
            .iter()
            .any(|a| annotated(request.old_object.as_ref(), a))
        {
            return Ok(Vec::new());
        }
        if let Some(ns) = &namespace
            && self.namespace_terminating(ns).await?
        {
            return Ok(Vec::new());
        }
        let held = self.held(request, kind, namespace.as_deref()).await?;
        Ok(rules::delete(&held))
    }

    async fn namespace_terminating(&self, namespace: &str) -> Result<bool, AdmissionError> {
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
        let found = api
            .get_opt(namespace)
            .await
            .map_err(|source| AdmissionError::Read {
                what: format!("namespace {namespace}"),
                source,
            })?;
        Ok(found.is_none_or(|ns| ns.metadata.deletion_timestamp.is_some()))
    }
}
