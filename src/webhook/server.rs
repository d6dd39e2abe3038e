//! The webhook routes (`/validate`, `/mutate`, `/convert`) on the shared HTTPS listener.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use super::Webhooks;
use crate::net::http::{self, Reply};
use crate::net::tls;

/// AdmissionReviews and ConversionReviews above this size are refused (the API server's own
/// request limit is 3 MiB; a ConversionReview of a large list can approach it).
const MAX_BODY: usize = 8 * 1024 * 1024;
/// Bodies read at once: with [`MAX_BODY`], what the webhooks buffer stays below 256 MiB however
/// many connections are open.
const BODIES_AT_ONCE: usize = 32;
/// How long a request's body may take to arrive (its turn to be read included): a caller that
/// trickles one holds a turn no longer than this.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);
static BODIES: Semaphore = Semaphore::const_new(BODIES_AT_ONCE);

/// The path of ConversionReviews for the CRDs' conversion webhooks.
pub const CONVERT_PATH: &str = "/convert";
/// The path of AdmissionReviews for the validating webhooks.
pub const VALIDATE_PATH: &str = "/validate";
/// The path of AdmissionReviews for the mutating webhooks.
pub const MUTATE_PATH: &str = "/mutate";

/// Why the webhook server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error(transparent)]
    Bind(#[from] http::BindError),
}

/// Binds the port and loads the certificate (both fail at once, with a message), then serves
/// until `shutdown` completes.
pub async fn serve(
    addr: SocketAddr,
    options: tls::TlsOptions,
    webhooks: Arc<Webhooks>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<impl std::future::Future<Output = ()>, ServeError> {
    let (config, reloader) = tls::server_config(&options)?;
    let listener = http::bind(addr, "webhooks").await?;
    let bound = listener.local_addr().unwrap_or(addr);
    tracing::info!(address = %bound, cert_dir = %options.cert_dir.display(), "serving webhooks");
    let acceptor = TlsAcceptor::from(config);
    let handler: http::Handler = Arc::new(move |request| {
        let webhooks = webhooks.clone();
        Box::pin(async move { route(&webhooks, request).await })
    });
    Ok(async move {
        let reload = tokio::spawn(reloader.watch());
        tokio::select! {
            _ = http::accept_loop(listener, Some(acceptor), handler, "webhooks") => {}
            _ = shutdown => {}
        }
        reload.abort();
    })
}

fn reply(status: StatusCode, body: Vec<u8>) -> Reply {
    http::reply(status, "application/json", body)
}

async fn route(webhooks: &Webhooks, request: Request<Incoming>) -> Reply {
    if request.method() != Method::POST {
        return reply(StatusCode::METHOD_NOT_ALLOWED, b"{}".to_vec());
    }
    let path = request.uri().path().to_string();
    let read = tokio::time::timeout(BODY_TIMEOUT, async {
        let _turn = BODIES.acquire().await;
        Limited::new(request.into_body(), MAX_BODY).collect().await
    })
    .await;
    let body = match read {
        Ok(Ok(body)) => body.to_bytes(),
        Ok(Err(e)) => {
            let message = serde_json::json!({ "error": format!("cannot read the request: {e}") });
            return reply(StatusCode::BAD_REQUEST, message.to_string().into_bytes());
        }
        Err(_) => {
            let message =
                serde_json::json!({ "error": "the request's body did not arrive in time" });
            return reply(
                StatusCode::REQUEST_TIMEOUT,
                message.to_string().into_bytes(),
            );
        }
    };
    let answer = match path.as_str() {
        CONVERT_PATH => webhooks.convert(&body),
        VALIDATE_PATH => webhooks.admit(&body, super::Phase::Validate).await,
        MUTATE_PATH => webhooks.admit(&body, super::Phase::Mutate).await,
        _ => return reply(StatusCode::NOT_FOUND, b"{}".to_vec()),
    };
    match answer {
        Ok(json) => reply(StatusCode::OK, json),
        Err(message) => {
            let message = serde_json::json!({ "error": message });
            reply(StatusCode::BAD_REQUEST, message.to_string().into_bytes())
        }
    }
}
