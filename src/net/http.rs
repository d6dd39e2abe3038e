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
use std::time::Duration;

use hyper_util::rt::TokioTimer;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::timeout;
use tokio_rustls::TlsAcceptor;

/// A response with its whole body.
pub type Reply = Response<Full<Bytes>>;
/// Answers one request.
pub type Handler =
    Arc<dyn Fn(Request<Incoming>) -> Pin<Box<dyn Future<Output = Reply> + Send>> + Send + Sync>;

/// A port that could not be bound, and for which server.
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

/// The most connections one server holds at once; a connection beyond it is closed at once
/// (each costs a task and its buffers: the bound keeps memory bounded whatever callers do).
pub const MAX_CONNECTIONS: usize = 4096;
/// How long a client may take to finish the TLS handshake, and to send a request's headers
/// (also while a kept-alive connection waits for its next request): idle and half-open
/// connections are closed after it.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The same bound on a request's headers (HTTP/1) and on keep-alive pings (HTTP/2).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long accepting pauses after an error (out of file descriptors: retrying at once would
/// spin).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Accepts connections for ever, answering each request with `handler`, within the bounds above.
pub async fn accept_loop(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    handler: Handler,
    what: &'static str,
) {
    let open = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(server = what, error = %e, "cannot accept a connection");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            tracing::debug!(server = what, peer = %peer, "too many connections; closing a new one");
            drop(stream);
            continue;
        };
        let (tls, handler) = (tls.clone(), handler.clone());
        tokio::spawn(async move {
            serve_connection(stream, peer, tls, handler, what).await;
            drop(permit);
        });
    }
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
    handler: Handler,
    what: &'static str,
) {
    let service = hyper::service::service_fn(move |request| {
        let answer = handler(request);
        async move { Ok::<_, Infallible>(answer.await) }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(HEADER_TIMEOUT)
        .keep_alive_timeout(HEADER_TIMEOUT);
    let served = match tls {
        Some(acceptor) => match timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
            Ok(Ok(stream)) => {
                builder
                    .serve_connection(TokioIo::new(stream), service)
                    .await
            }
            Ok(Err(e)) => {
                tracing::debug!(server = what, peer = %peer, error = %e, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(server = what, peer = %peer, "TLS handshake timed out");
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
}
