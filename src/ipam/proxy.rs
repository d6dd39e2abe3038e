//! The transparent proxy for migration: a Metal3 IPPool whose `spec.poolRef` names a CAPI pool
//! serves its IPClaims through IPAddressClaims against that pool (bitpool's own or another
//! provider's) and mirrors each resulting IPAddress back as the Metal3 IPAddress that existing
//! consumers read. Consumers keep working while the addresses come from the new pool.
//!
//! The proxy claim is named like the IPClaim, so that an InClusterIPPool written by
//! `bitpool migrate` (preallocations keyed by those names) gives every host its old address.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::Context;
use super::dialect::PoolDialect;
use super::engine;
use super::intent;
use super::kinds::{AnyAddress, AnyClaim, Created, NewAddress, Outcome};
use super::ledger::Loaded;
use super::metal3::metal3_address;
use super::transaction;
use crate::api::capi::{self, IPAddress, IPAddressClaim, IPAddressClaimSpec, IPPoolReference};
use crate::api::metal3_ipam::{ADDRESS_FINALIZER, CLAIM_FINALIZER, IPPool};
use crate::runtime::cached::IpamApi;
use crate::runtime::error::{Error, Verb, object_of};
use crate::runtime::objects::{self, FinalizerPatch};

/// The IPPool controller's reconcile: the pool engine (group `metal3-ipam`), or the proxy when
/// the pool names a CAPI pool (group `migration-proxy`); a pool of a group that is off is left
/// to whoever runs it.
pub async fn reconcile(pool: Arc<IPPool>, ctx: Arc<Context>) -> Result<Action, Error> {
    let groups = ctx.settings.groups;
    match pool.spec.pool_ref.clone() {
        None if groups.metal3_ipam => engine::reconcile(pool, ctx).await,
        Some(target) if groups.migration_proxy => reconcile_proxy(pool, target, ctx).await,
        _ => Ok(Action::await_change()),
    }
}

/// What the proxy claim of an IPClaim says.
enum Proxied {
    Pending,
    Failed(String),
    Allocated(Box<IPAddress>),
}

async fn proxied(ctx: &Context, claim: &IPAddressClaim) -> Result<Proxied, Error> {
    let status = claim.status.clone().unwrap_or_default();
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == capi::READY_CONDITION);
    match (ready, status.address_ref) {
        (Some(c), Some(address)) if c.status == "True" => {
            let api: Api<IPAddress> =
                Api::namespaced(ctx.client.clone(), &claim.namespace().unwrap_or_default());
            match objects::get_optional(&api, &address.name).await? {
                Some(a) => Ok(Proxied::Allocated(Box::new(a))),
                None => Ok(Proxied::Pending),
            }
        }
        (Some(c), _) if c.status == "False" => {
            Ok(Proxied::Failed(format!("{}: {}", c.reason, c.message)))
        }
        _ => Ok(Proxied::Pending),
    }
}

fn owned_by(claim: &IPAddressClaim, owner: &AnyClaim) -> bool {
    let uid = owner.uid();
    claim
        .owner_references()
        .iter()
        .any(|o| Some(&o.uid) == uid.as_ref())
}

/// The proxy claim for `ipclaim`: same name and namespace, owned by it, against `target`.
fn proxy_claim(
    pool: &IPPool,
    ipclaim: &AnyClaim,
    target: &IPPoolReference,
) -> Option<IPAddressClaim> {
    Some(IPAddressClaim {
        metadata: ObjectMeta {
            name: Some(ipclaim.name()),
            namespace: Some(ipclaim.namespace()),
            labels: ipclaim.labels(),
            owner_references: Some(vec![ipclaim.owner_reference(true)?]),
            ..Default::default()
        },
        spec: IPAddressClaimSpec {
            cluster_name: pool.spec.cluster_name.clone().filter(|c| !c.is_empty()),
            pool_ref: target.clone(),
        },
        status: None,
    })
}

/// The Metal3 IPAddress mirroring `address` for `ipclaim`. DNS servers come from the Metal3
/// pool (the CAPI contract carries none).
fn mirror(pool: &IPPool, ipclaim: &AnyClaim, address: &IPAddress) -> Option<NewAddress> {
    metal3_address(
        pool,
        ipclaim,
        address.spec.address.parse().ok()?,
        address.spec.prefix,
        address.spec.gateway.clone(),
        pool.spec.dns_servers.clone(),
    )
}

async fn reconcile_proxy(
    pool: Arc<IPPool>,
    target: IPPoolReference,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    if objects::is_paused(pool.meta()) || pool.paused_by_cluster(&ctx) {
        return Ok(Action::requeue(Duration::from_secs(30)));
    }
    let namespace = pool.namespace().unwrap_or_default();
    let pools: Api<IPPool> = Api::namespaced(ctx.client.clone(), &namespace);
    let proxy = Proxy {
        pool: &pool,
        target: &target,
        ctx: &ctx,
        claims: Api::namespaced(ctx.client.clone(), &namespace),
        mirrors: pool
            .addresses(&ctx, None)
            .into_iter()
            .filter(|a| a.api == IpamApi::Metal3)
            .map(|a| (a.claim().1, a))
            .collect(),
    };
    let deleting = pool.meta().deletion_timestamp.is_some();
    if !deleting
        && objects::add_finalizer(&pools, &*pool, IPPool::FINALIZER).await? == FinalizerPatch::Stale
    {
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    let key = pool.key();
    let mut indexes = BTreeMap::new();
    let mut requeue = retire_own_ledger(&pool, &ctx).await?;
    let mut releasing = false;
    for ipclaim in ctx.ipclaims.state().into_iter().map(AnyClaim::from) {
        if ipclaim.pool_key().as_ref() != Some(&key) || ipclaim.paused() {
            continue;
        }
        let step = match ipclaim.meta.deleted {
            Some(_) => proxy.release_one(&ipclaim).await?,
            // A pool being deleted starts serving nobody: only what it mirrors holds it up.
            None if deleting && !proxy.mirrors.contains_key(&*ipclaim.meta.name) => Step::Done,
            None => proxy.serve_one(&ipclaim).await?,
        };
        match step {
            Step::Done => {}
            Step::Again(after) => {
                releasing |= ipclaim.deleting();
                requeue = Some(after);
            }
            Step::Served(address) => {
                indexes.insert(ipclaim.name(), address);
            }
        }
    }
    // The pool goes once no address is mirrored (it mirrors none anew while deleted) and no
    // deleting IPClaim waits for its release: a claim released halfway when its pool went would
    // be left to the orphan controller.
    if deleting && proxy.mirrors.is_empty() && !releasing {
        objects::remove_finalizer(&pools, &*pool, IPPool::FINALIZER).await?;
        return Ok(Action::await_change());
    }
    write_indexes(&pools, &pool, indexes).await?;
    Ok(match requeue {
        Some(after) => Action::requeue(after),
        None => Action::requeue(Duration::from_secs(600)),
    })
}

/// A pool that proxies keeps no ledger of its own: its addresses are the target pool's, and a
/// record left from before the switch would go stale — the webhook would count addresses long
/// released as held, and a switch back would trust it. It is deleted once no reservation in it
/// can still land (the engine no longer runs for the pool to confirm them); a switch back
/// rebuilds it from the address objects. Returns when to look again if it has to wait.
async fn retire_own_ledger(pool: &IPPool, ctx: &Context) -> Result<Option<Duration>, Error> {
    let ledger = transaction::ledger_of(pool, ctx);
    let Loaded::Found(stored) = ledger.load().await? else {
        return Ok(None);
    };
    let now = objects::now().0.to_string();
    let landing = stored
        .ledger
        .pending
        .values()
        .any(|r| !intent::no_create_can_land(r, &now));
    if landing {
        return Ok(Some(Duration::from_secs(5)));
    }
    ledger.delete().await?;
    tracing::info!(pool = %pool.key().describe(), ledger = %ledger.describe(), "deleted the ledger of a pool that now proxies");
    Ok(None)
}

/// What one IPClaim of a proxying pool came to.
enum Step {
    Done,
    /// Look again after this long.
    Again(Duration),
    /// Served with this address (for the pool's `status.indexes`).
    Served(String),
}

/// A Metal3 IPPool serving its IPClaims from a CAPI pool, for one reconcile.
struct Proxy<'a> {
    pool: &'a IPPool,
    target: &'a IPPoolReference,
    ctx: &'a Context,
    claims: Api<IPAddressClaim>,
    /// The pool's Metal3 IPAddresses, by claim name.
    mirrors: BTreeMap<String, AnyAddress>,
}

impl Proxy<'_> {
    /// A deleting IPClaim: its mirror goes first, then its proxy claim (which releases the
    /// address), then its finalizer.
    async fn release_one(&self, ipclaim: &AnyClaim) -> Result<Step, Error> {
        if !ipclaim.meta.has_finalizer(CLAIM_FINALIZER) {
            return Ok(Step::Done);
        }
        let name = ipclaim.name();
        let existing = objects::get_optional(&self.claims, &name).await?;
        if let Some(address) = self.mirrors.get(&name)
            && !address.delete(self.ctx, ADDRESS_FINALIZER).await?
        {
            return Ok(Step::Again(Duration::from_secs(1)));
        }
        if let Some(proxy) = existing.filter(|c| owned_by(c, ipclaim)) {
            if proxy.meta().deletion_timestamp.is_none() {
                let _ = self.claims.delete(&name, &DeleteParams::background()).await;
            }
            return Ok(Step::Again(Duration::from_secs(1)));
        }
        ipclaim
            .set_finalizer(self.ctx, CLAIM_FINALIZER, false)
            .await?;
        Ok(Step::Done)
    }

    /// A live IPClaim: its proxy claim made, and once that is served, the address mirrored as
    /// a Metal3 IPAddress and written to the IPClaim's status.
    async fn serve_one(&self, ipclaim: &AnyClaim) -> Result<Step, Error> {
        if ipclaim
            .set_finalizer(self.ctx, CLAIM_FINALIZER, true)
            .await?
            == FinalizerPatch::Stale
        {
            return Ok(Step::Again(Duration::from_millis(200)));
        }
        let Some(proxy) = self.proxy_of(ipclaim).await? else {
            return Ok(Step::Done);
        };
        match proxied(self.ctx, &proxy).await? {
            Proxied::Pending => Ok(Step::Done),
            Proxied::Failed(message) => {
                self.tell_failure(ipclaim, message).await?;
                Ok(Step::Done)
            }
            Proxied::Allocated(address) => self.mirror(ipclaim, &address).await,
        }
    }

    /// The IPClaim's proxy claim, made if it is missing; `None` (its status says why, or its
    /// event comes) when there is none to use.
    async fn proxy_of(&self, ipclaim: &AnyClaim) -> Result<Option<IPAddressClaim>, Error> {
        let name = ipclaim.name();
        match objects::get_optional(&self.claims, &name).await? {
            Some(proxy) if owned_by(&proxy, ipclaim) => Ok(Some(proxy)),
            Some(_) => {
                let message =
                    format!("an IPAddressClaim named {name} exists and is not this claim's proxy");
                ipclaim
                    .write_status(self.ctx, &Outcome::Failed(message))
                    .await?;
                Ok(None)
            }
            None => {
                let Some(proxy) = proxy_claim(self.pool, ipclaim, self.target) else {
                    return Ok(None);
                };
                match self.claims.create(&PostParams::default(), &proxy).await {
                    Ok(created) => Ok(Some(created)),
                    // Retried on its event.
                    Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(None),
                    Err(e) => Err(Error::api(Verb::Create, object_of(&self.claims, &name), e)),
                }
            }
        }
    }

    /// Writes the proxy claim's failure to the IPClaim's status, unless it says so already.
    async fn tell_failure(&self, ipclaim: &AnyClaim, message: String) -> Result<(), Error> {
        if ipclaim.error_message() == Some(message.as_str()) {
            return Ok(());
        }
        let patch = json!({ "status": { "errorMessage": message } });
        ipclaim.patch_status(self.ctx, patch).await
    }

    /// The proxy claim's address mirrored as the IPClaim's Metal3 IPAddress, and the outcome
    /// written to the IPClaim's status.
    async fn mirror(&self, ipclaim: &AnyClaim, address: &IPAddress) -> Result<Step, Error> {
        let (Some(object), Ok(ip)) = (
            mirror(self.pool, ipclaim, address),
            address.spec.address.parse::<std::net::IpAddr>(),
        ) else {
            return Ok(Step::Done);
        };
        // A mirror of an address that exists: no reservation's window applies.
        let deadline = tokio::time::Instant::now() + crate::client::deadline::WRITE_DEADLINE;
        let (outcome, step) = match object.create(self.ctx, ipclaim, deadline).await? {
            Created::Confirmed | Created::Own(_) => (
                Outcome::Allocated {
                    address_name: object.name(),
                    address: ip.to_string(),
                },
                Step::Served(address.spec.address.clone()),
            ),
            Created::Conflict(message) => (Outcome::Failed(message), Step::Done),
        };
        ipclaim.write_status(self.ctx, &outcome).await?;
        Ok(step)
    }
}

/// The pool's `status.indexes`: which claim holds which address, as upstream keeps them.
async fn write_indexes(
    pools: &Api<IPPool>,
    pool: &IPPool,
    indexes: BTreeMap<String, String>,
) -> Result<(), Error> {
    let status = pool.status.clone().unwrap_or_default();
    if status.indexes == indexes {
        return Ok(());
    }
    let patch = objects::indexes_patch(&status.indexes, &indexes, objects::now());
    objects::merge_status(pools, &pool.name_any(), patch).await
}
