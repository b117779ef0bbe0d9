//! TLS towards GitLab as GitLab Runner configures it: the system's roots plus a private CA
//! (`tls-ca-file`), and a client certificate (`tls-cert-file`, `tls-key-file`).
//!
//! Keys left unset fall back to GitLab Runner's well-known files in the config's `certs/`
//! directory, `<host>.crt`, `<host>.auth.crt` and `<host>.auth.key`, when they exist.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::GitlabError;

/// The files that shape TLS towards one GitLab (all optional).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificates trusted besides the system's roots (`tls-ca-file`).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain presented to GitLab (`tls-cert-file`).
    pub cert_file: Option<PathBuf>,
    /// PEM private key of the client certificate (`tls-key-file`).
    pub key_file: Option<PathBuf>,
}

/// The host of `url` without its port (GitLab Runner names its certificate files so).
pub fn host_of(url: &str) -> Option<String> {
    let uri: http::Uri = url.trim().parse().ok()?;
    uri.host()
        .map(|h| h.trim_start_matches('[').trim_end_matches(']').to_string())
}

impl TlsFiles {
    /// Whether no file is set.
    pub fn is_empty(&self) -> bool {
        self.ca_file.is_none() && self.cert_file.is_none() && self.key_file.is_none()
    }

    /// These files, with unset ones taken from `certs_dir` as GitLab Runner does for `url`
    /// (`<host>.crt`, `<host>.auth.crt`, `<host>.auth.key`) where such a file exists. The client
    /// pair is taken only whole: one of the two alone would be a half-configured identity.
    pub fn with_defaults(mut self, certs_dir: &Path, url: &str) -> Self {
        let Some(host) = host_of(url) else {
            return self;
        };
        let found = |name: String| Some(certs_dir.join(name)).filter(|p| p.is_file());
        if self.ca_file.is_none() {
            self.ca_file = found(format!("{host}.crt"));
        }
        if self.cert_file.is_none() && self.key_file.is_none() {
            let cert = found(format!("{host}.auth.crt"));
            let key = found(format!("{host}.auth.key"));
            if cert.is_some() && key.is_some() {
                self.cert_file = cert;
                self.key_file = key;
            }
        }
        self
    }

    /// A rustls client configuration for `url`: the system's roots (Mozilla's when the system
    /// has none) plus the CA file, and the client certificate when one is set.
    pub fn client_config(&self, url: &str) -> Result<rustls::ClientConfig, GitlabError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut roots = RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        let (added, _) = roots.add_parsable_certificates(native.certs);
        if added == 0 {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        }
        if let Some(ca) = &self.ca_file {
            let certs = read_certs(ca, url)?;
            let (added, ignored) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(tls_error(
                    ca,
                    url,
                    format!("none of its {ignored} certificates can be used as a CA"),
                ));
            }
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| GitlabError::InvalidUrl {
                url: url.to_string(),
                reason: format!("TLS setup: {e}"),
            })?
            .with_root_certificates(roots);
        let config = match (&self.cert_file, &self.key_file) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), Some(key)) => {
                let chain = read_certs(cert, url)?;
                let private = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| tls_error(key, url, pem_reason(&e, "private key")))?;
                builder.with_client_auth_cert(chain, private).map_err(|e| {
                    tls_error(key, url, format!("does not fit {}: {e}", cert.display()))
                })?
            }
            (Some(file), None) | (None, Some(file)) => {
                return Err(tls_error(
                    file,
                    url,
                    "a client certificate needs both tls-cert-file and tls-key-file".into(),
                ));
            }
        };
        Ok(config)
    }
}

/// Every certificate of a PEM file; an error when it has none.
fn read_certs(path: &Path, url: &str) -> Result<Vec<CertificateDer<'static>>, GitlabError> {
    let iter = CertificateDer::pem_file_iter(path)
        .map_err(|e| tls_error(path, url, pem_reason(&e, "certificate")))?;
    let certs: Vec<_> = iter
        .collect::<Result<_, _>>()
        .map_err(|e| tls_error(path, url, pem_reason(&e, "certificate")))?;
    if certs.is_empty() {
        return Err(tls_error(
            path,
            url,
            "holds no PEM certificate (DER is not read)".into(),
        ));
    }
    Ok(certs)
}

fn pem_reason(e: &rustls::pki_types::pem::Error, what: &str) -> String {
    match e {
        rustls::pki_types::pem::Error::Io(io) => io.to_string(),
        rustls::pki_types::pem::Error::NoItemsFound => format!("holds no PEM {what}"),
        other => format!("not a PEM {what}: {other:?}"),
    }
}

fn tls_error(file: &Path, url: &str, reason: String) -> GitlabError {
    GitlabError::TlsFile {
        file: file.to_path_buf(),
        url: url.to_string(),
        reason,
    }
}

/// Whether a transport error, told as `text` (the error and its causes), is a rejected
/// certificate: of the server (an unknown CA, a wrong name) or of ours (the server refused the
/// client certificate). Read from the words: hyper's `io::Error` wrapper hides the rustls error
/// from `source()`.
pub(super) fn certificate_problem(text: &str) -> Option<String> {
    if let Some(at) = text.find("invalid peer certificate: ") {
        let what = &text[at + "invalid peer certificate: ".len()..];
        return Some(format!("GitLab's certificate is not trusted: {what}"));
    }
    const REFUSED: [&str; 6] = [
        "CertificateRequired",
        "BadCertificate",
        "UnknownCA",
        "CertificateUnknown",
        "CertificateExpired",
        "AccessDenied",
    ];
    let alert = text
        .find("received fatal alert: ")
        .map(|at| &text[at + "received fatal alert: ".len()..])?;
    REFUSED
        .iter()
        .find(|a| alert.starts_with(*a))
        .map(|a| format!("GitLab refused our client certificate ({a})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_drop_ports_and_brackets() {
        assert_eq!(
            host_of("https://gitlab.example.com:8443/sub/").as_deref(),
            Some("gitlab.example.com")
        );
        assert_eq!(host_of("https://[::1]:8443").as_deref(), Some("::1"));
        assert_eq!(host_of("not a url"), None);
    }

    #[test]
    fn defaults_come_from_the_certs_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("gitlab.example.com.crt"), "x").unwrap();
        std::fs::write(dir.path().join("gitlab.example.com.auth.crt"), "x").unwrap();
        let files =
            TlsFiles::default().with_defaults(dir.path(), "https://gitlab.example.com:8443");
        assert_eq!(
            files.ca_file,
            Some(dir.path().join("gitlab.example.com.crt"))
        );
        // No key beside the certificate: no client identity.
        assert_eq!(files.cert_file, None);
        std::fs::write(dir.path().join("gitlab.example.com.auth.key"), "x").unwrap();
        let files = TlsFiles::default().with_defaults(dir.path(), "https://gitlab.example.com");
        assert!(files.cert_file.is_some() && files.key_file.is_some());
        // A set key wins over the directory.
        let set = TlsFiles {
            ca_file: Some("/elsewhere.pem".into()),
            ..TlsFiles::default()
        }
        .with_defaults(dir.path(), "https://gitlab.example.com");
        assert_eq!(set.ca_file, Some(PathBuf::from("/elsewhere.pem")));
    }

    #[test]
    fn bad_files_are_named_with_the_server() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("ca.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let url = "https://gitlab.example.com";
        for (files, want) in [
            (
                TlsFiles {
                    ca_file: Some(dir.path().join("missing.pem")),
                    ..TlsFiles::default()
                },
                "missing.pem",
            ),
            (
                TlsFiles {
                    ca_file: Some(empty.clone()),
                    ..TlsFiles::default()
                },
                "holds no PEM certificate",
            ),
            (
                TlsFiles {
                    cert_file: Some(empty.clone()),
                    ..TlsFiles::default()
                },
                "needs both tls-cert-file and tls-key-file",
            ),
        ] {
            let text = files.client_config(url).unwrap_err().to_string();
            assert!(text.contains(want), "{text}");
            assert!(text.contains(url), "{text}");
        }
    }
}
