//! TLS for every listener and every client of Tidemark's HTTP APIs, with rustls.
//!
//! A listener loads its certificate chain and key from PEM files (`--tls-cert`, `--tls-key`).
//! Clients verify servers against the platform's trust store, or only against the certificates
//! of a private CA (`--tls-ca FILE`, set once per process with [`trust`] before any client is
//! built).

use std::path::Path;
use std::sync::{Arc, OnceLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

pub use tokio_rustls::TlsAcceptor;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("reading certificates from {}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("reading certificates from {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)", path.display()));
    }
    Ok(certs)
}

/// The acceptor of a listener serving `cert` (a PEM chain, the server's certificate first) with
/// `key` (a PEM private key). Errors name the file and what is wrong with it.
pub fn acceptor(cert: &Path, key: &Path) -> Result<tokio_rustls::TlsAcceptor, String> {
    let chain = certs(cert)?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("reading the private key from {}: {e}", key.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("--tls-cert {} and --tls-key do not make a usable pair: {e}", cert.display()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

static TRUST: OnceLock<rustls::ClientConfig> = OnceLock::new();

/// From now on this process's clients trust only the certificates in `ca` (PEM): a private CA's,
/// or a self-signed server certificate itself. Called once, at start.
pub fn trust(ca: &Path) -> Result<(), String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certs(ca)? {
        roots.add(c).map_err(|e| format!("--tls-ca {}: {e}", ca.display()))?;
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    TRUST.set(config).map_err(|_| "the clients' trust is already set".to_string())
}

/// The client configuration [`trust`] set, if any: for clients that are not reqwest's (the
/// PostgreSQL store's).
pub fn trusted_config() -> Option<rustls::ClientConfig> {
    TRUST.get().cloned()
}

/// Whether [`trust`] was called.
pub fn trusts_private_ca() -> bool {
    TRUST.get().is_some()
}

/// A builder for a client of Tidemark's APIs: with the trust [`trust`] set, if any.
pub fn client_builder() -> reqwest::ClientBuilder {
    let b = reqwest::Client::builder();
    match TRUST.get() {
        Some(config) => b.tls_backend_preconfigured(config.clone()),
        None => b,
    }
}
