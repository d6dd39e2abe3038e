//! Ledgers whose pool is gone. A pool's finalizer deletes its ledger, but a pool can go without
//! it: `clusterctl move` removes the finalizers of what it deletes on the source right after the
//! delete, and a person can do the same. Only a cluster-scoped pool's ledger has an owner the
//! garbage collector follows (an owner must be in the same namespace or cluster-scoped), so the
//! leader looks for such ledgers now and then and deletes each whose pool the server says is
//! gone — on the condition that the ledger is still the one it read.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, ObjectMeta};
use kube::core::GroupVersionKind;

use super::Context;
use super::key::{PoolKey, PoolKind};
use super::ledger::{LEDGER_LABEL, POOL_ANNOTATION};
use crate::runtime::error::{Call, Error, Verb};

/// How often the leader looks for ledgers whose pool is gone.
pub const EVERY: Duration = Duration::from_secs(60);

/// Looks for ledgers of gone pools every [`EVERY`] while this process leads, until shutdown.
pub async fn run(ctx: Arc<Context>) {
    let mut tick = tokio::time::interval(EVERY);
    loop {
        tick.tick().await;
        if ctx.shutting_down() {
            return;
        }
        if !ctx.ops.leadership.is_leading() || ctx.ops.not_ready().is_some() {
            continue;
        }
        match sweep(&ctx).await {
            Ok(0) => {}
            Ok(deleted) => tracing::info!(deleted, "deleted the ledgers of pools that are gone"),
            Err(e) => tracing::warn!(error = %e, "cannot look for ledgers of pools that are gone"),
        }
    }
}

/// The pool a ledger names (its [`POOL_ANNOTATION`], `<kind>/<namespace>/<name>`).
pub fn pool_of(ledger: &ObjectMeta) -> Option<PoolKey> {
    let text = ledger.annotations.as_ref()?.get(POOL_ANNOTATION)?;
    let mut parts = text.splitn(3, '/');
    let (kind, namespace, name) = (parts.next()?, parts.next()?, parts.next()?);
    let kind = PoolKind::ALL.into_iter().find(|k| k.as_str() == kind)?;
    Some(PoolKey {
        kind,
        namespace: (!namespace.is_empty()).then(|| namespace.to_string()),
        name: name.to_string(),
    })
}

/// Deletes the ledgers of pools of the kinds this process serves that the server no longer has.
async fn sweep(ctx: &Context) -> Result<usize, Error> {
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.settings.ledger_namespace);
    let listed = api
        .list_metadata(&ListParams::default().labels(LEDGER_LABEL))
        .await
        .call(Verb::List, &api, LEDGER_LABEL)?;
    let mut deleted = 0;
    for ledger in listed.items {
        let Some(pool) = pool_of(&ledger.metadata) else {
            continue;
        };
        let served = match pool.kind.is_metal3() {
            true => ctx.settings.groups.metal3_pools(),
            false => ctx.settings.groups.capi_ipam,
        };
        if !served || ctx.pool_exists(&pool) || exists(ctx, &pool).await? {
            continue;
        }
        let name = ledger.metadata.name.clone().unwrap_or_default();
        let only_this = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: ledger.metadata.uid.clone(),
                resource_version: ledger.metadata.resource_version.clone(),
            }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &only_this).await {
            Ok(_) => {
                tracing::info!(ledger = %name, pool = %pool.describe(), "deleted the ledger of a pool that is gone");
                deleted += 1;
            }
            // Gone already, or written since it was listed (its pool came back): left alone.
            Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => {}
            Err(e) => return Err(Error::api(Verb::Delete, format!("ConfigMap {name}"), e)),
        }
    }
    Ok(deleted)
}

/// Whether the server has the pool (a fresh read: the cache may lag a pool just created).
async fn exists(ctx: &Context, pool: &PoolKey) -> Result<bool, Error> {
    let version = pool.kind.stored_version();
    let gvk = GroupVersionKind::gvk(pool.kind.group(), version, pool.kind.as_str());
    let resource = ApiResource::from_gvk_with_plural(&gvk, pool.kind.plural());
    let api: Api<DynamicObject> = match &pool.namespace {
        Some(ns) => Api::namespaced_with(ctx.client.clone(), ns, &resource),
        None => Api::all_with(ctx.client.clone(), &resource),
    };
    let found = api
        .get_metadata_opt(&pool.name)
        .await
        .call(Verb::Get, &api, &pool.name)?;
    Ok(found.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotated(value: &str) -> ObjectMeta {
        ObjectMeta {
            annotations: Some([(POOL_ANNOTATION.to_string(), value.to_string())].into()),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn a_ledger_names_its_pool() {
        let key = pool_of(&annotated("InClusterIPPool/ns/a/b")).expect("a pool");
        assert_eq!(key.kind, PoolKind::InClusterIPPool);
        assert_eq!(key.namespace.as_deref(), Some("ns"));
        assert_eq!(key.name, "a/b");
        let global = pool_of(&annotated("GlobalInClusterIPPool//g")).expect("a pool");
        assert_eq!(global.namespace, None);
        assert_eq!(
            pool_of(&annotated("IPPool/m/p")).map(|k| k.kind),
            Some(PoolKind::Metal3IPPool)
        );
        assert!(pool_of(&annotated("Nothing/ns/x")).is_none());
        assert!(pool_of(&ObjectMeta::default()).is_none());
    }
}
