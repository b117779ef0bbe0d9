//! SSH connections to a runner's instances, one per instance, shared by its jobs and health checks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use slipway_connector::{Client, ConnectError, DialOptions, ExitStatus, HostKeyStore};
use slipway_executor::docker::DockerExecutor;
use slipway_fleeting::{ConnectInfo, InstanceGroup};
use slipway_taskscaler::InstanceHooks;

use crate::chain::Chain;

/// A heartbeat this recent vouches for the instance.
const HEARTBEAT_FRESH: Duration = Duration::from_secs(2);
/// How long `instance_ready_command` may run.
const READY_COMMAND_TIMEOUT: Duration = Duration::from_secs(300);

/// A runner's Docker executors by instance (`localhost`: this machine's engine), each keeping
/// its slots' networks warm across jobs.
pub type DockerExecs = Arc<tokio::sync::Mutex<HashMap<String, DockerExecutor>>>;

/// Why the pool has no connection to an instance.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// Dialling the instance, or logging in to it, failed.
    #[error("connecting to instance {instance}")]
    Connect {
        /// The instance's id.
        instance: String,
        /// Why.
        #[source]
        cause: ConnectError,
    },
}

/// Pooled connections with per-instance pinned host keys.
#[derive(Debug)]
pub struct Pool {
    host_keys: HostKeyStore,
    dial: DialOptions,
    clients: Mutex<HashMap<String, Arc<Client>>>,
}

impl Pool {
    /// An empty pool.
    pub fn new(dial: DialOptions) -> Pool {
        Pool {
            host_keys: HostKeyStore::new(),
            dial,
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// A live connection to the instance, dialled on first use.
    pub async fn client(&self, info: &ConnectInfo) -> Result<Arc<Client>, PoolError> {
        if let Some(c) = self.clients().get(&info.id)
            && !c.is_closed()
        {
            return Ok(c.clone());
        }
        // Dial without holding the lock: one slow instance must not stall jobs on others.
        let client = Client::connect(info, &self.dial, &self.host_keys)
            .await
            .map_err(|cause| PoolError::Connect {
                instance: info.id.clone(),
                cause,
            })?;
        let mut clients = self.clients();
        clients.retain(|_, c| !c.is_closed());
        // If another job connected meanwhile, share its connection; ours closes on drop.
        Ok(clients
            .entry(info.id.clone())
            .or_insert_with(|| Arc::new(client))
            .clone())
    }

    /// Run `cmd` on the instance over its connection (dialled again if it closed): its exit
    /// status, stdout and stderr, or why it could not run.
    pub async fn run(
        &self,
        info: &ConnectInfo,
        cmd: &str,
    ) -> Result<(ExitStatus, Vec<u8>, Vec<u8>), String> {
        let client = self.client(info).await.map_err(|e| Chain(&e).to_string())?;
        client
            .run_capture(cmd, Vec::new())
            .await
            .map_err(|e| e.to_string())
    }

    /// GitLab's acquire heartbeat: whether the instance runs `exit 0` over its connection.
    pub async fn answers(&self, info: &ConnectInfo) -> Result<(), String> {
        match self.run(info, "exit 0").await? {
            (st, _, _) if st.success() => Ok(()),
            (st, _, _) => Err(format!("`exit 0` returned {st}")),
        }
    }

    /// Close every connection.
    pub async fn close_all(&self) {
        let clients: Vec<Arc<Client>> = self.clients().drain().map(|(_, c)| c).collect();
        for c in clients {
            if let Ok(c) = Arc::try_unwrap(c) {
                // Bounded: an instance deleted meanwhile may never take the goodbye.
                let _ = tokio::time::timeout(std::time::Duration::from_secs(5), c.close()).await;
            }
        }
    }

    fn clients(&self) -> MutexGuard<'_, HashMap<String, Arc<Client>>> {
        // Poisoning only means a panic elsewhere; the map is still consistent.
        self.clients.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The taskscaler's health checks, done through the pool and the plugin.
pub struct Checks {
    /// Connections.
    pub pool: Arc<Pool>,
    /// The instance group (for its own `Heartbeat`).
    pub group: Arc<dyn InstanceGroup>,
    /// `instance_ready_command`, if any.
    pub ready_command: Option<String>,
    /// `preemption_check_command`, if any.
    pub preemption_command: Option<String>,
    /// When each instance last passed a heartbeat.
    pub alive: Mutex<HashMap<String, Instant>>,
    /// The runner's Docker executors: an instance's goes (its networks removed) with it.
    pub docker_execs: DockerExecs,
    /// Instances' cgroup subtrees on this host (the local plugin's): removed with them.
    pub subtrees: Option<Arc<crate::runner::subtrees::InstanceSubtrees>>,
}

impl Checks {
    /// Its executor's warm slot networks, while its engine is still reachable: on an engine
    /// the instance shares (the local plugin's share this host's) they would outlive it.
    /// Forgotten once done: cut short (the manager stopping), the runner's shutdown removes
    /// them.
    async fn remove_slot_networks(&self, id: &str) {
        let Some(exec) = self.docker_execs.lock().await.get(id).cloned() else {
            return;
        };
        if let Err(e) = exec.shutdown().await {
            tracing::warn!(instance = %id, "removing the instance's slot networks: {e}");
        }
        self.docker_execs.lock().await.remove(id);
    }

    fn recently_alive(&self, id: &str) -> bool {
        self.alive
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .is_some_and(|t| t.elapsed() < HEARTBEAT_FRESH)
    }
}

impl std::fmt::Debug for Checks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checks")
            .field("ready_command", &self.ready_command)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl InstanceHooks for Checks {
    async fn ready(&self, info: &ConnectInfo) -> Result<(), String> {
        let Some(cmd) = &self.ready_command else {
            return Ok(());
        };
        let run = self.pool.run(info, cmd);
        match tokio::time::timeout(READY_COMMAND_TIMEOUT, run).await {
            Err(_) => Err(format!(
                "instance_ready_command did not finish within {READY_COMMAND_TIMEOUT:?}"
            )),
            Ok(Err(e)) => Err(e),
            Ok(Ok((st, _, _))) if st.success() => Ok(()),
            Ok(Ok((st, _, err))) => Err(format!(
                "instance_ready_command failed ({st}): {}",
                String::from_utf8_lossy(&err).trim()
            )),
        }
    }

    async fn heartbeat(&self, info: &ConnectInfo) -> Result<(), String> {
        // An instance proven alive a moment ago is not asked again: back-to-back jobs on one
        // instance would otherwise pay a round trip each for no new information.
        if self.recently_alive(&info.id) {
            return Ok(());
        }
        self.group
            .heartbeat(&info.id)
            .await
            .map_err(|e| e.to_string())?;
        self.pool.answers(info).await?;
        self.alive
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(info.id.clone(), Instant::now());
        Ok(())
    }

    async fn preemption(&self, info: &ConnectInfo) -> Result<Option<Duration>, String> {
        let Some(cmd) = &self.preemption_command else {
            return Ok(None);
        };
        let (st, out, _) = self.pool.run(info, cmd).await?;
        // No notice: the command fails (curl -f on EC2's 404) or says nothing.
        if !st.success() {
            return Ok(None);
        }
        let now = std::time::SystemTime::now();
        Ok(crate::runner::preemption::notice(
            &String::from_utf8_lossy(&out),
            now,
        ))
    }

    async fn removing(&self, id: &str) {
        // Both at once: the taskscaler gives this hook a bounded time, and a subtree still
        // holding processes takes its cleanup's whole timeout.
        let subtree = async {
            if let Some(s) = &self.subtrees {
                s.remove(id).await;
            }
        };
        tokio::join!(subtree, self.remove_slot_networks(id));
    }
}
