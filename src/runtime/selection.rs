//! A kube store of stand-ins for the few objects of an [`Index`] a controller works on, so that
//! a kube `Controller` (which needs a store of its own kind) can reconcile them without a second
//! cache of every object: a stand-in carries only the object's namespace and name, and the
//! reconcile reads the object itself from the index.

use std::future::Future;
use std::sync::Arc;

use futures::{Stream, StreamExt, stream};
use kube::Resource;
use kube::runtime::reflector::{Store, store::Writer};
use kube::runtime::watcher;

use super::index::{Cached, Index};

enum Change<T> {
    Changed(Arc<T>),
    Removed(Arc<T>),
    /// Every object is judged again (what `keep` reads may have changed without them).
    Resync,
}

/// The objects of `index` that `keep` picks, as stand-ins made by `stand_in`: the store a
/// controller looks them up in, and the stream of its triggers (each picked object as it
/// changes). Nothing is judged before `ready` (what `keep` reads must be complete); `resync`
/// judges every object again.
pub fn selection<K, T>(
    index: &Index<T>,
    ready: impl Future<Output = ()> + Send + 'static,
    resync: impl Stream<Item = ()> + Send + 'static,
    keep: impl Fn(&Arc<T>) -> bool + Send + 'static,
    stand_in: fn(&T) -> K,
) -> (Store<K>, impl Stream<Item = Arc<K>> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    T: Cached,
{
    let mut judge = Judge::new(index.clone(), keep, stand_in);
    let store = judge.writer.as_reader();
    let changes = stream::select(
        stream::select(
            index.subscribe().map(Change::Changed),
            index.subscribe_removed().map(Change::Removed),
        ),
        resync.map(|()| Change::Resync),
    );
    let triggers = stream::once(async move {
        ready.await;
        changes
    })
    .flatten()
    .flat_map(move |change| stream::iter(judge.judge(change)));
    (store, triggers)
}

/// Keeps the store of stand-ins: what `keep` picks is in it, nothing else.
struct Judge<K: Resource<DynamicType = ()> + Clone + 'static, T, F> {
    writer: Writer<K>,
    index: Index<T>,
    keep: F,
    stand_in: fn(&T) -> K,
}

impl<K, T, F> Judge<K, T, F>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
    T: Cached,
    F: Fn(&Arc<T>) -> bool,
{
    fn new(index: Index<T>, keep: F, stand_in: fn(&T) -> K) -> Self {
        let mut writer = Writer::default();
        // Ready at once: a controller runs nothing before its store is ready, and the stand-ins
        // come only once `ready` (which the reconciles wait for too) has passed.
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        Self {
            writer,
            index,
            keep,
            stand_in,
        }
    }

    /// Applies one change to the store; returns the picked objects it concerns.
    fn judge(&mut self, change: Change<T>) -> Vec<Arc<K>> {
        let judged = match change {
            Change::Changed(object) => vec![object],
            Change::Removed(object) => {
                let gone = (self.stand_in)(&object);
                self.writer
                    .apply_watcher_event(&watcher::Event::Delete(gone));
                return Vec::new();
            }
            Change::Resync => self.index.state(),
        };
        let mut picked = Vec::new();
        for object in judged {
            let stand_in = (self.stand_in)(&object);
            if (self.keep)(&object) {
                self.writer
                    .apply_watcher_event(&watcher::Event::Apply(stand_in.clone()));
                picked.push(Arc::new(stand_in));
            } else {
                self.writer
                    .apply_watcher_event(&watcher::Event::Delete(stand_in));
            }
        }
        picked
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use kube::runtime::reflector::ObjectRef;

    #[derive(Debug)]
    struct Named {
        namespace: Arc<str>,
        name: Arc<str>,
        wanted: bool,
    }

    impl Cached for Named {
        fn namespace(&self) -> &Arc<str> {
            &self.namespace
        }
        fn name(&self) -> &Arc<str> {
            &self.name
        }
    }

    fn config_map(name: &str, wanted: bool) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                labels: wanted.then(|| [("wanted".to_string(), String::new())].into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn cached(object: &ConfigMap) -> Option<Named> {
        Some(Named {
            namespace: object.metadata.namespace.as_deref()?.into(),
            name: object.metadata.name.as_deref()?.into(),
            wanted: object.metadata.labels.is_some(),
        })
    }

    fn stand_in(object: &Named) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(object.name.to_string()),
                namespace: Some(object.namespace.to_string()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn named(name: &str, wanted: bool) -> Arc<Named> {
        Arc::new(Named {
            namespace: "ns".into(),
            name: name.into(),
            wanted,
        })
    }

    /// Only picked objects are in the store and trigger; an object no longer picked, or gone
    /// from the index, leaves the store; a resync judges what the index holds again.
    #[test]
    fn the_store_holds_what_is_picked_and_nothing_else() {
        let index = Index::new();
        let mut judge = Judge::new(index.clone(), |n: &Arc<Named>| n.wanted, stand_in);
        let store = judge.writer.as_reader();
        assert!(
            futures::FutureExt::now_or_never(store.wait_until_ready()).is_some(),
            "a controller waits for its store to be ready"
        );
        let in_store = |name: &str| store.get(&ObjectRef::new(name).within("ns")).is_some();
        let names = |picked: Vec<Arc<ConfigMap>>| -> Vec<String> {
            picked
                .iter()
                .filter_map(|c| c.metadata.name.clone())
                .collect()
        };
        assert_eq!(names(judge.judge(Change::Changed(named("a", true)))), ["a"]);
        assert!(names(judge.judge(Change::Changed(named("b", false)))).is_empty());
        assert!(in_store("a") && !in_store("b"));
        assert!(names(judge.judge(Change::Changed(named("a", false)))).is_empty());
        assert_eq!(names(judge.judge(Change::Changed(named("b", true)))), ["b"]);
        assert!(!in_store("a") && in_store("b"));
        assert!(names(judge.judge(Change::Removed(named("b", true)))).is_empty());
        assert!(!in_store("b"));
        let watched = super::super::watched::Watched::new(cached);
        watched.load([config_map("c", true), config_map("d", false)]);
        let mut judge = Judge::new(watched.index.clone(), |n: &Arc<Named>| n.wanted, stand_in);
        assert_eq!(names(judge.judge(Change::Resync)), ["c"]);
    }
}
