//! One HTTP(S) listener loop for every server bitpool runs: a task per connection, HTTP/1.1
//! and h2, TLS when an acceptor is given.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

pub type Reply = Response<Full<Bytes>>;
pub type Handler =
    Arc<dyn Fn(Request<Incoming>) -> Pin<Box<dyn Future<Output = Reply> + Send>> + Send + Sync>;

#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} for {what}: {source}")]
pub struct BindError {
    pub addr: SocketAddr,
    pub what: &'static str,
    pub source: std::io::Error,
}

/// Binds `addr` (failing at once, with a message) for the server named `what`.
pub async fn bind(addr: SocketAddr, what: &'static str) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| BindError { addr, what, source })
}

/// A response with a body and its content type.
pub fn reply(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Reply {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}

/// Accepts connections for ever, answering each request with `handler`.
pub async fn accept_loop(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    handler: Handler,
    what: &'static str,
) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(server = what, error = %e, "cannot accept a connection");
                continue;
            }
        };
        let tls = tls.clone();
        let handler = handler.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let answer = handler(request);
                async move { Ok::<_, Infallible>(answer.await) }
            });
            let builder = auto::Builder::new(TokioExecutor::new());
            let served = match tls {
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(stream) => {
                        builder
                            .serve_connection(TokioIo::new(stream), service)
                            .await
                    }
                    Err(e) => {
                        tracing::debug!(server = what, peer = %peer, error = %e, "TLS handshake failed");
                        return;
                    }
                },
                None => {
                    builder
                        .serve_connection(TokioIo::new(stream), service)
                        .await
                }
            };
            if let Err(e) = served {
                tracing::debug!(server = what, peer = %peer, error = %e, "connection ended with an error");
            }
        });
    }
}
