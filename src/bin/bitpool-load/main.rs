//! `bitpool-load`: the load command. Against `$KUBECONFIG`, it runs a provider (bitpool, and
//! optionally as its peers the upstream in-cluster provider for Cluster API's pools and Metal3's
//! ip-address-manager for Metal3's) as a child process and measures, per
//! scenario, the time until every claim has its address, the claims per second as a fraction of
//! the server's raw create rate over three (a claim needs at least three writes), the same for
//! deletion, the provider's CPU seconds and peak memory, its start-up time, and checks that no
//! address was handed out twice and no claim missed one. `hack/load.sh` builds and runs it.

mod admission;
mod certs;
mod flavour;
mod hosts;
mod provider;
mod scenario;
mod workload;
mod writes;

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;

use flavour::Flavour;
use provider::{Kind, Provider};
use scenario::{Networks, Row, Scenario};

#[derive(Parser, Debug)]
#[command(about = "Loads a provider with IPAddressClaims and measures it")]
struct Args {
    /// The bitpool binary to run.
    #[arg(long)]
    bitpool: PathBuf,
    /// The upstream in-cluster provider's binary: run as bitpool's peer, scenario by scenario.
    #[arg(long)]
    in_cluster: Option<PathBuf>,
    /// Metal3's ip-address-manager: run as bitpool's peer on the Metal3 runs, at its default
    /// flags and again at bitpool's client limits.
    #[arg(long)]
    metal3_ipam: Option<PathBuf>,
    /// CAPM3's manager, for the runs of hosts rendered (`--metal3-hosts`).
    #[arg(long)]
    capm3: Option<PathBuf>,
    /// Hosts rendered through a Metal3DataTemplate with a Metal3 and a CAPI pool, one run per
    /// setup (CAPM3 with metal3-ipam and in-cluster, CAPM3 with bitpool, bitpool alone); needs
    /// --capm3, --metal3-ipam, --in-cluster and --upstream-crds.
    #[arg(long)]
    metal3_hosts: Option<usize>,
    /// Bursts of claims on one pool, one run each.
    #[arg(long, value_delimiter = ',')]
    claims: Vec<usize>,
    /// Bursts on one Metal3 IPPool, one run each: of IPClaims, then of IPAddressClaims.
    #[arg(long, value_delimiter = ',')]
    metal3_claims: Vec<usize>,
    /// Many pools: `<pools>x<claims per pool>`.
    #[arg(long, value_delimiter = ',')]
    pools: Vec<String>,
    /// Claims made 500 at a time, each 500 served before the next, on two pools (IPv4 and IPv6):
    /// a /16 and a /64, then a /8 and all of IPv6 (memory by the shape of the work; bitpool
    /// only).
    #[arg(long, value_delimiter = ',')]
    chunked: Vec<usize>,
    /// Backlogs: claims created while the provider is stopped, then served from its start.
    #[arg(long, value_delimiter = ',')]
    backlog: Vec<usize>,
    /// Claims allocated and held across a restart: memory with them all allocated, and the time
    /// from process start to a new claim served (bitpool only).
    #[arg(long)]
    hold: Option<usize>,
    /// Addresses allocated from one pool while the admission webhook's check of a delete and of
    /// an update of that pool is timed, reading the pool's ledger and reading a list.
    #[arg(long)]
    admission: Option<usize>,
    /// Requests the load command keeps in flight.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// Claims the load command takes through the contract's writes itself, before each run and
    /// after it, at 8, 16 and 32 requests in flight (the server's own rate for the contract is
    /// the best of them; a run's own size compares it with a server holding as many objects).
    #[arg(long, default_value_t = 1000)]
    contract_sample: usize,
    /// The largest run the peer takes part in (the upstream provider slows down as pools fill).
    #[arg(long, default_value_t = 3000)]
    peer_max: usize,
    /// The largest run a peer takes part in at its default flags (at most --peer-max; Metal3's
    /// ip-address-manager serves about 10 claims/s at its defaults).
    #[arg(long)]
    peer_defaults_max: Option<usize>,
    /// Longest wait for any one phase, in seconds.
    #[arg(long, default_value_t = 1800)]
    timeout: u64,
    /// Where the providers' logs go.
    #[arg(long, default_value = "target/load-logs")]
    logs: PathBuf,
    /// The upstream CRDs folder (`hack/upstream-crds.sh`): Cluster API's claim, address and
    /// Cluster CRDs are installed from it where the cluster lacks them.
    #[arg(long)]
    upstream_crds: Option<PathBuf>,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if let Err(e) = run(args).await {
        eprintln!("load: {e}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<(), String> {
    let client = kube::Client::try_default()
        .await
        .map_err(|e| format!("no usable cluster (set KUBECONFIG): {e}"))?;
    install_missing_crds(&client, args.upstream_crds.as_deref()).await?;
    std::fs::create_dir_all(&args.logs)
        .map_err(|e| format!("cannot create {}: {e}", args.logs.display()))?;
    let kubeconfig = std::env::var_os("KUBECONFIG")
        .map(PathBuf::from)
        .ok_or("set KUBECONFIG to the cluster under load")?;
    let mut providers = vec![Provider::new(Kind::Bitpool, args.bitpool.clone())];
    if let Some(binary) = &args.in_cluster {
        providers.push(Provider::new(Kind::InCluster, binary.clone()));
    }
    if let Some(binary) = &args.metal3_ipam {
        let peer = Provider::new(Kind::Metal3Ipam, binary.clone());
        let tuned = peer.at_bitpool_limits();
        providers.extend([peer, tuned]);
    }
    let runner = scenario::Runner {
        load: workload::Load {
            client,
            connections: args.connections,
        },
        kubeconfig,
        logs: args.logs.clone(),
        limit: Duration::from_secs(args.timeout),
        contract_sample: args.contract_sample,
    };
    if let Some(count) = args.admission {
        let rows = admission::measure(&runner.load, count, runner.limit).await?;
        println!(
            "| admission of a pool | addresses allocated | from its ledger (ms) | from a list (ms) | list ÷ ledger |"
        );
        println!("|---|---|---|---|---|");
        print!("{rows}");
        if !claim_runs(&args) && args.metal3_hosts.is_none() {
            return Ok(());
        }
    }
    if let Some(hosts) = args.metal3_hosts {
        let runner = hosts_runner(&args, &runner)?;
        let rows = runner.measure(hosts).await?;
        print!("{}", hosts::table(&rows));
        if rows.iter().any(hosts::HostsRow::failed) {
            return Err(
                "a run of hosts handed out a duplicate or left a host without its addresses".into(),
            );
        }
        if !claim_runs(&args) {
            return Ok(());
        }
    }
    let mut rows = Vec::new();
    for scenario in scenarios(&args)? {
        for provider in &providers {
            if !takes_part(&args, &scenario, provider) {
                continue;
            }
            eprintln!("load: {} with {}", scenario.describe(), provider.label());
            let row = runner.run(provider, &scenario).await?;
            eprintln!("load: {}", row.summary());
            rows.push(row);
        }
    }
    print!("{}", scenario::table(&rows));
    let bad = rows.iter().any(Row::failed);
    if bad {
        return Err("a run handed out a duplicate or left a claim without its address".into());
    }
    Ok(())
}

/// Whether `provider` runs `scenario`: a peer up to --peer-max claims, and at its default flags
/// up to --peer-defaults-max.
fn takes_part(args: &Args, scenario: &Scenario, provider: &Provider) -> bool {
    let most = match provider.extra.is_empty() {
        true => args.peer_defaults_max.unwrap_or(args.peer_max),
        false => args.peer_max,
    };
    scenario.for_provider(provider, most.min(args.peer_max))
}

/// Whether runs of claims were asked for.
fn claim_runs(args: &Args) -> bool {
    !(args.claims.is_empty()
        && args.pools.is_empty()
        && args.metal3_claims.is_empty()
        && args.backlog.is_empty()
        && args.chunked.is_empty()
        && args.hold.is_none())
}

fn hosts_runner<'a>(
    args: &Args,
    runner: &'a scenario::Runner,
) -> Result<hosts::HostsRunner<'a>, String> {
    let needed = |path: &Option<PathBuf>, flag: &str| {
        path.clone()
            .ok_or_else(|| format!("--metal3-hosts needs {flag}"))
    };
    let managers = hosts::managers(
        &args.bitpool,
        &needed(&args.capm3, "--capm3")?,
        &needed(&args.metal3_ipam, "--metal3-ipam")?,
        &needed(&args.in_cluster, "--in-cluster")?,
    );
    Ok(hosts::HostsRunner {
        load: &runner.load,
        managers,
        kubeconfig: runner.kubeconfig.clone(),
        logs: runner.logs.clone(),
        upstream_crds: needed(&args.upstream_crds, "--upstream-crds")?,
        limit: runner.limit,
    })
}

fn scenarios(args: &Args) -> Result<Vec<Scenario>, String> {
    let mut all: Vec<Scenario> = args.claims.iter().map(|n| Scenario::burst(1, *n)).collect();
    for spec in &args.pools {
        let (pools, per_pool) = spec
            .split_once('x')
            .and_then(|(p, c)| Some((p.parse().ok()?, c.parse().ok()?)))
            .ok_or_else(|| format!("--pools {spec}: expected <pools>x<claims per pool>"))?;
        all.push(Scenario::burst(pools, per_pool));
    }
    for n in &args.metal3_claims {
        all.push(Scenario::burst_of(Flavour::Metal3OnMetal3, *n));
        all.push(Scenario::burst_of(Flavour::CapiOnMetal3, *n));
    }
    all.extend(args.backlog.iter().map(|n| Scenario::backlog(*n)));
    for n in &args.chunked {
        all.push(Scenario::chunked(*n, Networks::Narrow));
        all.push(Scenario::chunked(*n, Networks::Wide));
    }
    all.extend(args.hold.map(Scenario::hold));
    if all.is_empty() {
        return Err(
            "nothing to run: give --claims, --metal3-claims, --pools, --backlog, --chunked, --hold or --metal3-hosts".into(),
        );
    }
    Ok(all)
}

/// Installs the CRDs a run needs that the cluster does not have (never touching those it has):
/// bitpool's, and from `upstream` Cluster API's claims, addresses and Clusters and the in-cluster
/// provider's prefix pools.
async fn install_missing_crds(
    client: &kube::Client,
    upstream: Option<&std::path::Path>,
) -> Result<(), String> {
    let mut wanted = bitpool::crds::served();
    if let Some(dir) = upstream {
        // The in-cluster provider also waits for its prefix pools' CRDs.
        for file in [
            "cluster-api/ipam.cluster.x-k8s.io_ipaddressclaims.yaml",
            "cluster-api/ipam.cluster.x-k8s.io_ipaddresses.yaml",
            "cluster-api/cluster.x-k8s.io_clusters.yaml",
            "in-cluster/ipam.cluster.x-k8s.io_inclusterprefixpools.yaml",
            "in-cluster/ipam.cluster.x-k8s.io_globalinclusterprefixpools.yaml",
        ] {
            wanted.extend(hosts::read_crds(&dir.join(file))?);
        }
    } else {
        wanted.extend(bitpool::crds::standalone());
    }
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut missing = Vec::new();
    for crd in wanted {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let present = api
            .get_opt(&name)
            .await
            .map_err(|e| format!("cannot read CRD {name}: {e}"))?;
        if present.is_none() {
            missing.push(crd);
        }
    }
    bitpool::crds::apply(client, &missing, Duration::from_secs(60))
        .await
        .map_err(|e| format!("cannot install CRDs: {e}"))
}
