//! The commit's conflict and retry paths, one scenario each, against an in-memory API server
//! ([`crate::runtime::fake_api`]): what the server answers goes in, the calls made and what the
//! commit leaves come out.

use std::net::IpAddr;
use std::sync::Arc;

use kube::api::ObjectMeta;
use serde_json::{Value, json};

use super::*;
use crate::api::capi_pools::{InClusterIPPool, InClusterIPPoolSpec};
use crate::ipam::dialect::PoolSpace;
use crate::ipam::ledger::{ClaimId, Refusal, Request};
use crate::runtime::fake_api::{self, Exchange};

/// The ledger's path, as the API server serves it.
const LEDGER: &str = "/api/v1/namespaces/bitpool-system/configmaps/inclusterippool.ns.p";

/// A pool of two addresses that has reserved before (it carries its mark).
fn pool() -> InClusterIPPool {
    let mut pool = InClusterIPPool::new(
        "p",
        InClusterIPPoolSpec {
            addresses: vec!["10.0.0.1-10.0.0.2".into()],
            prefix: 24,
            ..Default::default()
        },
    );
    pool.metadata.namespace = Some("ns".into());
    pool.metadata.uid = Some("pool-uid".into());
    pool.metadata.annotations = Some([(LEDGER_ANNOTATION.to_string(), "marked".into())].into());
    pool
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("test address")
}

/// The ledger's ConfigMap holding `addresses`, at `version`, as the server would answer it.
fn ledger_at(addresses: &[&str], version: &str) -> Value {
    let ledger = Ledger::from_addresses(addresses.iter().map(|a| ip(a)));
    let meta = ObjectMeta {
        name: Some("inclusterippool.ns.p".into()),
        namespace: Some("bitpool-system".into()),
        resource_version: Some(version.into()),
        uid: Some("ledger-uid".into()),
        annotations: Some([(POOL_UID_ANNOTATION_KEY.to_string(), "pool-uid".into())].into()),
        ..Default::default()
    };
    let mut value = serde_json::to_value(ledger.to_config_map(meta)).expect("a ConfigMap");
    value["apiVersion"] = json!("v1");
    value["kind"] = json!("ConfigMap");
    value
}

const POOL_UID_ANNOTATION_KEY: &str = crate::ipam::ledger::POOL_UID_ANNOTATION;

/// One claim asking for any address.
fn allocation() -> Intent {
    Intent {
        allocate: vec![Request {
            claim: ClaimId {
                uid: "claim-uid".into(),
                namespace: "ns".into(),
                name: "c".into(),
            },
            requested: None,
            preallocation_key: "c".into(),
        }],
        ..Default::default()
    }
}

/// What one commit of `intent` does against `script`: its result and the calls it made.
async fn commit_against(
    script: Vec<Exchange>,
    intent: Intent,
    create: bool,
) -> (Result<Committed, Error>, Vec<String>) {
    commit_from(Start::Unread, script, intent, create).await
}

/// What one commit of `intent` from `start` does against `script`.
async fn commit_from(
    start: Start,
    script: Vec<Exchange>,
    intent: Intent,
    create: bool,
) -> (Result<Committed, Error>, Vec<String>) {
    let (client, server) = fake_api::serve(script);
    let ctx = Arc::new(Context::new(Arc::new(fake_api::context(client))));
    let pool = pool();
    let base = Base {
        space: pool.space().expect("a valid pool"),
        spec: crate::ipam::spec::SpecFingerprint {
            uid: "pool-uid".into(),
            generation: 1,
        },
    };
    let ledger_ref = crate::ipam::ledger::ledger_of(&pool, &ctx);
    let result = commit(
        &ledger_ref,
        &pool,
        &ctx,
        Some(&base),
        start,
        &intent,
        create,
    )
    .await;
    drop(ctx);
    let seen = server.await.expect("the fake server's task");
    (result, seen.into_iter().map(|s| s.call).collect())
}

/// The ledger holding `addresses` as read or remembered at `version`.
fn stored_at(addresses: &[&str], version: &str) -> Stored {
    let ledger = Ledger::from_addresses(addresses.iter().map(|a| ip(a)));
    Stored::new(ledger, Some(version.into()))
}

fn lease_of(committed: &Committed) -> Option<IpAddr> {
    match committed.outcomes.get("claim-uid") {
        Some(Ok(lease)) => Some(lease.address),
        _ => None,
    }
}

#[tokio::test]
async fn a_conflict_is_recomputed_from_the_ledger_another_writer_left() {
    let script = vec![
        Exchange::new("GET", LEDGER, 200, ledger_at(&[], "1")),
        // Another process reserved 10.0.0.1 since the read.
        Exchange::status("PUT", LEDGER, 409, "Conflict"),
        Exchange::new("GET", LEDGER, 200, ledger_at(&["10.0.0.1"], "2")),
        Exchange::new(
            "PUT",
            LEDGER,
            200,
            ledger_at(&["10.0.0.1", "10.0.0.2"], "3"),
        ),
    ];
    let (result, calls) = commit_against(script, allocation(), true).await;
    let committed = result.expect("committed on the second attempt");
    assert_eq!(
        lease_of(&committed),
        Some(ip("10.0.0.2")),
        "not the other writer's"
    );
    assert!(committed.ledger.contains(ip("10.0.0.1")));
    assert_eq!(
        committed.stored.as_ref().and_then(Stored::version),
        Some("3")
    );
    assert_eq!(calls.len(), 4, "{calls:?}");
}

#[tokio::test]
async fn a_ledger_that_keeps_changing_gives_up_after_its_attempts() {
    let mut script = Vec::new();
    for attempt in 0..LEDGER_ATTEMPTS {
        let version = attempt.to_string();
        script.push(Exchange::new("GET", LEDGER, 200, ledger_at(&[], &version)));
        script.push(Exchange::status("PUT", LEDGER, 409, "Conflict"));
    }
    let (result, calls) = commit_against(script, allocation(), true).await;
    assert!(
        matches!(result, Err(Error::LedgerContention { attempts, .. }) if attempts == LEDGER_ATTEMPTS),
        "{:?}",
        result.err()
    );
    assert_eq!(calls.len(), 2 * LEDGER_ATTEMPTS);
}

#[tokio::test]
async fn a_missing_ledger_is_not_recreated_when_nothing_needs_recording() {
    let script = vec![Exchange::status("GET", LEDGER, 404, "NotFound")];
    let (result, calls) = commit_against(script, Intent::default(), false).await;
    let committed = result.expect("nothing to commit");
    assert!(committed.stored.is_none() && committed.outcomes.is_empty());
    assert_eq!(calls, vec![format!("GET {LEDGER}")]);
}

#[tokio::test]
async fn a_lost_ledger_is_rebuilt_from_the_live_objects_and_fenced() {
    let addresses = json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressList",
        "metadata": {"resourceVersion": "5"},
        "items": [{
            "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddress",
            "metadata": {"name": "a", "namespace": "ns", "uid": "a-uid"},
            "spec": {
                "claimRef": {"name": "other"},
                "poolRef": {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "p"},
                "address": "10.0.0.1", "prefix": 24
            }
        }]
    });
    let pool_now = serde_json::to_value(pool()).expect("a pool");
    let script = vec![
        Exchange::status("GET", LEDGER, 404, "NotFound"),
        // The pool carries its mark: a reservation was made, so the record was lost.
        Exchange::new("GET", "/inclusterippools/p", 200, pool_now),
        Exchange::status("GET", LEDGER, 404, "NotFound"),
        Exchange::new("GET", "/namespaces/ns/ipaddresses", 200, addresses),
        Exchange::new("POST", "/configmaps", 201, ledger_at(&["10.0.0.1"], "6")),
    ];
    let (result, calls) = commit_against(script, allocation(), true).await;
    let committed = result.expect("rebuilt");
    assert!(
        committed.ledger.contains(ip("10.0.0.1")),
        "the live object's address"
    );
    assert!(committed.ledger.rebuilt_at.is_some(), "fenced");
    assert!(
        matches!(
            committed.outcomes.get("claim-uid"),
            Some(Err(Refusal::Fenced { .. }))
        ),
        "no new address while fenced: {:?}",
        committed.outcomes
    );
    assert_eq!(
        calls.len(),
        5,
        "nothing written after the rebuild: {calls:?}"
    );
}

#[tokio::test]
async fn a_remembered_record_the_server_still_has_costs_no_read() {
    let script = vec![Exchange::new(
        "PUT",
        LEDGER,
        200,
        ledger_at(&["10.0.0.1"], "2"),
    )];
    let start = Start::Remembered(stored_at(&[], "1"));
    let (result, calls) = commit_from(start, script, allocation(), true).await;
    let committed = result.expect("committed");
    assert_eq!(lease_of(&committed), Some(ip("10.0.0.1")));
    assert_eq!(calls.len(), 1, "{calls:?}");
}

#[tokio::test]
async fn a_remembered_record_changed_since_writes_nothing_and_says_so() {
    let script = vec![Exchange::status("PUT", LEDGER, 409, "Conflict")];
    let start = Start::Remembered(stored_at(&[], "1"));
    let (result, calls) = commit_from(start, script, allocation(), true).await;
    assert!(
        matches!(result, Err(Error::LedgerOutdated { .. })),
        "{:?}",
        result.err()
    );
    assert_eq!(calls.len(), 1, "no read, no second write: {calls:?}");
}

#[tokio::test]
async fn addresses_judged_leaked_in_a_record_changed_since_are_not_freed() {
    let script = vec![
        Exchange::status("PUT", LEDGER, 409, "Conflict"),
        // The writer since may have handed 10.0.0.1 out again, its object not listed yet.
        Exchange::new("GET", LEDGER, 200, ledger_at(&["10.0.0.1"], "2")),
    ];
    let intent = Intent {
        release_unbound: vec![ip("10.0.0.1")],
        ..Default::default()
    };
    let start = Start::Read(stored_at(&["10.0.0.1"], "1"));
    let (result, calls) = commit_from(start, script, intent, false).await;
    let committed = result.expect("committed");
    assert!(committed.ledger.contains(ip("10.0.0.1")), "kept");
    assert_eq!(calls.len(), 2, "nothing left to write: {calls:?}");
}

#[tokio::test]
async fn a_remembered_record_with_nothing_to_write_is_checked_by_a_read() {
    let script = vec![Exchange::new(
        "GET",
        LEDGER,
        200,
        ledger_at(&["10.0.0.1"], "1"),
    )];
    let start = Start::Remembered(stored_at(&["10.0.0.1"], "1"));
    let (result, calls) = commit_from(start, script, Intent::default(), true).await;
    let committed = result.expect("committed");
    assert!(committed.ledger.contains(ip("10.0.0.1")));
    assert_eq!(calls, vec![format!("GET {LEDGER}")]);
}

#[tokio::test]
async fn a_remembered_record_with_nothing_to_write_and_changed_since_says_so() {
    // Someone freed 10.0.0.1 since: what was judged from the remembered record must not stand.
    let script = vec![Exchange::new("GET", LEDGER, 200, ledger_at(&[], "2"))];
    let start = Start::Remembered(stored_at(&["10.0.0.1"], "1"));
    let (result, calls) = commit_from(start, script, Intent::default(), true).await;
    assert!(
        matches!(result, Err(Error::LedgerOutdated { .. })),
        "{:?}",
        result.err()
    );
    assert_eq!(calls.len(), 1, "{calls:?}");
}
