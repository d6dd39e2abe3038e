//! The `bitpool` command line. Every flag can also be set by the environment variable named in
//! its help text.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::{controllers, crds};

#[derive(Debug, Parser)]
#[command(name = "bitpool", version, about = "IP address management for bare-metal Kubernetes", long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controllers against $KUBECONFIG, or the in-cluster configuration.
    Run(RunArgs),
    /// Print the CRDs of the kinds bitpool serves, write them to a directory, or apply them.
    Crds(CrdsArgs),
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Log format.
    #[arg(long, env = "BITPOOL_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct CrdsArgs {
    /// Write one file per CRD (plus a kustomization) under this directory instead of printing.
    #[arg(long, env = "BITPOOL_CRDS_OUT")]
    pub out: Option<PathBuf>,
    /// Also include IPAddressClaim and IPAddress, for clusters without Cluster API core.
    #[arg(long, env = "BITPOOL_CRDS_STANDALONE")]
    pub standalone: bool,
    /// Install the CRDs into the cluster ($KUBECONFIG or in-cluster) by server-side apply and
    /// wait until they are established.
    #[arg(long, env = "BITPOOL_CRDS_APPLY", conflicts_with = "out")]
    pub apply: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Crds(#[from] crds::Error),
    #[error("cannot connect to the cluster: {0}")]
    Connect(#[source] kube::Error),
    #[error("cannot write to standard output: {0}")]
    Stdout(#[source] std::io::Error),
}

pub async fn execute(cli: Cli) -> Result<(), Error> {
    match cli.command {
        Command::Run(args) => run(args).await,
        Command::Crds(args) => crds_command(args).await,
    }
}

async fn crds_command(args: CrdsArgs) -> Result<(), Error> {
    if let Some(dir) = args.out {
        for file in crds::write_dir(&dir)? {
            eprintln!("wrote {}", dir.join(file).display());
        }
        return Ok(());
    }
    let mut selected = crds::served();
    if args.standalone {
        selected.extend(crds::standalone());
    }
    if args.apply {
        let client = kube::Client::try_default().await.map_err(Error::Connect)?;
        crds::apply(&client, &selected, Duration::from_secs(60)).await?;
        for crd in &selected {
            eprintln!(
                "established {}",
                crd.metadata.name.as_deref().unwrap_or_default()
            );
        }
        return Ok(());
    }
    use std::io::Write;
    std::io::stdout()
        .write_all(crds::to_yaml_stream(&selected)?.as_bytes())
        .map_err(Error::Stdout)
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn run(args: RunArgs) -> Result<(), Error> {
    init_tracing(args.log_format);
    let client = kube::Client::try_default().await.map_err(Error::Connect)?;
    // bitpool's own CRDs, and the contract's IPAddressClaim and IPAddress (from Cluster API
    // core, or `bitpool crds --apply --standalone`).
    let mut required = crds::served();
    required.extend(crds::standalone());
    let wait = Duration::from_secs(args.crd_wait_seconds);
    crds::wait_established(&client, &required, wait).await?;
    let settings = controllers::Settings {
        namespace: args.namespace,
        watch_filter: args.watch_filter,
        ledger_namespace: args.ledger_namespace,
    };
    controllers::run(client, settings, shutdown_signal()).await;
    tracing::info!("stopped");
    Ok(())
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
