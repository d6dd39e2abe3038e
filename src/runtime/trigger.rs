//! Controller triggers from a shared cache that never hold up its watch.
//!
//! A shared reflector hands every change to each subscriber through a bounded buffer and waits
//! when one is full: a controller that takes its triggers slowly (a long reconcile, a busy
//! scheduler) would freeze the cache every controller reads, and a frozen cache makes reconciles
//! see objects long gone. Each subscriber here is drained at once into a set holding the latest
//! version of each changed object, which its controller takes at its own pace: memory is bounded
//! by the number of objects, never by the number of events.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt, stream};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, ReflectHandle};
use tokio::sync::Notify;

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
    coalesced(handle, |object: &Arc<K>| ObjectRef::from(&**object))
}

/// The items of `changes`, drained at once and held as the latest one per `key`, taken at the
/// consumer's pace.
pub fn coalesced<T, Key>(
    mut changes: impl Stream<Item = T> + Unpin + Send + 'static,
    key: impl Fn(&T) -> Key + Send + 'static,
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
    stream::unfold(pending, |pending| async move {
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
                return Some((stream::iter(taken), pending));
            }
            if closed {
                return None;
            }
            pending.wake.notified().await;
        }
    })
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
