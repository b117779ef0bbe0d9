//! "This machine" as an instance group of one, for the executors that run jobs here (shell,
//! docker, custom): their slots go through the same taskscaler as autoscaled ones, so
//! reservations, limits and the job path are the same code.

use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use slipway_fleeting::{
    ConnectInfo, ConnectorConfig, GroupError, InstanceGroup, ProviderInfo, State,
};

/// The one instance's id.
pub const ID: &str = "localhost";

/// An instance group whose only instance is this machine: "created" on demand, at once.
#[derive(Debug, Default)]
pub struct LocalGroup {
    up: AtomicBool,
}

#[async_trait]
impl InstanceGroup for LocalGroup {
    async fn init(&self, _: &[u8], _: &ConnectorConfig) -> Result<ProviderInfo, GroupError> {
        Ok(provider())
    }

    async fn update(&self) -> Result<Vec<(String, State)>, GroupError> {
        Ok(if self.up.load(Ordering::SeqCst) {
            vec![(ID.to_string(), State::Running)]
        } else {
            Vec::new()
        })
    }

    async fn increase(&self, delta: u32) -> Result<u32, GroupError> {
        if delta == 0 || self.up.swap(true, Ordering::SeqCst) {
            return Ok(0);
        }
        Ok(1)
    }

    async fn decrease(&self, ids: &[String]) -> Result<Vec<String>, GroupError> {
        if ids.iter().any(|id| id == ID) {
            self.up.store(false, Ordering::SeqCst);
            return Ok(vec![ID.to_string()]);
        }
        Ok(Vec::new())
    }

    async fn connect_info(&self, id: &str) -> Result<ConnectInfo, GroupError> {
        Ok(ConnectInfo {
            id: id.to_string(),
            ..ConnectInfo::default()
        })
    }

    async fn heartbeat(&self, _: &str) -> Result<(), GroupError> {
        Ok(())
    }

    async fn shutdown(&self) -> Result<(), GroupError> {
        Ok(())
    }
}

/// What the group says of itself.
pub fn provider() -> ProviderInfo {
    ProviderInfo {
        id: ID.to_string(),
        max_size: 1,
        ..ProviderInfo::default()
    }
}
