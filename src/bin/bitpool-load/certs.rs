//! Serving certificates for the upstream managers' webhook servers, which start only with one:
//! a CA made for the run and a certificate it signed for 127.0.0.1, as `tls.crt`/`tls.key`.

use std::path::{Path, PathBuf};

/// A webhook serving certificate in `dir`, and the CA that signed it.
pub struct Certs {
    pub dir: PathBuf,
    /// The CA, for a CRD's conversion webhook to trust.
    pub ca_pem: String,
}

impl Certs {
    /// Makes a CA and a certificate for 127.0.0.1 in `dir`.
    pub fn generate(dir: &Path) -> Result<Self, String> {
        let failed = |e: &dyn std::fmt::Display| {
            format!(
                "cannot make a webhook certificate in {}: {e}",
                dir.display()
            )
        };
        let ca_key = rcgen::KeyPair::generate().map_err(|e| failed(&e))?;
        let mut ca_params =
            rcgen::CertificateParams::new(Vec::<String>::new()).map_err(|e| failed(&e))?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "bitpool-load CA");
        let ca = ca_params.self_signed(&ca_key).map_err(|e| failed(&e))?;
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate().map_err(|e| failed(&e))?;
        let serving = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
            .and_then(|params| params.signed_by(&key, &issuer))
            .map_err(|e| failed(&e))?;
        std::fs::create_dir_all(dir).map_err(|e| failed(&e))?;
        std::fs::write(dir.join("tls.crt"), serving.pem()).map_err(|e| failed(&e))?;
        std::fs::write(dir.join("tls.key"), key.serialize_pem()).map_err(|e| failed(&e))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            ca_pem: ca.pem(),
        })
    }
}

/// A port nothing listens on now (the kernel's pick for a socket bound to port 0).
pub fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(|e| format!("cannot find a free port: {e}"))
}
