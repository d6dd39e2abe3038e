//! An in-memory API server for unit tests: a client whose requests meet a script of expected
//! calls and their answers, and a context of empty caches around it. A call off the script, or
//! one left unmade, fails the test.

use std::sync::Arc;
use std::time::Duration;

use hyper::{Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use kube::runtime::reflector::Store;
use tokio::task::JoinHandle;

use super::context::{Context, Groups, Settings};
use super::index::Index;
use crate::ops::Ops;
use crate::ops::events::Events;
use crate::ops::lease::Leadership;
use crate::ops::metrics::Metrics;

/// One call the fake server expects, and what it answers.
pub struct Exchange {
    /// `GET`, `PUT`, `POST`, …
    pub method: &'static str,
    /// A part of the request's path and query that names what is asked for.
    pub path: String,
    pub status: u16,
    pub body: serde_json::Value,
}

impl Exchange {
    /// `method` on `path` answered with `status` and `body`.
    pub fn new(method: &'static str, path: &str, status: u16, body: serde_json::Value) -> Self {
        Self {
            method,
            path: path.to_string(),
            status,
            body,
        }
    }

    /// `method` on `path` answered with the API server's Status for `code` and `reason`.
    pub fn status(method: &'static str, path: &str, code: u16, reason: &str) -> Self {
        let status = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": reason, "reason": reason, "code": code,
        });
        Self::new(method, path, code, status)
    }
}

/// A request the fake server was sent: its method, path and query, and body.
#[derive(Debug)]
pub struct Seen {
    pub call: String,
    pub body: serde_json::Value,
}

/// A client served by `script`, in order, and the server's task, which ends with the requests
/// it was sent once the script is done.
pub fn serve(script: Vec<Exchange>) -> (Client, JoinHandle<Vec<Seen>>) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let server = tokio::spawn(async move {
        let mut seen = Vec::new();
        for exchange in script {
            let Some((request, respond)) = handle.next_request().await else {
                panic!(
                    "the client went before {} {}",
                    exchange.method, exchange.path
                );
            };
            let call = format!("{} {}", request.method(), request.uri());
            let bytes = http_body_util::BodyExt::collect(request.into_body())
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
            assert!(
                call.starts_with(exchange.method) && call.contains(&exchange.path),
                "expected {} …{}…, was sent {call}",
                exchange.method,
                exchange.path
            );
            let answer = Response::builder()
                .status(StatusCode::from_u16(exchange.status).unwrap_or(StatusCode::OK))
                .body(Body::from(exchange.body.to_string().into_bytes()))
                .unwrap_or_else(|e| panic!("a response: {e}"));
            respond.send_response(answer);
            seen.push(Seen { call, body });
        }
        seen
    });
    (Client::new(service, "default"), server)
}

/// A cache that stays empty.
fn empty<K: kube::Resource<DynamicType = ()> + Clone + 'static>() -> Store<K> {
    kube::runtime::reflector::store().0
}

/// What every reconcile shares, around `client`, with every cache empty and every group on.
pub fn context(client: Client) -> Context {
    let metrics = Arc::new(Metrics::new());
    Context {
        client,
        settings: Settings {
            namespace: None,
            watch_filter: None,
            ledger_namespace: "bitpool-system".into(),
            bmh_name_based_preallocation: false,
            metal3_machine_version: "v1beta1",
            groups: Groups {
                capi_ipam: true,
                metal3_ipam: true,
                migration_proxy: true,
                metal3_data: true,
            },
            concurrency: 0,
            sync_period: Duration::from_secs(600),
        },
        claims: Index::new(),
        addresses: Index::new(),
        clusters: None,
        pools: empty(),
        global_pools: empty(),
        prefix_pools: empty(),
        global_prefix_pools: empty(),
        ippools: empty(),
        ipclaims: Index::new(),
        metal3_addresses: Index::new(),
        data_templates: empty(),
        datas: empty(),
        data_claims: empty(),
        namespaces: empty(),
        ops: Arc::new(Ops::new(
            metrics.clone(),
            Events::for_tests(metrics),
            Leadership::always(),
        )),
        state: Default::default(),
    }
}
