//! Volumes: named volumes for caches and builds directories.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use serde_json::json;

use crate::client::{Docker, Req, seg};
use crate::error::Result;

/// What to create with [`Docker::create_volume`].
#[derive(Debug, Clone, Default)]
pub struct VolumeSpec {
    /// Volume name; the engine makes one up when empty.
    pub name: String,
    /// Driver; `local` when `None`.
    pub driver: Option<String>,
    /// Labels, e.g. `com.slipway.job=42`.
    pub labels: BTreeMap<String, String>,
}

impl VolumeSpec {
    /// A local volume called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ..Self::default()
        }
    }
}

/// A volume as create, inspect and list return it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct VolumeInfo {
    /// Volume name.
    pub name: String,
    /// Driver.
    #[serde(default)]
    pub driver: String,
    /// Where it lives on the engine's host.
    #[serde(default)]
    pub mountpoint: String,
    /// Labels.
    #[serde(default)]
    pub labels: Option<HashMap<String, String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct VolumeList {
    #[serde(default)]
    volumes: Option<Vec<VolumeInfo>>,
}

impl Docker {
    /// `POST /volumes/create`.
    pub async fn create_volume(&self, spec: &VolumeSpec) -> Result<VolumeInfo> {
        let body = json!({
            "Name": spec.name,
            "Driver": spec.driver.as_deref().unwrap_or("local"),
            "Labels": spec.labels,
        });
        self.json(Req::post("/volumes/create").json(&body)?).await
    }

    /// `GET /volumes/{name}`.
    pub async fn inspect_volume(&self, name: &str) -> Result<VolumeInfo> {
        self.json(Req::get(format!("/volumes/{}", seg(name)))).await
    }

    /// `DELETE /volumes/{name}`; `force` removes it even when the engine thinks it is in use.
    pub async fn remove_volume(&self, name: &str, force: bool) -> Result<()> {
        self.empty(Req::delete(format!("/volumes/{}", seg(name))).query_bool("force", force))
            .await
    }

    /// `GET /volumes`, optionally only those carrying `label` (`key` or `key=value`).
    pub async fn list_volumes(&self, label: Option<&str>) -> Result<Vec<VolumeInfo>> {
        let list: VolumeList = self.json(Req::get("/volumes").label_filter(label)).await?;
        Ok(list.volumes.unwrap_or_default())
    }
}
