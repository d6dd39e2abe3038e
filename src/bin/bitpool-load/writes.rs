//! The writes the API server took, by resource, from its own request counters
//! (`apiserver_request_total` on its `/metrics`): where a run's time goes is where its writes
//! go, whoever made them (the load command, the provider, the garbage collector, leases).

use std::collections::BTreeMap;

use kube::Client;

/// Verbs that read: every other verb the server counts is a write.
const READS: [&str; 6] = ["GET", "LIST", "WATCH", "WATCHLIST", "CONNECT", "PROXY"];

/// Writes the server has taken since it started, by resource (with its subresource, and the
/// answer's code where it refused the write), and its reads of single objects and lists.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Writes {
    writes: BTreeMap<String, f64>,
    reads: BTreeMap<String, f64>,
}

impl Writes {
    /// The server's counters now.
    pub async fn read(client: &Client) -> Result<Self, String> {
        let request = hyper::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        let text = client
            .request_text(request)
            .await
            .map_err(|e| format!("cannot read the API server's metrics: {e}"))?;
        Ok(Self::parse(&text))
    }

    /// The writes of `apiserver_request_total` in the exposition text `text`.
    fn parse(text: &str) -> Self {
        let (mut writes, mut reads) = (BTreeMap::new(), BTreeMap::new());
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let Ok(value) = value.trim().parse::<f64>() else {
                continue;
            };
            let label = |name: &str| label(labels, name).unwrap_or_default();
            let mut resource = match label("subresource") {
                "" => label("resource").to_string(),
                sub => format!("{}/{sub}", label("resource")),
            };
            if READS.contains(&label("verb")) {
                if matches!(label("verb"), "GET" | "LIST") {
                    *reads.entry(resource).or_insert(0.0) += value;
                }
                continue;
            }
            // Refused writes (a conflict, a precondition) are counted apart.
            if !label("code").starts_with('2') {
                resource = format!("{resource} {}", label("code"));
            }
            *writes.entry(resource).or_insert(0.0) += value;
        }
        Self { writes, reads }
    }

    /// What was written after `before`.
    pub fn since(&self, before: &Self) -> Self {
        Self {
            writes: since(&self.writes, &before.writes),
            reads: since(&self.reads, &before.reads),
        }
    }

    /// Every write counted.
    pub fn total(&self) -> f64 {
        self.writes.values().sum()
    }

    /// Writes per claim, in all and by resource, largest first, then reads: `4.20
    /// (ipaddressclaims 2.00, ipaddresses 2.00, events 0.20; reads 0.10: configmaps 0.10)`.
    pub fn per_claim(&self, claims: usize) -> String {
        let claims = claims.max(1) as f64;
        let reads: f64 = self.reads.values().sum();
        format!(
            "{:.2} ({}; reads {:.2}: {})",
            self.total() / claims,
            by_resource(&self.writes, claims),
            reads / claims,
            by_resource(&self.reads, claims),
        )
    }
}

/// `after`'s counts less `before`'s, those that moved.
fn since(after: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    let mut moved = after.clone();
    for (resource, count) in &mut moved {
        *count -= before.get(resource).copied().unwrap_or(0.0);
    }
    moved.retain(|_, count| *count > 0.0);
    moved
}

/// Counts per claim by resource, largest first, leaving out what is under 0.005.
fn by_resource(counts: &BTreeMap<String, f64>, claims: f64) -> String {
    let mut each: Vec<(&String, &f64)> = counts.iter().collect();
    each.sort_by(|a, b| b.1.total_cmp(a.1));
    let parts: Vec<String> = each
        .iter()
        .filter(|(_, count)| **count / claims >= 0.005)
        .map(|(resource, count)| format!("{resource} {:.2}", *count / claims))
        .collect();
    parts.join(", ")
}

/// The value of label `name` in `labels` (`a="x",b="y"`).
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let start = labels
        .split(',')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix("=\""))?;
    start.strip_suffix('"').or(Some(start))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP apiserver_request_total [STABLE] Counter of apiserver requests
apiserver_request_total{code="201",component="apiserver",dry_run="",group="ipam.cluster.x-k8s.io",resource="ipaddressclaims",scope="resource",subresource="",verb="POST",version="v1beta2"} 10
apiserver_request_total{code="200",component="apiserver",dry_run="",group="ipam.cluster.x-k8s.io",resource="ipaddressclaims",scope="resource",subresource="status",verb="PATCH",version="v1beta2"} 7
apiserver_request_total{code="200",component="apiserver",dry_run="",group="ipam.cluster.x-k8s.io",resource="ipaddressclaims",scope="namespace",subresource="",verb="LIST",version="v1beta2"} 3
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="configmaps",scope="resource",subresource="",verb="PUT",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="configmaps",scope="resource",subresource="",verb="PUT",version="v1"} 5
apiserver_request_duration_seconds_bucket{resource="configmaps",verb="PUT",le="0.1"} 99
"#;

    #[test]
    fn counts_writes_by_resource_and_leaves_reads_out() {
        let writes = Writes::parse(TEXT);
        let expected: BTreeMap<String, f64> = [
            ("configmaps".to_string(), 5.0),
            ("configmaps 409".to_string(), 2.0),
            ("ipaddressclaims".to_string(), 10.0),
            ("ipaddressclaims/status".to_string(), 7.0),
        ]
        .into();
        assert_eq!(writes.writes, expected);
        assert_eq!(writes.reads.values().sum::<f64>(), 3.0);
        assert_eq!(writes.total(), 24.0);
    }

    #[test]
    fn what_was_written_since_and_per_claim() {
        let before = Writes::parse(TEXT);
        let mut after = before.clone();
        *after.writes.entry("configmaps".into()).or_default() += 3.0;
        *after.writes.entry("events".into()).or_default() += 1.0;
        *after.reads.entry("configmaps".into()).or_default() += 1.0;
        let since = after.since(&before);
        assert_eq!(since.total(), 4.0);
        assert_eq!(
            since.per_claim(2),
            "2.00 (configmaps 1.50, events 0.50; reads 0.50: configmaps 0.50)"
        );
        assert!(before.per_claim(1).contains("configmaps 409 2.00"));
    }
}
