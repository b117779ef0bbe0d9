//! One instance: its directory, sshd configuration and sshd process.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::network::{self, Ensured, Netns};
use crate::process::{self, CommandError, run};

/// How long a started sshd may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long processes get between SIGTERM and SIGKILL on delete.
const TERM_GRACE: Duration = Duration::from_secs(3);
/// How many subnet indexes to try when others keep taking the one recorded.
const INDEX_ATTEMPTS: u32 = 64;
/// Prefix of a deleted instance's directory while it is being removed (`.trash-<id>`); the dot
/// keeps it out of instance listings.
pub const TRASH_PREFIX: &str = ".trash-";

/// Why an instance operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InstanceError {
    /// A file operation failed.
    #[error("instance {id}: {what}: {source}")]
    Io {
        /// Instance id.
        id: String,
        /// What was being done.
        what: String,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A helper program failed.
    #[error("instance {id}: {source}")]
    Command {
        /// Instance id.
        id: String,
        /// Underlying error.
        #[source]
        source: CommandError,
    },
    /// sshd did not come up.
    #[error("instance {id}: sshd {reason}")]
    Sshd {
        /// Instance id.
        id: String,
        /// What happened (with the tail of sshd's log).
        reason: String,
    },
    /// The operation was cancelled (instance deleted or plugin shutting down).
    #[error("instance {id}: cancelled")]
    Cancelled {
        /// Instance id.
        id: String,
    },
}

/// Where an instance listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Net {
    /// 127.0.0.1 with its own port.
    Loopback {
        /// TCP port.
        port: u16,
    },
    /// Its own network namespace, port 22.
    Netns(Netns),
}

impl Net {
    /// The address sshd listens on.
    pub fn addr(&self) -> SocketAddr {
        match self {
            Net::Loopback { port } => SocketAddr::from((Ipv4Addr::LOCALHOST, *port)),
            Net::Netns(ns) => SocketAddr::from((ns.instance_addr(), 22)),
        }
    }

    fn encode(&self) -> String {
        match self {
            Net::Loopback { port } => format!("loopback {port}\n"),
            Net::Netns(ns) => format!("netns {} {}\n", ns.name, ns.index),
        }
    }

    fn decode(text: &str) -> Option<Net> {
        let mut f = text.split_whitespace();
        match (f.next()?, f.next()?, f.next()) {
            ("loopback", port, None) => Some(Net::Loopback {
                port: port.parse().ok()?,
            }),
            ("netns", name, Some(index)) => Some(Net::Netns(Netns {
                name: name.to_owned(),
                index: index.parse().ok()?,
            })),
            _ => None,
        }
    }
}

/// What starting an instance needs from its group.
#[derive(Debug, Clone)]
pub struct StartEnv {
    /// Absolute path of sshd.
    pub sshd: PathBuf,
    /// `authorized_keys` line for the group's client key.
    pub authorized_key: String,
    /// Use network namespaces (else loopback).
    pub netns: bool,
    /// Owner for the home directory when the login user is not the plugin's user.
    pub owner: Option<(u32, u32)>,
}

/// Handle on one instance directory `<dir>/instances/<id>`.
#[derive(Debug, Clone)]
pub struct Instance {
    /// Instance id (`<group>-<8 hex>`).
    pub id: String,
    /// Its directory.
    pub dir: PathBuf,
}

impl Instance {
    /// Handle for instance `id` under `instances_dir` (nothing is touched).
    pub fn new(instances_dir: &Path, id: &str) -> Instance {
        Instance {
            id: id.to_owned(),
            dir: instances_dir.join(id),
        }
    }

    /// Path of the generated sshd_config (also how its processes are recognised).
    pub fn config_path(&self) -> PathBuf {
        self.dir.join("sshd_config")
    }

    /// The login user's home directory on this instance.
    pub fn home(&self) -> PathBuf {
        self.dir.join("home")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Random part of the id, used to name the namespace.
    fn short(&self) -> &str {
        self.id.rsplit('-').next().unwrap_or(&self.id)
    }

    fn io(&self, what: &str) -> impl FnOnce(std::io::Error) -> InstanceError {
        let (id, what) = (self.id.clone(), what.to_owned());
        move |source| InstanceError::Io { id, what, source }
    }

    fn cmd(&self) -> impl FnOnce(CommandError) -> InstanceError {
        let id = self.id.clone();
        move |source| InstanceError::Command { id, source }
    }

    /// Create the directory (failing if it exists: ids must be unique) and the home dir.
    pub async fn create(&self) -> Result<(), InstanceError> {
        tokio::fs::create_dir(&self.dir)
            .await
            .map_err(self.io("creating directory"))?;
        tokio::fs::create_dir(self.home())
            .await
            .map_err(self.io("creating home"))
    }

    /// Whether the instance directory exists. Nothing ever recreates a vanished one: once it
    /// is gone the instance is deleted for good.
    pub async fn exists(&self) -> bool {
        tokio::fs::metadata(&self.dir)
            .await
            .map(|m| m.is_dir())
            .unwrap_or(false)
    }

    /// Where the instance listens (recorded before the network is created, so a namespace
    /// named here may be only half made).
    pub async fn net(&self) -> Option<Net> {
        let text = tokio::fs::read_to_string(self.path("net")).await.ok()?;
        Net::decode(&text)
    }

    /// Whether deletion has started.
    pub async fn is_deleting(&self) -> bool {
        exists(&self.path("deleting")).await
    }

    /// Record that deletion has started (survives a plugin restart).
    pub async fn mark_deleting(&self) -> Result<(), InstanceError> {
        tokio::fs::write(self.path("deleting"), b"")
            .await
            .map_err(self.io("marking deleting"))
    }

    /// Whether sshd has accepted connections at least once.
    pub async fn is_ready(&self) -> bool {
        exists(&self.path("ready")).await
    }

    /// Why the instance failed, if it did.
    pub async fn failure(&self) -> Option<String> {
        tokio::fs::read_to_string(self.path("failed")).await.ok()
    }

    /// Record (and log) why the instance failed; it then reports `timeout`. Nothing is
    /// recorded for an instance whose directory is gone (deleted meanwhile).
    pub async fn mark_failed(&self, reason: &str) {
        match tokio::fs::write(self.path("failed"), reason).await {
            Ok(()) => tracing::warn!(instance = %self.id, "instance failed: {reason}"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::debug!(instance = %self.id, "instance gone; not marked failed: {reason}");
            }
            Err(e) => {
                tracing::warn!(instance = %self.id, "instance failed: {reason} (cannot record: {e})");
            }
        }
    }

    /// The sshd listener's pid, if it is running with our config.
    pub async fn sshd_pid(&self) -> Option<i32> {
        let pid: i32 = tokio::fs::read_to_string(self.path("sshd.pid"))
            .await
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let cfg = self.config_path();
        process::alive_with(pid, cfg.to_str()?).await.then_some(pid)
    }

    /// True when sshd answers with an SSH banner.
    pub async fn accepting(&self) -> bool {
        match self.net().await {
            Some(net) => probe(net.addr()).await,
            None => false,
        }
    }

    /// Start (or restart) sshd and wait until it accepts connections. Idempotent: pieces that
    /// exist (host key, namespace, a running sshd) are kept, so a restarted plugin can resume.
    pub async fn start(
        &self,
        env: &StartEnv,
        cancel: &CancellationToken,
    ) -> Result<(), InstanceError> {
        if self.sshd_pid().await.is_none() {
            self.prepare(env).await?;
            self.launch(env).await?;
        }
        self.wait_ready(cancel).await?;
        tokio::fs::write(self.path("ready"), b"")
            .await
            .map_err(self.io("marking ready"))
    }

    async fn prepare(&self, env: &StartEnv) -> Result<(), InstanceError> {
        // `create_dir`, not `create_dir_all`: if the instance directory vanished (deleted
        // meanwhile) this must fail rather than bring the instance back to life.
        match tokio::fs::create_dir(self.home()).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(self.io("creating home")(e)),
        }
        if let Some((uid, gid)) = env.owner {
            let home = self.home();
            let res = tokio::task::spawn_blocking(move || {
                nix::unistd::chown(
                    &home,
                    Some(nix::unistd::Uid::from_raw(uid)),
                    Some(nix::unistd::Gid::from_raw(gid)),
                )
            })
            .await;
            match res {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(self.io("chown home")(e.into())),
                Err(e) => return Err(self.io("chown home")(std::io::Error::other(e))),
            }
        }
        let host_key = self.path("ssh_host_ed25519_key");
        if !exists(&host_key).await {
            // A half-written key pair from an interrupted run would make ssh-keygen prompt.
            let _ = tokio::fs::remove_file(&host_key).await;
            let _ = tokio::fs::remove_file(self.path("ssh_host_ed25519_key.pub")).await;
            let comment = format!("slipway-local-{}", self.id);
            run(
                "ssh-keygen",
                [
                    "-q".as_ref(),
                    "-t".as_ref(),
                    "ed25519".as_ref(),
                    "-N".as_ref(),
                    "".as_ref(),
                    "-C".as_ref(),
                    comment.as_ref(),
                    "-f".as_ref(),
                    host_key.as_os_str(),
                ],
            )
            .await
            .map_err(self.cmd())?;
        }
        tokio::fs::write(self.path("authorized_keys"), &env.authorized_key)
            .await
            .map_err(self.io("writing authorized_keys"))?;
        if env.netns {
            self.prepare_netns().await?;
        }
        Ok(())
    }

    /// Name of this instance's namespace (derived from its id, so a half-made one is found
    /// again even without a record).
    fn netns_name(&self) -> String {
        format!("slw-{}", self.short())
    }

    /// Set up the namespace. The name and subnet index are recorded in `net` *before* anything
    /// is created, so a plugin killed half-way leaves a record that a restarted plugin uses to
    /// finish ([`network::ensure`] reuses what exists) or to clean up (`destroy`).
    async fn prepare_netns(&self) -> Result<(), InstanceError> {
        let mut ns = match self.net().await {
            Some(Net::Netns(ns)) => ns,
            _ => {
                let ns = Netns {
                    name: self.netns_name(),
                    index: network::free_index().await.map_err(self.cmd())?,
                };
                self.write_net(&Net::Netns(ns.clone())).await?;
                ns
            }
        };
        for _ in 0..INDEX_ATTEMPTS {
            match network::ensure(&ns).await.map_err(self.cmd())? {
                Ensured::Ready => return Ok(()),
                // Another instance holds the recorded index (lost a race, or it took the index
                // after a reboot): record a fresh one, then claim it.
                Ensured::IndexTaken => {
                    let taken = ns.index;
                    ns.index = network::free_index().await.map_err(self.cmd())?;
                    if ns.index == taken {
                        // Its link vanished meanwhile: just try it again after a moment.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    self.write_net(&Net::Netns(ns.clone())).await?;
                }
            }
        }
        Err(InstanceError::Sshd {
            id: self.id.clone(),
            reason: format!("no free subnet after {INDEX_ATTEMPTS} attempts"),
        })
    }

    /// Record where the instance listens: written to a temporary file and renamed, so a crash
    /// never leaves a torn record. Fails if the instance directory is gone.
    async fn write_net(&self, net: &Net) -> Result<(), InstanceError> {
        let tmp = self.path("net.tmp");
        tokio::fs::write(&tmp, net.encode())
            .await
            .map_err(self.io("writing net"))?;
        tokio::fs::rename(&tmp, self.path("net"))
            .await
            .map_err(self.io("writing net"))
    }

    async fn launch(&self, env: &StartEnv) -> Result<(), InstanceError> {
        let cfg = self.config_path();
        let log = self.path("sshd.log");
        let _ = tokio::fs::remove_file(self.path("sshd.pid")).await;
        let sftp = sftp_server().await;
        let mut last_err = None;
        // Loopback ports are picked by binding port 0 and releasing it, so another process can
        // grab one in between: retry with a fresh port.
        for attempt in 0..5 {
            let net = match (env.netns, self.net().await) {
                (true, Some(net)) => net,
                (true, None) => {
                    return Err(InstanceError::Sshd {
                        id: self.id.clone(),
                        reason: "namespace not set up".into(),
                    });
                }
                // Keep the previous port on resume so the address stays stable.
                (false, Some(net @ Net::Loopback { .. })) if attempt == 0 => net,
                (false, _) => Net::Loopback {
                    port: free_port().await.map_err(self.io("picking a port"))?,
                },
            };
            self.write_net(&net).await?;
            tokio::fs::write(&cfg, self.sshd_config(&net, sftp.as_deref()))
                .await
                .map_err(self.io("writing sshd_config"))?;
            let sshd = env.sshd.as_os_str();
            let res = match &net {
                // nsenter joins only the network namespace: `ip netns exec` would also mount a
                // fresh /sys, hiding /sys/fs/cgroup from jobs (no slot cgroups on the instance).
                Net::Netns(ns) => {
                    let netns = format!("--net=/run/netns/{}", ns.name);
                    run(
                        "nsenter",
                        [
                            netns.as_ref(),
                            "--".as_ref(),
                            sshd,
                            "-f".as_ref(),
                            cfg.as_os_str(),
                            "-E".as_ref(),
                            log.as_os_str(),
                        ],
                    )
                    .await
                }
                // No -D: sshd daemonizes and is re-parented to init, so instances outlive a
                // plugin restart; it is tracked through its PidFile instead.
                Net::Loopback { .. } => {
                    run(
                        sshd.to_string_lossy().as_ref(),
                        [
                            "-f".as_ref(),
                            cfg.as_os_str(),
                            "-E".as_ref(),
                            log.as_os_str(),
                        ],
                    )
                    .await
                }
            };
            match res {
                Ok(_) => return Ok(()),
                Err(e) => {
                    let reason = format!("failed to start: {e}; log: {}", self.log_tail().await);
                    last_err = Some(InstanceError::Sshd {
                        id: self.id.clone(),
                        reason,
                    });
                    if env.netns {
                        break;
                    }
                }
            }
        }
        Err(last_err.unwrap_or_else(|| InstanceError::Sshd {
            id: self.id.clone(),
            reason: "failed to start".into(),
        }))
    }

    async fn wait_ready(&self, cancel: &CancellationToken) -> Result<(), InstanceError> {
        let start = Instant::now();
        loop {
            if self.accepting().await {
                return Ok(());
            }
            // The pid file appears only after sshd has daemonized: allow a moment for it.
            if start.elapsed() > Duration::from_secs(2) && self.sshd_pid().await.is_none() {
                return Err(InstanceError::Sshd {
                    id: self.id.clone(),
                    reason: format!("exited during startup; log: {}", self.log_tail().await),
                });
            }
            if start.elapsed() > READY_TIMEOUT {
                return Err(InstanceError::Sshd {
                    id: self.id.clone(),
                    reason: format!("not accepting connections after {READY_TIMEOUT:?}"),
                });
            }
            tokio::select! {
                _ = cancel.cancelled() => return Err(InstanceError::Cancelled { id: self.id.clone() }),
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
    }

    /// Last lines of sshd's log, for error messages.
    pub async fn log_tail(&self) -> String {
        let text = tokio::fs::read_to_string(self.path("sshd.log"))
            .await
            .unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(5)..].join(" | ");
        if tail.is_empty() {
            "(empty)".into()
        } else {
            tail
        }
    }

    fn sshd_config(&self, net: &Net, sftp: Option<&Path>) -> String {
        let d = self.dir.display();
        let home = self.home();
        let home = home.display();
        let addr = net.addr();
        // The executor cds to $HOME for its builds; sshd's own chdir uses the passwd home, so
        // ForceCommand moves into the instance home and then runs the requested command exactly
        // as sshd would have (`$SHELL -c`), or a login shell when none was given.
        let force = "cd \"$HOME\" || exit 1; if [ -n \"$SSH_ORIGINAL_COMMAND\" ]; then exec \
                     \"${SHELL:-/bin/sh}\" -c \"$SSH_ORIGINAL_COMMAND\"; else exec \
                     \"${SHELL:-/bin/sh}\" -l; fi";
        let sftp = sftp
            .map(|p| format!("Subsystem sftp {}\n", p.display()))
            .unwrap_or_default();
        format!(
            "# Generated by fleeting-plugin-local for instance {id}\n\
             Port {port}\n\
             ListenAddress {ip}\n\
             HostKey {d}/ssh_host_ed25519_key\n\
             AuthorizedKeysFile {d}/authorized_keys\n\
             PidFile {d}/sshd.pid\n\
             StrictModes no\n\
             UsePAM no\n\
             PasswordAuthentication no\n\
             KbdInteractiveAuthentication no\n\
             PermitRootLogin prohibit-password\n\
             MaxSessions 64\n\
             MaxStartups 64:30:128\n\
             AllowTcpForwarding yes\n\
             AllowStreamLocalForwarding yes\n\
             SetEnv HOME={home} SLIPWAY_LOCAL_INSTANCE={d}\n\
             ForceCommand {force}\n\
             {sftp}\
             LogLevel ERROR\n",
            id = self.id,
            port = addr.port(),
            ip = addr.ip(),
        )
    }

    /// Marker in the environment of every session command of this instance.
    fn env_marker(&self) -> String {
        format!("SLIPWAY_LOCAL_INSTANCE={}", self.dir.display())
    }

    /// Stop sshd and every process of its sessions, remove the namespace and the directory.
    ///
    /// Safe to repeat after an interruption at any point: the directory (with its `deleting`
    /// marker and `net` record) goes last, atomically, and only once the namespace is gone.
    pub async fn destroy(&self) -> Result<(), InstanceError> {
        let recorded = match self.net().await {
            Some(Net::Netns(ns)) => Some(ns),
            _ => None,
        };
        // Without a netns record, a namespace by this instance's name may still exist (made by
        // a plugin version that recorded it only afterwards): it is ours too.
        let ns_name = match &recorded {
            Some(ns) => Some(ns.name.clone()),
            None if network::exists(&self.netns_name()).await => Some(self.netns_name()),
            None => None,
        };
        if let Some(pid) = self.sshd_pid().await {
            process::signal_all(&[pid], Signal::SIGTERM);
        }
        let cfg = self.config_path().display().to_string();
        let marker = self.env_marker();
        let deadline = Instant::now() + TERM_GRACE;
        let mut signal = Signal::SIGTERM;
        loop {
            let extra = match &ns_name {
                Some(name) => network::pids(name).await,
                None => Vec::new(),
            };
            let (cfg2, marker2) = (cfg.clone(), marker.clone());
            let pids = tokio::task::spawn_blocking(move || {
                process::instance_pids(&cfg2, &marker2, &extra)
            })
            .await
            .unwrap_or_default();
            if pids.is_empty() {
                break;
            }
            process::signal_all(&pids, signal);
            if Instant::now() > deadline {
                if signal == Signal::SIGKILL {
                    // SIGKILLed processes still listed: give the kernel a last moment, then go on.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    break;
                }
                signal = Signal::SIGKILL;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The directory holds the only record of the namespace: keep it (and the `deleting`
        // marker, so deletion is retried) until the namespace is really gone.
        if let Some(ns) = &recorded {
            network::remove(ns).await.map_err(self.cmd())?;
        } else if let Some(name) = &ns_name {
            network::remove_namespace(name).await.map_err(self.cmd())?;
        }
        // Rename first: the instance disappears atomically, and nothing can write into (or
        // recreate files in) its directory while the rest is removed.
        let trash = self.trash();
        remove_dir_if_exists(&trash)
            .await
            .map_err(self.io("removing old trash"))?;
        match tokio::fs::rename(&self.dir, &trash).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(self.io("removing directory")(e)),
        }
        // Leftovers of an interrupted removal are swept by the next `init`.
        remove_dir_if_exists(&trash)
            .await
            .map_err(self.io("removing directory"))
    }

    /// Where the directory is moved while it is removed.
    fn trash(&self) -> PathBuf {
        let parent = self.dir.parent().unwrap_or(Path::new("/"));
        parent.join(format!("{TRASH_PREFIX}{}", self.id))
    }
}

/// Connect, expect an SSH banner, send ours and close. Sending an identification string keeps
/// sshd from logging a `kex_exchange_identification` error for every probe.
pub async fn probe(addr: SocketAddr) -> bool {
    let attempt = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.ok()?;
        let _ = s.write_all(b"SSH-2.0-slipway_probe\r\n").await;
        let _ = s.shutdown().await;
        (&buf == b"SSH-").then_some(())
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), attempt).await,
        Ok(Some(()))
    )
}

async fn free_port() -> std::io::Result<u16> {
    let l = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    Ok(l.local_addr()?.port())
}

/// `remove_dir_all`, where a missing directory counts as removed.
pub async fn remove_dir_if_exists(dir: &Path) -> std::io::Result<()> {
    match tokio::fs::remove_dir_all(dir).await {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The sftp server binary, if installed.
async fn sftp_server() -> Option<PathBuf> {
    for p in ["/usr/lib/openssh/sftp-server", "/usr/libexec/sftp-server"] {
        if exists(Path::new(p)).await {
            return Some(PathBuf::from(p));
        }
    }
    None
}

async fn exists(path: &Path) -> bool {
    tokio::fs::try_exists(path).await.unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_round_trip() {
        for net in [
            Net::Loopback { port: 2222 },
            Net::Netns(Netns {
                name: "slw-abc".into(),
                index: 7,
            }),
        ] {
            assert_eq!(Net::decode(&net.encode()), Some(net));
        }
        assert_eq!(Net::decode("bogus"), None);
    }
}
