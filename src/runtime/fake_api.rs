//! An in-memory API server for unit tests: a client whose requests meet a script of expected
//! calls and their answers, and a context of empty caches around it. A call off the script, or
//! one left unmade, fails the test.

use std::sync::Arc;

use hyper::{Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use kube::runtime::reflector::Store;
use tokio::task::JoinHandle;

use super::cached::{AddressObject, ClaimObject};
use super::context::{Context, Settings};
use super::index::Index;
use super::watched::Watched;
use crate::api::capi::{IPAddress, IPAddressClaim};
use crate::api::metal3_ipam::{IPClaim, Metal3IPAddress};
use crate::ops::Ops;
use crate::ops::events::Events;
use crate::ops::lease::Leadership;
use crate::ops::metrics::Metrics;

/// What the fake server answers a call with.
pub enum Answer {
    /// This object.
    Json(serde_json::Value),
    /// The object the call sent, as a server stores it: with a UID and a new resourceVersion.
    Stored,
    /// The object the last [`Answer::Stored`] call stored under the call's path.
    LastStored,
}

/// One call the fake server expects, and what it answers.
pub struct Exchange {
    /// `GET`, `PUT`, `POST`, …
    pub method: &'static str,
    /// A part of the request's path and query that names what is asked for.
    pub path: String,
    pub status: u16,
    pub answer: Answer,
}

impl Exchange {
    /// `method` on `path` answered with `status` and `body`.
    pub fn new(method: &'static str, path: &str, status: u16, body: serde_json::Value) -> Self {
        Self::answer(method, path, status, Answer::Json(body))
    }

    /// `method` on `path` answered with `status` and `answer`.
    pub fn answer(method: &'static str, path: &str, status: u16, answer: Answer) -> Self {
        Self {
            method,
            path: path.to_string(),
            status,
            answer,
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
        // What the Stored calls stored, by the path that reads it back.
        let mut stored = std::collections::HashMap::<String, serde_json::Value>::new();
        for (version, exchange) in (100..).zip(script) {
            let Some((request, respond)) = handle.next_request().await else {
                panic!(
                    "the client went before {} {}",
                    exchange.method, exchange.path
                );
            };
            let call = format!("{} {}", request.method(), request.uri());
            let path = request.uri().path().to_string();
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
            let answer = match exchange.answer {
                Answer::Json(answer) => answer,
                Answer::Stored => {
                    let mut object = body.clone();
                    object["metadata"]["resourceVersion"] = version.to_string().into();
                    let uid = object["metadata"]["uid"].as_str().unwrap_or("stored-uid");
                    object["metadata"]["uid"] = uid.to_string().into();
                    let read_at = match call.starts_with("POST") {
                        true => format!(
                            "{path}/{}",
                            object["metadata"]["name"].as_str().unwrap_or_default()
                        ),
                        false => path.clone(),
                    };
                    stored.insert(read_at, object.clone());
                    object
                }
                Answer::LastStored => stored.get(&path).cloned().unwrap_or_default(),
            };
            let answer = Response::builder()
                .status(StatusCode::from_u16(exchange.status).unwrap_or(StatusCode::OK))
                .body(Body::from(answer.to_string().into_bytes()))
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

/// What every reconcile shares, around `client`, with every cache listed and empty but the
/// IPAddressClaims' and IPAddresses', which hold `claims` and `addresses`, and every group on.
pub fn context_with(
    client: Client,
    claims: Vec<IPAddressClaim>,
    addresses: Vec<IPAddress>,
) -> Context {
    let listed_claims = Watched::new(ClaimObject::of_capi);
    listed_claims.load(claims);
    let listed_addresses = Watched::new(AddressObject::of_capi);
    listed_addresses.load(addresses);
    let ipclaims = Watched::<IPClaim, _>::new(ClaimObject::of_metal3);
    ipclaims.load([]);
    let metal3_addresses = Watched::<Metal3IPAddress, _>::new(AddressObject::of_metal3);
    metal3_addresses.load([]);
    Context {
        claims: listed_claims.index.clone(),
        addresses: listed_addresses.index.clone(),
        ipclaims: ipclaims.index.clone(),
        metal3_addresses: metal3_addresses.index.clone(),
        ..context(client)
    }
}

/// What every reconcile shares, around `client`, with every cache empty and every group on.
pub fn context(client: Client) -> Context {
    let metrics = Arc::new(Metrics::new());
    Context {
        client,
        settings: Settings::for_tests(),
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
