//! A restarted process serves the claims made while no process ran before the claims' list
//! arrives (at 100,000 claims the server takes tens of seconds to send it): it follows the
//! claims' changes from where the last process recorded it had followed them. Each test ends the
//! first process in one of the ways a process ends — SIGKILLed mid-burst, stopped cleanly, cut
//! off from the API server with its lease expired — on every Cluster API pool kind at once, makes
//! claims while no process serves, holds the restarted process's claims list back with a relay,
//! and checks that those claims are served meanwhile, that what needs the list (a release) waits
//! for it, and that once it arrives every claim holds an address of its own.

mod support;

use bitpool::api::capi::IPAddressClaim;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams};
use support::build::*;
use support::check::*;
use support::hold::Holding;
use support::process::kill_when_created;
use support::wait::*;
use support::{Bitpool, Env, eventually};

/// Claims each pool's burst makes.
const BURST: usize = 30;

/// One pool of each Cluster API kind in the test's namespace (the global ones named after it).
struct Pools(Vec<Pool>);

struct Pool {
    kind: &'static str,
    name: String,
    /// A short name for the pool's claims.
    short: &'static str,
}

impl Pools {
    /// The four pools, in the test's own address room `room` (10.<room>.0.0/16, fd00:<room>::/48).
    async fn create(env: &Env, room: u8) -> Self {
        let v4 = |third: u8| format!("10.{room}.{third}.0/24");
        let v6 = |sub: u8| format!("fd00:{room}:{sub}::/56");
        capi_pool(env, "ip", capi_spec(&[&v4(0)], 24)).await;
        let global = global_pool(env, "global", capi_spec(&[&v4(1)], 24)).await;
        prefix_pool(env, "prefix", prefix_spec(&[&v6(0)], 64)).await;
        let global_prefix = global_prefix_pool(env, "gprefix", prefix_spec(&[&v6(1)], 64)).await;
        Self(vec![
            Pool {
                kind: "InClusterIPPool",
                name: "ip".into(),
                short: "ip",
            },
            Pool {
                kind: "GlobalInClusterIPPool",
                name: global,
                short: "gip",
            },
            Pool {
                kind: "InClusterPrefixPool",
                name: "prefix".into(),
                short: "pp",
            },
            Pool {
                kind: "GlobalInClusterPrefixPool",
                name: global_prefix,
                short: "gpp",
            },
        ])
    }

    /// One claim `<short>-<what>` on each pool; their names.
    async fn claim_each(&self, env: &Env, what: &str) -> Vec<String> {
        let mut names = Vec::new();
        for pool in &self.0 {
            let name = format!("{}-{what}", pool.short);
            claim(env, &name, pool.kind, &pool.name).await;
            names.push(name);
        }
        names
    }

    /// A burst of [`BURST`] claims `<short>-burst-NNNN` on every pool at once.
    async fn burst(&self, env: &Env) {
        let bursts = self.0.iter().map(|pool| async move {
            let prefix = format!("{}-burst", pool.short);
            burst(env, &prefix, pool.kind, &pool.name, BURST).await;
        });
        futures::future::join_all(bursts).await;
    }

    /// Every pool settled with `count` claims, each holding an address of its own.
    async fn assert_consistent(&self, env: &Env, count: usize) {
        for pool in &self.0 {
            match pool.kind.contains("Prefix") {
                true => {
                    assert_prefix_pool_consistent(env, pool.kind, &pool.name, count, AFTER_FENCE)
                        .await
                }
                false => assert_consistent(env, pool.kind, &pool.name, count, AFTER_FENCE).await,
            }
        }
    }
}

/// The claims' version the test's processes recorded, once there is one.
async fn recorded(env: &Env) -> String {
    let records: Api<ConfigMap> = env.api();
    eventually("a resume record", WAIT, || async {
        let listed = records.list(&ListParams::default()).await.ok()?;
        listed
            .items
            .into_iter()
            .filter(|c| {
                c.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("bitpool-resume"))
            })
            .find_map(|c| c.data?.remove("ipaddressclaims.ipam.cluster.x-k8s.io"))
    })
    .await
}

/// A process serving the test's namespace, with its first claims served and its position
/// recorded (the first claim change is recorded at once).
async fn first_process(
    env: &Env,
    pools: &Pools,
    args: &[&str],
    via: Option<&std::path::Path>,
) -> Bitpool {
    let process = match via {
        Some(kubeconfig) => Bitpool::start_via(kubeconfig, env.name(), args),
        None => Bitpool::start(env.name(), args),
    };
    for name in pools.claim_each(env, "first").await {
        wait_claim(env, &name, "served by the first process", |c| {
            c.status == "True"
        })
        .await;
    }
    recorded(env).await;
    process
}

/// While no process serves: a claim on each pool, and each pool's first claim deleted (its
/// release needs the list). Then a process starts behind a relay that holds the claims' list
/// back; the new claims are served while it is held, the deleted claims keep their addresses
/// until the list arrives, and once it has every pool settles with `count` claims. `meanwhile`
/// runs once the new claims are served, before the list is let through.
async fn served_while_listing(
    env: &Env,
    pools: &Pools,
    args: &[&str],
    count: usize,
    meanwhile: impl FnOnce(),
) -> Bitpool {
    let claims: Api<IPAddressClaim> = env.api();
    let deleted: Vec<String> = pools
        .0
        .iter()
        .map(|p| format!("{}-first", p.short))
        .collect();
    for name in &deleted {
        claims
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete a served claim");
    }
    let down = pools.claim_each(env, "down").await;

    let relay = Holding::start(env.client.clone(), "ipaddressclaims").await;
    let restarted = Bitpool::start_via(&relay.kubeconfig(env.name()), env.name(), args);
    for name in &down {
        wait_claim(
            env,
            name,
            "made while down, served while the claims are held back",
            |c| c.status == "True",
        )
        .await;
    }
    assert!(relay.held() > 0, "bitpool never asked for the claims");
    for name in &deleted {
        let deleting = claims.get_opt(name).await.expect("read the deleted claim");
        assert!(
            deleting.is_some(),
            "{name}, deleted while down, was released before the claims were listed"
        );
    }
    meanwhile();

    relay.release();
    for name in &deleted {
        eventually(&format!("{name} is released"), WAIT, || async {
            matches!(claims.get_opt(name).await, Ok(None)).then_some(())
        })
        .await;
    }
    pools.assert_consistent(env, count).await;
    assert_warnings_name_objects(&restarted);
    restarted
}

/// SIGKILLed mid-burst: some of its creates were on their way. The reservations it committed
/// hold their addresses; the claims made since get others.
#[tokio::test]
async fn after_a_sigkill_mid_burst_claims_made_while_down_are_served_before_the_list() {
    let env = Env::new("resume-killed").await;
    let pools = Pools::create(&env, 71).await;
    let mut first = first_process(&env, &pools, &[], None).await;
    let kill_mid_burst = async {
        // Four first claims, then a fifth of the burst.
        kill_when_created(&env, &mut first, 4 + pools.0.len() * BURST / 5).await;
    };
    futures::join!(pools.burst(&env), kill_mid_burst);
    // Per pool: the burst and the claim made while down (the first claim is deleted).
    let restarted = served_while_listing(&env, &pools, &[], BURST + 1, || {}).await;
    drop(restarted);
}

/// Stopped cleanly (SIGTERM): it records how far it followed the claims as it stops, so the
/// next process picks them up from there however long the claims had rested.
#[tokio::test]
async fn after_a_clean_stop_claims_made_while_down_are_served_before_the_list() {
    let env = Env::new("resume-stopped").await;
    let pools = Pools::create(&env, 72).await;
    let mut first = first_process(&env, &pools, &[], None).await;
    pools.burst(&env).await;
    pools.assert_consistent(&env, BURST + 1).await;
    // At rest nothing is recorded: only the stop can write the record again.
    let records: Api<ConfigMap> = env.api();
    for record in records
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
    {
        let name = record.metadata.name.unwrap_or_default();
        if name.starts_with("bitpool-resume") {
            records
                .delete(&name, &DeleteParams::default())
                .await
                .expect("delete the record");
        }
    }
    first.terminate();
    assert!(first.wait_exit(WAIT), "the first process did not stop");
    recorded(&env).await;
    served_while_listing(&env, &pools, &[], BURST + 1, || {}).await;
}

/// Cut off from the API server (not killed) mid-burst, with leader election: it stops writing
/// once it cannot renew its lease; the restarted process takes the expired lease and serves the
/// claims made since; when the network returns the old leader's queued writes land late, and
/// still nothing is held twice.
#[tokio::test]
async fn after_a_leader_is_cut_off_claims_made_since_are_served_before_the_list() {
    let env = Env::new("resume-cut").await;
    let pools = Pools::create(&env, 73).await;
    let relay = support::cut::Cuttable::start(support::cut::Cuttable::upstream_of(
        support::kubeconfig_path(),
    ))
    .await;
    let kubeconfig = relay.kubeconfig(support::kubeconfig_path(), env.name());
    let id = format!("--leader-election-id={}-leader", env.name());
    let args = [
        "--leader-elect",
        id.as_str(),
        "--leader-elect-lease-duration=6s",
        "--leader-elect-renew-deadline=4s",
    ];
    let leader = first_process(&env, &pools, &args, Some(&kubeconfig)).await;
    let cut_mid_burst = async {
        wait_addresses(
            &env,
            4 + pools.0.len() * BURST / 5,
            "the leader serves part of the burst",
        )
        .await;
        relay.cut();
    };
    futures::join!(pools.burst(&env), cut_mid_burst);
    // The network returns while the restarted process leads: what the old leader sent lands now.
    let restarted = served_while_listing(&env, &pools, &args, BURST + 1, || relay.restore()).await;
    drop((leader, restarted));
}
