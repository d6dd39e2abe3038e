//! `bitpool run` processes a test starts, kills and reads the logs of.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bitpool::api::capi::IPAddress;
use futures::StreamExt;
use kube::ResourceExt;

use super::env::{Env, kubeconfig_path, root};
use super::wait::WAIT;

/// A `bitpool run` process serving one test namespace (its claims and namespaced pools, and
/// global pools labelled with the same watch filter), killed when dropped.
pub struct Bitpool {
    child: Option<std::process::Child>,
    pub log: PathBuf,
}

impl Bitpool {
    /// Starts `bitpool run` limited to `namespace` (also its watch filter and ledger namespace).
    pub fn start(namespace: &str, extra_args: &[&str]) -> Self {
        let mut args = vec!["--namespace", namespace];
        args.extend_from_slice(extra_args);
        Self::spawn(namespace, &args)
    }

    /// Starts `bitpool run` limited to `namespace`, with its ledgers in `ledger_namespace`.
    pub fn start_with_ledger_namespace(namespace: &str, ledger_namespace: &str) -> Self {
        Self::spawn_with(namespace, ledger_namespace, &["--namespace", namespace])
    }

    /// Starts `bitpool run` over every namespace, for objects labelled with `filter` (which is
    /// also its ledger namespace).
    pub fn start_all_namespaces(filter: &str) -> Self {
        Self::spawn(filter, &[])
    }

    /// [`Bitpool::start_all_namespaces`] with `extra_args`.
    pub fn start_all_namespaces_with(filter: &str, extra_args: &[&str]) -> Self {
        Self::spawn(filter, extra_args)
    }

    fn spawn(filter: &str, extra_args: &[&str]) -> Self {
        Self::spawn_with(filter, filter, extra_args)
    }

    fn spawn_with(filter: &str, ledger_namespace: &str, extra_args: &[&str]) -> Self {
        let mut args = vec!["--watch-filter", filter];
        args.extend_from_slice(extra_args);
        Self::spawn_in(kubeconfig_path(), filter, ledger_namespace, &args, &[])
    }

    /// Like [`Bitpool::start`], on a machine whose clock is off by `offset` (libfaketime's
    /// `FAKETIME`, e.g. `+120s` or `-400d`); the monotonic clock is left alone.
    pub fn start_with_clock(namespace: &str, offset: &str, extra_args: &[&str]) -> Self {
        let mut args = vec!["--watch-filter", namespace, "--namespace", namespace];
        args.extend_from_slice(extra_args);
        let library = faketime_library();
        let env = [
            ("LD_PRELOAD", library.as_str()),
            ("FAKETIME", offset),
            ("DONT_FAKE_MONOTONIC", "1"),
        ];
        Self::spawn_in(kubeconfig_path(), namespace, namespace, &args, &env)
    }

    /// Like [`Bitpool::start`], against the cluster of `kubeconfig` (a relay to the same API
    /// server, say).
    pub fn start_via(kubeconfig: &Path, namespace: &str, extra_args: &[&str]) -> Self {
        let mut args = vec!["--watch-filter", namespace, "--namespace", namespace];
        args.extend_from_slice(extra_args);
        Self::spawn_in(kubeconfig, namespace, namespace, &args, &[])
    }

    /// Starts `bitpool run` with `args` alone (no namespace or watch filter) against the
    /// cluster of `kubeconfig`, as a deployment runs it; `name` names its log.
    pub fn start_in(kubeconfig: &Path, name: &str, args: &[&str]) -> Self {
        Self::spawn_in(kubeconfig, name, "bitpool-system", args, &[])
    }

    fn spawn_in(
        kubeconfig: &Path,
        name: &str,
        ledger_namespace: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = root().join("target/test-logs");
        std::fs::create_dir_all(&dir).expect("create target/test-logs");
        let log = dir.join(format!("bitpool-{name}-{n}.log"));
        let file = std::fs::File::create(&log).expect("create log file");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_bitpool"))
            .args(["run", "--ledger-namespace", ledger_namespace])
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            // No webhooks unless a test asks for them (`--webhook-port=…` wins over this).
            .env("BITPOOL_WEBHOOK_PORT", "0")
            // Likewise no probe or metrics servers: many processes run side by side.
            .env("BITPOOL_HEALTH_ADDR", "0")
            .env("BITPOOL_DIAGNOSTICS_ADDRESS", "0")
            .env("RUST_LOG", "info,bitpool=debug,kube_runtime=debug")
            .envs(env.iter().copied())
            .stdout(file.try_clone().expect("log file handle"))
            .stderr(file)
            .spawn()
            .expect("start bitpool");
        Self {
            child: Some(child),
            log,
        }
    }

    /// SIGKILL: no shutdown, no cleanup, whatever API call was in flight is cut off.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, as Kubernetes stops a pod.
    pub fn terminate(&self) {
        if let Some(child) = &self.child {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
    }

    /// Waits up to `limit` for the process to exit; whether it did.
    pub fn wait_exit(&mut self, limit: Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        while std::time::Instant::now() < deadline {
            if !self.is_running() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// Whether the process is still running (it has not exited on an error).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for Bitpool {
    fn drop(&mut self) {
        self.kill();
    }
}

/// libfaketime's multithreaded library (Debian's libfaketime package), which hack/test.sh
/// installs; a test that needs it fails without it.
fn faketime_library() -> String {
    let found = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|dir| dir.path().join("faketime/libfaketimeMT.so.1"))
        .find(|path| path.exists());
    match found {
        Some(path) => path.display().to_string(),
        None => panic!("libfaketime is not installed (Debian: apt-get install libfaketime)"),
    }
}

/// A port nobody listens on right now, and one this process has not handed out before: the
/// kernel may give a released port again, and two stacks started at once once got the same one
/// (bitpool could not listen, and another manager's webhook server answered in its place).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if given.insert(port) {
            return port;
        }
    }
}

/// SIGKILLs `victim` as soon as a watch has seen `threshold` IPAddresses of the test namespace,
/// so that the kill lands within milliseconds of that creation; how many it had seen.
pub async fn kill_when_created(env: &Env, victim: &mut Bitpool, threshold: usize) -> usize {
    let mut created = BTreeSet::new();
    let events = kube::runtime::watcher(env.api::<IPAddress>(), Default::default());
    let mut events = std::pin::pin!(kube::runtime::WatchStreamExt::applied_objects(events));
    let watching = async {
        while let Some(Ok(address)) = events.next().await {
            created.insert(address.name_any());
            if created.len() >= threshold {
                break;
            }
        }
    };
    let served = tokio::time::timeout(WAIT, watching).await.is_ok();
    assert!(served, "nothing was served (log: {:?})", victim.log);
    victim.kill();
    created.len()
}
