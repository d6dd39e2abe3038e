//! The HTTPS listener: TLS handshakes, one task per connection, and the three routes.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::{Webhooks, tls};

/// AdmissionReviews and ConversionReviews above this size are refused (the API server's own
/// request limit is 3 MiB; a ConversionReview of a large list can approach it).
const MAX_BODY: usize = 8 * 1024 * 1024;

pub const CONVERT_PATH: &str = "/convert";
pub const VALIDATE_PATH: &str = "/validate";
pub const MUTATE_PATH: &str = "/mutate";

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("cannot listen on {addr} for webhooks: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
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
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    let bound = listener.local_addr().unwrap_or(addr);
    tracing::info!(address = %bound, cert_dir = %options.cert_dir.display(), "serving webhooks");
    let acceptor = TlsAcceptor::from(config);
    Ok(async move {
        let reload = tokio::spawn(reloader.watch());
        tokio::select! {
            _ = accept_loop(listener, acceptor, webhooks) => {}
            _ = shutdown => {}
        }
        reload.abort();
    })
}

async fn accept_loop(listener: TcpListener, acceptor: TlsAcceptor, webhooks: Arc<Webhooks>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "cannot accept a webhook connection");
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let webhooks = webhooks.clone();
        tokio::spawn(async move {
            let tls = match acceptor.accept(stream).await {
                Ok(tls) => tls,
                Err(e) => {
                    tracing::debug!(peer = %peer, error = %e, "webhook TLS handshake failed");
                    return;
                }
            };
            let service = hyper::service::service_fn(move |request| {
                let webhooks = webhooks.clone();
                async move { Ok::<_, Infallible>(route(&webhooks, request).await) }
            });
            if let Err(e) = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), service)
                .await
            {
                tracing::debug!(peer = %peer, error = %e, "webhook connection ended with an error");
            }
        });
    }
}

fn reply(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

async fn route(webhooks: &Webhooks, request: Request<Incoming>) -> Response<Full<Bytes>> {
    if request.method() != Method::POST {
        return reply(StatusCode::METHOD_NOT_ALLOWED, b"{}".to_vec());
    }
    let path = request.uri().path().to_string();
    let body = match Limited::new(request.into_body(), MAX_BODY).collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) => {
            let message = serde_json::json!({ "error": format!("cannot read the request: {e}") });
            return reply(StatusCode::BAD_REQUEST, message.to_string().into_bytes());
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
