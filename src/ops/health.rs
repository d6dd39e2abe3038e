//! `/healthz` and `/readyz` on `--health-addr`, for the kubelet's probes.
//!
//! Live while the process answers. Ready once every watch cache holds its initial list and,
//! with leader election, while this process holds the lease: the Service then sends webhook
//! calls to the one replica that also writes.

use std::sync::Arc;

use hyper::{Method, StatusCode};

use super::Ops;
use crate::net::http::{self, Reply};

/// Answers a probe.
pub fn answer(ops: &Ops, method: &Method, path: &str) -> Reply {
    let text = |status, body: String| http::reply(status, "text/plain; charset=utf-8", body);
    if method != Method::GET && method != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
    }
    match path {
        "/healthz" | "/healthz/ping" | "/livez" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" | "/readyz/ping" => match ops.not_ready() {
            None => text(StatusCode::OK, "ok\n".into()),
            Some(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {why}\n"),
            ),
        },
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

/// The handler of the health server.
pub fn handler(ops: Arc<Ops>) -> http::Handler {
    Arc::new(move |request| {
        let reply = answer(&ops, request.method(), request.uri().path());
        Box::pin(async move { reply })
    })
}
