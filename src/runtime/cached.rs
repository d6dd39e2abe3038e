//! Objects as the caches hold them: what bitpool reads of them and nothing else, with the values
//! that repeat across objects shared ([`super::intern`]). A cached address object takes a
//! fraction of the object kube decodes (whose metadata alone is 360 bytes before its strings);
//! `tests/cache_memory.rs` pins how much.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use kube::api::ObjectMeta;

use super::intern::{self, Interner};
use crate::api::capi::{IPAddress, IPAddressClaim, IPPoolReference, READY_CONDITION};
use crate::api::labels;
use crate::api::metal3_ipam::{self, IPClaim, Metal3IPAddress};

/// Which API a claim or address object is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IpamApi {
    /// `ipam.cluster.x-k8s.io` IPAddressClaim and IPAddress.
    Capi,
    /// `ipam.metal3.io` IPClaim and IPAddress.
    Metal3,
}

/// An object's UID: 16 bytes for the UUIDs the API server makes, the text otherwise.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Uid {
    Uuid([u8; 16]),
    Other(Box<str>),
}

impl Uid {
    /// The UID `text` names, kept as 16 bytes where it is a UUID.
    pub fn of(text: &str) -> Self {
        Self::parse(text).map_or_else(|| Self::Other(text.into()), Self::Uuid)
    }

    /// The canonical form only (lowercase, hyphenated), so that the text comes back unchanged.
    fn parse(text: &str) -> Option<[u8; 16]> {
        let bytes = text.as_bytes();
        if bytes.len() != 36 || [8, 13, 18, 23].iter().any(|&i| bytes[i] != b'-') {
            return None;
        }
        let digits: Vec<u8> = bytes.iter().copied().filter(|b| *b != b'-').collect();
        let nibble = |b: u8| match b {
            b'0'..=b'9' => Some(b - b'0'),
            b'a'..=b'f' => Some(b - b'a' + 10),
            _ => None,
        };
        let mut uuid = [0u8; 16];
        for (i, pair) in digits.chunks(2).enumerate() {
            *uuid.get_mut(i)? = nibble(pair[0])? << 4 | nibble(*pair.get(1)?)?;
        }
        (digits.len() == 32).then_some(uuid)
    }

    /// Whether no UID is set.
    pub fn is_empty(&self) -> bool {
        matches!(self, Self::Other(text) if text.is_empty())
    }
}

impl std::fmt::Display for Uid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Other(text) => f.write_str(text),
            // Written whole: reconciles turn every claim's UID of a pool into text.
            Self::Uuid(bytes) => {
                let text = hyphenated(bytes);
                f.write_str(std::str::from_utf8(&text).map_err(|_| std::fmt::Error)?)
            }
        }
    }
}

/// The canonical text of a UUID: lowercase hex, hyphens after the 4th, 6th, 8th and 10th byte.
fn hyphenated(bytes: &[u8; 16]) -> [u8; 36] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut text = [b'-'; 36];
    let mut at = 0;
    for (i, byte) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            at += 1;
        }
        text[at] = HEX[usize::from(byte >> 4)];
        text[at + 1] = HEX[usize::from(byte & 0x0f)];
        at += 2;
    }
    text
}

impl std::fmt::Debug for Uid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

/// An owner reference. One that is not the object's controller is usually the same for many
/// objects (the pool that owns every address of the pool), and is shared whole.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Owner {
    pub api_version: Arc<str>,
    pub kind: Arc<str>,
    pub name: Arc<str>,
    pub uid: Uid,
    pub controller: Option<bool>,
    pub block_owner_deletion: Option<bool>,
}

impl Owner {
    /// `reference` as cached; `object` is the owned object's name, which a controller's name
    /// often repeats (a claim and its address object).
    fn of(reference: &OwnerReference, object: &Arc<str>) -> Arc<Self> {
        let controller = reference.controller == Some(true);
        let name = if controller && reference.name == **object {
            object.clone()
        } else {
            Arc::from(reference.name.as_str())
        };
        let owner = Self {
            api_version: intern::string(&reference.api_version),
            kind: intern::string(&reference.kind),
            name,
            uid: Uid::of(&reference.uid),
            controller: reference.controller,
            block_owner_deletion: reference.block_owner_deletion,
        };
        if controller {
            Arc::new(owner)
        } else {
            OWNERS.get(&owner, |v: &Owner| Arc::new(v.clone()))
        }
    }

    /// The owner reference as the API writes it.
    pub fn reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: self.api_version.to_string(),
            kind: self.kind.to_string(),
            name: self.name.to_string(),
            uid: self.uid.to_string(),
            controller: self.controller,
            block_owner_deletion: self.block_owner_deletion,
        }
    }
}

/// The metadata bitpool reads of a cached object.
#[derive(Clone, Debug, PartialEq)]
pub struct Meta {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    pub uid: Uid,
    /// For writes that must not overwrite a newer object.
    pub resource_version: Box<str>,
    pub created: Option<Time>,
    pub deleted: Option<Time>,
    /// Shared: most objects of a kind carry the same list.
    pub finalizers: Arc<[Arc<str>]>,
    pub owners: Box<[Arc<Owner>]>,
    /// Every label, the set shared (objects of one cluster carry the same labels).
    pub labels: intern::Labels,
}

impl Meta {
    /// `None` for an object without a name or namespace (only a namespaced kind is cached here).
    pub fn of(meta: &ObjectMeta) -> Option<Self> {
        let name: Arc<str> = Arc::from(meta.name.as_deref()?);
        Some(Self {
            namespace: intern::string(meta.namespace.as_deref()?),
            uid: Uid::of(meta.uid.as_deref().unwrap_or_default()),
            resource_version: meta.resource_version.as_deref().unwrap_or_default().into(),
            created: meta.creation_timestamp.clone(),
            deleted: meta.deletion_timestamp.clone(),
            finalizers: intern::strings(meta.finalizers.iter().flatten()),
            owners: (meta.owner_references.iter().flatten())
                .map(|o| Owner::of(o, &name))
                .collect(),
            labels: intern::labels(meta.labels.iter().flatten()),
            name,
        })
    }

    /// Whether the object carries `finalizer`.
    pub fn has_finalizer(&self, finalizer: &str) -> bool {
        self.finalizers.iter().any(|f| &**f == finalizer)
    }

    /// The object's label `key`, if it has it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| &**k == key)
            .map(|(_, v)| &**v)
    }

    /// The metadata as Kubernetes spells it (built anew: for comparisons off the hot path).
    pub fn object_meta(&self) -> ObjectMeta {
        let some_vec = |v: Vec<String>| (!v.is_empty()).then_some(v);
        ObjectMeta {
            namespace: Some(self.namespace.to_string()),
            name: Some(self.name.to_string()),
            uid: (!self.uid.is_empty()).then(|| self.uid.to_string()),
            resource_version: (!self.resource_version.is_empty())
                .then(|| self.resource_version.to_string()),
            creation_timestamp: self.created.clone(),
            deletion_timestamp: self.deleted.clone(),
            finalizers: some_vec(self.finalizers.iter().map(|f| f.to_string()).collect()),
            owner_references: (!self.owners.is_empty())
                .then(|| self.owners.iter().map(|o| o.reference()).collect()),
            labels: (!self.labels.is_empty()).then(|| {
                self.labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>()
            }),
            ..Default::default()
        }
    }
}

/// An address object of either API, as the caches hold it.
#[derive(Clone, Debug, PartialEq)]
pub struct AddressObject {
    pub api: IpamApi,
    pub meta: Meta,
    /// `spec.address` as written (it may not parse).
    pub address: Box<str>,
    pub prefix: Option<i32>,
    pub gateway: Option<Arc<str>>,
    pub dns_servers: Arc<[Arc<str>]>,
    /// The claim it answers, by name (shared with the object's own name, or its owner's).
    pub claim: Arc<str>,
    /// The pool it is from. A Metal3 address's pool is given as a Metal3 IPPool reference, with
    /// an empty name when the object names none.
    pub pool: Arc<IPPoolReference>,
}

impl AddressObject {
    fn new(api: IpamApi, meta: Meta, address: &str, claim: &str, pool: &IPPoolReference) -> Self {
        // The claim's name is the object's (CAPI pools) or its controller owner's (Metal3).
        let shared = std::iter::once(&meta.name)
            .chain(meta.owners.iter().map(|o| &o.name))
            .find(|name| ***name == *claim)
            .cloned();
        let claim = shared.unwrap_or_else(|| Arc::from(claim));
        Self {
            api,
            meta,
            address: address.into(),
            prefix: None,
            gateway: None,
            dns_servers: intern::strings([]),
            claim,
            pool: intern::pool_reference(pool),
        }
    }

    /// A CAPI IPAddress as cached; `None` without a name or namespace.
    pub fn of_capi(object: &IPAddress) -> Option<Self> {
        let spec = &object.spec;
        let meta = Meta::of(&object.metadata)?;
        Some(Self {
            prefix: Some(spec.prefix),
            gateway: spec.gateway.as_deref().map(intern::string),
            ..Self::new(
                IpamApi::Capi,
                meta,
                &spec.address,
                &spec.claim_ref.name,
                &spec.pool_ref,
            )
        })
    }

    /// A Metal3 IPAddress as cached; `None` without a name or namespace.
    pub fn of_metal3(object: &Metal3IPAddress) -> Option<Self> {
        let spec = &object.spec;
        let meta = Meta::of(&object.metadata)?;
        let pool = IPPoolReference {
            name: spec.pool.name.clone().unwrap_or_default(),
            kind: "IPPool".into(),
            api_group: metal3_ipam::GROUP.into(),
        };
        Some(Self {
            prefix: spec.prefix,
            gateway: spec.gateway.as_deref().map(intern::string),
            dns_servers: intern::strings(&spec.dns_servers),
            ..Self::new(
                IpamApi::Metal3,
                meta,
                &spec.address,
                spec.claim.name.as_deref().unwrap_or_default(),
                &pool,
            )
        })
    }
}

/// Owner references many objects have (such as their pool), one copy each.
static OWNERS: LazyLock<Interner<Owner>> = LazyLock::new(Interner::new);
/// Conditions' types, statuses and reasons, one copy each.
static CONDITION_HEADS: LazyLock<Interner<ConditionHead>> = LazyLock::new(Interner::new);

/// The shared copy of a condition's type, status and reason.
fn shared_head(value: ConditionHead) -> Arc<ConditionHead> {
    CONDITION_HEADS.get(&value, |v: &ConditionHead| Arc::new(v.clone()))
}

/// A condition's type, status and reason: one shared copy for the claims that say the same.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConditionHead {
    pub type_: Arc<str>,
    pub status: Arc<str>,
    pub reason: Arc<str>,
}

/// A status condition of a cached claim.
#[derive(Clone, Debug, PartialEq)]
pub struct CachedCondition {
    pub head: Arc<ConditionHead>,
    pub message: Box<str>,
    pub last_transition_time: Time,
    pub observed_generation: Option<i64>,
}

impl CachedCondition {
    fn of(condition: &Condition) -> Self {
        Self {
            head: shared_head(ConditionHead {
                type_: intern::string(&condition.type_),
                status: intern::string(&condition.status),
                reason: intern::string(&condition.reason),
            }),
            message: condition.message.as_str().into(),
            last_transition_time: condition.last_transition_time.clone(),
            observed_generation: condition.observed_generation,
        }
    }

    /// The condition as Kubernetes spells it, for a status patch.
    pub fn condition(&self) -> Condition {
        Condition {
            type_: self.head.type_.to_string(),
            status: self.head.status.to_string(),
            reason: self.head.reason.to_string(),
            message: self.message.to_string(),
            last_transition_time: self.last_transition_time.clone(),
            observed_generation: self.observed_generation,
        }
    }
}

/// A claim of either API, as the caches hold it: an IPAddressClaim or a Metal3 IPClaim.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimObject {
    pub api: IpamApi,
    pub meta: Meta,
    pub generation: Option<i64>,
    /// The pool it names. A Metal3 claim's is given as a Metal3 IPPool reference, with an empty
    /// name when it names none.
    pub pool: Arc<IPPoolReference>,
    /// A Metal3 claim naming a pool of another namespace (which upstream never serves).
    pub pool_elsewhere: bool,
    /// `spec.clusterName` (CAPI claims).
    pub cluster_name: Option<Arc<str>>,
    /// The address object its status names, if any.
    pub address: Option<Arc<str>>,
    /// Its status conditions (CAPI claims): every one, since a status patch writes the list
    /// whole.
    pub conditions: Box<[CachedCondition]>,
    /// What few claims have, apart: most claims have none of it.
    pub rare: Option<Box<RareClaimFields>>,
}

/// The fields of a cached claim that most claims do not have.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RareClaimFields {
    /// The value of the pause annotation.
    pub pause: Option<Arc<str>>,
    /// The `ipAddress` annotation (Metal3's, honoured on both kinds).
    pub requested: Option<Box<str>>,
    /// Upstream's `status.errorMessage` (Metal3 claims).
    pub error_message: Option<Box<str>>,
}

impl RareClaimFields {
    /// `None` when the claim has none of them.
    fn boxed(self) -> Option<Box<Self>> {
        (self != Self::default()).then(|| Box::new(self))
    }
}

impl ClaimObject {
    fn new(
        api: IpamApi,
        meta: Meta,
        source: &ObjectMeta,
        pool: &IPPoolReference,
        error_message: Option<&str>,
    ) -> Self {
        let annotation = |key: &str| source.annotations.as_ref()?.get(key);
        let rare = RareClaimFields {
            pause: annotation(labels::PAUSED).map(|v| intern::string(v)),
            requested: annotation(metal3_ipam::REQUESTED_ADDRESS_ANNOTATION)
                .map(|v| v.as_str().into()),
            error_message: error_message.map(Box::from),
        };
        Self {
            api,
            meta,
            generation: source.generation,
            pool: intern::pool_reference(pool),
            pool_elsewhere: false,
            cluster_name: None,
            address: None,
            conditions: Box::new([]),
            rare: rare.boxed(),
        }
    }

    /// An IPAddressClaim as cached; `None` without a name or namespace.
    pub fn of_capi(object: &IPAddressClaim) -> Option<Self> {
        let meta = Meta::of(&object.metadata)?;
        let status = object.status.as_ref();
        // A CAPI pool names the address object after the claim: one copy of the name.
        let address = status.and_then(|s| s.address_ref.as_ref()).map(|r| {
            if *r.name == *meta.name {
                meta.name.clone()
            } else {
                Arc::from(r.name.as_str())
            }
        });
        Some(Self {
            cluster_name: object.spec.cluster_name.as_deref().map(intern::string),
            address,
            conditions: status
                .map(|s| s.conditions.iter().map(CachedCondition::of).collect())
                .unwrap_or_default(),
            ..Self::new(
                IpamApi::Capi,
                meta,
                &object.metadata,
                &object.spec.pool_ref,
                None,
            )
        })
    }

    /// A Metal3 IPClaim as cached; `None` without a name or namespace.
    pub fn of_metal3(object: &IPClaim) -> Option<Self> {
        let meta = Meta::of(&object.metadata)?;
        let pool = &object.spec.pool;
        let pool_elsewhere = pool
            .namespace
            .as_deref()
            .is_some_and(|ns| !ns.is_empty() && *ns != *meta.namespace);
        let reference = IPPoolReference {
            name: pool.name.clone().unwrap_or_default(),
            kind: "IPPool".into(),
            api_group: metal3_ipam::GROUP.into(),
        };
        let status = object.status.as_ref();
        Some(Self {
            pool_elsewhere,
            address: status
                .and_then(|s| s.address.as_ref()?.name.as_deref())
                .map(Arc::from),
            ..Self::new(
                IpamApi::Metal3,
                meta,
                &object.metadata,
                &reference,
                status.and_then(|s| s.error_message.as_deref()),
            )
        })
    }

    /// Whether it is paused for bitpool: the pause annotation with any value but
    /// [`labels::HANDED_TO_BITPOOL`] (which pauses everyone else).
    pub fn paused(&self) -> bool {
        self.rare
            .as_ref()
            .and_then(|r| r.pause.as_deref())
            .is_some_and(|value| value != labels::HANDED_TO_BITPOOL)
    }

    /// The `ipAddress` annotation (Metal3's, honoured on both kinds).
    pub fn requested_address(&self) -> Option<&str> {
        self.rare.as_ref()?.requested.as_deref()
    }

    /// Upstream's `status.errorMessage` (Metal3 claims).
    pub fn error_message(&self) -> Option<&str> {
        self.rare.as_ref()?.error_message.as_deref()
    }

    /// The message of its `Ready=False` condition: why its provider serves it no address.
    pub fn refusal(&self) -> Option<&str> {
        self.conditions
            .iter()
            .find(|c| &*c.head.type_ == READY_CONDITION && &*c.head.status == "False")
            .map(|c| &*c.message)
            .filter(|m| !m.is_empty())
    }

    /// Its status conditions as Kubernetes spells them.
    pub fn conditions(&self) -> Vec<Condition> {
        self.conditions
            .iter()
            .map(CachedCondition::condition)
            .collect()
    }
}

impl super::index::Cached for ClaimObject {
    fn namespace(&self) -> &Arc<str> {
        &self.meta.namespace
    }
    fn name(&self) -> &Arc<str> {
        &self.meta.name
    }
}

impl super::index::Cached for AddressObject {
    fn namespace(&self) -> &Arc<str> {
        &self.meta.namespace
    }
    fn name(&self) -> &Arc<str> {
        &self.meta.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::capi::{IPAddressSpec, LocalObjectName};

    fn capi_address() -> IPAddress {
        IPAddress {
            metadata: ObjectMeta {
                name: Some("m-1".into()),
                namespace: Some("metal3".into()),
                uid: Some("u-1".into()),
                resource_version: Some("7".into()),
                finalizers: Some(vec!["ipam.cluster.x-k8s.io/ProtectAddress".into()]),
                labels: Some([("cluster.x-k8s.io/cluster-name".into(), "c".into())].into()),
                owner_references: Some(vec![
                    OwnerReference {
                        api_version: "ipam.cluster.x-k8s.io/v1beta2".into(),
                        kind: "IPAddressClaim".into(),
                        name: "m-1".into(),
                        uid: "claim-1".into(),
                        controller: Some(true),
                        block_owner_deletion: Some(true),
                    },
                    OwnerReference {
                        api_version: "ipam.cluster.x-k8s.io/v1alpha2".into(),
                        kind: "InClusterIPPool".into(),
                        name: "p".into(),
                        uid: "pool-1".into(),
                        controller: None,
                        block_owner_deletion: Some(true),
                    },
                ]),
                ..Default::default()
            },
            spec: IPAddressSpec {
                claim_ref: LocalObjectName { name: "m-1".into() },
                pool_ref: IPPoolReference {
                    name: "p".into(),
                    kind: "InClusterIPPool".into(),
                    api_group: "ipam.cluster.x-k8s.io".into(),
                },
                address: "10.0.0.4".into(),
                prefix: 24,
                gateway: Some("10.0.0.1".into()),
            },
        }
    }

    /// What is read of the object survives the trip into the cache: the metadata a repair
    /// compares is the object's own.
    #[test]
    fn a_cached_address_keeps_what_bitpool_reads() {
        let object = capi_address();
        let cached = AddressObject::of_capi(&object).expect("named and namespaced");
        assert_eq!(cached.meta.object_meta(), object.metadata);
        assert_eq!(&*cached.address, "10.0.0.4");
        assert_eq!(cached.prefix, Some(24));
        assert_eq!(cached.gateway.as_deref(), Some("10.0.0.1"));
        assert_eq!(*cached.pool, object.spec.pool_ref);
        assert!(Arc::ptr_eq(&cached.claim, &cached.meta.name));
        assert!(
            cached
                .meta
                .has_finalizer("ipam.cluster.x-k8s.io/ProtectAddress")
        );
        assert_eq!(
            cached.meta.label("cluster.x-k8s.io/cluster-name"),
            Some("c")
        );
    }

    /// The pool's reference and its owner entry are one copy for every address of the pool.
    #[test]
    fn addresses_of_one_pool_share_its_reference() {
        let (a, b) = (capi_address(), capi_address());
        let (a, b) = (
            AddressObject::of_capi(&a).expect("cached"),
            AddressObject::of_capi(&b).expect("cached"),
        );
        assert!(Arc::ptr_eq(&a.pool, &b.pool));
        assert!(Arc::ptr_eq(&a.meta.owners[1], &b.meta.owners[1]));
        assert!(!Arc::ptr_eq(&a.meta.owners[0], &b.meta.owners[0]));
        assert!(Arc::ptr_eq(&a.meta.labels, &b.meta.labels));
        assert!(Arc::ptr_eq(&a.meta.owners[0].name, &a.meta.name));
    }

    /// A UID comes back as it was written, whatever its form.
    #[test]
    fn uids_come_back_unchanged() {
        for text in [
            "5f8a1c3e-2b1d-4c6e-9f0a-00000000002a",
            "5F8A1C3E-2B1D-4C6E-9F0A-00000000002A",
            "5f8a1c3e-2b1d-4c6e-9f0a-00000000002",
            "5f8a1c3e2b1d-4c6e-9f0a--00000000002a",
            "u-1",
            "",
        ] {
            assert_eq!(Uid::of(text).to_string(), text);
        }
        assert!(matches!(
            Uid::of("5f8a1c3e-2b1d-4c6e-9f0a-00000000002a"),
            Uid::Uuid(_)
        ));
        assert!(matches!(
            Uid::of("5F8A1C3E-2B1D-4C6E-9F0A-00000000002A"),
            Uid::Other(_)
        ));
    }

    fn capi_claim() -> IPAddressClaim {
        let condition = |type_: &str, status: &str| Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "AddressAllocated".into(),
            message: "allocated 10.0.0.4".into(),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            observed_generation: Some(2),
        };
        IPAddressClaim {
            metadata: ObjectMeta {
                name: Some("m-1".into()),
                namespace: Some("metal3".into()),
                uid: Some("5f8a1c3e-2b1d-4c6e-9f0a-00000000002a".into()),
                generation: Some(2),
                annotations: Some(
                    [(
                        metal3_ipam::REQUESTED_ADDRESS_ANNOTATION.to_string(),
                        "10.0.0.4".to_string(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            spec: crate::api::capi::IPAddressClaimSpec {
                cluster_name: Some("c".into()),
                pool_ref: capi_address().spec.pool_ref,
            },
            status: Some(crate::api::capi::IPAddressClaimStatus {
                address_ref: Some(LocalObjectName { name: "m-1".into() }),
                conditions: vec![condition("Ready", "True"), condition("Other", "False")],
                ..Default::default()
            }),
        }
    }

    /// A cached claim keeps what a status patch writes back (every condition, as it was) and
    /// what a reconcile reads; its address object's name is its own name, shared.
    #[test]
    fn a_cached_claim_keeps_what_bitpool_reads_and_writes_back() {
        let object = capi_claim();
        let cached = ClaimObject::of_capi(&object).expect("named and namespaced");
        let status = object.status.as_ref().expect("a status");
        assert_eq!(cached.conditions(), status.conditions);
        assert!(Arc::ptr_eq(
            cached.address.as_ref().expect("an address"),
            &cached.meta.name
        ));
        assert_eq!(cached.generation, Some(2));
        assert_eq!(cached.cluster_name.as_deref(), Some("c"));
        assert_eq!(cached.requested_address(), Some("10.0.0.4"));
        assert!(!cached.paused());
        assert_eq!(cached.meta.object_meta().uid, object.metadata.uid);
        let other = ClaimObject::of_capi(&object).expect("cached");
        assert!(Arc::ptr_eq(
            &cached.conditions[0].head,
            &other.conditions[0].head
        ));
    }

    /// Only the pause annotation's values other than bitpool's own pause a claim for bitpool;
    /// a claim without pause, requested address or error keeps no room for them.
    #[test]
    fn a_claim_is_paused_by_any_pause_value_but_bitpools() {
        let mut object = capi_claim();
        object.metadata.annotations = None;
        let plain = ClaimObject::of_capi(&object).expect("cached");
        assert!(plain.rare.is_none() && !plain.paused());
        for (value, paused) in [
            ("", true),
            ("true", true),
            (labels::HANDED_TO_BITPOOL, false),
        ] {
            object.metadata.annotations =
                Some([(labels::PAUSED.to_string(), value.to_string())].into());
            let cached = ClaimObject::of_capi(&object).expect("cached");
            assert_eq!(cached.paused(), paused, "pause annotation {value:?}");
        }
    }

    /// A Metal3 claim naming a pool of another namespace is marked so (upstream never serves
    /// one), and its error message is kept.
    #[test]
    fn a_metal3_claim_keeps_its_pool_namespace_and_error() {
        let claim = IPClaim {
            metadata: ObjectMeta {
                name: Some("c".into()),
                namespace: Some("metal3".into()),
                ..Default::default()
            },
            spec: metal3_ipam::IPClaimSpec {
                pool: k8s_openapi::api::core::v1::ObjectReference {
                    name: Some("p".into()),
                    namespace: Some("other".into()),
                    ..Default::default()
                },
            },
            status: Some(metal3_ipam::IPClaimStatus {
                address: None,
                error_message: Some("Exhausted IP Pools".into()),
            }),
        };
        let cached = ClaimObject::of_metal3(&claim).expect("cached");
        assert!(cached.pool_elsewhere);
        assert_eq!(&*cached.pool.name, "p");
        assert_eq!(cached.error_message(), Some("Exhausted IP Pools"));
        let mut here = claim.clone();
        here.spec.pool.namespace = Some("metal3".into());
        assert!(
            !ClaimObject::of_metal3(&here)
                .expect("cached")
                .pool_elsewhere
        );
    }

    #[test]
    fn an_object_without_a_namespace_is_not_cached() {
        let mut object = capi_address();
        object.metadata.namespace = None;
        assert!(AddressObject::of_capi(&object).is_none());
    }
}
