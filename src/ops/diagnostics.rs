//! `/metrics` on `--diagnostics-address`, as Cluster API managers serve it: over HTTPS with a
//! certificate made at start-up, to callers whose bearer token the API server authenticates
//! (TokenReview) and allows `get` on the non-resource URL `/metrics` (SubjectAccessReview);
//! with `--insecure-diagnostics`, over plain HTTP to anyone. Decisions are remembered for a
//! minute by the token's SHA-256, and asked on a client of their own (with its own rate limit):
//! callers of `/metrics`, authenticated or not, cost the controllers nothing.

use std::sync::Arc;
use std::time::Instant;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};

use super::metrics::{CONTENT_TYPE, Metrics};
use crate::net::decisions::Remembered;
use crate::net::http::{self, Reply};

/// The path Prometheus scrapes.
pub const METRICS_PATH: &str = "/metrics";

/// Who may read the metrics.
#[derive(Clone)]
pub enum Access {
    /// Anyone (`--insecure-diagnostics`).
    Open,
    /// Callers the API server authenticates and authorises.
    Authorized(Client, Arc<Decisions>),
}

type Decision = Result<(), (StatusCode, String)>;

/// Authorization decisions by the SHA-256 of the token (the token itself is never kept).
#[derive(Default)]
pub struct Decisions(Remembered<[u8; 32], Decision>);

impl Decisions {
    fn key(token: &str) -> [u8; 32] {
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        let mut key = [0u8; 32];
        key.copy_from_slice(digest.as_ref());
        key
    }

    /// The decision about `token` made less than a minute before `now`.
    fn get(&self, token: &str, now: Instant) -> Option<Decision> {
        self.0.get(&Self::key(token), now)
    }

    /// Remembers a decision; one the API server could not make (503) is not remembered.
    fn put(&self, token: &str, now: Instant, decision: &Decision) {
        if matches!(decision, Err((StatusCode::SERVICE_UNAVAILABLE, _))) {
            return;
        }
        self.0.put(Self::key(token), now, decision.clone());
    }
}

fn text(status: StatusCode, body: &str) -> Reply {
    http::reply(status, "text/plain; charset=utf-8", body.to_string())
}

/// The handler of the diagnostics server.
pub fn handler(metrics: Arc<Metrics>, access: Access) -> http::Handler {
    Arc::new(move |request| {
        let (metrics, access) = (metrics.clone(), access.clone());
        Box::pin(async move { answer(&metrics, &access, request).await })
    })
}

async fn answer(metrics: &Metrics, access: &Access, request: Request<Incoming>) -> Reply {
    if request.uri().path() != METRICS_PATH {
        return text(StatusCode::NOT_FOUND, "not found\n");
    }
    if request.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
    }
    if let Access::Authorized(client, decisions) = access {
        let token = request
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty());
        let Some(token) = token else {
            return text(StatusCode::UNAUTHORIZED, "Unauthorized: no bearer token\n");
        };
        let now = Instant::now();
        let decision = match decisions.get(token, now) {
            Some(decision) => decision,
            None => {
                let decision = authorize(client, token).await;
                decisions.put(token, now, &decision);
                decision
            }
        };
        if let Err((status, why)) = decision {
            return text(status, &why);
        }
    }
    http::reply(StatusCode::OK, CONTENT_TYPE, metrics.encode())
}

/// Asks the API server who `token` is and whether they may `get /metrics`.
async fn authorize(client: &Client, token: &str) -> Result<(), (StatusCode, String)> {
    let unavailable = |e: kube::Error| {
        tracing::warn!(error = %e, "cannot check a metrics caller with the API server");
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "cannot reach the API server to check the token\n".to_string(),
        )
    };
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    let reviewed = Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(unavailable)?;
    let status = reviewed.status.unwrap_or_default();
    if status.authenticated != Some(true) {
        return Err((StatusCode::UNAUTHORIZED, "Unauthorized\n".into()));
    }
    let user: UserInfo = status.user.unwrap_or_default();
    let access = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            groups: user.groups,
            uid: user.uid,
            extra: user.extra,
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(METRICS_PATH.into()),
                verb: Some("get".into()),
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let decided = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &access)
        .await
        .map_err(unavailable)?;
    if decided.status.is_some_and(|s| s.allowed) {
        Ok(())
    } else {
        let who = user.username.unwrap_or_default();
        Err((
            StatusCode::FORBIDDEN,
            format!("Forbidden: {who} may not get {METRICS_PATH}\n"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::decisions::DECISION_TTL;

    #[test]
    fn decisions_are_reused_for_a_minute_and_never_when_the_server_was_unreachable() {
        let decisions = Decisions::default();
        let start = Instant::now();
        decisions.put("token-a", start, &Ok(()));
        let forbidden = Err((StatusCode::FORBIDDEN, "Forbidden\n".to_string()));
        decisions.put("token-b", start, &forbidden);
        let unreachable = Err((StatusCode::SERVICE_UNAVAILABLE, "down\n".to_string()));
        decisions.put("token-c", start, &unreachable);
        let later = start + DECISION_TTL - std::time::Duration::from_secs(1);
        assert_eq!(decisions.get("token-a", later), Some(Ok(())));
        assert_eq!(decisions.get("token-b", later), Some(forbidden));
        assert_eq!(decisions.get("token-c", later), None);
        assert_eq!(decisions.get("token-a", start + DECISION_TTL), None);
        assert_eq!(decisions.get("unknown", later), None);
    }
}
