//! An in-memory instance group shared by the taskscaler's integration tests.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Mutex;

use async_trait::async_trait;
use slipway_fleeting::{
    ConnectInfo, ConnectorConfig, GroupError, InstanceGroup, ProviderInfo, State,
};

/// An instance group in memory: instances are running as soon as they are asked for.
#[derive(Default)]
pub struct Memory {
    pub instances: Mutex<Vec<(String, State)>>,
    pub next: Mutex<u32>,
    pub decreased: Mutex<Vec<String>>,
    /// Accept this many Decrease calls without deleting anything (a cloud that drops requests).
    pub ignore_decreases: Mutex<u32>,
    /// Fail this many Update calls.
    pub failing_updates: Mutex<u32>,
    /// ConnectInfo calls answered.
    pub connect_calls: Mutex<u32>,
    /// Credentials handed out expire this long after the call.
    pub expires_in: Mutex<Option<std::time::Duration>>,
    /// Refuse Increase for lack of capacity (a spot market with none left).
    pub no_capacity: Mutex<bool>,
    /// Increase calls refused for lack of capacity.
    pub refused: Mutex<u32>,
}

#[async_trait]
impl InstanceGroup for Memory {
    async fn init(&self, _: &[u8], _: &ConnectorConfig) -> Result<ProviderInfo, GroupError> {
        Ok(ProviderInfo::default())
    }
    async fn update(&self) -> Result<Vec<(String, State)>, GroupError> {
        {
            let mut failing = self
                .failing_updates
                .lock()
                .map_err(|e| GroupError::Provider(e.to_string()))?;
            if *failing > 0 {
                *failing -= 1;
                return Err(GroupError::Provider("cloud API unavailable".into()));
            }
        }
        Ok(self
            .instances
            .lock()
            .map_err(|e| GroupError::Provider(e.to_string()))?
            .clone())
    }
    async fn increase(&self, delta: u32) -> Result<u32, GroupError> {
        if *self.no_capacity.lock().unwrap() {
            *self.refused.lock().unwrap() += 1;
            return Err(GroupError::Capacity("InsufficientInstanceCapacity".into()));
        }
        let mut next = self
            .next
            .lock()
            .map_err(|e| GroupError::Provider(e.to_string()))?;
        let mut list = self
            .instances
            .lock()
            .map_err(|e| GroupError::Provider(e.to_string()))?;
        for _ in 0..delta {
            *next += 1;
            list.push((format!("i{next}"), State::Running));
        }
        Ok(delta)
    }
    async fn decrease(&self, ids: &[String]) -> Result<Vec<String>, GroupError> {
        {
            let mut ignore = self
                .ignore_decreases
                .lock()
                .map_err(|e| GroupError::Provider(e.to_string()))?;
            if *ignore > 0 {
                *ignore -= 1;
                return Ok(ids.to_vec());
            }
        }
        self.instances
            .lock()
            .map_err(|e| GroupError::Provider(e.to_string()))?
            .retain(|(id, _)| !ids.contains(id));
        self.decreased
            .lock()
            .map_err(|e| GroupError::Provider(e.to_string()))?
            .extend(ids.iter().cloned());
        Ok(ids.to_vec())
    }
    async fn connect_info(&self, id: &str) -> Result<ConnectInfo, GroupError> {
        *self.connect_calls.lock().unwrap() += 1;
        let expires = self
            .expires_in
            .lock()
            .unwrap()
            .map(|d| std::time::SystemTime::now() + d);
        Ok(ConnectInfo {
            id: id.into(),
            expires,
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
