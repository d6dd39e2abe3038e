//! The CAPI IPAM provider: InClusterIPPool and GlobalInClusterIPPool serving IPAddressClaims.
//!
//! One reconcile per pool handles all of the pool's claims in a batch:
//! 1. dereference: the pool, its claims and IPAddresses (from the watch caches);
//! 2. finalizers on new claims;
//! 3. one ledger transaction: allocate for claims without an address, bind addresses that are
//!    about to lose their IPAddress, confirm and release (see [`super::ledger`]);
//! 4. apply: create and delete IPAddresses;
//! 5. a second transaction confirming what was created and freeing what was deleted;
//! 6. claim and pool status.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, stream};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Client, Resource, ResourceExt};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::Context;
use super::error::Error;
use super::intent::{self, ClaimId, Intent, Refusal, Request};
use super::ledger::{self, Ledger, LedgerRef, Stored};
use super::objects::{self, FinalizerPatch};
use crate::alloc::{self, AddressSpace, AllocError, Lease};
use crate::api::capi::{
    self, IPAddress, IPAddressClaim, IPAddressSpec, IPPoolReference, LocalObjectName,
};
use crate::api::capi_pools::{
    ADDRESS_FINALIZER, CLAIM_FINALIZER, GlobalInClusterIPPool, IPAddressCounts, InClusterIPPool,
    InClusterIPPoolSpec, InClusterIPPoolStatus, POOL_FINALIZER, SKIP_DELETE_CHECK_ANNOTATION,
};
use crate::api::{AllocationStrategy, labels, metal3_ipam};

/// How many API calls of one kind a reconcile runs at once.
const PARALLEL_CALLS: usize = 16;
/// Ledger writes attempted before a reconcile gives up and retries later.
const LEDGER_ATTEMPTS: usize = 8;
/// How long an address with neither reservation nor IPAddress must stay so before a fresh list
/// decides it is leaked (an IPAddress removed by force, or a crash mid-release).
const ORPHAN_GRACE: Duration = Duration::from_secs(30);
/// Periodic re-check of every pool, as a safety net for missed events.
const RESYNC: Duration = Duration::from_secs(600);

/// What both CAPI pool kinds have in common.
pub trait CapiPoolKind:
    Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Serialize + Send + Sync + 'static
{
    fn pool_spec(&self) -> &InClusterIPPoolSpec;
    fn pool_status(&self) -> Option<&InClusterIPPoolStatus>;
    /// An API through which this very object is read and patched.
    fn api_for(&self, client: Client) -> Api<Self>;
    /// The namespace whose claims the pool serves; `None` serves every namespace.
    fn claim_namespace(&self) -> Option<String>;
}

impl CapiPoolKind for InClusterIPPool {
    fn pool_spec(&self) -> &InClusterIPPoolSpec {
        &self.spec
    }
    fn pool_status(&self) -> Option<&InClusterIPPoolStatus> {
        self.status.as_ref()
    }
    fn api_for(&self, client: Client) -> Api<Self> {
        Api::namespaced(client, &self.namespace().unwrap_or_default())
    }
    fn claim_namespace(&self) -> Option<String> {
        Some(self.namespace().unwrap_or_default())
    }
}

impl CapiPoolKind for GlobalInClusterIPPool {
    fn pool_spec(&self) -> &InClusterIPPoolSpec {
        &self.spec.pool
    }
    fn pool_status(&self) -> Option<&InClusterIPPoolStatus> {
        self.status.as_ref()
    }
    fn api_for(&self, client: Client) -> Api<Self> {
        Api::all(client)
    }
    fn claim_namespace(&self) -> Option<String> {
        None
    }
}

/// Which pool a claim or an IPAddress belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolKey {
    pub kind: String,
    /// `None` for a global pool.
    pub namespace: Option<String>,
    pub name: String,
}

impl PoolKey {
    pub fn of_pool<P: CapiPoolKind>(pool: &P) -> Self {
        Self {
            kind: P::kind(&()).to_string(),
            namespace: pool.claim_namespace(),
            name: pool.name_any(),
        }
    }

    /// The bitpool CAPI pool a `poolRef` names, seen from an object in `namespace`.
    pub fn of_ref(pool_ref: &IPPoolReference, namespace: &str) -> Option<Self> {
        if pool_ref.api_group != capi::GROUP {
            return None;
        }
        let namespace = match pool_ref.kind.as_str() {
            "InClusterIPPool" => Some(namespace.to_string()),
            "GlobalInClusterIPPool" => None,
            _ => return None,
        };
        Some(Self {
            kind: pool_ref.kind.clone(),
            namespace,
            name: pool_ref.name.clone(),
        })
    }

    pub fn of_claim(claim: &IPAddressClaim) -> Option<Self> {
        Self::of_ref(&claim.spec.pool_ref, &claim.namespace()?)
    }

    pub fn of_address(address: &IPAddress) -> Option<Self> {
        Self::of_ref(&address.spec.pool_ref, &address.namespace()?)
    }

    /// The reconcile request for this pool, if it is of kind `P`.
    pub fn object_ref<P: CapiPoolKind>(&self) -> Option<ObjectRef<P>> {
        (self.kind == P::kind(&())).then(|| {
            let r = ObjectRef::new(&self.name);
            match &self.namespace {
                Some(ns) => r.within(ns),
                None => r,
            }
        })
    }

    fn describe(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.kind, self.name),
            None => format!("{} {}", self.kind, self.name),
        }
    }
}

/// The allocation core's view of a pool spec.
pub fn to_alloc(spec: &InClusterIPPoolSpec) -> alloc::CapiPool {
    alloc::CapiPool {
        addresses: spec.addresses.clone(),
        prefix: i64::from(spec.prefix),
        gateway: spec.gateway.clone(),
        excluded_addresses: spec.excluded_addresses.clone(),
        allocate_reserved: spec.allocate_reserved_ip_addresses,
        pre_allocations: spec.pre_allocations.clone(),
        strategy: match spec.allocation_strategy {
            Some(AllocationStrategy::Random) => alloc::Strategy::Random,
            _ => alloc::Strategy::Sequential,
        },
        dns_servers: spec.dns_servers.clone(),
    }
}

/// What a claim's Ready condition should say.
#[derive(Clone, Debug, PartialEq)]
enum ClaimOutcome {
    Allocated {
        address_name: String,
        address: String,
    },
    Failed {
        reason: &'static str,
        message: String,
    },
}

fn refusal_outcome(refusal: &Refusal, pool: &PoolKey, spec_error: Option<&str>) -> ClaimOutcome {
    match refusal {
        Refusal::PoolInvalid => ClaimOutcome::Failed {
            reason: capi::reasons::POOL_NOT_READY,
            message: format!(
                "{} is not ready: {}",
                pool.describe(),
                spec_error.unwrap_or("invalid spec")
            ),
        },
        Refusal::Alloc(AllocError::Exhausted) => ClaimOutcome::Failed {
            reason: capi::reasons::POOL_EXHAUSTED,
            message: format!(
                "{} has no free address; the claim is retried when one is released",
                pool.describe()
            ),
        },
        Refusal::Alloc(e) => ClaimOutcome::Failed {
            reason: capi::reasons::ALLOCATION_FAILED,
            message: e.to_string(),
        },
    }
}

/// Whether a claim may be acted on now.
enum Gate {
    Go,
    /// Paused claim or Cluster, or (for a live claim) a Cluster that does not exist.
    Hold,
}

fn gate(claim: &IPAddressClaim, ctx: &Context) -> Gate {
    if objects::is_paused(claim.meta()) {
        return Gate::Hold;
    }
    let Some(cluster) = objects::cluster_name(claim.spec.cluster_name.as_deref(), claim.meta())
    else {
        return Gate::Go;
    };
    let Some(clusters) = &ctx.clusters else {
        return Gate::Go; // no Cluster API core installed: nothing can pause the claim
    };
    let key = ObjectRef::new(cluster).within(&claim.namespace().unwrap_or_default());
    match clusters.get(&key) {
        Some(c) if c.spec.paused == Some(true) || objects::is_paused(c.meta()) => Gate::Hold,
        Some(_) => Gate::Go,
        // The contract: wait for the Cluster, but let deletions proceed without it.
        None if claim.meta().deletion_timestamp.is_some() => Gate::Go,
        None => Gate::Hold,
    }
}

fn claim_id(claim: &IPAddressClaim) -> Option<ClaimId> {
    Some(ClaimId {
        uid: claim.uid()?,
        namespace: claim.namespace()?,
        name: claim.name_any(),
    })
}

fn requested_address(claim: &IPAddressClaim) -> Option<String> {
    claim
        .annotations()
        .get(metal3_ipam::REQUESTED_ADDRESS_ANNOTATION)
        .cloned()
}

fn parse_address(address: &IPAddress) -> Option<IpAddr> {
    address.spec.address.parse().ok()
}

/// The ledger of a pool: beside a namespaced pool, in the ledger namespace for a global one.
fn ledger_of<P: CapiPoolKind>(pool: &P, ctx: &Context) -> Result<LedgerRef, Error> {
    let namespace = pool
        .claim_namespace()
        .unwrap_or_else(|| ctx.settings.ledger_namespace.clone());
    let owner = objects::owner_reference(pool, false)
        .ok_or_else(|| Error::MissingNamespace(pool.name_any()))?;
    let kind = P::kind(&());
    Ok(LedgerRef::new(
        ctx.client.clone(),
        &namespace,
        ledger::ledger_name(&kind, &pool.name_any()),
        owner,
        format!("{}.{}", kind.to_lowercase(), pool.name_any()),
    ))
}

/// All IPAddresses of the pool, read from the server (not a cache).
async fn list_addresses_fresh(ctx: &Context, key: &PoolKey) -> Result<Vec<IPAddress>, Error> {
    let api: Api<IPAddress> = match &key.namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let list = api.list(&Default::default()).await.map_err(Error::Kube)?;
    Ok(list
        .items
        .into_iter()
        .filter(|a| PoolKey::of_address(a).as_ref() == Some(key))
        .collect())
}

/// Reads the ledger, creating it from the pool's IPAddresses the first time.
async fn load_ledger(
    ledger_ref: &LedgerRef,
    ctx: &Context,
    key: &PoolKey,
) -> Result<Stored, Error> {
    for _ in 0..LEDGER_ATTEMPTS {
        if let Some(stored) = ledger_ref.load().await? {
            return Ok(stored);
        }
        let existing = list_addresses_fresh(ctx, key).await?;
        let ledger = Ledger::from_addresses(existing.iter().filter_map(parse_address));
        if let Some(stored) = ledger_ref.create(&ledger).await? {
            tracing::info!(pool = %key.describe(), addresses = existing.len(), "created ledger");
            return Ok(stored);
        }
    }
    Err(Error::LedgerContention {
        ledger: ledger_ref.name.clone(),
        attempts: LEDGER_ATTEMPTS,
    })
}

/// What a pool's status reports, taken from its address space after a transaction.
struct Usage {
    counts: alloc::Counts,
    /// A few of the allocated addresses the pool no longer contains.
    outside: Vec<IpAddr>,
}

impl Usage {
    fn of(space: &AddressSpace) -> Self {
        let counts = space.counts();
        let outside = if counts.out_of_range > 0 {
            space
                .used_addresses()
                .filter(|a| !space.contains(*a))
                .take(5)
                .collect()
        } else {
            Vec::new()
        };
        Self { counts, outside }
    }
}

/// Applies `intent` to the server's ledger, retrying on conflicts with the fresh ledger.
/// `base` is the pool's empty address space (`None` when the spec is invalid); the space that
/// mirrors the written ledger is kept in the context for the next reconcile.
async fn commit(
    ledger_ref: &LedgerRef,
    ctx: &Context,
    key: &PoolKey,
    base: Option<&(AddressSpace, (String, i64))>,
    intent: &Intent,
) -> Result<
    (
        Ledger,
        Option<Usage>,
        BTreeMap<String, Result<Lease, Refusal>>,
    ),
    Error,
> {
    let mut rng = StdRng::from_os_rng();
    let now = objects::now().0.to_string();
    for _ in 0..LEDGER_ATTEMPTS {
        let stored = load_ledger(ledger_ref, ctx, key).await?;
        let mut space = base.map(|(empty, pool)| {
            ctx.take_space(key, pool, stored.version())
                .unwrap_or_else(|| {
                    let mut space = empty.clone();
                    space.mark_all_used(stored.ledger.addresses());
                    space
                })
        });
        let (next, outcomes) =
            intent::apply(&stored.ledger, space.as_mut(), intent, &now, &mut rng);
        let written = if next == stored.ledger {
            Some(stored)
        } else {
            ledger_ref.replace(&stored, &next).await?
        };
        let Some(written) = written else {
            tracing::debug!(pool = %key.describe(), "ledger changed under us; recomputing");
            continue;
        };
        let usage = space.as_ref().map(Usage::of);
        if let (Some(space), Some((_, pool)), Some(version)) = (space, base, written.version()) {
            ctx.keep_space(
                key,
                super::CachedSpace {
                    pool: pool.clone(),
                    ledger_version: version.to_string(),
                    space,
                },
            );
        }
        return Ok((next, usage, outcomes));
    }
    Err(Error::LedgerContention {
        ledger: ledger_ref.name.clone(),
        attempts: LEDGER_ATTEMPTS,
    })
}

/// The IPAddress bitpool writes for `claim`.
fn address_object<P: CapiPoolKind>(
    pool: &P,
    claim: &IPAddressClaim,
    lease: &Lease,
) -> Option<IPAddress> {
    let mut owners = vec![objects::owner_reference(claim, true)?];
    owners.extend(objects::owner_reference(pool, false));
    let mut labels = BTreeMap::new();
    if let Some(cluster) = objects::cluster_name(claim.spec.cluster_name.as_deref(), claim.meta()) {
        labels.insert(labels::CLUSTER_NAME.to_string(), cluster.to_string());
    }
    Some(IPAddress {
        metadata: ObjectMeta {
            name: Some(claim.name_any()),
            namespace: claim.namespace(),
            finalizers: Some(vec![ADDRESS_FINALIZER.to_string()]),
            labels: (!labels.is_empty()).then_some(labels),
            owner_references: Some(owners),
            ..Default::default()
        },
        spec: IPAddressSpec {
            claim_ref: LocalObjectName {
                name: claim.name_any(),
            },
            pool_ref: claim.spec.pool_ref.clone(),
            address: lease.address.to_string(),
            prefix: i32::from(lease.prefix),
            gateway: lease.gateway.map(|g| g.to_string()),
        },
    })
}

enum Created {
    /// The IPAddress exists with the leased address.
    Confirmed,
    /// An IPAddress of that name already holds another address (or belongs to another pool).
    Conflict(Box<IPAddress>),
}

async fn create_address(api: &Api<IPAddress>, object: &IPAddress) -> Result<Created, Error> {
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(Created::Confirmed),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let existing = api.get(&object.name_any()).await.map_err(Error::Kube)?;
            if existing.spec.address == object.spec.address
                && existing.spec.pool_ref == object.spec.pool_ref
            {
                Ok(Created::Confirmed)
            } else {
                Ok(Created::Conflict(Box::new(existing)))
            }
        }
        Err(e) => Err(Error::Kube(e)),
    }
}

/// Removes bitpool's finalizer from an IPAddress, deletes it, and reports whether it is gone.
async fn delete_address(api: &Api<IPAddress>, address: &IPAddress) -> Result<bool, Error> {
    let name = address.name_any();
    if let Some(current) = api.get_opt(&name).await.map_err(Error::Kube)? {
        if objects::remove_finalizer(api, &current, ADDRESS_FINALIZER).await?
            == FinalizerPatch::Stale
        {
            return Ok(false);
        }
        match api.delete(&name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => return Err(Error::Kube(e)),
        }
    }
    Ok(api.get_opt(&name).await.map_err(Error::Kube)?.is_none())
}

fn claim_api(ctx: &Context, namespace: &str) -> Api<IPAddressClaim> {
    Api::namespaced(ctx.client.clone(), namespace)
}

fn address_api(ctx: &Context, namespace: &str) -> Api<IPAddress> {
    Api::namespaced(ctx.client.clone(), namespace)
}

/// Writes the claim's Ready condition and addressRef when they differ from what it has.
async fn write_claim_status(
    ctx: &Context,
    claim: &IPAddressClaim,
    outcome: &ClaimOutcome,
) -> Result<(), Error> {
    let mut status = claim.status.clone().unwrap_or_default();
    let condition = match outcome {
        ClaimOutcome::Allocated {
            address_name,
            address,
        } => {
            status.address_ref = Some(LocalObjectName {
                name: address_name.clone(),
            });
            objects::condition(
                capi::READY_CONDITION,
                true,
                "AddressAllocated",
                format!("allocated {address}"),
                claim.meta().generation,
            )
        }
        ClaimOutcome::Failed { reason, message } => objects::condition(
            capi::READY_CONDITION,
            false,
            reason,
            message.clone(),
            claim.meta().generation,
        ),
    };
    let ref_changed =
        claim.status.as_ref().and_then(|s| s.address_ref.as_ref()) != status.address_ref.as_ref();
    let condition_changed = objects::set_condition(&mut status.conditions, condition);
    if !ref_changed && !condition_changed {
        return Ok(());
    }
    let patch =
        json!({ "status": { "addressRef": status.address_ref, "conditions": status.conditions } });
    match claim_api(ctx, &claim.namespace().unwrap_or_default())
        .patch_status(
            &claim.name_any(),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(Error::Kube(e)),
    }
}

/// Runs `f` over `items`, at most [`PARALLEL_CALLS`] at a time.
async fn in_parallel<T, R, F, Fut>(items: Vec<T>, f: F) -> Vec<R>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = R>,
{
    stream::iter(items.into_iter().map(f))
        .buffer_unordered(PARALLEL_CALLS)
        .collect()
        .await
}

struct Claims {
    /// Live claims with bitpool's finalizer, ready to be served.
    live: Vec<Arc<IPAddressClaim>>,
    /// Deleting claims whose release may proceed now.
    releasing: Vec<Arc<IPAddressClaim>>,
    /// Earliest end of an address-reuse grace period still running.
    grace_wait: Option<Duration>,
}

pub async fn reconcile<P: CapiPoolKind>(pool: Arc<P>, ctx: Arc<Context>) -> Result<Action, Error> {
    let key = PoolKey::of_pool(&*pool);
    if objects::is_paused(pool.meta()) {
        return Ok(Action::await_change());
    }
    let pool_api = pool.api_for(ctx.client.clone());
    let ledger_ref = ledger_of(&*pool, &ctx)?;
    // A pool being deleted still releases its claims' addresses, but hands out none.
    let deleting = pool.meta().deletion_timestamp.is_some();
    if deleting && !objects::has_finalizer(pool.meta(), POOL_FINALIZER) {
        return Ok(Action::await_change());
    }
    if !deleting
        && objects::add_finalizer(&pool_api, &*pool, POOL_FINALIZER).await? == FinalizerPatch::Stale
    {
        return Ok(Action::requeue(Duration::from_millis(200)));
    }

    let fingerprint = (
        pool.uid().unwrap_or_default(),
        pool.meta().generation.unwrap_or_default(),
    );
    let (space, spec_error) = if deleting {
        (None, Some("the pool is being deleted".to_string()))
    } else {
        match AddressSpace::capi(&to_alloc(pool.pool_spec())) {
            Ok(space) => (Some((space, fingerprint)), None),
            Err(e) => (None, Some(e.to_string())),
        }
    };

    let claims = select_claims(&pool, &ctx, &key).await?;
    let addresses: HashMap<(String, String), Arc<IPAddress>> = ctx
        .addresses
        .state()
        .into_iter()
        .filter(|a| PoolKey::of_address(a).as_ref() == Some(&key))
        .filter_map(|a| Some(((a.namespace()?, a.name_any()), a)))
        .collect();
    let address_of = |claim: &IPAddressClaim| -> Option<Arc<IPAddress>> {
        addresses
            .get(&(claim.namespace()?, claim.name_any()))
            .cloned()
    };

    // Transaction 1: allocate, bind what is about to lose its IPAddress, confirm what exists.
    let mut first = Intent::default();
    let mut to_create = Vec::new();
    for claim in &claims.live {
        let Some(id) = claim_id(claim) else { continue };
        match address_of(claim).and_then(|a| Some((parse_address(&a)?, a))) {
            Some((ip, object)) if object.meta().deletion_timestamp.is_some() => {
                first.bind.push((ip, id))
            }
            Some((ip, _)) => first.confirm.push((ip, id.uid)),
            None => {
                to_create.push(claim.clone());
                first.allocate.push(Request {
                    claim: id,
                    requested: requested_address(claim),
                });
            }
        }
    }
    let mut to_delete = Vec::new();
    let mut released_without_address = Vec::new();
    for claim in &claims.releasing {
        let Some(id) = claim_id(claim) else { continue };
        let api = address_api(&ctx, &id.namespace);
        // A stale cache may miss a just-created IPAddress: ask the server before concluding.
        let object = match address_of(claim) {
            Some(a) => Some((*a).clone()),
            None => api
                .get_opt(&id.name)
                .await
                .map_err(Error::Kube)?
                .filter(|a| PoolKey::of_address(a).as_ref() == Some(&key)),
        };
        match object.as_ref().and_then(|a| Some((parse_address(a)?, a))) {
            Some((ip, a)) => {
                first.bind.push((ip, id.clone()));
                to_delete.push((claim.clone(), a.clone()));
            }
            None => {
                first.release_claims.push(id.uid.clone());
                released_without_address.push(claim.clone());
            }
        }
    }
    first.adopt = adoptable(&ctx, &ledger_ref, &key, &addresses).await?;
    let (_, _, outcomes) = commit(&ledger_ref, &ctx, &key, space.as_ref(), &first).await?;

    // Apply: create IPAddresses for new reservations, delete those of released claims.
    let mut statuses: Vec<(Arc<IPAddressClaim>, ClaimOutcome)> = Vec::new();
    let mut second = Intent::default();
    let creations: Vec<(Arc<IPAddressClaim>, Lease)> = to_create
        .into_iter()
        .filter_map(|claim| {
            let uid = claim.uid()?;
            match outcomes.get(&uid)? {
                Ok(lease) => Some((claim, lease.clone())),
                Err(refusal) => {
                    statuses.push((claim, refusal_outcome(refusal, &key, spec_error.as_deref())));
                    None
                }
            }
        })
        .collect();
    let created = in_parallel(creations, |(claim, lease)| {
        let ctx = ctx.clone();
        let pool = pool.clone();
        async move {
            let api = address_api(&ctx, &claim.namespace().unwrap_or_default());
            let result = match address_object(&*pool, &claim, &lease) {
                Some(object) => create_address(&api, &object).await,
                None => Ok(Created::Confirmed),
            };
            (claim, lease, result)
        }
    })
    .await;
    for (claim, lease, result) in created {
        let Some(uid) = claim.uid() else { continue };
        match result {
            Ok(Created::Confirmed) => {
                second.confirm.push((lease.address, uid));
                statuses.push((
                    claim.clone(),
                    ClaimOutcome::Allocated {
                        address_name: claim.name_any(),
                        address: lease.address.to_string(),
                    },
                ));
            }
            Ok(Created::Conflict(existing)) => {
                // The claim's name is taken by another IPAddress: our reservation is not needed.
                second.release.push((lease.address, uid));
                let message = if PoolKey::of_address(&existing).as_ref() == Some(&key) {
                    format!(
                        "IPAddress {} already holds {}",
                        existing.name_any(),
                        existing.spec.address
                    )
                } else {
                    format!(
                        "an IPAddress named {} already exists for another pool",
                        existing.name_any()
                    )
                };
                statuses.push((
                    claim,
                    ClaimOutcome::Failed {
                        reason: capi::reasons::ALLOCATION_FAILED,
                        message,
                    },
                ));
            }
            Err(e) => {
                tracing::warn!(claim = %claim.name_any(), error = %e, "creating IPAddress failed; retrying");
                statuses.push((
                    claim,
                    ClaimOutcome::Failed {
                        reason: capi::reasons::ALLOCATION_FAILED,
                        message: format!("creating the IPAddress failed: {e}"),
                    },
                ));
            }
        }
    }
    for claim in &claims.live {
        if let Some(address) = address_of(claim) {
            statuses.push((
                claim.clone(),
                ClaimOutcome::Allocated {
                    address_name: address.name_any(),
                    address: address.spec.address.clone(),
                },
            ));
        }
    }

    let deletions = in_parallel(to_delete, |(claim, address)| {
        let ctx = ctx.clone();
        async move {
            let api = address_api(&ctx, &address.namespace().unwrap_or_default());
            let gone = delete_address(&api, &address).await;
            (claim, gone)
        }
    })
    .await;
    let mut finished = released_without_address;
    let mut waiting_for_deletion = false;
    for (claim, gone) in deletions {
        match gone? {
            true => {
                second.release_claims.extend(claim.uid());
                finished.push(claim);
            }
            false => waiting_for_deletion = true,
        }
    }

    // Transaction 2: confirm what was created, free what was released, reclaim leaks.
    second.release_unbound = orphans(&ctx, &ledger_ref, &key, &addresses).await?;
    let (ledger, usage, _) = commit(&ledger_ref, &ctx, &key, space.as_ref(), &second).await?;

    let summary = (
        second.confirm.len(),
        second.release_claims.len(),
        second.release_unbound.len(),
    );
    if summary != (0, 0, 0) || !first.allocate.is_empty() {
        tracing::info!(
            pool = %key.describe(),
            pending = first.allocate.len(),
            created = summary.0,
            released = summary.1,
            reclaimed = summary.2,
            "reconciled"
        );
    }
    let removals = in_parallel(finished, |claim| {
        let ctx = ctx.clone();
        async move {
            let api = claim_api(&ctx, &claim.namespace().unwrap_or_default());
            objects::remove_finalizer(&api, &*claim, CLAIM_FINALIZER).await
        }
    })
    .await;
    for removal in removals {
        removal?;
    }
    let writes = in_parallel(statuses, |(claim, outcome)| {
        let ctx = ctx.clone();
        async move { write_claim_status(&ctx, &claim, &outcome).await }
    })
    .await;
    for write in writes {
        if let Err(e) = write {
            tracing::warn!(pool = %key.describe(), error = %e, "claim status not written; retrying later");
        }
    }

    if deleting {
        return finish_pool_deletion(&*pool, &pool_api, &ctx, &key, &ledger_ref).await;
    }
    write_pool_status(
        &*pool,
        &pool_api,
        usage.as_ref(),
        &ledger,
        spec_error.as_deref(),
    )
    .await?;

    let mut next = RESYNC;
    if let Some(wait) = claims.grace_wait {
        next = next.min(wait);
    }
    if waiting_for_deletion {
        next = next.min(Duration::from_secs(1));
    }
    if ctx.orphan_watch(&key).is_some() {
        next = next.min(ORPHAN_GRACE);
    }
    Ok(Action::requeue(next))
}

/// The pool's claims, sorted oldest first, with finalizers added to new ones.
async fn select_claims<P: CapiPoolKind>(
    pool: &Arc<P>,
    ctx: &Arc<Context>,
    key: &PoolKey,
) -> Result<Claims, Error> {
    // The reuse grace period does not hold up the release of a pool that is being deleted.
    let deleting = pool.meta().deletion_timestamp.is_some();
    let grace = pool
        .pool_spec()
        .address_reuse_grace_period_seconds
        .filter(|s| *s > 0 && !deleting)
        .map(|s| Duration::from_secs(s.unsigned_abs().into()));
    let now = k8s_openapi::jiff::Timestamp::now();
    let mut mine: Vec<Arc<IPAddressClaim>> = ctx
        .claims
        .state()
        .into_iter()
        .filter(|c| PoolKey::of_claim(c).as_ref() == Some(key))
        .collect();
    mine.sort_by(|a, b| {
        (
            a.meta().creation_timestamp.as_ref().map(|t| t.0),
            a.namespace(),
            a.name_any(),
        )
            .cmp(&(
                b.meta().creation_timestamp.as_ref().map(|t| t.0),
                b.namespace(),
                b.name_any(),
            ))
    });
    let mut claims = Claims {
        live: Vec::new(),
        releasing: Vec::new(),
        grace_wait: None,
    };
    let mut need_finalizer = Vec::new();
    for claim in mine {
        if matches!(gate(&claim, ctx), Gate::Hold) {
            continue;
        }
        match &claim.meta().deletion_timestamp {
            Some(deleted) => {
                if !objects::has_finalizer(claim.meta(), CLAIM_FINALIZER) {
                    continue;
                }
                let elapsed = now.duration_since(deleted.0).unsigned_abs();
                match grace.filter(|g| *g > elapsed) {
                    Some(g) => {
                        let wait = g - elapsed;
                        claims.grace_wait = Some(claims.grace_wait.map_or(wait, |w| w.min(wait)));
                    }
                    None => claims.releasing.push(claim),
                }
            }
            None if objects::has_finalizer(claim.meta(), CLAIM_FINALIZER) => {
                claims.live.push(claim)
            }
            None => need_finalizer.push(claim),
        }
    }
    let added = in_parallel(need_finalizer, |claim| {
        let ctx = ctx.clone();
        async move {
            let api = claim_api(&ctx, &claim.namespace().unwrap_or_default());
            let result = objects::add_finalizer(&api, &*claim, CLAIM_FINALIZER).await;
            (claim, result)
        }
    })
    .await;
    for (claim, result) in added {
        if result? == FinalizerPatch::Done {
            claims.live.push(claim);
        }
    }
    Ok(claims)
}

/// IPAddresses of the pool the ledger does not list, verified on the server (an address that
/// another provider allocated before bitpool took over, for example).
async fn adoptable(
    ctx: &Context,
    ledger_ref: &LedgerRef,
    key: &PoolKey,
    addresses: &HashMap<(String, String), Arc<IPAddress>>,
) -> Result<Vec<IpAddr>, Error> {
    let ledger = load_ledger(ledger_ref, ctx, key).await?.ledger;
    let candidates: Vec<_> = addresses
        .values()
        .filter(|a| parse_address(a).is_some_and(|ip| !ledger.contains(ip)))
        .cloned()
        .collect();
    let mut adopt = Vec::new();
    for candidate in candidates {
        let api = address_api(ctx, &candidate.namespace().unwrap_or_default());
        if let Some(fresh) = api
            .get_opt(&candidate.name_any())
            .await
            .map_err(Error::Kube)?
            && PoolKey::of_address(&fresh).as_ref() == Some(key)
        {
            adopt.extend(parse_address(&fresh));
        }
    }
    Ok(adopt)
}

/// Addresses the ledger holds with neither a reservation nor an IPAddress. Once that has been
/// seen for [`ORPHAN_GRACE`], a fresh list of the pool's IPAddresses decides which are leaked.
async fn orphans(
    ctx: &Context,
    ledger_ref: &LedgerRef,
    key: &PoolKey,
    addresses: &HashMap<(String, String), Arc<IPAddress>>,
) -> Result<Vec<IpAddr>, Error> {
    let ledger = load_ledger(ledger_ref, ctx, key).await?.ledger;
    let held: std::collections::HashSet<IpAddr> = addresses
        .values()
        .filter_map(|a| parse_address(a))
        .collect();
    let suspects = ledger
        .addresses()
        .filter(|ip| !held.contains(ip) && !ledger.pending.contains_key(&ip.to_string()))
        .count();
    if suspects == 0 {
        ctx.forget_orphans(key);
        return Ok(Vec::new());
    }
    let since = ctx.orphan_watch_start(key);
    if since.elapsed() < ORPHAN_GRACE {
        return Ok(Vec::new());
    }
    let fresh: std::collections::HashSet<IpAddr> = list_addresses_fresh(ctx, key)
        .await?
        .iter()
        .filter_map(parse_address)
        .collect();
    let leaked: Vec<IpAddr> = ledger
        .addresses()
        .filter(|ip| !fresh.contains(ip) && !ledger.pending.contains_key(&ip.to_string()))
        .collect();
    if !leaked.is_empty() {
        tracing::warn!(pool = %key.describe(), count = leaked.len(), "releasing addresses that no IPAddress holds");
    }
    ctx.forget_orphans(key);
    Ok(leaked)
}

fn saturate(value: u128) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

async fn write_pool_status<P: CapiPoolKind>(
    pool: &P,
    api: &Api<P>,
    usage: Option<&Usage>,
    ledger: &Ledger,
    spec_error: Option<&str>,
) -> Result<(), Error> {
    let mut status = pool.pool_status().cloned().unwrap_or_default();
    let generation = pool.meta().generation;
    let ready = match (usage, spec_error) {
        (Some(usage), _) => {
            let counts = usage.counts;
            status.ip_addresses = Some(IPAddressCounts {
                total: saturate(counts.total),
                free: saturate(counts.free),
                used: saturate(counts.used),
                out_of_range: saturate(counts.out_of_range),
            });
            let message = if counts.out_of_range > 0 {
                let outside: Vec<String> = usage.outside.iter().map(ToString::to_string).collect();
                format!(
                    "{} allocated address(es) are outside the pool's addresses and stay allocated until released: {}",
                    counts.out_of_range,
                    outside.join(", ")
                )
            } else {
                String::new()
            };
            let reason = if counts.out_of_range > 0 {
                "AddressesOutOfRange"
            } else {
                "Valid"
            };
            objects::condition("Ready", true, reason, message, generation)
        }
        (None, error) => {
            let allocated = ledger.allocated.len();
            objects::condition(
                "Ready",
                false,
                "InvalidSpec",
                format!(
                    "{}; nothing is allocated until the spec is fixed, and the {allocated} allocated address(es) are kept",
                    error.unwrap_or("invalid spec")
                ),
                generation,
            )
        }
    };
    let conditions_changed = objects::set_condition(&mut status.conditions, ready);
    if !conditions_changed && pool.pool_status().and_then(|s| s.ip_addresses) == status.ip_addresses
    {
        return Ok(());
    }
    let patch = json!({ "status": { "ipAddresses": status.ip_addresses, "conditions": status.conditions } });
    match api
        .patch_status(
            &pool.name_any(),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::Kube(e)),
    }
}

/// A pool being deleted keeps its finalizer while any address is allocated from it, unless it
/// carries the skip annotation (for `clusterctl move`).
async fn finish_pool_deletion<P: CapiPoolKind>(
    pool: &P,
    api: &Api<P>,
    ctx: &Context,
    key: &PoolKey,
    ledger_ref: &LedgerRef,
) -> Result<Action, Error> {
    let skip = pool
        .annotations()
        .contains_key(SKIP_DELETE_CHECK_ANNOTATION);
    let in_use = list_addresses_fresh(ctx, key).await?.len();
    if in_use > 0 && !skip {
        let mut status = pool.pool_status().cloned().unwrap_or_default();
        let changed = objects::set_condition(
            &mut status.conditions,
            objects::condition(
                "Ready",
                false,
                "Deleting",
                format!(
                    "waiting for {in_use} IPAddress(es) of the pool to be released before deleting it"
                ),
                pool.meta().generation,
            ),
        );
        if changed {
            let patch = json!({ "status": { "conditions": status.conditions } });
            api.patch_status(
                &pool.name_any(),
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await
            .map_err(Error::Kube)?;
        }
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    // The ledger goes with the pool (it is owned by it); delete it now rather than wait for GC.
    let ledgers: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(ctx.client.clone(), &ledger_ref.namespace);
    match ledgers
        .delete(&ledger_ref.name, &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(Error::Kube(e)),
    }
    objects::remove_finalizer(api, pool, POOL_FINALIZER).await?;
    Ok(Action::await_change())
}
