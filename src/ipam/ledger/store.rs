//! Where a pool's ledger lives and how it is read, created, replaced and deleted.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};

use super::memory::{RecordOf, Stored};
use super::record::{LEDGER_LABEL, Ledger, POOL_ANNOTATION, POOL_UID_ANNOTATION};
use crate::ipam::context::Context;
use crate::ipam::dialect::{PoolDialect, PoolSpace};
use crate::runtime::error::{Error, Verb, object_of};
use crate::runtime::objects;

/// What reading a pool's ledger found.
#[derive(Debug)]
pub enum Loaded {
    Found(Stored),
    Missing,
    /// An object is there but is not a record this pool can trust: unreadable, or written for an
    /// earlier pool of the same name. It is replaced by a rebuilt ledger.
    Untrusted {
        reason: String,
        resource_version: Option<String>,
    },
}

/// Where one pool's ledger lives.
#[derive(Clone)]
pub struct LedgerRef {
    api: Api<ConfigMap>,
    pub namespace: String,
    pub name: String,
    /// Only for cluster-scoped pools: an owner in another namespace is not allowed.
    owner: Option<OwnerReference>,
    kind: String,
    pool: String,
    pool_uid: String,
}

/// FNV-1a: stable across releases, which a ledger name must be.
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The ConfigMap name of the ledger of pool `kind` `namespace/name`: `<kind>.<namespace>.<name>`
/// (`<kind>.<name>` for a cluster-scoped pool), which is a valid name for every valid pool name
/// and namespace up to 253 characters (namespaces hold no dots, so the form is unambiguous), and
/// `<kind>.<hash>` beyond.
pub fn ledger_name(kind: &str, namespace: Option<&str>, pool_name: &str) -> String {
    let kind = kind.to_lowercase();
    let name = match namespace {
        Some(ns) => format!("{kind}.{ns}.{pool_name}"),
        None => format!("{kind}.{pool_name}"),
    };
    if name.len() <= 253 {
        return name;
    }
    format!(
        "{kind}.{:016x}",
        fnv(&format!("{}/{pool_name}", namespace.unwrap_or_default()))
    )
}

impl LedgerRef {
    /// Where the ledger of pool `kind` `pool_namespace/pool_name` lives, for the pool of UID `pool_uid`.
    pub fn new(
        client: kube::Client,
        ledger_namespace: &str,
        kind: &str,
        pool_namespace: Option<&str>,
        pool_name: &str,
        pool_uid: String,
        owner: Option<OwnerReference>,
    ) -> Self {
        Self {
            api: Api::namespaced(client, ledger_namespace),
            namespace: ledger_namespace.to_string(),
            name: ledger_name(kind, pool_namespace, pool_name),
            owner,
            kind: kind.to_lowercase(),
            pool: format!("{kind}/{}/{pool_name}", pool_namespace.unwrap_or_default()),
            pool_uid,
        }
    }

    /// Which ledger of which pool this is, as this process remembers its records.
    pub fn record_of(&self) -> RecordOf {
        RecordOf {
            ledger: format!("{}/{}", self.namespace, self.name),
            pool: self.pool_uid.clone(),
        }
    }

    /// The ledger's ConfigMap, as people read its name.
    pub fn describe(&self) -> String {
        format!("ConfigMap {}/{}", self.namespace, self.name)
    }

    fn meta(&self, resource_version: Option<String>) -> ObjectMeta {
        ObjectMeta {
            name: Some(self.name.clone()),
            namespace: Some(self.namespace.clone()),
            labels: Some(BTreeMap::from([(
                LEDGER_LABEL.to_string(),
                self.kind.clone(),
            )])),
            annotations: Some(BTreeMap::from([
                (POOL_ANNOTATION.to_string(), self.pool.clone()),
                (POOL_UID_ANNOTATION.to_string(), self.pool_uid.clone()),
            ])),
            owner_references: self.owner.clone().map(|o| vec![o]),
            resource_version,
            ..Default::default()
        }
    }

    /// The ledger as the server has it now (never from a cache).
    pub async fn load(&self) -> Result<Loaded, Error> {
        let Some(config_map) = objects::get_optional(&self.api, &self.name).await? else {
            return Ok(Loaded::Missing);
        };
        let resource_version = config_map.metadata.resource_version.clone();
        let written_for = config_map
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(POOL_UID_ANNOTATION));
        if let Some(uid) = written_for.filter(|uid| **uid != self.pool_uid) {
            return Ok(Loaded::Untrusted {
                reason: format!("it was written for an earlier pool of this name (UID {uid})"),
                resource_version,
            });
        }
        Ok(match Ledger::from_config_map(&config_map) {
            Ok(ledger) => Loaded::Found(Stored::new(ledger, resource_version)),
            Err(reason) => Loaded::Untrusted {
                reason,
                resource_version,
            },
        })
    }

    /// Creates the ledger; `None` when another writer created it first (load it again).
    pub async fn create(&self, ledger: &Ledger) -> Result<Option<Stored>, Error> {
        let config_map = ledger.to_config_map(self.meta(None));
        match self.api.create(&PostParams::default(), &config_map).await {
            Ok(created) => Ok(Some(Stored::new(
                Ledger {
                    uid: created.metadata.uid,
                    ..ledger.clone()
                },
                created.metadata.resource_version,
            ))),
            Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(None),
            Err(kube::Error::Api(status)) if status.is_not_found() => {
                Err(Error::LedgerNamespaceMissing(self.namespace.clone()))
            }
            Err(e) => Err(Error::api(
                Verb::Create,
                object_of(&self.api, &self.name),
                e,
            )),
        }
    }

    /// Replaces the ledger if nobody wrote it since `version` was read; `None` on a conflict or
    /// when it was deleted meanwhile (load it again).
    pub async fn replace(
        &self,
        version: Option<&str>,
        ledger: &Ledger,
    ) -> Result<Option<Stored>, Error> {
        let config_map = ledger.to_config_map(self.meta(version.map(str::to_string)));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &config_map)
            .await
        {
            Ok(replaced) => Ok(Some(Stored::new(
                Ledger {
                    uid: replaced.metadata.uid,
                    ..ledger.clone()
                },
                replaced.metadata.resource_version,
            ))),
            Err(kube::Error::Api(status)) if status.is_conflict() || status.is_not_found() => {
                Ok(None)
            }
            Err(e) => Err(Error::api(
                Verb::Replace,
                object_of(&self.api, &self.name),
                e,
            )),
        }
    }

    /// Deletes the ledger (its pool is gone); a missing one is fine.
    pub async fn delete(&self) -> Result<(), Error> {
        objects::delete_ignoring_missing(&self.api, &self.name).await
    }
}

/// Where `pool`'s ledger lives.
pub fn ledger_of<P: PoolSpace>(pool: &P, ctx: &Context) -> LedgerRef {
    let kind = P::kind(&());
    // An owner must live in the same namespace or be cluster-scoped.
    let owner = pool
        .namespace()
        .is_none()
        .then(|| objects::owner_reference(pool, false))
        .flatten();
    LedgerRef::new(
        ctx.client.clone(),
        &ctx.settings.ledger_namespace,
        &kind,
        pool.namespace().as_deref(),
        &pool.name_any(),
        pool.ledger_identity(),
        owner,
    )
}

/// Creates the ledger namespace if it is missing (a missing one would stop every pool).
pub async fn ensure_namespace(client: &Client, name: &str) -> Result<(), Error> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if objects::get_optional(&namespaces, name).await?.is_some() {
        return Ok(());
    }
    let namespace = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    match namespaces.create(&PostParams::default(), &namespace).await {
        Ok(_) => {
            tracing::info!(namespace = name, "created the ledger namespace");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(()),
        Err(e) => Err(Error::api(Verb::Create, object_of(&namespaces, name), e)),
    }
}

/// The pool's ledger is about to go with it.
pub async fn forget<P: PoolDialect>(pool: &P, ctx: &Context) -> Result<(), Error> {
    let ledger = ledger_of(pool, ctx);
    ctx.records.forget(&ledger.record_of());
    ledger.delete().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledger_names_are_valid_for_every_valid_pool_name() {
        assert_eq!(
            ledger_name("InClusterIPPool", Some("ns"), "a"),
            "inclusterippool.ns.a"
        );
        assert_eq!(
            ledger_name("GlobalInClusterIPPool", None, "a"),
            "globalinclusterippool.a"
        );
        let long = "x".repeat(253);
        let name = ledger_name("GlobalInClusterIPPool", None, &long);
        assert!(name.len() <= 253);
        assert_ne!(
            name,
            ledger_name("GlobalInClusterIPPool", None, &"y".repeat(253))
        );
        assert_ne!(
            ledger_name("IPPool", Some("a"), &long),
            ledger_name("IPPool", Some("b"), &long)
        );
    }
}
