//! The go-plugin handshake line: `CORE|APP|NETWORK|ADDR|PROTOCOL[|CERT[|MUX]]`.
//!
//! The plugin prints it as the first line of its stdout; the host parses it to learn where to
//! dial and which certificate to pin.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_NO_PAD;

/// go-plugin's core protocol version; anything else is rejected.
pub const CORE_PROTOCOL_VERSION: u32 = 1;

/// The Go host only treats field 6 as a certificate when it is longer than this.
const MIN_CERT_FIELD_LEN: usize = 50;

/// Transport the plugin listens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    /// A unix domain socket; the address is its path.
    Unix,
    /// TCP; the address is `host:port`.
    Tcp,
}

impl Network {
    /// Wire name (`unix` / `tcp`).
    pub fn as_str(self) -> &'static str {
        match self {
            Network::Unix => "unix",
            Network::Tcp => "tcp",
        }
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A parsed (or to-be-printed) handshake line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handshake {
    /// Negotiated app protocol version (field 2).
    pub app_version: u32,
    /// Transport (field 3).
    pub network: Network,
    /// Socket path or `host:port` (field 4).
    pub address: String,
    /// DER of the plugin's AutoMTLS leaf certificate (field 6), if any.
    pub server_cert: Option<Vec<u8>>,
    /// Field 7: the plugin supports broker multiplexing.
    pub multiplex: bool,
}

/// Why a handshake line was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// Fewer than the mandatory fields.
    #[error("handshake line {line:?} is not CORE|APP|NETWORK|ADDR|PROTOCOL")]
    Malformed {
        /// The offending line.
        line: String,
    },
    /// Field 1 is not go-plugin's core version 1.
    #[error("handshake line has core protocol version {found:?}, expected {CORE_PROTOCOL_VERSION}")]
    CoreVersion {
        /// What the plugin sent.
        found: String,
    },
    /// Field 2 is not a version this host speaks.
    #[error("plugin speaks app protocol version {found:?}, this host supports {supported:?}")]
    AppVersion {
        /// What the plugin sent.
        found: String,
        /// What the host accepts.
        supported: Vec<u32>,
    },
    /// Field 5 is absent (meaning net/rpc) or not `grpc`.
    #[error(
        "plugin protocol {found:?} is not supported, only \"grpc\" (net/rpc plugins are rejected)"
    )]
    Protocol {
        /// What the plugin sent (`netrpc` when the field was absent).
        found: String,
    },
    /// Field 3 is neither `unix` nor `tcp`.
    #[error("handshake network {found:?} is neither \"unix\" nor \"tcp\"")]
    Network {
        /// What the plugin sent.
        found: String,
    },
    /// Field 4 is empty.
    #[error("handshake address is empty")]
    EmptyAddress,
    /// Field 6 is not unpadded standard base64.
    #[error("handshake server certificate is not valid base64: {0}")]
    CertBase64(String),
}

impl Handshake {
    /// Parse a handshake line, accepting only app versions in `supported`.
    pub fn parse(line: &str, supported: &[u32]) -> Result<Self, HandshakeError> {
        let line = line.trim_end_matches(['\r', '\n']);
        let parts: Vec<&str> = line.split('|').collect();
        if parts.len() < 4 {
            return Err(HandshakeError::Malformed {
                line: line.to_owned(),
            });
        }
        if parts[0].trim().parse::<u32>().ok() != Some(CORE_PROTOCOL_VERSION) {
            return Err(HandshakeError::CoreVersion {
                found: parts[0].to_owned(),
            });
        }
        let app_version = parts[1]
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|v| supported.contains(v))
            .ok_or_else(|| HandshakeError::AppVersion {
                found: parts[1].to_owned(),
                supported: supported.to_vec(),
            })?;
        let network = match parts[2] {
            "unix" => Network::Unix,
            "tcp" => Network::Tcp,
            other => {
                return Err(HandshakeError::Network {
                    found: other.to_owned(),
                });
            }
        };
        let address = parts[3].to_owned();
        if address.is_empty() {
            return Err(HandshakeError::EmptyAddress);
        }
        // go-plugin: a missing protocol field means net/rpc.
        let protocol = parts.get(4).copied().unwrap_or("netrpc");
        if protocol != "grpc" {
            return Err(HandshakeError::Protocol {
                found: protocol.to_owned(),
            });
        }
        let server_cert = match parts.get(5) {
            // Like the Go host, short values are legacy extra data, not a certificate.
            Some(field) if field.len() > MIN_CERT_FIELD_LEN => Some(
                STANDARD_NO_PAD
                    // Tolerate padding some encoders add anyway.
                    .decode(field.trim_end_matches('='))
                    .map_err(|e| HandshakeError::CertBase64(e.to_string()))?,
            ),
            _ => None,
        };
        let multiplex = parts.get(6).is_some_and(|m| *m == "true");
        Ok(Handshake {
            app_version,
            network,
            address,
            server_cert,
            multiplex,
        })
    }

    /// Format the line as go-plugin prints it (without the trailing newline).
    pub fn format(&self) -> String {
        let cert = self
            .server_cert
            .as_deref()
            .map(|c| STANDARD_NO_PAD.encode(c))
            .unwrap_or_default();
        let mut line = format!(
            "{CORE_PROTOCOL_VERSION}|{}|{}|{}|grpc|{cert}",
            self.app_version, self.network, self.address
        );
        if self.multiplex {
            line.push_str("|true");
        }
        line
    }
}

impl fmt::Display for Handshake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.format())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V: &[u32] = &[1];

    #[test]
    fn parses_plaintext_line() {
        let h = Handshake::parse("1|1|unix|/tmp/plugin123|grpc|\n", V).unwrap();
        assert_eq!(h.app_version, 1);
        assert_eq!(h.network, Network::Unix);
        assert_eq!(h.address, "/tmp/plugin123");
        assert_eq!(h.server_cert, None);
        assert!(!h.multiplex);
    }

    #[test]
    fn round_trips_with_cert_and_mux() {
        let h = Handshake {
            app_version: 1,
            network: Network::Tcp,
            address: "127.0.0.1:1234".into(),
            server_cert: Some((0u8..=200).collect()),
            multiplex: true,
        };
        let line = h.format();
        assert!(!line.contains('='), "no padding: {line}");
        assert_eq!(Handshake::parse(&line, V).unwrap(), h);
    }

    #[test]
    fn short_cert_field_is_ignored_like_go() {
        let h = Handshake::parse("1|1|unix|/s|grpc|abc", V).unwrap();
        assert_eq!(h.server_cert, None);
    }

    #[test]
    fn rejects_bad_lines() {
        assert!(matches!(
            Handshake::parse("garbage", V),
            Err(HandshakeError::Malformed { .. })
        ));
        assert!(matches!(
            Handshake::parse("2|1|unix|/s|grpc", V),
            Err(HandshakeError::CoreVersion { .. })
        ));
        assert!(matches!(
            Handshake::parse("1|7|unix|/s|grpc", V),
            Err(HandshakeError::AppVersion { .. })
        ));
        assert_eq!(
            Handshake::parse("1|1|unix|/s", V),
            Err(HandshakeError::Protocol {
                found: "netrpc".into()
            })
        );
        assert!(matches!(
            Handshake::parse("1|1|unix|/s|netrpc", V),
            Err(HandshakeError::Protocol { .. })
        ));
        assert!(matches!(
            Handshake::parse("1|1|udp|/s|grpc", V),
            Err(HandshakeError::Network { .. })
        ));
        assert!(matches!(
            Handshake::parse("1|1|unix||grpc", V),
            Err(HandshakeError::EmptyAddress)
        ));
        let bad = format!("1|1|unix|/s|grpc|{}", "!".repeat(60));
        assert!(matches!(
            Handshake::parse(&bad, V),
            Err(HandshakeError::CertBase64(_))
        ));
    }

    #[test]
    fn malformed_message_names_the_format() {
        let e = Handshake::parse("garbage", V).unwrap_err();
        assert_eq!(
            e.to_string(),
            "handshake line \"garbage\" is not CORE|APP|NETWORK|ADDR|PROTOCOL"
        );
    }
}
