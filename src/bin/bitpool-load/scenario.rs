//! One measured run: a fresh provider process, a namespace of pools, a burst (or backlog) of
//! claims until all have their addresses, the check, and the deletion of them all.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kube::runtime::reflector::ObjectRef;

use crate::flavour::Flavour;
use crate::provider::{Kind, Provider, Running, Serving, Usage};
use crate::workload::{self, Load, Pool, Verdict, Watch};
use crate::writes::Writes;

/// Raw creates measured before a run and again after it (the server's rate moves with the
/// machine's load, so the run is compared with the mean of both).
const RAW_SAMPLE: usize = 2000;
const RAW_NAMESPACE: &str = "bitpool-load-raw";
/// The driver widths the contract's rate is measured at: the best of them counts.
const CONTRACT_WIDTHS: [usize; 3] = [8, 16, 32];

/// How a run's claims meet the provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Claims created while the provider runs.
    Burst,
    /// Claims created while the provider is stopped; timed from its start.
    Backlog,
    /// A burst kept across a restart of the provider: memory and start-up with it allocated.
    Hold,
    /// Claims created this many at a time, each chunk served before the next is made.
    Chunked(usize),
}

/// The networks of a run's pools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Networks {
    /// One /14, or /24s side by side ([`workload::pool`]).
    Sized,
    /// Two pools, IPv4 and IPv6 ([`workload::two_family_pool`]): a /16 and a /64.
    Narrow,
    /// The same two of the largest size each family has: a /8 and all of IPv6.
    Wide,
}

impl Networks {
    fn describe(self) -> &'static str {
        match self {
            Self::Sized => "one pool",
            Self::Narrow => "a /16 and a /64",
            Self::Wide => "a /8 and ::/0",
        }
    }
}

/// How many claims a chunked run makes at a time.
pub const CHUNK: usize = 500;

/// One run: how many pools and claims, how they are made, of which flavour.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub pools: usize,
    pub per_pool: usize,
    pub mode: Mode,
    pub flavour: Flavour,
    pub networks: Networks,
}

impl Scenario {
    /// `pools` pools of `per_pool` claims each, made while the provider runs.
    pub fn burst(pools: usize, per_pool: usize) -> Self {
        Self {
            pools,
            per_pool,
            mode: Mode::Burst,
            flavour: Flavour::CapiOnInCluster,
            networks: Networks::Sized,
        }
    }

    /// `claims` claims made [`CHUNK`] at a time on two pools of `networks`, alternately.
    pub fn chunked(claims: usize, networks: Networks) -> Self {
        Self {
            mode: Mode::Chunked(CHUNK),
            networks,
            ..Self::burst(2, claims.div_ceil(2))
        }
    }

    /// A burst of `claims` claims of `flavour` on one pool.
    pub fn burst_of(flavour: Flavour, claims: usize) -> Self {
        Self {
            flavour,
            ..Self::burst(1, claims)
        }
    }

    /// `claims` claims in one pool, made while the provider is stopped.
    pub fn backlog(claims: usize) -> Self {
        Self {
            mode: Mode::Backlog,
            ..Self::burst(1, claims)
        }
    }

    /// `claims` claims in one pool, held across a restart of the provider.
    pub fn hold(claims: usize) -> Self {
        Self {
            mode: Mode::Hold,
            ..Self::burst(1, claims)
        }
    }

    /// How many claims the run makes.
    pub fn claims(&self) -> usize {
        self.pools * self.per_pool
    }

    /// Whether `provider` takes part: a peer only on its own ground (held runs measure
    /// bitpool's own start-up), and up to `peer_max` claims.
    pub fn for_provider(&self, provider: &Provider, peer_max: usize) -> bool {
        match provider.kind {
            Kind::Bitpool => true,
            peer => {
                let peers_run = matches!(self.mode, Mode::Burst | Mode::Backlog);
                peer.serves(self.flavour) && peers_run && self.claims() <= peer_max
            }
        }
    }

    /// The run as the report names it.
    pub fn describe(&self) -> String {
        let what = match self.mode {
            Mode::Burst => "burst",
            Mode::Backlog => "backlog",
            Mode::Hold => "held",
            Mode::Chunked(chunk) => {
                let (claims, networks) = (self.claims(), self.networks.describe());
                return format!("{claims} claims in chunks of {chunk} on {networks}");
            }
        };
        let run = match self.pools {
            1 => format!("{what} of {} claims on one pool", self.per_pool),
            p => format!("{what} of {p} pools x {} claims", self.per_pool),
        };
        match self.flavour {
            Flavour::CapiOnInCluster => run,
            other => format!("{run} ({})", other.describe()),
        }
    }
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct Row {
    pub provider: String,
    pub scenario: String,
    pub claims: usize,
    /// The server's raw creates per second: the mean of a measurement before and one after.
    pub raw: f64,
    /// Claims per second the server takes through the contract's writes, allocation and
    /// deletion, driven by the load command alone (see [`Load::contract_rate`]).
    pub contract: (f64, f64),
    pub allocation: Duration,
    pub allocation_cpu: f64,
    /// What the server wrote while the claims were made and served, whoever wrote it.
    pub allocation_writes: Writes,
    pub deletion: Duration,
    pub deletion_cpu: f64,
    pub deletion_writes: Writes,
    pub peak_rss_mib: f64,
    /// Held runs: how soon the restarted process served new claims, and its memory then.
    pub start_up: Option<StartUp>,
    pub verdict: Verdict,
}

impl Row {
    fn rate(&self, time: Duration) -> f64 {
        self.claims as f64 / time.as_secs_f64().max(1e-9)
    }

    /// Claims per second as a fraction of raw/3 (three writes per claim at least).
    fn of_limit(&self, time: Duration) -> f64 {
        self.rate(time) / (self.raw / 3.0)
    }

    /// This row's rate over `time` as a share of `of`, the contract's rate: "–" when the run
    /// did not measure it (`--contract-sample 0`).
    fn of_contract(&self, time: Duration, of: f64) -> String {
        match of > 0.0 {
            true => format!("{:.0}%", 100.0 * self.rate(time) / of),
            false => "–".into(),
        }
    }

    /// Whether the run handed an address out twice or left a claim unserved.
    pub fn failed(&self) -> bool {
        self.verdict.duplicates > 0 || self.verdict.misses > 0
    }

    /// The run's measurements in one line.
    pub fn summary(&self) -> String {
        format!(
            "{} claims in {:.1} s = {:.0}/s ({:.0}% of raw/3, raw {:.0}/s; {} of the contract's {:.0}/s; writes per claim {}), deleted in {:.1} s ({:.0}% of raw/3; {} of the contract's {:.0}/s; writes per claim {}), CPU {:.1}+{:.1} s, peak RSS {:.0} MiB, {} duplicates, {} misses",
            self.claims,
            self.allocation.as_secs_f64(),
            self.rate(self.allocation),
            100.0 * self.of_limit(self.allocation),
            self.raw,
            self.of_contract(self.allocation, self.contract.0),
            self.contract.0,
            self.allocation_writes.per_claim(self.claims),
            self.deletion.as_secs_f64(),
            100.0 * self.of_limit(self.deletion),
            self.of_contract(self.deletion, self.contract.1),
            self.contract.1,
            self.deletion_writes.per_claim(self.claims),
            self.allocation_cpu,
            self.deletion_cpu,
            self.peak_rss_mib,
            self.verdict.duplicates,
            self.verdict.misses
        )
    }
}

/// A restart with every claim allocated, timed from the process start. Claims are made from that
/// moment on, one every [`PROBE_EVERY`], until one is served.
#[derive(Clone, Copy, Debug)]
pub struct StartUp {
    /// Until the first of them is served: from then on, new claims are served.
    pub serving: Duration,
    /// Until the one made at the start is served (which may come before the process has begun
    /// to watch, and so be served only once it has listed every claim).
    pub made_at_start: Duration,
    /// Resident memory once every claim made then is served.
    pub rss_mib: f64,
}

/// How often a claim is made while a restarted provider starts.
const PROBE_EVERY: Duration = Duration::from_millis(250);
/// How often the claims made then are looked at.
const PROBE_POLL: Duration = Duration::from_millis(20);

fn probe_name(i: u32) -> String {
    format!("restart-probe-{i:04}")
}

/// Which of the first `made` claims made at a restart in `namespace` are served, by number
/// (looked up by name: the watch may hold 100,000 others).
fn served_probes(watch: &Watch, namespace: &str, made: u32) -> Vec<u32> {
    let served = |i: &u32| {
        let key = ObjectRef::new_with(&probe_name(*i), watch.flavour.claims()).within(namespace);
        (watch.claims.get(&key)).is_some_and(|c| watch.flavour.served_by(&c).is_some())
    };
    (0..made).filter(served).collect()
}

/// The rows as a Markdown table.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| provider | run | claims | raw creates/s | contract claims/s (alloc, delete) | claims/s | of raw/3 | of contract | alloc CPU s | delete s | deletes/s | of raw/3 | of contract | delete CPU s | peak RSS MiB | writes per claim (alloc, delete) | start-up s (RSS MiB) | claim made at start served s | duplicates | misses |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let (start_up, made_at_start) = match r.start_up {
            Some(s) => (
                format!("{:.2} ({:.0})", s.serving.as_secs_f64(), s.rss_mib),
                format!("{:.2}", s.made_at_start.as_secs_f64()),
            ),
            None => ("–".into(), "–".into()),
        };
        out.push_str(&format!(
            "| {} | {} | {} | {:.0} | {:.0}, {:.0} | {:.0} | {:.0}% | {} | {:.1} | {:.1} | {:.0} | {:.0}% | {} | {:.1} | {:.0} | {:.2}, {:.2} | {} | {} | {} | {} |\n",
            r.provider,
            r.scenario,
            r.claims,
            r.raw,
            r.contract.0,
            r.contract.1,
            r.rate(r.allocation),
            100.0 * r.of_limit(r.allocation),
            r.of_contract(r.allocation, r.contract.0),
            r.allocation_cpu,
            r.deletion.as_secs_f64(),
            r.rate(r.deletion),
            100.0 * r.of_limit(r.deletion),
            r.of_contract(r.deletion, r.contract.1),
            r.deletion_cpu,
            r.peak_rss_mib,
            r.allocation_writes.total() / r.claims.max(1) as f64,
            r.deletion_writes.total() / r.claims.max(1) as f64,
            start_up,
            made_at_start,
            r.verdict.duplicates,
            r.verdict.misses,
        ));
    }
    out
}

/// Runs scenarios against one cluster, each in a namespace of its own.
pub struct Runner {
    pub load: Load,
    pub kubeconfig: PathBuf,
    pub logs: PathBuf,
    pub limit: Duration,
    /// Claims the load command takes through the contract's writes itself, before a run and
    /// again after its deletion with the provider still running (compared with the mean of
    /// both, as raw creates are: one sample of 1,000 moved by up to half between the two).
    pub contract_sample: usize,
}

/// The state of a run between its phases.
struct Run<'a> {
    namespace: String,
    flavour: Flavour,
    pools: Vec<Pool>,
    provider: &'a Provider,
    running: Running,
    /// The peak of the process a restart stopped: the run's peak is the higher of the two.
    stopped_peak_rss_mib: f64,
    watch: Watch,
}

impl Runner {
    /// Runs `scenario` with `provider` and measures it.
    pub async fn run(&self, provider: &Provider, scenario: &Scenario) -> Result<Row, String> {
        let mut run = self.prepare(provider, scenario).await?;
        let raw_before = self.raw_rate().await?;
        let contract_before = self.contract_rate().await?;
        let writes_before = self.writes().await?;
        let (allocation, allocation_cpu) = self.allocate(&mut run, scenario).await?;
        let allocation_writes = self.writes().await?.since(&writes_before);
        let start_up = match scenario.mode {
            Mode::Hold => Some(self.restart(&mut run).await?),
            _ => None,
        };
        // After the restart: the claims made then are checked too.
        let verdict = workload::verify(&self.load, &run.namespace, run.flavour, &run.pools).await?;
        let writes_before = self.writes().await?;
        let (deletion, deletion_cpu) = self.delete(&mut run).await?;
        let deletion_writes = self.writes().await?.since(&writes_before);
        let contract_after = self.contract_rate().await?;
        let contract = (
            (contract_before.0 + contract_after.0) / 2.0,
            (contract_before.1 + contract_after.1) / 2.0,
        );
        eprintln!(
            "load: contract claims/s before the run {:.0}, {:.0}; after it {:.0}, {:.0}",
            contract_before.0, contract_before.1, contract_after.0, contract_after.1
        );
        let peak_rss_mib = run
            .running
            .usage()?
            .peak_rss_mib
            .max(run.stopped_peak_rss_mib);
        self.finish(run).await?;
        let raw = (raw_before + self.raw_rate().await?) / 2.0;
        Ok(Row {
            provider: provider.label(),
            scenario: scenario.describe(),
            claims: scenario.claims(),
            raw,
            contract,
            allocation,
            allocation_cpu,
            allocation_writes,
            deletion,
            deletion_cpu,
            deletion_writes,
            peak_rss_mib,
            start_up,
            verdict,
        })
    }

    fn start(&self, provider: &Provider, namespace: &str) -> Result<Running, String> {
        let log = self.logs.join(format!("{namespace}.log"));
        let serving = Serving::new(&self.logs.join(format!("{namespace}-certs")))?;
        provider.start(&self.kubeconfig, &log, &serving)
    }

    /// A fresh namespace, the provider started, the pools created and taken up by it.
    async fn prepare<'a>(
        &self,
        provider: &'a Provider,
        scenario: &Scenario,
    ) -> Result<Run<'a>, String> {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let namespace = format!("load-{}-{stamp}", provider.slug());
        self.load.ensure_namespace(&namespace).await?;
        let pools: Vec<Pool> = (0..scenario.pools)
            .map(|i| match scenario.networks {
                Networks::Sized => workload::pool(i, scenario.pools),
                Networks::Narrow => workload::two_family_pool(i, false),
                Networks::Wide => workload::two_family_pool(i, true),
            })
            .collect();
        let running = self.start(provider, &namespace)?;
        let flavour = scenario.flavour;
        self.load.create_pools(&namespace, flavour, &pools).await?;
        let watch = Watch::start(&self.load, &namespace, flavour).await?;
        let mut run = Run {
            namespace,
            flavour,
            pools,
            provider,
            running,
            stopped_peak_rss_mib: 0.0,
            watch,
        };
        self.wait_pools_taken_up(&mut run).await?;
        Ok(run)
    }

    async fn wait_pools_taken_up(&self, run: &mut Run<'_>) -> Result<(), String> {
        let api = self.load.api(&run.namespace, &run.flavour.pools());
        let deadline = Instant::now() + self.limit;
        loop {
            let pools = api
                .list(&Default::default())
                .await
                .map_err(|e| format!("cannot list the pools: {e}"))?;
            let counted = pools
                .items
                .iter()
                .filter(|p| run.flavour.taken_up(p))
                .count();
            if counted == run.pools.len() {
                return Ok(());
            }
            if let Some(exit) = run.running.exited() {
                return Err(exit);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "only {counted} of {} pools were taken up by the provider",
                    run.pools.len()
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The contract's rate, allocation and deletion, each the best of the driver widths
    /// [`CONTRACT_WIDTHS`] (how many requests the load command keeps in flight: the server's
    /// best is what a provider is held to), with the load command watching the sample's claims
    /// and address objects as it watches a run's.
    async fn contract_rate(&self) -> Result<(f64, f64), String> {
        if self.contract_sample == 0 {
            return Ok((0.0, 0.0));
        }
        self.load.ensure_namespace(RAW_NAMESPACE).await?;
        let _watched = Watch::start(&self.load, RAW_NAMESPACE, Flavour::CapiOnInCluster).await?;
        let mut best = (0.0f64, 0.0f64);
        for width in CONTRACT_WIDTHS {
            let load = Load {
                connections: width,
                ..self.load.clone()
            };
            let before = self.writes().await?;
            let (allocations, deletions) = load
                .contract_rate(RAW_NAMESPACE, self.contract_sample)
                .await?;
            let writes = self.writes().await?.since(&before);
            eprintln!(
                "load: contract at {width} in flight: {allocations:.0} claims/s, deleted {deletions:.0}/s; writes per claim {}",
                writes.per_claim(self.contract_sample)
            );
            best = (best.0.max(allocations), best.1.max(deletions));
        }
        Ok(best)
    }

    async fn writes(&self) -> Result<Writes, String> {
        Writes::read(&self.load.client).await
    }

    async fn raw_rate(&self) -> Result<f64, String> {
        self.load.ensure_namespace(RAW_NAMESPACE).await?;
        self.load.raw_rate(RAW_NAMESPACE, RAW_SAMPLE).await
    }

    /// Creates the claims (a backlog with the provider stopped) and waits until all are served;
    /// the time counts from the first create, or for a backlog from the provider's start.
    async fn allocate(
        &self,
        run: &mut Run<'_>,
        scenario: &Scenario,
    ) -> Result<(Duration, f64), String> {
        let (pools, per_pool) = (&run.pools, scenario.per_pool);
        let claim = |p: &Pool, i: usize| (format!("{}-{i:06}", p.name), p.name.clone());
        let claims: Vec<(String, String)> = match scenario.mode {
            // The pools take turns.
            Mode::Chunked(_) => (0..per_pool)
                .flat_map(|i| pools.iter().map(move |p| claim(p, i)))
                .collect(),
            _ => pools
                .iter()
                .flat_map(|p| (0..per_pool).map(move |i| claim(p, i)))
                .collect(),
        };
        let total = claims.len();
        if let Mode::Chunked(chunk) = scenario.mode {
            return self.allocate_in_chunks(run, claims, chunk).await;
        }
        if scenario.mode == Mode::Backlog {
            // The provider stops (as a crash or an upgrade would), the claims pile up, and a fresh
            // process is timed from its start.
            run.running.stop();
            self.load
                .create_claims(&run.namespace, run.flavour, claims)
                .await?;
            run.running = self.start(run.provider, &format!("{}-backlog", run.namespace))?;
            let served = self.all_served(run, total).await?;
            return Ok((
                served - run.running.started,
                run.running.usage()?.cpu_seconds,
            ));
        }
        let started = Instant::now();
        let before = run.running.usage()?;
        self.load
            .create_claims(&run.namespace, run.flavour, claims)
            .await?;
        let served = self.all_served(run, total).await?;
        Ok((served - started, cpu_since(&run.running, before)?))
    }

    /// Makes the claims `chunk` at a time in their order, each chunk served before the next;
    /// the time counts from the first create.
    async fn allocate_in_chunks(
        &self,
        run: &mut Run<'_>,
        claims: Vec<(String, String)>,
        chunk: usize,
    ) -> Result<(Duration, f64), String> {
        let started = Instant::now();
        let before = run.running.usage()?;
        let mut made = 0;
        for part in claims.chunks(chunk.max(1)) {
            self.load
                .create_claims(&run.namespace, run.flavour, part.to_vec())
                .await?;
            made += part.len();
            self.all_served(run, made).await?;
        }
        eprintln!(
            "load: {:.0} MiB resident once the last chunk was served",
            run.running.usage()?.rss_mib
        );
        Ok((started.elapsed(), cpu_since(&run.running, before)?))
    }

    async fn all_served(&self, run: &mut Run<'_>, total: usize) -> Result<Instant, String> {
        run.watch
            .until(
                "every claim served",
                self.limit,
                &mut run.running,
                |w| w.ready_claims() >= total,
                |w| format!("{} of {total} served", w.ready_claims()),
            )
            .await
    }

    /// Restarts the provider with every claim allocated, making a claim at its start and every
    /// [`PROBE_EVERY`] after until one is served ([`StartUp`]); waits until all are served.
    async fn restart(&self, run: &mut Run<'_>) -> Result<StartUp, String> {
        let before = run.watch.claims.state().len();
        run.stopped_peak_rss_mib = run.running.usage()?.peak_rss_mib;
        run.running.stop();
        run.running = self.start(run.provider, &format!("{}-restarted", run.namespace))?;
        let pool = run
            .pools
            .first()
            .map(|p| p.name.clone())
            .unwrap_or_default();
        let started = run.running.started;
        let (mut made, mut serving) = (0u32, None);
        let made_at_start = loop {
            let served = served_probes(&run.watch, &run.namespace, made);
            let now = Instant::now();
            if !served.is_empty() {
                serving.get_or_insert(now - started);
            }
            if served.contains(&0) {
                break now - started;
            }
            if serving.is_none() && now - started >= PROBE_EVERY * made {
                let probe = (probe_name(made), pool.clone());
                self.load
                    .create_claims(&run.namespace, run.flavour, vec![probe])
                    .await?;
                made += 1;
                continue;
            }
            if let Some(exit) = run.running.exited() {
                return Err(format!("after the restart: {exit}"));
            }
            if now - started > self.limit {
                return Err(format!(
                    "no claim made at the restart served within {:?}",
                    self.limit
                ));
            }
            tokio::time::sleep(PROBE_POLL).await;
        };
        self.all_served(run, before + made as usize).await?;
        Ok(StartUp {
            serving: serving.unwrap_or(made_at_start),
            made_at_start,
            rss_mib: run.running.usage()?.rss_mib,
        })
    }

    /// Deletes every claim, in the order they were made (pool by pool), and waits until they
    /// and their address objects are gone.
    async fn delete(&self, run: &mut Run<'_>) -> Result<(Duration, f64), String> {
        let mut names: Vec<String> = run
            .watch
            .claims
            .state()
            .iter()
            .filter_map(|c| c.metadata.name.clone())
            .collect();
        // Names are `<pool>-<number>`: sorted, each pool's claims go together, as they came.
        names.sort_unstable();
        let before = run.running.usage()?;
        let started = Instant::now();
        self.load
            .delete_claims(&run.namespace, run.flavour, names)
            .await?;
        let gone = run
            .watch
            .until(
                "every claim released",
                self.limit,
                &mut run.running,
                |w| w.claims.state().is_empty() && w.addresses.state().is_empty(),
                |w| {
                    format!(
                        "{} claims and {} address objects left",
                        w.claims.state().len(),
                        w.addresses.state().len()
                    )
                },
            )
            .await?;
        Ok((gone - started, cpu_since(&run.running, before)?))
    }

    /// Deletes the pools while the provider runs (it holds their finalizers), then the rest.
    async fn finish(&self, mut run: Run<'_>) -> Result<(), String> {
        let api = self.load.api(&run.namespace, &run.flavour.pools());
        let _ = api
            .delete_collection(&Default::default(), &Default::default())
            .await;
        let deadline = Instant::now() + self.limit;
        while api
            .list(&Default::default())
            .await
            .map(|l| !l.items.is_empty())
            .unwrap_or(true)
        {
            if Instant::now() > deadline {
                return Err("the pools were not released".into());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        run.running.stop();
        self.load.delete_namespace(&run.namespace, self.limit).await
    }
}

fn cpu_since(running: &Running, before: Usage) -> Result<f64, String> {
    Ok(running.usage()?.cpu_seconds - before.cpu_seconds)
}
