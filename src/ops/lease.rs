//! Leader election on a `coordination.k8s.io` Lease (through `kube-lease-manager`), and the
//! [`Leadership`] every reconcile asks before it writes.
//!
//! Correctness never rests on the lease: every allocation is judged by the API server through
//! the pool's ledger, so two writers cannot hand out one address twice. The lease keeps standbys
//! from doing the same work twice. Still, a leader that cannot renew stops writing before
//! anyone else may take over: it trusts its lease only until half-way between the renew
//! deadline and the lease's expiry, as it last saw the Lease object.

use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::client::clock;

/// Leader election settings, as the CAPI manager flags give them.
#[derive(Clone, Debug)]
pub struct ElectionSettings {
    pub lease_name: String,
    pub namespace: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
}

/// Why this process cannot take part in leader election.
#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    #[error(
        "--leader-elect-renew-deadline ({renew:?}) must be shorter than --leader-elect-lease-duration ({lease:?})"
    )]
    Durations { lease: Duration, renew: Duration },
    #[error("refusing to take part in leader election: {0}")]
    Clock(String),
    #[error("cannot take part in leader election on Lease {namespace}/{name}: {reason}")]
    Lease {
        namespace: String,
        name: String,
        reason: String,
    },
}

/// Whether this process may write. Without leader election it always may.
#[derive(Clone, Debug)]
pub struct Leadership {
    leading: watch::Receiver<bool>,
    elected: bool,
}

impl Leadership {
    /// No leader election: this process is the only writer.
    pub fn always() -> Self {
        let (sender, leading) = watch::channel(true);
        // The value never changes; the receiver keeps working after the sender is gone.
        drop(sender);
        Self {
            leading,
            elected: false,
        }
    }

    /// Whether this process holds the lease now (always, without leader election).
    pub fn is_leading(&self) -> bool {
        *self.leading.borrow()
    }

    /// True when leadership is decided by a lease.
    pub fn elected(&self) -> bool {
        self.elected
    }

    /// Completes when this process stops leading (at once if it does not lead).
    pub async fn lost(&self) {
        let mut leading = self.leading.clone();
        // An error means the election ended; with leader election on that is the shutdown.
        let _ = leading.wait_for(|l| !*l).await;
        if !self.elected {
            std::future::pending::<()>().await;
        }
    }

    /// Yields each time this process becomes the leader, so that every object is reconciled.
    pub fn gained(&self) -> impl Stream<Item = ()> + Send + 'static {
        let mut leading = self.leading.clone();
        leading.mark_unchanged();
        futures::stream::unfold(leading, |mut leading| async move {
            loop {
                leading.changed().await.ok()?;
                if *leading.borrow_and_update() {
                    return Some(((), leading));
                }
            }
        })
    }
}

/// A running election; [`Election::resign`] gives the lease up for the next leader.
pub struct Election {
    /// `Lease <namespace>/<name>`, for the log.
    lease: String,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Election {
    /// Releases the lease (when held) so that a standby takes over at once.
    pub async fn resign(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if tokio::time::timeout(Duration::from_secs(5), &mut self.task)
            .await
            .is_err()
        {
            tracing::warn!(object = %self.lease, "the lease was not released within 5 s; it expires by itself");
            self.task.abort();
        }
    }
}

/// Joins the election: the returned [`Leadership`] turns true while the lease is held.
pub async fn elect(
    client: Client,
    settings: ElectionSettings,
    on_change: impl Fn(bool) + Send + 'static,
) -> Result<(Leadership, Election), ElectionError> {
    let (lease_duration, renew_deadline) = (settings.lease_duration, settings.renew_deadline);
    if renew_deadline >= lease_duration || renew_deadline.is_zero() {
        return Err(ElectionError::Durations {
            lease: lease_duration,
            renew: renew_deadline,
        });
    }
    // Candidates judge the lease on their own clocks: one far off would take it from a leader
    // that still holds it. (The connection has been checked: the server's clock is measured.)
    if let Some(skew) = clock::skew_beyond_bound() {
        return Err(ElectionError::Clock(skew));
    }
    let lease_error = |reason: String| ElectionError::Lease {
        namespace: settings.namespace.clone(),
        name: settings.lease_name.clone(),
        reason,
    };
    // The manager renews when `grace` is left of the lease.
    let grace = lease_duration
        .saturating_sub(renew_deadline)
        .as_secs()
        .max(1);
    let manager = LeaseManagerBuilder::new(client.clone(), settings.lease_name.as_str())
        .with_namespace(settings.namespace.as_str())
        .with_identity(settings.identity.as_str())
        .with_duration(lease_duration.as_secs().max(2))
        .with_grace(grace)
        .with_field_manager("bitpool")
        .build()
        .await
        .map_err(|e| lease_error(e.to_string()))?;
    let (manager_says, manager_task) = manager.watch().await;
    let (sender, leading) = watch::channel(false);
    let (stop, stopped) = oneshot::channel();
    let lease = format!("Lease {}/{}", settings.namespace, settings.lease_name);
    let fence = Fence {
        lease: lease.clone(),
        identity: settings.identity.clone(),
        trusted_for: renew_deadline + (lease_duration - renew_deadline) / 2,
    };
    let leases: Api<Lease> = Api::namespaced(client, &settings.namespace);
    let lease_for_election = lease.clone();
    let task = tokio::spawn(async move {
        follow(
            fence,
            leases,
            &settings.lease_name,
            manager_says,
            sender,
            stopped,
            on_change,
        )
        .await;
        // The manager releases the lease when its channel closes (dropped in `follow`).
        match manager_task.await {
            Ok(Ok(_)) => tracing::info!("leader lease released"),
            Ok(Err(e)) => {
                tracing::warn!(object = %lease, error = %e, "the leader lease was not released")
            }
            Err(e) => tracing::warn!(object = %lease, error = %e, "leader election task failed"),
        }
    });
    Ok((
        Leadership {
            leading,
            elected: true,
        },
        Election {
            lease: lease_for_election,
            stop: Some(stop),
            task,
        },
    ))
}

/// How often a leader checks that its clock still agrees with the API server's.
const CLOCK_CHECK: Duration = Duration::from_secs(5);

/// How long this process trusts the lease after its last renewal.
struct Fence {
    /// `Lease <namespace>/<name>`, for the log.
    lease: String,
    identity: String,
    trusted_for: Duration,
}

impl Fence {
    /// Until when (on this process' clock) `lease` lets this process write, if it holds it.
    fn held_until(&self, lease: &Lease, now: Timestamp, clock: Instant) -> Option<Instant> {
        let spec = lease.spec.as_ref()?;
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return None;
        }
        let renewed = spec.renew_time.as_ref()?.0;
        let since = Duration::try_from(now.duration_since(renewed)).unwrap_or(Duration::ZERO);
        clock.checked_add(self.trusted_for.checked_sub(since)?)
    }
}

/// Publishes the manager's word, fenced by the renewals seen on the Lease, until `stopped`.
async fn follow(
    fence: Fence,
    leases: Api<Lease>,
    lease_name: &str,
    mut manager_says: watch::Receiver<bool>,
    sender: watch::Sender<bool>,
    mut stopped: oneshot::Receiver<()>,
    on_change: impl Fn(bool),
) {
    let config = watcher::Config::default().fields(&format!("metadata.name={lease_name}"));
    let mut renewals = watcher(leases, config)
        .default_backoff()
        .applied_objects()
        .boxed();
    let mut held_until: Option<Instant> = None;
    let far = Duration::from_secs(3600);
    let mut clock_check = tokio::time::interval(CLOCK_CHECK);
    let mut skewed = None;
    loop {
        let deadline = held_until.unwrap_or_else(|| Instant::now() + far);
        tokio::select! {
            _ = &mut stopped => break,
            _ = clock_check.tick() => skewed = clock::skew_beyond_bound(),
            changed = manager_says.changed() => if changed.is_err() { break },
            event = renewals.next() => match event {
                Some(Ok(lease)) => held_until = fence.held_until(&lease, Timestamp::now(), Instant::now()),
                Some(Err(e)) => tracing::debug!(error = %e, "watching the leader lease failed; retrying"),
                None => break,
            },
            _ = tokio::time::sleep_until(deadline), if held_until.is_some() => held_until = None,
        }
        let leading = *manager_says.borrow()
            && held_until.is_some_and(|t| Instant::now() < t)
            && skewed.is_none();
        if leading != *sender.borrow() {
            if leading {
                tracing::info!(object = %fence.lease, identity = %fence.identity, "became the leader");
            } else if let Some(skew) = &skewed {
                tracing::error!(object = %fence.lease, identity = %fence.identity, "stopped leading: {skew}");
            } else {
                tracing::warn!(object = %fence.lease, identity = %fence.identity, "stopped leading: no more writes until the lease is held again");
            }
            sender.send_replace(leading);
            on_change(leading);
        }
    }
    sender.send_replace(false);
    on_change(false);
}

/// This process' identity in the election: the pod's name and a random suffix,
/// so that a restarted pod of the same name is a new candidate.
pub fn identity() -> String {
    format!("{}_{:016x}", host_name(), rand::random::<u64>())
}

/// The pod's name (or the machine's).
pub fn host_name() -> String {
    std::env::var("POD_NAME")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "bitpool".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn lease(holder: &str, renewed: Timestamp) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                renew_time: Some(MicroTime(renewed)),
                lease_duration_seconds: Some(15),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn fence() -> Fence {
        Fence {
            lease: "Lease ns/l".into(),
            identity: "me".into(),
            trusted_for: Duration::from_millis(12_500),
        }
    }

    #[test]
    fn a_lease_is_trusted_until_half_way_through_its_grace() {
        let now = Timestamp::now();
        let clock = Instant::now();
        let renewed = now - k8s_openapi::jiff::SignedDuration::from_secs(2);
        assert_eq!(
            fence().held_until(&lease("me", renewed), now, clock),
            Some(clock + Duration::from_millis(10_500))
        );
        let stale = now - k8s_openapi::jiff::SignedDuration::from_secs(13);
        assert_eq!(fence().held_until(&lease("me", stale), now, clock), None);
        assert_eq!(fence().held_until(&lease("other", now), now, clock), None);
        assert_eq!(fence().held_until(&Lease::default(), now, clock), None);
    }

    #[tokio::test]
    async fn without_election_leadership_never_ends() {
        let leadership = Leadership::always();
        assert!(leadership.is_leading());
        assert!(!leadership.elected());
        let lost = tokio::time::timeout(Duration::from_millis(50), leadership.lost()).await;
        assert!(lost.is_err(), "lost() completed without an election");
    }
}
