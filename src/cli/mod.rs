//! The `bitpool` command line, one file per command: `run` (the controllers), `crds`, `rbac`,
//! `migrate`, and `inspect` (`pools`, `who-has`, `explain`, `check`: also `kubectl bitpool`).
//! Every flag can also be set by the environment variable named in its help text.

mod crds;
mod inspect;
mod migrate;
mod rbac;
mod run;

use clap::{Parser, Subcommand, ValueEnum};

pub use crds::CrdsArgs;
pub use inspect::{CheckArgs, ExplainArgs, Format, PoolsArgs, Target, WhoHasArgs};
pub use migrate::MigrateArgs;
pub use rbac::RbacArgs;
pub use run::{LogFormat, OpsArgs, RunArgs, WebhookArgs, parse_go_duration};

use crate::net::http;
use crate::ops::lease;
use crate::runtime;

/// The command line: one of [`Command`].
#[derive(Debug, Parser)]
#[command(name = "bitpool", version = crate::VERSION_AND_COMMIT, about = "IP address management for bare-metal Kubernetes", long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// The commands bitpool has.
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
    /// Every pool of every kind: exact total, used, free and out-of-range counts, claims
    /// waiting, Ready and why not. Reads only.
    Pools(PoolsArgs),
    /// Who holds an address, or anything in a prefix: the address object, its claim and what
    /// owns the claim, across both claim kinds and every namespace. Exits 1 when nobody does.
    WhoHas(WhoHasArgs),
    /// Why a claim is or is not served, in one paragraph that says what to do. Exits 1 when it
    /// is not served.
    Explain(ExplainArgs),
    /// The invariants bitpool's tests assert, on the live cluster: no address held twice,
    /// ledgers equal to the live objects, no orphan address, no claim stuck deleting. Exits 1
    /// with what is wrong. Reads only.
    Check(CheckArgs),
}

/// What a command that answers a question answered: exit 0 for yes (found, served, every
/// invariant holds), 1 for no. A command that could not answer exits 2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Yes,
    No,
}

/// A group of controllers, as `--controllers` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ControllerGroup {
    CapiIpam,
    Metal3Ipam,
    MigrationProxy,
    Metal3Data,
}

/// The runtime's groups, each on when `selected` names it.
pub(crate) fn groups(selected: &[ControllerGroup]) -> runtime::Groups {
    runtime::Groups {
        capi_ipam: selected.contains(&ControllerGroup::CapiIpam),
        metal3_ipam: selected.contains(&ControllerGroup::Metal3Ipam),
        migration_proxy: selected.contains(&ControllerGroup::MigrationProxy),
        metal3_data: selected.contains(&ControllerGroup::Metal3Data),
    }
}

/// Why a command could not do its work (or, for `migrate --check`, answered no).
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
    #[error(transparent)]
    Read(#[from] crate::inspect::ReadError),
}

impl Error {
    /// 1 when the command answered no (`migrate --check`: allocations would change), 2 when it
    /// could not do its work.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::WouldChange(_) => 1,
            _ => 2,
        }
    }
}

/// Runs the command `cli` names.
pub async fn execute(cli: Cli) -> Result<Answer, Error> {
    let done = |result: Result<(), Error>| result.map(|()| Answer::Yes);
    match cli.command {
        Command::Run(args) => done(run::run(*args).await),
        Command::Rbac(args) => done(rbac::rbac_command(args)),
        Command::Crds(args) => done(crds::crds_command(args).await),
        Command::Migrate(args) => done(migrate::migrate_command(args).await),
        Command::Pools(args) => inspect::pools_command(args).await,
        Command::WhoHas(args) => inspect::who_has_command(args).await,
        Command::Explain(args) => inspect::explain_command(args).await,
        Command::Check(args) => inspect::check_command(args).await,
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
