//! The `bitpool` command line, one file per command: `run` (the controllers), `crds`, `rbac`
//! and `migrate`. Every flag can also be set by the environment variable named in its help text.

mod crds;
mod migrate;
mod rbac;
mod run;

use clap::{Parser, Subcommand, ValueEnum};

pub use crds::CrdsArgs;
pub use migrate::MigrateArgs;
pub use rbac::RbacArgs;
pub use run::{LogFormat, OpsArgs, RunArgs, WebhookArgs, parse_go_duration};

use crate::net::http;
use crate::ops::lease;
use crate::runtime;

#[derive(Debug, Parser)]
#[command(name = "bitpool", version = crate::VERSION_AND_COMMIT, about = "IP address management for bare-metal Kubernetes", long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controllers against $KUBECONFIG, or the in-cluster configuration.
    Run(Box<RunArgs>),
    /// Print the CRDs of the kinds bitpool serves, write them to a directory, or apply them.
    Crds(CrdsArgs),
    /// Print the RBAC roles bitpool needs for the given controller groups.
    Rbac(RbacArgs),
    /// Write InClusterIPPools that replace Metal3 IPPools, pinning every allocated address to its
    /// claim name so that no address changes. Prints the manifests unless --apply is given.
    Migrate(MigrateArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ControllerGroup {
    CapiIpam,
    Metal3Ipam,
    MigrationProxy,
    Metal3Data,
}

pub(crate) fn groups(selected: &[ControllerGroup]) -> runtime::Groups {
    runtime::Groups {
        capi_ipam: selected.contains(&ControllerGroup::CapiIpam),
        metal3_ipam: selected.contains(&ControllerGroup::Metal3Ipam),
        migration_proxy: selected.contains(&ControllerGroup::MigrationProxy),
        metal3_data: selected.contains(&ControllerGroup::Metal3Data),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Crds(#[from] crate::crds::Error),
    #[error(transparent)]
    Client(#[from] crate::client::Error),
    #[error("cannot connect to the cluster: {0}")]
    Connect(#[source] kube::Error),
    #[error("cannot write to standard output: {0}")]
    Stdout(#[source] std::io::Error),
    #[error("cannot read {path}: {reason}")]
    Input { path: String, reason: String },
    #[error("cannot write {path}: {reason}")]
    Output { path: String, reason: String },
    #[error("cannot list {what}: {source}")]
    List {
        what: &'static str,
        source: kube::Error,
    },
    #[error("{0}")]
    Migrate(#[from] crate::migrate::MigrateError),
    #[error("cannot render the manifests: {0}")]
    Render(#[source] serde_saphyr::SerializeError),
    #[error("cannot apply InClusterIPPool {name}: {source}")]
    Apply { name: String, source: kube::Error },
    #[error(transparent)]
    Webhook(#[from] crate::webhook::ServeError),
    #[error(transparent)]
    Contract(#[from] crate::crds::ContractError),
    #[error(transparent)]
    Bind(#[from] http::BindError),
    #[error(transparent)]
    Election(#[from] lease::ElectionError),
    #[error("{0}")]
    Flag(String),
    #[error("{0} allocation(s) would change; nothing was written")]
    WouldChange(usize),
}

pub async fn execute(cli: Cli) -> Result<(), Error> {
    match cli.command {
        Command::Run(args) => run::run(*args).await,
        Command::Rbac(args) => rbac::rbac_command(args),
        Command::Crds(args) => crds::crds_command(args).await,
        Command::Migrate(args) => migrate::migrate_command(args).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--version` names the release and the commit: what an operator quotes in a bug report.
    #[test]
    fn version_names_the_release_and_the_commit() {
        let shown = match Cli::try_parse_from(["bitpool", "--version"]) {
            Err(error) if error.kind() == clap::error::ErrorKind::DisplayVersion => {
                error.to_string()
            }
            other => panic!("--version did not print the version: {other:?}"),
        };
        let expected_release = option_env!("BITPOOL_VERSION")
            .filter(|v| !v.trim().is_empty())
            .map_or_else(
                || format!("v{}-dev", env!("CARGO_PKG_VERSION")),
                str::to_owned,
            );
        let (release, commit) = shown
            .trim()
            .strip_prefix("bitpool ")
            .and_then(|rest| rest.strip_suffix(')'))
            .and_then(|rest| rest.split_once(" (commit "))
            .unwrap_or_else(|| panic!("not `bitpool VERSION (commit COMMIT)`: {shown:?}"));
        assert_eq!(release, expected_release);
        assert!(
            commit == "unknown"
                || (commit.len() == 12 && commit.bytes().all(|b| b.is_ascii_hexdigit())),
            "{commit:?} is neither a commit nor \"unknown\""
        );
    }
}
