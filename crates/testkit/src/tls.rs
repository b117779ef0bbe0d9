//! [`TestCa`]: a private certificate authority made by a test, with a server certificate for
//! `127.0.0.1`/`localhost` and a client certificate, all written as PEM files, as an operator
//! of a self-hosted GitLab has them.

// A fixture: a step that fails should stop the test at once, saying which.
#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A CA and what it signed, as PEM files in a directory.
#[derive(Debug)]
pub struct TestCa {
    /// The CA's certificate (what `tls-ca-file` names).
    pub ca_file: PathBuf,
    /// The server's certificate chain, for 127.0.0.1 and localhost.
    pub server_cert: PathBuf,
    /// The server's key.
    pub server_key: PathBuf,
    /// A client certificate the CA signed (what `tls-cert-file` names).
    pub client_cert: PathBuf,
    /// Its key (what `tls-key-file` names).
    pub client_key: PathBuf,
}

impl TestCa {
    /// Make a CA named `name` and its certificates in `dir`; panics on failure (a test fixture).
    pub fn new(dir: &Path, name: &str) -> TestCa {
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca, ca_key);

        let write = |file: &str, pem: String| {
            let path = dir.join(file);
            std::fs::write(&path, pem).expect("writing a PEM file");
            path
        };
        let ca_file = write(&format!("{name}-ca.crt"), ca_cert.pem());

        let server_key = KeyPair::generate().expect("server key");
        let mut server =
            CertificateParams::new(vec!["localhost".to_string()]).expect("server params");
        server
            .subject_alt_names
            .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
        server
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_cert = server
            .signed_by(&server_key, &issuer)
            .expect("server certificate");

        let client_key = KeyPair::generate().expect("client key");
        let mut client = CertificateParams::new(Vec::<String>::new()).expect("client params");
        client
            .distinguished_name
            .push(DnType::CommonName, format!("{name} runner"));
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_cert = client
            .signed_by(&client_key, &issuer)
            .expect("client certificate");

        TestCa {
            server_cert: write(&format!("{name}-server.crt"), server_cert.pem()),
            server_key: write(&format!("{name}-server.key"), server_key.serialize_pem()),
            client_cert: write(&format!("{name}-client.crt"), client_cert.pem()),
            client_key: write(&format!("{name}-client.key"), client_key.serialize_pem()),
            ca_file,
        }
    }

    /// A rustls server configuration presenting the server certificate; with
    /// `require_client_cert`, a client must present a certificate this CA signed.
    pub fn server_config(&self, require_client_cert: bool) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&self.server_cert)
            .expect("server certificate")
            .collect::<Result<_, _>>()
            .expect("server certificate");
        let key = PrivateKeyDer::from_pem_file(&self.server_key).expect("server key");
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("TLS versions");
        let builder = if require_client_cert {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(&self.ca_file).expect("CA") {
                roots.add(c.expect("CA")).expect("CA");
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .expect("client verifier");
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        Arc::new(
            builder
                .with_single_cert(chain, key)
                .expect("server certificate and key"),
        )
    }
}
