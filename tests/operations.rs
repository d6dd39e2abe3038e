//! bitpool as operators run it: probes, metrics (open and behind the API server's authn/authz),
//! Events, and leader election with a handover under load, against the real control plane.

mod support;

use std::time::Duration;

use bitpool::api::capi::IPAddressClaim;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use support::build::*;
use support::check::*;
use support::ops::{Endpoints, bind_cluster_role, sample, service_account};
use support::wait::*;
use support::{Bitpool, Env, eventually};

fn start(env: &Env, endpoints: &Endpoints, secure: bool, extra: &[&str]) -> Bitpool {
    let mut args: Vec<String> = endpoints.args(secure);
    args.extend(extra.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Bitpool::start(env.name(), &args)
}

async fn wait_ready(endpoints: &Endpoints, what: &str) {
    wait_ready_within(endpoints, what, WAIT).await;
}

async fn wait_ready_within(endpoints: &Endpoints, what: &str, limit: Duration) {
    eventually(what, limit, || async {
        let (status, _) = endpoints.readyz().await;
        (status == 200).then_some(())
    })
    .await;
}

/// Readiness waits for the caches; `/metrics` tells each pool's usage and the allocations; the
/// claims and pools get Events for allocation, exhaustion, release and an invalid spec.
#[tokio::test]
async fn probes_metrics_and_events_tell_what_happened() {
    let env = Env::new("ops").await;
    let endpoints = Endpoints::new();
    let bitpool = start(&env, &endpoints, false, &[]);
    let (status, body) = endpoints.readyz().await;
    assert!(
        status == 503 || status == 0,
        "ready before the caches synced: {status} {body}"
    );
    wait_ready(&endpoints, "bitpool ready").await;
    let (status, _) = support::ops::get(
        &format!("http://127.0.0.1:{}/healthz", endpoints.health),
        None,
    )
    .await;
    assert_eq!(status, 200);

    capi_pool(&env, "two", capi_spec(&["10.70.0.1-10.70.0.2"], 24)).await;
    capi_pool(
        &env,
        "broken",
        capi_spec(&["10.71.0.0/24", "10.72.0.1"], 24),
    )
    .await;
    for name in ["a", "b"] {
        claim(&env, name, "InClusterIPPool", "two").await;
        wait_claim(&env, name, "served", |c| c.status == "True").await;
    }
    claim(&env, "c", "InClusterIPPool", "two").await;
    wait_claim(&env, "c", "exhausted", |c| c.reason == "PoolExhausted").await;

    let labels = format!(
        r#"{{kind="InClusterIPPool",namespace="{}",name="two"}}"#,
        env.name()
    );
    let metrics = endpoints.metrics().await;
    for (gauge, value) in [("total", 2.0), ("used", 2.0), ("free", 0.0)] {
        let series = format!("bitpool_pool_addresses_{gauge}{labels}");
        assert_eq!(
            sample(&metrics, &series),
            Some(value),
            "{series} in\n{metrics}"
        );
    }
    let allocations = r#"bitpool_allocations_total{kind="InClusterIPPool"}"#;
    assert_eq!(sample(&metrics, allocations), Some(2.0), "{metrics}");
    assert_eq!(sample(&metrics, "bitpool_leader"), Some(1.0));
    assert!(
        metrics
            .contains(r#"bitpool_reconcile_duration_seconds_count{controller="InClusterIPPool"}"#),
        "{metrics}"
    );

    wait_event_about(&env, "a", "AddressAllocated").await;
    wait_event_about(&env, "b", "AddressAllocated").await;
    wait_event_about(&env, "c", "PoolExhausted").await;
    wait_event_about(&env, "two", "PoolExhausted").await;
    wait_event_about(&env, "broken", "InvalidSpec").await;

    let claims: Api<IPAddressClaim> = env.api();
    claims
        .delete("a", &DeleteParams::default())
        .await
        .expect("delete claim a");
    wait_event_about(&env, "a", "AddressReleased").await;
    wait_claim(&env, "c", "served after a's release", |c| {
        c.status == "True"
    })
    .await;
    wait_event_about(&env, "c", "AddressAllocated").await;
    let metrics = endpoints.metrics().await;
    assert_eq!(sample(&metrics, allocations), Some(3.0), "{metrics}");
    let releases = r#"bitpool_releases_total{kind="InClusterIPPool"}"#;
    assert_eq!(sample(&metrics, releases), Some(1.0), "{metrics}");
    assert_warnings_name_objects(&bitpool);
}

/// A burst is told on its pool, not claim by claim: 40 claims made while bitpool is stopped are
/// served in its first reconcile of the pool, and released in one after they are deleted while it
/// is stopped again; each way, one Event on the pool counts them and no claim gets one.
#[tokio::test]
async fn a_burst_is_told_on_its_pool_not_claim_by_claim() {
    const CLAIMS: usize = 40;
    let env = Env::new("opsburst").await;
    capi_pool(&env, "wide", capi_spec(&["10.73.0.0/24"], 24)).await;
    for i in 0..CLAIMS {
        claim(&env, &format!("b-{i:02}"), "InClusterIPPool", "wide").await;
    }
    let endpoints = Endpoints::new();
    let mut bitpool = start(&env, &endpoints, false, &[]);
    wait_all_ready(&env, CLAIMS, WAIT).await;
    let allocated = format!("allocated {CLAIMS} addresses, one to each of {CLAIMS} claims");
    wait_event_noting(&env, "wide", "AddressAllocated", &allocated).await;
    bitpool.terminate();
    assert!(bitpool.wait_exit(WAIT), "bitpool did not stop");

    let claims: Api<IPAddressClaim> = env.api();
    claims
        .delete_collection(&DeleteParams::default(), &Default::default())
        .await
        .expect("delete the claims");
    let _bitpool = start(&env, &endpoints, false, &[]);
    eventually("every claim gone", WAIT, || async {
        claims
            .list(&Default::default())
            .await
            .ok()
            .filter(|l| l.items.is_empty())
            .map(drop)
    })
    .await;
    let released = format!("the addresses of {CLAIMS} deleted claims went back to the pool");
    wait_event_noting(&env, "wide", "AddressReleased", &released).await;
    let events: Api<Event> = env.api();
    let told_claims: Vec<String> = events
        .list(&Default::default())
        .await
        .expect("list the Events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("IPAddressClaim"))
        .map(|e| {
            let about = e.regarding.and_then(|r| r.name).unwrap_or_default();
            let by = e.reporting_instance.unwrap_or_default();
            let reason = e.reason.unwrap_or_default();
            format!(
                "{reason} about {about} by {by}: {}",
                e.note.unwrap_or_default()
            )
        })
        .collect();
    assert!(
        told_claims.is_empty(),
        "claims told one by one: {told_claims:?}"
    );
}

/// Without `--insecure-diagnostics`, `/metrics` is HTTPS and answers only callers the API
/// server authenticates and allows `get` on `/metrics`.
#[tokio::test]
async fn secure_metrics_ask_the_api_server_who_may_read_them() {
    let env = Env::new("opsauth").await;
    let endpoints = Endpoints::new();
    let _bitpool = start(&env, &endpoints, true, &[]);
    wait_ready(&endpoints, "bitpool ready").await;

    let (status, body) = endpoints.secure_metrics(None).await;
    assert_eq!(status, 401, "no token: {body}");
    let (status, _) = endpoints.secure_metrics(Some("not-a-token")).await;
    assert_eq!(status, 401, "a token the API server does not know");

    let token = service_account(&env, "scraper").await;
    let (status, body) = endpoints.secure_metrics(Some(&token)).await;
    assert_eq!(status, 403, "a known caller without the right: {body}");
    assert!(body.contains("scraper"), "{body}");

    let name = format!("{}-metrics-reader", env.name());
    let roles: Api<ClusterRole> = Api::all(env.client.clone());
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": { "name": name },
        "rules": [{ "nonResourceURLs": ["/metrics"], "verbs": ["get"] }]
    }))
    .expect("a ClusterRole");
    roles
        .create(&PostParams::default(), &role)
        .await
        .expect("create the role");
    bind_cluster_role(&env, &name, &name, "scraper").await;
    let metrics = eventually("the scraper may read /metrics", WAIT, || async {
        let (status, body) = endpoints.secure_metrics(Some(&token)).await;
        (status == 200).then_some(body)
    })
    .await;
    assert!(metrics.contains("bitpool_leader 1"), "{metrics}");
    let bindings: Api<ClusterRoleBinding> = Api::all(env.client.clone());
    let _ = bindings.delete(&name, &DeleteParams::default()).await;
    let _ = roles.delete(&name, &DeleteParams::default()).await;
}

/// The election identity a replica logged when it joined.
fn joined_as(bitpool: &Bitpool) -> String {
    let log = std::fs::read_to_string(&bitpool.log).unwrap_or_default();
    log.lines()
        .filter(|l| l.contains("leader election joined"))
        .find_map(|l| {
            let rest = &l[l.find("identity=")? + "identity=".len()..];
            Some(
                rest.split_whitespace()
                    .next()?
                    .trim_matches('"')
                    .to_string(),
            )
        })
        .unwrap_or_else(|| panic!("no identity in {}", bitpool.log.display()))
}

/// Short, so the handover test waits little.
const LEASE_DURATION: Duration = Duration::from_secs(4);

fn election_args(env: &Env) -> Vec<String> {
    vec![
        "--leader-elect".into(),
        format!(
            "--leader-elect-lease-duration={}s",
            LEASE_DURATION.as_secs()
        ),
        "--leader-elect-renew-deadline=3s".into(),
        format!("--leader-election-id={}-leader", env.name()),
    ]
}

fn start_candidate(env: &Env, endpoints: &Endpoints) -> Bitpool {
    let args = election_args(env);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    start(env, endpoints, false, &args)
}

async fn wait_standby(endpoints: &Endpoints, what: &str) {
    eventually(what, WAIT, || async {
        let (status, body) = endpoints.readyz().await;
        (status == 503 && body.contains("standby")).then_some(())
    })
    .await;
}

/// Two replicas: one leads, the other keeps warm caches and writes nothing; SIGKILL of the
/// leader in the middle of a burst hands over within the lease duration with no address handed
/// out twice; SIGTERM releases the lease for the next standby.
#[tokio::test]
async fn a_killed_leader_hands_over_mid_burst_without_duplicates() {
    let env = Env::new("leader").await;
    capi_pool(&env, "pool", capi_spec(&["10.73.0.0/22"], 22)).await;
    let (first_endpoints, second_endpoints) = (Endpoints::new(), Endpoints::new());
    let mut first = start_candidate(&env, &first_endpoints);
    wait_ready(&first_endpoints, "the first replica leads").await;
    let mut second = start_candidate(&env, &second_endpoints);
    wait_standby(&second_endpoints, "the second replica stands by").await;

    let claims = 600;
    let creating = burst(&env, "burst", "InClusterIPPool", "pool", claims);
    let kill_mid_burst = async {
        wait_addresses(&env, 50, "the leader to serve part of the burst").await;
        let standby = second_endpoints.metrics().await;
        assert_eq!(sample(&standby, "bitpool_leader"), Some(0.0), "{standby}");
        assert!(
            !standby.contains("bitpool_allocations_total"),
            "the standby allocated: {standby}"
        );
        first.kill();
        let killed = tokio::time::Instant::now();
        // The standby takes the lease when it expires, at most a lease duration after the last
        // renewal; the slack is for a machine busy with the burst.
        wait_ready_within(
            &second_endpoints,
            "the standby takes over",
            LEASE_DURATION * 3,
        )
        .await;
        eprintln!(
            "handover after SIGKILL took {:?} (lease duration {LEASE_DURATION:?})",
            killed.elapsed()
        );
    };
    tokio::join!(creating, kill_mid_burst);
    assert_consistent(&env, "InClusterIPPool", "pool", claims, WAIT).await;
    let leader = second_endpoints.metrics().await;
    let allocated = sample(
        &leader,
        r#"bitpool_allocations_total{kind="InClusterIPPool"}"#,
    );
    assert!(
        allocated.is_some_and(|n| n > 0.0),
        "the new leader served the rest: {leader}"
    );

    // A graceful stop gives the lease up at once rather than letting it expire.
    let third_endpoints = Endpoints::new();
    let _third = start_candidate(&env, &third_endpoints);
    wait_standby(&third_endpoints, "the third replica stands by").await;
    second.terminate();
    assert!(
        second.wait_exit(Duration::from_secs(30)),
        "the leader stops on SIGTERM"
    );
    let stopped_identity = joined_as(&second);
    let leases: Api<Lease> = env.api();
    let holder = leases
        .get(&format!("{}-leader", env.name()))
        .await
        .expect("the lease")
        .spec
        .and_then(|s| s.holder_identity);
    assert_ne!(
        holder.as_deref(),
        Some(stopped_identity.as_str()),
        "the lease still names the stopped leader"
    );
    wait_ready(&third_endpoints, "the third replica takes over").await;
}
