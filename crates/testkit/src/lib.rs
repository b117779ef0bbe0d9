//! Fixtures shared by Slipway's tests and benches, so each real part is set up one way:
//!
//! - [`Sshd`]: a real OpenSSH `sshd` on 127.0.0.1 with its own host key and an authorized
//!   client key (installed with apt-get when missing: tests never skip for want of it).
//! - [`docker_gateway`]: where servers listen for jobs in containers to reach them.
//! - [`ensure_docker_engine`]: Docker Engine running and the local `slipway-busybox` image
//!   built, through `scripts/docker-engine.sh`.
//! - [`kill_tree`]: kill a process and every descendant.
//! - [`guest::guest_image`]: QEMU and the image tools installed, a guest image built once.
//! - [`gitlab::FakeGitlab`]: a stateful mock GitLab runner API on 127.0.0.1, with fault injection.
//! - [`plugin_check::plugin_check`]: `slipway plugin check --json` run on a plugin binary.
//! - [`peer`]: local pipelines run by `slipway exec` and by gitlab-ci-local, compared.
//! - [`python`]: an interpreter with the go-plugin peer, grpclib stubs, plugin wrappers.
//! - [`s3::LocalStack`]: a real S3-compatible server (LocalStack, from PyPI) with a bucket.
//! - [`cloud_storage`]: Google Cloud Storage (`gcp-storage-emulator`) and Azure Blob Storage
//!   (Azurite) emulators with a bucket or container.
//! - [`tls::TestCa`]: a private CA with server and client certificates as PEM files.
//! - [`moto::Moto`]: a real moto server (AWS APIs) with Auto Scaling groups, and
//!   [`aws_faults::FaultProxy`] in front of it answering chosen actions with errors.
//! - [`bench`]: the `bench/results/NAME.json` file every bench writes, and its statistics.
//! - [`git_http`]: git over smart HTTP (`git http-backend`) and an LFS endpoint for [`gitlab::FakeGitlab`].

pub mod aws_faults;
pub mod bench;
pub mod cloud_storage;
pub mod git_http;
pub mod gitlab;
pub mod guest;
pub mod moto;
pub mod peer;
pub mod plugin_check;
pub mod python;
pub mod s3;
pub mod tls;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use slipway_fleeting::{ConnectInfo, ConnectorConfig};

/// Where Debian puts sshd.
pub const SSHD: &str = "/usr/sbin/sshd";
/// The image `scripts/docker-engine.sh` builds.
pub const BUSYBOX_IMAGE: &str = "slipway-busybox:latest";

/// A fixture that could not be set up, and why.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {why}")]
pub struct FixtureError {
    what: &'static str,
    why: String,
}

fn err(what: &'static str, why: impl std::fmt::Display) -> FixtureError {
    FixtureError {
        what,
        why: why.to_string(),
    }
}

/// Install openssh-server when sshd is missing.
pub fn ensure_sshd() -> Result<(), FixtureError> {
    if Path::new(SSHD).exists() {
        return Ok(());
    }
    apt_install("openssh-server")
}

/// `cargo build --release -p PACKAGE` in `repo` (benches build what they drive); the binary
/// of that name, where cargo put it (`CARGO_TARGET_DIR` when set, else `repo/target`).
pub async fn release_binary(repo: &Path, package: &str) -> Result<PathBuf, FixtureError> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = tokio::process::Command::new(cargo)
        .args(["build", "--release", "-p", package])
        .current_dir(repo)
        .status()
        .await
        .map_err(|e| err("running cargo build", e))?;
    if !st.success() {
        return Err(err("building a release binary", format!("{package}: {st}")));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("target"));
    Ok(target.join("release").join(package))
}

/// `apt-get install` one Debian package, updating the package lists once if the first try
/// fails. Tests run in parallel and `scripts/deps.sh` may be installing too: each call waits
/// for dpkg's lock (up to 10 minutes) instead of failing on it.
pub fn apt_install(package: &str) -> Result<(), FixtureError> {
    const WAIT_FOR_LOCK: &str = "DPkg::Lock::Timeout=600";
    let install = || {
        std::process::Command::new("apt-get")
            .args(["-o", WAIT_FOR_LOCK])
            .args(["install", "-y", "-q", "--no-install-recommends", package])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    if !install() {
        let _ = std::process::Command::new("apt-get")
            .args(["-o", WAIT_FOR_LOCK, "update"])
            .status();
        if !install() {
            return Err(err(
                "installing a Debian package",
                format!("apt-get install {package} failed"),
            ));
        }
    }
    Ok(())
}

fn keygen(path: &Path) -> Result<(), FixtureError> {
    let st = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .status()
        .map_err(|e| err("running ssh-keygen", e))?;
    if !st.success() {
        return Err(err("running ssh-keygen", st));
    }
    Ok(())
}

/// A real sshd in the foreground on a free loopback port; it and its sessions are killed when
/// dropped.
#[derive(Debug)]
pub struct Sshd {
    dir: tempfile::TempDir,
    port: u16,
    pid: u32,
    child: tokio::process::Child,
}

impl Sshd {
    /// Start one. `SetEnv SHLVL=1` keeps the login shell from sourcing the user's `~/.bashrc`
    /// (slow on some development machines), so figures measure Slipway, not a shell profile.
    pub async fn start() -> Result<Sshd, FixtureError> {
        ensure_sshd()?;
        std::fs::create_dir_all("/run/sshd").map_err(|e| err("creating /run/sshd", e))?;
        let dir = tempfile::Builder::new()
            .prefix("slipway-sshd-")
            .tempdir()
            .map_err(|e| err("creating a temp dir", e))?;
        let d: PathBuf = dir.path().to_path_buf();
        keygen(&d.join("host"))?;
        keygen(&d.join("client"))?;
        std::fs::copy(d.join("client.pub"), d.join("authorized_keys"))
            .map_err(|e| err("authorizing the client key", e))?;
        let cfg = d.join("sshd_config");
        for _ in 0..20 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map_err(|e| err("picking a port", e))?
                .port();
            let dd = d.display();
            std::fs::write(
                &cfg,
                format!(
                    "Port {port}\nListenAddress 127.0.0.1\nHostKey {dd}/host\n\
                     AuthorizedKeysFile {dd}/authorized_keys\nPidFile {dd}/sshd.pid\n\
                     StrictModes no\nUsePAM no\nPasswordAuthentication no\n\
                     PermitRootLogin prohibit-password\nMaxSessions 64\nMaxStartups 64:30:128\n\
                     LogLevel ERROR\nSetEnv SHLVL=1\n"
                ),
            )
            .map_err(|e| err("writing sshd_config", e))?;
            let mut child = tokio::process::Command::new(SSHD)
                .args(["-D", "-e", "-f"])
                .arg(&cfg)
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| err("starting sshd", e))?;
            let pid = child.id().ok_or_else(|| err("starting sshd", "no pid"))?;
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // a port collision, say: try another port
                }
                if tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_ok()
                {
                    return Ok(Sshd {
                        dir,
                        port,
                        pid,
                        child,
                    });
                }
                if Instant::now() >= deadline {
                    kill_tree(pid);
                    return Err(err("starting sshd", "no answer within 10 s"));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Err(err("starting sshd", "no free port after 20 tries"))
    }

    /// How to reach it as the current user with the authorized key.
    pub fn info(&self) -> Result<ConnectInfo, FixtureError> {
        let user = std::process::Command::new("id")
            .arg("-un")
            .output()
            .map_err(|e| err("running id -un", e))?;
        Ok(ConnectInfo {
            id: format!("sshd-{}-{}", std::process::id(), self.port),
            connector: ConnectorConfig {
                os: "linux".into(),
                protocol: "ssh".into(),
                username: String::from_utf8_lossy(&user.stdout).trim().to_owned(),
                key: std::fs::read(self.dir.path().join("client"))
                    .map_err(|e| err("reading the client key", e))?,
                timeout: Duration::from_secs(5),
                ..ConnectorConfig::default()
            },
            internal_addr: format!("127.0.0.1:{}", self.port),
            ..ConnectInfo::default()
        })
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The private key it accepts (mode 0600), for configs that name a key file.
    pub fn key_path(&self) -> PathBuf {
        self.dir.path().join("client")
    }

    /// `[runners.autoscaler.plugin_config.instances.web<N>]` entries of config.toml for the
    /// static plugin, one per sshd in `hosts` (on loopback, as `user` with the sshd's key).
    pub fn static_hosts(hosts: &[Sshd], user: &str) -> String {
        hosts
            .iter()
            .enumerate()
            .map(|(i, h)| {
                format!(
                    "      [runners.autoscaler.plugin_config.instances.web{i}]\n        \
                     internal_addr = \"127.0.0.1:{}\"\n        username = \"{user}\"\n        \
                     key_path = \"{}\"\n",
                    h.port(),
                    h.key_path().display()
                )
            })
            .collect()
    }

    /// Kill it, listener and sessions: the machine gone as far as SSH can tell.
    pub fn kill(&self) {
        kill_tree(self.pid);
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        kill_tree(self.pid);
        let _ = self.child.start_kill();
    }
}

/// Kill `root` and all its descendants (found through /proc/*/stat parent pids).
pub fn kill_tree(root: u32) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    let table: Vec<(u32, u32)> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let after = stat.rsplit_once(')')?.1;
            let ppid = after.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut pids = vec![root];
    let mut i = 0;
    while i < pids.len() {
        let parent = pids[i];
        pids.extend(
            table
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    for pid in pids {
        if let Ok(raw) = i32::try_from(pid) {
            let _ = kill(Pid::from_raw(raw), Signal::SIGKILL);
        }
    }
}

/// The Docker bridge's gateway on this machine (`docker0`'s IPv4 address): a server listening
/// there is reached from this machine and from jobs' containers on any bridge network. Call
/// [`ensure_docker_engine`] first.
pub fn docker_gateway() -> Result<std::net::IpAddr, FixtureError> {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "dev", "docker0"])
        .output()
        .map_err(|e| err("ip addr show docker0", e))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|cidr| cidr.split('/').next())
        .and_then(|ip| ip.parse().ok())
        .ok_or_else(|| err("docker0's address", format!("none in {text:?}")))
}

/// Start the Docker Engine and build [`BUSYBOX_IMAGE`] if needed (once per process; later
/// calls return the first outcome).
pub fn ensure_docker_engine() -> Result<(), FixtureError> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/docker-engine.sh");
        let out = std::process::Command::new("bash")
            .arg(&script)
            .output()
            .map_err(|e| format!("running {}: {e}", script.display()))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{} failed: {}\n{}",
                script.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    })
    .clone()
    .map_err(|why| err("starting the Docker Engine", why))
}
