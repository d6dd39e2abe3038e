//! The pool a cluster's endpoint annotation names, and the claim bitpool makes for it.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::api::capi::{
    ENDPOINT_CLAIM_LABEL, ENDPOINT_POOL_ANNOTATION, IPAddressClaim, IPAddressClaimSpec,
    IPPoolReference,
};
use crate::api::labels;
use crate::api::metal3_ipam::REQUESTED_ADDRESS_ANNOTATION;
use crate::ipam::key::{PoolKey, PoolKind};

/// The port written where an endpoint has none: the API server's, as kubeadm and CAPM3 default it.
pub const DEFAULT_PORT: i32 = 6443;
/// What the annotation ([`ENDPOINT_POOL_ANNOTATION`]) is, for messages that name it.
pub const FIELD: &str = "metadata.annotations[ipam.bitpool.dev/control-plane-endpoint-pool]";

/// The address pool an endpoint comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointPool {
    pub kind: PoolKind,
    pub name: String,
}

/// Why an annotation names no pool.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    #[error("{value:?} is not <kind>/<name>, for example InClusterIPPool/vips")]
    Shape { value: String },
    #[error(
        "{kind:?} is not an address pool kind: use InClusterIPPool, GlobalInClusterIPPool or IPPool (Metal3)"
    )]
    Kind { kind: String },
    #[error(
        "{name:?} is not a pool name (lower-case letters, digits, '-' and '.', at most 253 characters)"
    )]
    Name { name: String },
}

/// The kinds an endpoint may come from, as the annotation spells them.
const KINDS: [PoolKind; 3] = [
    PoolKind::InClusterIPPool,
    PoolKind::GlobalInClusterIPPool,
    PoolKind::Metal3IPPool,
];

impl EndpointPool {
    /// Reads `<kind>/<name>`.
    pub fn parse(value: &str) -> Result<Self, ReferenceError> {
        let shape = || ReferenceError::Shape {
            value: value.to_string(),
        };
        let (kind, name) = value.trim().split_once('/').ok_or_else(shape)?;
        if kind.is_empty() || name.is_empty() || name.contains('/') {
            return Err(shape());
        }
        let kind = KINDS
            .into_iter()
            .find(|k| k.as_str() == kind)
            .ok_or_else(|| ReferenceError::Kind {
                kind: kind.to_string(),
            })?;
        if !is_dns_subdomain(name) {
            return Err(ReferenceError::Name {
                name: name.to_string(),
            });
        }
        Ok(Self {
            kind,
            name: name.to_string(),
        })
    }

    /// The pool an object's annotation names; `None` when it has no annotation.
    pub fn of(meta: &ObjectMeta) -> Option<Result<Self, ReferenceError>> {
        let value = meta.annotations.as_ref()?.get(ENDPOINT_POOL_ANNOTATION)?;
        Some(Self::parse(value))
    }

    /// The claim's `poolRef`.
    pub fn pool_ref(&self) -> IPPoolReference {
        IPPoolReference {
            name: self.name.clone(),
            kind: self.kind.as_str().to_string(),
            api_group: self.kind.group().to_string(),
        }
    }

    /// The pool, seen from a cluster in `namespace`.
    pub fn key(&self, namespace: &str) -> PoolKey {
        PoolKey {
            kind: self.kind,
            namespace: (!self.kind.is_global()).then(|| namespace.to_string()),
            name: self.name.clone(),
        }
    }
}

/// `name` is a DNS subdomain (RFC 1123), as object names are.
fn is_dns_subdomain(name: &str) -> bool {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    name.len() <= 253 && name.split('.').all(label_ok)
}

/// The name of the claim of Cluster `cluster`'s endpoint (Cluster names have at most 63
/// characters, so it is a valid name).
pub fn claim_name(cluster: &str) -> String {
    format!("{cluster}-control-plane-endpoint")
}

/// The Cluster an endpoint claim was made for, from its labels (`label` looks one up).
pub fn cluster_of_claim<'a>(label: impl Fn(&str) -> Option<&'a str>) -> Option<&'a str> {
    label(ENDPOINT_CLAIM_LABEL)?;
    label(labels::CLUSTER_NAME)
}

/// What an endpoint claim is made of.
pub struct ClaimFor<'a> {
    pub namespace: &'a str,
    pub cluster: &'a str,
    pub owner: OwnerReference,
    pub pool: &'a EndpointPool,
    /// The `--watch-filter` label value of the object that asked: a process limited by that
    /// label serves the claim.
    pub watch_filter: Option<&'a str>,
    /// The address asked for (an endpoint already set to it), if any.
    pub requested: Option<&'a str>,
}

/// The claim for a Cluster's endpoint, owned by the Cluster.
pub fn claim(of: ClaimFor<'_>) -> IPAddressClaim {
    let ClaimFor {
        namespace,
        cluster,
        owner,
        pool,
        watch_filter,
        requested,
    } = of;
    let mut claim_labels = BTreeMap::from([
        (labels::CLUSTER_NAME.to_string(), cluster.to_string()),
        (ENDPOINT_CLAIM_LABEL.to_string(), "true".to_string()),
    ]);
    if let Some(value) = watch_filter {
        claim_labels.insert(labels::WATCH_FILTER.to_string(), value.to_string());
    }
    IPAddressClaim {
        metadata: ObjectMeta {
            name: Some(claim_name(cluster)),
            namespace: Some(namespace.to_string()),
            labels: Some(claim_labels),
            owner_references: Some(vec![owner]),
            annotations: requested.map(|address| {
                BTreeMap::from([(
                    REQUESTED_ADDRESS_ANNOTATION.to_string(),
                    address.to_string(),
                )])
            }),
            ..Default::default()
        },
        spec: IPAddressClaimSpec {
            cluster_name: Some(cluster.to_string()),
            pool_ref: pool.pool_ref(),
        },
        status: None,
    }
}

/// The owner reference of an endpoint claim to its Cluster. The controller reference: the
/// claim lives and goes with the Cluster alone. It does not block the Cluster's deletion.
pub fn owner(api_version: &str, cluster: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.to_string(),
        kind: "Cluster".to_string(),
        name: cluster.to_string(),
        uid: uid.to_string(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_field_in_messages_is_the_annotation() {
        assert_eq!(
            FIELD,
            format!("metadata.annotations[{ENDPOINT_POOL_ANNOTATION}]")
        );
    }

    #[test]
    fn the_annotation_names_an_address_pool_by_kind_and_name() {
        let ok = |kind, name: &str| {
            Ok(EndpointPool {
                kind,
                name: name.to_string(),
            })
        };
        let cases: &[(&str, Result<EndpointPool, ReferenceError>)] = &[
            (
                "InClusterIPPool/vips",
                ok(PoolKind::InClusterIPPool, "vips"),
            ),
            (
                "GlobalInClusterIPPool/dc1.vips",
                ok(PoolKind::GlobalInClusterIPPool, "dc1.vips"),
            ),
            (
                "IPPool/provisioning",
                ok(PoolKind::Metal3IPPool, "provisioning"),
            ),
            (" IPPool/vips ", ok(PoolKind::Metal3IPPool, "vips")),
            (
                "vips",
                Err(ReferenceError::Shape {
                    value: "vips".into(),
                }),
            ),
            (
                "InClusterIPPool/",
                Err(ReferenceError::Shape {
                    value: "InClusterIPPool/".into(),
                }),
            ),
            (
                "InClusterIPPool/a/b",
                Err(ReferenceError::Shape {
                    value: "InClusterIPPool/a/b".into(),
                }),
            ),
            (
                "InClusterPrefixPool/vips",
                Err(ReferenceError::Kind {
                    kind: "InClusterPrefixPool".into(),
                }),
            ),
            (
                "inclusterippool/vips",
                Err(ReferenceError::Kind {
                    kind: "inclusterippool".into(),
                }),
            ),
            (
                "InClusterIPPool/VIPs",
                Err(ReferenceError::Name {
                    name: "VIPs".into(),
                }),
            ),
            (
                "InClusterIPPool/-vips",
                Err(ReferenceError::Name {
                    name: "-vips".into(),
                }),
            ),
        ];
        for (value, expected) in cases {
            assert_eq!(&EndpointPool::parse(value), expected, "{value:?}");
        }
    }

    #[test]
    fn the_claim_is_the_clusters_and_names_the_pool() {
        let pool = EndpointPool::parse("GlobalInClusterIPPool/vips").expect("a pool");
        let claim = claim(ClaimFor {
            namespace: "team-a",
            cluster: "c1",
            owner: owner("cluster.x-k8s.io/v1beta2", "c1", "uid-1"),
            pool: &pool,
            watch_filter: Some("test-7"),
            requested: Some("10.0.0.9"),
        });
        let annotations = claim.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations.get("ipAddress").map(String::as_str),
            Some("10.0.0.9")
        );
        assert_eq!(
            claim.metadata.name.as_deref(),
            Some("c1-control-plane-endpoint")
        );
        assert_eq!(claim.spec.cluster_name.as_deref(), Some("c1"));
        assert_eq!(claim.spec.pool_ref.api_group, "ipam.cluster.x-k8s.io");
        assert_eq!(claim.spec.pool_ref.kind, "GlobalInClusterIPPool");
        let claim_labels = claim.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            cluster_of_claim(|k| claim_labels.get(k).map(String::as_str)),
            Some("c1")
        );
        assert_eq!(
            claim_labels.get(labels::WATCH_FILTER).map(String::as_str),
            Some("test-7")
        );
        let owners = claim.metadata.owner_references.unwrap_or_default();
        assert_eq!(owners.len(), 1);
        assert_eq!(
            (owners[0].uid.as_str(), owners[0].controller),
            ("uid-1", Some(true))
        );
        assert_eq!(pool.key("team-a").namespace, None, "a global pool");
        let metal3 = EndpointPool::parse("IPPool/p").expect("a pool");
        assert_eq!(metal3.pool_ref().api_group, "ipam.metal3.io");
        assert_eq!(metal3.key("team-a").namespace.as_deref(), Some("team-a"));
    }
}
