//! Which pool an object belongs to: the five pool kinds bitpool serves, and a pool's key.
//! Plain data, read by the webhook as by the engine.

use std::fmt;

use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use crate::api::capi::IPPoolReference;
use crate::api::{capi, metal3_ipam};

/// A kind of pool bitpool serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PoolKind {
    InClusterIPPool,
    GlobalInClusterIPPool,
    InClusterPrefixPool,
    GlobalInClusterPrefixPool,
    /// Metal3's `IPPool`.
    Metal3IPPool,
}

impl PoolKind {
    /// Every pool kind bitpool serves.
    pub const ALL: [PoolKind; 5] = [
        PoolKind::InClusterIPPool,
        PoolKind::GlobalInClusterIPPool,
        PoolKind::InClusterPrefixPool,
        PoolKind::GlobalInClusterPrefixPool,
        PoolKind::Metal3IPPool,
    ];

    /// The pool kind of an API group and kind, `None` for one bitpool does not serve.
    pub fn of(group: &str, kind: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|k| k.group() == group && k.as_str() == kind)
    }

    /// The kind as the API names it.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolKind::InClusterIPPool => "InClusterIPPool",
            PoolKind::GlobalInClusterIPPool => "GlobalInClusterIPPool",
            PoolKind::InClusterPrefixPool => "InClusterPrefixPool",
            PoolKind::GlobalInClusterPrefixPool => "GlobalInClusterPrefixPool",
            PoolKind::Metal3IPPool => metal3_ipam::POOL_KIND,
        }
    }

    /// The API group of the kind.
    pub fn group(self) -> &'static str {
        match self {
            PoolKind::Metal3IPPool => metal3_ipam::GROUP,
            _ => capi::GROUP,
        }
    }

    /// The resource as the API serves it (for access reviews).
    pub fn plural(self) -> &'static str {
        match self {
            PoolKind::InClusterIPPool => "inclusterippools",
            PoolKind::GlobalInClusterIPPool => "globalinclusterippools",
            PoolKind::InClusterPrefixPool => "inclusterprefixpools",
            PoolKind::GlobalInClusterPrefixPool => "globalinclusterprefixpools",
            PoolKind::Metal3IPPool => "ippools",
        }
    }

    /// Cluster-scoped: claims of any namespace name it.
    pub fn is_global(self) -> bool {
        matches!(
            self,
            PoolKind::GlobalInClusterIPPool | PoolKind::GlobalInClusterPrefixPool
        )
    }

    /// Hands out sub-prefixes rather than addresses.
    pub fn is_prefix(self) -> bool {
        matches!(
            self,
            PoolKind::InClusterPrefixPool | PoolKind::GlobalInClusterPrefixPool
        )
    }

    /// Metal3's own kind: its claims and address objects may be Metal3 IPClaims and
    /// IPAddresses too, and its group is served only where Metal3's CRDs are.
    pub fn is_metal3(self) -> bool {
        self.group() == metal3_ipam::GROUP
    }

    /// The version of the kind the API server stores, which bitpool reads it at.
    pub fn stored_version(self) -> &'static str {
        match self.is_metal3() {
            true => "v1alpha1",
            false => "v1alpha2",
        }
    }
}

impl fmt::Display for PoolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which pool a claim or an address object belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolKey {
    pub kind: PoolKind,
    /// `None` for a cluster-scoped pool.
    pub namespace: Option<String>,
    pub name: String,
}

impl PoolKey {
    /// The namespace of the bitpool pool a CAPI `poolRef` names, seen from an object in
    /// `namespace`: that namespace for a namespaced pool, `Some(None)` for a cluster-scoped one,
    /// `None` for a kind bitpool does not serve.
    fn scope_of<'a>(
        pool_ref: &IPPoolReference,
        namespace: Option<&'a str>,
    ) -> Option<(PoolKind, Option<&'a str>)> {
        let kind = PoolKind::of(&pool_ref.api_group, &pool_ref.kind)?;
        Some((kind, namespace.filter(|_| !kind.is_global())))
    }

    /// The bitpool pool a CAPI `poolRef` names, seen from an object in `namespace`.
    pub fn of_ref(pool_ref: &IPPoolReference, namespace: &str) -> Option<Self> {
        let (kind, namespace) = Self::scope_of(pool_ref, Some(namespace))?;
        Some(Self {
            kind,
            namespace: namespace.map(str::to_string),
            name: pool_ref.name.clone(),
        })
    }

    /// Whether a CAPI `poolRef` seen from `namespace` names this pool, as [`Self::of_ref`]
    /// would say, without building a key: it is asked of every object in a cache.
    pub fn is_named_by(&self, pool_ref: &IPPoolReference, namespace: Option<&str>) -> bool {
        Self::scope_of(pool_ref, namespace).is_some_and(|(kind, scope)| {
            pool_ref.name == self.name && kind == self.kind && scope == self.namespace.as_deref()
        })
    }

    /// The pool an IPAddress names.
    pub fn of_address(address: &capi::IPAddress) -> Option<Self> {
        Self::of_ref(&address.spec.pool_ref, &address.namespace()?)
    }

    /// The pool a Metal3 IPAddress names.
    pub fn of_metal3_address(address: &metal3_ipam::Metal3IPAddress) -> Option<Self> {
        Some(Self {
            kind: PoolKind::Metal3IPPool,
            namespace: Some(address.namespace()?),
            name: address.spec.pool.name.clone()?,
        })
    }

    /// The reconcile request for this pool, if it is of kind `P`.
    pub fn object_ref<P: Resource<DynamicType = ()>>(&self) -> Option<ObjectRef<P>> {
        (self.kind.as_str() == P::kind(&())).then(|| {
            let r = ObjectRef::new(&self.name);
            match &self.namespace {
                Some(ns) => r.within(ns),
                None => r,
            }
        })
    }

    /// The pool as people read it: `<Kind> <namespace>/<name>`.
    pub fn describe(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.kind, self.name),
            None => format!("{} {}", self.kind, self.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_reads_back_from_its_group_and_name() {
        for kind in PoolKind::ALL {
            assert_eq!(PoolKind::of(kind.group(), kind.as_str()), Some(kind));
        }
        assert_eq!(PoolKind::of("other.example", "InClusterIPPool"), None);
        assert_eq!(PoolKind::of(capi::GROUP, "IPPool"), None);
    }

    /// The allocation-free check says what building the key would say, for every combination.
    #[test]
    fn is_named_by_agrees_with_of_ref() {
        let kinds = [
            (capi::GROUP, "InClusterIPPool"),
            (capi::GROUP, "GlobalInClusterIPPool"),
            (capi::GROUP, "InClusterPrefixPool"),
            (capi::GROUP, "GlobalInClusterPrefixPool"),
            (metal3_ipam::GROUP, metal3_ipam::POOL_KIND),
            ("other.example", "InClusterIPPool"),
        ];
        let refs: Vec<IPPoolReference> = kinds
            .iter()
            .flat_map(|(group, kind)| {
                ["a", "b"].map(|name| IPPoolReference {
                    name: name.into(),
                    kind: kind.to_string(),
                    api_group: group.to_string(),
                })
            })
            .collect();
        let namespaces = ["ns1", "ns2"];
        let keys: Vec<PoolKey> = refs
            .iter()
            .flat_map(|r| namespaces.iter().filter_map(|ns| PoolKey::of_ref(r, ns)))
            .collect();
        for key in &keys {
            for r in &refs {
                for ns in namespaces {
                    let built = PoolKey::of_ref(r, ns);
                    assert_eq!(
                        key.is_named_by(r, Some(ns)),
                        built.as_ref() == Some(key),
                        "{key:?} {r:?} {ns}"
                    );
                }
            }
        }
    }
}
