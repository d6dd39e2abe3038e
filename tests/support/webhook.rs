//! bitpool's webhooks as the test control plane calls them: a CA and a serving certificate for
//! 127.0.0.1, a bitpool serving HTTPS on a free port, the shipped webhook configurations
//! (`config/webhook/*/manifests.yaml`) pointed at it and limited to one test's objects, and the
//! pool CRDs converting through it.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::WebhookClientConfig;
use kube::Client;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};

use super::process::free_port;
use super::{Bitpool, Env, root, run_to_completion};

/// The tests of one binary change cluster-wide objects (CRD conversion, webhook
/// configurations): they take turns.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A CA, and a certificate it signed for 127.0.0.1, written as `tls.crt`/`tls.key`.
pub struct Certs {
    pub dir: PathBuf,
    pub ca_pem: String,
}

impl Certs {
    pub fn generate(name: &str) -> Self {
        let dir = root().join("target/test-certs").join(name);
        std::fs::create_dir_all(&dir).expect("create cert dir");
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "bitpool test CA");
        let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        Self::issue(&dir, &issuer);
        Self {
            dir,
            ca_pem: ca.pem(),
        }
    }

    /// Writes a serving certificate for 127.0.0.1 signed by `issuer`, and its key.
    fn issue(dir: &std::path::Path, issuer: &rcgen::Issuer<'_, rcgen::KeyPair>) {
        let key = rcgen::KeyPair::generate().expect("serving key");
        let params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .expect("serving params");
        let cert = params.signed_by(&key, issuer).expect("serving certificate");
        std::fs::write(dir.join("tls.crt"), cert.pem()).expect("write tls.crt");
        std::fs::write(dir.join("tls.key"), key.serialize_pem()).expect("write tls.key");
    }

    /// Replaces the files with a pair from a new CA (as a rotation to a new issuer would);
    /// returns the new CA.
    pub fn rotate(&self) -> String {
        let fresh = Self::generate(&format!(
            "{}-rotated",
            self.dir.file_name().and_then(|n| n.to_str()).unwrap_or("x")
        ));
        for file in ["tls.crt", "tls.key"] {
            std::fs::copy(fresh.dir.join(file), self.dir.join(file)).expect("rotate");
        }
        fresh.ca_pem
    }
}

/// bitpool serving the test's namespace and its webhooks on 127.0.0.1.
pub struct Served {
    pub bitpool: Bitpool,
    pub port: u16,
    pub certs: Certs,
}

impl Served {
    pub fn start(env: &Env, extra_args: &[&str]) -> Self {
        let certs = Certs::generate(env.name());
        let port = free_port();
        let port_arg = format!("--webhook-port={port}");
        let dir_arg = format!("--webhook-cert-dir={}", certs.dir.display());
        let mut args = vec![
            port_arg.as_str(),
            "--webhook-host=127.0.0.1",
            dir_arg.as_str(),
        ];
        args.extend_from_slice(extra_args);
        let bitpool = Bitpool::start(env.name(), &args);
        Self {
            bitpool,
            port,
            certs,
        }
    }

    pub fn client_config(&self, path: &str) -> WebhookClientConfig {
        WebhookClientConfig {
            url: Some(format!("https://127.0.0.1:{}{path}", self.port)),
            ca_bundle: Some(ByteString(self.certs.ca_pem.clone().into_bytes())),
            service: None,
        }
    }

    /// Waits until the server answers TLS (it starts before the controllers).
    pub async fn wait_listening(&self) {
        super::wait::wait_listening(self.port, "the webhook server listens").await;
    }
}

/// The shipped webhook configurations, pointed at `served`, for this test's objects only;
/// removed when dropped.
pub struct Registered {
    /// The configurations made: kind and name.
    made: Vec<(String, String)>,
}

/// Every webhook configuration bitpool ships, whichever components file carries it.
pub const MANIFESTS: [&str; 4] = [
    "config/webhook/capi/manifests.yaml",
    "config/webhook/endpoint/manifests.yaml",
    "config/webhook/metal3/manifests.yaml",
    "config/webhook/metal3data/manifests.yaml",
];

/// The webhook configurations of a manifests file (`path`, from the repository's root or
/// absolute), as documents.
pub fn read_manifests(path: &std::path::Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(root().join(path))
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_saphyr::from_multiple::<serde_json::Value>(&text)
        .unwrap_or_else(|e| panic!("{} parses: {e}", path.display()))
}

/// Registers webhook configurations `documents`, named `<prefix>-<i>`, each webhook calling
/// what `client_config` makes of its service path, limited by `object_selector` if given;
/// returns the kinds and names made.
pub async fn register(
    client: &Client,
    documents: Vec<serde_json::Value>,
    prefix: &str,
    client_config: impl Fn(&str) -> WebhookClientConfig,
    object_selector: Option<serde_json::Value>,
) -> Vec<(String, String)> {
    let params = PatchParams::apply("bitpool-test").force();
    let mut made = Vec::new();
    for (i, mut document) in documents.into_iter().enumerate() {
        let kind = document["kind"].as_str().unwrap_or_default().to_string();
        let name = format!("{prefix}-{i}");
        document["metadata"]["name"] = name.clone().into();
        for hook in document["webhooks"].as_array_mut().into_iter().flatten() {
            let path = hook["clientConfig"]["service"]["path"].clone();
            let config = client_config(path.as_str().unwrap_or_default());
            hook["clientConfig"] = serde_json::to_value(config).expect("client config");
            if let Some(selector) = &object_selector {
                hook["objectSelector"] = selector.clone();
            }
        }
        let gvk = kube::api::GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", &kind);
        let resource = ApiResource::from_gvk(&gvk);
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        api.patch(&name, &params, &Patch::Apply(&document))
            .await
            .unwrap_or_else(|e| panic!("register {kind}: {e}"));
        made.push((kind, name));
    }
    made
}

impl Registered {
    pub async fn new(env: &Env, served: &Served) -> Self {
        static REGISTERED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = REGISTERED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let documents = MANIFESTS
            .iter()
            .flat_map(|file| read_manifests(std::path::Path::new(file)))
            .collect();
        let selector = serde_json::json!({"matchLabels": {
            bitpool::api::labels::WATCH_FILTER: env.name()
        }});
        let prefix = format!("bitpool-test-{}-{n}", env.name());
        let made = register(
            &env.client,
            documents,
            &prefix,
            |path| served.client_config(path),
            Some(selector),
        )
        .await;
        Self { made }
    }
}

impl Registered {
    /// Waits until the API server calls the webhooks (its view of new configurations lags a
    /// moment): a dry-run create of an invalid pool is denied.
    pub async fn wait_active(&self, env: &Env) {
        let api: Api<bitpool::api::capi_pools::InClusterIPPool> = env.api();
        let probe = bitpool::api::capi_pools::InClusterIPPool {
            metadata: env.meta("webhook-probe"),
            spec: super::build::capi_spec(&["not-an-ip"], 24),
            status: None,
        };
        let params = kube::api::PostParams {
            dry_run: true,
            ..Default::default()
        };
        super::eventually("the webhooks are called", Duration::from_secs(60), || {
            let (api, probe, params) = (api.clone(), probe.clone(), params.clone());
            async move {
                match api.create(&params, &probe).await {
                    Err(kube::Error::Api(e)) if e.message.contains("denied the request") => {
                        Some(())
                    }
                    _ => None,
                }
            }
        })
        .await;
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let made = std::mem::take(&mut self.made);
        run_to_completion(async move {
            let client = super::client().await;
            let dp = DeleteParams::default();
            for (kind, name) in made {
                let _ = if kind == "MutatingWebhookConfiguration" {
                    Api::<MutatingWebhookConfiguration>::all(client.clone())
                        .delete(&name, &dp)
                        .await
                        .map(|_| ())
                } else {
                    Api::<ValidatingWebhookConfiguration>::all(client.clone())
                        .delete(&name, &dp)
                        .await
                        .map(|_| ())
                };
            }
        });
    }
}

/// Points the pool CRDs' conversion at `served` (the API server calls it for v1alpha1).
pub async fn convert_through(client: &Client, served: &Served) {
    let mut crds = bitpool::crds::served();
    bitpool::crds::set_conversion(
        &mut crds,
        &served.client_config(bitpool::webhook::CONVERT_PATH),
    );
    super::install_crds(client, &crds).await;
}
