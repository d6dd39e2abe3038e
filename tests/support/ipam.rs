//! Helpers for the IPAM fault and outage tests: pools and claims of every kind, bursts, and the
//! end-of-test check that no address is held twice and the ledger matches the live objects.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use bitpool::api::capi::{IPAddress, IPAddressClaim, IPAddressClaimSpec, IPPoolReference};
use bitpool::api::capi_pools::{
    GlobalInClusterIPPool, GlobalInClusterIPPoolSpec, GlobalInClusterPrefixPool,
    GlobalInClusterPrefixPoolSpec, InClusterIPPool, InClusterIPPoolSpec, InClusterPrefixPool,
    InClusterPrefixPoolSpec,
};
use bitpool::api::metal3_ipam::{
    IPClaim, IPClaimSpec, IPPool, IPPoolSpec, Metal3IPAddress, Metal3PoolRange,
};
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, ListParams, PostParams};
use kube::{Resource, ResourceExt};

use super::{Bitpool, Env, eventually};

pub const WAIT: Duration = Duration::from_secs(90);
/// Long enough for a rebuilt ledger's fence (37 s) and the batches after it.
pub const AFTER_FENCE: Duration = Duration::from_secs(240);
pub const CAPI_GROUP: &str = "ipam.cluster.x-k8s.io";
pub const METAL3_GROUP: &str = "ipam.metal3.io";

pub fn capi_spec(addresses: &[&str], prefix: i32) -> InClusterIPPoolSpec {
    InClusterIPPoolSpec {
        addresses: addresses.iter().map(|s| s.to_string()).collect(),
        prefix,
        ..Default::default()
    }
}

pub async fn create<K>(api: &Api<K>, object: &K) -> K
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.create(&PostParams::default(), object)
        .await
        .unwrap_or_else(|e| panic!("create {:?}: {e}", object.meta().name))
}

pub async fn capi_pool(env: &Env, name: &str, spec: InClusterIPPoolSpec) {
    let pool = InClusterIPPool {
        metadata: env.meta(name),
        spec,
        status: None,
    };
    create(&env.api(), &pool).await;
}

/// A global pool named `<namespace>-<name>` (global names are cluster-wide), labelled for the
/// test's bitpool.
pub async fn global_pool(env: &Env, name: &str, spec: InClusterIPPoolSpec) -> String {
    let full = format!("{}-{name}", env.name());
    let mut metadata = env.meta(&full);
    metadata.namespace = None;
    let pool = GlobalInClusterIPPool {
        metadata,
        spec: GlobalInClusterIPPoolSpec { pool: spec },
        status: None,
    };
    create(&Api::all(env.client.clone()), &pool).await;
    full
}

pub fn prefix_spec(prefixes: &[&str], length: i32) -> InClusterPrefixPoolSpec {
    InClusterPrefixPoolSpec {
        prefixes: prefixes.iter().map(|s| s.to_string()).collect(),
        allocation_prefix_length: length,
        ..Default::default()
    }
}

pub async fn prefix_pool(env: &Env, name: &str, spec: InClusterPrefixPoolSpec) {
    let pool = InClusterPrefixPool {
        metadata: env.meta(name),
        spec,
        status: None,
    };
    create(&env.api(), &pool).await;
}

/// A global prefix pool named `<namespace>-<name>`, labelled for the test's bitpool.
pub async fn global_prefix_pool(env: &Env, name: &str, spec: InClusterPrefixPoolSpec) -> String {
    let full = format!("{}-{name}", env.name());
    let mut metadata = env.meta(&full);
    metadata.namespace = None;
    let pool = GlobalInClusterPrefixPool {
        metadata,
        spec: GlobalInClusterPrefixPoolSpec { pool: spec },
        status: None,
    };
    create(&Api::all(env.client.clone()), &pool).await;
    full
}

pub fn metal3_spec(start: &str, end: &str, prefix: i32) -> IPPoolSpec {
    IPPoolSpec {
        name_prefix: "m3".into(),
        pools: vec![Metal3PoolRange {
            start: Some(start.into()),
            end: Some(end.into()),
            ..Default::default()
        }],
        prefix: Some(prefix),
        ..Default::default()
    }
}

pub async fn metal3_pool(env: &Env, name: &str, spec: IPPoolSpec) {
    let pool = IPPool {
        metadata: env.meta(name),
        spec,
        status: None,
    };
    create(&env.api(), &pool).await;
}

pub fn claim_object(env: &Env, name: &str, group: &str, kind: &str, pool: &str) -> IPAddressClaim {
    IPAddressClaim {
        metadata: env.meta(name),
        spec: IPAddressClaimSpec {
            cluster_name: None,
            pool_ref: IPPoolReference {
                name: pool.into(),
                kind: kind.into(),
                api_group: group.into(),
            },
        },
        status: None,
    }
}

pub async fn claim(env: &Env, name: &str, kind: &str, pool: &str) {
    let group = if kind == "IPPool" {
        METAL3_GROUP
    } else {
        CAPI_GROUP
    };
    create(&env.api(), &claim_object(env, name, group, kind, pool)).await;
}

pub fn ipclaim_object(env: &Env, name: &str, pool: &str) -> IPClaim {
    IPClaim {
        metadata: env.meta(name),
        spec: IPClaimSpec {
            pool: k8s_openapi::api::core::v1::ObjectReference {
                name: Some(pool.into()),
                namespace: Some(env.name().to_string()),
                ..Default::default()
            },
        },
        status: None,
    }
}

pub async fn ipclaim(env: &Env, name: &str, pool: &str) {
    create(&env.api(), &ipclaim_object(env, name, pool)).await;
}

/// `count` claims named `<prefix>-NNNN` on one pool, created 32 at a time.
pub async fn burst(env: &Env, prefix: &str, kind: &str, pool: &str, count: usize) {
    let group = if kind == "IPPool" {
        METAL3_GROUP
    } else {
        CAPI_GROUP
    };
    let claims =
        (0..count).map(|i| claim_object(env, &format!("{prefix}-{i:04}"), group, kind, pool));
    create_claims(env, claims).await;
}

/// `count` IPClaims named `<prefix>-NNNN` on the Metal3 pool `pool`, created 32 at a time.
pub async fn ipclaim_burst(env: &Env, prefix: &str, pool: &str, count: usize) {
    let claims = (0..count).map(|i| ipclaim_object(env, &format!("{prefix}-{i:04}"), pool));
    create_all(&env.api(), claims).await;
}

/// Waits until at least `count` IPAddresses exist in the test namespace.
pub async fn wait_addresses(env: &Env, count: usize, what: &str) {
    let addresses: Api<IPAddress> = env.api();
    eventually(what, WAIT, || async {
        let served = addresses
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .len();
        (served >= count).then_some(())
    })
    .await;
}

/// Creates `claims` in the test namespace, 32 at a time.
pub async fn create_claims(env: &Env, claims: impl Iterator<Item = IPAddressClaim>) {
    create_all(&env.api(), claims).await;
}

/// Creates `objects` through `api`, 32 at a time; any refusal fails the test.
pub async fn create_all<K>(api: &Api<K>, objects: impl Iterator<Item = K>)
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let creations = objects.map(|object| async move {
        api.create(&PostParams::default(), &object)
            .await
            .map_err(|e| format!("create {:?}: {e}", object.meta().name))
    });
    for result in stream::iter(creations)
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
    {
        result.unwrap_or_else(|e| panic!("{e}"));
    }
}

pub fn ready(claim: &IPAddressClaim) -> Option<&Condition> {
    claim
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
}

/// Waits until the claim's Ready condition satisfies `check`.
pub async fn wait_claim(
    env: &Env,
    name: &str,
    what: &str,
    check: impl Fn(&Condition) -> bool,
) -> Condition {
    let api: Api<IPAddressClaim> = env.api();
    eventually(&format!("claim {name}: {what}"), WAIT, || {
        let api = api.clone();
        let check = &check;
        async move {
            let claim = api.get_opt(name).await.ok()??;
            ready(&claim).filter(|c| check(c)).cloned()
        }
    })
    .await
}

/// SIGKILLs `victim` as soon as a watch has seen `threshold` IPAddresses of the test namespace,
/// so that the kill lands within milliseconds of that creation; how many it had seen.
pub async fn kill_when_created(env: &Env, victim: &mut Bitpool, threshold: usize) -> usize {
    let mut created = BTreeSet::new();
    let events = kube::runtime::watcher(env.api::<IPAddress>(), Default::default());
    let mut events = std::pin::pin!(kube::runtime::WatchStreamExt::applied_objects(events));
    let watching = async {
        while let Some(Ok(address)) = events.next().await {
            created.insert(address.name_any());
            if created.len() >= threshold {
                break;
            }
        }
    };
    let served = tokio::time::timeout(WAIT, watching).await.is_ok();
    assert!(served, "nothing was served (log: {:?})", victim.log);
    victim.kill();
    created.len()
}

/// Waits until `count` claims of the test namespace are Ready.
pub async fn wait_all_ready(env: &Env, count: usize, within: Duration) {
    let claims: Api<IPAddressClaim> = env.api();
    eventually(&format!("all {count} claims Ready"), within, || {
        let claims = claims.clone();
        async move {
            let list = claims.list(&ListParams::default()).await.ok()?;
            let ready = list
                .items
                .iter()
                .filter(|c| ready(c).is_some_and(|r| r.status == "True"))
                .count();
            (ready == count).then_some(())
        }
    })
    .await;
}

/// Waits until none of the test's objects changes for a while, then checks for `rounds` more
/// that nothing is written at rest.
pub async fn assert_quiet_at_rest(env: &Env, rounds: usize) {
    let settled = eventually("the objects settle", Duration::from_secs(60), || async {
        let before = versions(env).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        changed_since(env, &before)
            .await
            .is_empty()
            .then_some(before)
    })
    .await;
    for _ in 0..rounds {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let changed = changed_since(env, &settled).await;
        assert!(changed.is_empty(), "written at rest: {changed:?}");
    }
}

/// The address the IPAddress `name` (named after its claim) holds.
pub async fn address_of(env: &Env, name: &str) -> String {
    env.api::<IPAddress>()
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("IPAddress {name}: {e}"))
        .spec
        .address
}

/// Waits until the IPClaim `name` names its address.
pub async fn wait_ipclaim(env: &Env, name: &str) {
    let ipclaims: Api<IPClaim> = env.api();
    eventually(&format!("IPClaim {name} served"), WAIT, || async {
        ipclaims.get(name).await.ok()?.status?.address.map(|_| ())
    })
    .await;
}

/// Every claim of `pool` has its own address object, no address is held twice, and the pool's
/// ledger lists exactly the live address objects with nothing pending. `expected` is the number
/// of claims that must hold an address.
pub async fn assert_consistent(
    env: &Env,
    kind: &str,
    pool: &str,
    expected: usize,
    within: Duration,
) {
    let claims: Api<IPAddressClaim> = env.api();
    let addresses: Api<IPAddress> = env.api();
    let key = format!("{kind}/{pool}");
    let state = eventually(
        &format!("{key}: {expected} claims served, ledger settled"),
        within,
        || {
            let (claims, addresses) = (claims.clone(), addresses.clone());
            async move {
                let claims: Vec<IPAddressClaim> = claims
                    .list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .filter(|c| c.spec.pool_ref.name == pool && c.spec.pool_ref.kind == kind)
                    .collect();
                let served = claims
                    .iter()
                    .filter(|c| ready(c).is_some_and(|r| r.status == "True"))
                    .count();
                let addresses: Vec<IPAddress> = addresses
                    .list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .filter(|a| a.spec.pool_ref.name == pool && a.spec.pool_ref.kind == kind)
                    .collect();
                let ledger = env.ledger(kind, pool).await?;
                let live: BTreeSet<String> =
                    addresses.iter().map(|a| a.spec.address.clone()).collect();
                let listed: BTreeSet<String> = ledger.addresses().map(|a| a.to_string()).collect();
                (served == expected
                    && addresses.len() == expected
                    && ledger.pending.is_empty()
                    && live == listed)
                    .then_some((claims, addresses))
            }
        },
    )
    .await;
    let (claims, addresses) = state;
    let mut holders: HashMap<&str, &str> = HashMap::new();
    let claim_names: BTreeSet<String> = claims.iter().map(|c| c.name_any()).collect();
    for address in &addresses {
        if let Some(other) = holders.insert(&address.spec.address, &address.spec.claim_ref.name) {
            panic!(
                "{key}: {} is held by both {other} and {}",
                address.spec.address, address.spec.claim_ref.name
            );
        }
        assert!(
            claim_names.contains(&address.spec.claim_ref.name),
            "{key}: IPAddress {} outlived its claim",
            address.name_any()
        );
    }
}

/// Every object of kind `K` in the test namespace that `keep` keeps.
pub async fn listed<K>(env: &Env, keep: impl Fn(&K) -> bool) -> Option<Vec<K>>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let items = env
        .api::<K>()
        .list(&ListParams::default())
        .await
        .ok()?
        .items;
    Some(items.into_iter().filter(|k| keep(k)).collect())
}

/// The Metal3 pool `pool` settled: every IPClaim and IPAddressClaim naming it served, each by
/// exactly one address object of the pool, no address held twice, and the pool's ledger
/// listing exactly the live objects with nothing pending.
pub async fn assert_metal3_consistent(env: &Env, pool: &str, within: Duration) {
    let settled = eventually(
        &format!("IPPool/{pool}: every claim served by one object, ledger settled"),
        within,
        || async {
            let ipclaims: Vec<IPClaim> =
                listed(env, |c: &IPClaim| c.spec.pool.name.as_deref() == Some(pool)).await?;
            let claims: Vec<IPAddressClaim> = listed(env, |c: &IPAddressClaim| {
                c.spec.pool_ref.kind == "IPPool" && c.spec.pool_ref.name == pool
            })
            .await?;
            let metal3: Vec<Metal3IPAddress> = listed(env, |a: &Metal3IPAddress| {
                a.spec.pool.name.as_deref() == Some(pool)
            })
            .await?;
            let capi: Vec<IPAddress> = listed(env, |a: &IPAddress| {
                a.spec.pool_ref.kind == "IPPool" && a.spec.pool_ref.name == pool
            })
            .await?;
            let served = ipclaims
                .iter()
                .all(|c| c.status.as_ref().is_some_and(|s| s.address.is_some()))
                && claims
                    .iter()
                    .all(|c| ready(c).is_some_and(|r| r.status == "True"));
            let ledger = env.ledger("IPPool", pool).await?;
            let live: BTreeSet<String> = metal3
                .iter()
                .map(|a| a.spec.address.clone())
                .chain(capi.iter().map(|a| a.spec.address.clone()))
                .collect();
            let listed: BTreeSet<String> = ledger.addresses().map(|a| a.to_string()).collect();
            let objects = metal3.len() + capi.len();
            (served
                && objects == ipclaims.len() + claims.len()
                && ledger.pending.is_empty()
                && live == listed)
                .then_some((metal3, capi))
        },
    )
    .await;
    let (metal3, capi) = settled;
    let mut holders: HashMap<String, String> = HashMap::new();
    let mut claimed = BTreeSet::new();
    let held = metal3
        .iter()
        .map(|a| {
            (
                a.spec.address.clone(),
                format!("IPClaim/{}", a.spec.claim.name.clone().unwrap_or_default()),
            )
        })
        .chain(capi.iter().map(|a| {
            (
                a.spec.address.clone(),
                format!("IPAddressClaim/{}", a.spec.claim_ref.name),
            )
        }));
    for (address, claim) in held {
        assert!(
            claimed.insert(claim.clone()),
            "IPPool/{pool}: {claim} has two address objects"
        );
        if let Some(other) = holders.insert(address.clone(), claim.clone()) {
            panic!("IPPool/{pool}: {address} is held by both {other} and {claim}");
        }
    }
}

/// The prefix pool `pool` settled with `count` claims: each served by one IPAddress of the pool
/// of its own, no sub-prefix twice, and the ledger holding exactly the live sub-prefixes with
/// nothing pending.
pub async fn assert_prefixes_consistent(env: &Env, pool: &str, count: usize, within: Duration) {
    eventually(
        &format!("InClusterPrefixPool/{pool} settles"),
        within,
        || async {
            let claims: Vec<IPAddressClaim> =
                listed(env, |c: &IPAddressClaim| c.spec.pool_ref.name == pool).await?;
            let served = claims
                .iter()
                .filter(|c| ready(c).is_some_and(|r| r.status == "True"))
                .count();
            let objects: Vec<IPAddress> =
                listed(env, |a: &IPAddress| a.spec.pool_ref.name == pool).await?;
            // The ledger holds each sub-prefix by its number (bitpool::alloc::prefix).
            let numbers: BTreeSet<String> = objects
                .iter()
                .filter_map(|a| {
                    let network: std::net::IpAddr = a.spec.address.parse().ok()?;
                    let length = u8::try_from(a.spec.prefix).ok()?;
                    let family = bitpool::alloc::Family::of(network);
                    let numbering = bitpool::alloc::Numbering { family, length };
                    numbering.number(network, length)
                })
                .map(|number| number.to_string())
                .collect();
            let holders: BTreeSet<&str> = objects
                .iter()
                .map(|a| a.spec.claim_ref.name.as_str())
                .collect();
            let ledger = env.ledger("InClusterPrefixPool", pool).await?;
            let recorded: BTreeSet<String> = ledger.addresses().map(|a| a.to_string()).collect();
            (claims.len() == count
                && served == count
                && objects.len() == count
                && numbers.len() == count
                && holders.len() == count
                && recorded == numbers
                && ledger.pending.is_empty())
            .then_some(())
        },
    )
    .await;
}

/// Every warning bitpool logged names the object it is about (the client library's own, such
/// as a connection the API server closed while restarting, are not bitpool's to word).
pub fn assert_warnings_name_objects(bitpool: &Bitpool) {
    let log = std::fs::read_to_string(&bitpool.log).unwrap_or_default();
    assert!(
        !log.contains('\u{1b}'),
        "colour codes in a log file: {:?}",
        bitpool.log
    );
    for line in log.lines().filter(|l| l.contains(" WARN bitpool")) {
        assert!(
            [
                "object=",
                "pool=",
                "claim=",
                "address=",
                "kind=",
                "namespace="
            ]
            .iter()
            .any(|field| line.contains(field)),
            "a warning that names no object in {:?}: {line}",
            bitpool.log
        );
    }
}

/// resourceVersions of every object bitpool writes in the test namespace.
pub async fn versions(env: &Env) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    macro_rules! collect {
        ($kind:ty, $label:expr) => {
            for object in env
                .api::<$kind>()
                .list(&ListParams::default())
                .await
                .expect("list")
                .items
            {
                out.insert(
                    format!("{} {}", $label, object.name_any()),
                    object.resource_version().unwrap_or_default(),
                );
            }
        };
    }
    collect!(InClusterIPPool, "InClusterIPPool");
    collect!(InClusterPrefixPool, "InClusterPrefixPool");
    collect!(IPPool, "IPPool");
    collect!(IPAddressClaim, "IPAddressClaim");
    collect!(IPClaim, "IPClaim");
    collect!(IPAddress, "IPAddress");
    collect!(Metal3IPAddress, "Metal3IPAddress");
    collect!(ConfigMap, "ConfigMap");
    let labelled = ListParams::default().labels(&format!(
        "{}={}",
        bitpool::runtime::WATCH_FILTER_LABEL,
        env.name()
    ));
    for pool in Api::<GlobalInClusterIPPool>::all(env.client.clone())
        .list(&labelled)
        .await
        .expect("list")
        .items
    {
        out.insert(
            format!("GlobalInClusterIPPool {}", pool.name_any()),
            pool.resource_version().unwrap_or_default(),
        );
    }
    for pool in Api::<GlobalInClusterPrefixPool>::all(env.client.clone())
        .list(&labelled)
        .await
        .expect("list")
        .items
    {
        out.insert(
            format!("GlobalInClusterPrefixPool {}", pool.name_any()),
            pool.resource_version().unwrap_or_default(),
        );
    }
    out
}

/// The objects (of [`versions`]) created or changed since `before`.
pub async fn changed_since(env: &Env, before: &BTreeMap<String, String>) -> Vec<String> {
    versions(env)
        .await
        .into_iter()
        .filter(|(k, v)| before.get(k) != Some(v))
        .map(|(k, _)| k)
        .collect()
}

/// Deletes every claim of `api`'s namespace. A deletecollection of thousands of claims can
/// outlast the API server's 60 s request timeout, which cuts the connection; like any client,
/// the test then asks again for what is left (at most 5 times).
pub async fn delete_all_claims(api: &Api<IPAddressClaim>) {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match api
            .delete_collection(&kube::api::DeleteParams::default(), &ListParams::default())
            .await
        {
            Ok(_) => return,
            Err(e) if attempt < 5 && !matches!(&e, kube::Error::Api(s) if s.code < 500) => {
                eprintln!("deletecollection of claims failed ({e}); asking again");
            }
            Err(e) => panic!("delete every claim: {e}"),
        }
    }
}
