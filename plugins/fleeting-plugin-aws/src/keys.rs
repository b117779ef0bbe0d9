//! One-off SSH key pairs pushed with EC2 Instance Connect.

use std::fmt;

use russh::keys::ssh_key::private::Ed25519Keypair;
use russh::keys::ssh_key::{LineEnding, PrivateKey};

/// A fresh ed25519 key pair; the private half is masked in `Debug`.
pub struct KeyPair {
    /// OpenSSH private key (PEM-like `-----BEGIN OPENSSH PRIVATE KEY-----` text).
    private_openssh: Vec<u8>,
    /// `ssh-ed25519 AAAA... slipway` line for `SendSSHPublicKey`.
    public_openssh: String,
}

impl fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyPair")
            .field("private_openssh", &"[masked]")
            .field("public_openssh", &self.public_openssh)
            .finish()
    }
}

/// Key encoding failed (not expected for ed25519).
#[derive(Debug, thiserror::Error)]
#[error("generating an ed25519 key pair: {0}")]
pub struct KeyError(String);

impl KeyPair {
    /// Generate a new ed25519 key pair from the OS-seeded CSPRNG.
    pub fn generate() -> Result<KeyPair, KeyError> {
        // From a seed: ssh-key's `random` wants a newer rand_core than the workspace's rand.
        let seed: [u8; 32] = rand::random();
        let mut key = PrivateKey::from(Ed25519Keypair::from_seed(&seed));
        key.set_comment("slipway");
        let private = key
            .to_openssh(LineEnding::LF)
            .map_err(|e| KeyError(e.to_string()))?;
        let public = key
            .public_key()
            .to_openssh()
            .map_err(|e| KeyError(e.to_string()))?;
        Ok(KeyPair {
            private_openssh: private.as_bytes().to_vec(),
            public_openssh: public,
        })
    }

    /// The public key in `authorized_keys` form.
    pub fn public_openssh(&self) -> &str {
        &self.public_openssh
    }

    /// Take the private key (OpenSSH format) for `ConnectorConfig::key`.
    pub fn into_private_openssh(self) -> Vec<u8> {
        self.private_openssh
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn generates_distinct_masked_keys() {
        let a = KeyPair::generate().unwrap();
        let b = KeyPair::generate().unwrap();
        assert!(a.public_openssh().starts_with("ssh-ed25519 "));
        assert_ne!(a.public_openssh(), b.public_openssh());
        assert!(!format!("{a:?}").contains("PRIVATE"));
        let pem = String::from_utf8(a.into_private_openssh()).unwrap();
        assert!(pem.starts_with("-----BEGIN OPENSSH PRIVATE KEY-----"));
        russh::keys::decode_secret_key(&pem, None).unwrap();
    }
}
