//! AdmissionReviews: the object's kind picks the rules ([`super::rules`]); this module reads the
//! cluster state they need. Reads are live (not cached): an admission decision must not act on
//! a stale view of what is allocated.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::{Client, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::convert::pools;
use super::rules::{self, Held, Reference};
use super::{Phase, Webhooks, writers};
use crate::alloc::{Layout, Numbering};
use crate::api::capi::{self, IPPoolReference};
use crate::api::capi_pools::{
    GlobalInClusterIPPool, GlobalInClusterPrefixPool, InClusterIPPool, InClusterIPPoolSpec,
    InClusterPrefixPool, InClusterPrefixPoolSpec, SKIP_DELETE_CHECK_ANNOTATION, v1alpha1,
};
use crate::api::metal3_data::Metal3DataTemplate;
use crate::api::metal3_ipam::{self, IPClaim, IPPool, Metal3IPAddress};
use crate::ipam::dialect::{AddressKinds, listed_addresses};
use crate::ipam::key::{PoolKey, PoolKind};
use crate::ipam::ledger::{Ledger, LedgerRef, Loaded};
use crate::ipam::moving;
use crate::ipam::tenancy::{self, Reach, Tenancy};
use crate::runtime::context::CachedAddressPool;

/// How many address objects of each kind are read to name the claims of a recorded pool's
/// allocated addresses: a bound on the cost of a pool update or delete, whatever the pool's size.
const NAMING_PAGE: u32 = 500;

/// Why a request could not be judged (the API server applies the webhook's failure policy).
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    #[error("the object is not a valid {kind}: {reason}")]
    Decode { kind: String, reason: String },
    #[error("cannot read {what}: {source}")]
    Read { what: String, source: kube::Error },
    #[error("cannot read {ledger}: {reason}")]
    Ledger { ledger: String, reason: String },
}

type Verdict = Result<Vec<String>, AdmissionError>;

impl Webhooks {
    /// Answers an AdmissionReview (the request body).
    pub async fn admit(&self, body: &[u8], phase: Phase) -> Result<Vec<u8>, String> {
        let review: AdmissionReview<DynamicObject> =
            serde_json::from_slice(body).map_err(|e| format!("not an AdmissionReview: {e}"))?;
        let request: AdmissionRequest<DynamicObject> = review
            .try_into()
            .map_err(|e: kube::core::admission::ConvertAdmissionReviewError| e.to_string())?;
        let response = AdmissionResponse::from(&request);
        let response = match phase {
            Phase::Mutate if request.kind.kind == "Metal3Cluster" => {
                self.metal3_cluster(&request, response).await
            }
            Phase::Mutate => mutate(&request, response),
            Phase::Validate => match self.validate(&request).await {
                Ok(problems) if problems.is_empty() => warn(&request, response),
                Ok(problems) => {
                    let message = problems.join("; ");
                    tracing::info!(kind = %request.kind.kind, object = %describe(&request), operation = ?request.operation, reason = %message, "admission denied");
                    response.deny(message)
                }
                Err(e) => {
                    tracing::warn!(kind = %request.kind.kind, object = %describe(&request), error = %e, "cannot judge an admission request");
                    response.deny(e.to_string())
                }
            },
        };
        serde_json::to_vec(&response.into_review()).map_err(|e| e.to_string())
    }

    async fn validate(&self, request: &AdmissionRequest<DynamicObject>) -> Verdict {
        let kind = &request.kind;
        match pool_kind(request) {
            Some(PoolKind::Metal3IPPool) => return self.metal3_pool(request).await,
            Some(pool) if pool.is_prefix() => return self.prefix_pool(request, pool).await,
            Some(pool) => return self.capi_pool(request, pool).await,
            None => {}
        }
        match (kind.group.as_str(), kind.kind.as_str()) {
            (metal3_ipam::GROUP, "IPClaim") => self.ipclaim(request).await,
            (metal3_ipam::GROUP, "IPAddress") => {
                let mut problems = metal3_address(request)?;
                problems.extend(self.address_writer(request).await?);
                Ok(problems)
            }
            (capi::GROUP, "IPAddress") => self.address_writer(request).await,
            (capi::GROUP, "IPAddressClaim") => self.capi_claim(request).await,
            ("infrastructure.cluster.x-k8s.io", "Metal3DataTemplate") => data_template(request),
            ("cluster.x-k8s.io", "Cluster") => self.cluster(request).await,
            _ => Ok(Vec::new()),
        }
    }
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

/// The pool kind of the request's object, `None` when it is not a pool.
fn pool_kind(request: &AdmissionRequest<DynamicObject>) -> Option<PoolKind> {
    PoolKind::of(&request.kind.group, &request.kind.kind)
}

/// Adds the warnings a valid object earns (kubectl prints them on apply).
fn warn(
    request: &AdmissionRequest<DynamicObject>,
    mut response: AdmissionResponse,
) -> AdmissionResponse {
    let kind = request.kind.kind.as_str();
    if request.operation == Operation::Delete {
        return response;
    }
    let object = request.object.as_ref();
    fn bare(
        meta: &kube::api::ObjectMeta,
        keys: &std::collections::BTreeMap<String, String>,
    ) -> Vec<String> {
        let namespace = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::api::capi_pools::PREALLOCATION_NAMESPACE_ANNOTATION));
        rules::bare_preallocation_warnings(keys, namespace.map(String::as_str))
    }
    let warnings = match pool_kind(request) {
        Some(PoolKind::InClusterIPPool) => decode::<InClusterIPPool>(kind, object)
            .ok()
            .flatten()
            .map(|p| rules::capi_pool_warnings(&p.spec)),
        Some(PoolKind::GlobalInClusterIPPool) => decode::<GlobalInClusterIPPool>(kind, object)
            .ok()
            .flatten()
            .map(|p| {
                let mut warnings = rules::capi_pool_warnings(&p.spec.pool);
                warnings.extend(bare(&p.metadata, &p.spec.pool.pre_allocations));
                warnings
            }),
        Some(PoolKind::GlobalInClusterPrefixPool) => {
            decode::<GlobalInClusterPrefixPool>(kind, object)
                .ok()
                .flatten()
                .map(|p| bare(&p.metadata, &p.spec.pool.pre_allocations))
        }
        _ => None,
    }
    .unwrap_or_default();
    if !warnings.is_empty() {
        response.warnings = Some(warnings);
    }
    response
}

fn describe(request: &AdmissionRequest<DynamicObject>) -> String {
    match &request.namespace {
        Some(ns) => format!("{ns}/{}", request.name),
        None => request.name.clone(),
    }
}

/// The request's object (or old object) as `K`, at the version bitpool works with.
fn decode<K: DeserializeOwned>(
    kind: &str,
    object: Option<&DynamicObject>,
) -> Result<Option<K>, AdmissionError> {
    let Some(object) = object else {
        return Ok(None);
    };
    let decode_error = |reason: String| AdmissionError::Decode {
        kind: kind.to_string(),
        reason,
    };
    let mut value = serde_json::to_value(object).map_err(|e| decode_error(e.to_string()))?;
    if value["apiVersion"] == pools::V1ALPHA1 && pools::KINDS.contains(&kind) {
        value = pools::convert(value, pools::V1ALPHA2).map_err(|e| decode_error(e.to_string()))?;
    }
    serde_json::from_value(value)
        .map(Some)
        .map_err(|e| decode_error(e.to_string()))
}

/// An update that leaves the spec as it was (finalizers, labels, annotations): never refused, so
/// that an object stored before these rules, or whose pool changed since, can still be released
/// and deleted.
fn spec_unchanged(request: &AdmissionRequest<DynamicObject>) -> bool {
    match (&request.operation, &request.object, &request.old_object) {
        (Operation::Update, Some(new), Some(old)) => new.data.get("spec") == old.data.get("spec"),
        _ => false,
    }
}

/// Whether the object carries `annotation` (any value, as upstream reads its skip annotation).
fn annotated(object: Option<&DynamicObject>, annotation: &str) -> bool {
    object.is_some_and(|o| o.annotations().contains_key(annotation))
}

/// Whether the object carries `annotation: "true"`.
fn annotated_true(object: Option<&DynamicObject>, annotation: &str) -> bool {
    object.is_some_and(|o| o.annotations().get(annotation).is_some_and(|v| v == "true"))
}

/// The Metal3 IPPool defaulting upstream does: `allocationStrategy: sequential`.
fn mutate(
    request: &AdmissionRequest<DynamicObject>,
    response: AdmissionResponse,
) -> AdmissionResponse {
    let is_ippool = pool_kind(request) == Some(PoolKind::Metal3IPPool);
    let unset = request.object.as_ref().is_some_and(|o| {
        o.data
            .pointer("/spec/allocationStrategy")
            .is_none_or(Value::is_null)
    });
    if !(is_ippool && unset) {
        return response;
    }
    let default = serde_json::json!([
        {"op": "add", "path": "/spec/allocationStrategy", "value": "sequential"}
    ]);
    super::patched(response, default, "the default allocationStrategy")
}

impl Webhooks {
    async fn capi_pool(
        &self,
        request: &AdmissionRequest<DynamicObject>,
        kind: PoolKind,
    ) -> Verdict {
        let spec_of =
            |o: Option<&DynamicObject>| -> Result<Option<InClusterIPPoolSpec>, AdmissionError> {
                let name = kind.as_str();
                Ok(if kind.is_global() {
                    decode::<GlobalInClusterIPPool>(name, o)?.map(|p| p.spec.pool)
                } else {
                    decode::<InClusterIPPool>(name, o)?.map(|p| p.spec)
                })
            };
        let namespace = request.namespace.clone();
        if request.operation == Operation::Delete {
            return self.pool_delete(request, kind, namespace).await;
        }
        if spec_unchanged(request) {
            return Ok(Vec::new());
        }
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
        let spec_of =
            |o: Option<&DynamicObject>| -> Result<Option<InClusterPrefixPoolSpec>, AdmissionError> {
                let name = kind.as_str();
                Ok(if kind.is_global() {
                    decode::<GlobalInClusterPrefixPool>(name, o)?.map(|p| p.spec.pool)
                } else {
                    decode::<InClusterPrefixPool>(name, o)?.map(|p| p.spec)
                })
            };
        let namespace = request.namespace.clone();
        if request.operation == Operation::Delete {
            return self.pool_delete(request, kind, namespace).await;
        }
        if spec_unchanged(request) {
            return Ok(Vec::new());
        }
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

    async fn metal3_pool(&self, request: &AdmissionRequest<DynamicObject>) -> Verdict {
        let kind = PoolKind::Metal3IPPool;
        let namespace = request.namespace.clone();
        if request.operation == Operation::Delete {
            return self.pool_delete(request, kind, namespace).await;
        }
        if spec_unchanged(request) {
            return Ok(Vec::new());
        }
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

    /// The addresses allocated from the pool of `request` (an update or delete), with the claims
    /// that hold them where known. A pool bitpool records is read from its ledger: one read of
    /// at most 1 MiB, whatever the number of addresses, and the claims named by its
    /// reservations and by the first [`NAMING_PAGE`] address objects. A prefix pool (whose
    /// record numbers sub-prefixes, not addresses) and a pool without a record yet (one the
    /// provider bitpool replaces left, not reconciled yet) are read from a list of their objects.
    async fn held(
        &self,
        request: &AdmissionRequest<DynamicObject>,
        kind: PoolKind,
        namespace: Option<&str>,
    ) -> Result<Vec<Held>, AdmissionError> {
        let name = request.name.as_str();
        let uid = request
            .old_object
            .as_ref()
            .and_then(|o| o.metadata.uid.clone());
        let recorded = match uid {
            Some(uid) if !kind.is_prefix() => self.recorded(kind, namespace, name, uid).await?,
            _ => None,
        };
        let Some(ledger) = recorded else {
            return self
                .listed(kind, namespace, name, &ListParams::default())
                .await;
        };
        let page = ListParams::default().limit(NAMING_PAGE);
        let mut claims: HashMap<String, String> = self
            .listed(kind, namespace, name, &page)
            .await?
            .into_iter()
            .map(|h| (h.address, h.claim))
            .collect();
        for (address, reservation) in &ledger.pending {
            claims.insert(address.clone(), reservation.claim_name.clone());
        }
        Ok(ledger
            .addresses()
            .map(|ip| {
                let address = ip.to_string();
                let claim = claims.get(&address).cloned().unwrap_or_default();
                Held { address, claim }
            })
            .collect())
    }

    /// The pool's ledger, if there is one this pool wrote.
    async fn recorded(
        &self,
        kind: PoolKind,
        namespace: Option<&str>,
        name: &str,
        uid: String,
    ) -> Result<Option<Ledger>, AdmissionError> {
        let ledger = LedgerRef::new(
            self.client.clone(),
            &self.ledger_namespace,
            kind.as_str(),
            namespace,
            name,
            uid,
            None,
        );
        match ledger.load().await {
            Ok(Loaded::Found(stored)) => Ok(Some(stored.ledger)),
            Ok(Loaded::Missing | Loaded::Untrusted { .. }) => Ok(None),
            Err(e) => Err(AdmissionError::Ledger {
                ledger: ledger.describe(),
                reason: e.to_string(),
            }),
        }
    }

    /// The address objects of a pool, of both address kinds, as `params` list them.
    async fn listed(
        &self,
        kind: PoolKind,
        namespace: Option<&str>,
        name: &str,
        params: &ListParams,
    ) -> Result<Vec<Held>, AdmissionError> {
        let kinds = match kind {
            PoolKind::Metal3IPPool => AddressKinds::CapiAndMetal3,
            _ => AddressKinds::Capi,
        };
        let fresh = listed_addresses(&self.client, namespace, kinds, params)
            .await
            .map_err(|source| AdmissionError::Read {
                what: "address objects".into(),
                source,
            })?;
        let key = PoolKey {
            kind,
            namespace: namespace.filter(|_| !kind.is_global()).map(str::to_string),
            name: name.to_string(),
        };
        Ok(fresh
            .all()
            .filter(|a| a.is_of(&key))
            .map(|a| Held {
                address: a.address.to_string(),
                claim: a.claim.to_string(),
            })
            .collect())
    }

    /// Every other pool's layout (valid ones), named `Kind namespace/name`.
    async fn other_layouts(
        &self,
        kind: PoolKind,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Vec<(String, Layout)>, AdmissionError> {
        let capi = list_all::<InClusterIPPool>(&self.client, "InClusterIPPools").await?;
        let globals =
            list_all::<GlobalInClusterIPPool>(&self.client, "GlobalInClusterIPPools").await?;
        let ippools = list_all::<IPPool>(&self.client, "IPPools").await?;
        let prefix_pools =
            list_all::<InClusterPrefixPool>(&self.client, "InClusterPrefixPools").await?;
        let global_prefix_pools =
            list_all::<GlobalInClusterPrefixPool>(&self.client, "GlobalInClusterPrefixPools")
                .await?;
        let as_addresses = |spec: &InClusterPrefixPoolSpec| {
            rules::prefix_pool(spec).map(|valid| rules::prefix_addresses(&valid))
        };
        let prefix_pools = prefix_pools.into_iter().map(|p| {
            let layout = as_addresses(&p.spec);
            (
                PoolKind::InClusterPrefixPool,
                p.namespace(),
                p.name_any(),
                layout,
            )
        });
        let global_prefix_pools = global_prefix_pools.into_iter().map(|p| {
            let layout = as_addresses(&p.spec.pool);
            (
                PoolKind::GlobalInClusterPrefixPool,
                None,
                p.name_any(),
                layout,
            )
        });
        let capi = capi.into_iter().map(|p| {
            (
                PoolKind::InClusterIPPool,
                p.namespace(),
                p.name_any(),
                rules::capi_pool(&p.spec),
            )
        });
        let globals = globals.into_iter().map(|p| {
            (
                PoolKind::GlobalInClusterIPPool,
                None,
                p.name_any(),
                rules::capi_pool(&p.spec.pool),
            )
        });
        // A pool that proxies hands out its target's addresses, none of its own.
        let ippools = ippools.into_iter().filter(|p| !p.proxies()).map(|p| {
            (
                PoolKind::Metal3IPPool,
                p.namespace(),
                p.name_any(),
                rules::metal3_pool(&p.spec),
            )
        });
        Ok(capi
            .chain(globals)
            .chain(ippools)
            .chain(prefix_pools)
            .chain(global_prefix_pools)
            .filter(|(k, ns, n, _)| !(*k == kind && ns.as_deref() == namespace && n == name))
            .filter_map(|(k, ns, n, layout)| {
                let named = match ns {
                    Some(ns) => format!("{k} {ns}/{n}"),
                    None => format!("{k} {n}"),
                };
                Some((named, layout.ok()?))
            })
            .collect())
    }

    /// A new address object of a pool bitpool serves comes from bitpool, or from someone who
    /// may change the pool ([`super::writers`]).
    async fn address_writer(&self, request: &AdmissionRequest<DynamicObject>) -> Verdict {
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

    async fn ipclaim(&self, request: &AdmissionRequest<DynamicObject>) -> Verdict {
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
    async fn capi_claim(&self, request: &AdmissionRequest<DynamicObject>) -> Verdict {
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
        let selector = match key.kind {
            PoolKind::GlobalInClusterIPPool => get(
                &Api::<GlobalInClusterIPPool>::all(client.clone()),
                &key.name,
                &what,
            )
            .await?
            .map(|p| p.spec.namespace_selector),
            _ => get(
                &Api::<GlobalInClusterPrefixPool>::all(client.clone()),
                &key.name,
                &what,
            )
            .await?
            .map(|p| p.spec.namespace_selector),
        };
        let Some(Ok(tenancy)) = selector.map(|s| Tenancy::of(s.as_ref())) else {
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

    /// The layout and numbering of a prefix pool, if it exists and is valid.
    async fn prefix_pool_layout(
        &self,
        key: &PoolKey,
    ) -> Result<Option<(Layout, Numbering)>, AdmissionError> {
        let (client, what) = (self.client.clone(), key.describe());
        let spec = match &key.namespace {
            Some(ns) => get(
                &Api::<InClusterPrefixPool>::namespaced(client, ns),
                &key.name,
                &what,
            )
            .await?
            .map(|p| p.spec),
            None => get(
                &Api::<GlobalInClusterPrefixPool>::all(client),
                &key.name,
                &what,
            )
            .await?
            .map(|p| p.spec.pool),
        };
        Ok(spec.and_then(|s| rules::prefix_pool(&s).ok()))
    }

    /// The layout of a bitpool pool, if it exists and is valid.
    async fn pool_layout(&self, key: &PoolKey) -> Result<Option<Layout>, AdmissionError> {
        Ok(self.address_pool(key).await?.and_then(|p| p.layout()))
    }

    /// The address pool `key` (an `InClusterIPPool`, `GlobalInClusterIPPool` or Metal3
    /// `IPPool`), read from the API server; `None` when it does not exist (or names no pool).
    pub(super) async fn address_pool(
        &self,
        key: &PoolKey,
    ) -> Result<Option<AddressPool>, AdmissionError> {
        if key.name.is_empty() {
            return Ok(None);
        }
        let (client, namespace) = (
            self.client.clone(),
            key.namespace.as_deref().unwrap_or_default(),
        );
        let what = key.describe();
        Ok(match key.kind {
            PoolKind::InClusterIPPool => {
                let api = Api::<InClusterIPPool>::namespaced(client, namespace);
                get(&api, &key.name, &what).await?.map(|p| {
                    AddressPool::Capi(Box::new(CachedAddressPool {
                        spec: p.spec,
                        status: p.status,
                    }))
                })
            }
            PoolKind::GlobalInClusterIPPool => {
                let api = Api::<GlobalInClusterIPPool>::all(client);
                get(&api, &key.name, &what).await?.map(|p| {
                    AddressPool::Capi(Box::new(CachedAddressPool {
                        spec: p.spec.pool,
                        status: p.status,
                    }))
                })
            }
            _ => get(
                &Api::<IPPool>::namespaced(client, namespace),
                &key.name,
                &what,
            )
            .await?
            .map(|p| AddressPool::Metal3(Box::new(p))),
        })
    }
}

/// An address pool as admission reads it, of any kind bitpool serves.
pub(super) enum AddressPool {
    /// An `InClusterIPPool` or `GlobalInClusterIPPool`.
    Capi(Box<CachedAddressPool>),
    Metal3(Box<IPPool>),
}

impl AddressPool {
    /// Its layout, if its spec is valid.
    fn layout(&self) -> Option<Layout> {
        match self {
            AddressPool::Capi(pool) => rules::capi_pool(&pool.spec).ok(),
            AddressPool::Metal3(pool) => rules::metal3_pool(&pool.spec).ok(),
        }
    }

    /// How many addresses it has free, by its status (`None` before a provider wrote one).
    pub(super) fn free(&self) -> Option<i64> {
        match self {
            AddressPool::Capi(pool) => pool.status.as_ref()?.ip_addresses.as_ref().map(|c| c.free),
            AddressPool::Metal3(pool) => pool.status.as_ref()?.available_ip_count,
        }
    }
}

fn metal3_address(request: &AdmissionRequest<DynamicObject>) -> Verdict {
    let new = decode::<Metal3IPAddress>("IPAddress", request.object.as_ref())?;
    let old = decode::<Metal3IPAddress>("IPAddress", request.old_object.as_ref())?;
    Ok(new
        .map(|n| rules::metal3_address(old.as_ref().map(|o| &o.spec), &n.spec))
        .unwrap_or_default())
}

fn data_template(request: &AdmissionRequest<DynamicObject>) -> Verdict {
    let kind = "Metal3DataTemplate";
    let new = decode::<Metal3DataTemplate>(kind, request.object.as_ref())?;
    let old = decode::<Metal3DataTemplate>(kind, request.old_object.as_ref())?;
    Ok(new
        .map(|n| rules::data_template(old.as_ref().map(|o| &o.spec), &n.spec))
        .unwrap_or_default())
}

/// `name`, or `None` when it does not exist; `what` names it in the error.
pub(super) async fn get<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
) -> Result<Option<K>, AdmissionError>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name)
        .await
        .map_err(|source| AdmissionError::Read {
            what: what.to_string(),
            source,
        })
}

async fn list_all<K>(client: &Client, what: &str) -> Result<Vec<K>, AdmissionError>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    Api::<K>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|source| AdmissionError::Read {
            what: what.to_string(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(
        object: serde_json::Value,
        kind: (&str, &str, &str),
    ) -> AdmissionRequest<DynamicObject> {
        let review = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u", "kind": {"group": kind.0, "version": kind.1, "kind": kind.2},
                "resource": {"group": kind.0, "version": kind.1, "resource": "x"},
                "name": "p", "namespace": "ns", "operation": "CREATE",
                "userInfo": {}, "object": object
            }
        });
        let review: AdmissionReview<DynamicObject> =
            serde_json::from_value(review).expect("review");
        review.try_into().expect("request")
    }

    fn patch_of(response: &AdmissionResponse) -> Option<serde_json::Value> {
        response
            .patch
            .as_ref()
            .map(|p| serde_json::from_slice(p).expect("json patch"))
    }

    #[test]
    fn metal3_pools_get_the_sequential_strategy_when_none_is_set() {
        let pool = |spec: serde_json::Value| serde_json::json!({"apiVersion": "ipam.metal3.io/v1alpha1", "kind": "IPPool", "metadata": {"name": "p"}, "spec": spec});
        let unset = request(
            pool(serde_json::json!({"namePrefix": "p"})),
            (metal3_ipam::GROUP, "v1alpha1", "IPPool"),
        );
        let patched = mutate(&unset, AdmissionResponse::from(&unset));
        assert_eq!(
            patch_of(&patched),
            Some(
                serde_json::json!([{"op": "add", "path": "/spec/allocationStrategy", "value": "sequential"}])
            )
        );
        let set = request(
            pool(serde_json::json!({"namePrefix": "p", "allocationStrategy": "random"})),
            (metal3_ipam::GROUP, "v1alpha1", "IPPool"),
        );
        assert_eq!(patch_of(&mutate(&set, AdmissionResponse::from(&set))), None);
        let other = request(
            pool(serde_json::json!({})),
            (capi::GROUP, "v1alpha2", "InClusterIPPool"),
        );
        assert_eq!(
            patch_of(&mutate(&other, AdmissionResponse::from(&other))),
            None
        );
    }

    #[test]
    fn a_v1alpha1_pool_is_judged_after_conversion() {
        let object = serde_json::json!({"apiVersion": pools::V1ALPHA1, "kind": "InClusterIPPool", "metadata": {"name": "p"}, "spec": {"subnet": "10.0.0.0/30"}});
        let request = request(object, (capi::GROUP, "v1alpha1", "InClusterIPPool"));
        let pool = decode::<InClusterIPPool>("InClusterIPPool", request.object.as_ref())
            .expect("decodes")
            .expect("present");
        assert_eq!(pool.spec.addresses, vec!["10.0.0.1-10.0.0.2".to_string()]);
        assert_eq!(pool.spec.prefix, 30);
    }
}
