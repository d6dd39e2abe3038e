//! Machines whose clocks are wrong, made with libfaketime against the real control plane: no
//! timestamp one process writes for another is taken on its own clock, a process whose clock is
//! far off refuses to lead and says so, and one whose clock is behind the server's certificate
//! says what to fix.

mod support;

use std::time::Duration;

use bitpool::api::capi::IPAddressClaim;
use bitpool::ipam::ledger::REBUILD_FENCE;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams};
use support::build::*;
use support::check::*;
use support::wait::*;
use support::{Bitpool, Env, eventually};

/// The API server's time now: the creation time of an object written for the purpose.
async fn server_now(env: &Env) -> Timestamp {
    let api: Api<ConfigMap> = env.api();
    let probe = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: None,
            generate_name: Some("clock-".into()),
            ..env.meta("unused")
        },
        ..Default::default()
    };
    let created = create(&api, &probe).await;
    let at = created
        .metadata
        .creation_timestamp
        .expect("the server sets creationTimestamp")
        .0;
    let name = created.metadata.name.expect("a generated name");
    let _ = api.delete(&name, &DeleteParams::default()).await;
    at
}

/// The claims of the test namespace whose name starts with `prefix` that hold an address.
async fn served(env: &Env, prefix: &str) -> Vec<String> {
    let claims: Api<IPAddressClaim> = env.api();
    let list = claims
        .list(&ListParams::default())
        .await
        .expect("list claims");
    list.items
        .into_iter()
        .filter(|c| {
            c.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(prefix))
        })
        .filter(|c| {
            c.status
                .as_ref()
                .and_then(|s| s.address_ref.as_ref())
                .is_some_and(|r| !r.name.is_empty())
        })
        .filter_map(|c| c.metadata.name)
        .collect()
}

/// Beside a process with a correct clock, one whose clock runs two minutes ahead: when the
/// ledger is lost, the rebuild fence starts at the server's time and holds for its whole length
/// for both (before, the fast one ended it at once for everybody), and then all is served once.
#[tokio::test]
async fn a_clock_ahead_neither_shortens_nor_stretches_the_rebuild_fence() {
    let env = Env::new("clockfence").await;
    let correct = Bitpool::start(env.name(), &[]);
    let ahead = Bitpool::start_with_clock(env.name(), "+120s", &[]);
    capi_pool(&env, "fenced", capi_spec(&["10.64.0.0/24"], 24)).await;
    burst(&env, "before", "InClusterIPPool", "fenced", 10).await;
    assert_consistent(&env, "InClusterIPPool", "fenced", 10, WAIT).await;

    let ledgers: Api<ConfigMap> = env.api();
    let ledger = env.ledger_name("InClusterIPPool", "fenced");
    ledgers
        .delete(&ledger, &DeleteParams::default())
        .await
        .expect("delete the ledger");
    burst(&env, "after", "InClusterIPPool", "fenced", 10).await;
    let rebuilt = eventually("the ledger is rebuilt and fenced", WAIT, || async {
        env.ledger("InClusterIPPool", "fenced").await?.rebuilt_at
    })
    .await;
    let rebuilt: Timestamp = rebuilt.parse().expect("rebuiltAt is RFC 3339");
    let created = ledgers
        .get(&ledger)
        .await
        .expect("the rebuilt ledger")
        .metadata
        .creation_timestamp
        .expect("creationTimestamp")
        .0;
    let apart = rebuilt.duration_since(created).unsigned_abs();
    assert!(
        apart <= Duration::from_secs(3),
        "the fence starts at {rebuilt}, the rebuilt ledger was written at {created} by the server's clock"
    );

    // Until the fence ends by the server's clock (less a second of measurement), no new claim
    // holds an address.
    let fence_end = rebuilt + REBUILD_FENCE - Duration::from_secs(1);
    while server_now(&env).await < fence_end {
        let early = served(&env, "after").await;
        assert!(
            early.is_empty(),
            "served during the rebuild fence (ends {fence_end}): {early:?}; logs {:?} {:?}",
            correct.log,
            ahead.log
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_consistent(&env, "InClusterIPPool", "fenced", 20, AFTER_FENCE).await;
    assert_warnings_name_objects(&correct);
    assert_warnings_name_objects(&ahead);
}

/// A candidate whose clock is two minutes ahead of the API server's refuses to join the leader
/// election, in one line that says by how much and what to do, and writes nothing.
#[tokio::test]
async fn a_clock_far_off_refuses_to_lead() {
    let env = Env::new("clocklead").await;
    let lease = format!("--leader-election-id={}-leader", env.name());
    let mut ahead = Bitpool::start_with_clock(env.name(), "+120s", &["--leader-elect", &lease]);
    assert!(
        ahead.wait_exit(Duration::from_secs(60)),
        "a candidate 120 s ahead kept running (log: {:?})",
        ahead.log
    );
    let log = std::fs::read_to_string(&ahead.log).expect("read the log");
    let refusal = log
        .lines()
        .find(|l| l.contains("refusing to take part in leader election"))
        .unwrap_or_else(|| panic!("no refusal in {:?}:\n{log}", ahead.log));
    assert!(
        refusal.contains("ahead of the API server's") && refusal.contains("NTP"),
        "{refusal}"
    );
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = env.api();
    let taken = leases
        .get_opt(&format!("{}-leader", env.name()))
        .await
        .expect("read the lease");
    assert!(taken.is_none(), "the refused candidate took the lease");
}

/// A process whose clock is before the API server's certificate was issued cannot connect: its
/// one-line error says that the clock is the likely cause.
#[tokio::test]
async fn a_clock_behind_the_servers_certificate_is_named() {
    let env = Env::new("clockcert").await;
    let mut behind = Bitpool::start_with_clock(env.name(), "-400d", &[]);
    assert!(
        behind.wait_exit(Duration::from_secs(60)),
        "a process 400 days behind kept running (log: {:?})",
        behind.log
    );
    let log = std::fs::read_to_string(&behind.log).expect("read the log");
    assert!(
        log.contains("not valid yet by this machine's clock"),
        "no word of the clock in {:?}:\n{log}",
        behind.log
    );
}
