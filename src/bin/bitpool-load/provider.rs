//! The provider under load, as a child process of its own: bitpool, the upstream in-cluster
//! provider or Metal3's ip-address-manager, started with the flags an operator would give it,
//! its CPU time and memory read from `/proc`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::certs::{Certs, free_port};
use crate::flavour::Flavour;

/// Which manager a provider runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Bitpool,
    InCluster,
    Metal3Ipam,
    /// CAPM3's manager, which the Metal3Data runs need whoever renders.
    Capm3,
}

impl Kind {
    /// Whether the provider serves `flavour`: bitpool serves every one, Metal3's manager both
    /// claim kinds on its own pools.
    pub fn serves(self, flavour: Flavour) -> bool {
        match self {
            Self::Bitpool => true,
            Self::InCluster => flavour == Flavour::CapiOnInCluster,
            Self::Metal3Ipam => flavour != Flavour::CapiOnInCluster,
            Self::Capm3 => false,
        }
    }
}

/// bitpool's own client limits (`bitpool run --kube-api-qps/--kube-api-burst` defaults), given
/// to a peer for a run at the same limits.
const BITPOOL_CLIENT_LIMITS: [&str; 2] = ["--kube-api-qps=500", "--kube-api-burst=1000"];

/// A manager to measure: its kind and binary.
#[derive(Clone, Debug)]
pub struct Provider {
    pub kind: Kind,
    pub binary: PathBuf,
    /// Flags beyond the ones every run gives it (a peer's client limits).
    pub extra: Vec<String>,
}

impl Provider {
    /// `kind` running `binary`, with no extra flags.
    pub fn new(kind: Kind, binary: PathBuf) -> Self {
        Self {
            kind,
            binary,
            extra: Vec::new(),
        }
    }

    /// The provider's name in reports and file names.
    pub fn name(&self) -> &'static str {
        match self.kind {
            Kind::Bitpool => "bitpool",
            Kind::InCluster => "in-cluster",
            Kind::Metal3Ipam => "metal3-ipam",
            Kind::Capm3 => "capm3",
        }
    }

    /// The provider at bitpool's client limits, where it has flags for them (CAPM3's and
    /// Metal3's managers; the in-cluster provider has none).
    pub fn at_bitpool_limits(&self) -> Self {
        let extra = match self.kind {
            Kind::Capm3 | Kind::Metal3Ipam => BITPOOL_CLIENT_LIMITS.map(String::from).to_vec(),
            Kind::Bitpool | Kind::InCluster => self.extra.clone(),
        };
        Self {
            extra,
            ..self.clone()
        }
    }

    /// The name a table shows, with the flags beyond the defaults.
    pub fn label(&self) -> String {
        match self.extra.is_empty() {
            true => self.name().to_string(),
            false => format!("{} {}", self.name(), self.extra.join(" ")),
        }
    }

    /// For namespaces and log files: the name, and whether the flags are the defaults.
    pub fn slug(&self) -> String {
        match self.extra.is_empty() {
            true => self.name().to_string(),
            false => format!("{}-tuned", self.name()),
        }
    }

    /// Starts the provider against the cluster of `kubeconfig`, its output in `log`. Probes,
    /// metrics and webhooks are off (nothing under test needs them, and ports stay free);
    /// Metal3's managers always serve their webhooks, with `serving`'s certificate and port
    /// (the API server calls CAPM3's for conversions, and no manager's for admission).
    pub fn start(
        &self,
        kubeconfig: &Path,
        log: &Path,
        serving: &Serving,
    ) -> Result<Running, String> {
        let file = std::fs::File::create(log)
            .map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let err = file
            .try_clone()
            .map_err(|e| format!("cannot open {}: {e}", log.display()))?;
        let mut command = Command::new(&self.binary);
        match self.kind {
            Kind::Bitpool => command.args([
                "run",
                "--webhook-port=0",
                "--health-addr=0",
                "--diagnostics-address=0",
            ]),
            Kind::InCluster => command.args([
                "--webhook-port=0",
                "--health-probe-bind-address=0",
                "--diagnostics-address=0",
                "--insecure-diagnostics",
            ]),
            Kind::Metal3Ipam | Kind::Capm3 => command.args(serving.args(self.kind)),
        };
        command.args(&self.extra);
        let started = Instant::now();
        let child = command
            .env("KUBECONFIG", kubeconfig)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.binary.display()))?;
        Ok(Running {
            child,
            started,
            log: log.to_path_buf(),
        })
    }
}

/// A started provider process, and where it logs.
pub struct Running {
    child: Child,
    pub started: Instant,
    pub log: PathBuf,
}

/// CPU seconds used so far and memory, of one process.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub cpu_seconds: f64,
    /// The most resident memory the process has had (VmHWM).
    pub peak_rss_mib: f64,
    pub rss_mib: f64,
}

impl Running {
    /// The process's CPU seconds so far and its memory, from `/proc`.
    pub fn usage(&self) -> Result<Usage, String> {
        let pid = self.child.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map_err(|e| format!("cannot read the provider's /proc/{pid}/stat: {e}"))?;
        // Fields after the command name (which may hold spaces) start at field 3.
        let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
        // utime and stime are fields 14 and 15: 12 and 13 after the name.
        let (Some(user), Some(system)) = (ticks(11), ticks(12)) else {
            return Err(format!("unexpected /proc/{pid}/stat: {stat}"));
        };
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .map_err(|e| format!("cannot read the provider's /proc/{pid}/status: {e}"))?;
        let kib = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        Ok(Usage {
            cpu_seconds: (user + system) / clock_ticks(),
            peak_rss_mib: kib("VmHWM:") / 1024.0,
            rss_mib: kib("VmRSS:") / 1024.0,
        })
    }

    /// Whether the process is still running (a provider that exits under load is a result).
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(format!(
                "the provider exited ({status}); its log: {}",
                self.log.display()
            )),
            _ => None,
        }
    }

    /// SIGKILL: the provider stops as a crash would stop it.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A webhook server's certificate and port.
pub struct Serving {
    pub certs: Certs,
    pub port: u16,
}

impl Serving {
    /// A certificate made in `dir` and a free port.
    pub fn new(dir: &Path) -> Result<Self, String> {
        Ok(Self {
            certs: Certs::generate(dir)?,
            port: free_port()?,
        })
    }

    /// The flags of a Metal3 manager (`kind`) serving its webhooks, probes and metrics off;
    /// CAPM3's CRD migrator, which would rewrite every object of its kinds at start, skipped.
    fn args(&self, kind: Kind) -> Vec<String> {
        let mut args = vec![
            format!("--webhook-port={}", self.port),
            format!("--webhook-cert-dir={}", self.certs.dir.display()),
            "--health-addr=0".into(),
            "--diagnostics-address=0".into(),
            "--insecure-diagnostics".into(),
        ];
        if kind == Kind::Capm3 {
            args.extend([
                "--skip-crd-migration-phases=StorageVersionMigration".into(),
                "--skip-crd-migration-phases=CleanupManagedFields".into(),
            ]);
        }
        args
    }

    /// Waits until the server accepts connections (the CRDs' conversions need it).
    pub async fn listening(&self, running: &mut Running, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        while tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .is_err()
        {
            if let Some(exit) = running.exited() {
                return Err(exit);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "nothing listens on port {} after {limit:?} (log: {})",
                    self.port,
                    running.log.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }
}

/// Clock ticks per second of `/proc/<pid>/stat` times (`getconf CLK_TCK`, 100 on Linux).
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}
