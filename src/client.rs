//! The Kubernetes client of `bitpool run`: where it connects (and saying so when it cannot), a
//! client-side rate limit like Cluster API managers' `--kube-api-qps` / `--kube-api-burst`,
//! deadlines on every write ([`deadline`]) and the API server's clock ([`clock`]).

pub mod clock;
pub mod deadline;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use kube::client::ClientBuilder;
use kube::{Client, Config};
use tower::{Layer, Service};

/// Why no client to the API server could be made.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot load a Kubernetes configuration ({source}): set KUBECONFIG, or run in a pod")]
    Config {
        #[source]
        source: kube::config::InferConfigError,
    },
    #[error("cannot build a client for {server}: {source}")]
    Build {
        server: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "cannot reach the Kubernetes API server at {server} (configured by {origin}): {source}{hint}"
    )]
    Unreachable {
        /// What the error most likely means, when it can be told.
        hint: &'static str,
        server: String,
        origin: String,
        #[source]
        source: Box<kube::Error>,
    },
}

/// Requests per second and burst for the client.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub qps: NonZeroU32,
    pub burst: NonZeroU32,
}

/// Where the configuration came from, for messages.
fn origin() -> String {
    match std::env::var("KUBECONFIG") {
        Ok(path) if !path.is_empty() => format!("KUBECONFIG={path}"),
        _ if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => {
            "the pod's service account".to_string()
        }
        _ => "~/.kube/config".to_string(),
    }
}

/// What bitpool's requests name themselves: `bitpool/<version>`.
pub const USER_AGENT: &str = concat!("bitpool/", env!("BITPOOL_BUILD_VERSION"));

/// A client for the configured cluster, rate limited, after checking that the API server answers.
pub async fn connect(limits: Limits) -> Result<Client, Error> {
    let mut config = Config::infer()
        .await
        .map_err(|source| Error::Config { source })?;
    // The API server names the field manager of every write after the agent: `bitpool`, as
    // its server-side applies are, so `managedFields` tell bitpool's writes from any other's.
    config.headers.push((
        hyper::header::USER_AGENT,
        hyper::header::HeaderValue::from_static(USER_AGENT),
    ));
    let server = config.cluster_url.to_string();
    let limiter = Arc::new(RateLimiter::direct(
        Quota::per_second(limits.qps).allow_burst(limits.burst),
    ));
    let builder = ClientBuilder::try_from(config).map_err(|source| Error::Build {
        server: server.clone(),
        source,
    })?;
    // Outermost last: a write's deadline covers the rate limiter and the buffer; the server is
    // told what is left of it, and its clock read, next to the wire.
    let client = builder
        .with_layer(&clock::ClockLayer)
        .with_layer(&deadline::DeadlineLayer(deadline::Side::Wire))
        .with_layer(&tower::buffer::BufferLayer::new(1024))
        .with_layer(&ThrottleLayer { limiter })
        .with_layer(&deadline::DeadlineLayer(deadline::Side::Client))
        .build();
    client
        .apiserver_version()
        .await
        .map_err(|source| Error::Unreachable {
            hint: hint(&source),
            server,
            origin: origin(),
            source: Box::new(source),
        })?;
    Ok(client)
}

/// A certificate that is not valid yet, or no longer, is most often this machine's clock.
fn hint(error: &kube::Error) -> &'static str {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    let text = text.to_lowercase();
    if text.contains("notvalidyet") || text.contains("not valid yet") {
        " (the server's certificate is not valid yet by this machine's clock: is the clock behind? correct it, e.g. with NTP)"
    } else if text.contains("certificate expired")
        || text.contains("invalid peer certificate: expired")
    {
        " (the server's certificate has expired by this machine's clock: renew it, or correct a clock that is ahead)"
    } else {
        ""
    }
}

/// Delays each request until the rate limiter lets it through.
struct ThrottleLayer {
    limiter: Arc<DefaultDirectRateLimiter>,
}

impl<S> Layer<S> for ThrottleLayer {
    type Service = Throttle<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Throttle {
            inner,
            limiter: self.limiter.clone(),
        }
    }
}

/// The service `ThrottleLayer` wraps: each request waits for the rate limiter.
#[derive(Clone)]
pub struct Throttle<S> {
    inner: S,
    limiter: Arc<DefaultDirectRateLimiter>,
}

impl<S, R> Service<R> for Throttle<S>
where
    S: Service<R> + Clone + Send + 'static,
    S::Future: Send + 'static,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        // The instance that was polled ready serves this request; a fresh clone the next one.
        let fresh = self.inner.clone();
        let mut ready = std::mem::replace(&mut self.inner, fresh);
        let limiter = self.limiter.clone();
        Box::pin(async move {
            limiter.until_ready().await;
            ready.call(request).await
        })
    }
}
