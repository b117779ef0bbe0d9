//! System endpoints: `/_ping` and `/version`.

use serde::Deserialize;

use crate::client::{Docker, Req};
use crate::error::{Error, Result};

/// The engine's `/version` answer (the parts we use).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SystemVersion {
    /// Engine version, e.g. `20.10.24`.
    #[serde(default)]
    pub version: String,
    /// Newest API version the engine speaks, e.g. `1.41`.
    #[serde(rename = "ApiVersion")]
    pub api_version: String,
    /// Oldest API version the engine accepts.
    #[serde(rename = "MinAPIVersion", default)]
    pub min_api_version: Option<String>,
    /// Engine OS, e.g. `linux`.
    #[serde(default)]
    pub os: String,
    /// Engine architecture, e.g. `amd64`.
    #[serde(default)]
    pub arch: String,
    /// Kernel version of the engine's host.
    #[serde(default)]
    pub kernel_version: String,
}

impl Docker {
    /// `GET /_ping`: succeeds when the engine answers `OK`.
    pub async fn ping(&self) -> Result<()> {
        let body = self
            .send(Req::get("/_ping").unversioned())
            .await?
            .bytes()
            .await?;
        if body.as_ref() == b"OK" {
            Ok(())
        } else {
            Err(Error::Api {
                status: 200,
                message: format!(
                    "unexpected ping answer {:?}",
                    String::from_utf8_lossy(&body)
                ),
            })
        }
    }

    /// `GET /version` (unversioned, so it works before negotiation).
    pub async fn version(&self) -> Result<SystemVersion> {
        self.json(Req::get("/version").unversioned()).await
    }
}
