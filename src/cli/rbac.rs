//! `bitpool rbac`: the RBAC roles bitpool needs for the given controller groups.

use std::path::PathBuf;

use clap::Args;

use super::{ControllerGroup, Error, groups};

/// The flags of `bitpool rbac`.
#[derive(Debug, Args)]
pub struct RbacArgs {
    /// The controller groups the roles are for (as `run --controllers`).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "capi-ipam,metal3-ipam,migration-proxy,metal3-data"
    )]
    pub controllers: Vec<ControllerGroup>,
    /// Print instead what these groups need beyond `--controllers`' roles: a ClusterRole
    /// `<groups>-role` and its binding, for an installation that enables them later.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub adding: Vec<ControllerGroup>,
    /// Print instead the ClusterRole `bitpool-viewer`: what `kubectl bitpool` reads (get and
    /// list only), to bind to the people and tools that run it.
    #[arg(long, conflicts_with = "adding")]
    pub viewer: bool,
    /// Write the roles to this file instead of printing them.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub(super) fn rbac_command(args: RbacArgs) -> Result<(), Error> {
    let base = groups(&args.controllers);
    let yaml = match args.adding.is_empty() {
        _ if args.viewer => crate::rbac::viewer_yaml(),
        true => crate::rbac::to_yaml(base),
        false => {
            let added = groups(&args.adding);
            let name = format!("{}-role", added.names().join("-"));
            crate::rbac::addon_yaml(base, added, &name)
        }
    }
    .map_err(Error::Render)?;
    match args.out {
        Some(path) => std::fs::write(&path, yaml).map_err(|e| Error::Output {
            path: path.display().to_string(),
            reason: e.to_string(),
        }),
        None => std::io::Write::write_all(&mut std::io::stdout(), yaml.as_bytes())
            .map_err(Error::Stdout),
    }
}
