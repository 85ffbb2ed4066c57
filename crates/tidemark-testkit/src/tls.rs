//! Certificates for tests of TLS: a private CA and a server certificate it signed, for
//! `localhost` and `127.0.0.1`, written as PEM files into a directory.

use std::path::{Path, PathBuf};

pub struct TestCa {
    /// The CA's certificate: what clients trust (`--tls-ca`).
    pub ca: PathBuf,
    /// The server's certificate chain (`--tls-cert`).
    pub cert: PathBuf,
    /// The server's private key (`--tls-key`).
    pub key: PathBuf,
}

impl TestCa {
    pub fn new(dir: &Path) -> TestCa {
        let ca_key = rcgen::KeyPair::generate().expect("a CA key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "Tidemark test CA");
        ca_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
        let ca_cert = ca_params.self_signed(&ca_key).expect("the CA certificate");
        let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
        let key = rcgen::KeyPair::generate().expect("a server key");
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).expect("parameters");
        params.distinguished_name.push(rcgen::DnType::CommonName, "tidemark test server");
        let cert = params.signed_by(&key, &issuer).expect("the server certificate");
        let paths = TestCa { ca: dir.join("ca.pem"), cert: dir.join("server.pem"), key: dir.join("server.key") };
        std::fs::write(&paths.ca, ca_cert.pem()).expect("writing ca.pem");
        std::fs::write(&paths.cert, cert.pem()).expect("writing server.pem");
        std::fs::write(&paths.key, key.serialize_pem()).expect("writing server.key");
        paths
    }
}
