//! A Metal3Data's rendered secrets: their names pinned in its status, and each written once.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Secret, SecretReference};
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta, PostParams};
use serde_json::json;

use crate::api::labels;
use crate::api::metal3_data::{Metal3Data, Metal3DataTemplate, SECRET_TYPE};
use crate::runtime::error::{Error, Verb, object_of};
use crate::runtime::objects::{self};

/// The secrets a Metal3Data renders into.
pub(super) struct Pinned {
    pub(super) meta_data: Option<SecretReference>,
    pub(super) network_data: Option<SecretReference>,
}

/// Names the secrets in the Metal3Data's spec. Secrets keep their names once set, and are never
/// rendered twice: a host re-provisions into exactly the state it had.
pub(super) async fn pin_secret_names(
    data: &Metal3Data,
    api: &Api<Metal3Data>,
    template: &Metal3DataTemplate,
    machine: &str,
) -> Result<Pinned, Error> {
    let namespace = data.namespace().unwrap_or_default();
    let spec = &template.spec;
    let pin = |current: Option<&SecretReference>, suffix: &str| {
        secret_ref(current, machine, suffix, &namespace)
    };
    let pinned = Pinned {
        meta_data: (spec.meta_data.as_ref()).map(|_| pin(data.spec.meta_data.as_ref(), "metadata")),
        network_data: (spec.network_data.as_ref())
            .map(|_| pin(data.spec.network_data.as_ref(), "networkdata")),
    };
    if pinned.meta_data.as_ref() != data.spec.meta_data.as_ref()
        || pinned.network_data.as_ref() != data.spec.network_data.as_ref()
    {
        let patch =
            json!({ "spec": { "metaData": pinned.meta_data, "networkData": pinned.network_data } });
        objects::merge_patch(api, &data.name_any(), patch).await?;
    }
    Ok(pinned)
}

/// Whether a wanted secret is still to be written (`None`: the template renders no such data).
pub(super) async fn secret_missing(
    secrets: &Api<Secret>,
    reference: Option<&SecretReference>,
) -> Result<bool, Error> {
    match reference.and_then(|r| r.name.as_deref()) {
        Some(name) => Ok(objects::get_optional(secrets, name).await?.is_none()),
        None => Ok(false),
    }
}

pub(super) fn secret_ref(
    existing: Option<&SecretReference>,
    machine: &str,
    suffix: &str,
    namespace: &str,
) -> SecretReference {
    match existing.filter(|r| r.name.as_deref().is_some_and(|n| !n.is_empty())) {
        Some(r) => r.clone(),
        None => SecretReference {
            name: Some(format!("{machine}-{suffix}")),
            namespace: Some(namespace.to_string()),
        },
    }
}

pub(super) async fn create_secret(
    secrets: &Api<Secret>,
    data: &Metal3Data,
    reference: &SecretReference,
    cluster: &str,
    key: &str,
    text: String,
) -> Result<(), Error> {
    let secret = Secret {
        metadata: ObjectMeta {
            name: reference.name.clone(),
            namespace: data.namespace(),
            labels: Some(BTreeMap::from([(
                labels::CLUSTER_NAME.to_string(),
                cluster.to_string(),
            )])),
            owner_references: objects::owner_reference(data, true).map(|o| vec![o]),
            ..Default::default()
        },
        type_: Some(SECRET_TYPE.to_string()),
        data: Some(BTreeMap::from([(
            key.to_string(),
            ByteString(text.into_bytes()),
        )])),
        ..Default::default()
    };
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(()),
        // Written by an earlier pass or another process: never re-rendered.
        Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(()),
        Err(e) => Err(Error::api(
            Verb::Create,
            object_of(secrets, &reference.name.clone().unwrap_or_default()),
            e,
        )),
    }
}
