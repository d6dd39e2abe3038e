//! The Metal3 IPAM dialect against a real API server: IPPool serving IPClaims (upstream's
//! names, finalizers, status and error strings) and CAPI IPAddressClaims from one address
//! space, with the upstream bugs fixed, driven by real `bitpool run` processes.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bitpool::api::capi::{IPAddress, IPAddressClaim, IPPoolReference};
use bitpool::api::metal3_ipam::{IPClaim, IPPool, IPPoolSpec, Metal3IPAddress, Metal3PoolRange};
use futures::{StreamExt, stream};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use support::build::{claim_object, create, create_claim, ipclaim_object, metal3_pool};
use support::check::listed;
use support::{Bitpool, Env, eventually};

const WAIT: Duration = Duration::from_secs(60);

/// Metal3 helpers on the shared test environment.
trait Metal3Env {
    async fn wait_ipclaim<T>(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&IPClaim) -> Option<T>,
    ) -> T;
    async fn allocated(&self, claim: &str) -> Metal3IPAddress;
    async fn error_of(&self, claim: &str, expected: &str);
    async fn capi_allocated(&self, claim: &str) -> IPAddress;
}

impl Metal3Env for Env {
    /// Waits for the IPClaim's status to satisfy `check`.
    async fn wait_ipclaim<T>(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&IPClaim) -> Option<T>,
    ) -> T {
        let api = self.api::<IPClaim>();
        eventually(&format!("IPClaim {name}: {what}"), WAIT, || {
            let api = api.clone();
            let check = &check;
            async move { check(&api.get_opt(name).await.ok()??) }
        })
        .await
    }

    /// The Metal3 IPAddress an IPClaim points at, once it has one.
    async fn allocated(&self, claim: &str) -> Metal3IPAddress {
        let name = self
            .wait_ipclaim(claim, "an address", |c| {
                c.status.as_ref()?.address.as_ref()?.name.clone()
            })
            .await;
        self.api::<Metal3IPAddress>()
            .get(&name)
            .await
            .expect("Metal3 IPAddress exists")
    }

    async fn error_of(&self, claim: &str, expected: &str) {
        self.wait_ipclaim(claim, expected, |c| {
            (c.status.as_ref()?.error_message.as_deref() == Some(expected)).then_some(())
        })
        .await
    }

    /// The CAPI IPAddress a claim's Ready condition points at.
    async fn capi_allocated(&self, claim: &str) -> IPAddress {
        let api = self.api::<IPAddressClaim>();
        let name = eventually(&format!("IPAddressClaim {claim} Ready"), WAIT, || {
            let api = api.clone();
            async move {
                let c = api.get_opt(claim).await.ok()??;
                let status = c.status?;
                status
                    .conditions
                    .iter()
                    .find(|c| c.type_ == "Ready" && c.status == "True")?;
                Some(status.address_ref?.name)
            }
        })
        .await;
        self.api::<IPAddress>()
            .get(&name)
            .await
            .expect("IPAddress exists")
    }
}

fn range(start: &str, end: &str) -> Metal3PoolRange {
    Metal3PoolRange {
        start: Some(start.into()),
        end: Some(end.into()),
        ..Default::default()
    }
}

fn pool_spec(ranges: Vec<Metal3PoolRange>) -> IPPoolSpec {
    IPPoolSpec {
        name_prefix: "test1-prov".into(),
        pools: ranges,
        prefix: Some(24),
        gateway: Some("192.168.0.1".into()),
        dns_servers: vec!["8.8.8.8".into()],
        ..Default::default()
    }
}

#[tokio::test]
async fn ipclaims_get_addresses_as_upstream_makes_them() {
    let env = Env::new("m3-upstream").await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    let mut ranges = vec![range("192.168.0.10", "192.168.0.20")];
    ranges.push(Metal3PoolRange {
        subnet: Some("192.168.1.0/24".into()),
        prefix: Some(25),
        gateway: Some("192.168.1.1".into()),
        dns_servers: vec!["192.168.1.53".into()],
        ..Default::default()
    });
    metal3_pool(&env, "pool", pool_spec(ranges)).await;
    let mut claim = ipclaim_object(&env, "node-0-pool", "pool");
    claim
        .metadata
        .labels
        .get_or_insert_default()
        .insert("cluster.x-k8s.io/cluster-name".into(), "test1".into());
    create(&env.api(), &claim).await;

    let address = env.allocated("node-0-pool").await;
    assert_eq!(address.name_any(), "test1-prov-192-168-0-10");
    assert_eq!(address.spec.address, "192.168.0.10");
    assert_eq!(
        (address.spec.prefix, address.spec.gateway.as_deref()),
        (Some(24), Some("192.168.0.1"))
    );
    assert_eq!(address.spec.dns_servers, ["8.8.8.8"]);
    assert_eq!(address.spec.claim.name.as_deref(), Some("node-0-pool"));
    assert_eq!(address.spec.pool.name.as_deref(), Some("pool"));
    assert_eq!(address.finalizers(), ["ipaddress.ipam.metal3.io"]);
    assert_eq!(
        address
            .labels()
            .get("cluster.x-k8s.io/cluster-name")
            .map(String::as_str),
        Some("test1")
    );
    let owners: BTreeSet<&str> = address
        .owner_references()
        .iter()
        .map(|o| o.kind.as_str())
        .collect();
    assert_eq!(owners, BTreeSet::from(["IPClaim", "IPPool"]));
    let claim = env
        .api::<IPClaim>()
        .get("node-0-pool")
        .await
        .expect("claim");
    assert_eq!(claim.finalizers(), ["ipclaim.ipam.metal3.io"]);
    assert!(claim.status.expect("status").error_message.is_none());

    let indexes = eventually("pool status.indexes", WAIT, || async {
        let pool = env.api::<IPPool>().get("pool").await.ok()?;
        let status = pool.status?;
        (!status.indexes.is_empty() && status.last_updated.is_some()).then_some(status.indexes)
    })
    .await;
    assert_eq!(
        indexes,
        BTreeMap::from([("node-0-pool".to_string(), "192.168.0.10".to_string())])
    );
    let pool = env.api::<IPPool>().get("pool").await.expect("pool");
    assert_eq!(pool.finalizers(), ["ippool.ipam.metal3.io"]);

    // The second entry's own prefix, gateway and DNS servers; its gateway is never handed out.
    for i in 0..11 {
        create(
            &env.api(),
            &ipclaim_object(&env, &format!("fill-{i}"), "pool"),
        )
        .await;
    }
    create(&env.api(), &ipclaim_object(&env, "second-entry", "pool")).await;
    let second = env.allocated("second-entry").await;
    assert_eq!(
        second.spec.address, "192.168.1.3",
        "the fills took .11 to .20 and 192.168.1.2; 192.168.1.1 is the entry's gateway"
    );
    assert_eq!(
        (second.spec.prefix, second.spec.gateway.as_deref()),
        (Some(25), Some("192.168.1.1"))
    );
    assert_eq!(second.spec.dns_servers, ["192.168.1.53"]);

    env.api::<IPClaim>()
        .delete("node-0-pool", &DeleteParams::default())
        .await
        .expect("delete");
    eventually("claim and address gone", WAIT, || async {
        let claim = env.api::<IPClaim>().get_opt("node-0-pool").await.ok()?;
        let address = env
            .api::<Metal3IPAddress>()
            .get_opt("test1-prov-192-168-0-10")
            .await
            .ok()?;
        (claim.is_none() && address.is_none()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn errors_use_upstream_messages_and_exhausted_claims_are_retried() {
    let env = Env::new("m3-errors").await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    let mut small = pool_spec(vec![range("192.168.0.10", "192.168.0.11")]);
    small.pre_allocations = BTreeMap::from([("lost".to_string(), "192.168.9.9".to_string())]);
    metal3_pool(&env, "small", small).await;
    create(&env.api(), &ipclaim_object(&env, "lost", "small")).await;
    env.error_of("lost", "Pre-allocated IP out of bounds").await;
    create(&env.api(), &ipclaim_object(&env, "a", "small")).await;
    env.allocated("a").await;
    create(&env.api(), &ipclaim_object(&env, "b", "small")).await;
    env.allocated("b").await;
    create(&env.api(), &ipclaim_object(&env, "c", "small")).await;
    env.error_of("c", "Exhausted IP Pools").await;
    // The pool says so too: upstream #1540's counts, bitpool's used count and Ready.
    let status = eventually("the exhausted pool's counts", WAIT, || async {
        let status = env.api::<IPPool>().get("small").await.ok()?.status?;
        (status.used_ip_count == Some(2)).then_some(status)
    })
    .await;
    assert_eq!(
        (
            status.capacity,
            status.available_ip_count,
            status.out_of_range_ip_count
        ),
        (Some(2), Some(0), Some(0))
    );
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
    assert_eq!(ready.map(|c| c.status.as_str()), Some("True"), "{status:?}");
    let mut taken = ipclaim_object(&env, "wants-taken", "small");
    taken.metadata.annotations = Some(BTreeMap::from([(
        "ipAddress".into(),
        "192.168.0.10".into(),
    )]));
    create(&env.api(), &taken).await;
    env.error_of("wants-taken", "Requested IP not available")
        .await;
    let mut garbage = ipclaim_object(&env, "wants-garbage", "small");
    garbage.metadata.annotations =
        Some(BTreeMap::from([("ipAddress".into(), "192.168.0.x".into())]));
    create(&env.api(), &garbage).await;
    env.error_of(
        "wants-garbage",
        "Invalid ipAddress annotation \"192.168.0.x\": not a valid IP address",
    )
    .await;

    // Upstream never retries a claim in error (#1537); bitpool does, as soon as an address frees.
    env.api::<IPClaim>()
        .delete("b", &DeleteParams::default())
        .await
        .expect("delete");
    let c = env.allocated("c").await;
    assert_eq!(c.spec.address, "192.168.0.11");
    let c = env.api::<IPClaim>().get("c").await.expect("claim");
    assert!(
        c.status.expect("status").error_message.is_none(),
        "the error is cleared"
    );
}

/// Where no webhook refused it, a pool whose spec hands out nothing says so on its status
/// (`Ready=False`, `InvalidSpec`, with the problem), and serves once the spec is fixed.
#[tokio::test]
async fn an_invalid_pool_says_why_on_its_status_and_serves_once_fixed() {
    let env = Env::new("m3-invalid").await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    metal3_pool(
        &env,
        "backwards",
        pool_spec(vec![range("192.168.0.20", "192.168.0.10")]),
    )
    .await;
    create(&env.api(), &ipclaim_object(&env, "waits", "backwards")).await;
    let ready = |pool: IPPool| {
        pool.status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Ready")
    };
    let refused = eventually("the pool's Ready=False", WAIT, || async {
        let condition = ready(env.api::<IPPool>().get("backwards").await.ok()?)?;
        (condition.status == "False").then_some(condition)
    })
    .await;
    assert_eq!(refused.reason, "InvalidSpec", "{refused:?}");
    assert!(
        refused
            .message
            .contains("nothing is allocated until the spec is fixed"),
        "{refused:?}"
    );
    let patch =
        json!({ "spec": { "pools": [{ "start": "192.168.0.10", "end": "192.168.0.20" }] } });
    env.api::<IPPool>()
        .patch("backwards", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("fix the pool");
    let served = env.allocated("waits").await;
    assert_eq!(served.spec.address, "192.168.0.10");
    eventually("the pool's Ready=True", WAIT, || async {
        let condition = ready(env.api::<IPPool>().get("backwards").await.ok()?)?;
        (condition.status == "True").then_some(())
    })
    .await;
}

#[tokio::test]
async fn capi_claims_share_the_pool_and_same_names_do_not_collide() {
    let env = Env::new("m3-capi").await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    metal3_pool(
        &env,
        "provisioning-pool",
        pool_spec(vec![range("192.168.0.10", "192.168.0.20")]),
    )
    .await;
    // upstream's own example creates exactly this pair: an IPClaim and an IPAddressClaim with the
    // same name on the same pool.
    create(
        &env.api(),
        &ipclaim_object(&env, "provisioning-pool", "provisioning-pool"),
    )
    .await;
    create_claim(
        &env,
        claim_object(&env, "provisioning-pool", "IPPool", "provisioning-pool"),
    )
    .await;
    let mut foreign = claim_object(&env, "foreign", "IPPool", "provisioning-pool");
    foreign.spec.pool_ref.api_group = "ipam.example.com".into();
    create_claim(&env, foreign).await;

    let metal3 = env.allocated("provisioning-pool").await;
    let capi = env.capi_allocated("provisioning-pool").await;
    assert_ne!(
        metal3.spec.address, capi.spec.address,
        "one address space for both kinds"
    );
    assert_eq!(
        capi.name_any(),
        format!("test1-prov-{}", capi.spec.address.replace('.', "-"))
    );
    assert_eq!(capi.finalizers(), ["ipam.metal3.io/ipaddress"]);
    assert_eq!(
        (
            capi.spec.pool_ref.api_group.as_str(),
            capi.spec.pool_ref.kind.as_str()
        ),
        ("ipam.metal3.io", "IPPool")
    );
    assert_eq!(capi.spec.prefix, 24);
    let claim = env
        .api::<IPAddressClaim>()
        .get("provisioning-pool")
        .await
        .expect("claim");
    assert_eq!(claim.finalizers(), ["ipam.metal3.io/ipaddressclaim"]);
    let ready = claim
        .status
        .expect("status")
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready");
    assert!(
        !ready.reason.is_empty(),
        "upstream's condition has no reason and the v1beta2 CRD rejects it"
    );

    let indexes = eventually("both claims in status.indexes", WAIT, || async {
        let status = env
            .api::<IPPool>()
            .get("provisioning-pool")
            .await
            .ok()?
            .status?;
        (status.indexes.len() == 2).then_some(status.indexes)
    })
    .await;
    assert_eq!(indexes.get("provisioning-pool"), Some(&metal3.spec.address));
    assert_eq!(
        indexes.get("IPAddressClaim/provisioning-pool"),
        Some(&capi.spec.address)
    );
    // The claim for another group's IPPool kind was left alone (upstream checks only the name).
    let foreign = env
        .api::<IPAddressClaim>()
        .get("foreign")
        .await
        .expect("claim");
    assert!(foreign.finalizers().is_empty() && foreign.status.is_none());
}

#[tokio::test]
async fn preallocations_are_reserved_for_their_claims_of_either_kind() {
    let env = Env::new("m3-prealloc").await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    let mut spec = pool_spec(vec![range("192.168.0.10", "192.168.0.13")]);
    spec.pre_allocations = BTreeMap::from([
        ("node-0-pool".to_string(), "192.168.0.10".to_string()),
        ("capi-host".to_string(), "192.168.0.11".to_string()),
    ]);
    metal3_pool(&env, "pool", spec).await;
    for i in 0..3 {
        create(
            &env.api(),
            &ipclaim_object(&env, &format!("dynamic-{i}"), "pool"),
        )
        .await;
    }
    env.allocated("dynamic-0").await;
    env.allocated("dynamic-1").await;
    env.error_of("dynamic-2", "Exhausted IP Pools").await;
    create(&env.api(), &ipclaim_object(&env, "node-0-pool", "pool")).await;
    create_claim(&env, claim_object(&env, "capi-host", "IPPool", "pool")).await;
    assert_eq!(
        env.allocated("node-0-pool").await.spec.address,
        "192.168.0.10"
    );
    assert_eq!(
        env.capi_allocated("capi-host").await.spec.address,
        "192.168.0.11"
    );
}

/// Every address held in the test namespace, by objects of either kind.
async fn holders(env: &Env) -> Option<Vec<String>> {
    let metal3: Vec<Metal3IPAddress> = listed(env, |_| true).await?;
    let capi: Vec<IPAddress> = listed(env, |_| true).await?;
    Some(
        metal3
            .into_iter()
            .map(|a| a.spec.address)
            .chain(capi.into_iter().map(|a| a.spec.address))
            .collect(),
    )
}

#[tokio::test]
async fn mixed_claims_racing_on_a_small_pool_never_share_an_address() {
    let env = Env::new("m3-race").await;
    metal3_pool(
        &env,
        "tiny",
        pool_spec(vec![range("192.168.0.10", "192.168.0.29")]),
    )
    .await;
    let _first = Bitpool::start(env.name(), &[]);
    let _second = Bitpool::start(env.name(), &[]);
    let creations = (0..30).map(|i| {
        let env = &env;
        async move {
            if i % 2 == 0 {
                create(&env.api(), &ipclaim_object(env, &format!("m3-{i}"), "tiny")).await;
            } else {
                create_claim(
                    env,
                    claim_object(env, &format!("capi-{i}"), "IPPool", "tiny"),
                )
                .await;
            }
        }
    });
    stream::iter(creations)
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;

    // 20 addresses for 30 claims: 20 allocated, 10 exhausted, never an address twice.
    let taken = eventually("20 addresses allocated", WAIT, || async {
        let all = holders(&env).await?;
        (all.len() == 20).then_some(all)
    })
    .await;
    assert_eq!(
        taken.iter().collect::<BTreeSet<_>>().len(),
        20,
        "an address was handed out twice: {taken:?}"
    );
    let exhausted = eventually("10 claims exhausted", WAIT, || async {
        let claims: Vec<IPClaim> = listed(&env, |_| true).await?;
        let capi: Vec<IPAddressClaim> = listed(&env, |_| true).await?;
        let m3 = claims
            .iter()
            .filter(|c| {
                c.status.as_ref().and_then(|s| s.error_message.as_deref())
                    == Some("Exhausted IP Pools")
            })
            .count();
        let capi = capi
            .iter()
            .filter(|c| {
                c.status
                    .as_ref()
                    .is_some_and(|s| s.conditions.iter().any(|c| c.reason == "PoolExhausted"))
            })
            .count();
        (m3 + capi == 10).then_some(m3 + capi)
    })
    .await;
    assert_eq!(exhausted, 10);

    // Freed addresses go to waiting claims of either kind, still without a duplicate.
    let metal3_claims = env
        .api::<IPClaim>()
        .list(&Default::default())
        .await
        .expect("list")
        .items;
    let allocated: Vec<String> = metal3_claims
        .iter()
        .filter(|c| c.status.as_ref().is_some_and(|s| s.address.is_some()))
        .map(|c| c.name_any())
        .take(5)
        .collect();
    for name in &allocated {
        env.api::<IPClaim>()
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete");
    }
    let env = &env;
    let allocated = &allocated;
    let after = eventually("5 waiting claims served", WAIT, || async move {
        let all = holders(env).await?;
        for name in allocated {
            if env.api::<IPClaim>().get_opt(name).await.ok()?.is_some() {
                return None;
            }
        }
        (all.len() == 20).then_some(all)
    })
    .await;
    assert_eq!(
        after.iter().collect::<BTreeSet<_>>().len(),
        20,
        "duplicate after release: {after:?}"
    );
}

/// The InClusterIPPool `new-pool` (a /24 of `addresses`) as `bitpool migrate` writes it: claim
/// `node-0-bmv4`'s address pinned to `pinned`.
async fn migrated_pool(env: &Env, addresses: &str, gateway: &str, pinned: &str) {
    let target = bitpool::api::capi_pools::InClusterIPPool {
        metadata: env.meta("new-pool"),
        spec: bitpool::api::capi_pools::InClusterIPPoolSpec {
            addresses: vec![addresses.into()],
            prefix: 24,
            gateway: Some(gateway.into()),
            pre_allocations: BTreeMap::from([("node-0-bmv4".into(), pinned.into())]),
            ..Default::default()
        },
        status: None,
    };
    env.api::<bitpool::api::capi_pools::InClusterIPPool>()
        .create(&PostParams::default(), &target)
        .await
        .expect("create InClusterIPPool");
}

#[tokio::test]
async fn a_proxy_pool_serves_ipclaims_from_a_capi_pool_and_releases_them() {
    let env = Env::new("m3-proxy").await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    // The new CAPI pool, as `bitpool migrate` would write it (the host's old address pinned).
    migrated_pool(&env, "10.50.0.0/24", "10.50.0.1", "10.50.0.77").await;
    let mut proxy = pool_spec(vec![]);
    proxy.name_prefix = "test1-bmv4".into();
    proxy.dns_servers = vec!["10.50.0.53".into()];
    proxy.pool_ref = Some(IPPoolReference {
        api_group: "ipam.cluster.x-k8s.io".into(),
        kind: "InClusterIPPool".into(),
        name: "new-pool".into(),
    });
    metal3_pool(&env, "bmv4", proxy).await;
    create(&env.api(), &ipclaim_object(&env, "node-0-bmv4", "bmv4")).await;
    create(&env.api(), &ipclaim_object(&env, "node-1-bmv4", "bmv4")).await;

    let pinned = env.allocated("node-0-bmv4").await;
    assert_eq!(pinned.name_any(), "test1-bmv4-10-50-0-77");
    assert_eq!(pinned.spec.address, "10.50.0.77");
    assert_eq!(
        (pinned.spec.prefix, pinned.spec.gateway.as_deref()),
        (Some(24), Some("10.50.0.1"))
    );
    assert_eq!(pinned.spec.dns_servers, ["10.50.0.53"]);
    assert_eq!(env.allocated("node-1-bmv4").await.spec.address, "10.50.0.2");
    let proxy_claim = env
        .api::<IPAddressClaim>()
        .get("node-0-bmv4")
        .await
        .expect("proxy claim");
    assert_eq!(proxy_claim.spec.pool_ref.kind, "InClusterIPPool");
    assert_eq!(proxy_claim.owner_references()[0].kind, "IPClaim");

    env.api::<IPClaim>()
        .delete("node-1-bmv4", &DeleteParams::default())
        .await
        .expect("delete");
    eventually(
        "the IPClaim, its mirror, its proxy claim and its IPAddress gone",
        WAIT,
        || async {
            let gone = [
                env.api::<IPClaim>()
                    .get_opt("node-1-bmv4")
                    .await
                    .ok()?
                    .is_none(),
                env.api::<Metal3IPAddress>()
                    .get_opt("test1-bmv4-10-50-0-2")
                    .await
                    .ok()?
                    .is_none(),
                env.api::<IPAddressClaim>()
                    .get_opt("node-1-bmv4")
                    .await
                    .ok()?
                    .is_none(),
                env.api::<IPAddress>()
                    .get_opt("node-1-bmv4")
                    .await
                    .ok()?
                    .is_none(),
            ];
            gone.iter().all(|g| *g).then_some(())
        },
    )
    .await;
    let indexes = eventually("the pool lists the remaining claim", WAIT, || async {
        let status = env.api::<IPPool>().get("bmv4").await.ok()?.status?;
        (status.indexes.len() == 1).then_some(status.indexes)
    })
    .await;
    assert_eq!(
        indexes.get("node-0-bmv4").map(String::as_str),
        Some("10.50.0.77")
    );
}

/// A pool that served its claims itself and is then pointed at a CAPI pool (the migration's
/// switch in place) keeps every address, and drops its own ledger: from then on the target
/// pool's record is the one that counts, and a record left behind would go stale.
#[tokio::test]
async fn a_pool_switched_to_the_proxy_in_place_drops_its_own_ledger() {
    let env = Env::new("m3-proxy-switch").await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    let mut own = pool_spec(vec![range("10.60.0.10", "10.60.0.20")]);
    own.name_prefix = "test1-bmv4".into();
    metal3_pool(&env, "bmv4", own).await;
    create(&env.api(), &ipclaim_object(&env, "node-0-bmv4", "bmv4")).await;
    let served = env.allocated("node-0-bmv4").await;
    assert_eq!(served.spec.address, "10.60.0.10");
    assert!(env.ledger("IPPool", "bmv4").await.is_some());

    // The new pool, as `bitpool migrate` writes it: the claim's address pinned.
    migrated_pool(&env, "10.60.0.10-10.60.0.20", "192.168.0.1", "10.60.0.10").await;
    env.api::<IPPool>()
        .patch(
            "bmv4",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"poolRef": {
                "apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "new-pool",
            }}})),
        )
        .await
        .expect("point the pool at the CAPI pool");
    let proxied = eventually("the claim served through the proxy", WAIT, || async {
        env.api::<IPAddress>().get_opt("node-0-bmv4").await.ok()?
    })
    .await;
    assert_eq!(proxied.spec.address, "10.60.0.10");
    eventually("the pool's own ledger deleted", WAIT, || async {
        env.ledger("IPPool", "bmv4").await.is_none().then_some(())
    })
    .await;
    let mirror = env.allocated("node-0-bmv4").await;
    assert_eq!(
        (mirror.name_any(), mirror.spec.address),
        (served.name_any(), served.spec.address),
        "the Metal3 IPAddress the claim had is its mirror now"
    );
}

/// `--controllers=capi-ipam,migration-proxy` (Metal3's own IPAM still serving the pools with
/// ranges): bitpool serves the proxied pool and leaves the pool with ranges, its claim and its
/// status to whoever serves Metal3 pools.
#[tokio::test]
async fn the_migration_proxy_group_alone_serves_proxied_pools_only() {
    let env = Env::new("m3-proxy-only").await;
    let _bitpool = Bitpool::start(env.name(), &["--controllers=capi-ipam,migration-proxy"]);
    support::build::capi_pool(
        &env,
        "new-pool",
        support::build::capi_spec(&["10.51.0.0/24"], 24),
    )
    .await;
    let mut proxied = pool_spec(vec![]);
    proxied.name_prefix = "test1-proxied".into();
    proxied.pool_ref = Some(IPPoolReference {
        api_group: "ipam.cluster.x-k8s.io".into(),
        kind: "InClusterIPPool".into(),
        name: "new-pool".into(),
    });
    metal3_pool(&env, "proxied", proxied).await;
    metal3_pool(
        &env,
        "ranges",
        pool_spec(vec![range("192.168.0.10", "192.168.0.20")]),
    )
    .await;
    create(&env.api(), &ipclaim_object(&env, "on-ranges", "ranges")).await;
    create(&env.api(), &ipclaim_object(&env, "on-proxied", "proxied")).await;

    assert!(
        env.allocated("on-proxied")
            .await
            .spec
            .address
            .starts_with("10.51.0.")
    );
    // Several round trips later than the pool with ranges and its claim were reported to the
    // same controller: they are still as they were written.
    let claim = env
        .api::<IPClaim>()
        .get("on-ranges")
        .await
        .expect("the claim");
    assert_eq!(claim.status, None, "{claim:?}");
    assert!(claim.finalizers().is_empty(), "{claim:?}");
    let pool = env.api::<IPPool>().get("ranges").await.expect("the pool");
    assert!(
        pool.status.is_none() && pool.finalizers().is_empty(),
        "{pool:?}"
    );
    let addresses = env
        .api::<Metal3IPAddress>()
        .list(&Default::default())
        .await
        .expect("list");
    assert_eq!(addresses.items.len(), 1, "only the proxied claim's address");
}

#[tokio::test]
async fn a_pool_naming_its_cluster_is_labelled_owned_and_paused_with_it() {
    let env = Env::new("m3-cluster").await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    let clusters: Api<bitpool::api::capi::Cluster> = env.api();
    let cluster = bitpool::api::capi::Cluster {
        metadata: ObjectMeta {
            name: Some("test1".into()),
            namespace: Some(env.name().into()),
            ..Default::default()
        },
        spec: bitpool::api::capi::ClusterSpec {
            paused: Some(true),
            ..Default::default()
        },
    };
    let cluster = clusters
        .create(&PostParams::default(), &cluster)
        .await
        .expect("cluster");
    let mut spec = pool_spec(vec![range("192.168.0.10", "192.168.0.20")]);
    spec.cluster_name = Some("test1".into());
    metal3_pool(&env, "clustered", spec).await;
    metal3_pool(
        &env,
        "control",
        pool_spec(vec![range("192.168.5.10", "192.168.5.20")]),
    )
    .await;
    create(&env.api(), &ipclaim_object(&env, "held", "clustered")).await;
    create(&env.api(), &ipclaim_object(&env, "control", "control")).await;
    env.allocated("control").await;
    let held = env.api::<IPClaim>().get("held").await.expect("claim");
    assert!(
        held.status.is_none() && held.finalizers().is_empty(),
        "served while its Cluster is paused"
    );

    clusters
        .patch(
            "test1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"paused": false}})),
        )
        .await
        .expect("unpause");
    assert_eq!(env.allocated("held").await.spec.address, "192.168.0.10");
    let pool = env.api::<IPPool>().get("clustered").await.expect("pool");
    assert_eq!(
        pool.labels()
            .get("cluster.x-k8s.io/cluster-name")
            .map(String::as_str),
        Some("test1")
    );
    assert_eq!(
        pool.labels()
            .get("cluster.x-k8s.io/provider")
            .map(String::as_str),
        Some("ipam-metal3")
    );
    let owner = pool
        .owner_references()
        .iter()
        .find(|o| o.kind == "Cluster")
        .expect("owned by the Cluster");
    assert_eq!(Some(&owner.uid), cluster.metadata.uid.as_ref());
}

/// A Metal3 IPPool deleted while claims of both kinds name it — pending on an invalid pool or a
/// migration proxy, or served by a pool that `clusterctl move` lets go with its addresses —
/// leaves nothing stuck:
/// each claim deleted afterwards goes, with its address objects (a Metal3 pool names them after
/// the address, not the claim), whatever the claim kind's finalizer.
#[tokio::test]
async fn claims_of_a_deleted_metal3_pool_go_when_deleted() {
    let env = Env::new("m3-orphans").await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    metal3_pool(
        &env,
        "invalid",
        pool_spec(vec![range("192.168.9.20", "192.168.9.10")]),
    )
    .await;
    metal3_pool(
        &env,
        "served",
        pool_spec(vec![range("192.168.8.10", "192.168.8.20")]),
    )
    .await;
    // A migration proxy whose CAPI pool does not exist (yet): its IPClaims wait.
    let mut proxy = pool_spec(vec![]);
    proxy.pool_ref = Some(IPPoolReference {
        api_group: "ipam.cluster.x-k8s.io".into(),
        kind: "InClusterIPPool".into(),
        name: "absent".into(),
    });
    metal3_pool(&env, "proxy", proxy).await;
    create(&env.api(), &ipclaim_object(&env, "proxied", "proxy")).await;
    let mut ipclaims = Vec::new();
    let mut capi_claims = Vec::new();
    for pool in ["invalid", "served"] {
        for i in 0..3 {
            let name = format!("{pool}-{i}");
            create(&env.api(), &ipclaim_object(&env, &name, pool)).await;
            create_claim(
                &env,
                claim_object(&env, &format!("capi-{name}"), "IPPool", pool),
            )
            .await;
            ipclaims.push(name.clone());
            capi_claims.push(format!("capi-{name}"));
        }
    }
    for i in 0..3 {
        env.allocated(&format!("served-{i}")).await;
        env.capi_allocated(&format!("capi-served-{i}")).await;
    }
    let finalized = |names: Vec<String>, api: Api<IPClaim>, capi: Api<IPAddressClaim>| async move {
        for name in &names {
            let ipclaim = api.get_opt(name).await.ok()??;
            let capi_claim = capi.get_opt(&format!("capi-{name}")).await.ok()??;
            if ipclaim.finalizers().is_empty() || capi_claim.finalizers().is_empty() {
                return None;
            }
        }
        Some(())
    };
    eventually("every claim protected by the pools", WAIT, || {
        finalized(ipclaims.clone(), env.api(), env.api())
    })
    .await;
    eventually("the proxied claim protected", WAIT, || async {
        let claim = env.api::<IPClaim>().get_opt("proxied").await.ok()??;
        (!claim.finalizers().is_empty()).then_some(())
    })
    .await;
    ipclaims.push("proxied".into());

    let pools = env.api::<IPPool>();
    pools
        .patch(
            "served",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                bitpool::api::capi_pools::SKIP_DELETE_CHECK_ANNOTATION: "true"
            }}})),
        )
        .await
        .expect("annotate the pool as clusterctl move does");
    for pool in ["invalid", "served", "proxy"] {
        pools
            .delete(pool, &DeleteParams::default())
            .await
            .expect("delete pool");
    }
    eventually("both pools gone", WAIT, || async {
        let left = pools.list(&Default::default()).await.ok()?.items;
        left.is_empty().then_some(())
    })
    .await;
    for name in &ipclaims {
        env.api::<IPClaim>()
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete IPClaim");
    }
    for name in &capi_claims {
        env.api::<IPAddressClaim>()
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete IPAddressClaim");
    }
    eventually("every claim and address object gone", WAIT, || async {
        let empty = listed(&env, |_: &IPClaim| true).await?.is_empty()
            && listed(&env, |_: &IPAddressClaim| true).await?.is_empty()
            && listed(&env, |_: &Metal3IPAddress| true).await?.is_empty()
            && listed(&env, |_: &IPAddress| true).await?.is_empty();
        empty.then_some(())
    })
    .await;
}

/// A claim whose last change came while its pool was there hears nothing of its own when the
/// pool goes: deleting claims of a paused pool, left behind when an operator strips the pool's
/// finalizer, are released anyway, and a live CAPI claim learns that its pool is missing.
#[tokio::test]
async fn claims_left_behind_by_a_removed_pool_are_released_without_a_change_of_their_own() {
    let env = Env::new("m3-left").await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    let pools = env.api::<IPPool>();
    metal3_pool(
        &env,
        "paused",
        pool_spec(vec![range("192.168.7.10", "192.168.7.20")]),
    )
    .await;
    eventually("the pool protected", WAIT, || async {
        let pool = pools.get_opt("paused").await.ok()??;
        (!pool.finalizers().is_empty()).then_some(())
    })
    .await;
    pools
        .patch(
            "paused",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"cluster.x-k8s.io/paused": ""}}})),
        )
        .await
        .expect("pause the pool");
    create(&env.api(), &ipclaim_object(&env, "left", "paused")).await;
    create_claim(&env, claim_object(&env, "capi-left", "IPPool", "paused")).await;
    create_claim(&env, claim_object(&env, "capi-live", "IPPool", "paused")).await;
    eventually("the claims protected by the paused pool", WAIT, || async {
        let ipclaim = env.api::<IPClaim>().get_opt("left").await.ok()??;
        let capi = env.api::<IPAddressClaim>();
        let (a, b) = (
            capi.get_opt("capi-left").await.ok()??,
            capi.get_opt("capi-live").await.ok()??,
        );
        [ipclaim.finalizers(), a.finalizers(), b.finalizers()]
            .iter()
            .all(|f| !f.is_empty())
            .then_some(())
    })
    .await;
    live_told(&env, "its pool is paused", "is paused").await;
    env.api::<IPClaim>()
        .delete("left", &DeleteParams::default())
        .await
        .expect("delete IPClaim");
    env.api::<IPAddressClaim>()
        .delete("capi-left", &DeleteParams::default())
        .await
        .expect("delete IPAddressClaim");
    pools
        .delete("paused", &DeleteParams::default())
        .await
        .expect("delete pool");
    // The deletions are seen while the pool is cached: they wait, as a paused pool's do.
    eventually("the paused pool deleting", WAIT, || async {
        let pool = pools.get_opt("paused").await.ok()??;
        pool.metadata.deletion_timestamp.map(|_| ())
    })
    .await;
    let waiting = env
        .api::<IPClaim>()
        .get("left")
        .await
        .expect("the IPClaim waits");
    assert!(waiting.metadata.deletion_timestamp.is_some());
    pools
        .patch(
            "paused",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("strip the pool's finalizer");
    eventually("the deleting claims released", WAIT, || async {
        let gone = env.api::<IPClaim>().get_opt("left").await.ok()?.is_none()
            && env
                .api::<IPAddressClaim>()
                .get_opt("capi-left")
                .await
                .ok()?
                .is_none();
        gone.then_some(())
    })
    .await;
    live_told(&env, "its pool is missing", "IPPool paused not found").await;
}

/// Waits until the live claim's Ready condition is False (PoolNotReady) with a message that
/// contains `words`.
async fn live_told(env: &Env, what: &str, words: &str) {
    eventually(&format!("the live claim told {what}"), WAIT, || async {
        let claim = env
            .api::<IPAddressClaim>()
            .get_opt("capi-live")
            .await
            .ok()??;
        let ready = claim
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Ready")?;
        let told = ready.status == "False"
            && ready.reason == "PoolNotReady"
            && ready.message.contains(words);
        told.then_some(())
    })
    .await;
}

/// A claim of a Metal3 pool never keeps two address objects (the pool names them after the
/// address, so nothing but bitpool stops a second): one left by a crash between a create and
/// the claim's status, or by a release of old, goes, and its address is free again; the claim
/// keeps the address its status names.
#[tokio::test]
async fn a_claims_second_address_object_goes_and_its_address_is_freed() {
    let env = Env::new("m3-second").await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    metal3_pool(
        &env,
        "pool",
        pool_spec(vec![range("192.168.7.10", "192.168.7.12")]),
    )
    .await;
    create(&env.api(), &ipclaim_object(&env, "a", "pool")).await;
    let first = env.allocated("a").await;
    assert_eq!(first.spec.address, "192.168.7.10");
    let mut second = first.clone();
    second.metadata = ObjectMeta {
        name: Some("test1-prov-192-168-7-11".into()),
        resource_version: None,
        uid: None,
        creation_timestamp: None,
        managed_fields: None,
        ..first.metadata.clone()
    };
    second.spec.address = "192.168.7.11".into();
    env.api::<Metal3IPAddress>()
        .create(&PostParams::default(), &second)
        .await
        .expect("create a second address object for claim a");
    eventually("the second object gone", WAIT, || async {
        let found = env
            .api::<Metal3IPAddress>()
            .get_opt("test1-prov-192-168-7-11")
            .await
            .ok()?;
        found.is_none().then_some(())
    })
    .await;
    create(&env.api(), &ipclaim_object(&env, "b", "pool")).await;
    assert_eq!(env.allocated("b").await.spec.address, "192.168.7.11");
    assert_eq!(env.allocated("a").await.name_any(), first.name_any());
}
