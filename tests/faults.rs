//! Faults found when bitpool was run as an operator would run it, each reproduced against the
//! real control plane: writes at rest, namespace deletion, restarts, a lost or damaged ledger,
//! pools whose family changes, backlogs, SIGKILL loops, long names, malformed pools, global
//! preallocations, shutdown under load. Every test ends by checking that no address is held
//! twice, that the ledger lists exactly the live address objects, and that nothing is stuck.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bitpool::api::capi::{IPAddress, IPAddressClaim};
use bitpool::api::capi_pools::{GlobalInClusterIPPool, InClusterIPPool, InClusterPrefixPool};
use bitpool::api::labels::PAUSED;
use bitpool::api::metal3_ipam::{IPClaim, IPPool, Metal3IPAddress};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use support::build::*;
use support::check::*;
use support::wait::*;
use support::{Bitpool, Env, eventually};

/// Pools of every kind with claims of both kinds, a claim on a missing pool, one on an invalid
/// pool and one on an exhausted pool: once settled, nothing bitpool writes changes.
#[tokio::test]
async fn nothing_is_written_at_rest() {
    let env = Env::new("rest").await;
    let bitpool = Bitpool::start(env.name(), &[]);
    capi_pool(&env, "capi", capi_spec(&["10.30.0.0/24"], 24)).await;
    let global = global_pool(&env, "global", capi_spec(&["10.31.0.0/24"], 24)).await;
    metal3_pool(&env, "m3", metal3_spec("10.32.0.10", "10.32.0.20", 24)).await;
    capi_pool(&env, "bad", capi_spec(&["10.33.0.0/24", "10.34.0.1"], 24)).await;
    capi_pool(&env, "tiny", capi_spec(&["10.35.0.1"], 24)).await;
    claim(&env, "on-capi", "InClusterIPPool", "capi").await;
    claim(&env, "on-global", "GlobalInClusterIPPool", &global).await;
    claim(&env, "capi-on-m3", "IPPool", "m3").await;
    ipclaim(&env, "ipclaim-on-m3", "m3").await;
    claim(&env, "on-missing", "InClusterIPPool", "nowhere").await;
    claim(&env, "on-bad", "InClusterIPPool", "bad").await;
    claim(&env, "tiny-1", "InClusterIPPool", "tiny").await;
    wait_claim(&env, "tiny-1", "served", |c| c.status == "True").await;
    claim(&env, "tiny-2", "InClusterIPPool", "tiny").await;

    for name in ["on-capi", "on-global", "capi-on-m3"] {
        wait_claim(&env, name, "served", |c| c.status == "True").await;
    }
    wait_claim(&env, "on-missing", "waits for its pool", |c| {
        c.reason == "PoolNotReady" && c.message.contains("not found")
    })
    .await;
    wait_claim(&env, "on-bad", "refused by an invalid pool", |c| {
        c.reason == "PoolNotReady" && c.message.contains("outside the pool's subnet")
    })
    .await;
    wait_claim(&env, "tiny-2", "exhausted", |c| c.reason == "PoolExhausted").await;
    wait_ipclaim(&env, "ipclaim-on-m3").await;

    // Settled: a few seconds for the last status writes, then 30 s of nothing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = versions(&env).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let changed = changed_since(&env, &before).await;
        assert!(changed.is_empty(), "written at rest: {changed:?}");
    }
    assert!(
        before.len() >= 15,
        "the snapshot covers every object: {before:?}"
    );
    assert_warnings_name_objects(&bitpool);
}

/// Deleting a namespace that holds pools, claims of both kinds and their addresses completes,
/// whatever order the namespace controller deletes them in — also when it is the ledger
/// namespace, with a global pool's ledger in it.
#[tokio::test]
async fn deleting_a_namespace_completes() {
    let env = Env::new("nsdelete").await;
    let bitpool = Bitpool::start(env.name(), &[]);
    capi_pool(&env, "capi", capi_spec(&["10.40.0.0/24"], 24)).await;
    metal3_pool(&env, "m3", metal3_spec("10.41.0.10", "10.41.0.50", 24)).await;
    let global = global_pool(&env, "global", capi_spec(&["10.42.0.0/24"], 24)).await;
    burst(&env, "capi", "InClusterIPPool", "capi", 20).await;
    burst(&env, "m3", "IPPool", "m3", 10).await;
    burst(&env, "global", "GlobalInClusterIPPool", &global, 10).await;
    for i in 0..10 {
        ipclaim(&env, &format!("ipclaim-{i}"), "m3").await;
    }
    assert_consistent(&env, "InClusterIPPool", "capi", 20, WAIT).await;
    assert_consistent(&env, "GlobalInClusterIPPool", &global, 10, WAIT).await;
    let metal3: Api<Metal3IPAddress> = env.api();
    eventually("the IPClaims' addresses", WAIT, || async {
        (metal3.list(&ListParams::default()).await.ok()?.items.len() == 10).then_some(())
    })
    .await;

    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    namespaces
        .delete(env.name(), &DeleteParams::default())
        .await
        .expect("delete the namespace");
    eventually(
        "the namespace to be gone",
        Duration::from_secs(180),
        || async { matches!(namespaces.get_opt(env.name()).await, Ok(None)).then_some(()) },
    )
    .await;
    // Nothing brings it back: the global pool has nothing left to record.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        matches!(namespaces.get_opt(env.name()).await, Ok(None)),
        "the ledger namespace was recreated although nothing needed it"
    );
    let pool = Api::<GlobalInClusterIPPool>::all(env.client.clone())
        .get(&global)
        .await
        .expect("the global pool stays");
    let used = pool.status.and_then(|s| s.ip_addresses).map(|c| c.used);
    assert_eq!(
        used,
        Some(0),
        "the global pool released its deleted claims' addresses"
    );
    assert_warnings_name_objects(&bitpool);
    let globals = Api::<GlobalInClusterIPPool>::all(env.client.clone());
    let _ = globals.delete(&global, &DeleteParams::default()).await;
    eventually("the global pool to be deleted", WAIT, || async {
        matches!(globals.get_opt(&global).await, Ok(None)).then_some(())
    })
    .await;
}

/// `bitpool run` fails at once with one line naming the API server it cannot reach.
#[tokio::test]
async fn an_unreachable_api_server_is_named_at_once() {
    let dir = support::root().join("target/test-logs");
    std::fs::create_dir_all(&dir).expect("log dir");
    let kubeconfig = dir.join("unreachable.kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\nusers:\n- name: u\n  user: {token: t}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n",
    )
    .expect("write kubeconfig");
    let started = std::time::Instant::now();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_bitpool"))
        .args(["run"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .await
        .expect("run bitpool");
    assert!(!output.status.success());
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "it failed at once"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains("cannot reach the Kubernetes API server at https://127.0.0.1:1")
            && last.contains("KUBECONFIG="),
        "{stderr}"
    );
    assert!(!stderr.contains("CRDs"), "{stderr}");
}

/// Waiting for CRDs names only those that are missing.
#[tokio::test]
async fn missing_crds_are_named_alone() {
    let client = support::client().await;
    let mut crds = bitpool::crds::served();
    support::install_crds(&client, &crds).await;
    let mut missing = crds[0].clone();
    missing.metadata.name = Some("absents.ipam.bitpool.dev".into());
    crds.push(missing);
    let required: Vec<_> = crds.iter().map(bitpool::crds::Required::of).collect();
    let error = bitpool::crds::wait_established(&client, &required, Duration::from_secs(2))
        .await
        .expect_err("one CRD is missing");
    let message = error.to_string();
    assert!(message.contains("absents.ipam.bitpool.dev"), "{message}");
    assert!(
        !message.contains("inclusterippools"),
        "only the missing one: {message}"
    );
}

/// An error that waits for a person (here: the ledger namespace is being deleted, so the API
/// server forbids the ledger) is retried with a growing delay, and the log names the pool.
#[tokio::test]
async fn errors_that_wait_for_a_person_back_off() {
    let env = Env::new("backoff").await;
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    let held = format!("{}-ledgers", env.name());
    create(
        &namespaces,
        &Namespace {
            metadata: ObjectMeta {
                name: Some(held.clone()),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .await;
    let holds: Api<ConfigMap> = Api::namespaced(env.client.clone(), &held);
    create(
        &holds,
        &ConfigMap {
            metadata: ObjectMeta {
                name: Some("hold".into()),
                finalizers: Some(vec!["test.bitpool.dev/hold".into()]),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .await;
    namespaces
        .delete(&held, &DeleteParams::default())
        .await
        .expect("delete the ledger namespace");
    let bitpool = Bitpool::start_with_ledger_namespace(env.name(), &held);
    capi_pool(&env, "pool", capi_spec(&["10.43.0.0/24"], 24)).await;
    claim(&env, "claim", "InClusterIPPool", "pool").await;
    let failures = || {
        std::fs::read_to_string(&bitpool.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                l.contains("reconcile failed")
                    && l.contains(&format!("InClusterIPPool {}/pool", env.name()))
            })
            .map(String::from)
            .collect::<Vec<_>>()
    };
    eventually("a first failure", WAIT, || async {
        (!failures().is_empty()).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(25)).await;
    let lines = failures();
    assert!(
        (2..=6).contains(&lines.len()),
        "a fixed 2 s retry would fail about 12 times in 25 s; backoff fails a few times: {lines:#?}"
    );
    assert!(
        lines.iter().all(|l| l.contains("error_kind=\"forbidden\"")),
        "{lines:#?}"
    );
    assert!(
        lines.iter().any(|l| l.contains("retry_in=Some(8s)")),
        "the delay doubles: {lines:#?}"
    );
    assert_warnings_name_objects(&bitpool);
    let _ = holds
        .patch(
            "hold",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
        )
        .await;
}

/// 7,000 claims created while bitpool is stopped are all served once it starts, and deleting
/// them all at once releases every address: no number of pending or deleted claims stops the
/// pool (a reservation per pending claim once outgrew the API server's object size limit).
#[tokio::test]
async fn a_backlog_and_a_mass_deletion_are_served() {
    let env = Env::new("backlog").await;
    const COUNT: usize = 7000;
    capi_pool(&env, "big", capi_spec(&["10.50.0.0/16"], 16)).await;
    burst(&env, "c", "InClusterIPPool", "big", COUNT).await;
    let bitpool = Bitpool::start(env.name(), &[]);
    assert_consistent(
        &env,
        "InClusterIPPool",
        "big",
        COUNT,
        Duration::from_secs(900),
    )
    .await;

    let claims: Api<IPAddressClaim> = env.api();
    delete_all_claims(&claims).await;
    let addresses: Api<IPAddress> = env.api();
    eventually("every claim released", Duration::from_secs(900), || async {
        let left = claims
            .list_metadata(&ListParams::default())
            .await
            .ok()?
            .items
            .len();
        let held = addresses
            .list_metadata(&ListParams::default())
            .await
            .ok()?
            .items
            .len();
        let ledger = env.ledger("InClusterIPPool", "big").await?;
        (left == 0 && held == 0 && ledger.is_empty() && ledger.pending.is_empty()).then_some(())
    })
    .await;
    assert_warnings_name_objects(&bitpool);
}

/// A pool whose last address was released and whose spec then changed from IPv4 to IPv6 hands
/// out no address twice (the ledger once kept its IPv4 family and took IPv6 addresses for
/// others), with two processes racing.
#[tokio::test]
async fn a_pool_that_changes_family_never_duplicates() {
    let env = Env::new("family").await;
    let first = Bitpool::start(env.name(), &[]);
    let second = Bitpool::start(env.name(), &[]);
    capi_pool(&env, "fam", capi_spec(&["10.60.0.0/24"], 24)).await;
    burst(&env, "v4", "InClusterIPPool", "fam", 50).await;
    assert_consistent(&env, "InClusterIPPool", "fam", 50, WAIT).await;
    let claims: Api<IPAddressClaim> = env.api();
    delete_all_claims(&claims).await;
    assert_consistent(&env, "InClusterIPPool", "fam", 0, WAIT).await;
    let pools: Api<InClusterIPPool> = env.api();
    pools
        .patch(
            "fam",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "addresses": ["fd00:60::/120"], "prefix": 120 } })),
        )
        .await
        .expect("make the pool IPv6");
    burst(&env, "v6", "InClusterIPPool", "fam", 200).await;
    assert_consistent(&env, "InClusterIPPool", "fam", 200, WAIT).await;
    let addresses: Api<IPAddress> = env.api();
    for address in addresses
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
    {
        assert!(
            address.spec.address.starts_with("fd00:60::"),
            "{:?}",
            address.spec
        );
    }
    assert_warnings_name_objects(&first);
    assert_warnings_name_objects(&second);
}

/// Restarting bitpool on a pool whose claims are all served changes nothing: no claim turns
/// failed or exhausted, nothing is reserved again, no object is written.
#[tokio::test]
async fn restarts_change_nothing_that_was_right() {
    let env = Env::new("restart").await;
    capi_pool(&env, "pool", capi_spec(&["10.61.0.0/24"], 24)).await;
    let mut bitpool = Bitpool::start(env.name(), &[]);
    burst(&env, "c", "InClusterIPPool", "pool", 200).await;
    assert_consistent(&env, "InClusterIPPool", "pool", 200, WAIT).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let settled = versions(&env).await;
    for round in 0..3 {
        bitpool.kill();
        bitpool = Bitpool::start(env.name(), &[]);
        // Long enough for the new process to list everything and reconcile the pool.
        eventually("the new process reconciled the pool", WAIT, || async {
            std::fs::read_to_string(&bitpool.log)
                .ok()?
                .contains("pool checked")
                .then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        let changed = changed_since(&env, &settled).await;
        assert!(changed.is_empty(), "restart {round} wrote {changed:?}");
        assert_warnings_name_objects(&bitpool);
    }
}

/// Replaces the data of `pool`'s ledger with what `edit` makes of it (a hand edit).
async fn edit_ledger(env: &Env, pool: &str, edit: impl Fn(&mut ConfigMap)) {
    let api: Api<ConfigMap> = env.api();
    let name = env.ledger_name("InClusterIPPool", pool);
    let mut ledger = api.get(&name).await.expect("the ledger exists");
    edit(&mut ledger);
    api.replace(&name, &PostParams::default(), &ledger)
        .await
        .expect("edit the ledger");
}

/// Waits until `pool`'s Ready condition has `reason`; its message.
async fn wait_pool_reason(env: &Env, pool: &str, reason: &str) -> String {
    let pools: Api<InClusterIPPool> = env.api();
    eventually(&format!("pool {pool} says {reason}"), WAIT, || async {
        let pool = pools.get(pool).await.ok()?;
        let ready = pool
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Ready")?;
        (ready.reason == reason).then_some(ready.message)
    })
    .await
}

/// Waits until `pool` says its ledger was rebuilt, for a reason containing `reason`.
async fn wait_rebuilt(env: &Env, pool: &str, reason: &str) {
    let message = wait_pool_reason(env, pool, "LedgerRebuilt").await;
    assert!(message.contains(reason), "{message}");
}

/// Losing or damaging a pool's ledger never yields a duplicate: deleted every 0.3 s during a
/// burst served by two processes, overwritten with garbage, emptied, or set back to an older
/// copy. Each pool says what happened and recovers on its own from the live address objects.
#[tokio::test]
async fn a_lost_or_damaged_ledger_never_yields_a_duplicate() {
    let env = Env::new("ledgerfaults").await;
    let first = Bitpool::start(env.name(), &[]);
    let second = Bitpool::start(env.name(), &[]);
    for (i, pool) in ["deleted", "garbage", "emptied", "stale"]
        .iter()
        .enumerate()
    {
        capi_pool(&env, pool, capi_spec(&[&format!("10.62.{i}.0/24")], 24)).await;
    }
    let deleted = async {
        let ledgers: Api<ConfigMap> = env.api();
        let name = env.ledger_name("InClusterIPPool", "deleted");
        let deleting = async {
            for _ in 0..30 {
                let _ = ledgers.delete(&name, &DeleteParams::default()).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        };
        futures::join!(
            burst(&env, "d", "InClusterIPPool", "deleted", 150),
            deleting
        );
        claim(&env, "d-last", "InClusterIPPool", "deleted").await;
        assert_consistent(&env, "InClusterIPPool", "deleted", 151, AFTER_FENCE).await;
    };
    let garbage = async {
        burst(&env, "g", "InClusterIPPool", "garbage", 20).await;
        assert_consistent(&env, "InClusterIPPool", "garbage", 20, WAIT).await;
        edit_ledger(&env, "garbage", |cm| {
            let bytes = k8s_openapi::ByteString(b"not a roaring bitmap".to_vec());
            cm.binary_data = Some(BTreeMap::from([("ipv4".to_string(), bytes)]));
        })
        .await;
        claim(&env, "g-more", "InClusterIPPool", "garbage").await;
        wait_rebuilt(&env, "garbage", "could not be trusted").await;
        assert_consistent(&env, "InClusterIPPool", "garbage", 21, AFTER_FENCE).await;
    };
    let emptied = async {
        burst(&env, "e", "InClusterIPPool", "emptied", 20).await;
        assert_consistent(&env, "InClusterIPPool", "emptied", 20, WAIT).await;
        edit_ledger(&env, "emptied", |cm| {
            cm.data = None;
            cm.binary_data = None;
        })
        .await;
        claim(&env, "e-more", "InClusterIPPool", "emptied").await;
        wait_rebuilt(&env, "emptied", "could not be trusted").await;
        assert_consistent(&env, "InClusterIPPool", "emptied", 21, AFTER_FENCE).await;
    };
    let stale = async {
        burst(&env, "s1", "InClusterIPPool", "stale", 20).await;
        assert_consistent(&env, "InClusterIPPool", "stale", 20, WAIT).await;
        // The copy restored below must be of a record in no fence: one restored from inside a
        // fence that has ended since is adopted from a fresh list without a new fence, by
        // design (its record was already being rebuilt).
        eventually(
            "the stale pool's record in no fence",
            AFTER_FENCE,
            || async {
                let ledger = env.ledger("InClusterIPPool", "stale").await?;
                ledger.rebuilt_at.is_none().then_some(())
            },
        )
        .await;
        let api: Api<ConfigMap> = env.api();
        let old = api
            .get(&env.ledger_name("InClusterIPPool", "stale"))
            .await
            .expect("ledger");
        burst(&env, "s2", "InClusterIPPool", "stale", 20).await;
        assert_consistent(&env, "InClusterIPPool", "stale", 40, WAIT).await;
        edit_ledger(&env, "stale", |cm| {
            cm.data = old.data.clone();
            cm.binary_data = old.binary_data.clone();
        })
        .await;
        claim(&env, "s-more", "InClusterIPPool", "stale").await;
        wait_rebuilt(&env, "stale", "did not list").await;
        assert_consistent(&env, "InClusterIPPool", "stale", 41, AFTER_FENCE).await;
    };
    futures::join!(deleted, garbage, emptied, stale);
    assert_warnings_name_objects(&first);
    assert_warnings_name_objects(&second);
}

/// Starts a third process `rounds` times, SIGKILLing each 2 s after its start (the kills'
/// cadence, not a wait for anything).
async fn sigkill_loop(env: &Env, rounds: usize) {
    for _ in 0..rounds {
        let mut victim = Bitpool::start(env.name(), &[]);
        tokio::time::sleep(Duration::from_secs(2)).await;
        victim.kill();
    }
}

/// `count` claims named `<prefix>-NNNN` on one pool, then `deletions` of them deleted at random,
/// one every 0.1 s.
async fn churn(env: &Env, prefix: &str, kind: &str, pool: &str, count: usize, deletions: usize) {
    burst(env, prefix, kind, pool, count).await;
    let claims: Api<IPAddressClaim> = env.api();
    let mut deleted = BTreeSet::new();
    while deleted.len() < deletions {
        let i = rand::random_range(0..count);
        if deleted.insert(i) {
            let name = format!("{prefix}-{i:04}");
            claims
                .delete(&name, &DeleteParams::default())
                .await
                .unwrap_or_else(|e| panic!("delete claim {name}: {e}"));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Two processes serve an address pool and a prefix pool while a third is SIGKILLed every 2 s
/// and claims are created and deleted at random: in the end every remaining claim holds one
/// address of its own, and no address object outlives its claim.
#[tokio::test]
async fn a_sigkill_loop_with_deletions_leaves_no_orphan() {
    let env = Env::new("killloop").await;
    capi_pool(&env, "pool", capi_spec(&["10.63.0.0/24"], 24)).await;
    prefix_pool(&env, "pp", prefix_spec(&["fd00:63::/56"], 64)).await;
    // A killed process loses no record (each ledger write is whole or not at all, and what it
    // reserved the others complete): nothing here may fence either pool.
    let fenced = watch_for_fence::<InClusterIPPool>(env.api(), "pool");
    let prefix_fenced = watch_for_fence::<InClusterPrefixPool>(env.api(), "pp");
    let first = Bitpool::start(env.name(), &[]);
    let second = Bitpool::start(env.name(), &[]);
    futures::join!(
        sigkill_loop(&env, 10),
        churn(&env, "c", "InClusterIPPool", "pool", 200, 80),
        churn(&env, "p", "InClusterPrefixPool", "pp", 100, 40),
    );
    assert_consistent(&env, "InClusterIPPool", "pool", 120, WAIT).await;
    assert_prefixes_consistent(&env, "pp", 60, WAIT).await;
    for (pool, fence) in [
        ("InClusterIPPool", fenced),
        ("InClusterPrefixPool", prefix_fenced),
    ] {
        fence.abort();
        assert!(
            !matches!(fence.await, Ok(true)),
            "a SIGKILL loop fenced the {pool}"
        );
    }
    assert_warnings_name_objects(&first);
    assert_warnings_name_objects(&second);
}

/// Pools whose names are as long as Kubernetes allows are served and can be deleted.
#[tokio::test]
async fn pools_with_long_names_are_served_and_deleted() {
    let env = Env::new("longnames").await;
    let bitpool = Bitpool::start(env.name(), &[]);
    let capi48 = "p".repeat(48);
    let capi253 = format!("{}.{}", "a".repeat(63), "b".repeat(189));
    let metal57 = "m".repeat(57);
    capi_pool(&env, &capi48, capi_spec(&["10.64.0.0/24"], 24)).await;
    capi_pool(&env, &capi253, capi_spec(&["10.64.1.0/24"], 24)).await;
    metal3_pool(&env, &metal57, metal3_spec("10.64.2.10", "10.64.2.20", 24)).await;
    // Global pool names carry the namespace (19 characters) in front: 42 in all.
    let global = global_pool(
        &env,
        &"g".repeat(42 - env.name().len() - 1),
        capi_spec(&["10.64.3.0/24"], 24),
    )
    .await;
    assert_eq!(global.len(), 42);
    claim(&env, "on-48", "InClusterIPPool", &capi48).await;
    claim(&env, "on-253", "InClusterIPPool", &capi253).await;
    claim(&env, "on-57", "IPPool", &metal57).await;
    claim(&env, "on-global", "GlobalInClusterIPPool", &global).await;
    for name in ["on-48", "on-253", "on-57", "on-global"] {
        wait_claim(&env, name, "served", |c| c.status == "True").await;
    }
    let claims: Api<IPAddressClaim> = env.api();
    delete_all_claims(&claims).await;
    let capi: Api<InClusterIPPool> = env.api();
    let metal3: Api<IPPool> = env.api();
    let globals: Api<GlobalInClusterIPPool> = Api::all(env.client.clone());
    for name in [&capi48, &capi253] {
        capi.delete(name, &DeleteParams::default())
            .await
            .expect("delete");
    }
    metal3
        .delete(&metal57, &DeleteParams::default())
        .await
        .expect("delete");
    globals
        .delete(&global, &DeleteParams::default())
        .await
        .expect("delete");
    eventually("every pool to be deleted", WAIT, || async {
        let gone = matches!(capi.get_opt(&capi48).await, Ok(None))
            && matches!(capi.get_opt(&capi253).await, Ok(None))
            && matches!(metal3.get_opt(&metal57).await, Ok(None))
            && matches!(globals.get_opt(&global).await, Ok(None));
        gone.then_some(())
    })
    .await;
    assert_warnings_name_objects(&bitpool);
}

/// A pool whose addresses lie outside the subnet its lowest address and prefix define is
/// reported invalid and allocates nothing (a gateway outside it is valid, as upstream has it).
#[tokio::test]
async fn malformed_pools_are_reported_and_serve_nothing() {
    let env = Env::new("malformed").await;
    let bitpool = Bitpool::start(env.name(), &[]);
    capi_pool(
        &env,
        "spread",
        capi_spec(&["10.65.0.10-10.65.0.20", "10.66.0.1"], 24),
    )
    .await;
    claim(&env, "on-spread", "InClusterIPPool", "spread").await;
    let pools: Api<InClusterIPPool> = env.api();
    for (pool, field) in [("spread", "addresses[1]")] {
        eventually(&format!("pool {pool} invalid"), WAIT, || async {
            let ready = pools
                .get(pool)
                .await
                .ok()?
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Ready")?;
            (ready.status == "False"
                && ready.reason == "InvalidSpec"
                && ready.message.contains(field)
                && ready.message.contains("outside the pool's subnet"))
            .then_some(())
        })
        .await;
    }
    for claim in ["on-spread"] {
        wait_claim(&env, claim, "refused", |c| c.reason == "PoolNotReady").await;
    }
    let addresses: Api<IPAddress> = env.api();
    assert!(
        addresses
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .is_empty()
    );
    assert_warnings_name_objects(&bitpool);
}

/// A global pool's preallocation names the claim's namespace: a claim of the same name in
/// another namespace cannot take it, even created first, neither by a qualified key nor by a bare
/// one (which serves only the namespace the pool's annotation names).
#[tokio::test]
async fn global_preallocations_name_the_namespace() {
    let env = Env::new("prealloc").await;
    let other = support::TestNamespace::new(&env.client, "prealloc-other").await;
    let bitpool = Bitpool::start_all_namespaces(env.name());
    let mut spec = capi_spec(&["10.70.0.0/24"], 24);
    spec.pre_allocations = BTreeMap::from([
        (format!("{}/web", env.name()), "10.70.0.50".to_string()),
        ("solo".to_string(), "10.70.0.60".to_string()),
    ]);
    let global = global_pool(&env, "pre", spec).await;
    // The pool's owner names the namespace its bare keys are for.
    let globals: Api<GlobalInClusterIPPool> = Api::all(env.client.clone());
    let annotation = bitpool::api::capi_pools::PREALLOCATION_NAMESPACE_ANNOTATION;
    let owner = json!({ "metadata": { "annotations": { annotation: env.name() } } });
    globals
        .patch(&global, &PatchParams::default(), &Patch::Merge(&owner))
        .await
        .expect("annotate the pool");
    // The squatters come first, with both names, from another namespace.
    let theirs: Api<IPAddressClaim> = Api::namespaced(env.client.clone(), &other.name);
    for name in ["web", "solo"] {
        let mut squatter = claim_object(&env, name, "GlobalInClusterIPPool", &global);
        squatter.metadata.namespace = Some(other.name.clone());
        create(&theirs, &squatter).await;
    }
    let served = |api: Api<IPAddress>, name: &'static str| async move {
        eventually(&format!("{name} served"), WAIT, || async {
            api.get_opt(name).await.ok()?.map(|a| a.spec.address)
        })
        .await
    };
    let other_addresses = || Api::namespaced(env.client.clone(), &other.name);
    let squatted_web = served(other_addresses(), "web").await;
    let squatted_solo = served(other_addresses(), "solo").await;
    claim(&env, "web", "GlobalInClusterIPPool", &global).await;
    claim(&env, "solo", "GlobalInClusterIPPool", &global).await;
    assert_eq!(served(env.api(), "web").await, "10.70.0.50");
    assert_eq!(served(env.api(), "solo").await, "10.70.0.60");
    assert_ne!(
        squatted_web, "10.70.0.50",
        "another namespace's claim took the qualified preallocation"
    );
    assert_ne!(
        squatted_solo, "10.70.0.60",
        "another namespace's claim took the bare preallocation"
    );
    let mut claims: Vec<Api<IPAddressClaim>> = vec![env.api()];
    claims.push(Api::namespaced(env.client.clone(), &other.name));
    for api in &claims {
        delete_all_claims(api).await;
    }
    let _ = globals.delete(&global, &DeleteParams::default()).await;
    eventually("the global pool to be deleted", WAIT, || async {
        matches!(globals.get_opt(&global).await, Ok(None)).then_some(())
    })
    .await;
    assert_warnings_name_objects(&bitpool);
}

/// An address held by two claims' objects (here a hand-made IPAddress naming another claim's
/// address) is said out loud on the pool, and stays allocated while either holds it: when one
/// claim goes, a third claim does not get it.
#[tokio::test]
async fn a_duplicate_is_reported_and_never_handed_to_a_third_claim() {
    let env = Env::new("duplicate").await;
    let bitpool = Bitpool::start(env.name(), &[]);
    capi_pool(&env, "dup", capi_spec(&["10.66.0.1-10.66.0.2"], 24)).await;
    claim(&env, "a", "InClusterIPPool", "dup").await;
    claim(&env, "filler", "InClusterIPPool", "dup").await;
    assert_consistent(&env, "InClusterIPPool", "dup", 2, WAIT).await;
    let shared = address_of(&env, "a").await;
    claim(&env, "b", "InClusterIPPool", "dup").await;
    wait_claim(&env, "b", "refused: the pool is exhausted", |c| {
        c.reason == "PoolExhausted"
    })
    .await;
    let by_hand = IPAddress::new(
        "b",
        bitpool::api::capi::IPAddressSpec {
            claim_ref: bitpool::api::capi::LocalObjectName { name: "b".into() },
            pool_ref: bitpool::api::capi::IPPoolReference {
                name: "dup".into(),
                kind: "InClusterIPPool".into(),
                api_group: CAPI_GROUP.into(),
            },
            address: shared.clone(),
            prefix: 24,
            gateway: None,
        },
    );
    let by_hand = IPAddress {
        metadata: env.meta("b"),
        ..by_hand
    };
    create(&env.api(), &by_hand).await;

    let reported = wait_pool_reason(&env, "dup", "DuplicateAddress").await;
    assert!(
        reported.contains(&shared) && reported.contains("/a") && reported.contains("/b"),
        "{reported}"
    );
    wait_event(&env, "DuplicateAddress").await;

    // One holder goes: the other still holds the address, and a new claim does not get it.
    delete_claim(&env, "a").await;
    claim(&env, "c", "InClusterIPPool", "dup").await;
    wait_claim(&env, "c", "refused: the pool is exhausted", |c| {
        c.reason == "PoolExhausted"
    })
    .await;
    let addresses: Api<IPAddress> = env.api();
    assert!(
        addresses
            .get_opt("c")
            .await
            .expect("read IPAddress c")
            .is_none(),
        "claim c got an address while {shared} was still held by b"
    );
    let ledger = env
        .ledger("InClusterIPPool", "dup")
        .await
        .expect("the ledger");
    let held: std::net::IpAddr = shared.parse().expect("an address");
    assert!(ledger.contains(held), "{shared} was freed while b holds it");

    // The last holder goes: now the address is free again, for c.
    delete_claim(&env, "b").await;
    wait_claim(&env, "c", "served", |c| c.status == "True").await;
    assert_consistent(&env, "InClusterIPPool", "dup", 2, WAIT).await;
    assert_eq!(address_of(&env, "c").await, shared);
    assert_warnings_name_objects(&bitpool);
}

/// A pool whose allocation record fills up with addresses scattered over a vast space (here
/// written into its ledger by hand: 20,000 addresses, each in a /64 of its own) hands out no new
/// address and says why on the pool and the waiting claim, instead of failing to write its
/// ledger; once the scattered addresses are found to be held by nothing and released, it serves
/// again.
#[tokio::test]
async fn a_full_allocation_record_is_explained_and_recovers() {
    let env = Env::new("ledgerfull").await;
    let bitpool = Bitpool::start(env.name(), &[]);
    capi_pool(&env, "wide", capi_spec(&["fd00:77::/48"], 48)).await;
    claim(&env, "first", "InClusterIPPool", "wide").await;
    assert_consistent(&env, "InClusterIPPool", "wide", 1, WAIT).await;

    let ledgers: Api<ConfigMap> = env.api();
    let name = env.ledger_name("InClusterIPPool", "wide");
    let stored = ledgers.get(&name).await.expect("the ledger");
    let mut ledger = bitpool::ipam::ledger::Ledger::from_config_map(&stored).expect("a ledger");
    for i in 0..20_000u128 {
        let value = (0xfd00_0077u128 << 96) | (i << 64) | 1;
        ledger.insert(std::net::IpAddr::V6(std::net::Ipv6Addr::from(value)));
    }
    assert!(ledger.bitmap_bytes() >= bitpool::ipam::ledger::MAX_BITMAP_BYTES);
    ledgers
        .replace(
            &name,
            &PostParams::default(),
            &ledger.to_config_map(stored.metadata),
        )
        .await
        .expect("write the scattered ledger");

    claim(&env, "second", "InClusterIPPool", "wide").await;
    let waiting = wait_claim(&env, "second", "told the record is full", |c| {
        c.message.contains("allocation record takes")
    })
    .await;
    assert_eq!(waiting.reason, "PoolExhausted", "{waiting:?}");
    wait_pool_reason(&env, "wide", "LedgerFull").await;
    // Nothing holds the scattered addresses: they are released, and the pool serves again.
    assert_consistent(&env, "InClusterIPPool", "wide", 2, AFTER_FENCE).await;
    assert_warnings_name_objects(&bitpool);
}

/// Three pools covering 10.77.0.0/24 — two namespaced in one namespace, one global — each give
/// 10.77.0.1 to a claim (overlaps are allowed, as upstream), and each says which pools it meets
/// and where, on its status, in an Event and a metric; when one goes, the others stop naming it.
#[tokio::test]
async fn overlapping_pools_say_so() {
    let env = Env::new("overlap").await;
    let bitpool = Bitpool::start_all_namespaces(env.name());
    let spec = || capi_spec(&["10.77.0.0/24"], 24);
    capi_pool(&env, "one", spec()).await;
    capi_pool(&env, "two", spec()).await;
    let global = global_pool(&env, "three", spec()).await;
    claim(&env, "on-one", "InClusterIPPool", "one").await;
    claim(&env, "on-two", "InClusterIPPool", "two").await;
    claim(&env, "on-three", "GlobalInClusterIPPool", &global).await;
    for name in ["on-one", "on-two", "on-three"] {
        wait_claim(&env, name, "served", |c| c.status == "True").await;
        assert_eq!(address_of(&env, name).await, "10.77.0.1");
    }
    let overlap = |conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>| {
        conditions
            .into_iter()
            .find(|c| c.type_ == "AddressesOverlap" && c.status == "True")
            .map(|c| c.message)
    };
    let pools: Api<InClusterIPPool> = env.api();
    let globals: Api<GlobalInClusterIPPool> = Api::all(env.client.clone());
    let ns = env.name().to_string();
    let said_by_one = eventually("pool one names both others", WAIT, || async {
        let message = overlap(pools.get("one").await.ok()?.status?.conditions)?;
        (message.contains(&format!("InClusterIPPool {ns}/two"))
            && message.contains(&format!("GlobalInClusterIPPool {global}")))
        .then_some(message)
    })
    .await;
    assert!(
        said_by_one.contains("10.77.0.1-10.77.0.254"),
        "{said_by_one}"
    );
    eventually("the global pool names both others", WAIT, || async {
        let message = overlap(globals.get(&global).await.ok()?.status?.conditions)?;
        (message.contains(&format!("{ns}/one")) && message.contains(&format!("{ns}/two")))
            .then_some(())
    })
    .await;
    wait_event(&env, "PoolsOverlap").await;

    // Pool two goes (its claim first): the others stop naming it.
    delete_claim(&env, "on-two").await;
    pools
        .delete("two", &DeleteParams::default())
        .await
        .expect("delete pool two");
    eventually("pool one no longer names pool two", WAIT, || async {
        let message = overlap(pools.get("one").await.ok()?.status?.conditions)?;
        (!message.contains(&format!("{ns}/two"))).then_some(())
    })
    .await;
    for name in ["on-one", "on-three"] {
        delete_claim(&env, name).await;
    }
    let _ = globals.delete(&global, &DeleteParams::default()).await;
    assert_warnings_name_objects(&bitpool);
}

/// Deletes the claim `name` and waits until it is gone (its address released).
async fn delete_claim(env: &Env, name: &str) {
    let claims: Api<IPAddressClaim> = env.api();
    claims
        .delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete claim {name}: {e}"));
    eventually(&format!("claim {name} is gone"), WAIT, || async {
        matches!(claims.get_opt(name).await, Ok(None)).then_some(())
    })
    .await;
}

/// An IPClaim on a pool whose namePrefix makes invalid address object names is told which name
/// and why, and nothing is allocated.
#[tokio::test]
async fn an_invalid_name_prefix_is_explained_on_the_ipclaim() {
    let env = Env::new("nameprefix").await;
    let bitpool = Bitpool::start(env.name(), &[]);
    let mut spec = metal3_spec("10.71.0.10", "10.71.0.20", 24);
    spec.name_prefix = "n".repeat(250);
    metal3_pool(&env, "long", spec).await;
    ipclaim(&env, "victim", "long").await;
    let ipclaims: Api<IPClaim> = env.api();
    let message = eventually("the IPClaim's error", WAIT, || async {
        ipclaims.get("victim").await.ok()?.status?.error_message
    })
    .await;
    assert!(
        message.starts_with("Failed to create associated IPAddress object")
            && message.contains("namePrefix")
            && message.contains("more than 253"),
        "{message}"
    );
    let addresses: Api<Metal3IPAddress> = env.api();
    assert!(
        addresses
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .is_empty()
    );
    assert!(
        env.ledger("IPPool", "long")
            .await
            .is_none_or(|l| l.is_empty()),
        "nothing is reserved for a claim that cannot get an address object"
    );
    assert_warnings_name_objects(&bitpool);
}

/// SIGTERM under load stops new work at once and the process ends within its shutdown timeout;
/// a second SIGTERM ends it at once; the next process finishes the job with nothing duplicated.
#[tokio::test]
async fn shutdown_under_load_is_prompt_and_loses_nothing() {
    let env = Env::new("shutdown").await;
    capi_pool(&env, "pool", capi_spec(&["10.72.0.0/22"], 22)).await;
    let addresses: Api<IPAddress> = env.api();
    let count = || async {
        addresses
            .list_metadata(&ListParams::default())
            .await
            .map(|l| l.items.len())
            .unwrap_or_default()
    };
    let mut first = Bitpool::start(env.name(), &[]);
    burst(&env, "c", "InClusterIPPool", "pool", 800).await;
    eventually("100 addresses", WAIT, || async {
        (count().await >= 100).then_some(())
    })
    .await;
    first.terminate();
    let at_signal = count().await;
    assert!(
        first.wait_exit(Duration::from_secs(25)),
        "exited within the shutdown timeout"
    );
    let after = count().await;
    assert!(
        after <= at_signal + 32,
        "new work after SIGTERM: {at_signal} addresses at the signal, {after} at exit"
    );
    assert_warnings_name_objects(&first);

    let mut second = Bitpool::start(env.name(), &[]);
    eventually("the second process works", WAIT, || async {
        (count().await > after).then_some(())
    })
    .await;
    second.terminate();
    tokio::time::sleep(Duration::from_millis(300)).await;
    second.terminate();
    assert!(
        second.wait_exit(Duration::from_secs(3)),
        "a second SIGTERM exits at once"
    );

    let third = Bitpool::start(env.name(), &[]);
    assert_consistent(
        &env,
        "InClusterIPPool",
        "pool",
        800,
        Duration::from_secs(300),
    )
    .await;
    assert_warnings_name_objects(&third);
}

/// A hand-made IPAddress naming `pool` (a global pool) in `namespace`, for claim `claim`.
fn by_hand(namespace: &str, name: &str, claim: &str, pool: &str, address: &str) -> IPAddress {
    IPAddress {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        spec: bitpool::api::capi::IPAddressSpec {
            claim_ref: bitpool::api::capi::LocalObjectName { name: claim.into() },
            pool_ref: bitpool::api::capi::IPPoolReference {
                name: pool.into(),
                kind: "GlobalInClusterIPPool".into(),
                api_group: CAPI_GROUP.into(),
            },
            address: address.into(),
            prefix: 24,
            gateway: None,
        },
    }
}

/// Whether the pool `name` of `api` ever says its ledger was rebuilt (a `LedgerRebuilt`
/// condition) while the returned task watches it.
fn watch_for_fence<K>(api: Api<K>, name: &str) -> tokio::task::JoinHandle<bool>
where
    K: kube::Resource
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    use futures::StreamExt;
    let config = kube::runtime::watcher::Config::default().fields(&format!("metadata.name={name}"));
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(kube::runtime::watcher(api, config));
        while let Some(event) = stream.next().await {
            let rebuilt = match event {
                Ok(kube::runtime::watcher::Event::Apply(p))
                | Ok(kube::runtime::watcher::Event::InitApply(p)) => {
                    reasons(&p).iter().any(|reason| reason == "LedgerRebuilt")
                }
                _ => false,
            };
            if rebuilt {
                return true;
            }
        }
        false
    })
}

/// The reasons of a pool's conditions, for a pool of any kind (each kind has its own status type,
/// all with upstream's `status.conditions`).
fn reasons<K: serde::Serialize>(pool: &K) -> Vec<String> {
    let status = serde_json::to_value(pool).unwrap_or_default();
    let conditions = status["status"]["conditions"].as_array().cloned();
    let reasons = conditions.into_iter().flatten();
    reasons
        .filter_map(|c| c["reason"].as_str().map(str::to_string))
        .collect()
}

/// A tenant who may write IPAddresses in its own namespace cannot stop or corrupt a pool all
/// tenants share (here with no webhook in the way, as while bitpool's is down): an object naming
/// a free address for no claim, and one named after the tenant's own claim naming another
/// tenant's address, neither fence the pool (another tenant's new claim is served with no
/// rebuild), nor free or move the other tenant's address (its claim keeps it; the tenant's claim
/// is told why it is not served with it), and the pool names them in an Event.
#[tokio::test]
async fn a_tenants_hand_made_addresses_neither_fence_free_nor_move() {
    let env = Env::new("tenants").await;
    let tenant = support::TestNamespace::new(&env.client, "tenants-other").await;
    let bitpool = Bitpool::start_all_namespaces(env.name());
    let global = global_pool(&env, "shared", capi_spec(&["10.89.0.1-10.89.0.8"], 24)).await;
    claim(&env, "mine", "GlobalInClusterIPPool", &global).await;
    wait_claim(&env, "mine", "served", |c| c.status == "True").await;
    let mine = address_of(&env, "mine").await;
    // Once its record is judged whole, an object it does not list is not a lost part of it.
    eventually("the record is judged whole", WAIT, || async {
        let ledger = env.ledger("GlobalInClusterIPPool", &global).await?;
        ledger.whole().then_some(())
    })
    .await;
    let fenced = watch_for_fence::<GlobalInClusterIPPool>(Api::all(env.client.clone()), &global);

    let free = (1..=8)
        .map(|n| format!("10.89.0.{n}"))
        .find(|a| *a != mine)
        .expect("a free address");
    // The tenant's claim exists, paused, before its object: an object whose claim is missing
    // is deleted as an orphan, and an unpaused claim would be served before its object is made.
    let their_claims: Api<IPAddressClaim> = Api::namespaced(env.client.clone(), &tenant.name);
    let mut grab = claim_object(&env, "grab", "GlobalInClusterIPPool", &global);
    grab.metadata.namespace = Some(tenant.name.clone());
    grab.metadata.annotations = Some([(PAUSED.to_string(), String::new())].into());
    create(&their_claims, &grab).await;
    let theirs: Api<IPAddress> = Api::namespaced(env.client.clone(), &tenant.name);
    create(
        &theirs,
        &by_hand(&tenant.name, "squat", "ghost", &global, &free),
    )
    .await;
    create(
        &theirs,
        &by_hand(&tenant.name, "grab", "grab", &global, &mine),
    )
    .await;
    their_claims
        .patch(
            "grab",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { PAUSED: null } } })),
        )
        .await
        .expect("unpause the tenant's claim");

    claim(&env, "next", "GlobalInClusterIPPool", &global).await;
    wait_claim(&env, "next", "served", |c| c.status == "True").await;
    let refused = eventually("the tenant's claim is told why", WAIT, || async {
        let claim = their_claims.get_opt("grab").await.ok()??;
        ready(&claim)
            .filter(|c| c.status == "False" && c.message.contains("did not hand"))
            .map(|c| c.message.clone())
    })
    .await;
    assert!(refused.contains(&mine), "{refused}");
    wait_event_in(&env, "default", None, "ForeignAddress").await;

    assert_eq!(
        address_of(&env, "mine").await,
        mine,
        "mine kept its address"
    );
    let ledger = env
        .ledger("GlobalInClusterIPPool", &global)
        .await
        .expect("the ledger");
    assert!(ledger.contains(mine.parse().expect("an address")));
    assert!(ledger.rebuilt_at.is_none(), "{:?}", ledger.rebuilt_because);
    fenced.abort();
    assert!(
        !matches!(fenced.await, Ok(true)),
        "the pool was fenced for a hand-made object"
    );
    let status = their_claims
        .get("grab")
        .await
        .expect("read the tenant's claim")
        .status;
    assert!(
        status.and_then(|s| s.address_ref).is_none(),
        "the tenant's claim was served with another tenant's address"
    );

    delete_all_claims(&their_claims).await;
    let _ = theirs
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    delete_all_claims(&env.api()).await;
    assert_consistent(&env, "GlobalInClusterIPPool", &global, 0, WAIT).await;
    assert_warnings_name_objects(&bitpool);
}

/// The SIGKILL loop on a Metal3 pool serving both claim kinds: two processes serve it while a
/// third is SIGKILLed every 2 s, claims of both kinds are created and deleted at random, and
/// some are deleted within a second of their creation while both writers run. In the end every
/// remaining claim holds one address object of its own, no address is held twice, nothing is
/// left of the claims that went, and the ledger lists exactly the live objects.
#[tokio::test]
async fn a_sigkill_loop_on_a_metal3_pool_with_both_claim_kinds_leaves_no_orphan() {
    let env = Env::new("killloop-m3").await;
    metal3_pool(&env, "m3", metal3_spec("10.64.0.1", "10.64.0.250", 24)).await;
    let first = Bitpool::start(env.name(), &[]);
    let second = Bitpool::start(env.name(), &[]);
    let killing = sigkill_loop(&env, 10);
    let ipclaims: Api<IPClaim> = env.api();
    let claims: Api<IPAddressClaim> = env.api();
    let churn = async {
        ipclaim_burst(&env, "m", "m3", 100).await;
        burst(&env, "c", "IPPool", "m3", 100).await;
        let mut deleted = BTreeSet::new();
        while deleted.len() < 80 {
            let i = rand::random_range(0..200);
            if deleted.insert(i) {
                let _ = match i < 100 {
                    true => ipclaims
                        .delete(&format!("m-{i:04}"), &DeleteParams::default())
                        .await
                        .map(drop),
                    false => claims
                        .delete(&format!("c-{:04}", i - 100), &DeleteParams::default())
                        .await
                        .map(drop),
                };
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    // Claims of both kinds deleted within a second of their creation, while both writers run.
    let fleeting = async {
        for i in 0..10 {
            let name = format!("f-{i:02}");
            create(&ipclaims, &ipclaim_object(&env, &name, "m3")).await;
            let claim = claim_object(&env, &name, "IPPool", "m3");
            create(&claims, &claim).await;
            tokio::time::sleep(Duration::from_millis(rand::random_range(0..800))).await;
            let _ = ipclaims.delete(&name, &DeleteParams::default()).await;
            let _ = claims.delete(&name, &DeleteParams::default()).await;
        }
    };
    futures::join!(killing, churn, fleeting);
    assert_metal3_consistent(&env, "m3", WAIT).await;
    let left = ipclaims
        .list(&ListParams::default())
        .await
        .expect("IPClaims")
        .items
        .len()
        + claims
            .list(&ListParams::default())
            .await
            .expect("claims")
            .items
            .len();
    assert_eq!(left, 120, "the claims not deleted are all there");
    assert_warnings_name_objects(&first);
    assert_warnings_name_objects(&second);
}

/// The holder of the leader election Lease `name` in the test namespace.
async fn lease_holder(env: &Env, name: &str) -> Option<String> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = env.api();
    leases.get_opt(name).await.ok()??.spec?.holder_identity
}

/// A leader cut off from the API server (not killed: it runs on, its writes wait in the
/// network) while it serves a burst: the standby takes over and serves the claims created
/// meanwhile; when the network returns, the old leader's queued writes land after the standby
/// has led, and still no address is handed out twice and the ledger lists exactly the live
/// objects.
#[tokio::test]
async fn a_leader_cut_off_mid_burst_lands_its_writes_late_and_hands_out_nothing_twice() {
    let env = Env::new("cutoff").await;
    capi_pool(&env, "pool", capi_spec(&["10.65.0.0/24"], 24)).await;
    let relay = support::cut::Cuttable::start(support::cut::Cuttable::upstream_of(
        support::kubeconfig_path(),
    ))
    .await;
    let kubeconfig = relay.kubeconfig(support::kubeconfig_path(), env.name());
    let lease = format!("{}-leader", env.name());
    let id = format!("--leader-election-id={lease}");
    let args = [
        "--leader-elect",
        id.as_str(),
        "--leader-elect-lease-duration=6s",
        "--leader-elect-renew-deadline=4s",
    ];
    let leader = Bitpool::start_via(&kubeconfig, env.name(), &args);
    let first = eventually("the first process leads", WAIT, || {
        lease_holder(&env, &lease)
    })
    .await;
    let standby = Bitpool::start(env.name(), &args);

    // The cut comes while the leader serves a burst: some of its writes are on their way.
    let cut_mid_burst = async {
        wait_addresses(&env, 20, "the leader serves part of the burst").await;
        relay.cut();
    };
    futures::join!(
        burst(&env, "a", "InClusterIPPool", "pool", 100),
        cut_mid_burst
    );
    eventually("the standby leads", WAIT, || async {
        lease_holder(&env, &lease).await.filter(|h| *h != first)
    })
    .await;
    burst(&env, "b", "InClusterIPPool", "pool", 50).await;
    wait_all_ready(&env, 150, WAIT).await;
    // The network returns: what the old leader sent lands now, after the standby has led.
    relay.restore();
    assert_consistent(&env, "InClusterIPPool", "pool", 150, AFTER_FENCE).await;
    assert_warnings_name_objects(&standby);
    drop(leader);
}

/// Losing the ledger of a Metal3 pool serving both claim kinds, and of a prefix pool, never
/// yields a duplicate: each ledger is deleted every 0.3 s during a burst served by two
/// processes, and each pool recovers on its own from its live address objects.
#[tokio::test]
async fn a_lost_ledger_of_a_metal3_or_prefix_pool_never_yields_a_duplicate() {
    let env = Env::new("ledgerloss-kinds").await;
    metal3_pool(&env, "m3", metal3_spec("10.66.0.1", "10.66.0.250", 24)).await;
    prefix_pool(&env, "pp", prefix_spec(&["fd00:66::/56"], 64)).await;
    let first = Bitpool::start(env.name(), &[]);
    let second = Bitpool::start(env.name(), &[]);
    let ledgers: Api<ConfigMap> = env.api();
    let deleting = |name: String| {
        let ledgers = ledgers.clone();
        async move {
            for _ in 0..30 {
                let _ = ledgers.delete(&name, &DeleteParams::default()).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    };
    let ipclaims: Api<IPClaim> = env.api();
    let metal3 = async {
        ipclaim_burst(&env, "m", "m3", 60).await;
        burst(&env, "c", "IPPool", "m3", 60).await;
    };
    futures::join!(
        metal3,
        burst(&env, "p", "InClusterPrefixPool", "pp", 100),
        deleting(env.ledger_name("IPPool", "m3")),
        deleting(env.ledger_name("InClusterPrefixPool", "pp")),
    );
    // A ledger missing at rest is rebuilt by the pool's next reconcile (as in the test above):
    // one more claim of each kind.
    create(&ipclaims, &ipclaim_object(&env, "m-last", "m3")).await;
    claim(&env, "c-last", "IPPool", "m3").await;
    claim(&env, "p-last", "InClusterPrefixPool", "pp").await;
    assert_metal3_consistent(&env, "m3", AFTER_FENCE).await;
    assert_prefixes_consistent(&env, "pp", 101, AFTER_FENCE).await;
    assert_warnings_name_objects(&first);
    assert_warnings_name_objects(&second);
}

/// A pool whose 20 claims (`old-NNNN`) a process served and which then stopped as a crash
/// would: where the restart tests begin.
async fn served_then_stopped(name: &str, cidr: &str) -> Env {
    let env = Env::new(name).await;
    capi_pool(&env, "pool", capi_spec(&[cidr], 24)).await;
    let mut first = Bitpool::start(env.name(), &[]);
    burst(&env, "old", "InClusterIPPool", "pool", 20).await;
    assert_consistent(&env, "InClusterIPPool", "pool", 20, WAIT).await;
    first.kill();
    env
}

/// The address of the object `name`, which no other object holds.
async fn held_once(env: &Env, name: &str) -> String {
    let address = address_of(env, name).await;
    let objects: Vec<IPAddress> = listed(env, |_: &IPAddress| true)
        .await
        .expect("list the address objects");
    let holding_it: Vec<String> = objects
        .iter()
        .filter(|a| a.spec.address == address)
        .map(|a| a.name_any())
        .collect();
    assert_eq!(holding_it, [name], "{address} is held once");
    address
}

/// A restarted process serves a claim made after it started while the claims themselves are
/// still being listed (held back by a relay, as 100,000 claims hold a list for tens of seconds):
/// it follows the claims' changes from where the last process left them, and takes the address
/// from the pool's ledger; a claim made while no process ran is one of those changes
/// (`tests/restarts.rs` has the ways a process ends). What the list alone can show waits for it:
/// the release of a deleted claim, one deleted before the restart and one served and deleted
/// since. Once the list arrives, all are settled and nothing is held twice.
#[tokio::test]
async fn new_claims_are_served_before_the_claims_are_listed() {
    let env = served_then_stopped("arriving", "10.67.0.0/24").await;

    // While no process runs.
    let claims: Api<IPAddressClaim> = env.api();
    claims
        .delete("old-0001", &DeleteParams::default())
        .await
        .expect("delete a claim");
    claim(&env, "down", "InClusterIPPool", "pool").await;

    let relay = support::hold::Holding::start(env.client.clone(), "ipaddressclaims").await;
    let bitpool = Bitpool::start_via(&relay.kubeconfig(env.name()), env.name(), &[]);
    eventually("bitpool follows the claims' changes", WAIT, || async {
        (relay.following() > 0).then_some(())
    })
    .await;
    claim(&env, "new", "InClusterIPPool", "pool").await;
    wait_claim(&env, "new", "served while the claims are held back", |c| {
        c.status == "True"
    })
    .await;
    assert!(relay.held() > 0, "bitpool never asked for the claims");
    let new_address = held_once(&env, "new").await;
    // Served and deleted while the list is held: the next claim's reconcile sees the deletion
    // (the changes come in order) and must leave it to the list.
    claims
        .delete("new", &DeleteParams::default())
        .await
        .expect("delete the new claim");
    claim(&env, "newer", "InClusterIPPool", "pool").await;
    wait_claim(
        &env,
        "newer",
        "served while the claims are held back",
        |c| c.status == "True",
    )
    .await;
    assert_ne!(address_of(&env, "newer").await, new_address);
    for (name, what) in [
        ("new", "deleted since the restart"),
        ("old-0001", "deleted before it"),
    ] {
        let deleting = claims.get_opt(name).await.expect("read the claim");
        assert!(
            deleting.is_some(),
            "a claim {what} was released before the list"
        );
    }
    wait_claim(
        &env,
        "down",
        "made while down, served before the list",
        |c| c.status == "True",
    )
    .await;

    relay.release();
    for name in ["new", "old-0001"] {
        eventually(&format!("{name} is released"), WAIT, || async {
            matches!(claims.get_opt(name).await, Ok(None)).then_some(())
        })
        .await;
    }
    // 19 old claims, "down" and "newer".
    assert_consistent(&env, "InClusterIPPool", "pool", 21, WAIT).await;
    assert_warnings_name_objects(&bitpool);
}

/// A restarted process serves a new claim from the pool's ledger while the address objects are
/// still being listed (here held back by a relay, as 100,000 objects would hold a list for
/// seconds), and leaves to the list what needs it: a claim whose object exists but whose status
/// was lost (a process killed between the two writes) gets no second address, and a deleting
/// claim keeps its address. Once the list arrives, both are settled and nothing is held twice.
#[tokio::test]
async fn new_claims_are_served_before_the_address_objects_are_listed() {
    let env = served_then_stopped("unlisted", "10.66.0.0/24").await;

    // While no process runs.
    let claims: Api<IPAddressClaim> = env.api();
    let lost_address = address_of(&env, "old-0000").await;
    claims
        .patch_status(
            "old-0000",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": null })),
        )
        .await
        .expect("clear a claim's status");
    claims
        .delete("old-0001", &DeleteParams::default())
        .await
        .expect("delete a claim");
    claim(&env, "new", "InClusterIPPool", "pool").await;

    let relay = support::hold::Holding::start(env.client.clone(), "ipaddresses").await;
    let bitpool = Bitpool::start_via(&relay.kubeconfig(env.name()), env.name(), &[]);
    wait_claim(
        &env,
        "new",
        "served while the address objects are held back",
        |c| c.status == "True",
    )
    .await;
    assert!(
        relay.held() > 0,
        "bitpool never asked for the address objects"
    );
    held_once(&env, "new").await;
    let objects: Vec<IPAddress> = listed(&env, |_: &IPAddress| true)
        .await
        .expect("list the address objects");
    // What needs the objects waited for them.
    let lost = claims.get("old-0000").await.expect("read the claim");
    assert!(
        ready(&lost).is_none(),
        "judged without its object: {lost:?}"
    );
    assert_eq!(address_of(&env, "old-0000").await, lost_address);
    assert_eq!(
        objects
            .iter()
            .filter(|a| a.spec.claim_ref.name == "old-0000")
            .count(),
        1,
        "a second object for the claim whose status was lost"
    );
    let deleting = claims.get_opt("old-0001").await.expect("read the claim");
    assert!(deleting.is_some(), "released before its object was seen");

    relay.release();
    wait_claim(&env, "old-0000", "served with its object", |c| {
        c.status == "True"
    })
    .await;
    assert_eq!(address_of(&env, "old-0000").await, lost_address);
    eventually("the deleting claim is released", WAIT, || async {
        matches!(claims.get_opt("old-0001").await, Ok(None)).then_some(())
    })
    .await;
    assert_consistent(&env, "InClusterIPPool", "pool", 20, WAIT).await;
    assert_warnings_name_objects(&bitpool);
}

/// A reservation whose address the pool no longer contains when its create is sent again (a
/// process killed between reserving and creating, and the address's subnet removed from the
/// pool meanwhile): the claim gets no IPAddress with another subnet's prefix and gateway, but
/// a condition that says what happened and what to do, and the reservation is kept.
#[tokio::test]
async fn a_reservation_outside_every_subnet_gets_no_other_subnets_prefix_or_gateway() {
    let env = Env::new("reserved-outside").await;
    let mut spec = with_gateway(capi_spec(&["10.36.0.10-10.36.0.20"], 24), "10.36.0.1");
    spec.subnets = vec![bitpool::api::capi_pools::PoolSubnet {
        addresses: vec!["10.36.1.10-10.36.1.20".into()],
        prefix: 25,
        gateway: Some("10.36.1.1".into()),
        dns_servers: Vec::new(),
    }];
    capi_pool(&env, "racks", spec).await;
    let mut bitpool = Bitpool::start(env.name(), &[]);
    claim(&env, "warm", "InClusterIPPool", "racks").await;
    wait_claim(&env, "warm", "served", |c| c.status == "True").await;
    bitpool.kill();

    // What a process killed after reserving leaves: a reservation for the claim, here of an
    // address in a third subnet that the pool had when it was made.
    let stranded = claim(&env, "stranded", "InClusterIPPool", "racks").await;
    let uid = stranded.uid().expect("the server sets a UID");
    edit_ledger(&env, "racks", |cm| {
        let mut ledger =
            bitpool::ipam::ledger::Ledger::from_config_map(cm).expect("a readable ledger");
        let reservation = bitpool::ipam::ledger::Reservation {
            claim_namespace: env.name().to_string(),
            claim_name: "stranded".into(),
            claim_uid: uid.clone(),
            since: k8s_openapi::jiff::Timestamp::now().to_string(),
        };
        ledger.reserve("10.36.2.15".parse().expect("an address"), reservation);
        *cm = ledger.to_config_map(cm.metadata.clone());
    })
    .await;

    let _bitpool = Bitpool::start(env.name(), &[]);
    let refused = wait_claim(&env, "stranded", "refused, saying why", |c| {
        c.status == "False" && c.reason == "AllocationFailed"
    })
    .await;
    assert!(
        refused.message.contains("10.36.2.15") && refused.message.contains("outside every subnet"),
        "{}",
        refused.message
    );
    let addresses: Api<IPAddress> = env.api();
    assert!(
        addresses
            .list(&ListParams::default())
            .await
            .expect("list IPAddresses")
            .items
            .iter()
            .all(|a| a.spec.claim_ref.name != "stranded"),
        "no IPAddress for the stranded claim"
    );
    let ledger = env
        .ledger("InClusterIPPool", "racks")
        .await
        .expect("the ledger");
    assert_eq!(
        ledger.reservation_of(&uid).map(|(a, _)| a.to_string()),
        Some("10.36.2.15".to_string()),
        "the reservation is kept"
    );
}
