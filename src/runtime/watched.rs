//! A watch cache: the objects of kind `K` one watch returns, kept in an [`Index`] of the
//! compact `T` made from each, with the first list streamed where the server can, and the
//! changes made while it comes followed ([`super::arrivals`]).

use std::fmt::Debug;

use futures::{Stream, StreamExt, future};
use kube::Resource;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;

use super::index::{Cached, Index, Objects};
use super::lean::Lean;
use super::resume::{Followed, Position, ResumeRecord, Start};

/// A cache of `T` made from the objects of kind `K` one watch returns.
pub struct Watched<K, T> {
    pub index: Index<T>,
    convert: fn(&K) -> Option<T>,
    /// Where an earlier process recorded how far it followed the changes ([`super::resume`]).
    resume: Option<ResumeRecord>,
    /// How far this watch has followed the changes; set where changes are followed while the
    /// first list is coming ([`super::arrivals`]).
    position: Option<Position>,
    driver: Option<tokio::task::JoinHandle<()>>,
}

impl<K, T> Watched<K, T>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    T: Cached,
{
    /// A cache that makes each object with `convert` (`None` leaves it out).
    pub fn new(convert: fn(&K) -> Option<T>) -> Self {
        Self {
            index: Index::new(),
            convert,
            resume: None,
            position: None,
            driver: None,
        }
    }

    /// Follows the objects' changes while the first list is coming ([`super::arrivals`]), and
    /// keeps how far they have been followed ([`Self::position`]).
    pub fn with_arrivals(mut self) -> Self {
        self.position = Some(Position::default());
        self
    }

    /// Follows the changes while the first list is coming from where an earlier process
    /// recorded it had followed them, rather than from now (before [`Self::start`]).
    pub fn resume_from(&mut self, record: ResumeRecord) {
        self.resume = Some(record);
    }

    /// The record the watch resumes from and how far it has followed the changes, where it
    /// follows arrivals from a record: what that record is kept from.
    pub fn followed(&self) -> Option<Followed> {
        Some(Followed {
            record: self.resume.clone()?,
            position: self.position.clone()?,
        })
    }

    /// Replaces what the cache holds with `objects`, as a complete list from the server does.
    pub fn load(&self, objects: impl IntoIterator<Item = K>) {
        let mut relist = None;
        self.index
            .apply(watcher::Event::Init, &mut relist, self.convert);
        for object in objects {
            self.index
                .apply(watcher::Event::InitApply(object), &mut relist, self.convert);
        }
        self.index
            .apply(watcher::Event::InitDone, &mut relist, self.convert);
    }

    /// Starts the watch that fills the cache (after every subscriber is registered); its
    /// objects are decoded without their managed fields.
    pub fn start(&mut self, api: Api<Lean<K>>, config: watcher::Config) {
        self.start_after(api, config, future::ready(()));
    }

    /// Like [`Self::start`], but the watch begins once `after` completes.
    ///
    /// The first list is streamed (watch events, one object at a time) where the server can:
    /// a list of 100,000 objects in one response is held whole, as text and decoded, and was
    /// most of a restarted process's peak memory. Once a server refuses to stream, the watch
    /// lists with `config` from then on, as client-go's reflector falls back.
    pub fn start_after(
        &mut self,
        api: Api<Lean<K>>,
        config: watcher::Config,
        after: impl Future<Output = ()> + Send + 'static,
    ) {
        if self.driver.is_some() {
            return;
        }
        let (index, convert) = (self.index.clone(), self.convert);
        let (resume, position) = (self.resume.clone(), self.position.clone());
        let arrivals = position.is_some();
        let kind = K::kind(&()).to_string();
        self.driver = Some(tokio::spawn(async move {
            after.await;
            let start = match arrivals {
                true => arrivals_start(&api, &config, resume.as_ref()).await,
                false => None,
            };
            let arrivals = start.map(|start| {
                super::arrivals::follow(api.clone(), config.clone(), start, index.clone(), convert)
            });
            let streamed = watcher(api.clone(), config.clone().streaming_lists());
            let mut feed = Feed {
                index,
                convert,
                kind,
                relist: None,
                position,
            };
            let cache = async move {
                if feed.follow(streamed, ListStrategy::Streamed).await == Ended::Refused {
                    feed.follow(watcher(api, config), ListStrategy::Listed)
                        .await;
                }
            };
            match arrivals {
                Some(arrivals) => {
                    future::join(arrivals, cache).await;
                }
                None => cache.await,
            }
        }));
    }
}

/// Where the arrivals watch begins: the earlier process's record where there is one the server
/// still has, else the current version. Both are read before the list begins (see
/// `arrivals::current_version`); `None` when the server does not answer.
async fn arrivals_start<K>(
    api: &Api<Lean<K>>,
    config: &watcher::Config,
    resume: Option<&ResumeRecord>,
) -> Option<Start>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let recorded = match resume {
        Some(record) => record.read(&api.clone().into_client()).await,
        None => None,
    };
    let current = super::arrivals::current_version(api, config).await?;
    let start = super::resume::start(recorded, current);
    if start.fallback.is_some() {
        tracing::info!(kind = %K::kind(&()), from = %start.at,
            "following the changes from where the last process left them");
    }
    Some(start)
}

/// How a watch gets its first list of objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ListStrategy {
    Streamed,
    Listed,
}

/// Why a watch's stream ended.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// The server refused to stream a list.
    Refused,
    /// The stream ended (it does not, but for the task's abort).
    Closed,
}

/// A watch's events, applied to one index.
struct Feed<K, T> {
    index: Index<T>,
    convert: fn(&K) -> Option<T>,
    kind: String,
    relist: Option<Objects<T>>,
    /// Advanced by every change applied after the first list.
    position: Option<Position>,
}

impl<K: Resource<DynamicType = ()> + Clone + Debug + Send + 'static, T: Cached> Feed<K, T> {
    async fn follow(
        &mut self,
        events: impl Stream<Item = watcher::Result<watcher::Event<Lean<K>>>> + Send,
        strategy: ListStrategy,
    ) -> Ended {
        let events = events.default_backoff();
        futures::pin_mut!(events);
        while let Some(event) = events.next().await {
            match event {
                Ok(event) => {
                    if let (Some(position), watcher::Event::Apply(o) | watcher::Event::Delete(o)) =
                        (&self.position, &event)
                    {
                        position.advance(o.meta().resource_version.as_deref());
                    }
                    let convert = self.convert;
                    self.index
                        .apply(event, &mut self.relist, |Lean(object)| convert(object));
                }
                // At the first list or at any later one: during a rolling upgrade the next
                // relist may reach an API server of the older version.
                Err(e) if strategy == ListStrategy::Streamed && refuses_streaming(&e) => {
                    tracing::warn!(kind = %self.kind, error = %e,
                        "the API server does not stream lists; listing instead");
                    self.relist = None;
                    return Ended::Refused;
                }
                Err(e) => tracing::warn!(kind = %self.kind, error = %e, "watch failed; retrying"),
            }
        }
        Ended::Closed
    }
}

/// Whether a watch error is the server refusing a streamed list (`sendInitialEvents`): a server
/// without the WatchList feature answers Invalid (422) or BadRequest (400) at the watch's start.
fn refuses_streaming(error: &watcher::Error) -> bool {
    let status = match error {
        watcher::Error::WatchStartFailed(kube::Error::Api(status)) => status,
        watcher::Error::WatchError(status) => status,
        _ => return false,
    };
    status.is_invalid() || status.reason == kube::core::response::reason::BAD_REQUEST
}

impl<K, T> Drop for Watched<K, T> {
    fn drop(&mut self) {
        if let Some(driver) = &self.driver {
            driver.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_refused_stream_falls_back_to_a_list() {
        use kube::core::Status;
        use kube::core::response::reason;
        let start =
            |status: Status| watcher::Error::WatchStartFailed(kube::Error::Api(Box::new(status)));
        // As a server without the WatchList feature answers `sendInitialEvents`.
        let forbidden_parameter = Status::failure(
            "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden",
            reason::INVALID,
        )
        .with_code(422);
        assert!(refuses_streaming(&start(forbidden_parameter)));
        let bad_request = Status::failure("bad", reason::BAD_REQUEST).with_code(400);
        assert!(refuses_streaming(&watcher::Error::WatchError(Box::new(
            bad_request
        ))));
        // Outages, lost permissions and expired versions are retried as they are.
        for (reason, code) in [
            (reason::FORBIDDEN, 403),
            (reason::EXPIRED, 410),
            (reason::SERVICE_UNAVAILABLE, 503),
            (reason::TIMEOUT, 504),
        ] {
            let status = Status::failure("", reason).with_code(code);
            assert!(!refuses_streaming(&start(status)), "{reason}");
        }
        assert!(!refuses_streaming(&watcher::Error::NoResourceVersion));
    }
}
