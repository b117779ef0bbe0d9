//! Host side: start a `fleeting-plugin-<name>` process the go-plugin way (see
//! [`slipway_goplugin::process`]) and expose it as an [`InstanceGroup`].
//!
//! The process is supervised: when it dies it is restarted with backoff and re-initialized with
//! the last `init`, so callers only see a short wait.

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use slipway_goplugin::process::{self, MAX_MESSAGE_SIZE};
use slipway_goplugin::{CallError, Connection, PluginProcess, ProcessOptions, Reinit};
use tonic::transport::Channel;

use crate::convert::{
    connect_info_from_pb, connector_to_pb, info_from_pb, state_from_pb, status_to_error,
};
use crate::group::{ConnectInfo, ConnectorConfig, GroupError, InstanceGroup, ProviderInfo, State};
use crate::proto::fleeting::v1 as pb;
use crate::proto::fleeting::v1::instance_group_client::InstanceGroupClient;

pub use slipway_goplugin::HostError;

pub use crate::oci::PLUGIN_PREFIX;

/// How to start and supervise one plugin, and the `init` it gets.
#[derive(Clone)]
pub struct PluginOptions {
    /// The process: name, executable (see [`find_plugin`]), timeouts, restarts, environment.
    pub process: ProcessOptions,
    /// Plugin config JSON used by [`PluginHost::init_from_options`].
    pub plugin_config: Vec<u8>,
    /// Connector settings used by [`PluginHost::init_from_options`].
    pub connector: ConnectorConfig,
}

impl PluginOptions {
    /// Options with go-plugin's defaults (60 s handshake, AutoMTLS, 200 ms → 5 s backoff).
    pub fn new(name: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        PluginOptions {
            process: ProcessOptions::new(name, path),
            plugin_config: b"{}".to_vec(),
            connector: ConnectorConfig::default(),
        }
    }

    /// Set the plugin config JSON.
    pub fn plugin_config(mut self, json: impl Into<Vec<u8>>) -> Self {
        self.plugin_config = json.into();
        self
    }

    /// Set the connector settings.
    pub fn connector(mut self, connector: ConnectorConfig) -> Self {
        self.connector = connector;
        self
    }

    /// Change the process options.
    pub fn process(mut self, f: impl FnOnce(ProcessOptions) -> ProcessOptions) -> Self {
        self.process = f(self.process);
        self
    }

    /// Set the handshake timeout.
    pub fn handshake_timeout(self, timeout: Duration) -> Self {
        self.process(|p| p.handshake_timeout(timeout))
    }

    /// Set how many consecutive restarts are attempted before giving up.
    pub fn max_restarts(self, n: u32) -> Self {
        self.process(|p| p.max_restarts(n))
    }

    /// Set how long RPCs wait for a restart in progress.
    pub fn call_wait(self, wait: Duration) -> Self {
        self.process(|p| p.call_wait(wait))
    }

    /// Turn AutoMTLS on or off.
    pub fn auto_mtls(self, on: bool) -> Self {
        self.process(|p| p.auto_mtls(on))
    }

    /// Add an environment variable for the plugin.
    pub fn env(self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.process(|p| p.env(key, value))
    }
}

impl fmt::Debug for PluginOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // plugin_config may carry cloud credentials: show its size only.
        f.debug_struct("PluginOptions")
            .field("process", &self.process)
            .field("plugin_config_len", &self.plugin_config.len())
            .field("connector", &self.connector)
            .finish()
    }
}

/// Resolve a plugin reference to an executable.
///
/// A path (absolute, `./`, `../`, or an existing relative path with a `/`) is used as it is.
/// Otherwise the reference (a name, or an OCI reference such as
/// `gitlab-org/fleeting/plugins/aws:1`) is looked up as `fleeting-plugin-<name>` in
/// `plugin_dir`, then where GitLab Runner installs plugins ([`crate::oci`]), then next to the
/// current executable (and its parent when that is cargo's `deps`, so binaries of the same
/// target dir are found) and on `PATH`.
pub fn find_plugin(reference: &str, plugin_dir: Option<&Path>) -> Result<PathBuf, HostError> {
    find_plugin_in(reference, plugin_dir, crate::oci::plugin_root().as_deref())
}

/// [`find_plugin`] with GitLab Runner's plugin root given.
fn find_plugin_in(
    reference: &str,
    plugin_dir: Option<&Path>,
    oci_root: Option<&Path>,
) -> Result<PathBuf, HostError> {
    if let Some(found) = process::as_path(reference) {
        return found;
    }
    let oci = crate::oci::Reference::parse(reference);
    let name = oci.as_ref().map_or(reference, |r| r.name.as_str());
    if name.is_empty() {
        return Err(HostError::NotFound {
            name: reference.to_owned(),
            looked: Vec::new(),
        });
    }
    let file = if name.starts_with(PLUGIN_PREFIX) {
        name.to_owned()
    } else {
        format!("{PLUGIN_PREFIX}{name}")
    };
    let mut looked = Vec::new();
    // 1. The operator's own plugin directory wins.
    if let Some(found) = process::find_in(&file, plugin_dir.map(Path::to_path_buf), &mut looked) {
        return Ok(found);
    }
    // 2. Where `gitlab-runner fleeting install` put it (an OCI reference, or a bare name).
    if let (Some(r), Some(root)) = (&oci, oci_root) {
        if let Some(found) =
            crate::oci::find_installed(r, root).filter(|p| process::is_executable(p))
        {
            return Ok(found);
        }
        looked.push(r.dir(root));
    }
    // 3. Next to this executable (and cargo's target dir above `deps`), then PATH.
    process::find_in(&file, process::search_dirs(), &mut looked).ok_or(HostError::NotFound {
        name: reference.to_owned(),
        looked,
    })
}

/// The last `init`, re-sent to a restarted process.
type LastInit = Arc<Mutex<Option<(Vec<u8>, ConnectorConfig)>>>;

/// A running, supervised plugin process, usable as an [`InstanceGroup`].
pub struct PluginHost {
    process: PluginProcess,
    plugin_config: Vec<u8>,
    connector: ConnectorConfig,
    last_init: LastInit,
}

impl fmt::Debug for PluginHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginHost")
            .field("process", &self.process)
            .finish()
    }
}

fn client(channel: Channel) -> InstanceGroupClient<Channel> {
    InstanceGroupClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_SIZE)
        .max_encoding_message_size(MAX_MESSAGE_SIZE)
}

impl PluginHost {
    /// Start the plugin, complete the handshake, connect and health-check it.
    ///
    /// Does not call `Init`: call [`InstanceGroup::init`] or [`PluginHost::init_from_options`].
    pub async fn start(opts: PluginOptions) -> Result<PluginHost, HostError> {
        let last_init: LastInit = Arc::default();
        let remembered = last_init.clone();
        let name = opts.process.name.clone();
        let reinit: Reinit = Arc::new(move |channel| {
            let last = remembered.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let name = name.clone();
            Box::pin(async move {
                let Some((plugin_config, connector)) = last else {
                    return Ok(());
                };
                let req = pb::InitRequest {
                    plugin_config,
                    connector: Some(connector_to_pb(&connector)),
                };
                client(channel)
                    .init(req)
                    .await
                    .map(drop)
                    .map_err(|s| status_to_error(&name, &s).to_string())
            })
        });
        let process = PluginProcess::start(opts.process, crate::PROTOCOL, Some(reinit)).await?;
        Ok(PluginHost {
            process,
            plugin_config: opts.plugin_config,
            connector: opts.connector,
            last_init,
        })
    }

    /// Plugin name.
    pub fn name(&self) -> &str {
        self.process.name()
    }

    /// Process id of the current plugin process (also its process group id).
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// How many times the plugin was restarted after dying.
    pub fn restarts(&self) -> u32 {
        self.process.restarts()
    }

    /// `init` with the options' plugin config and connector.
    pub async fn init_from_options(&self) -> Result<ProviderInfo, GroupError> {
        self.init(&self.plugin_config, &self.connector).await
    }

    /// Stop the plugin: `GRPCController.Shutdown`, up to 2 s grace, SIGKILL the process group,
    /// reap, stop the supervisor and drains, remove the socket directory. Idempotent.
    pub async fn stop(&self) {
        self.process.stop().await;
    }

    /// Run one RPC (retried once across a restart), in the group's error vocabulary.
    async fn call<T, F, Fut>(&self, rpc: &str, f: F) -> Result<T, GroupError>
    where
        F: Fn(InstanceGroupClient<Channel>) -> Fut + Send + Sync,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>> + Send,
        T: Send,
    {
        self.process
            .call(rpc, |c: Connection| f(client(c.channel)))
            .await
            .map_err(|e| match e {
                CallError::Unavailable(message) => GroupError::Unavailable {
                    plugin: self.name().to_owned(),
                    message,
                },
                CallError::Status(s) => status_to_error(self.name(), &s),
            })
    }
}

#[async_trait]
impl InstanceGroup for PluginHost {
    async fn init(
        &self,
        plugin_config: &[u8],
        connector: &ConnectorConfig,
    ) -> Result<ProviderInfo, GroupError> {
        let req = pb::InitRequest {
            plugin_config: plugin_config.to_vec(),
            connector: Some(connector_to_pb(connector)),
        };
        let resp = self
            .call("Init", |mut c: InstanceGroupClient<Channel>| {
                let req = req.clone();
                async move { c.init(req).await }
            })
            .await?;
        // Remembered so a restarted process is initialized the same way.
        *self.last_init.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((plugin_config.to_vec(), connector.clone()));
        Ok(info_from_pb(resp.info.unwrap_or_default()))
    }

    async fn update(&self) -> Result<Vec<(String, State)>, GroupError> {
        let resp = self
            .call("Update", |mut c: InstanceGroupClient<Channel>| async move {
                c.update(pb::UpdateRequest {}).await
            })
            .await?;
        Ok(resp
            .instances
            .into_iter()
            .map(|i| (i.id, state_from_pb(i.state)))
            .collect())
    }

    async fn increase(&self, delta: u32) -> Result<u32, GroupError> {
        let resp = self
            .call(
                "Increase",
                |mut c: InstanceGroupClient<Channel>| async move {
                    c.increase(pb::IncreaseRequest { delta }).await
                },
            )
            .await?;
        Ok(resp.succeeded)
    }

    async fn decrease(&self, ids: &[String]) -> Result<Vec<String>, GroupError> {
        let req = pb::DecreaseRequest { ids: ids.to_vec() };
        let resp = self
            .call("Decrease", |mut c: InstanceGroupClient<Channel>| {
                let req = req.clone();
                async move { c.decrease(req).await }
            })
            .await?;
        Ok(resp.succeeded)
    }

    async fn connect_info(&self, id: &str) -> Result<ConnectInfo, GroupError> {
        let req = pb::ConnectInfoRequest { id: id.to_owned() };
        let resp = self
            .call("ConnectInfo", |mut c: InstanceGroupClient<Channel>| {
                let req = req.clone();
                async move { c.connect_info(req).await }
            })
            .await?;
        connect_info_from_pb(resp).map_err(GroupError::Provider)
    }

    async fn heartbeat(&self, id: &str) -> Result<(), GroupError> {
        let req = pb::HeartbeatRequest { id: id.to_owned() };
        self.call("Heartbeat", |mut c: InstanceGroupClient<Channel>| {
            let req = req.clone();
            async move { c.heartbeat(req).await }
        })
        .await?;
        Ok(())
    }

    async fn shutdown(&self) -> Result<(), GroupError> {
        self.call(
            "Shutdown",
            |mut c: InstanceGroupClient<Channel>| async move {
                c.shutdown(pb::ShutdownRequest {}).await
            },
        )
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn executable(path: &Path) {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn plugin_dir_first_then_gitlab_runners_layout_then_the_name() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("fleeting");
        let installed =
            root.join("registry.gitlab.com/gitlab-org/fleeting/plugins/zz9/1.2.0/plugin");
        executable(&installed);
        let own = tmp.path().join("own");
        executable(&own.join("fleeting-plugin-zz9"));
        // The operator's --plugin-dir wins over what GitLab Runner installed.
        let found = find_plugin_in("zz9", Some(&own), Some(&root)).ok();
        assert_eq!(found, Some(own.join("fleeting-plugin-zz9")));
        // Without it, a bare name and an OCI reference both find GitLab Runner's install.
        assert_eq!(
            find_plugin_in("zz9", None, Some(&root)).ok(),
            Some(installed.clone())
        );
        assert_eq!(
            find_plugin_in("gitlab-org/fleeting/plugins/zz9:1", None, Some(&root)).ok(),
            Some(installed)
        );
        // A constraint no installed version meets: not found, and the error says where it looked.
        let err = find_plugin_in("zz9:2", None, Some(&root))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("plugins/zz9"), "{err}");
    }

    #[test]
    fn options_debug_hides_config() {
        let o = PluginOptions::new("x", "/bin/true")
            .plugin_config(r#"{"secret":"s3cr3t"}"#)
            .env("TOKEN", "t0k");
        let s = format!("{o:?}");
        assert!(!s.contains("s3cr3t") && !s.contains("t0k"), "{s}");
    }
}
