//! [`QemuGroup`]: the `InstanceGroup` over VMs in the state directory.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use slipway_fleeting::{
    ConnectInfo, ConnectorConfig, GroupError, InstanceGroup, ProviderInfo, State,
};
use slipway_nesting::Accel;
use slipway_nesting_daemon::image::ImageManifest;
use tokio::task::JoinSet;

use crate::command::Launch;
use crate::config::Config;
use crate::key::{Secret, client_key};
use crate::vm::{Vm, VmError, free_port};

/// How long `shutdown` waits for in-flight deletions before aborting them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// Boot timeouts when the configuration sets none: Debian under emulation is slow.
const TCG_BOOT_TIMEOUT: Duration = Duration::from_secs(600);
const KVM_BOOT_TIMEOUT: Duration = Duration::from_secs(120);

/// The QEMU instance group. Create with `Default`, then `init`.
#[derive(Debug, Default)]
pub struct QemuGroup {
    ready: OnceLock<Ready>,
    // Deletions run here: dropping the group aborts them, `shutdown` drains them.
    tasks: Mutex<JoinSet<()>>,
    // Ids with a deletion task running in this process.
    deleting: Arc<Mutex<HashSet<String>>>,
    // Serialises creating VMs against counting and reaping them: an instance directory whose
    // QEMU is still being started must not look like a VM that died.
    scale: tokio::sync::Mutex<()>,
}

/// Everything `init` established.
struct Ready {
    config: Config,
    instances_dir: PathBuf,
    image: ImageManifest,
    qemu: PathBuf,
    accel: Accel,
    boot_timeout: Duration,
    key: Secret,
    public_key: String,
    connector: ConnectorConfig,
}

impl fmt::Debug for Ready {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ready")
            .field("config", &self.config)
            .field("accel", &self.accel)
            .field("boot_timeout", &self.boot_timeout)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

fn provider(e: impl fmt::Display) -> GroupError {
    GroupError::Provider(e.to_string())
}

fn invalid(key: &str, reason: impl fmt::Display) -> GroupError {
    GroupError::InvalidArgument(format!("plugin_config key `{key}`: {reason}"))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Guarded values are single inserts/removals: a poisoned lock still holds a consistent one.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Ids are single path components we generated: no separators, no dot-files.
fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

async fn list_vms(dir: &Path) -> Result<Vec<Vm>, GroupError> {
    let mut out = Vec::new();
    let mut rd = tokio::fs::read_dir(dir)
        .await
        .map_err(|e| provider(format!("listing {}: {e}", dir.display())))?;
    while let Some(entry) = rd.next_entry().await.map_err(provider)? {
        let is_dir = entry.file_type().await.is_ok_and(|t| t.is_dir());
        if let Some(name) = entry.file_name().to_str()
            && is_dir
            && valid_id(name)
        {
            out.push(Vm::new(dir, name));
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// `qemu` as configured: a path must exist; a bare name is looked up on PATH.
async fn find_binary(configured: &Path) -> Result<PathBuf, GroupError> {
    if configured.components().count() > 1 {
        return if tokio::fs::try_exists(configured).await.unwrap_or(false) {
            Ok(configured.to_path_buf())
        } else {
            Err(invalid(
                "qemu",
                format!("{} does not exist", configured.display()),
            ))
        };
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join(configured);
            if tokio::fs::try_exists(&candidate).await.unwrap_or(false) {
                return Ok(candidate);
            }
        }
    }
    Err(invalid(
        "qemu",
        format!(
            "{} not found on PATH (apt-get install qemu-system-x86 qemu-utils)",
            configured.display()
        ),
    ))
}

async fn load_image(dir: &Path) -> Result<ImageManifest, GroupError> {
    let owned = dir.to_path_buf();
    let image = tokio::task::spawn_blocking(move || slipway_nesting_daemon::image::load(&owned))
        .await
        .map_err(provider)?
        .map_err(|e| invalid("image", e))?;
    if image.level != slipway_nesting::Level::Vm || !image.sshd {
        return Err(invalid(
            "image",
            format!(
                "{} is a {} image without sshd; build one with `slipway image build --name {} \
                 --level vm --sshd`",
                dir.display(),
                image.level.as_str(),
                image.name
            ),
        ));
    }
    Ok(image)
}

impl QemuGroup {
    fn ready(&self) -> Result<&Ready, GroupError> {
        self.ready
            .get()
            .ok_or_else(|| GroupError::FailedPrecondition("init has not been called".into()))
    }

    /// Delete a VM in the background (once per id at a time). The caller marked it `deleting`
    /// first, so a restarted plugin finishes the job.
    fn spawn_delete(&self, vm: Vm) {
        if !lock(&self.deleting).insert(vm.id.clone()) {
            return;
        }
        let deleting = Arc::clone(&self.deleting);
        let mut tasks = lock(&self.tasks);
        // Reap finished tasks so the set does not grow without bound.
        while tasks.try_join_next().is_some() {}
        tasks.spawn(async move {
            match vm.destroy().await {
                Ok(()) => tracing::info!(instance = %vm.id, "instance deleted"),
                // The `deleting` marker stays: the next update retries.
                Err(e) => tracing::warn!(instance = %vm.id, "deleting instance: {e}"),
            }
            lock(&deleting).remove(&vm.id);
        });
    }

    async fn find(&self, id: &str) -> Result<Vm, GroupError> {
        let ready = self.ready()?;
        let vm = Vm::new(&ready.instances_dir, id);
        if valid_id(id) && vm.exists().await {
            Ok(vm)
        } else {
            Err(GroupError::NotFound(id.to_owned()))
        }
    }

    /// One VM: directory, overlay, QEMU started; everything removed again on failure.
    async fn create(&self, ready: &Ready) -> Result<Vm, VmError> {
        let mut made = None;
        for _ in 0..8 {
            let id = format!("{}-{:08x}", ready.config.name, rand::random::<u32>());
            let vm = Vm::new(&ready.instances_dir, &id);
            match vm.create_dir().await {
                Ok(()) => {
                    made = Some(vm);
                    break;
                }
                Err(e) if made.is_none() => tracing::debug!("id {id} taken: {e}"),
                Err(e) => return Err(e),
            }
        }
        let vm = made.ok_or_else(|| VmError::Command {
            command: "creating an instance directory".into(),
            message: "no free id after 8 draws".into(),
        })?;
        match self.boot(ready, &vm).await {
            Ok(()) => Ok(vm),
            Err(e) => {
                if let Err(cleanup) = vm.destroy().await {
                    tracing::warn!(instance = %vm.id, "cleaning up a failed start: {cleanup}");
                }
                Err(e)
            }
        }
    }

    async fn boot(&self, ready: &Ready, vm: &Vm) -> Result<(), VmError> {
        let image_dir = &ready.config.image_dir;
        vm.create_overlay(&ready.image.disk_path(image_dir)).await?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let launch = Launch::for_image(
                &ready.qemu,
                &ready.image,
                image_dir,
                &vm.id,
                ready.accel,
                ready.config.cpus,
                ready.config.memory_mib,
                &ready.public_key,
                free_port()?,
                &vm.dir,
            )?;
            match vm.start(&launch).await {
                // Another process took the port between our probe and QEMU's bind: draw again.
                Err(e) if attempt < 3 && e.to_string().contains("host forwarding") => {
                    tracing::debug!(instance = %vm.id, "port taken, retrying: {e}");
                }
                other => return other,
            }
        }
    }
}

#[async_trait]
impl InstanceGroup for QemuGroup {
    async fn init(
        &self,
        plugin_config: &[u8],
        connector: &ConnectorConfig,
    ) -> Result<ProviderInfo, GroupError> {
        if self.ready.get().is_some() {
            return Err(GroupError::FailedPrecondition("init called twice".into()));
        }
        let mut config =
            Config::parse(plugin_config).map_err(|e| GroupError::InvalidArgument(e.to_string()))?;
        // QEMU daemonizes into `/`: every path it gets must be absolute.
        config.dir = std::path::absolute(&config.dir).map_err(|e| invalid("dir", e))?;
        config.image_dir =
            std::path::absolute(&config.image_dir).map_err(|e| invalid("image", e))?;
        let image = load_image(&config.image_dir).await?;
        let qemu = find_binary(&config.qemu).await?;
        let instances_dir = config.dir.join("instances");
        tokio::fs::create_dir_all(&instances_dir)
            .await
            .map_err(|e| invalid("dir", format!("creating {}: {e}", instances_dir.display())))?;
        let (key, public_key) = client_key(&config.dir).await.map_err(provider)?;
        let probe = slipway_nesting_daemon::accel::resolve(
            config.accel,
            &qemu.display().to_string(),
            Some(&image.kernel_path(&config.image_dir)),
        )
        .await;
        let boot_timeout = config.boot_timeout.unwrap_or(match probe.accel {
            Accel::Kvm => KVM_BOOT_TIMEOUT,
            Accel::Tcg => TCG_BOOT_TIMEOUT,
        });
        let info = ProviderInfo {
            id: format!("qemu/{}", config.name),
            max_size: config.max_size,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            build_info: format!("fleeting-plugin-qemu {}", env!("CARGO_PKG_VERSION")),
            capabilities: Vec::new(),
        };
        tracing::info!(
            group = %info.id,
            dir = %config.dir.display(),
            image = %config.image_dir.display(),
            accel = probe.accel.as_str(),
            why = %probe.reason,
            boot_timeout = ?boot_timeout,
            "qemu group initialised"
        );
        let ready = Ready {
            config,
            instances_dir,
            image,
            qemu,
            accel: probe.accel,
            boot_timeout,
            key,
            public_key,
            connector: connector.clone(),
        };
        if self.ready.set(ready).is_err() {
            return Err(GroupError::FailedPrecondition("init called twice".into()));
        }
        // Finish deletions a previous plugin process left half done.
        let ready = self.ready()?;
        for vm in list_vms(&ready.instances_dir).await? {
            if vm.is_deleting().await {
                self.spawn_delete(vm);
            }
        }
        Ok(info)
    }

    async fn update(&self) -> Result<Vec<(String, State)>, GroupError> {
        let ready = self.ready()?;
        let _scale = self.scale.lock().await;
        let mut out = Vec::new();
        for vm in list_vms(&ready.instances_dir).await? {
            let state = if lock(&self.deleting).contains(&vm.id) {
                State::Deleting
            } else if vm.is_deleting().await {
                // Marked but no task: a restart or a failed attempt; (re)try.
                self.spawn_delete(vm.clone());
                State::Deleting
            } else if vm.failure().await.is_some() {
                State::Timeout
            } else if vm.pid().await.is_none() {
                if !vm.exists().await {
                    continue; // a deletion finished during this pass
                }
                // QEMU is gone (killed, crashed, powered off): so is the instance.
                tracing::warn!(
                    instance = %vm.id,
                    "qemu exited; console: {}",
                    vm.console_tail().await
                );
                if let Err(e) = vm.remove_dir().await {
                    tracing::warn!(instance = %vm.id, "removing a dead VM's files: {e}");
                }
                State::Deleted
            } else if vm.is_ready().await {
                State::Running
            } else if vm.ssh_answers().await {
                vm.mark_ready().await.map_err(provider)?;
                tracing::info!(instance = %vm.id, "sshd answers: instance running");
                State::Running
            } else {
                let started = vm.started().await.unwrap_or_else(SystemTime::now);
                let waited = started.elapsed().unwrap_or_default();
                if waited > ready.boot_timeout {
                    let reason = format!(
                        "sshd did not answer within {:?} ({}); console: {}",
                        ready.boot_timeout,
                        ready.accel.as_str(),
                        vm.console_tail().await
                    );
                    tracing::warn!(instance = %vm.id, "{reason}");
                    vm.fail(&reason).await;
                    State::Timeout
                } else {
                    State::Creating
                }
            };
            out.push((vm.id, state));
        }
        Ok(out)
    }

    async fn increase(&self, delta: u32) -> Result<u32, GroupError> {
        let ready = self.ready()?;
        let _scale = self.scale.lock().await;
        let mut live = 0u64;
        for vm in list_vms(&ready.instances_dir).await? {
            if !vm.is_deleting().await {
                live += 1;
            }
        }
        let n = u64::from(delta).min(ready.config.max_size.saturating_sub(live));
        let mut created = 0u32;
        for _ in 0..n {
            match self.create(ready).await {
                Ok(vm) => {
                    tracing::info!(instance = %vm.id, "VM started");
                    created += 1;
                }
                Err(e) if created == 0 => return Err(provider(e)),
                Err(e) => {
                    tracing::warn!("increase stopped after {created} VMs: {e}");
                    break;
                }
            }
        }
        Ok(created)
    }

    async fn decrease(&self, ids: &[String]) -> Result<Vec<String>, GroupError> {
        self.ready()?;
        let mut accepted = Vec::new();
        for id in ids {
            let vm = match self.find(id).await {
                Ok(vm) => vm,
                Err(GroupError::NotFound(_)) => continue,
                Err(e) => return Err(e),
            };
            if let Err(e) = vm.mark_deleting().await {
                tracing::warn!(instance = %id, "cannot mark for deletion: {e}");
                continue;
            }
            self.spawn_delete(vm);
            accepted.push(id.clone());
        }
        Ok(accepted)
    }

    async fn connect_info(&self, id: &str) -> Result<ConnectInfo, GroupError> {
        let ready = self.ready()?;
        let vm = self.find(id).await?;
        let port = vm.port().await.ok_or_else(|| {
            GroupError::FailedPrecondition(format!("instance {id} has no SSH port yet"))
        })?;
        let mut connector = ready.connector.clone();
        connector.os = "linux".into();
        connector.arch = "amd64".into();
        connector.protocol = "ssh".into();
        connector.protocol_port = port;
        connector.username = ready.config.username.clone();
        connector.key = ready.key.0.clone();
        connector.password = String::new();
        Ok(ConnectInfo {
            id: id.to_owned(),
            connector,
            internal_addr: format!("127.0.0.1:{port}"),
            external_addr: String::new(),
            expires: None,
        })
    }

    async fn heartbeat(&self, id: &str) -> Result<(), GroupError> {
        let vm = self.find(id).await?;
        if vm.pid().await.is_none() {
            return Err(provider(format!("instance {id}: qemu is not running")));
        }
        if !vm.ssh_answers().await {
            return Err(provider(format!("instance {id}: sshd does not answer")));
        }
        Ok(())
    }

    async fn shutdown(&self) -> Result<(), GroupError> {
        // VMs stay (deleting them is the manager's call, `delete_instances_on_shutdown`); a
        // restarted plugin finds them. Deletions in flight get a grace period.
        let mut tasks = std::mem::take(&mut *lock(&self.tasks));
        let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!("shutdown: aborting deletions still running");
            tasks.shutdown().await;
        }
        Ok(())
    }
}
