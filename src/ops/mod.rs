//! What operators run bitpool by, beside its controllers:
//!
//! - [`health`]: `/healthz` and `/readyz` for the kubelet's probes;
//! - [`metrics`]: the Prometheus metrics, and [`diagnostics`], the endpoint that serves them;
//! - [`lease`]: leader election, and the [`lease::Leadership`] every write is gated by;
//! - [`events`]: rate-limited Kubernetes Events on claims and pools.

pub mod diagnostics;
pub mod events;
pub mod health;
pub mod lease;
pub mod metrics;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use events::Events;
use lease::Leadership;
use metrics::Metrics;

/// The state the operational endpoints report, shared with the controllers.
pub struct Ops {
    pub metrics: Arc<Metrics>,
    pub events: Events,
    pub leadership: Leadership,
    caches_synced: AtomicBool,
}

impl Ops {
    /// Not ready until [`Self::mark_caches_synced`].
    pub fn new(metrics: Arc<Metrics>, events: Events, leadership: Leadership) -> Self {
        Self {
            metrics,
            events,
            leadership,
            caches_synced: AtomicBool::new(false),
        }
    }

    /// The caches are complete: this process may report ready.
    pub fn mark_caches_synced(&self) {
        self.caches_synced.store(true, Ordering::SeqCst);
    }

    /// Why this process is not ready, or `None` when it is.
    pub fn not_ready(&self) -> Option<&'static str> {
        if !self.caches_synced.load(Ordering::SeqCst) {
            Some("the watch caches have not received their initial lists")
        } else if !self.leadership.is_leading() {
            Some("standby: another replica holds the leader lease")
        } else {
            None
        }
    }
}

/// A bind address as Cluster API managers' flags give it: `host:port`, `:port` (every
/// interface), or `0` (off).
pub fn parse_bind_address(text: &str) -> Result<Option<SocketAddr>, String> {
    if text == "0" {
        return Ok(None);
    }
    let problem = || format!("{text:?} is not an address: use host:port, :port, or 0 for off");
    let (host, port) = text.rsplit_once(':').ok_or_else(problem)?;
    let port: u16 = port.parse().map_err(|_| problem())?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let ip = if host.is_empty() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else if host == "localhost" {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        host.parse().map_err(|_| problem())?
    };
    Ok(Some(SocketAddr::new(ip, port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_addresses_take_go_spellings() {
        let parse = |s| parse_bind_address(s).map(|a| a.map(|a| a.to_string()));
        assert_eq!(parse(":9440"), Ok(Some("0.0.0.0:9440".into())));
        assert_eq!(parse("127.0.0.1:8443"), Ok(Some("127.0.0.1:8443".into())));
        assert_eq!(parse("localhost:8080"), Ok(Some("127.0.0.1:8080".into())));
        assert_eq!(parse("[::1]:8443"), Ok(Some("[::1]:8443".into())));
        assert_eq!(parse("0"), Ok(None));
        for bad in ["9440", "host:http", "example.com:80", ""] {
            let error = parse(bad).unwrap_err();
            assert!(error.contains("host:port"), "{error}");
        }
    }

    #[tokio::test]
    async fn ready_once_synced_and_leading() {
        let metrics = Arc::new(Metrics::new());
        let ops = Ops::new(
            metrics.clone(),
            Events::for_tests(metrics),
            Leadership::always(),
        );
        assert!(ops.not_ready().is_some_and(|w| w.contains("watch caches")));
        ops.mark_caches_synced();
        assert_eq!(ops.not_ready(), None);
        let ready = health::answer(&ops, &hyper::Method::GET, "/readyz");
        assert_eq!(ready.status(), hyper::StatusCode::OK);
        let missing = health::answer(&ops, &hyper::Method::GET, "/nope");
        assert_eq!(missing.status(), hyper::StatusCode::NOT_FOUND);
    }
}
