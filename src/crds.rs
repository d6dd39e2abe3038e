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

use crate::api::{FIELD_MANAGER, capi, capi_pools, metal3_data, metal3_ipam};
use crate::runtime::Groups;

/// Subdirectory of the CRD directory for the kinds a CAPI installation already has.
pub const STANDALONE_DIR: &str = "standalone";

/// Why CRDs could not be rendered, written or installed.
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
        "CRDs not established after {waited:?}: {missing}; install them with `bitpool crds --apply`, or run without the groups that need them (--controllers)"
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
    merged.spec.conversion = Some(webhook_conversion());
    merged
}

fn webhook_conversion() -> CustomResourceConversion {
    CustomResourceConversion {
        strategy: "Webhook".into(),
        webhook: Some(WebhookConversion {
            client_config: Some(default_conversion()),
            conversion_review_versions: vec!["v1".into()],
        }),
    }
}

/// A conversion by the webhook server at `url` (`https://127.0.0.1:<port>/convert` for a manager
/// run outside the cluster, as the tests and the load command run upstream's), trusted through
/// the CA `ca_pem`.
pub fn conversion_at(url: String, ca_pem: &str) -> CustomResourceConversion {
    CustomResourceConversion {
        strategy: "Webhook".into(),
        webhook: Some(WebhookConversion {
            client_config: Some(WebhookClientConfig {
                url: Some(url),
                ca_bundle: Some(k8s_openapi::ByteString(ca_pem.as_bytes().to_vec())),
                service: None,
            }),
            conversion_review_versions: vec!["v1".into(), "v1beta1".into()],
        }),
    }
}

/// A Metal3Data kind at v1beta2 (storage, as CAPM3 1.13 and later store it) and v1beta1 (served,
/// deprecated, as upstream), converted by bitpool's webhook. The v1beta1 schema is v1beta2's in
/// v1beta1's spelling (see [`crate::webhook::convert::metal3data`]).
fn with_v1beta1(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let kind = crd.spec.names.kind.clone();
    let Some(mut v1beta1) = crd.spec.versions.first().cloned() else {
        unreachable!("{kind}: a derived CRD has its version");
    };
    v1beta1.name = "v1beta1".into();
    v1beta1.storage = false;
    v1beta1.deprecated = Some(true);
    if let Some(schema) = v1beta1
        .schema
        .as_mut()
        .and_then(|s| s.open_api_v3_schema.as_mut())
    {
        let mut value = serde_json::to_value(&*schema)
            .unwrap_or_else(|e| unreachable!("{kind}: a generated schema serialises: {e}"));
        v1beta1_schema(&mut value, &kind);
        *schema = serde_json::from_value(value)
            .unwrap_or_else(|e| unreachable!("{kind}: the v1beta1 schema is a schema: {e}"));
    }
    crd.spec.versions.insert(0, v1beta1);
    crd.spec.conversion = Some(webhook_conversion());
    crd
}

/// Rewrites a v1beta2 Metal3Data kind's schema (JSON) into v1beta1's field names and shapes.
fn v1beta1_schema(schema: &mut serde_json::Value, kind: &str) {
    use serde_json::json;
    let string = json!({"type": "string", "description": "Deprecated upstream; kept so that objects round-trip."});
    if kind != "Metal3DataClaim"
        && let Some(spec) = schema.pointer_mut("/properties/spec/properties")
    {
        spec["templateReference"] = string;
    }
    // v1beta1's references are whole ObjectReferences.
    for reference in [
        "/properties/spec/properties/claim/properties",
        "/properties/spec/properties/template/properties",
        "/properties/status/properties/renderedData/properties",
    ] {
        if kind != "Metal3DataTemplate"
            && let Some(serde_json::Value::Object(fields)) = schema.pointer_mut(reference)
        {
            for field in ["apiVersion", "fieldPath", "kind", "resourceVersion", "uid"] {
                fields.insert(field.into(), json!({"type": "string"}));
            }
        }
    }
    if kind != "Metal3DataTemplate" {
        return;
    }
    if let Some(serde_json::Value::Object(meta_data)) =
        schema.pointer_mut("/properties/spec/properties/metaData/properties")
    {
        for (v1beta1, v1beta2) in crate::webhook::convert::metal3data::RENAMED {
            if let Some(list) = meta_data.remove(v1beta2) {
                meta_data.insert(v1beta1.to_string(), list);
            }
        }
    }
    let bond = "/properties/spec/properties/networkData/properties/links/properties/bonds/items/properties";
    if let Some(bond) = schema.pointer_mut(bond) {
        bond["parameters"] = json!({
            "type": "object",
            "additionalProperties": {"x-kubernetes-preserve-unknown-fields": true},
        });
    }
    if let Some(status) = schema.pointer_mut("/properties/status/properties") {
        status["indexes"] = json!({"type": "object", "additionalProperties": {"type": "integer", "format": "int64"}});
    }
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
        capi_pools::InClusterPrefixPool::crd(),
        capi_pools::GlobalInClusterPrefixPool::crd(),
        metal3_ipam::IPPool::crd(),
        metal3_ipam::IPClaim::crd(),
        metal3_ipam::Metal3IPAddress::crd(),
        with_v1beta1(metal3_data::Metal3DataTemplate::crd()),
        with_v1beta1(metal3_data::Metal3Data::crd()),
        with_v1beta1(metal3_data::Metal3DataClaim::crd()),
    ])
}

/// A CRD a process must find established before it starts, and the `--controllers` groups
/// that need it (named in the message when it is missing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Required {
    pub name: String,
    pub needed_by: Vec<&'static str>,
}

impl Required {
    /// A CRD needed whatever runs (as in tests of the wait itself).
    pub fn of(crd: &CustomResourceDefinition) -> Self {
        Self {
            name: crd.metadata.name.clone().unwrap_or_default(),
            needed_by: Vec::new(),
        }
    }
}

const METAL3_IPAM_CRDS: [&str; 3] = [
    "ippools.ipam.metal3.io",
    "ipclaims.ipam.metal3.io",
    "ipaddresses.ipam.metal3.io",
];
const METAL3_DATA_CRDS: [&str; 3] = [
    "metal3datatemplates.infrastructure.cluster.x-k8s.io",
    "metal3datas.infrastructure.cluster.x-k8s.io",
    "metal3dataclaims.infrastructure.cluster.x-k8s.io",
];

/// The CRDs a process running `groups` needs installed: the CAPI pools and the contract's
/// claim and address for every group (each reads or names them), the Metal3 IPAM kinds for the
/// groups that read IPPools, the Metal3Data kinds for their reconciler.
pub fn required(groups: Groups) -> Vec<Required> {
    let needed_by = |name: &str| {
        let only = |metal3_data| Groups {
            capi_ipam: false,
            metal3_ipam: false,
            migration_proxy: false,
            metal3_data,
        };
        if METAL3_IPAM_CRDS.contains(&name) {
            Groups {
                capi_ipam: false,
                ..groups
            }
        } else if METAL3_DATA_CRDS.contains(&name) {
            only(groups.metal3_data)
        } else {
            groups
        }
    };
    served()
        .iter()
        .chain(standalone().iter())
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let needed_by = needed_by(&name).names();
            Required { name, needed_by }
        })
        .filter(|r| !r.needed_by.is_empty())
        .collect()
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

/// One CRD as a YAML document (with its leading `---`).
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

/// Why the served Cluster API or CAPM3 versions could not be told.
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
    let versions = [
        capi::ContractVersion::V1Beta2,
        capi::ContractVersion::V1Beta1,
    ];
    let names = versions.map(|v| v.as_str());
    match first_served_version(client, capi::GROUP, "ipaddressclaims", &names).await? {
        Some(served) => Ok(versions[served]),
        None => Err(ContractError::NotServed),
    }
}

/// The Metal3Machine version the Metal3Data reconciler reads: v1beta2 (what CAPM3 1.13 and
/// later store) where served, else v1beta1 (older CAPM3); v1beta2 while no CAPM3 is installed.
pub async fn served_metal3_machine_version(client: &Client) -> Result<&'static str, ContractError> {
    let versions = ["v1beta2", "v1beta1"];
    let group = crate::api::metal3_data::GROUP;
    let served = first_served_version(client, group, "metal3machines", &versions).await?;
    Ok(versions[served.unwrap_or(0)])
}

/// The index of the first of `versions` at which `group` serves `resource`, by discovery.
async fn first_served_version(
    client: &Client,
    group: &str,
    resource: &str,
    versions: &[&str],
) -> Result<Option<usize>, ContractError> {
    for (index, version) in versions.iter().enumerate() {
        let group_version = format!("{group}/{version}");
        match client.list_api_group_resources(&group_version).await {
            Ok(list) if list.resources.iter().any(|r| r.name == resource) => {
                return Ok(Some(index));
            }
            Ok(_) => {}
            // A group version the server does not serve answers a bare "404 page not found",
            // not a Status: kube-core's is_not_found (which reads the Status' reason) misses it.
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(source) => {
                return Err(ContractError::Discovery {
                    group: group_version,
                    source,
                });
            }
        }
    }
    Ok(None)
}

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
    let required: Vec<Required> = crds.iter().map(Required::of).collect();
    wait_established(client, &required, wait).await
}

/// Waits until every CRD exists with `Established=True`, or fails naming only those that are not.
pub async fn wait_established(
    client: &Client,
    crds: &[Required],
    wait: Duration,
) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + wait;
    let mut reported = false;
    loop {
        let mut missing = Vec::new();
        for crd in crds {
            let name = &crd.name;
            let for_groups = match crd.needed_by.as_slice() {
                [] => String::new(),
                groups => format!(", for {}", groups.join(", ")),
            };
            match api.get_opt(name).await {
                Ok(Some(found))
                    if conditions::is_crd_established().matches_object(Some(&found)) => {}
                Ok(Some(_)) => missing.push(format!("{name} (not established yet{for_groups})")),
                Ok(None) if for_groups.is_empty() => missing.push(name.clone()),
                Ok(None) => missing.push(format!("{name} (missing{for_groups})")),
                Err(source) => {
                    return Err(Error::Read {
                        name: name.clone(),
                        source,
                    });
                }
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

    #[test]
    fn each_required_crd_names_the_groups_that_need_it() {
        let proxy_and_data = Groups {
            capi_ipam: false,
            metal3_ipam: false,
            migration_proxy: true,
            metal3_data: true,
        };
        let required = required(proxy_and_data);
        let needed_by = |name: &str| {
            required
                .iter()
                .find(|r| r.name == name)
                .map(|r| r.needed_by.clone())
        };
        assert_eq!(
            needed_by("ippools.ipam.metal3.io"),
            Some(vec!["migration-proxy", "metal3-data"])
        );
        assert_eq!(
            needed_by("metal3datas.infrastructure.cluster.x-k8s.io"),
            Some(vec!["metal3-data"])
        );
        assert_eq!(
            needed_by("ipaddressclaims.ipam.cluster.x-k8s.io"),
            Some(vec!["migration-proxy", "metal3-data"])
        );
        let capi_only = Groups {
            capi_ipam: true,
            ..Groups::default()
        };
        assert_eq!(
            needed_by("inclusterippools.ipam.cluster.x-k8s.io").map(|g| g.len()),
            Some(2)
        );
        assert!(
            super::required(capi_only)
                .iter()
                .all(|r| r.needed_by == ["capi-ipam"] && !r.name.contains("metal3"))
        );
    }

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
