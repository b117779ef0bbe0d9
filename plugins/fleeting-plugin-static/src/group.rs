//! [`StaticGroup`]: the instance group over the configured hosts.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use slipway_connector::HostKeyStore;
use slipway_fleeting::sdk::log;
use slipway_fleeting::{
    ConnectInfo, ConnectorConfig, GroupError, InstanceGroup, ProviderInfo, State,
};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Level;

use crate::addr::probe;
use crate::config::Config;
use crate::host::Host;
use crate::state::{self, Phase};

/// How long `shutdown` lets running cleanups finish before stopping them (a restarted plugin
/// runs them again).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The static instance group. Create with `Default`, then `init`.
#[derive(Debug, Default)]
pub struct StaticGroup {
    shared: Arc<Shared>,
    // Every cleanup task lives here: dropping the group aborts them.
    tasks: Mutex<JoinSet<()>>,
    // Cancelled by `shutdown`: cleanups stop and stay recorded as pending.
    cancel: CancellationToken,
}

#[derive(Debug, Default)]
struct Shared {
    ready: OnceLock<Ready>,
    // In-memory copy of the state file; changed only through `commit`.
    state: Mutex<state::State>,
    // Serialises read-modify-write-save of the state so saves never go backwards.
    commit: tokio::sync::Mutex<()>,
    // Serialises increase's pick-probe-lease so two calls cannot lease one host.
    scale: tokio::sync::Mutex<()>,
    // Leases whose cleanup task runs in this process.
    cleaning: Mutex<HashSet<String>>,
}

/// Everything `init` established.
#[derive(Debug)]
struct Ready {
    config: Config,
    hosts: BTreeMap<String, Host>,
    pins: HostKeyStore,
    state_path: PathBuf,
    // Held for the group's lifetime.
    _lock: state::DirLock,
}

fn provider(e: impl std::fmt::Display) -> GroupError {
    GroupError::Provider(e.to_string())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section is a plain field update or clone: a poisoned value is consistent.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    fn ready(&self) -> Result<&Ready, GroupError> {
        self.ready
            .get()
            .ok_or_else(|| GroupError::FailedPrecondition("init has not been called".into()))
    }

    fn snapshot(&self) -> state::State {
        lock(&self.state).clone()
    }

    /// Apply `f` to the state as on disk now (another process may have changed it) and save
    /// it; memory changes only once the file is written.
    async fn commit<R>(&self, f: impl FnOnce(&mut state::State) -> R) -> Result<R, GroupError> {
        let ready = self.ready()?;
        let _guard = self.commit.lock().await;
        let _file = state::lock_state(&ready.config.state_dir)
            .await
            .map_err(provider)?;
        let mut next = state::load(&ready.state_path).await.map_err(provider)?;
        let out = f(&mut next);
        state::save(&ready.state_path, &next)
            .await
            .map_err(provider)?;
        *lock(&self.state) = next;
        Ok(out)
    }

    /// The host behind a listed lease (`Leased` or `Cleaning`).
    fn leased_host(&self, id: &str) -> Result<(&Host, Phase), GroupError> {
        let ready = self.ready()?;
        let lease = lock(&self.state).leases.get(id).cloned();
        match lease {
            Some(l) if !matches!(l.phase, Phase::Failed { .. }) => ready
                .hosts
                .get(&l.host)
                .map(|h| (h, l.phase))
                .ok_or_else(|| GroupError::NotFound(id.to_owned())),
            _ => Err(GroupError::NotFound(id.to_owned())),
        }
    }
}

impl StaticGroup {
    /// Run the cleanup of lease `id` in the background, unless one already runs here or in
    /// another process sharing the state dir.
    async fn spawn_cleanup(&self, id: &str) {
        if lock(&self.shared.cleaning).contains(id) {
            return;
        }
        let Ok(ready) = self.shared.ready() else {
            return;
        };
        let claim = match state::lock_cleanup(&ready.config.state_dir, id).await {
            Ok(Some(claim)) => claim,
            // Another process (or another call here) cleans it; the state file tells the end.
            Ok(None) => return,
            Err(e) => {
                log(
                    Level::ERROR,
                    "cannot claim a cleanup",
                    &[("instance", &id), ("error", &e)],
                );
                return;
            }
        };
        // Claimed: clean only if the lease still waits for it on disk. Another process may
        // have finished it (and the host been leased again) since this one last read the file.
        if self.refresh().await.is_err()
            || !lock(&self.shared.state)
                .leases
                .get(id)
                .is_some_and(|l| l.phase != Phase::Leased)
        {
            return;
        }
        if !lock(&self.shared.cleaning).insert(id.to_owned()) {
            return;
        }
        let shared = Arc::clone(&self.shared);
        let cancel = self.cancel.clone();
        let id = id.to_owned();
        let mut tasks = lock(&self.tasks);
        // Reap finished tasks so the set does not grow without bound.
        while tasks.try_join_next().is_some() {}
        tasks.spawn(async move {
            tokio::select! {
                biased;
                // Stopped by shutdown: the lease stays `Cleaning` on disk and is resumed.
                _ = cancel.cancelled() => {}
                _ = clean(&shared, &id) => {}
            }
            lock(&shared.cleaning).remove(&id);
            // The lease is gone once cleaned: so is its lock (lease ids never repeat).
            if let Ok(ready) = shared.ready()
                && !lock(&shared.state).leases.contains_key(&id)
            {
                let _ =
                    std::fs::remove_file(state::cleanup_lock_path(&ready.config.state_dir, &id));
            }
            drop(claim);
        });
    }

    /// Leases of hosts still configured; drop the others (the operator removed the host) when
    /// no other process shares the dir (its config may still list them).
    async fn adopt(&self, alone: bool) -> Result<(), GroupError> {
        let ready = self.shared.ready()?;
        let orphans: Vec<(String, String)> = self
            .shared
            .snapshot()
            .leases
            .into_iter()
            .filter(|(_, l)| !ready.hosts.contains_key(&l.host))
            .map(|(id, l)| (id, l.host))
            .collect();
        if !orphans.is_empty() && alone {
            for (id, host) in &orphans {
                log(
                    Level::WARN,
                    "dropping lease of a host no longer configured",
                    &[("instance", id), ("host", host)],
                );
            }
            self.shared
                .commit(|s| {
                    for (id, _) in &orphans {
                        s.leases.remove(id);
                    }
                })
                .await?;
        }
        // Resume cleanups a previous process did not finish, and retry failed ones: the
        // operator may have fixed the host (restarting the plugin is how to ask for a retry).
        for (id, lease) in self.shared.snapshot().leases {
            if lease.phase != Phase::Leased {
                log(
                    Level::INFO,
                    "resuming cleanup",
                    &[("instance", &id), ("host", &lease.host)],
                );
                self.spawn_cleanup(&id).await;
            }
        }
        Ok(())
    }

    /// Read the state file afresh: another process sharing the state dir may have leased or
    /// given back hosts.
    async fn refresh(&self) -> Result<(), GroupError> {
        let ready = self.shared.ready()?;
        // Not between another task's load and its write to memory: that would bring back an
        // older state.
        let _guard = self.shared.commit.lock().await;
        let fresh = state::load(&ready.state_path).await.map_err(provider)?;
        *lock(&self.shared.state) = fresh;
        Ok(())
    }
}

/// Clean the host of lease `id` and give it back, or hold it back when the cleanup fails.
async fn clean(shared: &Shared, id: &str) {
    let Ok(ready) = shared.ready() else { return };
    let Some(lease) = lock(&shared.state).leases.get(id).cloned() else {
        return;
    };
    let Some(host) = ready.hosts.get(&lease.host) else {
        return;
    };
    let outcome = match &ready.config.cleanup_command {
        None => Ok(()),
        Some(cmd) => {
            host.run_cleanup(
                cmd,
                ready.config.cleanup_timeout,
                ready.config.use_external_addr,
                &ready.pins,
            )
            .await
        }
    };
    let committed = match &outcome {
        Ok(()) => {
            shared
                .commit(|s| {
                    s.leases.remove(id);
                })
                .await
        }
        Err(reason) => {
            shared
                .commit(|s| {
                    if let Some(l) = s.leases.get_mut(id) {
                        l.phase = Phase::Failed {
                            reason: reason.clone(),
                        };
                    }
                })
                .await
        }
    };
    match (outcome, committed) {
        (_, Err(e)) => log(
            // Still `Cleaning` on disk and in memory: the next update retries.
            Level::ERROR,
            "cannot record the cleanup",
            &[("instance", &id), ("host", &host.name), ("error", &e)],
        ),
        (Ok(()), Ok(())) => log(
            Level::INFO,
            "host cleaned and free again",
            &[("instance", &id), ("host", &host.name)],
        ),
        (Err(reason), Ok(())) => log(
            Level::ERROR,
            "cleanup failed: host held back until the plugin restarts",
            &[("instance", &id), ("host", &host.name), ("reason", &reason)],
        ),
    }
}

#[async_trait]
impl InstanceGroup for StaticGroup {
    async fn init(
        &self,
        plugin_config: &[u8],
        connector: &ConnectorConfig,
    ) -> Result<ProviderInfo, GroupError> {
        if self.shared.ready.get().is_some() {
            return Err(GroupError::FailedPrecondition("init called twice".into()));
        }
        let invalid = |e: crate::config::ConfigError| GroupError::InvalidArgument(e.to_string());
        let config = Config::parse(plugin_config).map_err(invalid)?;
        let mut hosts = BTreeMap::new();
        for (name, cfg) in &config.instances {
            hosts.insert(
                name.clone(),
                Host::resolve(cfg, connector).await.map_err(invalid)?,
            );
        }
        tokio::fs::create_dir_all(&config.state_dir)
            .await
            .map_err(|e| {
                GroupError::InvalidArgument(format!(
                    "plugin_config: state_dir: cannot create {}: {e}",
                    config.state_dir.display()
                ))
            })?;
        let (dir_lock, alone) = state::lock_dir(&config.state_dir)
            .await
            .map_err(|e| match e {
                e @ state::StateError::InUse { .. } => GroupError::InvalidArgument(e.to_string()),
                e => provider(e),
            })?;
        let state_path = config.state_dir.join("state.json");
        let loaded = state::load(&state_path).await.map_err(provider)?;
        let pins = HostKeyStore::open(config.state_dir.join("known_hosts"))
            .await
            .map_err(provider)?;
        let info = ProviderInfo {
            id: format!("static/{}", config.name),
            max_size: hosts.len() as u64,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            build_info: format!("fleeting-plugin-static {}", env!("CARGO_PKG_VERSION")),
            capabilities: Vec::new(),
        };
        log(
            Level::INFO,
            "static group initialised",
            &[
                ("group", &info.id),
                ("hosts", &hosts.len()),
                ("leases", &loaded.leases.len()),
                ("state_dir", &config.state_dir.display()),
            ],
        );
        *lock(&self.shared.state) = loaded;
        let ready = Ready {
            config,
            hosts,
            pins,
            state_path,
            _lock: dir_lock,
        };
        if self.shared.ready.set(ready).is_err() {
            return Err(GroupError::FailedPrecondition("init called twice".into()));
        }
        self.adopt(alone).await?;
        Ok(info)
    }

    async fn update(&self) -> Result<Vec<(String, State)>, GroupError> {
        self.refresh().await?;
        let mut out = Vec::new();
        for (id, lease) in self.shared.snapshot().leases {
            match lease.phase {
                Phase::Leased => out.push((id, State::Running)),
                Phase::Cleaning => {
                    // No task: its result could not be saved last time (or the process that
                    // cleaned it is gone); try again.
                    self.spawn_cleanup(&id).await;
                    out.push((id, State::Deleting));
                }
                // Not listed: for the taskscaler the instance is gone.
                Phase::Failed { .. } => {}
            }
        }
        Ok(out)
    }

    async fn increase(&self, delta: u32) -> Result<u32, GroupError> {
        let ready = self.shared.ready()?;
        let _scale = self.shared.scale.lock().await;
        self.refresh().await?;
        let state = self.shared.snapshot();
        let mut free: Vec<&Host> = ready
            .hosts
            .values()
            .filter(|h| state.lease_of(&h.name).is_none())
            .collect();
        let mut picked: Vec<String> = Vec::new();
        // Probe only as many hosts at a time as are still wanted, in parallel.
        while picked.len() < delta as usize && !free.is_empty() {
            let want = (delta as usize - picked.len()).min(free.len());
            let batch: Vec<&Host> = free.drain(..want).collect();
            let mut probes = JoinSet::new();
            for (i, h) in batch.iter().enumerate() {
                let addr = h.dial_addr(ready.config.use_external_addr).to_owned();
                let timeout = ready.config.probe_timeout;
                probes.spawn(async move { (i, probe(&addr, timeout).await) });
            }
            let mut results = Vec::new();
            while let Some(r) = probes.join_next().await {
                results.push(r.map_err(provider)?);
            }
            results.sort_by_key(|(i, _)| *i);
            for (i, r) in results {
                let Some(h) = batch.get(i) else { continue };
                match r {
                    Ok(()) => picked.push(h.name.clone()),
                    Err(reason) => log(
                        Level::WARN,
                        "host unreachable: not handed out",
                        &[
                            ("host", &h.name),
                            ("addr", &h.dial_addr(ready.config.use_external_addr)),
                            ("reason", &reason),
                        ],
                    ),
                }
            }
        }
        if picked.is_empty() {
            return Ok(0);
        }
        // A host another process leased since the state was read is not leased twice.
        let leased = self
            .shared
            .commit(|s| {
                let mut leased = Vec::new();
                for h in &picked {
                    if s.lease_of(h).is_none() {
                        leased.push((s.lease(h), h.clone()));
                    }
                }
                leased
            })
            .await?;
        let (ids, picked): (Vec<String>, Vec<String>) = leased.into_iter().unzip();
        for (id, host) in ids.iter().zip(&picked) {
            log(
                Level::INFO,
                "host leased",
                &[("instance", id), ("host", host)],
            );
        }
        Ok(ids.len() as u32)
    }

    async fn decrease(&self, ids: &[String]) -> Result<Vec<String>, GroupError> {
        self.refresh().await?;
        let state = self.shared.snapshot();
        let accepted: Vec<String> = ids
            .iter()
            .filter(|id| {
                state
                    .leases
                    .get(id.as_str())
                    .is_some_and(|l| matches!(l.phase, Phase::Leased | Phase::Cleaning))
            })
            .cloned()
            .collect();
        // Recorded before any cleanup starts, so a restarted plugin resumes it.
        self.shared
            .commit(|s| {
                for id in &accepted {
                    if let Some(l) = s.leases.get_mut(id) {
                        l.phase = Phase::Cleaning;
                    }
                }
            })
            .await?;
        for id in &accepted {
            self.spawn_cleanup(id).await;
        }
        Ok(accepted)
    }

    async fn connect_info(&self, id: &str) -> Result<ConnectInfo, GroupError> {
        let (host, _) = self.shared.leased_host(id)?;
        Ok(host.connect_info(id))
    }

    async fn heartbeat(&self, id: &str) -> Result<(), GroupError> {
        let ready = self.shared.ready()?;
        let (host, _) = self.shared.leased_host(id)?;
        let addr = host.dial_addr(ready.config.use_external_addr);
        probe(addr, ready.config.probe_timeout)
            .await
            .map_err(|reason| {
                GroupError::Provider(format!(
                    "instance {id} (host {} at {addr}) unreachable: {reason}",
                    host.name
                ))
            })
    }

    async fn shutdown(&self) -> Result<(), GroupError> {
        // Hosts stay leased: giving them back is the manager's call. Running cleanups get a
        // grace period, then stop; they stay pending on disk and resume at the next start.
        let mut tasks = std::mem::take(&mut *lock(&self.tasks));
        let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            self.cancel.cancel();
            tasks.shutdown().await;
        }
        Ok(())
    }
}
