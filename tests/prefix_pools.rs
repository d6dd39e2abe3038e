//! Prefix pools (InClusterPrefixPool, GlobalInClusterPrefixPool) against a real API server,
//! driven by real `bitpool run` processes: the IPAddress a claim gets, exhaustion and recovery,
//! requested and preallocated sub-prefixes, both families, an invalid spec, a pool's deletion,
//! and two processes racing while one is killed.

mod support;

use std::collections::BTreeMap;

use bitpool::api::capi::{IPAddress, IPAddressClaim};
use bitpool::api::capi_pools::{
    GlobalInClusterPrefixPool, InClusterIPPoolStatus, InClusterPrefixPool,
};
use bitpool::api::metal3_ipam::REQUESTED_ADDRESS_ANNOTATION;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use support::build::*;
use support::check::*;
use support::process::kill_when_created;
use support::wait::*;
use support::{Bitpool, Env, eventually};

const KIND: &str = "InClusterPrefixPool";
const GLOBAL_KIND: &str = "GlobalInClusterPrefixPool";

/// A claim asking for `requested` through the `ipAddress` annotation.
fn requesting(mut claim: IPAddressClaim, requested: &str) -> IPAddressClaim {
    claim
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(REQUESTED_ADDRESS_ANNOTATION.into(), requested.into());
    claim
}

async fn served(env: &Env, name: &str) -> IPAddress {
    wait_claim(env, name, "Ready", |c| c.status == "True").await;
    env.api::<IPAddress>()
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("IPAddress {name}: {e}"))
}

/// `address/prefix` of the IPAddress `name`, once its claim is Ready.
async fn sub_prefix_of(env: &Env, name: &str) -> String {
    let address = served(env, name).await;
    format!("{}/{}", address.spec.address, address.spec.prefix)
}

async fn refused(env: &Env, name: &str, reason: &str) -> Condition {
    wait_claim(env, name, reason, |c| {
        c.status == "False" && c.reason == reason
    })
    .await
}

/// (total, used, free, outOfRange) of a status.
fn counts(status: Option<InClusterIPPoolStatus>) -> Option<(i64, i64, i64, i64)> {
    let c = status?.ip_addresses?;
    Some((c.total, c.used, c.free, c.out_of_range))
}

async fn wait_counts(env: &Env, name: &str, expected: (i64, i64, i64, i64)) {
    let pools: Api<InClusterPrefixPool> = env.api();
    eventually(&format!("{name} counts {expected:?}"), WAIT, || async {
        let pool = pools.get(name).await.ok()?;
        (counts(pool.status) == Some(expected)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn an_ipv6_claim_gets_a_sub_prefix_waits_when_the_pool_is_exhausted_or_paused() {
    let env = Env::new("prefix-v6").await;
    let bitpool = Bitpool::start(env.name(), &[]);
    let mut spec = prefix_spec(&["fd00:10::/62"], 64);
    spec.gateway = Some("fd00:10::1".into());
    spec.excluded_prefixes = vec!["fd00:10:0:1::5".into()];
    prefix_pool(&env, "v6", spec).await;

    let claims: Api<IPAddressClaim> = env.api();
    for name in ["a", "b", "c"] {
        create(&claims, &claim_object(&env, name, KIND, "v6")).await;
        served(&env, name).await;
    }
    // What upstream writes: the network address, the allocation length, the gateway as given.
    let a = served(&env, "a").await;
    assert_eq!(
        (
            a.spec.address.as_str(),
            a.spec.prefix,
            a.spec.gateway.as_deref(),
            a.spec.pool_ref.kind.as_str()
        ),
        ("fd00:10::", 64, Some("fd00:10::1"), KIND)
    );
    // Lowest first, and the /64 touched by an excluded address is skipped.
    assert_eq!(sub_prefix_of(&env, "b").await, "fd00:10:0:2::/64");
    assert_eq!(sub_prefix_of(&env, "c").await, "fd00:10:0:3::/64");
    wait_counts(&env, "v6", (3, 3, 0, 0)).await;

    create(&claims, &claim_object(&env, "d", KIND, "v6")).await;
    refused(&env, "d", "PoolExhausted").await;
    // A request is refused in the pool's terms: the sub-prefix, not its internal number.
    let excluded = requesting(claim_object(&env, "e", KIND, "v6"), "fd00:10:0:1::/64");
    create(&claims, &excluded).await;
    let condition = refused(&env, "e", "AllocationFailed").await;
    assert!(
        condition.message.contains("fd00:10:0:1::")
            && condition.message.contains("not in the pool"),
        "{}",
        condition.message
    );
    claims
        .delete("e", &DeleteParams::default())
        .await
        .expect("delete e");

    // Recovery: the released /64 goes to the waiting claim.
    claims
        .delete("b", &DeleteParams::default())
        .await
        .expect("delete b");
    assert_eq!(sub_prefix_of(&env, "d").await, "fd00:10:0:2::/64");
    wait_counts(&env, "v6", (3, 3, 0, 0)).await;
    assert_quiet_at_rest(&env, 3).await;

    // A paused pool releases nothing until resumed (a pool beside it serves on).
    let pools: Api<InClusterPrefixPool> = env.api();
    let pause = |value: serde_json::Value| {
        Patch::Merge(json!({"metadata": {"annotations": {"cluster.x-k8s.io/paused": value}}}))
    };
    pools
        .patch("v6", &PatchParams::default(), &pause(json!("")))
        .await
        .expect("pause the pool");
    prefix_pool(&env, "spare", prefix_spec(&["fd00:11::/63"], 64)).await;
    claims
        .delete("c", &DeleteParams::default())
        .await
        .expect("delete c");
    create(&claims, &claim_object(&env, "control", KIND, "spare")).await;
    served(&env, "control").await;
    let held = claims
        .get("c")
        .await
        .expect("c is held while its pool is paused");
    assert!(held.metadata.deletion_timestamp.is_some());
    pools
        .patch(
            "v6",
            &PatchParams::default(),
            &pause(serde_json::Value::Null),
        )
        .await
        .expect("resume the pool");
    eventually("c released once its pool resumed", WAIT, || async {
        matches!(claims.get_opt("c").await, Ok(None)).then_some(())
    })
    .await;
    wait_counts(&env, "v6", (3, 2, 1, 0)).await;
    assert_warnings_name_objects(&bitpool);
}

#[tokio::test]
async fn a_global_ipv4_pool_serves_requests_and_preallocations_and_keeps_them_until_deleted() {
    let env = Env::new("prefix-v4").await;
    let _bitpool = Bitpool::start(env.name(), &[]);
    let mut spec = prefix_spec(&["10.20.0.0/24"], 26);
    spec.gateway = Some("10.20.0.1".into());
    // A global pool's preallocation names the claim's namespace.
    spec.pre_allocations =
        BTreeMap::from([(format!("{}/pinned", env.name()), "10.20.0.192/26".into())]);
    let pool = global_prefix_pool(&env, "v4", spec).await;

    let claims: Api<IPAddressClaim> = env.api();
    create(&claims, &claim_object(&env, "pinned", GLOBAL_KIND, &pool)).await;
    let asked = requesting(
        claim_object(&env, "asked", GLOBAL_KIND, &pool),
        "10.20.0.128",
    );
    create(&claims, &asked).await;
    create(&claims, &claim_object(&env, "plain", GLOBAL_KIND, &pool)).await;
    let unaligned = requesting(
        claim_object(&env, "unaligned", GLOBAL_KIND, &pool),
        "10.20.0.129",
    );
    create(&claims, &unaligned).await;

    assert_eq!(sub_prefix_of(&env, "pinned").await, "10.20.0.192/26");
    assert_eq!(sub_prefix_of(&env, "asked").await, "10.20.0.128/26");
    assert_eq!(sub_prefix_of(&env, "plain").await, "10.20.0.0/26");
    let condition = refused(&env, "unaligned", "AllocationFailed").await;
    assert!(
        condition.message.contains("not a /26 sub-prefix"),
        "{}",
        condition.message
    );
    let pools: Api<GlobalInClusterPrefixPool> = Api::all(env.client.clone());
    eventually("the global pool's counts", WAIT, || async {
        let pool = pools.get(&pool).await.ok()?;
        (counts(pool.status) == Some((4, 3, 1, 0))).then_some(())
    })
    .await;

    // An invalid spec (without the webhook) hands out nothing and keeps what is allocated.
    let patch = Patch::Merge(json!({"spec": {"prefixes": ["10.20.0.5/24"]}}));
    pools
        .patch(&pool, &PatchParams::default(), &patch)
        .await
        .expect("patch the pool");
    let ready = eventually("the pool reports its invalid spec", WAIT, || async {
        let pool = pools.get(&pool).await.ok()?;
        let status = pool.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Ready" && c.status == "False" && c.reason == "InvalidSpec")
    })
    .await;
    assert!(
        ready.message.contains("not network aligned") && ready.message.contains("3 allocated"),
        "{}",
        ready.message
    );
    create(&claims, &claim_object(&env, "late", GLOBAL_KIND, &pool)).await;
    let late = refused(&env, "late", "PoolNotReady").await;
    assert!(
        late.message.contains("not network aligned"),
        "{}",
        late.message
    );
    for name in ["pinned", "asked", "plain"] {
        served(&env, name).await;
    }

    // Deleting the pool waits for its sub-prefixes, then takes its ledger with it.
    pools
        .delete(&pool, &DeleteParams::default())
        .await
        .expect("delete the pool");
    let waiting = eventually("the pool waits for its sub-prefixes", WAIT, || async {
        let pool = pools.get(&pool).await.ok()?;
        pool.status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Ready" && c.reason == "Deleting")
    })
    .await;
    assert!(
        waiting.message.contains("waiting for 3 address(es)"),
        "{}",
        waiting.message
    );
    delete_all_claims(&claims).await;
    let ledgers: Api<k8s_openapi::api::core::v1::ConfigMap> = env.api();
    let ledger = env.ledger_name(GLOBAL_KIND, &pool);
    eventually("the pool and its ledger are gone", WAIT, || async {
        let pool_gone = matches!(pools.get_opt(&pool).await, Ok(None));
        let ledger_gone = matches!(ledgers.get_opt(&ledger).await, Ok(None));
        (pool_gone && ledger_gone).then_some(())
    })
    .await;
}

/// Each of `pools` (name, sub-prefix length) settled with half of `count` claims (support's
/// check), every sub-prefix of the pool's length.
async fn assert_pools_consistent(env: &Env, pools: &[(&str, i32)], count: usize) {
    for (pool, _) in pools {
        assert_prefixes_consistent(env, pool, count / pools.len(), AFTER_FENCE).await;
    }
    for address in env
        .api::<IPAddress>()
        .list(&Default::default())
        .await
        .expect("list")
        .items
    {
        let length = pools
            .iter()
            .find(|(pool, _)| *pool == address.spec.pool_ref.name)
            .map(|(_, length)| *length);
        assert_eq!(Some(address.spec.prefix), length, "{}", address.name_any());
    }
}

/// Claims `claim-NNN` for `range`, alternating between the pools `left` and `right`.
fn alternating(env: &Env, range: std::ops::Range<usize>) -> impl Iterator<Item = IPAddressClaim> {
    range.map(|i| {
        claim_object(
            env,
            &format!("claim-{i:03}"),
            KIND,
            ["left", "right"][i % 2],
        )
    })
}

#[tokio::test]
async fn two_processes_racing_and_a_kill_never_hand_out_a_sub_prefix_twice() {
    let env = Env::new("prefix-race").await;
    prefix_pool(&env, "left", prefix_spec(&["fd00:20::/56"], 64)).await;
    prefix_pool(&env, "right", prefix_spec(&["10.30.0.0/16"], 24)).await;
    let pools = [("left", 64), ("right", 24)];
    // Two processes race over a burst, both creating the pools' first ledgers.
    let mut victim = Bitpool::start(env.name(), &[]);
    let survivor = Bitpool::start(env.name(), &[]);
    create_claims(&env, alternating(&env, 0..200)).await;
    assert_pools_consistent(&env, &pools, 200).await;
    let log = std::fs::read_to_string(&survivor.log).unwrap_or_default();
    assert!(
        !log.contains("rebuilding the pool's ledger"),
        "a new pool's ledger was taken for a lost one: {:?}",
        survivor.log
    );

    // Then one is SIGKILLed at a random point of a second burst, seen through a watch.
    let threshold = 200 + rand::random_range(10..60);
    // The kill lands while at least 40 claims of the burst wait (the survivor serves them on).
    let kill_mid_burst = kill_when_created(&env, &mut victim, threshold);
    futures::join!(
        create_claims(&env, alternating(&env, 200..300)),
        kill_mid_burst
    );
    assert_pools_consistent(&env, &pools, 300).await;
}
