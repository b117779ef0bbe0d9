//! `fleeting-plugin-local`: an instance group whose instances are OpenSSH sshd hosts on this
//! machine — each in its own network namespace (as root) or on its own loopback port.
//!
//! State lives on disk under the configured `dir` so a restarted plugin finds its instances:
//! the sshd processes daemonize (they are not the plugin's children) and are tracked through
//! their PidFiles. Layout:
//!
//! ```text
//! <dir>/id_ed25519{,.pub}            client key pair handed out in ConnectInfo
//! <dir>/instances/<id>/              one instance
//!     sshd_config sshd.pid sshd.log ssh_host_ed25519_key{,.pub} authorized_keys home/
//!     net                            "loopback <port>" | "netns <name> <index>" (a namespace is
//!                                    recorded before it is created: it may be half made)
//!     ready | deleting | failed      state markers (failed holds the reason)
//! <dir>/instances/.trash-<id>/       a deleted instance's directory while it is removed
//! ```
//!
//! An instance directory is never recreated once gone: that is what "deleted" means, so a
//! provisioning step racing a finished deletion fails instead of resurrecting the instance.
//!
//! - [`config`]: the plugin's `plugin_config` JSON.
//! - [`instance`]: one instance: its directory, sshd configuration and sshd process.
//! - [`network`]: a network namespace, veth pair and /30 subnet per instance, made in idempotent
//!   steps so a restarted plugin reuses or removes what a killed one left.
//! - `process`: running helper programs, and finding and killing an instance's processes
//!   through /proc.

pub mod config;
pub mod instance;
pub mod network;
mod process;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use slipway_fleeting::{
    ConnectInfo, ConnectorConfig, GroupError, InstanceGroup, ProviderInfo, State,
};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, NetworkMode};
use crate::instance::{Instance, InstanceError, StartEnv};
use crate::process::run;

/// How long `shutdown` waits for in-flight deletions before aborting them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The local instance group. Create with `Default`, then `init`.
#[derive(Debug, Default)]
pub struct LocalGroup {
    shared: Arc<Shared>,
    // Every background task (provisioning, deletion) lives here: dropping the group aborts them.
    tasks: Mutex<JoinSet<()>>,
    // Parent of every provisioning task's token; cancelled by `shutdown`.
    cancel: CancellationToken,
}

#[derive(Debug, Default)]
struct Shared {
    ready: OnceLock<Ready>,
    // In-flight work per instance id; an id absent here has no task running in this process.
    slots: Mutex<HashMap<String, Slot>>,
    // Serialises increase's count-then-create so concurrent calls cannot exceed max_size.
    scale: tokio::sync::Mutex<()>,
}

#[derive(Debug, Clone)]
struct Slot {
    cancel: CancellationToken,
    // Held by the task working on the instance: deletion waits for provisioning to stop.
    lock: Arc<tokio::sync::Mutex<()>>,
    provisioning: bool,
    deleting: bool,
}

/// Private key bytes that must never be printed.
struct Secret(Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[masked]")
    }
}

/// Everything `init` established.
#[derive(Debug)]
struct Ready {
    config: Config,
    instances_dir: PathBuf,
    env: StartEnv,
    key: Secret,
    user: String,
    connector: ConnectorConfig,
}

fn provider(e: impl fmt::Display) -> GroupError {
    GroupError::Provider(e.to_string())
}

impl Shared {
    fn ready(&self) -> Result<&Ready, GroupError> {
        self.ready
            .get()
            .ok_or_else(|| GroupError::FailedPrecondition("init has not been called".into()))
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<String, Slot>> {
        // Slot updates are single inserts/field writes: a poisoned map is still consistent.
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn slot(&self, id: &str) -> Option<Slot> {
        self.slots().get(id).cloned()
    }

    /// Clear a task's flag; drop the slot once no task works on the instance.
    fn finish(&self, id: &str, provisioning: bool) {
        let mut slots = self.slots();
        if let Some(slot) = slots.get_mut(id) {
            if provisioning {
                slot.provisioning = false;
            } else {
                slot.deleting = false;
            }
            if !slot.provisioning && !slot.deleting {
                slots.remove(id);
            }
        }
    }
}

impl LocalGroup {
    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut tasks = self
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Reap finished tasks so the set does not grow without bound.
        while tasks.try_join_next().is_some() {}
        tasks.spawn(task);
    }

    /// Start (or resume) an instance in the background after `delay`.
    fn spawn_provision(&self, inst: Instance, delay: Duration) -> Result<(), GroupError> {
        let env = self.shared.ready()?.env.clone();
        let slot = {
            let mut slots = self.shared.slots();
            let slot = slots.entry(inst.id.clone()).or_insert_with(|| Slot {
                cancel: self.cancel.child_token(),
                lock: Arc::default(),
                provisioning: false,
                deleting: false,
            });
            if slot.provisioning || slot.deleting {
                return Ok(()); // already being worked on
            }
            slot.provisioning = true;
            slot.clone()
        };
        let shared = Arc::clone(&self.shared);
        self.spawn(async move {
            let _guard = slot.lock.lock().await;
            let sleep = tokio::time::sleep(delay);
            let proceed = tokio::select! {
                biased;
                _ = slot.cancel.cancelled() => false,
                _ = sleep => true,
            };
            // Holding the lock, no deletion of ours runs: but one may have finished while this
            // task waited (directory gone), or the instance may be marked for deletion. Starting
            // it then would resurrect a deleted instance that nobody ever deletes again.
            let proceed = proceed && provisionable(&shared, &inst, &slot).await;
            if proceed {
                match inst.start(&env, &slot.cancel).await {
                    Ok(()) => tracing::info!(instance = %inst.id, "instance running"),
                    Err(InstanceError::Cancelled { .. }) => {}
                    Err(e) if slot.cancel.is_cancelled() => {
                        tracing::debug!(instance = %inst.id, "start interrupted: {e}");
                    }
                    Err(e) => inst.mark_failed(&e.to_string()).await,
                }
            }
            shared.finish(&inst.id, true);
        });
        Ok(())
    }

    /// Delete an instance in the background (stopping any provisioning first).
    ///
    /// Callers mark the instance `deleting` first, so a restarted plugin resumes the deletion.
    fn spawn_delete(&self, inst: Instance) {
        let slot = {
            let mut slots = self.shared.slots();
            let slot = slots.entry(inst.id.clone()).or_insert_with(|| Slot {
                cancel: self.cancel.child_token(),
                lock: Arc::default(),
                provisioning: false,
                deleting: false,
            });
            if slot.deleting {
                return;
            }
            slot.deleting = true;
            slot.cancel.cancel();
            slot.clone()
        };
        let shared = Arc::clone(&self.shared);
        self.spawn(async move {
            let _guard = slot.lock.lock().await;
            match inst.destroy().await {
                Ok(()) => tracing::info!(instance = %inst.id, "instance deleted"),
                // The `deleting` marker stays: the next update retries.
                Err(e) => tracing::warn!(instance = %inst.id, "deleting instance: {e}"),
            }
            shared.finish(&inst.id, false);
        });
    }

    /// The instance named `id`, if its directory exists.
    async fn find(&self, id: &str) -> Result<Instance, GroupError> {
        let ready = self.shared.ready()?;
        if !valid_id(id) {
            return Err(GroupError::NotFound(id.to_owned()));
        }
        let inst = Instance::new(&ready.instances_dir, id);
        if inst.exists().await {
            Ok(inst)
        } else {
            Err(GroupError::NotFound(id.to_owned()))
        }
    }
}

/// Whether a provisioning task (holding the instance's lock) may still start `inst`.
async fn provisionable(shared: &Shared, inst: &Instance, slot: &Slot) -> bool {
    let reason = if slot.cancel.is_cancelled() || shared.slot(&inst.id).is_some_and(|s| s.deleting)
    {
        "deletion requested"
    } else if !inst.exists().await {
        "directory gone"
    } else if inst.is_deleting().await {
        "marked for deletion"
    } else {
        return true;
    };
    tracing::debug!(instance = %inst.id, "not provisioning: {reason}");
    false
}

/// Remove directories of deletions interrupted after their rename (see `Instance::destroy`).
async fn sweep_trash(dir: &Path) {
    let Ok(mut rd) = tokio::fs::read_dir(dir).await else {
        return;
    };
    while let Ok(Some(entry)) = rd.next_entry().await {
        let is_trash = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(instance::TRASH_PREFIX));
        if is_trash && let Err(e) = instance::remove_dir_if_exists(&entry.path()).await {
            tracing::warn!("removing {}: {e}", entry.path().display());
        }
    }
}

/// Ids are single path components we generated: no separators, no dot-files.
fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

async fn list_instances(dir: &Path) -> Result<Vec<Instance>, GroupError> {
    let mut out = Vec::new();
    let mut rd = tokio::fs::read_dir(dir)
        .await
        .map_err(|e| GroupError::Provider(format!("listing {}: {e}", dir.display())))?;
    while let Some(entry) = rd.next_entry().await.map_err(provider)? {
        let is_dir = entry.file_type().await.map(|t| t.is_dir()).unwrap_or(false);
        if let Some(name) = entry.file_name().to_str()
            && is_dir
            && valid_id(name)
        {
            out.push(Instance::new(dir, name));
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Find sshd: the configured path, else `/usr/sbin/sshd`, else PATH. sshd must be started by an
/// absolute path (it re-executes itself).
async fn find_sshd(configured: Option<&Path>) -> Result<PathBuf, GroupError> {
    if let Some(p) = configured {
        let p = if p.is_absolute() {
            p.to_owned()
        } else {
            std::env::current_dir().map_err(provider)?.join(p)
        };
        return if tokio::fs::try_exists(&p).await.unwrap_or(false) {
            Ok(p)
        } else {
            Err(GroupError::InvalidArgument(format!(
                "plugin_config field `sshd_path`: {} does not exist",
                p.display()
            )))
        };
    }
    let mut candidates = vec![PathBuf::from("/usr/sbin/sshd")];
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("sshd")));
    }
    for c in candidates {
        if c.is_absolute() && tokio::fs::try_exists(&c).await.unwrap_or(false) {
            return Ok(c);
        }
    }
    Err(GroupError::Provider(
        "sshd not found (install openssh-server or set sshd_path)".into(),
    ))
}

/// (name, uid, gid) of a user, or of the effective user when `name` is None.
async fn lookup_user(name: Option<String>) -> Result<(String, u32, u32), GroupError> {
    let res = tokio::task::spawn_blocking(move || match &name {
        Some(n) => nix::unistd::User::from_name(n).map(|u| (u, n.clone())),
        None => nix::unistd::User::from_uid(nix::unistd::geteuid()).map(|u| (u, String::new())),
    })
    .await
    .map_err(provider)?;
    match res {
        Ok((Some(u), _)) => Ok((u.name, u.uid.as_raw(), u.gid.as_raw())),
        Ok((None, asked)) if !asked.is_empty() => Err(GroupError::InvalidArgument(format!(
            "plugin_config field `user`: no such user {asked:?}"
        ))),
        Ok((None, _)) => Err(GroupError::Provider(
            "current user has no passwd entry".into(),
        )),
        Err(e) => Err(provider(format!("looking up user: {e}"))),
    }
}

/// The client key pair: the static key from the connector config, or one generated once in
/// `dir`. Returns (private key PEM, authorized_keys line).
async fn client_key(
    dir: &Path,
    connector: &ConnectorConfig,
) -> Result<(Vec<u8>, String), GroupError> {
    if connector.use_static_credentials {
        if connector.key.is_empty() {
            return Err(GroupError::InvalidArgument(
                "use_static_credentials needs a key: local instances accept only public-key logins"
                    .into(),
            ));
        }
        // ssh-keygen derives the public half from a file; keep it 0600 and remove it at once.
        let tmp = dir.join(".static_key.tmp");
        let write = {
            let (tmp, key) = (tmp.clone(), connector.key.clone());
            tokio::task::spawn_blocking(move || {
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&tmp)?;
                f.write_all(&key)
            })
            .await
            .map_err(provider)?
        };
        let derived = match write {
            Ok(()) => {
                run(
                    "ssh-keygen",
                    ["-y".as_ref(), "-f".as_ref(), tmp.as_os_str()],
                )
                .await
            }
            Err(e) => Err(process::CommandError::other(&e.to_string())),
        };
        let _ = tokio::fs::remove_file(&tmp).await;
        let public = derived.map_err(|_| {
            GroupError::InvalidArgument(
                "connector key is not a valid unencrypted private key".into(),
            )
        })?;
        return Ok((connector.key.clone(), public));
    }
    let private = dir.join("id_ed25519");
    let public = dir.join("id_ed25519.pub");
    if !tokio::fs::try_exists(&private).await.unwrap_or(false)
        || !tokio::fs::try_exists(&public).await.unwrap_or(false)
    {
        let _ = tokio::fs::remove_file(&private).await;
        let _ = tokio::fs::remove_file(&public).await;
        run(
            "ssh-keygen",
            [
                "-q".as_ref(),
                "-t".as_ref(),
                "ed25519".as_ref(),
                "-N".as_ref(),
                "".as_ref(),
                "-C".as_ref(),
                "slipway-local".as_ref(),
                "-f".as_ref(),
                private.as_os_str(),
            ],
        )
        .await
        .map_err(provider)?;
    }
    let key = tokio::fs::read(&private).await.map_err(provider)?;
    let public = tokio::fs::read_to_string(&public).await.map_err(provider)?;
    Ok((key, public))
}

#[async_trait]
impl InstanceGroup for LocalGroup {
    async fn init(
        &self,
        plugin_config: &[u8],
        connector: &ConnectorConfig,
    ) -> Result<ProviderInfo, GroupError> {
        if self.shared.ready.get().is_some() {
            return Err(GroupError::FailedPrecondition("init called twice".into()));
        }
        let config =
            Config::parse(plugin_config).map_err(|e| GroupError::InvalidArgument(e.to_string()))?;
        let instances_dir = config.dir.join("instances");
        tokio::fs::create_dir_all(&instances_dir)
            .await
            .map_err(|e| provider(format!("creating {}: {e}", instances_dir.display())))?;
        let sshd = find_sshd(config.sshd_path.as_deref()).await?;
        let root = is_root();
        let netns = match config.network {
            NetworkMode::Loopback => false,
            NetworkMode::Auto => root && network::available().await,
            NetworkMode::Netns => {
                if !root || !network::available().await {
                    return Err(GroupError::InvalidArgument(
                        "plugin_config field `network`: netns needs root and a working `ip`".into(),
                    ));
                }
                true
            }
        };
        if root {
            // sshd refuses to start as root without its privilege separation directory.
            tokio::fs::create_dir_all("/run/sshd")
                .await
                .map_err(|e| provider(format!("creating /run/sshd: {e}")))?;
        }
        let wanted = config
            .user
            .clone()
            .or_else(|| (!connector.username.is_empty()).then(|| connector.username.clone()));
        let (user, uid, gid) = lookup_user(wanted).await?;
        let me = nix::unistd::geteuid().as_raw();
        if !root && uid != me {
            return Err(GroupError::InvalidArgument(format!(
                "plugin_config field `user`: only root can serve logins as another user ({user})"
            )));
        }
        let (key, authorized_key) = client_key(&config.dir, connector).await?;
        let info = ProviderInfo {
            id: format!("local/{}", config.name),
            max_size: config.max_size,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            build_info: format!("fleeting-plugin-local {}", env!("CARGO_PKG_VERSION")),
            capabilities: Vec::new(),
        };
        let ready = Ready {
            env: StartEnv {
                sshd,
                authorized_key,
                netns,
                owner: (uid != me).then_some((uid, gid)),
            },
            config,
            instances_dir,
            key: Secret(key),
            user,
            connector: connector.clone(),
        };
        tracing::info!(
            group = %info.id,
            dir = %ready.config.dir.display(),
            network = if netns { "netns" } else { "loopback" },
            "local group initialised"
        );
        if self.shared.ready.set(ready).is_err() {
            return Err(GroupError::FailedPrecondition("init called twice".into()));
        }
        // Re-discover instances left by a previous plugin process.
        let ready = self.shared.ready()?;
        sweep_trash(&ready.instances_dir).await;
        for inst in list_instances(&ready.instances_dir).await? {
            if inst.is_deleting().await {
                self.spawn_delete(inst);
            } else if inst.failure().await.is_some() {
                // Reported as timeout; the taskscaler removes it.
            } else if inst.sshd_pid().await.is_none() || !inst.is_ready().await {
                tracing::info!(instance = %inst.id, "resuming instance");
                self.spawn_provision(inst, Duration::ZERO)?;
            }
        }
        Ok(info)
    }

    async fn update(&self) -> Result<Vec<(String, State)>, GroupError> {
        let ready = self.shared.ready()?;
        let mut out = Vec::new();
        for inst in list_instances(&ready.instances_dir).await? {
            let slot = self.shared.slot(&inst.id);
            let state = if slot.as_ref().is_some_and(|s| s.deleting) {
                State::Deleting
            } else if inst.is_deleting().await {
                // Marked but no task: a restart or a failed attempt; (re)try.
                self.spawn_delete(inst.clone());
                State::Deleting
            } else if inst.failure().await.is_some() {
                State::Timeout
            } else if slot.as_ref().is_some_and(|s| s.provisioning) {
                State::Creating
            } else if !inst.exists().await {
                // Deleted since the listing (a deletion finished during this pass): it is gone,
                // and must not be "resumed".
                continue;
            } else if inst.is_ready().await {
                if inst.sshd_pid().await.is_some() {
                    State::Running
                } else {
                    let reason =
                        format!("sshd exited unexpectedly; log: {}", inst.log_tail().await);
                    inst.mark_failed(&reason).await;
                    State::Timeout
                }
            } else {
                // Never became ready and nothing works on it: resume provisioning.
                self.spawn_provision(inst.clone(), Duration::ZERO)?;
                State::Creating
            };
            if !inst.exists().await {
                continue; // deleted meanwhile: not listed means gone
            }
            out.push((inst.id, state));
        }
        Ok(out)
    }

    async fn increase(&self, delta: u32) -> Result<u32, GroupError> {
        let ready = self.shared.ready()?;
        let _scale = self.shared.scale.lock().await;
        let mut live = 0u64;
        for inst in list_instances(&ready.instances_dir).await? {
            if !inst.is_deleting().await {
                live += 1;
            }
        }
        let room = ready.config.max_size.saturating_sub(live);
        let n = u64::from(delta).min(room);
        let mut created = 0u32;
        for _ in 0..n {
            let inst = match create_instance(ready).await {
                Ok(inst) => inst,
                Err(e) if created == 0 => return Err(provider(e)),
                Err(e) => {
                    tracing::warn!("increase stopped after {created} instances: {e}");
                    break;
                }
            };
            tracing::info!(instance = %inst.id, "instance requested");
            self.spawn_provision(inst, ready.config.provisioning_delay)?;
            created += 1;
        }
        Ok(created)
    }

    async fn decrease(&self, ids: &[String]) -> Result<Vec<String>, GroupError> {
        self.shared.ready()?;
        let mut accepted = Vec::new();
        for id in ids {
            let inst = match self.find(id).await {
                Ok(inst) => inst,
                Err(GroupError::NotFound(_)) => continue,
                Err(e) => return Err(e),
            };
            if let Err(e) = inst.mark_deleting().await {
                tracing::warn!(instance = %id, "cannot mark for deletion: {e}");
                continue;
            }
            self.spawn_delete(inst);
            accepted.push(id.clone());
        }
        Ok(accepted)
    }

    async fn connect_info(&self, id: &str) -> Result<ConnectInfo, GroupError> {
        let ready = self.shared.ready()?;
        let inst = self.find(id).await?;
        let net = inst.net().await.ok_or_else(|| {
            GroupError::FailedPrecondition(format!("instance {id} has no address yet"))
        })?;
        let addr = net.addr();
        let mut connector = ready.connector.clone();
        connector.os = "linux".into();
        connector.arch = arch().into();
        connector.protocol = "ssh".into();
        connector.protocol_port = addr.port();
        connector.username = ready.user.clone();
        connector.key = ready.key.0.clone();
        connector.password = String::new();
        Ok(ConnectInfo {
            id: id.to_owned(),
            connector,
            internal_addr: addr.to_string(),
            external_addr: String::new(),
            expires: None,
        })
    }

    async fn heartbeat(&self, id: &str) -> Result<(), GroupError> {
        let inst = self.find(id).await?;
        if inst.sshd_pid().await.is_none() {
            return Err(GroupError::Provider(format!(
                "instance {id}: sshd is not running"
            )));
        }
        if !inst.accepting().await {
            return Err(GroupError::Provider(format!(
                "instance {id}: sshd is not accepting connections"
            )));
        }
        Ok(())
    }

    async fn shutdown(&self) -> Result<(), GroupError> {
        // Provisioning stops at once (a restarted plugin resumes it); deletions get a grace
        // period. Instances themselves stay: deleting them is the manager's call.
        self.cancel.cancel();
        let mut tasks = std::mem::take(
            &mut *self
                .tasks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!("shutdown: aborting background tasks still running");
            tasks.shutdown().await;
        }
        Ok(())
    }
}

/// Create a new instance directory with a fresh unique id.
async fn create_instance(ready: &Ready) -> Result<Instance, InstanceError> {
    let mut last = None;
    for _ in 0..8 {
        let id = format!("{}-{:08x}", ready.config.name, rand::random::<u32>());
        let inst = Instance::new(&ready.instances_dir, &id);
        match inst.create().await {
            Ok(()) => return Ok(inst),
            // Id collision (or a leftover of a deleted instance): draw again.
            Err(e @ InstanceError::Io { .. }) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or(InstanceError::Cancelled { id: String::new() }))
}
