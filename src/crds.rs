//! The CustomResourceDefinitions bitpool generates from its API types.
//!
//! `crds/` in the repository holds exactly what [`write_dir`] writes; a test fails on drift.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition, ServiceReference, WebhookClientConfig,
    WebhookConversion,
};
use kube::api::{Api, Patch, PatchParams};
use kube::core::crd::merge_crds;
use kube::runtime::wait::{Condition, conditions};
use kube::{Client, CustomResourceExt};

use crate::api::{capi, capi_pools, metal3_data, metal3_ipam};

/// Subdirectory of the CRD directory for the kinds a CAPI installation already has.
pub const STANDALONE_DIR: &str = "standalone";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot render CRD {name} as YAML: {source}")]
    Yaml {
        name: String,
        source: serde_saphyr::SerializeError,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot apply CRD {name}: {source}")]
    Apply { name: String, source: kube::Error },
    #[error("cannot read CRD {name}: {source}")]
    Read { name: String, source: kube::Error },
    #[error(
        "CRDs not established after {waited:?}: {missing}; install them with `bitpool crds --apply`"
    )]
    NotEstablished { waited: Duration, missing: String },
}

/// Where the API server sends ConversionReviews: the webhook Service of the deployment in
/// `config/` unless told otherwise.
pub fn default_conversion() -> WebhookClientConfig {
    WebhookClientConfig {
        service: Some(ServiceReference {
            namespace: "bitpool-system".into(),
            name: "bitpool-webhook-service".into(),
            path: Some(crate::webhook::CONVERT_PATH.into()),
            port: Some(443),
        }),
        ..Default::default()
    }
}

/// The pool kinds at v1alpha1 and v1alpha2 (storage), converted by bitpool's webhook.
fn with_v1alpha1(
    current: CustomResourceDefinition,
    v1alpha1: CustomResourceDefinition,
) -> CustomResourceDefinition {
    let name = current.metadata.name.clone().unwrap_or_default();
    let mut merged = merge_crds(vec![v1alpha1, current], "v1alpha2")
        .unwrap_or_else(|e| unreachable!("{name}: both versions derive from one kind: {e}"));
    merged.spec.conversion = Some(CustomResourceConversion {
        strategy: "Webhook".into(),
        webhook: Some(WebhookConversion {
            client_config: Some(default_conversion()),
            conversion_review_versions: vec!["v1".into()],
        }),
    });
    merged
}

/// Points the conversion webhooks of `crds` (those that have one) at `client_config`.
pub fn set_conversion(crds: &mut [CustomResourceDefinition], client_config: &WebhookClientConfig) {
    for crd in crds {
        if let Some(webhook) = crd
            .spec
            .conversion
            .as_mut()
            .and_then(|c| c.webhook.as_mut())
        {
            webhook.client_config = Some(client_config.clone());
        }
    }
}

/// The kinds bitpool serves: it owns their CRDs in every installation.
pub fn served() -> Vec<CustomResourceDefinition> {
    finish(vec![
        with_v1alpha1(
            capi_pools::InClusterIPPool::crd(),
            capi_pools::v1alpha1::InClusterIPPool::crd(),
        ),
        with_v1alpha1(
            capi_pools::GlobalInClusterIPPool::crd(),
            capi_pools::v1alpha1::GlobalInClusterIPPool::crd(),
        ),
        metal3_ipam::IPPool::crd(),
        metal3_ipam::IPClaim::crd(),
        metal3_ipam::Metal3IPAddress::crd(),
        metal3_data::Metal3DataTemplate::crd(),
        metal3_data::Metal3Data::crd(),
        metal3_data::Metal3DataClaim::crd(),
    ])
}

/// The CRDs a process running `groups` needs installed: the CAPI pools and the contract's
/// claim and address always, the Metal3 IPAM kinds and the Metal3Data kinds with their groups.
pub fn required(groups: crate::controllers::Groups) -> Vec<CustomResourceDefinition> {
    let metal3_ipam = [
        "ippools.ipam.metal3.io",
        "ipclaims.ipam.metal3.io",
        "ipaddresses.ipam.metal3.io",
    ];
    let metal3_data = [
        "metal3datatemplates.infrastructure.cluster.x-k8s.io",
        "metal3datas.infrastructure.cluster.x-k8s.io",
        "metal3dataclaims.infrastructure.cluster.x-k8s.io",
    ];
    let mut required: Vec<CustomResourceDefinition> = served()
        .into_iter()
        .filter(|crd| {
            let name = crd.metadata.name.as_deref().unwrap_or_default();
            (groups.metal3_kinds() || !metal3_ipam.contains(&name))
                && (groups.metal3_data || !metal3_data.contains(&name))
        })
        .collect();
    required.extend(standalone());
    required
}

/// IPAddressClaim and IPAddress, for running bitpool without CAPI core (which owns them otherwise).
pub fn standalone() -> Vec<CustomResourceDefinition> {
    finish(vec![
        with_older_capi_versions(
            capi::schema::IPAddressClaim::crd(),
            capi::schema::older::IPAddressClaim::crd(),
        ),
        with_older_capi_versions(
            capi::schema::IPAddress::crd(),
            capi::schema::older::IPAddress::crd(),
        ),
    ])
}

/// The versions Cluster API stored IPAddressClaim and IPAddress at before v1beta2, with their
/// schema (`older`) and the current printer columns: the API server refuses a CRD that drops a
/// version installations stored. The versions convert by apiVersion alone (no webhook).
fn with_older_capi_versions(
    mut crd: CustomResourceDefinition,
    older: CustomResourceDefinition,
) -> CustomResourceDefinition {
    let (Some(current), Some(older)) = (
        crd.spec.versions.first().cloned(),
        older.spec.versions.first().cloned(),
    ) else {
        return crd;
    };
    for (name, deprecated) in [("v1beta1", true), ("v1alpha1", false)] {
        let mut version = current.clone();
        version.name = name.into();
        version.storage = false;
        version.deprecated = deprecated.then_some(true);
        version.schema = older.schema.clone();
        crd.spec.versions.push(version);
    }
    crd
}

/// What the derive leaves out but upstream CRDs spell out: `listKind`.
fn finish(mut crds: Vec<CustomResourceDefinition>) -> Vec<CustomResourceDefinition> {
    for crd in &mut crds {
        let names = &mut crd.spec.names;
        names
            .list_kind
            .get_or_insert_with(|| format!("{}List", names.kind));
    }
    crds
}

/// `<group>_<plural>.yaml`, the file name kubebuilder gives a CRD.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural)
}

pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, Error> {
    let body = serde_saphyr::to_string(crd).map_err(|source| Error::Yaml {
        name: crd.metadata.name.clone().unwrap_or_default(),
        source,
    })?;
    Ok(format!("---\n{body}"))
}

/// All CRDs as one multi-document YAML stream.
pub fn to_yaml_stream(crds: &[CustomResourceDefinition]) -> Result<String, Error> {
    crds.iter().map(to_yaml).collect()
}

/// The files [`write_dir`] writes, as (relative path, contents), in a fixed order.
pub fn rendered_files() -> Result<Vec<(String, String)>, Error> {
    let mut files = Vec::new();
    for (dir, crds) in [("", served()), (STANDALONE_DIR, standalone())] {
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        let mut names = Vec::new();
        for crd in &crds {
            names.push(file_name(crd));
            files.push((format!("{prefix}{}", file_name(crd)), to_yaml(crd)?));
        }
        let resources: String = names.iter().map(|n| format!("- {n}\n")).collect();
        files.push((
            format!("{prefix}kustomization.yaml"),
            format!(
                "# Generated by `bitpool crds --out crds`; do not edit.\n\
                 apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n{resources}"
            ),
        ));
    }
    Ok(files)
}

/// Writes every CRD file under `dir` (the served kinds at the top, the standalone CAPI kinds in
/// [`STANDALONE_DIR`]), each directory with a kustomization listing its files.
pub fn write_dir(dir: &Path) -> Result<Vec<String>, Error> {
    let files = rendered_files()?;
    let mut written = Vec::new();
    for (relative, contents) in files {
        let path = dir.join(&relative);
        let io_error = |source| Error::Write {
            path: path.display().to_string(),
            source,
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io_error)?;
        }
        std::fs::write(&path, contents).map_err(io_error)?;
        written.push(relative);
    }
    Ok(written)
}

#[derive(Debug, thiserror::Error)]
pub enum ContractError {
    #[error(
        "IPAddressClaim is served at neither v1beta2 nor v1beta1 by this API server; install Cluster API 1.9 or later, or `bitpool crds --apply --standalone`"
    )]
    NotServed,
    #[error("cannot read which versions of {group} the API server serves: {source}")]
    Discovery { group: String, source: kube::Error },
}

/// The Cluster API version the installed CRDs serve IPAddressClaim at, newest first.
pub async fn served_contract_version(
    client: &Client,
) -> Result<capi::ContractVersion, ContractError> {
    for version in [
        capi::ContractVersion::V1Beta2,
        capi::ContractVersion::V1Beta1,
    ] {
        let group_version = format!("{}/{}", capi::GROUP, version.as_str());
        match client.list_api_group_resources(&group_version).await {
            Ok(list) if list.resources.iter().any(|r| r.name == "ipaddressclaims") => {
                return Ok(version);
            }
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(source) => {
                return Err(ContractError::Discovery {
                    group: group_version,
                    source,
                });
            }
        }
    }
    Err(ContractError::NotServed)
}

/// The field manager bitpool's server-side applies use.
pub const FIELD_MANAGER: &str = "bitpool";

/// Installs (or updates) CRDs by server-side apply, then waits until they are established.
pub async fn apply(
    client: &Client,
    crds: &[CustomResourceDefinition],
    wait: Duration,
) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(crd))
            .await
            .map_err(|source| Error::Apply { name, source })?;
    }
    wait_established(client, crds, wait).await
}

/// Waits until every CRD exists with `Established=True`, or fails naming only those that are not.
pub async fn wait_established(
    client: &Client,
    crds: &[CustomResourceDefinition],
    wait: Duration,
) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + wait;
    let mut reported = false;
    loop {
        let mut missing = Vec::new();
        for crd in crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            match api.get_opt(&name).await {
                Ok(Some(found))
                    if conditions::is_crd_established().matches_object(Some(&found)) => {}
                Ok(Some(_)) => missing.push(format!("{name} (not established yet)")),
                Ok(None) => missing.push(name),
                Err(source) => return Err(Error::Read { name, source }),
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::NotEstablished {
                waited: wait,
                missing: missing.join(", "),
            });
        }
        if !reported {
            tracing::info!(missing = %missing.join(", "), "waiting for CRDs to be installed and established");
            reported = true;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `crds/` must be exactly what the types generate. Regenerate with `cargo run -- crds --out crds`.
    #[test]
    fn committed_crds_match_the_types() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
        let mut drift = Vec::new();
        for (relative, expected) in rendered_files().expect("CRDs render") {
            match std::fs::read_to_string(root.join(&relative)) {
                Ok(actual) if actual == expected => {}
                Ok(_) => drift.push(format!("{relative} differs")),
                Err(e) => drift.push(format!("{relative}: {e}")),
            }
        }
        assert!(
            drift.is_empty(),
            "crds/ is out of date ({}); run `cargo run -- crds --out crds`",
            drift.join(", ")
        );
    }

    #[test]
    fn every_served_kind_has_a_status_subresource_but_addresses() {
        for crd in served() {
            for version in &crd.spec.versions {
                let has_status = version
                    .subresources
                    .as_ref()
                    .and_then(|s| s.status.as_ref())
                    .is_some();
                assert_eq!(
                    has_status,
                    crd.spec.names.kind != "IPAddress",
                    "{}",
                    crd.spec.names.kind
                );
            }
        }
    }

    /// Kubernetes 1.20 rejects an enum that lists `null` (see the test control-plane facts).
    #[test]
    fn no_schema_lists_null_in_an_enum() {
        for crd in served().into_iter().chain(standalone()) {
            let yaml = to_yaml(&crd).expect("renders");
            assert!(
                !yaml.contains("- null"),
                "{} has a null enum entry",
                crd.spec.names.kind
            );
        }
    }
}
