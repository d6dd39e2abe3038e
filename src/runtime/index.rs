//! A watch cache of bitpool's own object types ([`super::cached`]): one watch decodes each
//! object, keeps what is read of it, and drops the rest. It answers what a reflector store does
//! (every object, one by namespace and name, readiness) and hands each change to the
//! controllers that subscribed, as the shared reflector does.

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::watcher;
use tokio::sync::{mpsc, watch};

/// An object type a cache of this module holds: namespaced, known by namespace and name.
pub trait Cached: Debug + Send + Sync + 'static {
    fn namespace(&self) -> &Arc<str>;
    fn name(&self) -> &Arc<str>;
}

/// Namespace → the objects of it, by name.
pub(super) type Objects<T> = HashMap<Arc<str>, HashSet<ByName<T>>>;

/// An object in a set where its name is its key: the name is kept once, in the object, rather
/// than again as a map's key (a hundred thousand keys of 16 bytes and their room).
pub(super) struct ByName<T>(Arc<T>);

impl<T: Cached> Hash for ByName<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As `str` hashes: the set is searched by `&str`.
        (**self.0.name()).hash(state);
    }
}

impl<T: Cached> PartialEq for ByName<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0.name() == other.0.name()
    }
}

impl<T: Cached> Eq for ByName<T> {}

impl<T: Cached> Borrow<str> for ByName<T> {
    fn borrow(&self) -> &str {
        self.0.name()
    }
}

struct Inner<T> {
    objects: RwLock<Objects<T>>,
    /// What changed since the watch began, while its first list is still coming
    /// ([`super::arrivals`]); empty once the list is complete.
    arrivals: RwLock<Objects<T>>,
    ready: watch::Sender<bool>,
    subscribers: Mutex<Vec<mpsc::UnboundedSender<Arc<T>>>>,
    removal_subscribers: Mutex<Vec<mpsc::UnboundedSender<Arc<T>>>>,
}

/// The reading side of a cache, cheap to clone.
pub struct Index<T> {
    inner: Arc<Inner<T>>,
}

impl<T> Clone for Index<T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<T: Cached> Default for Index<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Cached> Index<T> {
    /// An index holding nothing, not ready.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                objects: RwLock::new(HashMap::new()),
                arrivals: RwLock::new(HashMap::new()),
                ready: watch::Sender::new(false),
                subscribers: Mutex::new(Vec::new()),
                removal_subscribers: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Every cached object.
    pub fn state(&self) -> Vec<Arc<T>> {
        self.state_of(None)
    }

    /// Every cached object of `namespace`, or of every namespace for `None`.
    pub fn state_of(&self, namespace: Option<&str>) -> Vec<Arc<T>> {
        of_namespace(&self.inner.objects, namespace)
    }

    /// The object `name` of `namespace`, if it is cached.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<T>> {
        let objects = self.inner.objects.read().ok()?;
        objects.get(namespace)?.get(name).map(|o| o.0.clone())
    }

    /// The objects of `namespace` (or of every namespace, for `None`) changed since the
    /// cache's watch began, while its first list has not arrived; none once it has. True, but
    /// not all there is: for decisions that may be made from part of the objects only (see
    /// [`super::arrivals`]).
    pub fn arrivals_of(&self, namespace: Option<&str>) -> Vec<Arc<T>> {
        of_namespace(&self.inner.arrivals, namespace)
    }

    /// An object changed while the first list is coming: kept with the arrivals, and handed to
    /// the subscribers as any change is.
    pub(super) fn arrive(&self, object: T) {
        let object = Arc::new(object);
        {
            let Ok(mut arrivals) = self.inner.arrivals.write() else {
                return;
            };
            // Checked under the lock the list's completion clears the arrivals with.
            if self.is_ready() {
                return;
            }
            Self::insert(&mut arrivals, object.clone());
        }
        self.notify(&object);
    }

    /// An object deleted while the first list is coming: the subscribers that heard of its
    /// arrival hear of its removal.
    pub(super) fn depart(&self, namespace: &str, name: &str) {
        let mut removed = None;
        if let Ok(mut arrivals) = self.inner.arrivals.write()
            && let Some(names) = arrivals.get_mut(namespace)
        {
            removed = names.take(name).map(|o| o.0);
            if names.is_empty() {
                arrivals.remove(namespace);
            }
        }
        self.notify_removed(removed);
    }

    /// How many objects are cached.
    pub fn len(&self) -> usize {
        match self.inner.objects.read() {
            Ok(objects) => objects.values().map(HashSet::len).sum(),
            Err(_) => 0,
        }
    }

    /// Whether it holds no object.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the first complete list has arrived.
    pub fn is_ready(&self) -> bool {
        *self.inner.ready.borrow()
    }

    /// Waits until the first complete list has arrived.
    pub async fn wait_until_ready(&self) {
        let mut ready = self.inner.ready.subscribe();
        // An error means the cache is gone: the process is stopping.
        let _ = ready.wait_for(|ready| *ready).await;
    }

    /// Every object that changes from now on, coalesced per object so that a slow subscriber
    /// never holds the cache up (see [`super::trigger::eager`]).
    pub fn subscribe(&self) -> impl Stream<Item = Arc<T>> + Send + 'static {
        let key = |object: &Arc<T>| (object.namespace().clone(), object.name().clone());
        super::trigger::coalesced(Box::pin(self.changes()), key, Duration::ZERO)
    }

    /// The reconcile requests `mapper` makes of each object that changes from now on, for a
    /// controller's [`super::trigger::Triggers`]. Mapped as the changes come, before they wait
    /// for the controller: a list of 100,000 claims of one pool waits as one request rather
    /// than as 100,000 objects for each controller that watches the kind.
    pub fn requests<R, I>(
        &self,
        mapper: impl Fn(Arc<T>) -> I + Send + 'static,
    ) -> impl Stream<Item = R> + Send + 'static
    where
        I: IntoIterator<Item = R>,
        I::IntoIter: Send + 'static,
        R: Send + 'static,
    {
        self.changes()
            .flat_map(move |object| futures::stream::iter(mapper(object)))
    }

    /// Every object that changes from now on, each change as it comes.
    fn changes(&self) -> impl Stream<Item = Arc<T>> + Send + 'static {
        let (sender, receiver) = mpsc::unbounded_channel();
        if let Ok(mut subscribers) = self.inner.subscribers.lock() {
            subscribers.push(sender);
        }
        futures::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|object| (object, receiver))
        })
    }

    /// Every object that leaves the cache from now on (deleted, or missing from a relist), as
    /// it was last cached. Unlike [`Self::subscribe`], nothing is coalesced or dropped.
    pub fn subscribe_removed(&self) -> impl Stream<Item = Arc<T>> + Send + 'static {
        let (sender, receiver) = mpsc::unbounded_channel();
        if let Ok(mut subscribers) = self.inner.removal_subscribers.lock() {
            subscribers.push(sender);
        }
        futures::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|object| (object, receiver))
        })
    }

    fn notify(&self, object: &Arc<T>) {
        if let Ok(mut subscribers) = self.inner.subscribers.lock() {
            subscribers.retain(|s| s.send(object.clone()).is_ok());
        }
    }

    fn notify_removed(&self, removed: impl IntoIterator<Item = Arc<T>>) {
        if let Ok(mut subscribers) = self.inner.removal_subscribers.lock() {
            for object in removed {
                subscribers.retain(|s| s.send(object.clone()).is_ok());
            }
        }
    }

    fn insert(objects: &mut Objects<T>, object: Arc<T>) {
        objects
            .entry(object.namespace().clone())
            .or_default()
            .replace(ByName(object));
    }

    /// Applies one watch event; `convert` makes the cached form (`None`: not cacheable).
    pub(super) fn apply<K: Resource>(
        &self,
        event: watcher::Event<K>,
        relist: &mut Option<Objects<T>>,
        convert: impl Fn(&K) -> Option<T>,
    ) {
        match event {
            watcher::Event::Apply(object) => {
                let Some(object) = convert(&object).map(Arc::new) else {
                    return;
                };
                if let Ok(mut objects) = self.inner.objects.write() {
                    Self::insert(&mut objects, object.clone());
                }
                self.notify(&object);
            }
            watcher::Event::Delete(object) => {
                let meta = object.meta();
                let (Some(namespace), Some(name)) = (&meta.namespace, &meta.name) else {
                    return;
                };
                let mut removed = None;
                if let Ok(mut objects) = self.inner.objects.write()
                    && let Some(names) = objects.get_mut(namespace.as_str())
                {
                    removed = names.take(name.as_str()).map(|o| o.0);
                    if names.is_empty() {
                        objects.remove(namespace.as_str());
                    }
                }
                self.notify_removed(removed);
            }
            watcher::Event::Init => *relist = Some(Objects::new()),
            watcher::Event::InitApply(object) => {
                if let (Some(list), Some(object)) = (relist.as_mut(), convert(&object)) {
                    Self::insert(list, Arc::new(object));
                }
            }
            watcher::Event::InitDone => {
                let Some(list) = relist.take() else {
                    return;
                };
                let mut gone = Vec::new();
                if let Ok(mut objects) = self.inner.objects.write() {
                    let old = std::mem::replace(&mut *objects, list);
                    for (namespace, names) in old {
                        let kept = objects.get(&namespace);
                        gone.extend(
                            (names.into_iter())
                                .filter(|o| kept.is_none_or(|k| !k.contains(&**o.0.name())))
                                .map(|o| o.0),
                        );
                    }
                }
                self.notify_removed(gone);
                self.inner.ready.send_replace(true);
                if let Ok(mut arrivals) = self.inner.arrivals.write() {
                    *arrivals = Objects::new();
                }
                // As the shared reflector does: every object once the list is complete.
                for object in self.state() {
                    self.notify(&object);
                }
            }
        }
    }
}

/// The objects of `namespace` in `objects`, or of every namespace for `None`.
fn of_namespace<T: Cached>(objects: &RwLock<Objects<T>>, namespace: Option<&str>) -> Vec<Arc<T>> {
    let Ok(objects) = objects.read() else {
        return Vec::new();
    };
    match namespace {
        Some(namespace) => (objects.get(namespace).into_iter())
            .flat_map(|m| m.iter().map(|o| o.0.clone()))
            .collect(),
        None => (objects.values())
            .flat_map(|m| m.iter().map(|o| o.0.clone()))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[derive(Debug, PartialEq)]
    struct Named {
        namespace: Arc<str>,
        name: Arc<str>,
        version: u32,
    }

    impl Cached for Named {
        fn namespace(&self) -> &Arc<str> {
            &self.namespace
        }
        fn name(&self) -> &Arc<str> {
            &self.name
        }
    }

    fn named(name: &str, version: u32) -> ConfigMap {
        ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(version.to_string()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn same(object: &ConfigMap) -> Option<Named> {
        let meta = &object.metadata;
        Some(Named {
            namespace: Arc::from(meta.namespace.as_deref()?),
            name: Arc::from(meta.name.as_deref()?),
            version: meta.resource_version.as_deref()?.parse().ok()?,
        })
    }

    /// A relist replaces the cache whole (what vanished meanwhile goes), readiness comes with
    /// the first complete list, and every object is handed to subscribers then.
    #[tokio::test]
    async fn a_relist_replaces_the_cache_and_makes_it_ready() {
        let index: Index<Named> = Index::new();
        let triggers = index.subscribe();
        let removed = index.subscribe_removed();
        let mut relist = None;
        index.apply(watcher::Event::Apply(named("old", 1)), &mut relist, same);
        assert!(!index.is_ready());
        index.apply(watcher::Event::Init, &mut relist, same);
        index.apply(watcher::Event::InitApply(named("a", 1)), &mut relist, same);
        index.apply(watcher::Event::InitApply(named("b", 1)), &mut relist, same);
        assert_eq!(
            index.len(),
            1,
            "the old state stands until the list is complete"
        );
        index.apply(watcher::Event::InitDone, &mut relist, same);
        assert!(index.is_ready());
        index.wait_until_ready().await;
        assert!(index.get("ns", "old").is_none());
        assert_eq!(index.get("ns", "a").map(|a| a.version), Some(1));
        index.apply(watcher::Event::Apply(named("a", 2)), &mut relist, same);
        index.apply(watcher::Event::Delete(named("b", 1)), &mut relist, same);
        assert_eq!(index.get("ns", "a").map(|a| a.version), Some(2));
        assert!(index.get("ns", "b").is_none());
        assert_eq!(index.len(), 1);
        assert_eq!(index.state_of(Some("ns")).len(), 1);
        assert!(index.state_of(Some("other")).is_empty());
        assert_eq!(index.state_of(None).len(), 1);
        drop(index);
        let mut names: Vec<String> = triggers.map(|o| o.name.to_string()).collect().await;
        names.sort();
        names.dedup();
        assert_eq!(names, ["a", "b", "old"]);
        let removed: Vec<String> = removed.map(|o| o.name.to_string()).collect().await;
        assert_eq!(
            removed,
            ["old", "b"],
            "missing from the relist, then deleted"
        );
    }

    /// While the first list is coming, the changes since the watch began are the arrivals:
    /// handed to subscribers, gone when deleted (the removal told), not the cache, and dropped
    /// once the list is complete, after which none are taken.
    #[tokio::test]
    async fn arrivals_stand_until_the_first_list_is_complete() {
        let index: Index<Named> = Index::new();
        let triggers = index.subscribe();
        let removed = index.subscribe_removed();
        let arrived = |name: &str, version: u32| same(&named(name, version)).expect("named");
        index.arrive(arrived("new", 5));
        index.arrive(arrived("gone", 6));
        index.depart("ns", "gone");
        let names = |objects: Vec<Arc<Named>>| -> Vec<String> {
            objects.iter().map(|o| o.name.to_string()).collect()
        };
        assert_eq!(names(index.arrivals_of(Some("ns"))), ["new"]);
        assert_eq!(names(index.arrivals_of(None)), ["new"]);
        assert!(index.arrivals_of(Some("other")).is_empty());
        assert!(
            index.get("ns", "new").is_none(),
            "arrivals are not the cache"
        );
        let mut relist = None;
        index.apply(watcher::Event::Init, &mut relist, same);
        index.apply(watcher::Event::InitApply(named("a", 1)), &mut relist, same);
        index.apply(watcher::Event::InitDone, &mut relist, same);
        assert!(index.arrivals_of(None).is_empty(), "dropped with the list");
        index.arrive(arrived("late", 7));
        assert!(index.arrivals_of(None).is_empty(), "taken after the list");
        drop(index);
        let mut told: Vec<String> = triggers.map(|o| o.name.to_string()).collect().await;
        told.sort();
        assert_eq!(told, ["a", "gone", "new"]);
        let removed: Vec<String> = removed.map(|o| o.name.to_string()).collect().await;
        assert_eq!(removed, ["gone"]);
    }

    /// Many objects that map to one reconcile request wait as that request: a controller that
    /// takes its triggers late gets it a few times at most, never once per object.
    #[tokio::test]
    async fn triggers_wait_as_requests_not_as_objects() {
        const OBJECTS: usize = 10_000;
        let index: Index<Named> = Index::new();
        let requests = super::super::trigger::Triggers::new()
            .with(index.requests(|object: Arc<Named>| [format!("pool-{}", object.namespace)]))
            .stream();
        let mut relist = None;
        index.apply(watcher::Event::Init, &mut relist, same);
        for i in 0..OBJECTS {
            let object = named(&format!("claim-{i}"), 1);
            index.apply(watcher::Event::InitApply(object), &mut relist, same);
        }
        index.apply(watcher::Event::InitDone, &mut relist, same);
        drop(index);
        let requests: Vec<String> = requests.collect().await;
        assert!(!requests.is_empty(), "the list triggers its pool");
        assert!(requests.iter().all(|r| r == "pool-ns"), "{requests:?}");
        assert!(
            requests.len() <= OBJECTS / 100,
            "{} requests for one pool of {OBJECTS} objects",
            requests.len()
        );
    }
}
