//! The claims that change while a cache's first list is still coming. With 100,000 objects the
//! server takes tens of seconds to send that list, and a claim made after the process started
//! comes only after all of it. So a second, short-lived watch follows the changes from a version
//! taken just before the list began, into the index's arrivals ([`Index::arrivals_of`]), until
//! the list is complete. What it sees is true but partial: a pool may serve new claims from it
//! (their addresses come from the pool's ledger), never release or judge anything by what it
//! lacks. It is an accelerator only: when it cannot start, or the server no longer has the
//! version it began at, claims simply wait for the list, as before.

use std::fmt::Debug;
use std::time::Duration;

use futures::StreamExt;
use kube::Resource;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::core::Status;
use kube::core::response::reason;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;

use super::index::{Cached, Index};
use super::lean::Lean;
use super::resume::Start;

/// Wait before resuming a watch that failed (not one the server ended: that resumes at once).
const RETRY: Duration = Duration::from_secs(1);

/// Where the changes are followed from: the collection's current version, read with a list of
/// at most one object (cheap at any size). Taken before the first list begins, so that list's
/// snapshot is no older and every change after it is in one of the two. `None` when the server
/// does not answer: then nothing is followed.
pub(super) async fn current_version<K>(
    api: &Api<Lean<K>>,
    config: &watcher::Config,
) -> Option<String>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let mut params = ListParams::default().limit(1);
    params.label_selector = config.label_selector.clone();
    params.field_selector = config.field_selector.clone();
    match api.list_metadata(&params).await {
        Ok(list) => list.metadata.resource_version.filter(|v| !v.is_empty()),
        Err(e) => {
            tracing::info!(kind = %K::kind(&()), error = %e,
                "cannot read the current version: new objects wait for the first list");
            None
        }
    }
}

/// Follows every change of `api`'s objects from `start.at` into `index`'s arrivals, until the
/// index holds its first complete list; from `start.fallback` if the server no longer has the
/// first version (a record of the last process's, [`super::resume`], compacted since).
pub(super) async fn follow<K, T>(
    api: Api<Lean<K>>,
    config: watcher::Config,
    start: Start,
    index: Index<T>,
    convert: fn(&K) -> Option<T>,
) where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    T: Cached,
{
    let params = WatchParams {
        label_selector: config.label_selector,
        field_selector: config.field_selector,
        ..WatchParams::default()
    };
    let kind = K::kind(&()).to_string();
    let listed = index.clone();
    let (mut version, mut fallback) = (start.at, start.fallback);
    let following = async move {
        loop {
            match watch_once(&api, &params, &mut version, &index, convert).await {
                Resume::At => {}
                Resume::After(e) => {
                    tracing::debug!(%kind, error = %e, "the watch of arrivals failed; resuming");
                    tokio::time::sleep(RETRY).await;
                }
                Resume::Never(why) => match fallback.take() {
                    Some(now) => {
                        tracing::info!(%kind, %why, from = %version,
                            "cannot follow the changes from where the last process left them: objects made while it was down wait for the first list");
                        version = now;
                    }
                    None => {
                        tracing::info!(%kind, %why, "new objects wait for the first list");
                        return;
                    }
                },
            }
        }
    };
    tokio::select! {
        () = following => {}
        () = listed.wait_until_ready() => {}
    }
}

/// What to do once a watch has ended.
enum Resume {
    /// The server ended it (watches time out): resume from the last version seen.
    At,
    /// It failed: resume after [`RETRY`].
    After(String),
    /// The version is gone (compacted) or the server refuses: stop following.
    Never(String),
}

async fn watch_once<K, T>(
    api: &Api<Lean<K>>,
    params: &WatchParams,
    version: &mut String,
    index: &Index<T>,
    convert: fn(&K) -> Option<T>,
) -> Resume
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    T: Cached,
{
    let events = match api.watch(params, version).await {
        Ok(events) => events,
        Err(kube::Error::Api(status)) if version_gone(&status) || status.is_invalid() => {
            return Resume::Never(status.message);
        }
        Err(e) => return Resume::After(e.to_string()),
    };
    futures::pin_mut!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(WatchEvent::Added(Lean(object)) | WatchEvent::Modified(Lean(object))) => {
                advance(version, object.meta().resource_version.as_deref());
                if let Some(object) = convert(&object) {
                    index.arrive(object);
                }
            }
            Ok(WatchEvent::Deleted(Lean(object))) => {
                advance(version, object.meta().resource_version.as_deref());
                let meta = object.meta();
                if let (Some(namespace), Some(name)) = (&meta.namespace, &meta.name) {
                    index.depart(namespace, name);
                }
            }
            Ok(WatchEvent::Bookmark(bookmark)) => {
                advance(version, Some(&bookmark.metadata.resource_version));
            }
            Ok(WatchEvent::Error(status)) if version_gone(&status) => {
                return Resume::Never(status.message);
            }
            Ok(WatchEvent::Error(status)) => return Resume::After(status.message),
            Err(e) => return Resume::After(e.to_string()),
        }
    }
    Resume::At
}

/// Whether the server no longer has the version a watch asked for (410, compacted).
fn version_gone(status: &Status) -> bool {
    status.code == 410 || [reason::EXPIRED, reason::GONE].contains(&status.reason.as_str())
}

fn advance(version: &mut String, seen: Option<&str>) {
    if let Some(seen) = seen.filter(|v| !v.is_empty()) {
        *version = seen.to_string();
    }
}
