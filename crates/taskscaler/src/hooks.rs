//! Runner-side instance checks the taskscaler calls, injected so it does no I/O of its own.

use async_trait::async_trait;
use slipway_fleeting::ConnectInfo;

/// Checks run against instances through the connector (the runner implements them).
#[async_trait]
pub trait InstanceHooks: Send + Sync + 'static {
    /// Once, when an instance first runs (`instance_ready_command`); an error removes it.
    async fn ready(&self, info: &ConnectInfo) -> Result<(), String>;
    /// Before an acquisition is handed out; errors count towards `failure_threshold`.
    async fn heartbeat(&self, info: &ConnectInfo) -> Result<(), String>;
    /// Just before an idle instance is handed to the plugin for removal (its connection still
    /// up): remove what the runner keeps on it across jobs. Errors are the hook's to report.
    async fn removing(&self, _id: &str) {}
    /// Whether the instance is about to be taken away by its cloud (a spot instance's
    /// interruption notice): `Some(time left)`, or `None`. Asked every
    /// `preemption_check_interval`; an error is logged and asked again next time.
    async fn preemption(&self, _info: &ConnectInfo) -> Result<Option<std::time::Duration>, String> {
        Ok(None)
    }
}
