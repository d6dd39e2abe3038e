//! An HTTP relay to the API server that holds back the lists of one resource (and the watches
//! that begin with one) until the test releases them, as a server slow to list 100,000 objects
//! would; every other request passes at once, among them a list of one object and a watch from a
//! given version (what bitpool follows the changes with while a list is coming). It speaks plain HTTP on 127.0.0.1 and reaches the server as the test's own
//! client does, as `kubectl proxy` would.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kube::Client;
use kube::client::Body;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Headers of one hop, which the relay's own connections replace.
const HOP_HEADERS: [&str; 6] = [
    "host",
    "connection",
    "keep-alive",
    "content-length",
    "transfer-encoding",
    "upgrade",
];

pub struct Holding {
    pub addr: SocketAddr,
    released: watch::Sender<bool>,
    held: Arc<AtomicUsize>,
    following: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

/// What every relayed request shares.
#[derive(Clone)]
struct Relay {
    client: Client,
    /// The path ending of the collection held back: `/<plural>`.
    suffix: String,
    released: watch::Receiver<bool>,
    held: Arc<AtomicUsize>,
    following: Arc<AtomicUsize>,
}

impl Holding {
    /// Relays to `client`'s API server, holding back every list of a collection named
    /// `resource` (its plural, in any group, version and namespace) until [`Self::release`].
    pub async fn start(client: Client, resource: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the relay");
        let addr = listener.local_addr().expect("the relay's address");
        let (released, receiver) = watch::channel(false);
        let held = Arc::new(AtomicUsize::new(0));
        let following = Arc::new(AtomicUsize::new(0));
        let relay = Relay {
            client,
            suffix: format!("/{resource}"),
            released: receiver,
            held: held.clone(),
            following: following.clone(),
        };
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let relay = relay.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request| relay.clone().forward(request));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            released,
            held,
            following,
            task,
        }
    }

    /// How many requests were held back so far.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// How many watches of the resource's changes from a given version passed so far.
    pub fn following(&self) -> usize {
        self.following.load(Ordering::SeqCst)
    }

    /// Lets every held request through, and every later one at once.
    pub fn release(&self) {
        self.released.send_replace(true);
    }

    /// A kubeconfig, written as `name`, whose server is this relay.
    pub fn kubeconfig(&self, name: &str) -> PathBuf {
        let config = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "held", "cluster": {"server": format!("http://{}", self.addr)}}],
            "users": [{"name": "held", "user": {}}],
            "contexts": [{"name": "held", "context": {"cluster": "held", "user": "held"}}],
            "current-context": "held",
        });
        let path = super::root()
            .join("target/test-kubeconfigs")
            .join(format!("{name}-held.yaml"));
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("create the folder");
        std::fs::write(&path, config.to_string()).expect("write the kubeconfig");
        path
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Relay {
    async fn forward(mut self, request: Request<Incoming>) -> Result<Response<Body>, Infallible> {
        let path = request.uri().path();
        if request.method() == Method::GET && path.ends_with(&self.suffix) {
            match Reading::of(request.uri().query().unwrap_or("")) {
                Reading::Existing => {
                    self.held.fetch_add(1, Ordering::SeqCst);
                    let _ = self.released.wait_for(|released| *released).await;
                }
                Reading::Changes => {
                    self.following.fetch_add(1, Ordering::SeqCst);
                }
                Reading::OneObject => {}
            }
        }
        let (parts, body) = request.into_parts();
        let body = match body.collect().await {
            Ok(body) => body.to_bytes(),
            Err(e) => return Ok(failed(format!("reading the request: {e}"))),
        };
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut forwarded = Request::builder().method(parts.method).uri(target);
        for (name, value) in &parts.headers {
            if !HOP_HEADERS.contains(&name.as_str()) {
                forwarded = forwarded.header(name, value);
            }
        }
        let forwarded = match forwarded.body(Body::from(body.to_vec())) {
            Ok(request) => request,
            Err(e) => return Ok(failed(format!("building the request: {e}"))),
        };
        match self.client.send(forwarded).await {
            Ok(response) => {
                let (mut parts, body) = response.into_parts();
                for name in HOP_HEADERS {
                    parts.headers.remove(name);
                }
                Ok(Response::from_parts(parts, body))
            }
            Err(e) => Ok(failed(format!("relaying to the API server: {e}"))),
        }
    }
}

/// What a GET of a collection asks for.
#[derive(Debug, PartialEq)]
enum Reading {
    /// Every existing object: a list, or a watch that begins with one (no version given, or
    /// `sendInitialEvents`).
    Existing,
    /// The changes after a given version.
    Changes,
    /// A list of one object, for the collection's current version.
    OneObject,
}

impl Reading {
    fn of(query: &str) -> Self {
        let params: Vec<(&str, &str)> = query
            .split('&')
            .filter_map(|pair| pair.split_once('='))
            .collect();
        let value = |key: &str| params.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        let watch = matches!(value("watch"), Some("true" | "1"));
        let versioned = value("resourceVersion").is_some_and(|v| !v.is_empty() && v != "0");
        match watch {
            true if versioned && value("sendInitialEvents") != Some("true") => Self::Changes,
            true => Self::Existing,
            false if value("limit") == Some("1") => Self::OneObject,
            false => Self::Existing,
        }
    }
}

fn failed(message: String) -> Response<Body> {
    let mut response = Response::new(Body::from(message.into_bytes()));
    *response.status_mut() = StatusCode::BAD_GATEWAY;
    response
}
