//! The Prometheus metrics `/metrics` serves. Every label has a bounded set of values: kinds,
//! controllers and error reasons are fixed lists, and a pool's series exist while the pool does.

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::alloc::Counts;

/// The content type of [`Metrics::encode`]'s text (Prometheus reads OpenMetrics).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Address counts can exceed 2^63 (IPv6), so they are exported as floats.
type AddressGauge = Gauge<f64, AtomicU64>;

/// A pool, as its series name it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub kind: String,
    /// Empty for cluster-scoped pools.
    pub namespace: String,
    pub name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    kind: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    controller: String,
    reason: String,
}

/// Every metric bitpool exports, registered under the `bitpool_` prefix.
pub struct Metrics {
    registry: Registry,
    pool_total: Family<PoolLabels, AddressGauge>,
    pool_used: Family<PoolLabels, AddressGauge>,
    pool_free: Family<PoolLabels, AddressGauge>,
    pool_out_of_range: Family<PoolLabels, AddressGauge>,
    pool_duplicated: Family<PoolLabels, AddressGauge>,
    pool_overlaps: Family<PoolLabels, AddressGauge>,
    pool_claims_pending: Family<PoolLabels, AddressGauge>,
    pool_claims_pending_since: Family<PoolLabels, AddressGauge>,
    allocations: Family<KindLabels, Counter>,
    releases: Family<KindLabels, Counter>,
    ledger_conflicts: Family<KindLabels, Counter>,
    ledger_rebuilds: Family<KindLabels, Counter>,
    claims_refused: Family<RefusalLabels, Counter>,
    reconcile_duration: Family<ControllerLabels, Histogram>,
    reconcile_errors: Family<ErrorLabels, Counter>,
    leader: Gauge,
    events_dropped: Counter,
    /// Serialises encoding: a scrape sees one consistent moment.
    encoding: Mutex<()>,
}

/// Seconds from 1 ms to about 16 s, doubling.
fn duration_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(0.001, 2.0, 15)
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every metric at zero, registered under the `bitpool_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("bitpool");
        let metrics = Self {
            pool_total: Family::default(),
            pool_used: Family::default(),
            pool_free: Family::default(),
            pool_out_of_range: Family::default(),
            pool_duplicated: Family::default(),
            pool_overlaps: Family::default(),
            pool_claims_pending: Family::default(),
            pool_claims_pending_since: Family::default(),
            allocations: Family::default(),
            releases: Family::default(),
            ledger_conflicts: Family::default(),
            ledger_rebuilds: Family::default(),
            claims_refused: Family::default(),
            reconcile_duration: Family::new_with_constructor(|| Histogram::new(duration_buckets())),
            reconcile_errors: Family::default(),
            leader: Gauge::default(),
            events_dropped: Counter::default(),
            encoding: Mutex::new(()),
            registry: Registry::default(),
        };
        registry.register(
            "build",
            "The release and commit of this process's build (always 1)",
            prometheus_client::metrics::info::Info::new([
                ("version", crate::VERSION),
                ("commit", crate::COMMIT),
            ]),
        );
        metrics.register_pool_gauges(&mut registry);
        metrics.register_engine_metrics(&mut registry);
        Self {
            registry,
            ..metrics
        }
    }

    /// What each pool's status says, as gauges labelled by pool.
    fn register_pool_gauges(&self, registry: &mut Registry) {
        registry.register(
            "pool_addresses_total",
            "Addresses a pool can hand out (its ranges less excluded, network, broadcast and gateway addresses)",
            self.pool_total.clone(),
        );
        registry.register(
            "pool_addresses_used",
            "Addresses of a pool held by claims, including those outside its current ranges",
            self.pool_used.clone(),
        );
        registry.register(
            "pool_addresses_free",
            "Addresses a pool can still hand out",
            self.pool_free.clone(),
        );
        registry.register(
            "pool_addresses_out_of_range",
            "Addresses held by claims that the pool's current ranges no longer contain",
            self.pool_out_of_range.clone(),
        );
        registry.register(
            "pool_addresses_duplicated",
            "Addresses of a pool that its address objects hold for more than one claim (never handed out again while so)",
            self.pool_duplicated.clone(),
        );
        registry.register(
            "pool_overlapping_pools",
            "Other pools whose addresses meet this pool's (each pool hands out an address once; two pools may hand out the same one)",
            self.pool_overlaps.clone(),
        );
        registry.register(
            "pool_claims_pending",
            "Claims of a pool that hold no address after its last reconcile (refused, waiting or deferred)",
            self.pool_claims_pending.clone(),
        );
        registry.register(
            "pool_claims_pending_since_seconds",
            "Unix time the oldest of a pool's pending claims was created; 0 when none is pending",
            self.pool_claims_pending_since.clone(),
        );
    }

    /// What the engine and the process do: allocations, releases, conflicts, reconciles, the
    /// leader lease and dropped Events.
    fn register_engine_metrics(&self, registry: &mut Registry) {
        registry.register(
            "allocations",
            "Addresses handed out (address objects created), by pool kind",
            self.allocations.clone(),
        );
        registry.register(
            "releases",
            "Addresses released back to their pool, by pool kind",
            self.releases.clone(),
        );
        registry.register(
            "ledger_conflicts",
            "Ledger writes that lost a race with another writer and were computed again",
            self.ledger_conflicts.clone(),
        );
        registry.register(
            "ledger_rebuilds",
            "Ledgers rebuilt from the live address objects after their record was lost (each fenced for 37 s), by pool kind",
            self.ledger_rebuilds.clone(),
        );
        registry.register(
            "claims_refused",
            "Claims a pool refused to serve for who they are, not for want of addresses (reason NamespaceNotSelected: the pool's namespaceSelector leaves the claim's namespace out), counted when the claim's status says so",
            self.claims_refused.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "How long reconciles took, by controller (the kind it reconciles)",
            self.reconcile_duration.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciles, by controller and reason",
            self.reconcile_errors.clone(),
        );
        registry.register(
            "leader",
            "1 while this process holds the leader lease (or runs without leader election)",
            self.leader.clone(),
        );
        registry.register(
            "events_dropped",
            "Kubernetes Events not sent because of the Event rate limit",
            self.events_dropped.clone(),
        );
    }

    /// Records how many of a pool's addresses are held for more than one claim.
    pub fn pool_duplicated(&self, pool: &PoolLabels, count: usize) {
        self.pool_duplicated.get_or_create(pool).set(count as f64);
    }

    /// Records how many other pools meet a pool.
    pub fn pool_overlaps(&self, pool: &PoolLabels, count: usize) {
        self.pool_overlaps.get_or_create(pool).set(count as f64);
    }

    /// Records a pool's usage after a reconcile.
    pub fn pool_usage(&self, pool: &PoolLabels, counts: &Counts) {
        let set = |family: &Family<PoolLabels, AddressGauge>, value: u128| {
            family.get_or_create(pool).set(value as f64);
        };
        set(&self.pool_total, counts.total);
        set(&self.pool_used, counts.used);
        set(&self.pool_free, counts.free);
        set(&self.pool_out_of_range, counts.out_of_range);
    }

    /// Records a pool's claims that hold no address after a reconcile: how many, and when the
    /// oldest of them was created (Unix seconds).
    pub fn pool_pending(&self, pool: &PoolLabels, count: usize, oldest_created: Option<f64>) {
        self.pool_claims_pending
            .get_or_create(pool)
            .set(count as f64);
        self.pool_claims_pending_since
            .get_or_create(pool)
            .set(oldest_created.unwrap_or(0.0));
    }

    fn pool_families(&self) -> [&Family<PoolLabels, AddressGauge>; 8] {
        [
            &self.pool_claims_pending,
            &self.pool_claims_pending_since,
            &self.pool_overlaps,
            &self.pool_duplicated,
            &self.pool_total,
            &self.pool_used,
            &self.pool_free,
            &self.pool_out_of_range,
        ]
    }

    /// Drops a deleted pool's series.
    pub fn forget_pool(&self, pool: &PoolLabels) {
        for family in self.pool_families() {
            family.remove(pool);
        }
    }

    /// Counts `count` addresses allocated from a pool of `pool_kind`.
    pub fn allocated(&self, pool_kind: &str, count: usize) {
        self.count(&self.allocations, pool_kind, count);
    }

    /// Counts `count` addresses released to a pool of `pool_kind`.
    pub fn released(&self, pool_kind: &str, count: usize) {
        self.count(&self.releases, pool_kind, count);
    }

    /// Counts one ledger write that lost a race with another writer.
    pub fn ledger_conflict(&self, pool_kind: &str) {
        self.count(&self.ledger_conflicts, pool_kind, 1);
    }

    /// Counts one claim a pool refused for who it is (not for want of addresses), by reason.
    pub fn claim_refused(&self, pool_kind: &str, reason: &str) {
        self.claims_refused
            .get_or_create(&RefusalLabels {
                kind: pool_kind.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Counts one ledger rebuilt from the live address objects.
    pub fn ledger_rebuilt(&self, pool_kind: &str) {
        self.count(&self.ledger_rebuilds, pool_kind, 1);
    }

    fn count(&self, family: &Family<KindLabels, Counter>, kind: &str, count: usize) {
        if count > 0 {
            family
                .get_or_create(&KindLabels {
                    kind: kind.to_string(),
                })
                .inc_by(count as u64);
        }
    }

    /// Records how long one reconcile by `controller` took.
    pub fn reconciled(&self, controller: &str, took: Duration) {
        self.reconcile_duration
            .get_or_create(&ControllerLabels {
                controller: controller.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    /// Counts one failed reconcile by `controller`, by reason.
    pub fn reconcile_failed(&self, controller: &str, reason: &str) {
        self.reconcile_errors
            .get_or_create(&ErrorLabels {
                controller: controller.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Records leadership. A replica that stops leading stops reconciling, so its pool series
    /// would go stale: they go, and the next leader exports them.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
        if !leading {
            for family in self.pool_families() {
                family.clear();
            }
        }
    }

    /// Counts one Event not sent because of the Event rate limit.
    pub fn event_dropped(&self) {
        self.events_dropped.inc();
    }

    /// The exposition text of every metric.
    pub fn encode(&self) -> String {
        let _one_at_a_time = self.encoding.lock();
        let mut text = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::warn!(error = %e, "cannot encode the metrics");
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(name: &str) -> PoolLabels {
        PoolLabels {
            kind: "InClusterIPPool".into(),
            namespace: "default".into(),
            name: name.into(),
        }
    }

    fn counts(total: u128, used: u128, out_of_range: u128) -> Counts {
        Counts {
            total,
            used,
            free: total - (used - out_of_range),
            out_of_range,
            reserved: 0,
        }
    }

    #[test]
    fn pool_gauges_follow_usage_and_go_with_the_pool() {
        let metrics = Metrics::new();
        metrics.pool_usage(&pool("a"), &counts(254, 10, 2));
        metrics.pool_usage(&pool("b"), &counts(14, 0, 0));
        let text = metrics.encode();
        let a = r#"{kind="InClusterIPPool",namespace="default",name="a"}"#;
        for line in [
            format!("bitpool_pool_addresses_total{a} 254.0"),
            format!("bitpool_pool_addresses_used{a} 10.0"),
            format!("bitpool_pool_addresses_free{a} 246.0"),
            format!("bitpool_pool_addresses_out_of_range{a} 2.0"),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        metrics.forget_pool(&pool("a"));
        let text = metrics.encode();
        assert!(!text.contains(r#"name="a""#), "{text}");
        assert!(text.contains(r#"name="b""#), "{text}");
        metrics.set_leader(false);
        assert!(
            !metrics.encode().contains(r#"name="b""#),
            "a standby keeps pool series"
        );
    }

    /// Every `bitpool_` series a PromQL expression anywhere in `document` (an `expr` field)
    /// names, with the expression.
    fn queried_series(document: &serde_json::Value) -> Vec<(String, String)> {
        let mut queried = Vec::new();
        let mut values = vec![document];
        while let Some(value) = values.pop() {
            match value {
                serde_json::Value::Object(map) => {
                    if let Some(serde_json::Value::String(expr)) = map.get("expr") {
                        let names = expr
                            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                            .filter(|w| w.starts_with("bitpool_"));
                        queried.extend(names.map(|n| (n.to_string(), expr.clone())));
                    }
                    values.extend(map.values());
                }
                serde_json::Value::Array(items) => values.extend(items),
                _ => {}
            }
        }
        queried
    }

    /// Every series name bitpool exports, each family with a sample.
    fn exported_series() -> std::collections::HashSet<String> {
        let metrics = Metrics::new();
        metrics.pool_usage(&pool("p"), &counts(4, 1, 0));
        metrics.pool_duplicated(&pool("p"), 0);
        metrics.pool_pending(&pool("p"), 1, Some(1.0));
        metrics.allocated("InClusterIPPool", 1);
        metrics.released("InClusterIPPool", 1);
        metrics.ledger_conflict("InClusterIPPool");
        metrics.ledger_rebuilt("InClusterIPPool");
        metrics.reconciled("InClusterIPPool", Duration::from_millis(1));
        metrics.reconcile_failed("InClusterIPPool", "conflict");
        metrics.event_dropped();
        metrics
            .encode()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split(['{', ' ']).next().map(str::to_string))
            .collect()
    }

    fn shipped(path: &str) -> serde_json::Value {
        let path = format!("{}/{path}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// Every series the shipped Grafana dashboard and alerts query is one bitpool exports.
    #[test]
    fn the_dashboard_and_the_alerts_query_only_exported_series() {
        let exported = exported_series();
        for (path, at_least) in [
            ("config/grafana/bitpool-dashboard.json", 8),
            ("config/prometheus/alerts.yaml", 9),
        ] {
            let queried = queried_series(&shipped(path));
            assert!(queried.len() >= at_least, "{path}: {queried:?}");
            for (name, expr) in &queried {
                assert!(
                    exported.contains(name),
                    "{name} (in {path}: {expr}) is not exported"
                );
            }
        }
    }

    #[test]
    fn counters_histograms_and_leader_are_exported() {
        let metrics = Metrics::new();
        metrics.allocated("IPPool", 3);
        metrics.allocated("IPPool", 0);
        metrics.released("IPPool", 1);
        metrics.ledger_conflict("GlobalInClusterIPPool");
        metrics.reconciled("InClusterIPPool", Duration::from_millis(3));
        metrics.reconcile_failed("Metal3Data", "conflict");
        metrics.set_leader(true);
        let text = metrics.encode();
        let build = format!(
            r#"bitpool_build_info{{version="{}",commit="{}"}} 1"#,
            crate::VERSION,
            crate::COMMIT
        );
        for line in [
            r#"bitpool_allocations_total{kind="IPPool"} 3"#,
            r#"bitpool_releases_total{kind="IPPool"} 1"#,
            r#"bitpool_ledger_conflicts_total{kind="GlobalInClusterIPPool"} 1"#,
            r#"bitpool_reconcile_duration_seconds_count{controller="InClusterIPPool"} 1"#,
            r#"bitpool_reconcile_errors_total{controller="Metal3Data",reason="conflict"} 1"#,
            "bitpool_leader 1",
            build.as_str(),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
