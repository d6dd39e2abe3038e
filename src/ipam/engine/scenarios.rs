//! Whole reconciles of one pool against an in-memory API server
//! ([`crate::runtime::fake_api`]): the calls each phase makes, in order, and what the pool and
//! its claim are left with, for the apply phase's create paths.

use std::sync::Arc;

use kube::api::ObjectMeta;
use serde_json::{Value, json};

use super::reconcile;
use crate::api::capi::{IPAddressClaim, IPAddressClaimSpec, IPPoolReference};
use crate::api::capi_pools::{
    CLAIM_FINALIZER, InClusterIPPool, InClusterIPPoolSpec, POOL_FINALIZER,
};
use crate::ipam::Context;
use crate::ipam::ledger::{LEDGER_ANNOTATION, Ledger, POOL_UID_ANNOTATION, Stored};
use crate::runtime::fake_api::{self, Answer, Exchange, Seen};

const LEDGER: &str = "/api/v1/namespaces/bitpool-system/configmaps/inclusterippool.ns.p";
const ADDRESSES: &str = "/apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/ns/ipaddresses";

/// A pool of one address, with its finalizer, that has reserved before.
fn pool() -> InClusterIPPool {
    let mut pool = InClusterIPPool::new(
        "p",
        InClusterIPPoolSpec {
            addresses: vec!["10.0.0.1".into()],
            prefix: 24,
            ..Default::default()
        },
    );
    pool.metadata = ObjectMeta {
        name: Some("p".into()),
        namespace: Some("ns".into()),
        uid: Some("pool-uid".into()),
        generation: Some(1),
        finalizers: Some(vec![POOL_FINALIZER.into()]),
        annotations: Some([(LEDGER_ANNOTATION.to_string(), "marked".into())].into()),
        ..Default::default()
    };
    pool
}

/// A claim of the pool, with its finalizer, not served yet.
fn claim() -> IPAddressClaim {
    IPAddressClaim {
        metadata: ObjectMeta {
            name: Some("c".into()),
            namespace: Some("ns".into()),
            uid: Some("claim-uid".into()),
            finalizers: Some(vec![CLAIM_FINALIZER.into()]),
            ..Default::default()
        },
        spec: IPAddressClaimSpec {
            cluster_name: None,
            pool_ref: IPPoolReference {
                name: "p".into(),
                kind: "InClusterIPPool".into(),
                api_group: "ipam.cluster.x-k8s.io".into(),
            },
        },
        status: None,
    }
}

/// The pool's ledger, empty and whole, as the server answers it.
fn empty_ledger() -> Value {
    let ledger = Ledger {
        written_to: Some("ledger-uid".into()),
        ..Ledger::default()
    };
    let meta = ObjectMeta {
        name: Some("inclusterippool.ns.p".into()),
        namespace: Some("bitpool-system".into()),
        resource_version: Some("1".into()),
        uid: Some("ledger-uid".into()),
        annotations: Some([(POOL_UID_ANNOTATION.to_string(), "pool-uid".into())].into()),
        ..Default::default()
    };
    let mut value = serde_json::to_value(ledger.to_config_map(meta)).expect("a ConfigMap");
    value["apiVersion"] = json!("v1");
    value["kind"] = json!("ConfigMap");
    value
}

fn as_json<T: serde::Serialize>(object: &T) -> Value {
    serde_json::to_value(object).expect("serializable")
}

/// One reconcile of the pool with its claim in the cache, against `script`.
async fn reconcile_against(script: Vec<Exchange>) -> Vec<Seen> {
    reconcile_remembering(None, script).await
}

/// One reconcile of the pool with its claim in the cache, against `script`, by a process that
/// remembers `record` as the pool's ledger.
async fn reconcile_remembering(record: Option<Stored>, script: Vec<Exchange>) -> Vec<Seen> {
    let (client, server) = fake_api::serve(script);
    let shared = fake_api::context_with(client, vec![claim()], Vec::new());
    let ctx = Arc::new(Context::new(Arc::new(shared)));
    if let Some(record) = record {
        let of = crate::ipam::ledger::ledger_of(&pool(), &ctx).record_of();
        ctx.records.remember(&of, &record);
    }
    let result = reconcile(Arc::new(pool()), ctx.clone()).await;
    assert!(result.is_ok(), "{:?}", result.err());
    drop(ctx);
    server.await.expect("the fake server's task")
}

/// The ledger as its last write left it.
fn written_ledger(seen: &[Seen]) -> Ledger {
    let last = seen
        .iter()
        .rev()
        .find(|s| s.call.starts_with("PUT") && s.call.contains(LEDGER))
        .expect("a ledger write");
    let config_map = serde_json::from_value(last.body.clone()).expect("a ConfigMap");
    Ledger::from_config_map(&config_map).expect("a readable ledger")
}

/// What the claim's status write said.
fn claim_status(seen: &[Seen]) -> String {
    let write = seen
        .iter()
        .find(|s| s.call.contains("/ipaddressclaims/c/status"))
        .expect("a claim status write");
    write.body.to_string()
}

/// The calls of a reconcile that has its ledger: the claim's address reserved, its object
/// created, confirmed (transaction 2 starts from what transaction 1 wrote: no read between), and
/// the statuses written.
fn reserved_created_and_confirmed() -> Vec<Exchange> {
    vec![
        Exchange::answer("PUT", LEDGER, 200, Answer::Stored),
        Exchange::answer("POST", ADDRESSES, 201, Answer::Stored),
        Exchange::answer("PUT", LEDGER, 200, Answer::Stored),
        Exchange::new("PATCH", "/ipaddressclaims/c/status", 200, as_json(&claim())),
        Exchange::new("PATCH", "/inclusterippools/p/status", 200, as_json(&pool())),
    ]
}

#[tokio::test]
async fn a_new_claim_is_reserved_created_and_confirmed() {
    let mut script = vec![Exchange::new("GET", LEDGER, 200, empty_ledger())];
    script.extend(reserved_created_and_confirmed());
    let seen = reconcile_against(script).await;
    let created = seen
        .iter()
        .find(|s| s.call.starts_with("POST"))
        .expect("a create");
    assert_eq!(created.body["spec"]["address"], "10.0.0.1");
    let ledger = written_ledger(&seen);
    assert!(ledger.contains("10.0.0.1".parse().expect("an address")));
    assert!(ledger.pending.is_empty(), "confirmed: {:?}", ledger.pending);
    assert!(claim_status(&seen).contains("10.0.0.1"));
}

#[tokio::test]
async fn a_create_that_meets_another_claims_object_frees_its_reservation() {
    let existing = json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddress",
        "metadata": {"name": "c", "namespace": "ns", "uid": "other-uid"},
        "spec": {
            "claimRef": {"name": "someone-else"},
            "poolRef": {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "p"},
            "address": "10.0.0.1", "prefix": 24
        }
    });
    let seen = reconcile_against(vec![
        Exchange::new("GET", LEDGER, 200, empty_ledger()),
        Exchange::answer("PUT", LEDGER, 200, Answer::Stored),
        // Made meanwhile for another claim, under this claim's name.
        Exchange::status("POST", ADDRESSES, 409, "AlreadyExists"),
        Exchange::new("GET", &format!("{ADDRESSES}/c"), 200, existing),
        Exchange::answer("PUT", LEDGER, 200, Answer::Stored),
        Exchange::new("PATCH", "/ipaddressclaims/c/status", 200, as_json(&claim())),
        Exchange::new("PATCH", "/inclusterippools/p/status", 200, as_json(&pool())),
    ])
    .await;
    let ledger = written_ledger(&seen);
    assert!(ledger.is_empty(), "the reservation went back: {ledger:?}");
    let status = claim_status(&seen);
    assert!(status.contains("\"False\""), "the claim is told: {status}");
}

/// The calls of `seen`, as method and path.
fn calls(seen: &[Seen]) -> Vec<&str> {
    seen.iter().map(|s| s.call.as_str()).collect()
}

/// The pool's empty ledger as this process remembers it, at `version`.
fn remembered_at(version: &str) -> Stored {
    let ledger = Ledger {
        written_to: Some("ledger-uid".into()),
        uid: Some("ledger-uid".into()),
        ..Ledger::default()
    };
    Stored::new(ledger, Some(version.into()))
}

#[tokio::test]
async fn a_remembered_record_the_server_still_has_is_not_read_again() {
    let seen =
        reconcile_remembering(Some(remembered_at("1")), reserved_created_and_confirmed()).await;
    let reads = calls(&seen)
        .into_iter()
        .filter(|c| c.starts_with("GET"))
        .count();
    assert_eq!(reads, 0, "{:?}", calls(&seen));
    let first_write = seen
        .iter()
        .find(|s| s.call.starts_with("PUT"))
        .expect("a write");
    assert_eq!(
        first_write.body["metadata"]["resourceVersion"], "1",
        "it carries the remembered version"
    );
    assert!(claim_status(&seen).contains("10.0.0.1"));
}

#[tokio::test]
async fn a_remembered_record_changed_since_is_judged_again_from_the_server() {
    // Someone else wrote the ledger since: it now holds the pool's one address, with no object.
    let mut taken = empty_ledger();
    let held = Ledger::from_addresses(["10.0.0.1".parse().expect("an address")]);
    let held = held.to_config_map(ObjectMeta::default());
    taken["binaryData"] = as_json(&held)["binaryData"].clone();
    taken["metadata"]["resourceVersion"] = json!("2");
    let seen = reconcile_remembering(
        Some(remembered_at("1")),
        vec![
            Exchange::status("PUT", LEDGER, 409, "Conflict"),
            Exchange::new("GET", LEDGER, 200, taken),
            Exchange::new("PATCH", "/ipaddressclaims/c/status", 200, as_json(&claim())),
            Exchange::new("PATCH", "/inclusterippools/p/status", 200, as_json(&pool())),
        ],
    )
    .await;
    // Nothing is created from the outdated record: the address is someone else's now.
    assert!(
        !calls(&seen).iter().any(|c| c.starts_with("POST")),
        "{:?}",
        calls(&seen)
    );
    assert!(
        !claim_status(&seen).contains("10.0.0.1"),
        "{}",
        claim_status(&seen)
    );
}
