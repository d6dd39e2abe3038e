//! Where a restarted process picks the claims' changes up. A claim made while no process ran
//! is in the claims' first list, which at 100,000 claims takes the server tens of seconds. So a
//! running process records how far it has followed the claims (a version of their collection)
//! in a ConfigMap beside the ledgers, and the next process follows the changes from there while
//! its list is coming ([`super::arrivals`]): a claim made while it was down is one of them.
//!
//! The record is only ever a starting point for that accelerator, never a judgement: what the
//! arrivals show is true but partial, and nothing is decided from what they lack. A version the
//! server no longer has (compacted: the API server keeps at least five minutes of history by
//! default) or one it cannot have yet falls back to the collection's current version, as before.
//!
//! Written when the claims change, at most every [`RECORD_EVERY`] (a change within that time of
//! the last record is not written later: any earlier version is a valid starting point, it only
//! makes the next start follow a little more), and once at a clean shutdown, with the version
//! the collection has then: at rest nothing is written.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tokio::time::Instant;

use super::context::{Context, Settings};
use crate::api::labels;

/// The shortest time between two records while the claims change.
pub const RECORD_EVERY: Duration = Duration::from_secs(5);

/// The key of the claims' version in the record.
const CLAIMS_KEY: &str = "ipaddressclaims.ipam.cluster.x-k8s.io";
/// The key saying which process scope the record is for.
const SCOPE_KEY: &str = "scope";
/// The record of a process that watches every namespace, unfiltered.
const DEFAULT_NAME: &str = "bitpool-resume";

/// The ConfigMap one process scope (its namespace and watch filter) records its claims'
/// version in: processes of different scopes follow different claims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumeRecord {
    pub namespace: String,
    pub name: String,
    /// What the process watches, as people read it.
    pub scope: String,
}

impl ResumeRecord {
    /// The record of the processes run with `settings`.
    pub fn of(settings: &Settings) -> Self {
        let watched = match &settings.namespace {
            Some(namespace) => format!("namespace {namespace}"),
            None => "all namespaces".to_string(),
        };
        let (name, scope) = match &settings.watch_filter {
            None if settings.namespace.is_none() => (DEFAULT_NAME.to_string(), watched),
            filter => {
                let scope = match filter {
                    Some(value) => format!("{watched}, {}={value}", labels::WATCH_FILTER),
                    None => watched,
                };
                (format!("{DEFAULT_NAME}-{:016x}", fnv1a(&scope)), scope)
            }
        };
        Self {
            namespace: settings.ledger_namespace.clone(),
            name,
            scope,
        }
    }

    /// The claims' version recorded by an earlier process, if there is one it could read.
    pub async fn read(&self, client: &Client) -> Option<String> {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &self.namespace);
        match api.get_opt(&self.name).await {
            Ok(found) => found.and_then(|record| recorded_version(&record, &self.scope)),
            Err(e) => {
                tracing::info!(record = %self, error = %e,
                    "cannot read where the last process left the claims: claims made while it was down wait for the list");
                None
            }
        }
    }

    /// Records `version` as how far the claims have been followed.
    pub async fn write(&self, client: &Client, version: &str) -> Result<(), kube::Error> {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &self.namespace);
        let record = ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some([(labels::MANAGED_BY.to_string(), "bitpool".to_string())].into()),
                ..ObjectMeta::default()
            },
            data: Some(
                [
                    (SCOPE_KEY.to_string(), self.scope.clone()),
                    (CLAIMS_KEY.to_string(), version.to_string()),
                ]
                .into(),
            ),
            ..ConfigMap::default()
        };
        // An unconditional update: the newest record wins, and any is a valid starting point.
        let params = PostParams {
            field_manager: Some(crate::api::FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        match api.replace(&self.name, &params, &record).await {
            Err(kube::Error::Api(status)) if status.is_not_found() => {
                match api.create(&params, &record).await {
                    Err(kube::Error::Api(status)) if status.is_already_exists() => {
                        api.replace(&self.name, &params, &record).await.map(drop)
                    }
                    created => created.map(drop),
                }
            }
            replaced => replaced.map(drop),
        }
    }
}

impl std::fmt::Display for ResumeRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ConfigMap {}/{}", self.namespace, self.name)
    }
}

/// The version in `record`, if it is the record of `scope` (two scopes hashing alike must not
/// resume from each other's claims).
fn recorded_version(record: &ConfigMap, scope: &str) -> Option<String> {
    let data = record.data.as_ref()?;
    if data.get(SCOPE_KEY).map(String::as_str) != Some(scope) {
        tracing::warn!(record = %record.name_any(), "the resume record is for another scope; ignored");
        return None;
    }
    data.get(CLAIMS_KEY).filter(|v| !v.is_empty()).cloned()
}

/// A stable 64-bit FNV-1a hash: the record's name must not change between releases.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Where the arrivals watch begins, and where it falls back to if the server no longer has
/// that version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Start {
    pub at: String,
    pub fallback: Option<String>,
}

/// From the `recorded` version where it is older than the `current` one (the collection's,
/// read just before its list begins), else from the current one.
///
/// Versions are opaque to clients; they are compared here only to refuse a record the server
/// cannot have reached yet (one restored from another cluster, say), which a watch would wait
/// for instead of showing today's claims. Versions that are not numbers are taken as they are.
pub fn start(recorded: Option<String>, current: String) -> Start {
    let ahead = |recorded: &str| match (recorded.parse::<u64>(), current.parse::<u64>()) {
        (Ok(recorded), Ok(current)) => recorded >= current,
        _ => recorded == current,
    };
    if let Some(recorded) = recorded {
        if !ahead(&recorded) {
            return Start {
                at: recorded,
                fallback: Some(current),
            };
        }
        if recorded != current {
            tracing::warn!(%recorded, %current,
                "the resume record is ahead of the server: following the claims from now");
        }
    }
    Start {
        at: current,
        fallback: None,
    }
}

/// The version of the claims' latest change a watch has applied, shared with the recorder.
#[derive(Clone, Debug)]
pub struct Position(watch::Sender<Option<String>>);

impl Default for Position {
    fn default() -> Self {
        Self(watch::Sender::new(None))
    }
}

impl Position {
    /// A change at `version` was applied.
    pub(super) fn advance(&self, version: Option<&str>) {
        if let Some(version) = version.filter(|v| !v.is_empty()) {
            self.0.send_if_modified(|seen| {
                let changed = seen.as_deref() != Some(version);
                if changed {
                    *seen = Some(version.to_string());
                }
                changed
            });
        }
    }

    /// Follows the position's changes.
    pub fn subscribe(&self) -> watch::Receiver<Option<String>> {
        self.0.subscribe()
    }
}

/// A watch that resumes from `record`, and how far it has followed the changes since.
#[derive(Clone, Debug)]
pub struct Followed {
    pub record: ResumeRecord,
    pub position: Position,
}

/// Keeps the record while the process runs: while it leads, at a change of the claims, unless
/// the last record is younger than [`RECORD_EVERY`] (the changes since are left to the next
/// record or the stop, never written once the claims rest); at shutdown (`stopped`), once more
/// with the version the collection has then (`now`), so that the next process follows from
/// there even after a long rest.
pub async fn keep<F>(
    Followed { record, position }: Followed,
    ctx: Arc<Context>,
    mut stopped: watch::Receiver<bool>,
    now: F,
) where
    F: Future<Output = Option<String>>,
{
    let mut moved = position.subscribe();
    let mut last_written: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = stopped.wait_for(|stopped| *stopped) => break,
            changed = moved.changed() => if changed.is_err() { break },
        }
        let seen = moved.borrow_and_update().clone();
        let recent = last_written.is_some_and(|at| at.elapsed() < RECORD_EVERY);
        if let Some(seen) = seen.filter(|_| !recent && ctx.ops.leadership.is_leading())
            && write_logged(&record, &ctx, &seen).await
        {
            last_written = Some(Instant::now());
        }
    }
    if !ctx.ops.leadership.is_leading() {
        return;
    }
    let last = moved.borrow().clone();
    if let Some(version) = now.await.or(last) {
        write_logged(&record, &ctx, &version).await;
    }
}

/// Writes the record; whether it was written (a failure only makes the next start slower).
async fn write_logged(record: &ResumeRecord, ctx: &Context, version: &str) -> bool {
    match record.write(&ctx.client, version).await {
        Ok(()) => true,
        Err(e) => {
            tracing::info!(%record, error = %e, "cannot record how far the claims were followed");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(namespace: Option<&str>, filter: Option<&str>) -> Settings {
        Settings {
            namespace: namespace.map(String::from),
            watch_filter: filter.map(String::from),
            ..Settings::for_tests()
        }
    }

    #[test]
    fn each_scope_has_a_record_of_its_own() {
        let all = ResumeRecord::of(&settings(None, None));
        assert_eq!(all.name, "bitpool-resume");
        assert_eq!(all.namespace, "bitpool-system");
        let records = [
            all,
            ResumeRecord::of(&settings(Some("team-a"), None)),
            ResumeRecord::of(&settings(Some("team-b"), None)),
            ResumeRecord::of(&settings(None, Some("blue"))),
            ResumeRecord::of(&settings(Some("team-a"), Some("blue"))),
        ];
        let names: std::collections::BTreeSet<_> = records.iter().map(|r| &r.name).collect();
        assert_eq!(names.len(), records.len(), "{records:?}");
        assert_eq!(
            records[4].scope,
            "namespace team-a, cluster.x-k8s.io/watch-filter=blue"
        );
        // The name is a DNS label and does not change between releases.
        assert_eq!(
            ResumeRecord::of(&settings(Some("team-a"), None)).name,
            format!("bitpool-resume-{:016x}", fnv1a("namespace team-a"))
        );
        assert!(records.iter().all(|r| r.name.len() <= 63));
    }

    #[test]
    fn a_record_of_another_scope_is_not_followed() {
        let record = |scope: &str| ConfigMap {
            data: Some(
                [
                    (SCOPE_KEY.to_string(), scope.to_string()),
                    (CLAIMS_KEY.to_string(), "120".to_string()),
                ]
                .into(),
            ),
            ..ConfigMap::default()
        };
        assert_eq!(
            recorded_version(&record("all namespaces"), "all namespaces").as_deref(),
            Some("120")
        );
        assert_eq!(
            recorded_version(&record("namespace x"), "all namespaces"),
            None
        );
        assert_eq!(
            recorded_version(&ConfigMap::default(), "all namespaces"),
            None
        );
    }

    #[test]
    fn the_watch_starts_from_an_older_record_and_falls_back_to_now() {
        let from = |recorded: Option<&str>, current: &str| {
            start(recorded.map(String::from), current.to_string())
        };
        assert_eq!(
            from(Some("120"), "900"),
            Start {
                at: "120".into(),
                fallback: Some("900".into())
            }
        );
        let now = Start {
            at: "900".into(),
            fallback: None,
        };
        assert_eq!(from(None, "900"), now, "no record");
        assert_eq!(from(Some("900"), "900"), now, "nothing changed since");
        assert_eq!(from(Some("5000"), "900"), now, "ahead of the server");
        // Opaque versions are followed as recorded.
        assert_eq!(from(Some("a"), "b").at, "a");
    }

    #[test]
    fn the_position_moves_with_each_change_only() {
        let position = Position::default();
        let mut seen = position.subscribe();
        position.advance(None);
        position.advance(Some(""));
        assert!(!seen.has_changed().unwrap_or(true));
        position.advance(Some("7"));
        assert!(seen.has_changed().unwrap_or(false));
        assert_eq!(seen.borrow_and_update().as_deref(), Some("7"));
        position.advance(Some("7"));
        assert!(!seen.has_changed().unwrap_or(true));
    }
}
