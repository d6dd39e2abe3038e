//! API server and etcd outages in the middle of a burst, on the project's own control plane
//! (the processes are frozen with SIGSTOP, as a hung machine would leave them, and resumed).
//! Its own test binary: an outage would disturb tests running beside it.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use bitpool::api::capi::{IPAddress, IPAddressClaim};
use bitpool::api::metal3_ipam::IPClaim;
use futures::{StreamExt, stream};
use kube::api::{Api, ListParams, PostParams};
use support::build::*;
use support::check::*;
use support::wait::*;
use support::{Bitpool, Env, eventually};

/// The PID of one of the control plane's processes. Outages are made by freezing and restarting
/// the project's own control plane (hack/control-plane.sh), so these tests fail under an
/// external `$KUBECONFIG` rather than pass without testing anything.
fn plane_pid(process: &str) -> String {
    let dir = std::env::var_os("BITPOOL_CP_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/bitpool-control-plane"));
    let own = dir.join("kubeconfig");
    assert!(
        support::kubeconfig_path() == &own,
        "outages need the project's own control plane ({}): unset KUBECONFIG",
        own.display()
    );
    let pid = std::fs::read_to_string(dir.join(format!("{process}.pid")))
        .unwrap_or_else(|e| panic!("the control plane's {process}.pid: {e}"));
    pid.trim().to_string()
}

/// Held by each test for its whole run: one test's outage (a restart gives kube-apiserver a new
/// PID) must not meet another's.
static ONE_OUTAGE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Freezes `pid` for `how_long`, then resumes it (also if the test panics meanwhile).
async fn freeze(pid: &str, how_long: Duration) {
    struct Resume(String);
    impl Drop for Resume {
        fn drop(&mut self) {
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &self.0])
                .status();
        }
    }
    let status = std::process::Command::new("kill")
        .args(["-STOP", pid])
        .status()
        .expect("run kill");
    assert!(status.success(), "SIGSTOP {pid}");
    let _resume = Resume(pid.to_string());
    tokio::time::sleep(how_long).await;
}

/// Freezes etcd for 10 s once `served` reaches 50, then the API server for 10 s once it
/// reaches 200: both in the middle of a burst.
async fn outages_mid_burst<F, Fut>(served: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = usize>,
{
    let (etcd, apiserver) = (plane_pid("etcd"), plane_pid("kube-apiserver"));
    eventually("the burst under way", WAIT, || async {
        (served().await >= 50).then_some(())
    })
    .await;
    freeze(&etcd, Duration::from_secs(10)).await;
    eventually("the burst resumed", WAIT, || async {
        (served().await >= 200).then_some(())
    })
    .await;
    freeze(&apiserver, Duration::from_secs(10)).await;
}

/// How many CAPI IPAddresses the test namespace holds (0 while the server does not answer).
async fn capi_addresses(env: &Env) -> usize {
    let addresses: Api<IPAddress> = env.api();
    addresses
        .list_metadata(&ListParams::default())
        .await
        .map(|l| l.items.len())
        .unwrap_or_default()
}

/// Creates `objects` 16 at a time, each retried through the outages until the server has it.
async fn create_through_outages<K>(api: &Api<K>, objects: impl Iterator<Item = K>)
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let creations = objects.map(|object| async move {
        loop {
            match api.create(&PostParams::default(), &object).await {
                Ok(_) => return,
                Err(kube::Error::Api(s)) if s.is_already_exists() => return,
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    });
    stream::iter(creations)
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
}

#[tokio::test]
async fn etcd_and_api_server_outages_mid_burst_lose_nothing() {
    let _alone = ONE_OUTAGE_AT_A_TIME.lock().await;
    let env = Env::new("outage").await;
    capi_pool(&env, "pool", capi_spec(&["10.80.0.0/23"], 23)).await;
    let first = Bitpool::start(env.name(), &[]);
    let second = Bitpool::start(env.name(), &[]);
    let claims = (0..500).map(|i| {
        let name = format!("c-{i:04}");
        claim_object(&env, &name, "InClusterIPPool", "pool")
    });
    let api: Api<IPAddressClaim> = env.api();
    futures::join!(
        outages_mid_burst(|| capi_addresses(&env)),
        create_through_outages(&api, claims)
    );
    let settled = Duration::from_secs(300);
    assert_consistent(&env, "InClusterIPPool", "pool", 500, settled).await;
    assert_warnings_name_objects(&first);
    assert_warnings_name_objects(&second);
}

/// The same outages in the middle of a burst on a Metal3 pool serving IPClaims and
/// IPAddressClaims mixed, and on a prefix pool, served by two processes: every claim of each
/// kind ends with one address object of its own, none is held twice, and each ledger lists
/// exactly the live objects.
#[tokio::test]
async fn outages_mid_burst_on_a_metal3_and_a_prefix_pool_lose_nothing() {
    let _alone = ONE_OUTAGE_AT_A_TIME.lock().await;
    let env = Env::new("outage-kinds").await;
    metal3_pool(&env, "m3", metal3_spec("10.81.0.1", "10.81.3.254", 22)).await;
    prefix_pool(&env, "pp", prefix_spec(&["fd00:81::/52"], 64)).await;
    let first = Bitpool::start(env.name(), &[]);
    let second = Bitpool::start(env.name(), &[]);
    let ipclaims = (0..150).map(|i| ipclaim_object(&env, &format!("m-{i:04}"), "m3"));
    let metal3_claims = (0..150).map(|i| claim_object(&env, &format!("c-{i:04}"), "IPPool", "m3"));
    let prefix_claims = (0..200).map(|i| {
        let name = format!("p-{i:04}");
        claim_object(&env, &name, "InClusterPrefixPool", "pp")
    });
    let (ipclaim_api, claims): (Api<IPClaim>, Api<IPAddressClaim>) = (env.api(), env.api());
    futures::join!(
        outages_mid_burst(|| capi_addresses(&env)),
        create_through_outages(&ipclaim_api, ipclaims),
        create_through_outages(&claims, metal3_claims.chain(prefix_claims)),
    );
    let settled = Duration::from_secs(300);
    assert_metal3_consistent(&env, "m3", settled).await;
    assert_prefixes_consistent(&env, "pp", 200, settled).await;
    assert_warnings_name_objects(&first);
    assert_warnings_name_objects(&second);
}

/// Stops the control plane's kube-apiserver for `down`, then starts it again: every watch ends,
/// and each client's watches come back after backoffs of their own, in any order.
fn restart_apiserver(down: Duration) {
    let status = std::process::Command::new(support::root().join("hack/control-plane.sh"))
        .args(["restart-apiserver", &down.as_secs().to_string()])
        .status()
        .expect("run hack/control-plane.sh restart-apiserver");
    assert!(status.success(), "kube-apiserver did not come back");
}

/// A Metal3 pool serving IPClaims and IPAddressClaims across a kube-apiserver restart, with new
/// claims of both kinds created as soon as it is back, while every watch relists: each claim
/// ends with exactly one address object. The pool names its objects after the address, so only
/// bitpool keeps a claim from getting a second one while its caches lag (it once gave each of
/// 40 such claims 22).
#[tokio::test]
async fn a_restarted_api_server_leaves_each_metal3_claim_one_address() {
    let _alone = ONE_OUTAGE_AT_A_TIME.lock().await;
    plane_pid("kube-apiserver");
    let env = Env::new("restart-m3").await;
    metal3_pool(&env, "m3", metal3_spec("10.90.0.1", "10.90.3.254", 22)).await;
    let bitpool = Bitpool::start(env.name(), &[]);
    for i in 0..60 {
        ipclaim(&env, &format!("before-{i:02}"), "m3").await;
    }
    for i in 0..20 {
        claim(&env, &format!("capi-before-{i:02}"), "IPPool", "m3").await;
    }
    assert_metal3_consistent(&env, "m3", WAIT).await;

    restart_apiserver(Duration::from_secs(20));
    for i in 0..40 {
        ipclaim(&env, &format!("after-{i:02}"), "m3").await;
    }
    for i in 0..10 {
        claim(&env, &format!("capi-after-{i:02}"), "IPPool", "m3").await;
    }
    assert_metal3_consistent(&env, "m3", Duration::from_secs(180)).await;
    assert_warnings_name_objects(&bitpool);
}
