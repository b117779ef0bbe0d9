//! The client key pair: made once with `ssh-keygen` in the state directory, its public half
//! handed to every guest at boot, its private half to the manager in ConnectInfo.

use std::fmt;
use std::path::Path;
use std::process::Stdio;

/// Private key bytes that are never printed.
#[derive(Clone)]
pub struct Secret(pub Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[masked]")
    }
}

/// Why the key pair is unavailable.
#[derive(Debug, thiserror::Error)]
#[error("client key {path}: {message}")]
pub struct KeyError {
    path: String,
    message: String,
}

/// The key pair in `dir` (`id_ed25519{,.pub}`), generated when absent: (private, public line).
pub async fn client_key(dir: &Path) -> Result<(Secret, String), KeyError> {
    let private = dir.join("id_ed25519");
    let public = dir.join("id_ed25519.pub");
    let err = |message: String| KeyError {
        path: private.display().to_string(),
        message,
    };
    let have = |p: &Path| {
        let p = p.to_path_buf();
        async move { tokio::fs::try_exists(&p).await.unwrap_or(false) }
    };
    if !have(&private).await || !have(&public).await {
        let _ = tokio::fs::remove_file(&private).await;
        let _ = tokio::fs::remove_file(&public).await;
        let out = tokio::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "slipway-qemu", "-f"])
            .arg(&private)
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|e| err(format!("running ssh-keygen (install openssh-client): {e}")))?;
        if !out.status.success() {
            return Err(err(format!(
                "ssh-keygen {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    let key = tokio::fs::read(&private)
        .await
        .map_err(|e| err(e.to_string()))?;
    let public = tokio::fs::read_to_string(&public)
        .await
        .map_err(|e| err(e.to_string()))?;
    Ok((Secret(key), public.trim().to_string()))
}
