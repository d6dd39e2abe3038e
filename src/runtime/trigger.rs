//! Controller triggers from a shared cache that never hold up its watch, and that never starve
//! the reconcile they ask for.
//!
//! A shared reflector hands every change to each subscriber through a bounded buffer and waits
//! when one is full: a controller that takes its triggers slowly (a long reconcile, a busy
//! scheduler) would freeze the cache every controller reads, and a frozen cache makes reconciles
//! see objects long gone. Each subscriber here is drained at once into a set holding the latest
//! version of each changed object, which its controller takes at its own pace: memory is bounded
//! by the number of objects, never by the number of events.
//!
//! The controllers' scheduler debounces: a request waits [`DEBOUNCE`] for its object to be quiet,
//! and a request for the same object within that time starts the wait again, with no limit. A
//! pool's claims changing faster than that (thousands created in a burst) would hold the pool's
//! reconcile back until the burst ends. [`Triggers`] hands a controller the requests its caches
//! make at most once per [`PERIOD`], longer than the debounce, so a pool idle when its claims
//! start to change is reconciled within [`PERIOD`] + [`DEBOUNCE`] (see the test below).

use std::collections::HashMap;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt, stream};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, ReflectHandle};
use tokio::sync::Notify;
use tokio::time::Instant;

/// How long every controller's scheduler waits for an object's requests to stop before it
/// reconciles the object. It lets the watches catch up with a reconcile's own writes before the
/// next one reads them: without it, a burst of 10,000 claims on one pool cost 4.8% more status
/// writes (claims served again from a stale cache), while the batches of a burst still follow
/// each other within a few milliseconds (the next reconcile is queued while one runs;
/// BENCHMARKS.md, issue 29's item 3).
pub const DEBOUNCE: Duration = Duration::from_millis(100);

/// The shortest time between two hand-overs of one controller's [`Triggers`]: twice the
/// debounce, so that the debounce of each hand-over ends before the next can restart it.
pub const PERIOD: Duration = DEBOUNCE.saturating_mul(2);

struct Pending<Key, T> {
    changed: Mutex<HashMap<Key, T>>,
    /// Set when the subscription ended (the watch stopped).
    closed: AtomicBool,
    wake: Notify,
}

/// The changes `handle` delivers, coalesced per object, as a stream that never blocks the watch.
pub fn eager<K>(handle: ReflectHandle<K>) -> impl Stream<Item = Arc<K>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    ObjectRef<K>: Hash + Eq,
{
    // An object's own changes come from people or from one reconcile's writes, never as a
    // steady stream: no period.
    coalesced(
        handle,
        |object: &Arc<K>| ObjectRef::from(&**object),
        Duration::ZERO,
    )
}

/// A stream of reconcile requests, as [`Triggers`] merges them.
type Requests<R> = Pin<Box<dyn Stream<Item = R> + Send + 'static>>;

/// One controller's triggers from bitpool's own caches ([`super::index::Index::requests`]): the
/// requests of every source merged into one set, coalesced per request, and handed to the
/// controller at most once per [`PERIOD`].
pub struct Triggers<R> {
    sources: Vec<Requests<R>>,
}

impl<R> Triggers<R>
where
    R: Clone + Hash + Eq + Send + 'static,
{
    /// No sources yet: add them with [`Self::with`].
    pub fn new() -> Self {
        Self {
            sources: Vec::new(),
        }
    }

    /// Adds the requests of one source.
    pub fn with(mut self, requests: impl Stream<Item = R> + Send + 'static) -> Self {
        self.sources.push(Box::pin(requests));
        self
    }

    /// The merged requests, for `Controller::reconcile_on`.
    pub fn stream(self) -> impl Stream<Item = R> + Send + 'static {
        coalesced(stream::select_all(self.sources), R::clone, PERIOD)
    }
}

impl<R> Default for Triggers<R>
where
    R: Clone + Hash + Eq + Send + 'static,
{
    fn default() -> Self {
        Self::new()
    }
}

/// The items of `changes`, drained at once and held as the latest one per `key`, taken at the
/// consumer's pace but no more often than once per `period`.
pub fn coalesced<T, Key>(
    mut changes: impl Stream<Item = T> + Unpin + Send + 'static,
    key: impl Fn(&T) -> Key + Send + 'static,
    period: Duration,
) -> impl Stream<Item = T> + Send + 'static
where
    T: Send + 'static,
    Key: Hash + Eq + Send + 'static,
{
    let pending = Arc::new(Pending {
        changed: Mutex::new(HashMap::new()),
        closed: AtomicBool::new(false),
        wake: Notify::new(),
    });
    let filler = pending.clone();
    tokio::spawn(async move {
        while let Some(object) = changes.next().await {
            if let Ok(mut changed) = filler.changed.lock() {
                changed.insert(key(&object), object);
            }
            filler.wake.notify_one();
        }
        filler.closed.store(true, Ordering::SeqCst);
        filler.wake.notify_one();
    });
    stream::unfold(
        (pending, None),
        move |(pending, last): (_, Option<Instant>)| async move {
            if let Some(last) = last.filter(|_| !period.is_zero()) {
                tokio::time::sleep_until(last + period).await;
            }
            loop {
                // Read before the drain: every change was recorded before the flag was set, so a
                // drain after seeing it set misses nothing.
                let closed = pending.closed.load(Ordering::SeqCst);
                // Taken whole rather than drained: a drained map keeps the room of its largest
                // burst (a list of 100,000) for as long as the process runs.
                let taken: Vec<T> = match pending.changed.lock() {
                    Ok(mut changed) => std::mem::take(&mut *changed).into_values().collect(),
                    Err(_) => Vec::new(),
                };
                if !taken.is_empty() {
                    return Some((stream::iter(taken), (pending, Some(Instant::now()))));
                }
                if closed {
                    return None;
                }
                pending.wake.notified().await;
            }
        },
    )
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use kube::runtime::watcher::Event;

    fn config_map(name: &str, version: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(version.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// Requests for one pool every 10 ms for 5 s, as a burst of claims makes them, through the
    /// controllers' debounced scheduler: straight in, the pool waits for the burst to end; handed
    /// over by [`Triggers`], it is reconciled within [`PERIOD`] + [`DEBOUNCE`].
    #[tokio::test(start_paused = true)]
    async fn a_burst_of_changes_does_not_hold_its_reconcile_back() {
        use kube::runtime::scheduler::{ScheduleRequest, debounced_scheduler};
        const BURST: Duration = Duration::from_secs(5);
        fn burst() -> futures::channel::mpsc::UnboundedReceiver<&'static str> {
            let (sender, receiver) = futures::channel::mpsc::unbounded();
            tokio::spawn(async move {
                let end = Instant::now() + BURST;
                while Instant::now() < end && sender.unbounded_send("pool").is_ok() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            });
            receiver
        }
        async fn first_reconcile(requests: impl Stream<Item = &'static str> + Send) -> Duration {
            let start = Instant::now();
            // A controller's triggers never end; the scheduler ends with its requests.
            let scheduled = requests
                .chain(stream::pending())
                .map(|message| ScheduleRequest {
                    message,
                    run_at: Instant::now(),
                });
            let mut reconciles = std::pin::pin!(debounced_scheduler(scheduled, DEBOUNCE));
            assert_eq!(reconciles.next().await, Some("pool"));
            start.elapsed()
        }
        let unthrottled = first_reconcile(burst()).await;
        assert!(unthrottled >= BURST, "straight in: {unthrottled:?}");
        let handed_over = first_reconcile(Triggers::new().with(burst()).stream()).await;
        assert!(
            handed_over <= PERIOD + DEBOUNCE + Duration::from_millis(20),
            "through Triggers: {handed_over:?}"
        );
    }

    /// The writer goes on while nobody takes the triggers (a buffer of one would block it at
    /// the second event), and the triggers then hold each object once, at its latest version.
    #[tokio::test]
    async fn a_slow_subscriber_never_holds_up_the_cache() {
        let (store, writer) = kube::runtime::reflector::store_shared::<ConfigMap>(1);
        let handle = writer.subscribe().expect("a shared store");
        let triggers = eager(handle);
        let events = (0..100).map(|i| {
            Ok(Event::Apply(config_map(
                &format!("cm-{}", i % 10),
                &i.to_string(),
            )))
        });
        let writing = kube::runtime::reflector::reflector(writer, stream::iter(events))
            .for_each(|_| async {});
        tokio::time::timeout(std::time::Duration::from_secs(10), writing)
            .await
            .expect("the writer was never held up");
        assert_eq!(store.state().len(), 10);
        let taken: Vec<Arc<ConfigMap>> = triggers.collect().await;
        let mut names: Vec<String> = taken
            .iter()
            .filter_map(|c| c.metadata.name.clone())
            .collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 10, "every changed object triggers");
        assert!(taken.len() <= 100);
    }
}
