//! AutoMTLS as go-plugin does it: a fresh self-signed certificate per run on each side, and each
//! side pins exactly the peer's leaf certificate.
//!
//! Only the aws-lc-rs provider is used: ring cannot verify the P-521 signatures Go plugins make.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, DistinguishedName as RustlsDn,
    ServerConfig, SignatureScheme,
};

/// ALPN protocol both sides must offer; grpc-go enforces it.
pub const ALPN_H2: &[u8] = b"h2";
/// Server name used for SNI and in the certificate SAN.
pub const SERVER_NAME: &str = "localhost";

/// Go's AutoMTLS validity: 30 years.
const VALIDITY_YEARS: i32 = 30;

/// An AutoMTLS error.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Key or certificate generation failed.
    #[error("generating the AutoMTLS certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// The peer's certificate PEM could not be read.
    #[error("peer certificate PEM is invalid: {0}")]
    Pem(String),
    /// The SNI name is invalid.
    #[error("invalid TLS server name: {0}")]
    ServerName(String),
    /// rustls refused the configuration.
    #[error("building the TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// One side's AutoMTLS identity.
pub struct AutoMtlsCert {
    /// DER of the self-signed leaf.
    pub cert_der: CertificateDer<'static>,
    /// PEM of the same certificate (what `PLUGIN_CLIENT_CERT` carries).
    pub cert_pem: String,
    key_der: PrivatePkcs8KeyDer<'static>,
}

impl std::fmt::Debug for AutoMtlsCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The private key stays out of logs.
        f.debug_struct("AutoMtlsCert")
            .field("cert_der_len", &self.cert_der.len())
            .finish()
    }
}

impl AutoMtlsCert {
    /// Generate a go-plugin-shaped certificate: ECDSA P-521, CN=localhost, O=HashiCorp, SAN
    /// localhost, IsCA, clientAuth+serverAuth, 30 years.
    pub fn generate() -> Result<Self, TlsError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P521_SHA512)?;
        let mut params = CertificateParams::new(vec![SERVER_NAME.to_owned()])?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, SERVER_NAME);
        dn.push(DnType::OrganizationName, "HashiCorp");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
            KeyUsagePurpose::KeyAgreement,
            KeyUsagePurpose::KeyCertSign,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ClientAuth,
            ExtendedKeyUsagePurpose::ServerAuth,
        ];
        // Whole-year bounds are enough: the peer pins the DER and ignores validity anyway, but a
        // backdated start keeps tools like openssl happy under small clock skew.
        let year = current_year();
        params.not_before = rcgen::date_time_ymd(year - 1, 1, 1);
        params.not_after = rcgen::date_time_ymd(year + VALIDITY_YEARS, 1, 1);
        let cert = params.self_signed(&key)?;
        Ok(AutoMtlsCert {
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            key_der: PrivatePkcs8KeyDer::from(key.serialize_der()),
        })
    }

    fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(self.key_der.clone_key())
    }
}

fn current_year() -> i32 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    // Mean Gregorian year length; off by a day at most around New Year, which the backdating absorbs.
    1970 + i32::try_from(secs / 31_556_952).unwrap_or(0)
}

/// The only crypto provider Slipway uses for plugin TLS.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Decode the first certificate of a PEM document (e.g. `PLUGIN_CLIENT_CERT`).
pub fn cert_from_pem(pem: &str) -> Result<CertificateDer<'static>, TlsError> {
    CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|e| TlsError::Pem(e.to_string()))
}

/// Host side: present `own`, trust exactly `server_cert_der` (handshake field 6), ALPN h2.
pub fn client_config(own: &AutoMtlsCert, server_cert_der: &[u8]) -> Result<ClientConfig, TlsError> {
    let provider = provider();
    let verifier = PinnedServerVerifier {
        expected: CertificateDer::from(server_cert_der.to_vec()),
        algs: provider.signature_verification_algorithms,
    };
    let mut cfg = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_auth_cert(vec![own.cert_der.clone()], own.key())?;
    cfg.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(cfg)
}

/// Plugin side: present `own`, require the client to present exactly `client_cert`, ALPN h2.
pub fn server_config(
    own: &AutoMtlsCert,
    client_cert: CertificateDer<'static>,
) -> Result<ServerConfig, TlsError> {
    let provider = provider();
    let verifier = PinnedClientVerifier {
        expected: client_cert,
        algs: provider.signature_verification_algorithms,
    };
    let mut cfg = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(Arc::new(verifier))
        .with_single_cert(vec![own.cert_der.clone()], own.key())?;
    cfg.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(cfg)
}

/// The SNI name the host sends (`localhost`).
pub fn server_name() -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(SERVER_NAME).map_err(|e| TlsError::ServerName(e.to_string()))
}

fn pinned_match(
    presented: &CertificateDer<'_>,
    expected: &CertificateDer<'_>,
) -> Result<(), rustls::Error> {
    // Byte-for-byte pinning: the stock WebPKI verifier rejects go-plugin's IsCA leaf
    // (CaUsedAsEndEntity), and there is no chain to build anyway.
    if presented.as_ref() == expected.as_ref() {
        Ok(())
    } else {
        Err(rustls::Error::InvalidCertificate(
            CertificateError::ApplicationVerificationFailure,
        ))
    }
}

/// Host-side verifier that trusts only the plugin's announced leaf.
#[derive(Debug)]
struct PinnedServerVerifier {
    expected: CertificateDer<'static>,
    algs: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for PinnedServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        pinned_match(end_entity, &self.expected).map(|()| ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

/// Plugin-side verifier that requires exactly the host's certificate from `PLUGIN_CLIENT_CERT`.
#[derive(Debug)]
struct PinnedClientVerifier {
    expected: CertificateDer<'static>,
    algs: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for PinnedClientVerifier {
    fn root_hint_subjects(&self) -> &[RustlsDn] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        pinned_match(end_entity, &self.expected).map(|()| ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn cert_round_trips_through_pem() {
        let c = AutoMtlsCert::generate().unwrap();
        assert!(c.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert_eq!(cert_from_pem(&c.cert_pem).unwrap(), c.cert_der);
        assert!(cert_from_pem("nope").is_err());
    }

    async fn handshake(
        server_cert: &AutoMtlsCert,
        pinned_by_client: &[u8],
        client_cert: &AutoMtlsCert,
        pinned_by_server: CertificateDer<'static>,
    ) -> Result<Vec<u8>, std::io::Error> {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(
            server_config(server_cert, pinned_by_server).unwrap(),
        ));
        let connector = tokio_rustls::TlsConnector::from(Arc::new(
            client_config(client_cert, pinned_by_client).unwrap(),
        ));
        let server = tokio::spawn(async move {
            let mut s = acceptor.accept(b).await?;
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).await?;
            s.write_all(&buf).await?;
            s.flush().await?;
            Ok::<_, std::io::Error>(s.get_ref().1.alpn_protocol().map(<[u8]>::to_vec))
        });
        let client = async {
            let mut c = connector.connect(server_name().unwrap(), a).await?;
            c.write_all(b"ping").await?;
            let mut buf = [0u8; 4];
            c.read_exact(&mut buf).await?;
            Ok::<_, std::io::Error>(buf)
        };
        let client_res = client.await;
        let server_res = server.await.map_err(std::io::Error::other)?;
        let buf = client_res?;
        assert_eq!(&buf, b"ping");
        Ok(server_res?.unwrap_or_default())
    }

    #[tokio::test]
    async fn mutual_pinning_with_p521() {
        let s = AutoMtlsCert::generate().unwrap();
        let c = AutoMtlsCert::generate().unwrap();
        let alpn = handshake(&s, &s.cert_der, &c, c.cert_der.clone())
            .await
            .unwrap();
        assert_eq!(alpn, b"h2");
    }

    #[tokio::test]
    async fn wrong_pins_fail() {
        let s = AutoMtlsCert::generate().unwrap();
        let c = AutoMtlsCert::generate().unwrap();
        let other = AutoMtlsCert::generate().unwrap();
        assert!(
            handshake(&s, &other.cert_der, &c, c.cert_der.clone())
                .await
                .is_err()
        );
        assert!(
            handshake(&s, &s.cert_der, &c, other.cert_der.clone())
                .await
                .is_err()
        );
    }
}
