//! `bitpool pools|who-has|explain|check`: the operator's questions, read-only, also run as
//! `kubectl bitpool …` (the binary on PATH as `kubectl-bitpool`). Each reads the cluster once
//! (`check` twice) and answers with a pure function of what it read ([`crate::inspect`]).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde::Serialize;

use super::{Answer, Error, parse_go_duration};
use crate::inspect::check::{self, Finding};
use crate::inspect::explain::{self, ClaimName, EventNote, Explanation};
use crate::inspect::pools::{self, PoolRow};
use crate::inspect::who_has::{self, Holding, Query};
use crate::inspect::{Scope, Snapshot, table};
use crate::ipam::kinds::AnyClaim;

/// How the inspect commands print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
    Yaml,
}

/// Which cluster, which namespace, and how to print: as kubectl spells them.
#[derive(Debug, Args)]
pub struct Target {
    /// Only this namespace's pools, claims and address objects, and the cluster-scoped pools
    /// they may claim from (default: every namespace; `explain`: the context's namespace).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// The kubeconfig to read (default: $KUBECONFIG, else ~/.kube/config, else in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long)]
    pub context: Option<String>,
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

/// The flags of `bitpool pools`.
#[derive(Debug, Args)]
pub struct PoolsArgs {
    #[command(flatten)]
    pub target: Target,
    /// Also the free addresses (sub-prefixes), merged into runs.
    #[arg(long)]
    pub wide: bool,
}

/// The flags of `bitpool who-has`.
#[derive(Debug, Args)]
pub struct WhoHasArgs {
    #[command(flatten)]
    pub target: Target,
    /// An address (10.0.4.17) or a prefix (10.0.4.0/24): every holder of an address in it.
    #[arg(value_name = "ADDRESS|PREFIX")]
    pub query: Query,
}

/// The flags of `bitpool explain`.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub target: Target,
    /// `ipaddressclaim/NAME`, `ipclaim/NAME`, or a bare NAME (either kind).
    #[arg(value_name = "CLAIM")]
    pub claim: ClaimName,
}

/// The flags of `bitpool check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub target: Target,
    /// How long past its pool's reuse grace period a deleting claim may take before it counts
    /// as stuck.
    #[arg(long, default_value = "5m", value_parser = parse_go_duration)]
    pub stuck_after: Duration,
    /// How long to wait before reading again to confirm what the first read found (work in
    /// flight can look like a fault for a moment); 0s reports the first read as it is.
    #[arg(long, default_value = "3s", value_parser = parse_go_duration)]
    pub recheck: Duration,
}

/// A client of the cluster `target` names, and the namespace it defaults to.
async fn connect(target: &Target) -> Result<(Client, String), Error> {
    let options = KubeConfigOptions {
        context: target.context.clone(),
        ..KubeConfigOptions::default()
    };
    let unusable = |e: &dyn std::fmt::Display| {
        Error::Flag(format!("cannot configure a client of the cluster: {e}"))
    };
    let mut config = match &target.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path).map_err(|e| Error::Input {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| unusable(&e))?
        }
        None if target.context.is_some() => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| unusable(&e))?,
        None => Config::infer().await.map_err(|e| unusable(&e))?,
    };
    let namespace = config.default_namespace.clone();
    config.headers.push((
        hyper::header::USER_AGENT,
        hyper::header::HeaderValue::from_static(crate::client::USER_AGENT),
    ));
    let client = Client::try_from(config).map_err(Error::Connect)?;
    Ok((client, namespace))
}

async fn read(client: &Client, target: &Target) -> Result<Snapshot, Error> {
    let scope = target
        .namespace
        .clone()
        .map_or(Scope::Cluster, Scope::Namespace);
    Snapshot::read(client, scope).await.map_err(Error::Read)
}

/// Prints `value` as JSON or YAML, or `table` for the table format.
fn print<T: Serialize>(
    format: Format,
    value: &T,
    table: impl FnOnce() -> String,
) -> Result<(), Error> {
    let text = match format {
        Format::Table => table(),
        Format::Json => serde_json::to_string_pretty(value)
            .map(|json| json + "\n")
            .map_err(|e| Error::Flag(format!("cannot render JSON: {e}")))?,
        Format::Yaml => serde_saphyr::to_string(value).map_err(Error::Render)?,
    };
    use std::io::Write;
    std::io::stdout()
        .write_all(text.as_bytes())
        .map_err(Error::Stdout)
}

pub(super) async fn pools_command(args: PoolsArgs) -> Result<Answer, Error> {
    let (client, _) = connect(&args.target).await?;
    let snapshot = read(&client, &args.target).await?;
    let rows = pools::pool_rows(&snapshot, args.wide);
    print(args.target.output, &rows, || pools_table(&rows, args.wide))?;
    Ok(Answer::Yes)
}

fn pools_table(rows: &[PoolRow], wide: bool) -> String {
    let mut headers = vec![
        "KIND",
        "NAMESPACE",
        "NAME",
        "TOTAL",
        "USED",
        "FREE",
        "OUT OF RANGE",
        "PENDING",
        "READY",
        "WHY",
    ];
    if wide {
        headers.push("FREE RANGES");
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            let mut cells = vec![
                row.kind.clone(),
                row.namespace.clone().unwrap_or_else(|| "-".into()),
                row.name.clone(),
                row.total.clone(),
                row.used.clone(),
                row.free.clone(),
                row.out_of_range.clone(),
                row.pending_claims.to_string(),
                row.ready.clone(),
                dash_if_empty(&row.why),
            ];
            if wide {
                cells.push(dash_if_empty(
                    &row.free_ranges.clone().unwrap_or_default().join(","),
                ));
            }
            cells
        })
        .collect();
    table::render(&headers, &cells)
}

fn dash_if_empty(text: &str) -> String {
    match text.is_empty() {
        true => "-".into(),
        false => text.into(),
    }
}

pub(super) async fn who_has_command(args: WhoHasArgs) -> Result<Answer, Error> {
    let (client, _) = connect(&args.target).await?;
    let snapshot = read(&client, &args.target).await?;
    let holdings = who_has::who_has(&snapshot, args.query);
    if holdings.is_empty() {
        eprintln!("nothing holds {}", args.query);
        if args.target.output == Format::Table {
            return Ok(Answer::No);
        }
    }
    print(args.target.output, &holdings, || holdings_table(&holdings))?;
    Ok(match holdings.is_empty() {
        true => Answer::No,
        false => Answer::Yes,
    })
}

fn holdings_table(holdings: &[Holding]) -> String {
    let headers = [
        "ADDRESS",
        "NAMESPACE",
        "OBJECT",
        "POOL",
        "CLAIM",
        "CLAIM OWNERS",
        "CLUSTER",
    ];
    let cells: Vec<Vec<String>> = holdings
        .iter()
        .map(|h| {
            let object = match h.name.is_empty() {
                true => format!("{} (reserved)", h.object),
                false => format!("{}/{}", h.object, h.name),
            };
            let deleting = if h.deleting { " (deleting)" } else { "" };
            vec![
                h.address.clone(),
                h.namespace.clone(),
                object + deleting,
                h.pool.clone(),
                h.claim.clone(),
                dash_if_empty(&h.claim_owners.join(",")),
                h.cluster.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    table::render(&headers, &cells)
}

pub(super) async fn explain_command(args: ExplainArgs) -> Result<Answer, Error> {
    let (client, default_namespace) = connect(&args.target).await?;
    let namespace = args.target.namespace.clone().unwrap_or(default_namespace);
    let target = Target {
        namespace: Some(namespace.clone()),
        ..args.target
    };
    let snapshot = read(&client, &target).await?;
    let claim = explain::find_claim(&snapshot, &namespace, &args.claim).ok_or_else(|| {
        Error::Flag(format!(
            "no claim {} in namespace {namespace}",
            args.claim.name
        ))
    })?;
    let events = claim_events(&client, &claim).await?;
    let explanation = explain::explain(&snapshot, &claim, &events);
    print(target.output, &explanation, || wrap(&explanation))?;
    Ok(match explanation.served {
        true => Answer::Yes,
        false => Answer::No,
    })
}

/// The paragraph, wrapped at 100 columns.
fn wrap(explanation: &Explanation) -> String {
    let mut out = String::new();
    let mut line = 0;
    for word in explanation.paragraph().split(' ') {
        if line > 0 && line + 1 + word.len() > 100 {
            out.push('\n');
            line = 0;
        } else if line > 0 {
            out.push(' ');
            line += 1;
        }
        out.push_str(word);
        line += word.len();
    }
    out + "\n"
}

/// The claim's Events (of this very object, not an earlier one of its name), oldest first.
async fn claim_events(client: &Client, claim: &AnyClaim) -> Result<Vec<EventNote>, Error> {
    let api: Api<Event> = Api::namespaced(client.clone(), claim.meta.namespace());
    let selector = format!("involvedObject.name={}", claim.meta.name);
    let listed = api
        .list(&ListParams::default().fields(&selector))
        .await
        .map_err(|source| Error::List {
            what: "Events",
            source,
        })?;
    let uid = claim.uid().unwrap_or_default();
    let mut events: Vec<&Event> = listed
        .items
        .iter()
        .filter(|e| e.involved_object.uid.as_deref() == Some(uid.as_str()))
        .collect();
    events.sort_by_key(|e| {
        e.last_timestamp
            .as_ref()
            .map(|t| t.0)
            .or(e.event_time.as_ref().map(|t| t.0))
    });
    Ok(events
        .into_iter()
        .map(|e| EventNote {
            type_: e.type_.clone().unwrap_or_default(),
            reason: e.reason.clone().unwrap_or_default(),
            message: e.message.clone().unwrap_or_default(),
        })
        .collect())
}

pub(super) async fn check_command(args: CheckArgs) -> Result<Answer, Error> {
    let (client, _) = connect(&args.target).await?;
    let first = read(&client, &args.target).await?;
    let mut found = check::findings(&first, args.stuck_after);
    if !found.is_empty() && !args.recheck.is_zero() {
        tokio::time::sleep(args.recheck).await;
        let second = read(&client, &args.target).await?;
        found = check::confirmed(found, &check::findings(&second, args.stuck_after));
    }
    print(args.target.output, &found, || findings_table(&found))?;
    Ok(match found.is_empty() {
        true => Answer::Yes,
        false => Answer::No,
    })
}

fn findings_table(found: &[Finding]) -> String {
    if found.is_empty() {
        return "every invariant holds\n".into();
    }
    let cells: Vec<Vec<String>> = found
        .iter()
        .map(|f| vec![format!("{:?}", f.rule), f.subject.clone(), f.detail.clone()])
        .collect();
    table::render(&["RULE", "OBJECT", "WHAT IS WRONG"], &cells)
}
