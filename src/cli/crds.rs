//! `bitpool crds`: the CRDs of the kinds bitpool serves, printed, written or applied.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::Error;
use crate::crds;

/// The flags of `bitpool crds`.
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
    /// Send ConversionReviews to this URL (a bitpool outside the cluster) instead of the
    /// `bitpool-webhook-service` Service in `bitpool-system`.
    #[arg(long, env = "BITPOOL_CRDS_CONVERSION_URL", conflicts_with = "out")]
    pub conversion_url: Option<String>,
    /// PEM file of the CA that signed the webhook's certificate (the CRDs' `caBundle`; inside a
    /// cluster cert-manager injects it).
    #[arg(long, env = "BITPOOL_CRDS_CONVERSION_CA_FILE", conflicts_with = "out")]
    pub conversion_ca_file: Option<PathBuf>,
}

pub(super) async fn crds_command(args: CrdsArgs) -> Result<(), Error> {
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
    if args.conversion_url.is_some() || args.conversion_ca_file.is_some() {
        let mut client_config = crds::default_conversion();
        if let Some(url) = &args.conversion_url {
            client_config.service = None;
            client_config.url = Some(url.clone());
        }
        if let Some(path) = &args.conversion_ca_file {
            let pem = std::fs::read(path).map_err(|e| Error::Input {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
            client_config.ca_bundle = Some(k8s_openapi::ByteString(pem));
        }
        crds::set_conversion(&mut selected, &client_config);
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
