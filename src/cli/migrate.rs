//! `bitpool migrate`: InClusterIPPools that replace Metal3 IPPools without changing an address.

use std::path::PathBuf;

use clap::Args;

use super::Error;
use crate::api::FIELD_MANAGER;
use crate::api::capi_pools::InClusterIPPool;
use crate::api::metal3_ipam::{IPPool, Metal3IPAddress};
use crate::migrate;

/// The flags of `bitpool migrate`.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// Read IPPools and Metal3 IPAddresses from these YAML files instead of the cluster.
    #[arg(
        long = "from-file",
        env = "BITPOOL_MIGRATE_FROM_FILES",
        value_delimiter = ','
    )]
    pub from_files: Vec<PathBuf>,
    /// Only IPPools of this namespace (default: every namespace).
    #[arg(long, env = "BITPOOL_MIGRATE_NAMESPACE")]
    pub namespace: Option<String>,
    /// Only these IPPools (by name; default: all).
    #[arg(long = "pool", env = "BITPOOL_MIGRATE_POOLS", value_delimiter = ',')]
    pub pools: Vec<String>,
    /// Prove that every allocated address would stay with its claim; exit 1 if any would not.
    #[arg(long, env = "BITPOOL_MIGRATE_CHECK")]
    pub check: bool,
    /// Create the InClusterIPPools in the cluster (server-side apply) instead of printing them.
    #[arg(long, env = "BITPOOL_MIGRATE_APPLY", conflicts_with = "check")]
    pub apply: bool,
}

/// IPPools and Metal3 IPAddresses from YAML files (any other documents are skipped).
fn read_metal3_objects(paths: &[PathBuf]) -> Result<(Vec<IPPool>, Vec<Metal3IPAddress>), Error> {
    let mut pools = Vec::new();
    let mut addresses = Vec::new();
    for path in paths {
        let input = |reason: String| Error::Input {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| input(e.to_string()))?;
        let documents: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(&text).map_err(|e| input(e.to_string()))?;
        for document in documents {
            let api_version = document["apiVersion"].as_str().unwrap_or_default();
            if api_version != "ipam.metal3.io/v1alpha1" {
                continue;
            }
            match document["kind"].as_str() {
                Some("IPPool") => {
                    pools.push(serde_json::from_value(document).map_err(|e| input(e.to_string()))?)
                }
                Some("IPAddress") => addresses
                    .push(serde_json::from_value(document).map_err(|e| input(e.to_string()))?),
                _ => {}
            }
        }
    }
    Ok((pools, addresses))
}

pub(super) async fn migrate_command(args: MigrateArgs) -> Result<(), Error> {
    let client = if args.from_files.is_empty() || args.apply {
        Some(kube::Client::try_default().await.map_err(Error::Connect)?)
    } else {
        None
    };
    let (pools, addresses) = match (&client, args.from_files.is_empty()) {
        (Some(client), true) => list_metal3_objects(client, args.namespace.as_deref()).await?,
        _ => read_metal3_objects(&args.from_files)?,
    };
    let selected = pools.iter().filter(|p| {
        args.namespace
            .as_ref()
            .is_none_or(|ns| p.metadata.namespace.as_ref() == Some(ns))
            && (args.pools.is_empty()
                || args
                    .pools
                    .iter()
                    .any(|n| p.metadata.name.as_ref() == Some(n)))
    });
    let mut migrations = Vec::new();
    for pool in selected {
        migrations.push(migrate::plan(pool, &addresses)?);
    }
    let changed = report_changes(&migrations, args.check);
    if changed > 0 {
        return Err(Error::WouldChange(changed));
    }
    if args.check {
        return Ok(());
    }
    if let (true, Some(client)) = (args.apply, client) {
        return apply_migrations(&client, &migrations).await;
    }
    use std::io::Write;
    let yaml = migrate::to_yaml(&migrations).map_err(Error::Render)?;
    std::io::stdout()
        .write_all(yaml.as_bytes())
        .map_err(Error::Stdout)
}

/// The Metal3 IPPools and IPAddresses of `namespace` (all namespaces for `None`).
async fn list_metal3_objects(
    client: &kube::Client,
    namespace: Option<&str>,
) -> Result<(Vec<IPPool>, Vec<Metal3IPAddress>), Error> {
    let lp = kube::api::ListParams::default();
    let (pools, addresses): (kube::Api<IPPool>, kube::Api<Metal3IPAddress>) = match namespace {
        Some(ns) => (
            kube::Api::namespaced(client.clone(), ns),
            kube::Api::namespaced(client.clone(), ns),
        ),
        None => (
            kube::Api::all(client.clone()),
            kube::Api::all(client.clone()),
        ),
    };
    let pools = pools.list(&lp).await.map_err(|source| Error::List {
        what: "IPPools",
        source,
    })?;
    let addresses = addresses.list(&lp).await.map_err(|source| Error::List {
        what: "Metal3 IPAddresses",
        source,
    })?;
    Ok((pools.items, addresses.items))
}

/// Says (on stderr) which claims' addresses a migration would change, and with `--check` how
/// each pool fares; returns how many would change.
fn report_changes(migrations: &[migrate::Migration], check: bool) -> usize {
    let mut changed = 0;
    for migration in migrations {
        let changes = migrate::check(migration);
        if check {
            let fate = match changes.len() {
                0 => "every address kept".to_string(),
                n => format!("{n} would change"),
            };
            let pinned = migration.pinned.len();
            eprintln!(
                "IPPool {}: {pinned} allocation(s), {fate}",
                migration.source
            );
        }
        for change in &changes {
            eprintln!(
                "  {}: {} today, {} after migration",
                change.claim, change.today, change.after
            );
        }
        changed += changes.len();
    }
    changed
}

/// Applies each migration's InClusterIPPool with server-side apply.
async fn apply_migrations(
    client: &kube::Client,
    migrations: &[migrate::Migration],
) -> Result<(), Error> {
    let params = kube::api::PatchParams::apply(FIELD_MANAGER);
    for migration in migrations {
        let pool = &migration.pool;
        let name = pool.metadata.name.clone().unwrap_or_default();
        let api: kube::Api<InClusterIPPool> = kube::Api::namespaced(
            client.clone(),
            pool.metadata.namespace.as_deref().unwrap_or("default"),
        );
        let mut body = serde_json::to_value(pool).map_err(|e| Error::Input {
            path: name.clone(),
            reason: e.to_string(),
        })?;
        body["apiVersion"] = "ipam.cluster.x-k8s.io/v1alpha2".into();
        body["kind"] = "InClusterIPPool".into();
        api.patch(&name, &params, &kube::api::Patch::Apply(body))
            .await
            .map_err(|source| Error::Apply {
                name: name.clone(),
                source,
            })?;
        eprintln!("applied InClusterIPPool {}", migration.source);
    }
    Ok(())
}
