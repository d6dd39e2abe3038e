//! `bitpool run`: the controllers, webhooks and operational endpoints, until a signal stops them.

use std::io::IsTerminal;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::{ControllerGroup, Error, groups};
use crate::net::http;
use crate::ops::diagnostics::Access;
use crate::ops::events::Events;
use crate::ops::metrics::Metrics;
use crate::ops::{self, Ops, lease};
use crate::{crds, ipam, manager, runtime};

/// The flags of `bitpool run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Log format.
    #[arg(long, env = "BITPOOL_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log level (error, warn, info, debug, trace). RUST_LOG, when set, takes precedence and
    /// can set levels per module.
    #[arg(long, env = "BITPOOL_LOG_LEVEL", default_value = "info")]
    pub log_level: tracing::Level,
    /// Requests per second to the Kubernetes API server, on average.
    #[arg(long, env = "BITPOOL_KUBE_API_QPS", default_value_t = NonZeroU32::new(500).unwrap_or(NonZeroU32::MIN))]
    pub kube_api_qps: NonZeroU32,
    /// Requests allowed at once above the average rate.
    #[arg(long, env = "BITPOOL_KUBE_API_BURST", default_value_t = NonZeroU32::new(1000).unwrap_or(NonZeroU32::MIN))]
    pub kube_api_burst: NonZeroU32,
    /// After SIGTERM, how long reconciles in flight may take before the process exits anyway
    /// (keep it below the pod's terminationGracePeriodSeconds). A second SIGTERM exits at once.
    #[arg(long, env = "BITPOOL_SHUTDOWN_TIMEOUT_SECONDS", default_value_t = 20)]
    pub shutdown_timeout_seconds: u64,
    /// How long to wait at start-up for bitpool's CRDs to be installed and established.
    #[arg(long, env = "BITPOOL_CRD_WAIT_SECONDS", default_value_t = 300)]
    pub crd_wait_seconds: u64,
    /// Serve only claims, addresses and namespaced pools of this namespace (default: all).
    #[arg(long, env = "BITPOOL_NAMESPACE")]
    pub namespace: Option<String>,
    /// Reconcile only pools and claims labelled `cluster.x-k8s.io/watch-filter=<value>`.
    #[arg(long, env = "BITPOOL_WATCH_FILTER")]
    pub watch_filter: Option<String>,
    /// Namespace for the ledgers of cluster-scoped pools (GlobalInClusterIPPool). Every bitpool
    /// process of a cluster must use the same one. Created if missing.
    #[arg(
        long,
        env = "BITPOOL_LEDGER_NAMESPACE",
        default_value = "bitpool-system"
    )]
    pub ledger_namespace: String,
    /// Name the IP claims of each Metal3Data `<BareMetalHost>-<pool>` instead of
    /// `<Metal3Data>-<pool>`, so that pools' preAllocations keyed by host name give each host the
    /// same address across re-provisioning and rolling upgrades.
    #[arg(
        long,
        alias = "enableBMHNameBasedPreallocation",
        env = "ENABLE_BMH_NAME_BASED_PREALLOCATION",
        default_value_t = false,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub enable_bmh_name_based_preallocation: bool,
    /// Controller groups to run, comma-separated: capi-ipam (InClusterIPPool,
    /// GlobalInClusterIPPool), metal3-ipam (Metal3 IPPool, IPClaim), migration-proxy (Metal3
    /// IPPools served from a CAPI pool through `spec.poolRef`), metal3-data (Metal3DataTemplate,
    /// Metal3Data). Only the CRDs of these groups are required.
    #[arg(
        long,
        env = "BITPOOL_CONTROLLERS",
        value_enum,
        value_delimiter = ',',
        default_value = "capi-ipam,metal3-ipam,migration-proxy,metal3-data"
    )]
    pub controllers: Vec<ControllerGroup>,
    /// Reconciles of one controller running at once (0: no limit). Each pool is reconciled by
    /// one at a time, whatever this says.
    #[arg(long, env = "BITPOOL_CONCURRENCY", default_value_t = 10)]
    pub concurrency: u16,
    /// How often every pool is checked again when nothing happens (Go duration: 10m, 90s).
    #[arg(long, env = "BITPOOL_SYNC_PERIOD", default_value = "10m", value_parser = parse_go_duration)]
    pub sync_period: Duration,
    #[command(flatten)]
    pub webhook: WebhookArgs,
    #[command(flatten)]
    pub ops: OpsArgs,
}

/// Health probes, metrics and leader election, spelled as Cluster API managers spell them.
#[derive(Debug, Args)]
pub struct OpsArgs {
    /// Where `/healthz` and `/readyz` are served (`host:port`, `:port`, or `0` for off). The
    /// in-cluster provider's spelling `--health-probe-bind-address` is accepted too.
    #[arg(
        long,
        alias = "health-probe-bind-address",
        env = "BITPOOL_HEALTH_ADDR",
        default_value = ":9440"
    )]
    pub health_addr: String,
    /// Where `/metrics` is served (`host:port`, `:port`, or `0` for off): over HTTPS to callers
    /// allowed `get` on `/metrics`, unless --insecure-diagnostics.
    #[arg(long, env = "BITPOOL_DIAGNOSTICS_ADDRESS", default_value = ":8443")]
    pub diagnostics_address: String,
    /// Serve `/metrics` over plain HTTP, without authentication or authorisation.
    #[arg(
        long,
        env = "BITPOOL_INSECURE_DIAGNOSTICS",
        default_value_t = false,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub insecure_diagnostics: bool,
    /// Elect a leader on a Lease in the ledger namespace: only the leader writes; standbys keep
    /// their caches warm and take over when the lease expires or is released.
    #[arg(
        long,
        env = "BITPOOL_LEADER_ELECT",
        default_value_t = false,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub leader_elect: bool,
    /// How long a lease lasts without renewal; a standby takes over after it (Go duration).
    #[arg(long, env = "BITPOOL_LEADER_ELECT_LEASE_DURATION", default_value = "15s", value_parser = parse_go_duration)]
    pub leader_elect_lease_duration: Duration,
    /// When the leader renews its lease; it stops writing half-way between this and the lease
    /// duration if renewals fail (Go duration).
    #[arg(long, env = "BITPOOL_LEADER_ELECT_RENEW_DEADLINE", default_value = "10s", value_parser = parse_go_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// Accepted for Cluster API tooling: standbys try again when the lease they saw expires,
    /// and after conflicts with backoff, rather than on a fixed period (Go duration).
    #[arg(long, env = "BITPOOL_LEADER_ELECT_RETRY_PERIOD", default_value = "2s", value_parser = parse_go_duration)]
    pub leader_elect_retry_period: Duration,
    /// Name of the leader election Lease.
    #[arg(
        long,
        env = "BITPOOL_LEADER_ELECTION_ID",
        default_value = "bitpool-leader-election"
    )]
    pub leader_election_id: String,
}

/// A Go duration (`1h30m`, `10s`, `250ms`), as Cluster API managers' flags take them.
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let problem =
        || format!("{text:?} is not a duration: use a number and a unit, as 10s, 1m30s, 500ms");
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return Err(problem());
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(problem)?;
        let (number, tail) = rest.split_at(digits);
        let number: f64 = number.parse().map_err(|_| problem())?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let seconds = match unit {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return Err(problem()),
        };
        total += Duration::try_from_secs_f64(number * seconds).map_err(|_| problem())?;
        rest = tail;
    }
    Ok(total)
}

/// The webhook server (admission and conversion). The CRDs of the pool kinds convert through it,
/// so it runs wherever bitpool serves them; `--webhook-port=0` turns it off (local runs).
#[derive(Debug, Args)]
pub struct WebhookArgs {
    /// Port of the HTTPS webhook server; 0 serves no webhooks.
    #[arg(long, env = "BITPOOL_WEBHOOK_PORT", default_value_t = 9443)]
    pub webhook_port: u16,
    /// Address the webhook server listens on.
    #[arg(long, env = "BITPOOL_WEBHOOK_HOST", default_value = "0.0.0.0")]
    pub webhook_host: std::net::IpAddr,
    /// Directory with `tls.crt` and `tls.key` (as cert-manager writes them); re-read when they
    /// change.
    #[arg(
        long,
        env = "BITPOOL_WEBHOOK_CERT_DIR",
        default_value = "/tmp/k8s-webhook-server/serving-certs"
    )]
    pub webhook_cert_dir: PathBuf,
    /// File name of the certificate in --webhook-cert-dir.
    #[arg(long, env = "BITPOOL_WEBHOOK_CERT_NAME", default_value = crate::net::tls::CERT_FILE)]
    pub webhook_cert_name: String,
    /// File name of the private key in --webhook-cert-dir.
    #[arg(long, env = "BITPOOL_WEBHOOK_KEY_NAME", default_value = crate::net::tls::KEY_FILE)]
    pub webhook_key_name: String,
    /// Minimum TLS version: VersionTLS12 or VersionTLS13.
    #[arg(long, env = "BITPOOL_TLS_MIN_VERSION", default_value = "VersionTLS12")]
    pub tls_min_version: crate::net::tls::MinVersion,
    /// TLS 1.2 cipher suites, by their Go names, comma-separated (default: all that rustls
    /// offers, every one AEAD with forward secrecy). TLS 1.3 suites are always on.
    #[arg(long, env = "BITPOOL_TLS_CIPHER_SUITES", value_delimiter = ',')]
    pub tls_cipher_suites: Vec<String>,
    /// Refuse a pool whose addresses overlap another pool's (any kind, any namespace). Off by
    /// default, as upstream: overlapping ranges can be on purpose (NAT, separate sites).
    #[arg(
        long,
        env = "BITPOOL_REFUSE_OVERLAPPING_POOLS",
        default_value_t = false,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub refuse_overlapping_pools: bool,
}

impl WebhookArgs {
    /// The TLS settings every HTTPS server of bitpool takes from these flags.
    fn tls_options(&self) -> crate::net::tls::TlsOptions {
        crate::net::tls::TlsOptions {
            cert_dir: self.webhook_cert_dir.clone(),
            cert_name: self.webhook_cert_name.clone(),
            key_name: self.webhook_key_name.clone(),
            min_version: self.tls_min_version,
            cipher_suites: self.tls_cipher_suites.clone(),
        }
    }
}

/// The format of the log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

fn init_tracing(format: LogFormat, level: tracing::Level) {
    let level = level.to_string().to_lowercase();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("{level},kube=warn")));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// The rate limit of the client that reviews `/metrics` callers (two reviews each).
const METRICS_REVIEW_QPS: NonZeroU32 = NonZeroU32::new(20).expect("20 is not zero");
const METRICS_REVIEW_BURST: NonZeroU32 = NonZeroU32::new(40).expect("40 is not zero");

pub(super) async fn run(args: RunArgs) -> Result<(), Error> {
    init_tracing(args.log_format, args.log_level);
    let client = crate::client::connect(crate::client::Limits {
        qps: args.kube_api_qps,
        burst: args.kube_api_burst,
    })
    .await?;
    // Before the CRD wait: the pool CRDs convert through this server.
    start_webhooks(&args.webhook, &args.ledger_namespace, &client).await?;
    let (ops, election) = start_ops(&args, &client).await?;
    // bitpool's own CRDs, and the contract's IPAddressClaim and IPAddress (from Cluster API
    // core, or `bitpool crds --apply --standalone`).
    let groups = groups(&args.controllers);
    let required = crds::required(groups);
    let wait = Duration::from_secs(args.crd_wait_seconds);
    crds::wait_established(&client, &required, wait).await?;
    let contract = crds::served_contract_version(&client).await?;
    if crate::api::capi::select_contract_version(contract).is_err() {
        tracing::warn!("the Cluster API version was already chosen");
    }
    tracing::info!(
        version = contract.as_str(),
        "Cluster API version of IPAddressClaim, IPAddress, Cluster and Machine"
    );
    let metal3_machine_version = if groups.metal3_data {
        let version = crds::served_metal3_machine_version(&client).await?;
        tracing::info!(version, "version Metal3Machines are read at");
        version
    } else {
        "v1beta2"
    };
    let settings = runtime::Settings {
        namespace: args.namespace,
        watch_filter: args.watch_filter,
        ledger_namespace: args.ledger_namespace,
        bmh_name_based_preallocation: args.enable_bmh_name_based_preallocation,
        metal3_machine_version,
        groups,
        concurrency: args.concurrency,
        sync_period: args.sync_period,
    };
    let grace = Duration::from_secs(args.shutdown_timeout_seconds);
    manager::run(client, settings, ops, stop_on_signal(grace)).await;
    if let Some(election) = election {
        election.resign().await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// Metrics, Events and leadership, and the health and diagnostics servers that report them.
async fn start_ops(
    args: &RunArgs,
    client: &kube::Client,
) -> Result<(Arc<Ops>, Option<lease::Election>), Error> {
    let flags = &args.ops;
    let metrics = Arc::new(Metrics::new());
    let identity = lease::identity();
    let (leadership, election) = if flags.leader_elect {
        // The Lease lives in bitpool's own namespace, beside the ledgers.
        if let Err(e) = ipam::ledger::ensure_namespace(client, &args.ledger_namespace).await {
            tracing::warn!(namespace = %args.ledger_namespace, error = %e, "cannot create the namespace of the leader lease");
        }
        let settings = lease::ElectionSettings {
            lease_name: flags.leader_election_id.clone(),
            namespace: args.ledger_namespace.clone(),
            identity: identity.clone(),
            lease_duration: flags.leader_elect_lease_duration,
            renew_deadline: flags.leader_elect_renew_deadline,
        };
        let on_change = {
            let metrics = metrics.clone();
            move |leading| metrics.set_leader(leading)
        };
        let (leadership, election) = lease::elect(client.clone(), settings, on_change).await?;
        tracing::info!(%identity, lease = %flags.leader_election_id, "leader election joined");
        (leadership, Some(election))
    } else {
        metrics.set_leader(true);
        (lease::Leadership::always(), None)
    };
    let events = Events::new(client.clone(), identity, metrics.clone());
    let ops = Arc::new(Ops::new(metrics.clone(), events, leadership));
    if let Some(addr) = ops::parse_bind_address(&flags.health_addr).map_err(Error::Flag)? {
        let listener = http::bind(addr, "health probes").await?;
        tracing::info!(address = %addr, "serving /healthz and /readyz");
        let handler = ops::health::handler(ops.clone());
        tokio::spawn(http::accept_loop(listener, None, handler, "health"));
    }
    if let Some(addr) = ops::parse_bind_address(&flags.diagnostics_address).map_err(Error::Flag)? {
        let listener = http::bind(addr, "metrics").await?;
        let (tls, access) = if flags.insecure_diagnostics {
            (None, Access::Open)
        } else {
            let options = args.webhook.tls_options();
            let names = vec!["localhost".to_string(), lease::host_name()];
            let config = crate::net::tls::self_signed_config(&options, names)
                .map_err(|e| Error::Webhook(e.into()))?;
            // A client of its own: reviews of callers never wait behind the controllers'
            // requests, nor they behind a flood of callers.
            let reviews = crate::client::connect(crate::client::Limits {
                qps: METRICS_REVIEW_QPS,
                burst: METRICS_REVIEW_BURST,
            })
            .await?;
            (
                Some(tokio_rustls::TlsAcceptor::from(config)),
                Access::Authorized(reviews, Default::default()),
            )
        };
        tracing::info!(address = %addr, secure = tls.is_some(), "serving /metrics");
        let handler = ops::diagnostics::handler(metrics, access);
        tokio::spawn(http::accept_loop(listener, tls, handler, "metrics"));
    }
    Ok((ops, election))
}

async fn start_webhooks(
    args: &WebhookArgs,
    ledger_namespace: &str,
    client: &kube::Client,
) -> Result<(), Error> {
    if args.webhook_port == 0 {
        tracing::info!("webhook server off (--webhook-port=0)");
        return Ok(());
    }
    let options = args.tls_options();
    let webhooks = std::sync::Arc::new(crate::webhook::Webhooks {
        client: client.clone(),
        refuse_overlap: args.refuse_overlapping_pools,
        ledger_namespace: ledger_namespace.to_string(),
        writers: Default::default(),
    });
    let addr = std::net::SocketAddr::new(args.webhook_host, args.webhook_port);
    // Served until the process exits: peers may still call it while work drains.
    let server = crate::webhook::serve(addr, options, webhooks, std::future::pending()).await?;
    tokio::spawn(server);
    Ok(())
}

/// Completes on the first SIGTERM (or Ctrl-C): the controllers stop taking work. From then on a
/// second signal, or `grace` passing, ends the process at once; what was committed is resumed
/// by the next process.
async fn stop_on_signal(grace: Duration) {
    shutdown_signal().await;
    tracing::info!(grace = ?grace, "shutting down: no new work is taken");
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown_signal() => tracing::warn!("second signal: exiting now"),
            _ = tokio::time::sleep(grace) => tracing::warn!("work in flight did not finish within the shutdown timeout; exiting"),
        }
        std::process::exit(1);
    });
}

/// SIGTERM (what Kubernetes sends) or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn preallocation(args: &[&str]) -> bool {
        let cli = Cli::try_parse_from(["bitpool", "run"].iter().chain(args))
            .expect("the arguments parse");
        match cli.command {
            Command::Run(run) => run.enable_bmh_name_based_preallocation,
            _ => unreachable!("parsed as run"),
        }
    }

    fn run_args(args: &[&str]) -> RunArgs {
        let cli = Cli::try_parse_from(["bitpool", "run"].iter().chain(args))
            .expect("the arguments parse");
        match cli.command {
            Command::Run(run) => *run,
            _ => unreachable!("parsed as run"),
        }
    }

    #[test]
    fn client_limits_log_level_and_shutdown_have_defaults_and_flags() {
        let defaults = run_args(&[]);
        assert_eq!(defaults.kube_api_qps.get(), 500);
        assert_eq!(defaults.kube_api_burst.get(), 1000);
        assert_eq!(defaults.log_level, tracing::Level::INFO);
        assert_eq!(defaults.shutdown_timeout_seconds, 20);
        let set = run_args(&[
            "--kube-api-qps=20",
            "--kube-api-burst=30",
            "--log-level=debug",
            "--shutdown-timeout-seconds=5",
        ]);
        assert_eq!(set.kube_api_qps.get(), 20);
        assert_eq!(set.kube_api_burst.get(), 30);
        assert_eq!(set.log_level, tracing::Level::DEBUG);
        assert_eq!(set.shutdown_timeout_seconds, 5);
        assert!(
            Cli::try_parse_from(["bitpool", "run", "--kube-api-qps=0"]).is_err(),
            "a zero rate would stop every request"
        );
    }

    #[test]
    fn webhook_flags_take_capi_manager_spellings() {
        let defaults = run_args(&[]).webhook;
        assert_eq!(defaults.webhook_port, 9443);
        assert_eq!(
            defaults.webhook_cert_dir,
            PathBuf::from("/tmp/k8s-webhook-server/serving-certs")
        );
        assert_eq!(defaults.tls_min_version, crate::net::tls::MinVersion::Tls12);
        assert!(defaults.tls_cipher_suites.is_empty() && !defaults.refuse_overlapping_pools);
        let set = run_args(&[
            "--webhook-port=0",
            "--tls-min-version=VersionTLS13",
            "--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
            "--refuse-overlapping-pools",
        ])
        .webhook;
        assert_eq!(set.webhook_port, 0);
        assert_eq!(set.tls_min_version, crate::net::tls::MinVersion::Tls13);
        assert_eq!(set.tls_cipher_suites.len(), 2);
        assert!(set.refuse_overlapping_pools);
        let refused = Cli::try_parse_from(["bitpool", "run", "--tls-min-version=VersionTLS11"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(refused.contains("VersionTLS11"), "{refused}");
    }

    #[test]
    fn capi_manager_flags_are_accepted_with_their_meaning() {
        let defaults = run_args(&[]);
        assert_eq!(defaults.ops.health_addr, ":9440");
        assert_eq!(defaults.ops.diagnostics_address, ":8443");
        assert!(!defaults.ops.insecure_diagnostics && !defaults.ops.leader_elect);
        assert_eq!(
            defaults.ops.leader_elect_lease_duration,
            Duration::from_secs(15)
        );
        assert_eq!(
            defaults.ops.leader_elect_renew_deadline,
            Duration::from_secs(10)
        );
        assert_eq!(
            (defaults.concurrency, defaults.sync_period),
            (10, Duration::from_secs(600))
        );
        // As CAPI's own manifests and tooling spell them.
        let set = run_args(&[
            "--leader-elect",
            "--diagnostics-address=:8080",
            "--insecure-diagnostics=true",
            "--health-addr=127.0.0.1:9441",
            "--leader-elect-lease-duration=1m30s",
            "--leader-elect-renew-deadline=45s",
            "--leader-elect-retry-period=500ms",
            "--concurrency=3",
            "--sync-period=2h",
            "--kube-api-qps=20",
            "--kube-api-burst=30",
        ]);
        assert!(set.ops.leader_elect && set.ops.insecure_diagnostics);
        assert_eq!(set.ops.diagnostics_address, ":8080");
        assert_eq!(set.ops.leader_elect_lease_duration, Duration::from_secs(90));
        assert_eq!(set.ops.leader_elect_renew_deadline, Duration::from_secs(45));
        assert_eq!(
            set.ops.leader_elect_retry_period,
            Duration::from_millis(500)
        );
        assert_eq!(
            (set.concurrency, set.sync_period),
            (3, Duration::from_secs(7200))
        );
        assert_eq!((set.kube_api_qps.get(), set.kube_api_burst.get()), (20, 30));
        assert!(!run_args(&["--leader-elect=false"]).ops.leader_elect);
        // The in-cluster provider's own spellings, so its Deployment's arguments keep working.
        let in_cluster = run_args(&[
            "--health-probe-bind-address=:8081",
            "--webhook-cert-name=cert.pem",
            "--webhook-key-name=key.pem",
        ]);
        assert_eq!(in_cluster.ops.health_addr, ":8081");
        let tls = in_cluster.webhook.tls_options();
        assert_eq!(
            (tls.cert_name.as_str(), tls.key_name.as_str()),
            ("cert.pem", "key.pem")
        );
    }

    #[test]
    fn controller_groups_default_to_all_and_choose_the_crds_required() {
        assert_eq!(groups(&run_args(&[]).controllers), runtime::Groups::ALL);
        let capi = groups(&run_args(&["--controllers=capi-ipam"]).controllers);
        let names = |g| {
            crds::required(g)
                .into_iter()
                .map(|c| c.name)
                .collect::<Vec<_>>()
        };
        let capi_crds = names(capi);
        assert_eq!(capi_crds.len(), 6, "{capi_crds:?}");
        assert!(
            capi_crds
                .iter()
                .all(|n| n.ends_with(".ipam.cluster.x-k8s.io"))
        );
        let bundle = groups(&run_args(&["--controllers", "capi-ipam,metal3-ipam"]).controllers);
        let bundle_crds = names(bundle);
        assert_eq!(bundle_crds.len(), 9, "{bundle_crds:?}");
        assert_eq!(names(runtime::Groups::ALL).len(), 12);
        let proxy = groups(&run_args(&["--controllers=migration-proxy"]).controllers);
        assert_eq!(proxy.names(), ["migration-proxy"]);
        assert_eq!(names(proxy).len(), 9, "the CAPI kinds and Metal3 IPAM's");
        let refused = Cli::try_parse_from(["bitpool", "run", "--controllers=capm3"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(refused.contains("capi-ipam"), "{refused}");
    }

    #[test]
    fn go_durations_parse_and_nonsense_is_refused_by_name() {
        assert_eq!(parse_go_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_go_duration("1h2m3s"), Ok(Duration::from_secs(3723)));
        assert_eq!(parse_go_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_go_duration("250ms"), Ok(Duration::from_millis(250)));
        for bad in ["", "10", "s", "10x", "1h-2m", "ten seconds"] {
            let error = parse_go_duration(bad).unwrap_err();
            assert!(error.contains("not a duration"), "{bad}: {error}");
        }
    }

    #[test]
    fn bmh_name_based_preallocation_takes_capm3s_flag_spellings() {
        assert!(!preallocation(&[]));
        assert!(preallocation(&["--enable-bmh-name-based-preallocation"]));
        assert!(preallocation(&[
            "--enable-bmh-name-based-preallocation=true"
        ]));
        assert!(!preallocation(&[
            "--enable-bmh-name-based-preallocation=false"
        ]));
        // The spelling of CAPM3 before v1.13.
        assert!(preallocation(&["--enableBMHNameBasedPreallocation=true"]));
    }
}
