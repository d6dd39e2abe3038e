//! Claims of either API as the caches hold them, with their status conditions.

use std::sync::{Arc, LazyLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::ObjectMeta;

use super::{IpamApi, Meta, Stamp};
use crate::api::capi::{IPAddressClaim, IPPoolReference, READY_CONDITION};
use crate::api::labels;
use crate::api::metal3_ipam::{self, IPClaim};
use crate::runtime::intern::{self, Interner};

/// What claims ask, one copy each.
static CLAIM_SPECS: LazyLock<Interner<ClaimSpec>> = LazyLock::new(Interner::new);
/// A generation (`metadata.generation`, a condition's `observedGeneration`) in 8 bytes, not
/// the 16 of an `Option<i64>`: `i64::MIN`, which the API server never gives, for none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Generation(i64);

impl Generation {
    fn of(generation: Option<i64>) -> Self {
        Self(generation.unwrap_or(i64::MIN))
    }

    fn get(self) -> Option<i64> {
        (self.0 != i64::MIN).then_some(self.0)
    }
}

/// Conditions' types, statuses and reasons, one copy each.
static CONDITION_HEADS: LazyLock<Interner<ConditionHead>> = LazyLock::new(Interner::new);

/// The shared copy of a condition's type, status and reason.
fn shared_head(value: ConditionHead) -> Arc<ConditionHead> {
    CONDITION_HEADS.share(value)
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
    last_transition_time: Stamp,
    observed_generation: Generation,
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
            last_transition_time: Stamp::of(Some(&condition.last_transition_time)),
            observed_generation: Generation::of(condition.observed_generation),
        }
    }

    /// The generation it was written for.
    pub fn observed_generation(&self) -> Option<i64> {
        self.observed_generation.get()
    }

    /// The condition as Kubernetes spells it, for a status patch.
    pub fn condition(&self) -> Condition {
        Condition {
            type_: self.head.type_.to_string(),
            status: self.head.status.to_string(),
            reason: self.head.reason.to_string(),
            message: self.message.to_string(),
            // Always a time: it was read from one.
            last_transition_time: (self.last_transition_time.time())
                .unwrap_or(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
            observed_generation: self.observed_generation(),
        }
    }
}

/// A claim of either API, as the caches hold it: an IPAddressClaim or a Metal3 IPClaim.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimObject {
    pub api: IpamApi,
    pub meta: Meta,
    generation: Generation,
    /// What the claims of a pool ask alike.
    spec: Arc<ClaimSpec>,
    /// The address object its status names, if any.
    pub address: Option<Arc<str>>,
    /// Its status conditions (CAPI claims): every one, since a status patch writes the list
    /// whole.
    pub conditions: Box<[CachedCondition]>,
    /// What few claims have, apart: most claims have none of it.
    pub rare: Option<Box<RareClaimFields>>,
}

/// What a claim asks: one shared copy for the claims of a pool.
#[derive(Debug, PartialEq, Eq, Hash)]
struct ClaimSpec {
    pool: IPPoolReference,
    pool_elsewhere: bool,
    cluster_name: Option<Arc<str>>,
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
        spec: ClaimSpec,
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
            generation: Generation::of(source.generation),
            spec: CLAIM_SPECS.share(spec),
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
        let spec = ClaimSpec {
            pool: object.spec.pool_ref.clone(),
            pool_elsewhere: false,
            cluster_name: object.spec.cluster_name.as_deref().map(intern::string),
        };
        Some(Self {
            address,
            conditions: status
                .map(|s| s.conditions.iter().map(CachedCondition::of).collect())
                .unwrap_or_default(),
            ..Self::new(IpamApi::Capi, meta, &object.metadata, spec, None)
        })
    }

    /// A Metal3 IPClaim as cached; `None` without a name or namespace.
    pub fn of_metal3(object: &IPClaim) -> Option<Self> {
        let meta = Meta::of(&object.metadata)?;
        let pool = &object.spec.pool;
        let pool_elsewhere = pool
            .namespace
            .as_deref()
            .is_some_and(|ns| !ns.is_empty() && *ns != **meta.namespace());
        let spec = ClaimSpec {
            pool: IPPoolReference {
                name: pool.name.clone().unwrap_or_default(),
                kind: "IPPool".into(),
                api_group: metal3_ipam::GROUP.into(),
            },
            pool_elsewhere,
            cluster_name: None,
        };
        let status = object.status.as_ref();
        Some(Self {
            address: status
                .and_then(|s| s.address.as_ref()?.name.as_deref())
                .map(Arc::from),
            ..Self::new(
                IpamApi::Metal3,
                meta,
                &object.metadata,
                spec,
                status.and_then(|s| s.error_message.as_deref()),
            )
        })
    }

    /// `metadata.generation`.
    pub fn generation(&self) -> Option<i64> {
        self.generation.get()
    }

    /// The pool it names. A Metal3 claim's is given as a Metal3 IPPool reference, with an empty
    /// name when it names none.
    pub fn pool(&self) -> &IPPoolReference {
        &self.spec.pool
    }

    /// A Metal3 claim naming a pool of another namespace (which upstream never serves).
    pub fn pool_elsewhere(&self) -> bool {
        self.spec.pool_elsewhere
    }

    /// `spec.clusterName` (CAPI claims).
    pub fn spec_cluster_name(&self) -> Option<&str> {
        self.spec.cluster_name.as_deref()
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

impl crate::runtime::index::Cached for ClaimObject {
    fn namespace(&self) -> &Arc<str> {
        self.meta.namespace()
    }
    fn name(&self) -> &Arc<str> {
        &self.meta.name
    }
}
