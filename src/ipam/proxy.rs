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
use super::capi::OVERLAP_CONDITION;
use super::dialect::PoolSpace;
use super::engine;
use super::kinds::{AnyAddress, AnyClaim, Created, NewAddress, Outcome};
use super::ledger::intent;
use super::ledger::{self, Loaded};
use super::metal3::metal3_address;
use crate::alloc::AddressSpace;
use crate::api::capi::{self, IPAddress, IPAddressClaim, IPAddressClaimSpec, IPPoolReference};
use crate::api::capi_pools::InClusterIPPoolStatus;
use crate::api::metal3_ipam::{ADDRESS_FINALIZER, CLAIM_FINALIZER, IPPool, IPPoolStatus};
use crate::runtime::cached::IpamApi;
use crate::runtime::context::CachedAddressPool;
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

/// The Metal3 IPAddress mirroring `address` for `ipclaim`: the target's address, prefix and
/// gateway (its IPAddress carries them), and `dns_servers`.
fn mirror(
    pool: &IPPool,
    ipclaim: &AnyClaim,
    address: &IPAddress,
    dns_servers: Vec<String>,
) -> Option<NewAddress> {
    metal3_address(
        pool,
        ipclaim,
        address.spec.address.parse().ok()?,
        address.spec.prefix,
        address.spec.gateway.clone(),
        dns_servers,
    )
}

/// The DNS servers of a mirrored address. The CAPI contract carries none: the target pool's
/// where bitpool reads its kind and it gives the address some (`bitpool migrate` writes the
/// Metal3 pool's there, per subnet), else those the Metal3 pool itself gives the address (its
/// entry's, else its own), as every address made before the migration has them.
fn dns_servers(
    target: Option<&CachedAddressPool>,
    own: Option<&AddressSpace>,
    pool: &IPPool,
    address: &str,
) -> Vec<String> {
    let from_target = target.map(|t| t.dns_servers_for(address));
    if let Some(servers) = from_target.filter(|s| !s.is_empty()) {
        return servers;
    }
    let lease = address
        .parse()
        .ok()
        .and_then(|ip| own.and_then(|space| space.lease(ip)));
    match lease {
        Some(lease) => lease.dns_servers.iter().map(ToString::to_string).collect(),
        None => pool.spec.dns_servers.clone(),
    }
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
    let deleting = pool.meta().deletion_timestamp.is_some();
    if !deleting
        && objects::add_finalizer(&pools, &*pool, IPPool::FINALIZER).await? == FinalizerPatch::Stale
    {
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    let proxy = Proxy::read(&pool, &target, &ctx);
    let mut requeue = retire_own_ledger(&pool, &ctx).await?;
    let served = proxy.serve_all(deleting).await?;
    requeue = served.requeue.or(requeue);
    // The pool goes once no address is mirrored (it mirrors none anew while deleted) and no
    // deleting IPClaim waits for its release: a claim released halfway when its pool went would
    // be left to the orphan controller.
    if deleting && proxy.mirrors.is_empty() && !served.releasing {
        objects::remove_finalizer(&pools, &*pool, IPPool::FINALIZER).await?;
        return Ok(Action::await_change());
    }
    let next = proxy_status(&pool, &target, proxy.target.as_ref(), served.indexes);
    write_status(&pools, &pool, next).await?;
    Ok(match requeue {
        Some(after) => Action::requeue(after),
        None => Action::requeue(Duration::from_secs(600)),
    })
}

/// What serving a proxying pool's IPClaims came to.
struct Served {
    /// Claim name → the address it holds through the proxy.
    indexes: BTreeMap<String, String>,
    /// A deleting IPClaim still waits for its release.
    releasing: bool,
    requeue: Option<Duration>,
}

/// A pool that proxies keeps no ledger of its own: its addresses are the target pool's, and a
/// record left from before the switch would go stale — the webhook would count addresses long
/// released as held, and a switch back would trust it. It is deleted once no reservation in it
/// can still land (the engine no longer runs for the pool to confirm them); a switch back
/// rebuilds it from the address objects. Returns when to look again if it has to wait.
async fn retire_own_ledger(pool: &IPPool, ctx: &Context) -> Result<Option<Duration>, Error> {
    let ledger = ledger::ledger_of(pool, ctx);
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
    target_ref: &'a IPPoolReference,
    /// The target pool, where bitpool reads its kind and the cache holds it.
    target: Option<CachedAddressPool>,
    /// The Metal3 pool's own ranges, for the DNS servers its entries give.
    own: Option<AddressSpace>,
    ctx: &'a Context,
    claims: Api<IPAddressClaim>,
    /// The pool's Metal3 IPAddresses, by claim name.
    mirrors: BTreeMap<String, AnyAddress>,
}

impl<'a> Proxy<'a> {
    /// What one reconcile of `pool` reads, from the caches.
    fn read(pool: &'a IPPool, target_ref: &'a IPPoolReference, ctx: &'a Context) -> Self {
        let namespace = pool.namespace().unwrap_or_default();
        Proxy {
            pool,
            target_ref,
            target: ctx.address_pool(
                &target_ref.api_group,
                &target_ref.kind,
                &target_ref.name,
                &namespace,
            ),
            own: pool.space().ok(),
            ctx,
            claims: Api::namespaced(ctx.client.clone(), &namespace),
            mirrors: pool
                .addresses(ctx, None)
                .into_iter()
                .filter(|a| a.api == IpamApi::Metal3)
                .map(|a| (a.claim().1, a))
                .collect(),
        }
    }

    /// Every IPClaim of the pool, oldest first (as the pool engine serves claims), so that the
    /// proxy claims are made, and so served, in the order the IPClaims were. Once one live
    /// IPClaim must wait for its proxy claim, no younger one gets a proxy claim before it.
    async fn serve_all(&self, deleting: bool) -> Result<Served, Error> {
        let key = self.pool.key();
        let mut ipclaims: Vec<AnyClaim> = (self.ctx.ipclaims.state().into_iter())
            .map(AnyClaim::from)
            .filter(|c| c.pool_key().as_ref() == Some(&key) && !c.paused())
            .collect();
        ipclaims.sort_by_cached_key(engine::age);
        let mut served = Served {
            indexes: BTreeMap::new(),
            releasing: false,
            requeue: None,
        };
        let mut held_back = false;
        for ipclaim in &ipclaims {
            let mirrored = self.mirrors.contains_key(&*ipclaim.meta.name);
            let step = match ipclaim.meta.deleted() {
                Some(_) => self.release_one(ipclaim).await?,
                // A pool being deleted starts serving nobody: only what it mirrors holds it up.
                None if deleting && !mirrored => Step::Done,
                None if held_back && !mirrored => Step::Again(Duration::from_millis(200)),
                None => self.serve_one(ipclaim).await?,
            };
            match step {
                Step::Done => {}
                Step::Again(after) => {
                    served.releasing |= ipclaim.deleting();
                    held_back |= !ipclaim.deleting();
                    served.requeue = Some(after);
                }
                Step::Served(address) => {
                    served.indexes.insert(ipclaim.name(), address);
                }
            }
        }
        Ok(served)
    }

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
                let Some(proxy) = proxy_claim(self.pool, ipclaim, self.target_ref) else {
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
        let dns = dns_servers(
            self.target.as_ref(),
            self.own.as_ref(),
            self.pool,
            &address.spec.address,
        );
        let (Some(object), Ok(ip)) = (
            mirror(self.pool, ipclaim, address, dns),
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

/// Why a proxying pool's target is not ready to serve, by what bitpool can see of it: a pool of
/// a kind bitpool reads that the cache does not hold.
fn target_problem(
    target_ref: &IPPoolReference,
    target: Option<&CachedAddressPool>,
) -> Option<String> {
    let readable = CachedAddressPool::is_kind(&target_ref.api_group, &target_ref.kind);
    (readable && target.is_none()).then(|| {
        format!(
            "spec.poolRef names {} {}, which does not exist: the pool's IPClaims wait for it",
            target_ref.kind, target_ref.name
        )
    })
}

/// A proxying pool's status (pure): `indexes`, which claim holds which address through it, as
/// upstream keeps them; `usedIPCount`, how many it holds; `capacity` and `availableIPCount`,
/// its target's (what it can still get), where the target's status says (left out otherwise);
/// `Ready`, that it serves through its target; and no `AddressesOverlap`: a pool that proxies
/// meets no pool, least of all its target.
fn proxy_status(
    pool: &IPPool,
    target_ref: &IPPoolReference,
    target: Option<&CachedAddressPool>,
    indexes: BTreeMap<String, String>,
) -> IPPoolStatus {
    let mut next = pool.status.clone().unwrap_or_default();
    let counts = target
        .and_then(|t| t.status.as_ref())
        .and_then(|s: &InClusterIPPoolStatus| s.ip_addresses.as_ref());
    next.capacity = counts.map(|c| c.total);
    next.available_ip_count = counts.map(|c| c.free);
    next.used_ip_count = Some(i64::try_from(indexes.len()).unwrap_or(i64::MAX));
    next.out_of_range_ip_count = None;
    next.indexes = indexes;
    let generation = pool.meta().generation;
    let ready = match target_problem(target_ref, target) {
        Some(problem) => objects::condition("Ready", false, "PoolNotFound", problem, generation),
        None => {
            let message = format!(
                "serves its IPClaims through IPAddressClaims on {} {} (spec.poolRef)",
                target_ref.kind, target_ref.name
            );
            objects::condition("Ready", true, "Proxying", message, generation)
        }
    };
    objects::set_condition(&mut next.conditions, ready);
    objects::remove_condition(&mut next.conditions, OVERLAP_CONDITION);
    next
}

/// Writes `next` as the pool's status where it differs from what the pool has; `lastUpdated`
/// changes only with the indexes.
async fn write_status(pools: &Api<IPPool>, pool: &IPPool, next: IPPoolStatus) -> Result<(), Error> {
    let status = pool.status.clone().unwrap_or_default();
    let indexes_changed = status.indexes != next.indexes;
    if !indexes_changed && next == status {
        return Ok(());
    }
    let mut patch = match indexes_changed {
        true => objects::indexes_patch(&status.indexes, &next.indexes, objects::now()),
        false => json!({ "status": {} }),
    };
    patch["status"]["capacity"] = json!(next.capacity);
    patch["status"]["availableIPCount"] = json!(next.available_ip_count);
    patch["status"]["usedIPCount"] = json!(next.used_ip_count);
    patch["status"]["outOfRangeIPCount"] = json!(next.out_of_range_ip_count);
    patch["status"]["conditions"] = json!(next.conditions);
    objects::merge_status(pools, &pool.name_any(), patch).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::capi_pools::{IPAddressCounts, InClusterIPPoolSpec, PoolSubnet};
    use crate::api::metal3_ipam::{IPPoolSpec, Metal3PoolRange};

    fn target_ref(kind: &str) -> IPPoolReference {
        IPPoolReference {
            name: "racks".into(),
            kind: kind.into(),
            api_group: capi::GROUP.into(),
        }
    }

    /// Three racks: the pool's DNS servers, and rack 2's own.
    fn metal3_pool() -> IPPool {
        let entry = |start: &str, end: &str, dns: &[&str]| Metal3PoolRange {
            start: Some(start.into()),
            end: Some(end.into()),
            dns_servers: dns.iter().map(|d| d.to_string()).collect(),
            ..Default::default()
        };
        IPPool::new(
            "racks",
            IPPoolSpec {
                pools: vec![
                    entry("10.0.0.10", "10.0.0.20", &[]),
                    entry("10.0.1.10", "10.0.1.20", &[]),
                    entry("10.0.2.10", "10.0.2.20", &["10.0.2.53"]),
                ],
                prefix: Some(24),
                dns_servers: vec!["10.0.0.53".into()],
                pool_ref: Some(target_ref("InClusterIPPool")),
                ..Default::default()
            },
        )
    }

    fn capi_target(dns: &[&str], rack2_dns: &[&str]) -> CachedAddressPool {
        CachedAddressPool {
            spec: InClusterIPPoolSpec {
                addresses: vec!["10.0.0.10-10.0.0.20".into()],
                prefix: 24,
                dns_servers: dns.iter().map(|d| d.to_string()).collect(),
                subnets: vec![PoolSubnet {
                    addresses: vec!["10.0.2.10-10.0.2.20".into()],
                    prefix: 24,
                    gateway: None,
                    dns_servers: rack2_dns.iter().map(|d| d.to_string()).collect(),
                }],
                ..Default::default()
            },
            status: Some(InClusterIPPoolStatus {
                ip_addresses: Some(IPAddressCounts {
                    total: 22,
                    used: 3,
                    free: 19,
                    out_of_range: 0,
                }),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_mirror_has_the_dns_servers_its_subnet_gives() {
        let pool = metal3_pool();
        let own = pool.space().ok();
        let cases: [(Option<CachedAddressPool>, &str, &[&str]); 6] = [
            // A target bitpool reads that gives servers: its subnet's, else its own.
            (
                Some(capi_target(&["10.9.0.53"], &["10.9.2.53"])),
                "10.0.2.15",
                &["10.9.2.53"],
            ),
            (
                Some(capi_target(&["10.9.0.53"], &[])),
                "10.0.0.15",
                &["10.9.0.53"],
            ),
            // One that gives none: the Metal3 pool's, by its entry.
            (Some(capi_target(&[], &[])), "10.0.2.15", &["10.0.2.53"]),
            (Some(capi_target(&[], &[])), "10.0.1.15", &["10.0.0.53"]),
            // A target of another provider: the Metal3 pool's.
            (None, "10.0.2.15", &["10.0.2.53"]),
            // An address outside the Metal3 pool's entries: its own servers.
            (None, "10.0.7.15", &["10.0.0.53"]),
        ];
        for (target, address, expected) in cases {
            assert_eq!(
                dns_servers(target.as_ref(), own.as_ref(), &pool, address),
                expected,
                "{address}, target {:?}",
                target.map(|t| t.spec.dns_servers)
            );
        }
    }

    #[test]
    fn a_proxying_pool_counts_what_it_holds_and_what_its_target_has_left() {
        let mut pool = metal3_pool();
        // As the pool engine left it before the switch: its own counts, and an overlap with
        // the new pool.
        pool.status = Some(IPPoolStatus {
            capacity: Some(33),
            available_ip_count: Some(30),
            used_ip_count: Some(3),
            out_of_range_ip_count: Some(0),
            conditions: vec![objects::condition(
                OVERLAP_CONDITION,
                true,
                "PoolsOverlap",
                "meets InClusterIPPool racks".into(),
                None,
            )],
            ..Default::default()
        });
        let held = BTreeMap::from([
            ("a".to_string(), "10.0.0.10".to_string()),
            ("b".to_string(), "10.0.0.11".to_string()),
        ]);
        let target = capi_target(&[], &[]);
        let next = proxy_status(
            &pool,
            &target_ref("InClusterIPPool"),
            Some(&target),
            held.clone(),
        );
        assert_eq!(next.indexes, held);
        assert_eq!(
            (next.capacity, next.available_ip_count, next.used_ip_count),
            (Some(22), Some(19), Some(2))
        );
        assert_eq!(next.out_of_range_ip_count, None);
        let types: Vec<(&str, &str, &str)> = (next.conditions.iter())
            .map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_str()))
            .collect();
        assert_eq!(types, [("Ready", "True", "Proxying")]);

        // A target of a kind bitpool reads, missing: not ready, saying so; no counts.
        let missing = proxy_status(&pool, &target_ref("InClusterIPPool"), None, BTreeMap::new());
        let ready = missing.conditions.iter().find(|c| c.type_ == "Ready");
        assert!(
            ready.is_some_and(|c| c.status == "False" && c.message.contains("does not exist")),
            "{ready:?}"
        );
        assert_eq!((missing.capacity, missing.used_ip_count), (None, Some(0)));
        // Another provider's kind: ready, its counts unknown.
        let foreign = proxy_status(&pool, &target_ref("ForeignPool"), None, BTreeMap::new());
        assert_eq!((foreign.capacity, foreign.available_ip_count), (None, None));
        assert!(foreign.conditions.iter().any(|c| c.reason == "Proxying"));
    }
}
