//! What the load command does to the cluster: pools, bursts of claims and their deletion on a
//! number of connections, the server's raw create rate, and the check that every claim got one
//! address of its pool and no address was given twice.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use bitpool::api::capi::{
    GROUP, IPAddress, IPAddressClaim, IPAddressClaimSpec, IPAddressSpec, IPPoolReference,
    LocalObjectName,
};
use bitpool::api::capi_pools::InClusterIPPool;
use futures::{StreamExt, stream};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, ObjectMeta, PostParams,
};
use kube::runtime::reflector::{Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};

use crate::flavour::Flavour;
use crate::provider::Running;

/// The kind of the pools the load command makes.
pub const POOL_KIND: &str = "InClusterIPPool";
/// How often the watch caches of the load command are looked at while waiting.
const POLL: Duration = Duration::from_millis(50);
/// Attempts per API call before the run is abandoned (a loaded server may time a request out).
const ATTEMPTS: usize = 5;

/// The cluster under load, and how many requests the load command keeps in flight.
#[derive(Clone)]
pub struct Load {
    pub client: Client,
    pub connections: usize,
}

/// A pool the load command made, and the network its addresses must come from.
#[derive(Clone, Debug)]
pub struct Pool {
    pub name: String,
    pub network: IpNet,
}

/// The `i`-th pool of a run: one /14 when there is a single pool (room for 100,000 claims and
/// more), else /24s side by side.
pub fn pool(i: usize, count: usize) -> Pool {
    let network: IpNet = if count == 1 {
        "10.0.0.0/14".parse()
    } else {
        format!("10.{}.{}.0/24", 16 + i / 256, i % 256).parse()
    }
    .unwrap_or_else(|_| unreachable!("a valid network literal"));
    Pool {
        name: format!("pool-{i:04}"),
        network,
    }
}

/// The `i`-th of two pools, IPv4 then IPv6: a /16 and a /64, or (`wide`) a /8 and all of IPv6.
pub fn two_family_pool(i: usize, wide: bool) -> Pool {
    let network = match (i.is_multiple_of(2), wide) {
        (true, false) => "10.0.0.0/16",
        (true, true) => "10.0.0.0/8",
        (false, false) => "fd00:10::/64",
        (false, true) => "::/0",
    };
    Pool {
        name: format!("pool-{i:04}"),
        network: network
            .parse()
            .unwrap_or_else(|_| unreachable!("a valid network literal")),
    }
}

impl Load {
    /// Creates the namespace unless it is there (waiting out one still being deleted).
    pub async fn ensure_namespace(&self, name: &str) -> Result<(), String> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let terminating = |n: &Namespace| n.metadata.deletion_timestamp.is_some();
        if let Ok(Some(existing)) = api.get_opt(name).await {
            if !terminating(&existing) {
                return Ok(());
            }
            self.delete_namespace(name, Duration::from_secs(300))
                .await?;
        }
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &namespace).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.is_already_exists() => Ok(()),
            Err(e) => Err(format!("cannot create namespace {name}: {e}")),
        }
    }

    /// Deletes the namespace and waits until it is gone (its objects must not load the next run).
    pub async fn delete_namespace(&self, name: &str, limit: Duration) -> Result<(), String> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let _ = api.delete(name, &DeleteParams::default()).await;
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            match api.get_opt(name).await {
                Ok(None) => return Ok(()),
                Ok(Some(_)) | Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
        Err(format!("namespace {name} was not gone within {limit:?}"))
    }

    /// The namespace's objects of `resource`.
    pub fn api(&self, namespace: &str, resource: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, resource)
    }

    /// Creates `pools` of `flavour` in `namespace`.
    pub async fn create_pools(
        &self,
        namespace: &str,
        flavour: Flavour,
        pools: &[Pool],
    ) -> Result<(), String> {
        let api = self.api(namespace, &flavour.pools());
        let objects: Vec<DynamicObject> = pools.iter().map(|p| flavour.pool_object(p)).collect();
        self.each(objects, |pool| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &pool).await.map(drop) }
        })
        .await
    }

    /// Creates the claims (name → pool) and returns how long that took.
    pub async fn create_claims(
        &self,
        namespace: &str,
        flavour: Flavour,
        claims: Vec<(String, String)>,
    ) -> Result<Duration, String> {
        let api = self.api(namespace, &flavour.claims());
        let started = Instant::now();
        self.each(claims, |(name, pool)| {
            let api = api.clone();
            async move {
                let claim = flavour.claim_object(namespace, &name, &pool);
                api.create(&PostParams::default(), &claim).await.map(drop)
            }
        })
        .await?;
        Ok(started.elapsed())
    }

    /// Deletes the named claims and returns how long the requests took.
    pub async fn delete_claims(
        &self,
        namespace: &str,
        flavour: Flavour,
        names: Vec<String>,
    ) -> Result<Duration, String> {
        let api = self.api(namespace, &flavour.claims());
        let started = Instant::now();
        self.each(names, |name| {
            let api = api.clone();
            async move {
                match api.delete(&name, &DeleteParams::default()).await {
                    Err(kube::Error::Api(e)) if e.is_not_found() => Ok(()),
                    other => other.map(drop),
                }
            }
        })
        .await?;
        Ok(started.elapsed())
    }

    /// The server's raw create rate (objects per second) on the same connections: `count`
    /// IPAddress objects of a pool kind no provider serves, created, then deleted again.
    pub async fn raw_rate(&self, namespace: &str, count: usize) -> Result<f64, String> {
        let api: Api<IPAddress> = Api::namespaced(self.client.clone(), namespace);
        // What an interrupted run left behind would answer creates with 409.
        api.delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .map_err(|e| format!("cannot clear namespace {namespace}: {e}"))?;
        let names: Vec<String> = (0..count).map(|i| format!("raw-{i:06}")).collect();
        let started = Instant::now();
        self.each(names.clone(), |name| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &raw_address(&name))
                    .await
                    .map(drop)
            }
        })
        .await?;
        let rate = count as f64 / started.elapsed().as_secs_f64();
        self.each(names, |name| {
            let api = api.clone();
            async move { api.delete(&name, &DeleteParams::default()).await.map(drop) }
        })
        .await?;
        Ok(rate)
    }

    /// The server's own limit for the contract: claims per second that the load command alone
    /// takes through the writes a provider and its user make for each claim, phase by phase on
    /// the same connections: create the claims, add their finalizers, create their address
    /// objects (with finalizers, and owned by their claim and a pool as the contract says),
    /// write their statuses; then, to delete, delete the claims and the address objects, and
    /// drop both finalizers. Returns (allocations/s, deletions/s). The claims name a pool kind no
    /// provider serves; the pool that owns the objects serves none of them.
    pub async fn contract_rate(&self, namespace: &str, count: usize) -> Result<(f64, f64), String> {
        let claims: Api<IPAddressClaim> = Api::namespaced(self.client.clone(), namespace);
        let addresses: Api<IPAddress> = Api::namespaced(self.client.clone(), namespace);
        let pool = self
            .ensure_pool(namespace, CONTRACT_POOL, "192.0.2.0/24")
            .await?;
        let apis = ContractApis {
            claims,
            addresses,
            pool: pool_owner(&pool)?,
            claim_owners: std::sync::Mutex::new(HashMap::new()),
        };
        let names: Vec<String> = (0..count).map(|i| format!("contract-{i:06}")).collect();
        let started = Instant::now();
        for step in ContractStep::ALLOCATION {
            self.each(names.clone(), |name| step.run(&apis, name))
                .await?;
        }
        let allocations = count as f64 / started.elapsed().as_secs_f64();
        let started = Instant::now();
        for step in ContractStep::DELETION {
            self.each(names.clone(), |name| step.run(&apis, name))
                .await?;
        }
        Ok((allocations, count as f64 / started.elapsed().as_secs_f64()))
    }

    /// The InClusterIPPool `name` of `namespace` (made unless it is there) over `network`.
    pub async fn ensure_pool(
        &self,
        namespace: &str,
        name: &str,
        network: &str,
    ) -> Result<InClusterIPPool, String> {
        let api: Api<InClusterIPPool> = Api::namespaced(self.client.clone(), namespace);
        let prefix = (network.parse::<IpNet>())
            .map_err(|e| format!("the pool {namespace}/{name}'s network {network}: {e}"))?
            .prefix_len();
        let pool: InClusterIPPool = serde_json::from_value(serde_json::json!({
            "apiVersion": "ipam.cluster.x-k8s.io/v1alpha2",
            "kind": "InClusterIPPool",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"addresses": [network], "prefix": prefix},
        }))
        .map_err(|e| e.to_string())?;
        match api.create(&PostParams::default(), &pool).await {
            Ok(created) => Ok(created),
            Err(kube::Error::Api(e)) if e.is_already_exists() => {
                api.get(name).await.map_err(|e| e.to_string())
            }
            Err(e) => Err(format!("cannot create the pool {namespace}/{name}: {e}")),
        }
    }

    /// Runs `call` for every item, `connections` at a time, each retried a few times.
    pub async fn each<T, F, Fut>(&self, items: Vec<T>, call: F) -> Result<(), String>
    where
        T: Clone,
        F: Fn(T) -> Fut,
        Fut: Future<Output = Result<(), kube::Error>>,
    {
        let results: Vec<Result<(), kube::Error>> = stream::iter(items)
            .map(|item| {
                let call = &call;
                async move {
                    let mut last = Ok(());
                    for attempt in 0..ATTEMPTS {
                        last = call(item.clone()).await;
                        if last.is_ok() {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                    }
                    last
                }
            })
            .buffer_unordered(self.connections)
            .collect()
            .await;
        match results.into_iter().find_map(Result::err) {
            Some(e) => Err(format!("an API call failed {ATTEMPTS} times: {e}")),
            None => Ok(()),
        }
    }
}

const PROBE_FINALIZER: &str = "load.bitpool.test/probe";

fn finalizers(names: &[&str]) -> kube::api::Patch<serde_json::Value> {
    kube::api::Patch::Merge(serde_json::json!({"metadata": {"finalizers": names}}))
}

/// One of the writes the contract makes for a claim.
#[derive(Clone, Copy)]
enum ContractStep {
    CreateClaim,
    AddClaimFinalizer,
    CreateAddress,
    WriteStatus,
    DeleteClaim,
    DeleteAddress,
    DropAddressFinalizer,
    DropClaimFinalizer,
}

impl ContractStep {
    const ALLOCATION: [Self; 4] = [
        Self::CreateClaim,
        Self::AddClaimFinalizer,
        Self::CreateAddress,
        Self::WriteStatus,
    ];
    const DELETION: [Self; 4] = [
        Self::DeleteClaim,
        Self::DeleteAddress,
        Self::DropAddressFinalizer,
        Self::DropClaimFinalizer,
    ];

    /// Makes the write for claim `name` (a retry that finds it done succeeds).
    async fn run(self, apis: &ContractApis, name: String) -> Result<(), kube::Error> {
        let (claims, addresses) = (&apis.claims, &apis.addresses);
        let params = kube::api::PatchParams::default();
        let delete = DeleteParams::default();
        match self {
            Self::CreateClaim => {
                let claim = IPAddressClaim::new(
                    &name,
                    IPAddressClaimSpec {
                        cluster_name: None,
                        pool_ref: probe_pool(),
                    },
                );
                ignore_existing(claims.create(&PostParams::default(), &claim).await)
            }
            Self::AddClaimFinalizer => {
                let claim = claims
                    .patch(&name, &params, &finalizers(&[PROBE_FINALIZER]))
                    .await?;
                if let Ok(mut owners) = apis.claim_owners.lock() {
                    owners.insert(name, claim.metadata.uid.unwrap_or_default());
                }
                Ok(())
            }
            Self::CreateAddress => {
                let claim_uid = apis
                    .claim_owners
                    .lock()
                    .ok()
                    .and_then(|owners| owners.get(&name).cloned())
                    .unwrap_or_default();
                let mut address = raw_address(&name);
                address.metadata.finalizers = Some(vec![PROBE_FINALIZER.into()]);
                let claim = OwnerReference {
                    api_version: format!("{GROUP}/v1beta2"),
                    kind: "IPAddressClaim".into(),
                    name: name.clone(),
                    uid: claim_uid,
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                };
                address.metadata.owner_references = Some(vec![claim, apis.pool.clone()]);
                ignore_existing(addresses.create(&PostParams::default(), &address).await)
            }
            Self::WriteStatus => {
                let status = serde_json::json!({"status": {
                    "addressRef": {"name": name},
                    "conditions": [{
                        "type": "Ready", "status": "True", "reason": "AddressAllocated",
                        "message": "",
                        "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
                    }],
                }});
                let patch = kube::api::Patch::Merge(status);
                claims.patch_status(&name, &params, &patch).await.map(drop)
            }
            Self::DeleteClaim => ignore_missing(claims.delete(&name, &delete).await.map(drop)),
            Self::DeleteAddress => ignore_missing(addresses.delete(&name, &delete).await.map(drop)),
            Self::DropAddressFinalizer => ignore_missing(
                addresses
                    .patch(&name, &params, &finalizers(&[]))
                    .await
                    .map(drop),
            ),
            Self::DropClaimFinalizer => ignore_missing(
                claims
                    .patch(&name, &params, &finalizers(&[]))
                    .await
                    .map(drop),
            ),
        }
    }
}

fn ignore_existing<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Err(kube::Error::Api(e)) if e.is_already_exists() => Ok(()),
        other => other.map(drop),
    }
}

fn ignore_missing(result: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match result {
        Err(kube::Error::Api(e)) if e.is_not_found() => Ok(()),
        other => other,
    }
}

/// The pool that owns the contract sample's address objects, as a provider's pool owns its own.
const CONTRACT_POOL: &str = "contract";

/// What the contract sample writes to, and the owners of its address objects.
struct ContractApis {
    claims: Api<IPAddressClaim>,
    addresses: Api<IPAddress>,
    pool: OwnerReference,
    /// Claim name → UID, from each claim's finalizer patch.
    claim_owners: std::sync::Mutex<HashMap<String, String>>,
}

/// `pool` as an owner of its address objects: blocking their deletion, not their controller.
fn pool_owner(pool: &InClusterIPPool) -> Result<OwnerReference, String> {
    let owner = pool
        .owner_ref(&())
        .ok_or_else(|| format!("{} has no UID", pool.name_any()))?;
    Ok(OwnerReference {
        controller: Some(false),
        block_owner_deletion: Some(true),
        ..owner
    })
}

fn probe_pool() -> IPPoolReference {
    IPPoolReference {
        name: "raw".into(),
        kind: "LoadProbe".into(),
        api_group: "load.bitpool.test".into(),
    }
}

fn raw_address(name: &str) -> IPAddress {
    IPAddress::new(
        name,
        IPAddressSpec {
            claim_ref: LocalObjectName { name: name.into() },
            pool_ref: probe_pool(),
            address: "192.0.2.1".into(),
            prefix: 32,
            gateway: None,
        },
    )
}

/// The load command's own view of a namespace's claims and address objects.
pub struct Watch {
    pub flavour: Flavour,
    pub claims: Store<DynamicObject>,
    pub addresses: Store<DynamicObject>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Watch {
    /// Watches the claims and addresses of `flavour` in `namespace`; returns once both caches
    /// are filled.
    pub async fn start(load: &Load, namespace: &str, flavour: Flavour) -> Result<Self, String> {
        let (claims, claims_task) = cache(load.api(namespace, &flavour.claims()), flavour.claims());
        let (addresses, addresses_task) = cache(
            load.api(namespace, &flavour.addresses()),
            flavour.addresses(),
        );
        for (what, ready) in [
            ("claims", claims.wait_until_ready().await),
            ("address objects", addresses.wait_until_ready().await),
        ] {
            ready.map_err(|e| format!("the watch of {what} failed: {e}"))?;
        }
        Ok(Self {
            flavour,
            claims,
            addresses,
            tasks: vec![claims_task, addresses_task],
        })
    }

    /// How many claims are served.
    pub fn ready_claims(&self) -> usize {
        let served = |c: &&std::sync::Arc<DynamicObject>| self.flavour.served_by(c).is_some();
        self.claims.state().iter().filter(served).count()
    }

    /// Waits until `done` holds, the provider exits or `limit` passes; says how far it got.
    pub async fn until(
        &self,
        what: &str,
        limit: Duration,
        provider: &mut Running,
        done: impl Fn(&Self) -> bool,
        progress: impl Fn(&Self) -> String,
    ) -> Result<Instant, String> {
        let deadline = Instant::now() + limit;
        loop {
            if done(self) {
                return Ok(Instant::now());
            }
            if let Some(exit) = provider.exited() {
                return Err(format!("{what}: {exit}"));
            }
            if Instant::now() > deadline {
                return Err(format!("{what}: not within {limit:?} ({})", progress(self)));
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn cache(
    api: Api<DynamicObject>,
    resource: ApiResource,
) -> (Store<DynamicObject>, tokio::task::JoinHandle<()>) {
    let writer = Writer::new(resource);
    let store = writer.as_reader();
    let stream = watcher(api, watcher::Config::default().any_semantic())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .for_each(|_| futures::future::ready(()));
    (store, tokio::spawn(stream))
}

/// Duplicates and misses among the claims of a run, checked on the server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Address objects whose address another address object of the same run also has.
    pub duplicates: usize,
    /// Claims without an address object of theirs, from their pool, naming them.
    pub misses: usize,
}

/// Lists the claims and address objects of `namespace` afresh and checks them against `pools`.
pub async fn verify(
    load: &Load,
    namespace: &str,
    flavour: Flavour,
    pools: &[Pool],
) -> Result<Verdict, String> {
    let claims = list_all(&load.api(namespace, &flavour.claims())).await?;
    let addresses = list_all(&load.api(namespace, &flavour.addresses())).await?;
    let networks: HashMap<&str, IpNet> =
        pools.iter().map(|p| (p.name.as_str(), p.network)).collect();
    let mut holders: BTreeMap<IpAddr, usize> = BTreeMap::new();
    let mut by_name = HashMap::new();
    for address in &addresses {
        // An object without an address or its references counts as holding nothing: the
        // claim it should serve is a miss.
        if let Some(held) = flavour.held(address) {
            *holders.entry(held.address).or_default() += 1;
            by_name.insert(address.name_any(), held);
        }
    }
    let duplicates = holders.values().filter(|n| **n > 1).map(|n| n - 1).sum();
    let misses = claims
        .iter()
        .filter(|claim| {
            let pool = flavour.claim_pool(claim).unwrap_or_default();
            let network = networks.get(pool);
            let held = flavour.served_by(claim).and_then(|name| by_name.get(name));
            !held.is_some_and(|held| {
                held.claim == claim.name_any()
                    && held.pool == pool
                    && network.is_some_and(|n| n.contains(&held.address))
            })
        })
        .count();
    Ok(Verdict { duplicates, misses })
}

/// Every object `api` lists, page by page.
pub async fn list_all(api: &Api<DynamicObject>) -> Result<Vec<DynamicObject>, String> {
    let mut items = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|e| format!("cannot list: {e}"))?;
        let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
        items.extend(page.items);
        match next {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(items),
        }
    }
}
