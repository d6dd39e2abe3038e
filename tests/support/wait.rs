//! Waiting for the cluster to reach a state: polled, with a deadline and a message that says
//! what never happened.

use std::time::Duration;

use bitpool::api::capi::{IPAddress, IPAddressClaim};
use bitpool::api::metal3_ipam::IPClaim;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, ListParams};

use super::check::ready;
use super::env::Env;

/// Polls `check` until it returns `Some`, or panics after `timeout` with `what` in the message.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_every(what, timeout, Duration::from_millis(100), check).await
}

/// [`eventually`], polling every `interval`: for checks that read many objects, against states
/// that take minutes to reach.
pub async fn eventually_every<T, F, Fut>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(interval).await;
    }
}

pub const WAIT: Duration = Duration::from_secs(90);

/// Long enough for a rebuilt ledger's fence (37 s) and the batches after it.
pub const AFTER_FENCE: Duration = Duration::from_secs(240);

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

/// Waits until the IPClaim `name` names its address.
pub async fn wait_ipclaim(env: &Env, name: &str) {
    let ipclaims: Api<IPClaim> = env.api();
    eventually(&format!("IPClaim {name} served"), WAIT, || async {
        ipclaims.get(name).await.ok()?.status?.address.map(|_| ())
    })
    .await;
}

/// Waits for an Event with `reason` in `namespace`, about the object named `about` (about any
/// object when `None`).
pub async fn wait_event_in(env: &Env, namespace: &str, about: Option<&str>, reason: &str) {
    let what = format!(
        "an Event {reason} in {namespace} about {}",
        about.unwrap_or("any object")
    );
    wait_event_matching(env, namespace, &what, |e| {
        about.is_none_or(|name| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            && e.reason.as_deref() == Some(reason)
    })
    .await;
}

/// Waits for an Event with `reason` and `note` about the object `about` of the test namespace.
pub async fn wait_event_noting(env: &Env, about: &str, reason: &str, note: &str) {
    let what = format!("an Event {reason} about {about} noting \"{note}\"");
    wait_event_matching(env, env.name(), &what, |e| {
        e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(about)
            && e.reason.as_deref() == Some(reason)
            && e.note.as_deref() == Some(note)
    })
    .await;
}

async fn wait_event_matching(
    env: &Env,
    namespace: &str,
    what: &str,
    matches: impl Fn(&Event) -> bool,
) {
    let events: Api<Event> = Api::namespaced(env.client.clone(), namespace);
    eventually(what, WAIT, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.iter().any(&matches).then_some(())
    })
    .await;
}

/// Waits for an Event with `reason` in the test namespace.
pub async fn wait_event(env: &Env, reason: &str) {
    wait_event_in(env, env.name(), None, reason).await;
}

/// Waits for an Event with `reason` about the object `name` of the test namespace.
pub async fn wait_event_about(env: &Env, name: &str, reason: &str) {
    wait_event_in(env, env.name(), Some(name), reason).await;
}

/// Waits until something listens on 127.0.0.1:`port`; `what` names it in the failure.
pub async fn wait_listening(port: u16, what: &str) {
    eventually(what, Duration::from_secs(60), || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
            .map(|_| ())
    })
    .await;
}
