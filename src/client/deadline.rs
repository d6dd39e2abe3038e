//! Hard deadlines for writes. Every write bitpool makes is abandoned by the client at its
//! deadline, queueing in the client's buffer and rate limiter included ([`Side::Client`], the
//! outermost layer), and carries what is left of it to the API server as the `timeout` query
//! parameter ([`Side::Wire`], next to the wire), which ends the request there too. A
//! write that may only land within a window (an address object's create, see
//! `ipam::ledger::CREATE_WINDOW`) carries the window's end as its [`Deadline`].

use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use hyper::http;
use tokio::time::Instant;
use tower::{BoxError, Layer, Service};

/// The deadline of a write that names none.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(10);

/// A request extension: the request must be done by then.
#[derive(Clone, Copy, Debug)]
pub struct Deadline(pub Instant);

/// A write abandoned at its deadline: it may or may not have been carried out.
#[derive(Debug, thiserror::Error)]
#[error("abandoned at its deadline, {0:?} after it was made (queueing included)")]
pub struct DeadlineExceeded(pub Duration);

fn is_write(method: &http::Method) -> bool {
    !matches!(
        *method,
        http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
    )
}

/// Where in the client's stack a [`DeadlineLayer`] sits, and so what it does there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Outermost: gives every write a deadline (its own, or [`WRITE_DEADLINE`]) and abandons
    /// the request there, whatever it waits for below.
    Client,
    /// Next to the wire: tells the API server what is left of the deadline as the request's
    /// `timeout`; a request whose deadline has passed is not sent.
    Wire,
}

/// Bounds requests by their deadline, as its [`Side`] says.
#[derive(Clone, Copy, Debug)]
pub struct DeadlineLayer(pub Side);

impl<S> Layer<S> for DeadlineLayer {
    type Service = Bounded<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Bounded {
            inner,
            side: self.0,
        }
    }
}

/// The service [`DeadlineLayer`] wraps.
#[derive(Clone)]
pub struct Bounded<S> {
    inner: S,
    side: Side,
}

impl<S, B, T> Service<http::Request<B>> for Bounded<S>
where
    S: Service<http::Request<B>, Response = T>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = T;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<T, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let made = Instant::now();
        let mut deadline = request.extensions().get::<Deadline>().map(|d| d.0);
        match self.side {
            Side::Client => {
                if deadline.is_none() && is_write(request.method()) {
                    deadline = Some(made + WRITE_DEADLINE);
                }
                if let Some(at) = deadline {
                    request.extensions_mut().insert(Deadline(at));
                }
            }
            Side::Wire => {
                if let Some(at) = deadline {
                    let left = at.saturating_duration_since(made);
                    match with_timeout(request.uri(), left).filter(|_| !left.is_zero()) {
                        Some(uri) => *request.uri_mut() = uri,
                        None => {
                            return Box::pin(async move { Err(DeadlineExceeded(left).into()) });
                        }
                    }
                }
                // The client side enforces it.
                deadline = None;
            }
        }
        let response = self.inner.call(request);
        Box::pin(async move {
            let Some(at) = deadline else {
                return response.await.map_err(Into::into);
            };
            match tokio::time::timeout_at(at, response).await {
                Ok(result) => result.map_err(Into::into),
                Err(_) => Err(DeadlineExceeded(made.elapsed()).into()),
            }
        })
    }
}

/// `uri` with the server-side `timeout` parameter set to `left` (whole milliseconds, as the
/// API server reads a Go duration).
fn with_timeout(uri: &http::Uri, left: Duration) -> Option<http::Uri> {
    let timeout = format!("timeout={}ms", left.as_millis().max(1));
    let path = uri.path();
    let query = match uri.query() {
        Some(query) => {
            let kept = query
                .split('&')
                .filter(|p| !p.starts_with("timeout="))
                .chain(std::iter::once(timeout.as_str()))
                .collect::<Vec<_>>();
            kept.join("&")
        }
        None => timeout,
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = format!("{path}?{query}").parse().ok();
    http::Uri::from_parts(parts).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use tower::ServiceExt;

    #[test]
    fn the_server_is_told_what_is_left() {
        let uri: http::Uri =
            "/apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/a/ipaddresses?fieldManager=bitpool"
                .parse()
                .expect("uri");
        let told = with_timeout(&uri, Duration::from_millis(9_250)).expect("uri");
        assert_eq!(
            told.to_string(),
            "/apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/a/ipaddresses?fieldManager=bitpool&timeout=9250ms"
        );
        let again = with_timeout(&told, Duration::from_secs(3)).expect("uri");
        assert_eq!(again.query(), Some("fieldManager=bitpool&timeout=3000ms"));
        let bare: http::Uri = "/api/v1/namespaces".parse().expect("uri");
        let told = with_timeout(&bare, Duration::from_secs(1)).expect("uri");
        assert_eq!(told.query(), Some("timeout=1000ms"));
    }

    /// A server that never answers, and records the URI it was sent.
    fn silent(
        seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    ) -> impl Service<http::Request<()>, Response = (), Error = Infallible, Future: Send> + Clone
    {
        tower::service_fn(move |request: http::Request<()>| {
            let seen = seen.clone();
            async move {
                if let Ok(mut seen) = seen.lock() {
                    seen.push(request.uri().to_string());
                }
                std::future::pending::<Result<(), Infallible>>().await
            }
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_is_abandoned_at_its_deadline_and_a_read_is_not_bounded() {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stack = DeadlineLayer(Side::Client)
            .layer(DeadlineLayer(Side::Wire).layer(silent(seen.clone())));
        let write = http::Request::post("/api/v1/namespaces")
            .body(())
            .expect("request");
        let error = stack.clone().oneshot(write).await.expect_err("abandoned");
        let exceeded = error
            .downcast_ref::<DeadlineExceeded>()
            .expect("a deadline");
        assert_eq!(exceeded.0, WRITE_DEADLINE);
        assert_eq!(
            seen.lock().expect("lock").as_slice(),
            ["/api/v1/namespaces?timeout=10000ms"]
        );

        let read = http::Request::get("/api/v1/namespaces")
            .body(())
            .expect("request");
        let waited = tokio::time::timeout(WRITE_DEADLINE * 3, stack.oneshot(read)).await;
        assert!(waited.is_err(), "a read got a deadline");
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_past_its_deadline_is_not_sent() {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stack = DeadlineLayer(Side::Wire).layer(silent(seen.clone()));
        let mut late = http::Request::post("/api/v1/namespaces")
            .body(())
            .expect("request");
        late.extensions_mut().insert(Deadline(Instant::now()));
        let error = stack.oneshot(late).await.expect_err("not sent");
        assert!(error.is::<DeadlineExceeded>());
        assert!(seen.lock().expect("lock").is_empty());
    }
}
