//! Networks: a user-defined bridge per job, so services are reachable by alias.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use serde_json::json;

use crate::client::{Docker, Req, seg};
use crate::error::Result;

/// What to create with [`Docker::create_network`].
#[derive(Debug, Clone, Default)]
pub struct NetworkSpec {
    /// Network name.
    pub name: String,
    /// Driver; `bridge` when `None`.
    pub driver: Option<String>,
    /// No route to the outside.
    pub internal: bool,
    /// Labels, e.g. `com.slipway.job=42`.
    pub labels: BTreeMap<String, String>,
}

impl NetworkSpec {
    /// A bridge network called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ..Self::default()
        }
    }
}

/// Answer of `POST /networks/create`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct CreatedNetwork {
    /// The new network's ID.
    pub id: String,
    /// Warning from the engine, if any.
    #[serde(default)]
    pub warning: Option<String>,
}

/// A network as inspect and list return it (the parts we use).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct NetworkInfo {
    /// Network ID.
    pub id: String,
    /// Network name.
    #[serde(default)]
    pub name: String,
    /// Driver.
    #[serde(default)]
    pub driver: String,
    /// Whether it is internal.
    #[serde(default)]
    pub internal: bool,
    /// Labels.
    #[serde(default)]
    pub labels: Option<HashMap<String, String>>,
}

impl Docker {
    /// `POST /networks/create` (refuses a duplicate name).
    pub async fn create_network(&self, spec: &NetworkSpec) -> Result<CreatedNetwork> {
        let body = json!({
            "Name": spec.name,
            "Driver": spec.driver.as_deref().unwrap_or("bridge"),
            "CheckDuplicate": true,
            "Internal": spec.internal,
            "Labels": spec.labels,
        });
        self.json(Req::post("/networks/create").json(&body)?).await
    }

    /// `POST /networks/{id}/connect`: attaches `container` with DNS `aliases`.
    pub async fn connect_network(
        &self,
        network: &str,
        container: &str,
        aliases: &[String],
    ) -> Result<()> {
        let body = json!({
            "Container": container,
            "EndpointConfig": { "Aliases": aliases },
        });
        let req = Req::post(format!("/networks/{}/connect", seg(network))).json(&body)?;
        self.empty(req).await
    }

    /// `POST /networks/{id}/disconnect`.
    pub async fn disconnect_network(
        &self,
        network: &str,
        container: &str,
        force: bool,
    ) -> Result<()> {
        let body = json!({ "Container": container, "Force": force });
        let req = Req::post(format!("/networks/{}/disconnect", seg(network))).json(&body)?;
        self.empty(req).await
    }

    /// `GET /networks/{id}`.
    pub async fn inspect_network(&self, network: &str) -> Result<NetworkInfo> {
        self.json(Req::get(format!("/networks/{}", seg(network))))
            .await
    }

    /// `DELETE /networks/{id}`.
    pub async fn remove_network(&self, network: &str) -> Result<()> {
        self.empty(Req::delete(format!("/networks/{}", seg(network))))
            .await
    }

    /// `GET /networks`, optionally only those carrying `label` (`key` or `key=value`).
    pub async fn list_networks(&self, label: Option<&str>) -> Result<Vec<NetworkInfo>> {
        self.json(Req::get("/networks").label_filter(label)).await
    }
}
