//! The provider under load, as a child process of its own: bitpool or the upstream in-cluster
//! provider, started with the flags an operator would give it, its CPU time and memory read
//! from `/proc`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Bitpool,
    InCluster,
}

#[derive(Clone, Debug)]
pub struct Provider {
    pub kind: Kind,
    pub binary: PathBuf,
}

impl Provider {
    pub fn name(&self) -> &'static str {
        match self.kind {
            Kind::Bitpool => "bitpool",
            Kind::InCluster => "in-cluster",
        }
    }

    /// Starts the provider against the cluster of `kubeconfig`, its output in `log`. Probes,
    /// metrics and webhooks are off (nothing under test needs them, and ports stay free).
    pub fn start(&self, kubeconfig: &Path, log: &Path) -> Result<Running, String> {
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
        };
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
