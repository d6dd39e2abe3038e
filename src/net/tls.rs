//! The TLS of bitpool's servers: rustls with the *ring* provider, the minimum version and TLS 1.2
//! cipher suites named as Cluster API managers name them (Go's names); for the webhooks a
//! certificate that is read again whenever cert-manager rotates the files, for the diagnostics
//! endpoint one made at start-up.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ServerConfig, SupportedCipherSuite, SupportedProtocolVersion};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// How often the certificate files are compared with what is being served.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(10);
/// The file names cert-manager writes (`--webhook-cert-name`, `--webhook-key-name` default).
pub const CERT_FILE: &str = "tls.crt";
/// The key's file name, beside [`CERT_FILE`].
pub const KEY_FILE: &str = "tls.key";

/// Why the certificate or key could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} holds no PEM {what}: {reason}")]
    Pem {
        path: String,
        what: &'static str,
        reason: String,
    },
    #[error("the key in {path} does not fit: {reason}")]
    Key { path: String, reason: String },
    #[error("--tls-min-version {0:?} is not supported; use VersionTLS12 or VersionTLS13")]
    MinVersion(String),
    #[error("--tls-cipher-suites: {0:?} is not supported; supported: {1}")]
    CipherSuite(String, String),
    #[error("cannot build the TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// `--tls-min-version`, as CAPI managers spell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MinVersion {
    Tls12,
    Tls13,
}

impl std::str::FromStr for MinVersion {
    type Err = TlsError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "VersionTLS12" | "TLS12" | "1.2" => Ok(Self::Tls12),
            "VersionTLS13" | "TLS13" | "1.3" => Ok(Self::Tls13),
            // TLS 1.0 and 1.1 are refused rather than silently raised.
            other => Err(TlsError::MinVersion(other.to_string())),
        }
    }
}

/// The TLS settings of the webhook server.
#[derive(Clone, Debug)]
pub struct TlsOptions {
    pub cert_dir: PathBuf,
    /// File names of the certificate and the key in `cert_dir`.
    pub cert_name: String,
    pub key_name: String,
    pub min_version: MinVersion,
    /// Go names of the TLS 1.2 suites to offer; empty means all of the provider's. TLS 1.3
    /// suites are always on (Go does not make them configurable either).
    pub cipher_suites: Vec<String>,
}

/// The TLS 1.2 suite names Go uses for the suites rustls offers: rustls' own name, and Go's
/// shorter name for the ChaCha20 suites.
fn go_names(suite: &SupportedCipherSuite) -> Vec<String> {
    let name = format!("{:?}", suite.suite());
    let mut names = vec![name.clone()];
    if let Some(short) = name.strip_suffix("_CHACHA20_POLY1305_SHA256") {
        names.push(format!("{short}_CHACHA20_POLY1305"));
    }
    if let Some(tls13) = name.strip_prefix("TLS13_") {
        names.push(format!("TLS_{tls13}"));
    }
    names
}

fn provider(options: &TlsOptions) -> Result<CryptoProvider, TlsError> {
    let mut provider = rustls::crypto::ring::default_provider();
    if options.cipher_suites.is_empty() {
        return Ok(provider);
    }
    let all = provider.cipher_suites.clone();
    for wanted in &options.cipher_suites {
        if !all.iter().any(|s| go_names(s).contains(wanted)) {
            let supported: Vec<String> = all.iter().map(|s| go_names(s).remove(0)).collect();
            return Err(TlsError::CipherSuite(wanted.clone(), supported.join(", ")));
        }
    }
    provider.cipher_suites = all
        .into_iter()
        .filter(|s| {
            s.version() == &rustls::version::TLS13
                || go_names(s)
                    .iter()
                    .any(|n| options.cipher_suites.contains(n))
        })
        .collect();
    Ok(provider)
}

static TLS12_AND_UP: [&SupportedProtocolVersion; 2] =
    [&rustls::version::TLS13, &rustls::version::TLS12];
static TLS13_ONLY: [&SupportedProtocolVersion; 1] = [&rustls::version::TLS13];

fn versions(min: MinVersion) -> &'static [&'static SupportedProtocolVersion] {
    match min {
        MinVersion::Tls12 => &TLS12_AND_UP,
        MinVersion::Tls13 => &TLS13_ONLY,
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// The certificate chain and key the options name, checked to belong together.
fn load(
    provider: &CryptoProvider,
    files: &TlsOptions,
) -> Result<(Vec<u8>, CertifiedKey), TlsError> {
    let cert_path = files.cert_dir.join(&files.cert_name);
    let key_path = files.cert_dir.join(&files.key_name);
    let cert_pem = read(&cert_path)?;
    let key_pem = read(&key_path)?;
    let pem_error = |path: &Path, what, reason: String| TlsError::Pem {
        path: path.display().to_string(),
        what,
        reason,
    };
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(&cert_path, "certificate", e.to_string()))?;
    if chain.is_empty() {
        return Err(pem_error(&cert_path, "certificate", "empty".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| pem_error(&key_path, "private key", e.to_string()))?;
    let key_error = |reason: String| TlsError::Key {
        path: key_path.display().to_string(),
        reason,
    };
    let certified =
        CertifiedKey::from_der(chain, key, provider).map_err(|e| key_error(e.to_string()))?;
    let mut fingerprint = cert_pem;
    fingerprint.extend_from_slice(&key_pem);
    Ok((fingerprint, certified))
}

/// Serves the current certificate; [`CertReloader::reload_if_changed`] swaps it.
#[derive(Debug)]
struct CurrentCert(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for CurrentCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.read().ok().map(|c| Arc::clone(&c))
    }
}

/// Keeps the served certificate in step with the files of the cert directory.
pub struct CertReloader {
    provider: Arc<CryptoProvider>,
    files: TlsOptions,
    loaded: Vec<u8>,
    current: Arc<CurrentCert>,
}

impl CertReloader {
    /// Reads the files again; swaps the certificate when they changed and still load. A
    /// half-written rotation is kept out until both files fit.
    pub fn reload_if_changed(&mut self) -> Result<bool, TlsError> {
        let (fingerprint, certified) = load(&self.provider, &self.files)?;
        if fingerprint == self.loaded {
            return Ok(false);
        }
        if let Ok(mut current) = self.current.0.write() {
            *current = Arc::new(certified);
        }
        self.loaded = fingerprint;
        Ok(true)
    }

    /// Checks the files every [`RELOAD_INTERVAL`] for ever.
    pub async fn watch(mut self) {
        let mut tick = tokio::time::interval(RELOAD_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.reload_if_changed() {
                Ok(true) => {
                    tracing::info!(dir = %self.files.cert_dir.display(), "webhook certificate reloaded")
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "cannot reload the webhook certificate; serving the previous one")
                }
            }
        }
    }
}

/// The server configuration, and the reloader that keeps its certificate current.
pub fn server_config(options: &TlsOptions) -> Result<(Arc<ServerConfig>, CertReloader), TlsError> {
    let provider = Arc::new(provider(options)?);
    let (loaded, certified) = load(&provider, options)?;
    let current = Arc::new(CurrentCert(RwLock::new(Arc::new(certified))));
    let config = serving(&provider, options.min_version, current.clone())?;
    let reloader = CertReloader {
        provider,
        files: options.clone(),
        loaded,
        current,
    };
    Ok((config, reloader))
}

/// A configuration serving a certificate for `names` that signs itself, made now and kept in
/// memory (as controller-runtime does for its secure metrics endpoint): scrapers that verify
/// the server pin it out of band, the bearer token is what is checked.
pub fn self_signed_config(
    options: &TlsOptions,
    names: Vec<String>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(provider(options)?);
    let generated_error = |reason: String| TlsError::Key {
        path: "(generated)".into(),
        reason,
    };
    let generated =
        rcgen::generate_simple_self_signed(names).map_err(|e| generated_error(e.to_string()))?;
    let chain = vec![generated.cert.der().clone()];
    let key = PrivateKeyDer::try_from(generated.signing_key.serialize_der())
        .map_err(|e| generated_error(e.to_string()))?;
    let certified = CertifiedKey::from_der(chain, key, &provider)
        .map_err(|e| generated_error(e.to_string()))?;
    let current = Arc::new(CurrentCert(RwLock::new(Arc::new(certified))));
    serving(&provider, options.min_version, current)
}

/// A server configuration offering h2 and HTTP/1.1 with the certificate `current` serves.
fn serving(
    provider: &Arc<CryptoProvider>,
    min_version: MinVersion,
    current: Arc<CurrentCert>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let mut config = ServerConfig::builder_with_provider(Arc::clone(provider))
        .with_protocol_versions(versions(min_version))?
        .with_no_client_auth()
        .with_cert_resolver(current);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(suites: &[&str]) -> TlsOptions {
        TlsOptions {
            cert_dir: PathBuf::from("/nonexistent"),
            cert_name: CERT_FILE.into(),
            key_name: KEY_FILE.into(),
            min_version: MinVersion::Tls12,
            cipher_suites: suites.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn min_versions_take_capi_spellings_and_refuse_old_ones() {
        assert_eq!(
            "VersionTLS12".parse::<MinVersion>().ok(),
            Some(MinVersion::Tls12)
        );
        assert_eq!(
            "VersionTLS13".parse::<MinVersion>().ok(),
            Some(MinVersion::Tls13)
        );
        let refused = "VersionTLS10"
            .parse::<MinVersion>()
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("VersionTLS10") && refused.contains("VersionTLS12"),
            "{refused}"
        );
    }

    #[test]
    fn cipher_suites_are_chosen_by_go_names() {
        let chosen = provider(&options(&["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"])).expect("known");
        let names: Vec<String> = chosen
            .cipher_suites
            .iter()
            .map(|s| format!("{:?}", s.suite()))
            .collect();
        assert!(names.contains(&"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".to_string()));
        assert!(
            !names.contains(&"TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384".to_string()),
            "{names:?}"
        );
        assert!(
            names.iter().any(|n| n.starts_with("TLS13_")),
            "TLS 1.3 stays on: {names:?}"
        );
        // Go's short ChaCha20 name.
        assert!(provider(&options(&["TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305"])).is_ok());
        let refused = provider(&options(&["TLS_RSA_WITH_RC4_128_SHA"]))
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("TLS_RSA_WITH_RC4_128_SHA") && refused.contains("supported:"),
            "{refused}"
        );
    }

    #[test]
    fn a_missing_cert_dir_is_named() {
        let error = server_config(&options(&[]))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("/nonexistent/tls.crt"), "{error}");
    }
}
