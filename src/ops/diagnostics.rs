//! `/metrics` on `--diagnostics-address`, as Cluster API managers serve it: over HTTPS with a
//! certificate made at start-up, to callers whose bearer token the API server authenticates
//! (TokenReview) and allows `get` on the non-resource URL `/metrics` (SubjectAccessReview);
//! with `--insecure-diagnostics`, over plain HTTP to anyone.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};

use super::metrics::{CONTENT_TYPE, Metrics};
use crate::net::http::{self, Reply};

pub const METRICS_PATH: &str = "/metrics";

/// Who may read the metrics.
#[derive(Clone)]
pub enum Access {
    /// Anyone (`--insecure-diagnostics`).
    Open,
    /// Callers the API server authenticates and authorises.
    Authorized(Client),
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
    if let Access::Authorized(client) = access {
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
        if let Err((status, why)) = authorize(client, token).await {
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
