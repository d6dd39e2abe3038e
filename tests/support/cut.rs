//! A TCP relay to the API server whose traffic a test can cut off and restore, as a network
//! partition would: while cut, what either side sends waits in the relay (and in the sockets
//! behind it) and is delivered, late, once restored. The process on the far side keeps running.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Cuttable {
    pub addr: SocketAddr,
    cut: Arc<watch::Sender<bool>>,
    task: tokio::task::JoinHandle<()>,
}

/// Copies `from` to `to`, holding each chunk while the relay is cut.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut cut: watch::Receiver<bool>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        if cut.wait_for(|cut| !*cut).await.is_err() {
            return;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}

impl Cuttable {
    /// Relays 127.0.0.1:<a free port> to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the relay");
        let addr = listener.local_addr().expect("the relay's address");
        let (cut, _) = watch::channel(false);
        let cut = Arc::new(cut);
        let relay = cut.clone();
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let (in_read, in_write) = inbound.into_split();
                let (out_read, out_write) = outbound.into_split();
                tokio::spawn(pump(in_read, out_write, relay.subscribe()));
                tokio::spawn(pump(out_read, in_write, relay.subscribe()));
            }
        });
        Self { addr, cut, task }
    }

    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    pub fn restore(&self) {
        self.cut.send_replace(false);
    }

    /// A copy of `kubeconfig` whose server is this relay, written as `name`.
    pub fn kubeconfig(&self, kubeconfig: &Path, name: &str) -> PathBuf {
        let mut config =
            kube::config::Kubeconfig::read_from(kubeconfig).expect("read the kubeconfig");
        for cluster in &mut config.clusters {
            if let Some(cluster) = cluster.cluster.as_mut() {
                cluster.server = Some(format!("https://{}", self.addr));
            }
        }
        let path = super::root()
            .join("target/test-kubeconfigs")
            .join(format!("{name}.yaml"));
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("create the folder");
        let text = serde_json::to_string(&config).expect("a kubeconfig serializes");
        std::fs::write(&path, text).expect("write the kubeconfig");
        path
    }

    /// The API server the kubeconfig at `path` names, as a socket address.
    pub fn upstream_of(path: &Path) -> SocketAddr {
        let config = kube::config::Kubeconfig::read_from(path).expect("read the kubeconfig");
        let server = config
            .clusters
            .iter()
            .find_map(|c| c.cluster.as_ref()?.server.clone())
            .expect("a server");
        let authority = server
            .trim_start_matches("https://")
            .trim_end_matches('/')
            .to_string();
        authority
            .parse()
            .expect("the server is an IP address and port")
    }
}

impl Drop for Cuttable {
    fn drop(&mut self) {
        self.restore();
        self.task.abort();
    }
}
