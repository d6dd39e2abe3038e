//! Kubernetes Events on claims and pools (`kubectl describe` shows them), rate-limited twice:
//! each object gets one Event of a reason per [`PER_OBJECT_PERIOD`], and the whole process at
//! most [`RATE`] a second, so that a burst of thousands of claims cannot flood the API server.
//! Sending never holds up a reconcile, and a failure to send is only logged.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use super::metrics::Metrics;

/// Events a second, on average, for the whole process. Each is a write the API server takes
/// beside the claims' own: at 20 a second, bursts on pools of 10 claims cost 0.24 writes per
/// claim more than the contract's 4 (BENCHMARKS.md, issue 54's target 3); at 5, a person reading
/// `kubectl describe` still sees what happened to the claims of a quiet cluster.
pub const RATE: u32 = 5;
/// Events the process may send at once above [`RATE`].
pub const BURST: u32 = 25;
/// One Event per object and reason at most this often.
pub const PER_OBJECT_PERIOD: Duration = Duration::from_secs(300);

/// Why an Event was sent (its `reason`), a fixed list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// A claim got its address.
    AddressAllocated,
    /// A claim's address went back to its pool.
    AddressReleased,
    /// A pool has no free address for a claim.
    PoolExhausted,
    /// A pool's spec cannot be served.
    InvalidSpec,
    /// A pool's objects hold one address for more than one claim.
    DuplicateAddress,
    /// A pool's addresses meet another pool's.
    PoolsOverlap,
    /// An address object names a pool that did not hand its address out.
    ForeignAddress,
    /// A pool's namespace selector leaves a claim's namespace out.
    NamespaceNotSelected,
    /// A Cluster's control-plane endpoint was written from its pool.
    ControlPlaneEndpointSet,
    /// A Cluster's control-plane endpoint waits for its address, or is not the one claimed.
    ControlPlaneEndpointPending,
    /// A Cluster's endpoint pool annotation names no address pool.
    InvalidEndpointPool,
    /// A Metal3Data's IP claim has had no answer from any IPAM provider.
    ClaimUnanswered,
}

impl Reason {
    /// The reason as Events carry it.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::AddressAllocated => "AddressAllocated",
            Reason::AddressReleased => "AddressReleased",
            Reason::PoolExhausted => "PoolExhausted",
            Reason::InvalidSpec => "InvalidSpec",
            Reason::DuplicateAddress => "DuplicateAddress",
            Reason::PoolsOverlap => "PoolsOverlap",
            Reason::ForeignAddress => "ForeignAddress",
            Reason::NamespaceNotSelected => "NamespaceNotSelected",
            Reason::ControlPlaneEndpointSet => "ControlPlaneEndpointSet",
            Reason::ControlPlaneEndpointPending => "ControlPlaneEndpointPending",
            Reason::InvalidEndpointPool => "InvalidEndpointPool",
            Reason::ClaimUnanswered => "ClaimUnanswered",
        }
    }

    fn event_type(self) -> EventType {
        match self {
            Reason::AddressAllocated
            | Reason::AddressReleased
            | Reason::ControlPlaneEndpointSet => EventType::Normal,
            Reason::PoolExhausted
            | Reason::InvalidSpec
            | Reason::DuplicateAddress
            | Reason::PoolsOverlap
            | Reason::ForeignAddress
            | Reason::NamespaceNotSelected
            | Reason::ControlPlaneEndpointPending
            | Reason::InvalidEndpointPool
            | Reason::ClaimUnanswered => EventType::Warning,
        }
    }

    fn action(self) -> &'static str {
        match self {
            Reason::AddressAllocated
            | Reason::PoolExhausted
            | Reason::NamespaceNotSelected
            | Reason::ControlPlaneEndpointSet
            | Reason::ControlPlaneEndpointPending
            | Reason::ClaimUnanswered => "Allocate",
            Reason::AddressReleased => "Release",
            Reason::InvalidSpec
            | Reason::DuplicateAddress
            | Reason::PoolsOverlap
            | Reason::ForeignAddress
            | Reason::InvalidEndpointPool => "Validate",
        }
    }
}

/// Sends rate-limited Events.
pub struct Events {
    recorder: Option<Recorder>,
    overall: DefaultDirectRateLimiter,
    per_object: DefaultKeyedRateLimiter<(String, Reason)>,
    /// When the per-object limiter last forgot the objects whose period is over.
    pruned: std::sync::Mutex<std::time::Instant>,
    metrics: Arc<Metrics>,
}

fn per_second(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN)
}

impl Events {
    /// Events reported as `controller`, instance `instance` (the pod).
    pub fn new(client: Client, instance: String, metrics: Arc<Metrics>) -> Self {
        let reporter = Reporter {
            controller: "bitpool".into(),
            instance: Some(instance),
        };
        Self::with_recorder(Some(Recorder::new(client, reporter)), metrics)
    }

    /// Events that are limited and counted but never sent.
    #[cfg(test)]
    pub(crate) fn for_tests(metrics: Arc<Metrics>) -> Self {
        Self::with_recorder(None, metrics)
    }

    fn with_recorder(recorder: Option<Recorder>, metrics: Arc<Metrics>) -> Self {
        let per_object = Quota::with_period(PER_OBJECT_PERIOD)
            .unwrap_or_else(|| Quota::per_hour(NonZeroU32::MIN))
            .allow_burst(NonZeroU32::MIN);
        Self {
            recorder,
            overall: RateLimiter::direct(
                Quota::per_second(per_second(RATE)).allow_burst(per_second(BURST)),
            ),
            per_object: RateLimiter::keyed(per_object),
            pruned: std::sync::Mutex::new(std::time::Instant::now()),
            metrics,
        }
    }

    /// Whether an Event of `reason` about `regarding` may go now (and counts it if so).
    fn admit(&self, regarding: &ObjectReference, reason: Reason) -> bool {
        if self
            .per_object
            .check_key(&(limit_key(regarding), reason))
            .is_err()
        {
            return false;
        }
        if self.overall.check().is_err() {
            self.metrics.event_dropped();
            return false;
        }
        // Forget objects whose period is over, so the limiter does not grow with churn; a pass
        // over every key, so at most every 10 s.
        if self.per_object.len() > 10_000
            && let Ok(mut pruned) = self.pruned.lock()
            && pruned.elapsed() >= Duration::from_secs(10)
        {
            self.per_object.retain_recent();
            *pruned = std::time::Instant::now();
        }
        true
    }

    /// Sends one Event about `regarding` that tells of each of `covered` as well (a pool's Event
    /// for a burst of its claims): each counts as told for the per-object limit, so that a claim
    /// told in bulk is not told again on its own within the period.
    pub fn publish_covering(
        &self,
        regarding: ObjectReference,
        reason: Reason,
        note: String,
        covered: impl IntoIterator<Item = ObjectReference>,
    ) {
        for object in covered {
            // Spent, not sent: the bulk Event speaks for it.
            let _ = self.per_object.check_key(&(limit_key(&object), reason));
        }
        self.publish(regarding, reason, note);
    }

    /// Sends an Event about `regarding` in the background, unless a limit holds it back.
    pub fn publish(&self, regarding: ObjectReference, reason: Reason, note: String) {
        if !self.admit(&regarding, reason) {
            return;
        }
        let Some(recorder) = self.recorder.clone() else {
            return;
        };
        let event = Event {
            type_: reason.event_type(),
            reason: reason.as_str().to_string(),
            note: Some(note),
            action: reason.action().to_string(),
            secondary: None,
        };
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &regarding).await {
                tracing::debug!(reason = %event.reason, error = %e, "cannot send an Event");
            }
        });
    }
}

/// An object as the per-object limit knows it.
fn limit_key(regarding: &ObjectReference) -> String {
    format!(
        "{}/{}/{}/{}",
        regarding.kind.as_deref().unwrap_or_default(),
        regarding.namespace.as_deref().unwrap_or_default(),
        regarding.name.as_deref().unwrap_or_default(),
        regarding.uid.as_deref().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(name: &str) -> ObjectReference {
        ObjectReference {
            kind: Some("IPAddressClaim".into()),
            namespace: Some("default".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        }
    }

    #[test]
    fn one_event_per_object_and_reason_per_period() {
        let events = Events::for_tests(Arc::new(Metrics::new()));
        assert!(events.admit(&object("a"), Reason::PoolExhausted));
        assert!(!events.admit(&object("a"), Reason::PoolExhausted));
        assert!(events.admit(&object("a"), Reason::AddressAllocated));
        assert!(events.admit(&object("b"), Reason::PoolExhausted));
    }

    /// A pool's Event for a burst speaks for its claims: a claim it covered is not told again
    /// on its own (as a reconcile whose cache lags behind the burst's statuses would), one it
    /// did not cover is, and the pool's own Event went.
    #[test]
    fn an_event_for_a_burst_stands_for_each_claim_it_covers() {
        let events = Events::for_tests(Arc::new(Metrics::new()));
        let pool = ObjectReference {
            kind: Some("InClusterIPPool".into()),
            ..object("pool")
        };
        let covered = [object("a"), object("b")];
        let note = "allocated 2 addresses".to_string();
        events.publish_covering(pool.clone(), Reason::AddressAllocated, note, covered);
        assert!(!events.admit(&object("a"), Reason::AddressAllocated));
        assert!(!events.admit(&object("b"), Reason::AddressAllocated));
        assert!(events.admit(&object("c"), Reason::AddressAllocated));
        assert!(events.admit(&object("a"), Reason::AddressReleased));
        assert!(
            !events.admit(&pool, Reason::AddressAllocated),
            "the pool was told"
        );
    }

    #[test]
    fn a_burst_beyond_the_process_limit_is_dropped_and_counted() {
        let metrics = Arc::new(Metrics::new());
        let events = Events::for_tests(metrics.clone());
        let sent = (0..BURST * 3)
            .filter(|i| events.admit(&object(&i.to_string()), Reason::AddressAllocated))
            .count();
        // The burst, and perhaps the few the rate refilled while the loop ran.
        assert!(
            (BURST as usize..BURST as usize + 10).contains(&sent),
            "{sent} sent"
        );
        let dropped = format!("bitpool_events_dropped_total {}", BURST as usize * 3 - sent);
        assert!(metrics.encode().lines().any(|l| l == dropped));
    }
}
