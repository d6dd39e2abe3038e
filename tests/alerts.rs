//! The alerts bitpool ships (config/prometheus/alerts.yaml, a PrometheusRule): checked and
//! unit-tested with Debian's `promtool`, documented with a runbook each, and loaded by a real
//! Prometheus scraping a running bitpool, which sees an exhausted pool's alert go pending.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::Duration;

use serde_json::Value;
use support::build::{capi_pool, capi_spec, claim};
use support::ops::{Endpoints, get};
use support::process::free_port;
use support::wait::wait_claim;
use support::{Bitpool, Env, eventually, root};

/// The PrometheusRule as shipped.
fn prometheus_rule() -> Value {
    let path = root().join("config/prometheus/alerts.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The alerts of the PrometheusRule, each as its rule object.
fn alerts() -> Vec<Value> {
    let rule = prometheus_rule();
    let groups = rule["spec"]["groups"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    groups
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// A directory of the test's own holding the PrometheusRule's groups as a plain rules file
/// (`rules.yaml`: JSON, which every YAML reader takes), what Prometheus and promtool read.
fn rules_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("bitpool-alerts-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create the rules directory");
    let groups = serde_json::json!({ "groups": prometheus_rule()["spec"]["groups"] });
    std::fs::write(dir.join("rules.yaml"), groups.to_string()).expect("write rules.yaml");
    dir
}

fn promtool(dir: &Path, args: &[&str]) -> Output {
    Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!("run promtool (Debian package prometheus; hack/test.sh installs it): {e}")
        })
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn the_rules_pass_promtool_check_and_their_unit_tests() {
    let dir = rules_dir("promtool");
    let check = promtool(&dir, &["check", "rules", "rules.yaml"]);
    assert!(
        check.status.success(),
        "promtool check rules: {}",
        text(&check)
    );
    assert!(
        text(&check).contains(&format!("SUCCESS: {} rules found", alerts().len())),
        "{}",
        text(&check)
    );
    std::fs::copy(
        root().join("tests/fixtures/alerts/rules_test.yaml"),
        dir.join("rules_test.yaml"),
    )
    .expect("copy the promtool tests");
    let tested = promtool(&dir, &["test", "rules", "rules_test.yaml"]);
    assert!(
        tested.status.success(),
        "promtool test rules: {}",
        text(&tested)
    );
}

/// Each alert has a runbook in docs/operating.md (a heading of its name, which the annotation
/// links to), a severity, and promtool tests that fire it.
#[test]
fn every_alert_has_a_runbook_a_severity_and_a_test() {
    let docs =
        std::fs::read_to_string(root().join("docs/operating.md")).expect("docs/operating.md");
    let tests = std::fs::read_to_string(root().join("tests/fixtures/alerts/rules_test.yaml"))
        .expect("the promtool tests");
    let alerts = alerts();
    assert!(alerts.len() >= 9, "{alerts:?}");
    for alert in &alerts {
        let name = alert["alert"].as_str().expect("an alert name");
        assert_eq!(
            alert["annotations"]["runbook_url"].as_str(),
            Some(format!("docs/operating.md#{}", name.to_lowercase()).as_str()),
            "{name}'s runbook"
        );
        assert!(
            docs.contains(&format!("\n#### {name}\n")),
            "docs/operating.md has no runbook for {name}"
        );
        assert!(
            alert["labels"]["severity"].is_string(),
            "{name} has no severity"
        );
        assert!(
            tests.contains(&format!("alertname: {name}\n    eval_time: "))
                && tests.contains(&format!("alertname: {name}\n")),
            "{name} has no promtool test"
        );
    }
}

/// A Prometheus process, stopped when dropped.
struct Prometheus {
    child: Child,
    port: u16,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Debian's Prometheus scraping `target` every second, evaluating the shipped rules every
    /// second.
    fn start(dir: &Path, target: &str) -> Self {
        let port = free_port();
        let config = format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nrule_files: [rules.yaml]\nscrape_configs:\n- job_name: bitpool\n  static_configs: [{{targets: ['{target}']}}]\n"
        );
        std::fs::write(dir.join("prometheus.yml"), config).expect("write prometheus.yml");
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("the Prometheus log");
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start prometheus (Debian package prometheus): {e}"));
        Self { child, port }
    }

    /// The alerts Prometheus holds now (pending or firing).
    async fn alerts(&self) -> Option<Vec<Value>> {
        let (status, body) = get(
            &format!("http://127.0.0.1:{}/api/v1/alerts", self.port),
            None,
        )
        .await;
        let answer: Value = serde_json::from_str(&body).ok().filter(|_| status == 200)?;
        answer["data"]["alerts"].as_array().cloned()
    }
}

/// An exhausted pool with a claim waiting: Prometheus scrapes bitpool's metrics, evaluates the
/// shipped rules, and holds BitpoolPoolExhausted pending for that pool (it fires after 5
/// minutes), and no alert for a pool with room.
#[tokio::test]
async fn a_real_prometheus_sees_an_exhausted_pool() {
    let env = Env::new("alerts").await;
    let ns = env.name().to_string();
    let endpoints = Endpoints::new();
    let args = endpoints.args(false);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _bitpool = Bitpool::start(&ns, &args);
    capi_pool(&env, "full", capi_spec(&["10.70.0.10"], 24)).await;
    capi_pool(&env, "roomy", capi_spec(&["10.71.0.0/24"], 24)).await;
    claim(&env, "first", "InClusterIPPool", "full").await;
    wait_claim(&env, "first", "Ready", |c| c.status == "True").await;
    claim(&env, "second", "InClusterIPPool", "full").await;
    wait_claim(&env, "second", "exhausted", |c| c.reason == "PoolExhausted").await;
    claim(&env, "third", "InClusterIPPool", "roomy").await;
    wait_claim(&env, "third", "Ready", |c| c.status == "True").await;

    let dir = rules_dir(&ns);
    let prometheus = Prometheus::start(&dir, &format!("127.0.0.1:{}", endpoints.diagnostics));
    let of_this_test = |alert: &Value| alert["labels"]["namespace"] == ns.as_str();
    let exhausted = eventually(
        "BitpoolPoolExhausted pending for the full pool",
        Duration::from_secs(90),
        || async {
            let alerts = prometheus.alerts().await?;
            alerts
                .into_iter()
                .find(|a| of_this_test(a) && a["labels"]["alertname"] == "BitpoolPoolExhausted")
        },
    )
    .await;
    assert_eq!(exhausted["state"], "pending", "{exhausted:#}");
    assert_eq!(exhausted["labels"]["name"], "full", "{exhausted:#}");
    assert_eq!(exhausted["labels"]["severity"], "critical", "{exhausted:#}");
    assert_eq!(
        exhausted["value"]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok()),
        Some(1.0),
        "one claim waits: {exhausted:#}"
    );
    let others: Vec<Value> = prometheus
        .alerts()
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|a| of_this_test(a) && a["labels"]["name"] == "roomy")
        .collect();
    assert_eq!(
        others,
        Vec::<Value>::new(),
        "a pool with room raises nothing"
    );
}

/// The component beside each provider's configuration, rendered with kustomize: the Service
/// selects the Deployment's pods in its namespace and targets its metrics port, and the
/// ServiceMonitor selects the Service and scrapes a port it has.
#[test]
fn the_component_scrapes_each_providers_metrics_port() {
    let kustomize = support::hack_script("tools.sh", &["kustomize"]);
    for provider in ["capi-ipam", "baremetal"] {
        // kustomize takes only relative paths to other kustomizations.
        let dir = root().join(format!("target/alerts-component-{provider}"));
        std::fs::create_dir_all(&dir).expect("create the kustomization");
        std::fs::write(
            dir.join("kustomization.yaml"),
            format!(
                "resources: [../../config/{provider}]\ncomponents: [../../config/prometheus]\n"
            ),
        )
        .expect("write the kustomization");
        let built = Command::new(&kustomize)
            .arg("build")
            .arg(&dir)
            .output()
            .expect("run kustomize");
        assert!(
            built.status.success(),
            "kustomize build ({provider}): {}",
            text(&built)
        );
        let objects: Vec<Value> =
            serde_saphyr::from_multiple(&String::from_utf8_lossy(&built.stdout))
                .unwrap_or_else(|e| panic!("kustomize's output ({provider}): {e}"));
        let one = |kind: &str, name: &str| {
            objects
                .iter()
                .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
                .cloned()
                .unwrap_or_else(|| panic!("{provider}: no {kind} {name}"))
        };
        let deployment = one("Deployment", "bitpool-controller-manager");
        let service = one("Service", "bitpool-metrics-service");
        let monitor = one("ServiceMonitor", "bitpool-controller-manager-metrics");
        one("PrometheusRule", "bitpool-alerts");
        let namespace = &deployment["metadata"]["namespace"];
        assert_eq!(&service["metadata"]["namespace"], namespace, "{provider}");
        assert_eq!(&monitor["metadata"]["namespace"], namespace, "{provider}");
        let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
        let selects = |selector: &Value, labels: &Value| {
            selector
                .as_object()
                .is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| &labels[k] == v))
        };
        assert!(
            selects(&service["spec"]["selector"], pod_labels),
            "{provider}: {service:#}"
        );
        assert!(
            selects(
                &monitor["spec"]["selector"]["matchLabels"],
                &service["metadata"]["labels"]
            ),
            "{provider}: {monitor:#}"
        );
        let port = &service["spec"]["ports"][0];
        let container_ports = deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            container_ports
                .iter()
                .any(|p| p["name"] == port["targetPort"] && p["containerPort"] == port["port"]),
            "{provider}: the Service targets {port} of {container_ports:?}"
        );
        assert_eq!(
            monitor["spec"]["endpoints"][0]["port"], port["name"],
            "{provider}"
        );
    }
}
