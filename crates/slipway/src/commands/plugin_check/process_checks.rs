//! Checks of the plugin process and its `Init`: `handshake`, `cookie`, `init-bad-config`,
//! `init`, and `shutdown` at the end.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use slipway_fleeting::handshake::Handshake;
use slipway_fleeting::sdk::{ENV_CLIENT_CERT, ENV_PROTOCOL_VERSIONS, ENV_UNIX_SOCKET_DIR};
use slipway_fleeting::{InstanceGroup as _, MAGIC_COOKIE_KEY, PROTOCOL_VERSIONS, PluginHost};
use tokio::io::AsyncReadExt as _;

use super::checks::{Checker, Verdict, progress};
use super::report::{go_duration, one_line, truncate};

/// Sent as the bad `Init` config: not JSON at all, which every plugin must refuse.
const BAD_CONFIG: &[u8] = b"{\"slipway_plugin_check_unknown_key\": 1,";
/// Bound on a plugin started without the magic cookie: it should exit at once.
const COOKIE_WAIT: Duration = Duration::from_secs(10);

impl Checker<'_> {
    pub(super) async fn handshake(&mut self) -> Verdict {
        match PluginHost::start(self.plugin_options()).await {
            Ok(host) => {
                let pid = host.pid().map_or_else(|| "?".to_owned(), |p| p.to_string());
                self.host = Some(Arc::new(host));
                Verdict::Pass(format!(
                    "pid {pid}: go-plugin line valid, app protocol {}, gRPC health SERVING",
                    versions()
                ))
            }
            Err(e) => Verdict::Fail(e.to_string()),
        }
    }

    /// Started by hand (no magic cookie), a plugin must refuse to run.
    pub(super) async fn cookie(&mut self) -> Verdict {
        let mut cmd = tokio::process::Command::new(&self.path);
        cmd.env_remove(MAGIC_COOKIE_KEY)
            .env_remove(ENV_PROTOCOL_VERSIONS)
            .env_remove(ENV_CLIENT_CERT)
            .env_remove(ENV_UNIX_SOCKET_DIR)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Own group: a timeout kills whatever it started, too.
            .process_group(0)
            .kill_on_drop(true);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => return Verdict::Fail(format!("cannot run {}: {e}", self.path.display())),
        };
        let pgid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut stdout = child.stdout.take();
        let mut stderr = child.stderr.take();
        let read_all = async {
            let a = async {
                if let Some(s) = stdout.as_mut() {
                    let _ = s.read_to_end(&mut out).await;
                }
            };
            let b = async {
                if let Some(s) = stderr.as_mut() {
                    let _ = s.read_to_end(&mut err).await;
                }
            };
            tokio::join!(a, b);
            child.wait().await
        };
        let wait = COOKIE_WAIT.min(self.opts.timeout);
        let status = tokio::time::timeout(wait, read_all).await;
        let status = match status {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Verdict::Fail(format!("waiting for it: {e}")),
            Err(_) => {
                if pgid > 0 {
                    let _ = nix::sys::signal::killpg(
                        nix::unistd::Pid::from_raw(pgid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                let _ = child.wait().await;
                return Verdict::Fail(format!(
                    "started without {MAGIC_COOKIE_KEY}, it was still running after {}: \
                     it must exit with an error",
                    go_duration(wait)
                ));
            }
        };
        let out = String::from_utf8_lossy(&out);
        if let Some(line) = out
            .lines()
            .find(|l| Handshake::parse(l.trim(), PROTOCOL_VERSIONS).is_ok())
        {
            return Verdict::Fail(format!(
                "printed a handshake line without {MAGIC_COOKIE_KEY}: {line}"
            ));
        }
        if status.success() {
            return Verdict::Fail(format!(
                "exited 0 without {MAGIC_COOKIE_KEY}; it must refuse to run (non-zero exit)"
            ));
        }
        let err = String::from_utf8_lossy(&err);
        let said = err.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        let how = status
            .code()
            .map_or_else(|| status.to_string(), |c| format!("exit status {c}"));
        let said = truncate(&one_line(said), 36);
        Verdict::Pass(format!(
            "without the cookie: {how}, no handshake line; stderr: {said:?}"
        ))
    }

    pub(super) async fn init_bad_config(&mut self) -> Verdict {
        let host = match self.host() {
            Ok(h) => h,
            Err(v) => return v,
        };
        let restarts = host.restarts();
        let result = self
            .call("Init", host.init(BAD_CONFIG, &self.opts.connector))
            .await
            .map_err(|e| e.strip_prefix("Init: ").map_or(e.clone(), str::to_owned));
        let died = host.restarts() != restarts;
        match result {
            Ok(_) => {
                // It is initialized now: the good Init needs a fresh process.
                if let Some(h) = self.host.take() {
                    h.stop().await;
                }
                match PluginHost::start(self.plugin_options()).await {
                    Ok(h) => self.host = Some(Arc::new(h)),
                    Err(e) => progress(format_args!("restarting the plugin failed: {e}")),
                }
                Verdict::Fail(
                    "Init accepted a plugin_config that is not JSON; it must return an error \
                     (InvalidArgument)"
                        .into(),
                )
            }
            Err(e) if died || e.contains("Unavailable") => Verdict::Fail(format!(
                "the plugin crashed on a plugin_config that is not JSON instead of returning \
                 InvalidArgument ({e})"
            )),
            Err(e) if e.contains("InvalidArgument") => {
                Verdict::Pass(format!("not-JSON config rejected: {e}"))
            }
            Err(e) => Verdict::Pass(format!(
                "not-JSON config rejected (InvalidArgument preferred): {e}"
            )),
        }
    }

    pub(super) async fn init(&mut self) -> Verdict {
        let host = match self.host() {
            Ok(h) => h,
            Err(v) => return v,
        };
        match self
            .call(
                "Init",
                host.init(&self.opts.plugin_config, &self.opts.connector),
            )
            .await
        {
            Ok(info) => {
                self.initialized = true;
                let mut d = format!(
                    "group {:?}, max_size {}, version {:?}",
                    info.id, info.max_size, info.version
                );
                if !info.capabilities.is_empty() {
                    d.push_str(&format!(", capabilities {}", info.capabilities.join(",")));
                }
                if info.id.is_empty() {
                    return Verdict::Fail(format!("{d}: the group id is empty"));
                }
                Verdict::Pass(d)
            }
            Err(e) => Verdict::Fail(e),
        }
    }

    /// `Shutdown`, then stop the process the go-plugin way; nothing of its group may remain.
    pub(super) async fn shutdown(&mut self) -> Verdict {
        let Some(host) = self.host.take() else {
            return Verdict::Skip("needs a running plugin (handshake failed)".into());
        };
        let pid = host.pid();
        let rpc = self.call("Shutdown", host.shutdown()).await;
        host.stop().await;
        let mut problems = Vec::new();
        if let Err(e) = &rpc {
            problems.push(e.clone());
        }
        let Some(pid) = pid else {
            problems.push("no plugin process to stop".into());
            return Verdict::Fail(problems.join("; "));
        };
        let Ok(raw) = i32::try_from(pid) else {
            return Verdict::Fail(format!("pid {pid} out of range"));
        };
        // The plugin leads its own process group: a live member after stop() is an orphan.
        let group_alive = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(raw), None).is_ok();
        if group_alive {
            problems.push(format!("processes of group {pid} still running after stop"));
        }
        if Path::new(&format!("/proc/{pid}")).exists() {
            problems.push(format!("pid {pid} still exists (not exited or not reaped)"));
        }
        if problems.is_empty() {
            Verdict::Pass(format!(
                "Shutdown ok; plugin pid {pid} exited and was reaped, no process left in its group"
            ))
        } else {
            Verdict::Fail(problems.join("; "))
        }
    }
}

fn versions() -> String {
    PROTOCOL_VERSIONS
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}
