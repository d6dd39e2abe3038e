//! What the tests assert of the cluster: every claim served by one address object of its own,
//! no address held twice, ledgers equal to the live objects, nothing written at rest, warnings
//! that name their object — and the reads these checks are made of.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use bitpool::api::capi::{IPAddress, IPAddressClaim};
use bitpool::api::capi_pools::{
    GlobalInClusterIPPool, GlobalInClusterPrefixPool, InClusterIPPool, InClusterPrefixPool,
};
use bitpool::api::metal3_ipam::{IPClaim, IPPool, Metal3IPAddress};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use super::env::Env;
use super::process::Bitpool;
use super::wait::eventually;

pub fn ready(claim: &IPAddressClaim) -> Option<&Condition> {
    claim
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
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
    assert_prefix_pool_consistent(env, "InClusterPrefixPool", pool, count, within).await;
}

/// [`assert_prefixes_consistent`] for the prefix pool `kind`/`pool`, namespaced or global.
pub async fn assert_prefix_pool_consistent(
    env: &Env,
    kind: &str,
    pool: &str,
    count: usize,
    within: Duration,
) {
    let of_pool = |r: &bitpool::api::capi::IPPoolReference| r.name == pool && r.kind == kind;
    eventually(&format!("{kind}/{pool} settles"), within, || async {
        let claims: Vec<IPAddressClaim> =
            listed(env, |c: &IPAddressClaim| of_pool(&c.spec.pool_ref)).await?;
        let served = claims
            .iter()
            .filter(|c| ready(c).is_some_and(|r| r.status == "True"))
            .count();
        let objects: Vec<IPAddress> =
            listed(env, |a: &IPAddress| of_pool(&a.spec.pool_ref)).await?;
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
        let ledger = env.ledger(kind, pool).await?;
        let recorded: BTreeSet<String> = ledger.addresses().map(|a| a.to_string()).collect();
        (claims.len() == count
            && served == count
            && objects.len() == count
            && numbers.len() == count
            && holders.len() == count
            && recorded == numbers
            && ledger.pending.is_empty())
        .then_some(())
    })
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
        bitpool::api::labels::WATCH_FILTER,
        env.name()
    ));
    collect_global::<GlobalInClusterIPPool>(env, &labelled, &mut out).await;
    collect_global::<GlobalInClusterPrefixPool>(env, &labelled, &mut out).await;
    out
}

/// Adds the resourceVersions of the cluster-scoped `K` that `labelled` selects to `out`.
async fn collect_global<K>(env: &Env, labelled: &ListParams, out: &mut BTreeMap<String, String>)
where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    for pool in Api::<K>::all(env.client.clone())
        .list(labelled)
        .await
        .expect("list")
        .items
    {
        out.insert(
            format!("{} {}", K::kind(&()), pool.name_any()),
            pool.resource_version().unwrap_or_default(),
        );
    }
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
