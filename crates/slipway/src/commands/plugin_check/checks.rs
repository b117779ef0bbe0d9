//! `slipway plugin check`: a conformance check of any fleeting plugin against the `fleeting.v1`
//! contract, run the way a manager runs it (go-plugin handshake, AutoMTLS, supervised restarts).
//!
//! [`CHECKS`] lists the checks in order; [`run`] performs them and returns a [`Report`] with one
//! [`CheckResult`] per check. Instances the check created are always deleted before [`run`]
//! returns, whatever failed, and also when `cancel` fires (Ctrl-C).

use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use slipway_connector::{Client, DialOptions, HostKeyStore};
use slipway_fleeting::handshake::Handshake;
use slipway_fleeting::host::{HostError, find_plugin};
use slipway_fleeting::sdk::{ENV_CLIENT_CERT, ENV_PROTOCOL_VERSIONS, ENV_UNIX_SOCKET_DIR};
use slipway_fleeting::{
    ConnectInfo, ConnectorConfig, GroupError, InstanceGroup as _, MAGIC_COOKIE_KEY,
    PROTOCOL_VERSIONS, PluginHost, PluginOptions, State,
};
use tokio::io::AsyncReadExt as _;
use tokio_util::sync::CancellationToken;

use slipway_config::{ConnectorConfigError, ConnectorConfigToml};

/// Every check, in the order it runs (the CHECK column and the JSON `name`).
pub const CHECKS: [&str; 12] = [
    "handshake",
    "cookie",
    "init-bad-config",
    "init",
    "increase",
    "connect-info",
    "ssh",
    "heartbeat",
    "restart",
    "unknown-ids",
    "decrease",
    "shutdown",
];

/// Default for `--timeout`: how long an instance may take to become running or to go away.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Sent as the bad `Init` config: not JSON at all, which every plugin must refuse.
const BAD_CONFIG: &[u8] = b"{\"slipway_plugin_check_unknown_key\": 1,";
/// Bound on a plugin started without the magic cookie: it should exit at once.
const COOKIE_WAIT: Duration = Duration::from_secs(10);
/// Longest pause between two `Update` polls.
const POLL_MAX: Duration = Duration::from_secs(2);
/// How often a long wait reports that it is still alive.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);
/// Longest detail kept (JSON); a failure's full text also goes to stderr.
const DETAIL_MAX: usize = 400;
/// Longest detail shown in the table.
const TABLE_DETAIL_MAX: usize = 100;
/// What `echo` prints in the `ssh` check.
const ECHO_TOKEN: &str = "slipway-plugin-check";

/// Why a check could not even start (bad usage): exit code 2.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// A file named on the command line could not be read.
    #[error("cannot read {what} file {}: {source}", .path.display())]
    Read {
        /// Which option (`-c plugin_config`, `--connector connector_config`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file named on the command line has bad content.
    #[error("{what} file {}: {message}", .path.display())]
    Invalid {
        /// Which option.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the key when there is one.
        message: String,
    },
    /// The plugin executable was not found.
    #[error(transparent)]
    NotFound(#[from] HostError),
}

/// What to check and how.
#[derive(Clone)]
pub struct CheckOptions {
    /// Plugin reference: a name (`local`, `fleeting-plugin-aws`) or a path.
    pub plugin: String,
    /// Directory searched first for `fleeting-plugin-<name>`.
    pub plugin_dir: Option<PathBuf>,
    /// The good `plugin_config` JSON (`-c`).
    pub plugin_config: Vec<u8>,
    /// The connector settings sent with `Init` (`--connector`).
    pub connector: ConnectorConfig,
    /// Dial the external address in the `ssh` check.
    pub use_external_addr: bool,
    /// Log in over SSH and run `echo` on the instance.
    pub connect: bool,
    /// How long an instance may take to be running or gone, and bound on each call.
    pub timeout: Duration,
}

impl fmt::Debug for CheckOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // plugin_config may carry cloud credentials: its size only.
        f.debug_struct("CheckOptions")
            .field("plugin", &self.plugin)
            .field("plugin_dir", &self.plugin_dir)
            .field("plugin_config_len", &self.plugin_config.len())
            .field("connector", &self.connector)
            .field("use_external_addr", &self.use_external_addr)
            .field("connect", &self.connect)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl CheckOptions {
    /// Options for `plugin` with an empty config, no connector settings and the default timeout.
    pub fn new(plugin: impl Into<String>) -> Self {
        CheckOptions {
            plugin: plugin.into(),
            plugin_dir: None,
            plugin_config: b"{}".to_vec(),
            connector: ConnectorConfig::default(),
            use_external_addr: false,
            connect: false,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

/// Read a `plugin_config` JSON file (`-c`); it must hold a JSON object.
pub async fn load_plugin_config(path: &Path) -> Result<Vec<u8>, CheckError> {
    const WHAT: &str = "plugin_config";
    let bytes = tokio::fs::read(path)
        .await
        .map_err(|source| CheckError::Read {
            what: WHAT,
            path: path.to_owned(),
            source,
        })?;
    match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(serde_json::Value::Object(_)) => Ok(bytes),
        Ok(other) => Err(CheckError::Invalid {
            what: WHAT,
            path: path.to_owned(),
            message: format!(
                "expected a JSON object (the [runners.autoscaler.plugin_config] table), found {}",
                json_kind(&other)
            ),
        }),
        Err(e) => Err(CheckError::Invalid {
            what: WHAT,
            path: path.to_owned(),
            message: format!("not valid JSON: {e}"),
        }),
    }
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Read a `connector_config` JSON file (`--connector`): the keys of
/// `[runners.autoscaler.connector_config]`, with `key_path` read here as the manager does.
///
/// Returns the settings and `use_external_addr`.
pub async fn load_connector(path: &Path) -> Result<(ConnectorConfig, bool), CheckError> {
    const WHAT: &str = "connector_config";
    let invalid = |message: String| CheckError::Invalid {
        what: WHAT,
        path: path.to_owned(),
        message,
    };
    let bytes = tokio::fs::read(path)
        .await
        .map_err(|source| CheckError::Read {
            what: WHAT,
            path: path.to_owned(),
            source,
        })?;
    let mut unknown = Vec::new();
    let mut de = serde_json::Deserializer::from_slice(&bytes);
    let mut note = |p: serde_ignored::Path<'_>| unknown.push(p.to_string());
    let raw: ConnectorConfigToml =
        serde_path_to_error::deserialize(serde_ignored::Deserializer::new(&mut de, &mut note))
            .map_err(|e| {
                let at = e.path().to_string();
                if at == "." {
                    invalid(e.inner().to_string())
                } else {
                    invalid(format!("key `{at}`: {}", e.inner()))
                }
            })?;
    if let Some(key) = unknown.first() {
        return Err(invalid(format!(
            "unknown key `{key}` (known: os, arch, protocol, protocol_port, username, password, \
             key_path, use_static_credentials, keepalive, timeout, use_external_addr)"
        )));
    }
    let connector = raw.to_connector_config().await.map_err(
        |ConnectorConfigError::KeyPath { path, source }| {
            invalid(format!("key `key_path`: cannot read {path:?}: {source}"))
        },
    )?;
    Ok((connector, raw.use_external_addr))
}

/// How one check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// The plugin did what the contract asks.
    Pass,
    /// It did not.
    Fail,
    /// Not run (not asked for, or something it needs failed).
    Skip,
}

impl Outcome {
    /// `pass`, `fail` or `skip`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail => "fail",
            Outcome::Skip => "skip",
        }
    }
}

/// One row of the report.
#[derive(Debug, Clone, Serialize)]
pub struct CheckResult {
    /// One of [`CHECKS`].
    pub name: &'static str,
    /// Pass, fail or skip.
    pub result: Outcome,
    /// What was seen, or why it failed or was skipped.
    pub detail: String,
    /// How long the check took, in milliseconds.
    pub ms: u64,
}

/// The outcome of a whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Path of the plugin binary checked.
    pub plugin: String,
    /// True when no check failed (skips allowed).
    pub passed: bool,
    /// The `--timeout` in seconds.
    pub timeout_secs: u64,
    /// One result per entry of [`CHECKS`], in order.
    pub checks: Vec<CheckResult>,
}

impl Report {
    /// Count of (passed, failed, skipped) checks.
    pub fn counts(&self) -> (usize, usize, usize) {
        let n = |o: Outcome| self.checks.iter().filter(|c| c.result == o).count();
        (n(Outcome::Pass), n(Outcome::Fail), n(Outcome::Skip))
    }

    /// The human table: `CHECK  RESULT  DETAIL  TIME` rows, then the summary line.
    pub fn table(&self) -> String {
        let times: Vec<String> = self
            .checks
            .iter()
            .map(|c| go_duration(Duration::from_millis(c.ms)))
            .collect();
        let w_name = self
            .checks
            .iter()
            .map(|c| c.name.len())
            .chain([5])
            .max()
            .unwrap_or(5);
        let details: Vec<String> = self
            .checks
            .iter()
            .map(|c| truncate(&c.detail, TABLE_DETAIL_MAX))
            .collect();
        let w_detail = details
            .iter()
            .map(|d| d.chars().count())
            .chain([6])
            .max()
            .unwrap_or(6);
        let mut out = format!(
            "plugin {} (timeout {})\n",
            self.plugin,
            go_duration(Duration::from_secs(self.timeout_secs))
        );
        out.push_str(&format!(
            "{:<w_name$}  {:<6}  {:<w_detail$}  TIME\n",
            "CHECK", "RESULT", "DETAIL"
        ));
        for ((c, time), detail) in self.checks.iter().zip(&times).zip(&details) {
            out.push_str(&format!(
                "{:<w_name$}  {:<6}  {detail:<w_detail$}  {time}\n",
                c.name,
                c.result.as_str(),
            ));
        }
        let (p, f, s) = self.counts();
        out.push_str(&format!(
            "plugin check: {p} passed, {f} failed, {s} skipped\n"
        ));
        out
    }
}

/// `5m0s`, `1h0m0s`, `30s`, `1.5s`, `250ms`: Go's duration style, as config.toml writes them.
pub fn go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs();
    if secs < 60 {
        let tenths = d.subsec_millis() / 100;
        return if tenths == 0 {
            format!("{secs}s")
        } else {
            format!("{secs}.{tenths}s")
        };
    }
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else {
        format!("{m}m{s}s")
    }
}

/// A check's verdict before timing is attached.
enum Verdict {
    Pass(String),
    Fail(String),
    Skip(String),
}

/// Progress line on stderr: a long wait (VMs boot for minutes) stays visibly alive.
fn progress(message: impl fmt::Display) {
    use std::io::Write as _;
    // Not eprintln!: a closed stderr must not abort the run before it cleans up.
    let _ = writeln!(std::io::stderr(), "plugin check: {message}");
}

/// A contract error with its gRPC-ish kind, for details.
fn describe(e: &GroupError) -> String {
    let (kind, message) = match e {
        GroupError::InvalidArgument(m) => ("InvalidArgument", m.as_str()),
        GroupError::NotFound(m) => ("NotFound", m.as_str()),
        GroupError::FailedPrecondition(m) => ("FailedPrecondition", m.as_str()),
        GroupError::Provider(m) => ("Internal", m.as_str()),
        GroupError::Unavailable { message, .. } => ("Unavailable", message.as_str()),
    };
    one_line(&format!("{kind}: {message}"))
}

/// Details are table cells: one line, bounded length (the table cuts them shorter).
fn one_line(s: &str) -> String {
    let flat: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    truncate(
        &flat.split_whitespace().collect::<Vec<_>>().join(" "),
        DETAIL_MAX,
    )
}

/// At most `max` characters, the cut marked with `...`.
fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() > max {
        let cut: String = s.chars().take(max.saturating_sub(3)).collect();
        format!("{cut}...")
    } else {
        s.to_owned()
    }
}

/// Run every check against the plugin; `cancel` (Ctrl-C) stops the checks and cleans up.
///
/// Errors only when the plugin cannot be found; everything else is a row of the report.
pub async fn run(opts: &CheckOptions, cancel: &CancellationToken) -> Result<Report, CheckError> {
    let path = find_plugin(&opts.plugin, opts.plugin_dir.as_deref())?;
    let mut checker = Checker {
        opts,
        path: path.clone(),
        host: None,
        results: Vec::new(),
        initialized: false,
        before: None,
        created: BTreeSet::new(),
        instance: None,
        info: None,
    };
    let interrupted = tokio::select! {
        () = checker.checks() => false,
        () = cancel.cancelled() => true,
    };
    if interrupted {
        progress("interrupted: cleaning up");
    }
    checker.cleanup().await;
    if !interrupted {
        let start = Instant::now();
        let verdict = checker.shutdown().await;
        checker.record("shutdown", start, verdict);
    } else if let Some(host) = checker.host.take() {
        host.stop().await;
    }
    // Rows the interruption never reached.
    let mut first_missing = true;
    for name in CHECKS {
        if !checker.results.iter().any(|r| r.name == name) {
            let (result, detail) = if first_missing && interrupted {
                (Outcome::Fail, "interrupted (signal)")
            } else {
                (Outcome::Skip, "not reached: interrupted")
            };
            first_missing = false;
            checker.results.push(CheckResult {
                name,
                result,
                detail: detail.to_owned(),
                ms: 0,
            });
        }
    }
    let mut checks = checker.results;
    checks.sort_by_key(|c| CHECKS.iter().position(|n| *n == c.name));
    let passed = !interrupted && checks.iter().all(|c| c.result != Outcome::Fail);
    Ok(Report {
        plugin: path.display().to_string(),
        passed,
        timeout_secs: opts.timeout.as_secs(),
        checks,
    })
}

/// State carried from check to check.
struct Checker<'a> {
    opts: &'a CheckOptions,
    path: PathBuf,
    host: Option<Arc<PluginHost>>,
    results: Vec<CheckResult>,
    /// The good `Init` succeeded on the current host.
    initialized: bool,
    /// Instance ids listed before `Increase`: anything else was created by this run.
    before: Option<HashSet<String>>,
    /// Ids this run created and has not seen deleted yet: cleanup deletes them.
    created: BTreeSet<String>,
    /// The instance the checks use, once running.
    instance: Option<String>,
    /// Its `ConnectInfo`, once it passed.
    info: Option<ConnectInfo>,
}

impl Checker<'_> {
    fn record(&mut self, name: &'static str, start: Instant, verdict: Verdict) {
        let (result, detail) = match verdict {
            Verdict::Pass(d) => (Outcome::Pass, d),
            Verdict::Fail(d) => (Outcome::Fail, d),
            Verdict::Skip(d) => (Outcome::Skip, d),
        };
        let ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        if result == Outcome::Fail {
            progress(format_args!("{name}: FAIL: {detail}"));
        }
        self.results.push(CheckResult {
            name,
            result,
            detail: one_line(&detail),
            ms,
        });
    }

    /// Every check but `shutdown`, in order. Dropped mid-way on Ctrl-C.
    async fn checks(&mut self) {
        macro_rules! check {
            ($name:literal, $f:ident) => {{
                let start = Instant::now();
                let verdict = self.$f().await;
                self.record($name, start, verdict);
            }};
        }
        check!("handshake", handshake);
        check!("cookie", cookie);
        check!("init-bad-config", init_bad_config);
        check!("init", init);
        check!("increase", increase);
        check!("connect-info", connect_info);
        check!("ssh", ssh);
        check!("heartbeat", heartbeat);
        check!("restart", restart);
        check!("unknown-ids", unknown_ids);
        check!("decrease", decrease);
    }

    fn plugin_options(&self) -> PluginOptions {
        let mut o = PluginOptions::new(
            slipway_manager::runner::plugin_name(&self.opts.plugin),
            &self.path,
        )
        .handshake_timeout(self.opts.timeout.min(Duration::from_secs(60)))
        .call_wait(self.opts.timeout)
        .plugin_config(self.opts.plugin_config.clone())
        .connector(self.opts.connector.clone());
        // Quick restarts: the restart check should not wait on backoff.
        o.process.restart_backoff = Duration::from_millis(100);
        o
    }

    /// Bound one plugin call by the timeout.
    async fn call<T>(
        &self,
        what: &str,
        fut: impl Future<Output = Result<T, GroupError>>,
    ) -> Result<T, String> {
        match tokio::time::timeout(self.opts.timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(format!("{what}: {}", describe(&e))),
            Err(_) => Err(format!(
                "{what}: no answer within {}",
                go_duration(self.opts.timeout)
            )),
        }
    }

    fn host(&self) -> Result<Arc<PluginHost>, Verdict> {
        self.host
            .clone()
            .ok_or_else(|| Verdict::Skip("needs a running plugin (handshake failed)".into()))
    }

    fn ready(&self) -> Result<Arc<PluginHost>, Verdict> {
        let host = self.host()?;
        if self.initialized {
            Ok(host)
        } else {
            Err(Verdict::Skip("needs a successful init".into()))
        }
    }

    fn instance(&self) -> Result<(Arc<PluginHost>, String), Verdict> {
        let host = self.ready()?;
        match &self.instance {
            Some(id) => Ok((host, id.clone())),
            None => Err(Verdict::Skip(
                "needs the running instance (increase or restart failed)".into(),
            )),
        }
    }

    async fn handshake(&mut self) -> Verdict {
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
    async fn cookie(&mut self) -> Verdict {
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

    async fn init_bad_config(&mut self) -> Verdict {
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

    async fn init(&mut self) -> Verdict {
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

    async fn increase(&mut self) -> Verdict {
        let host = match self.ready() {
            Ok(h) => h,
            Err(v) => return v,
        };
        let before: HashSet<String> = match self.call("Update", host.update()).await {
            Ok(list) => list.into_iter().map(|(id, _)| id).collect(),
            Err(e) => return Verdict::Fail(format!("before Increase: {e}")),
        };
        self.before = Some(before.clone());
        let n = match self.call("Increase(1)", host.increase(1)).await {
            Ok(n) => n,
            Err(e) => return Verdict::Fail(e),
        };
        if n == 0 {
            return Verdict::Fail("Increase(1) requested no instance (returned 0)".into());
        }
        let timeout = self.opts.timeout;
        progress(format_args!(
            "waiting up to {} for the new instance to be running",
            go_duration(timeout)
        ));
        let start = Instant::now();
        let mut poll = Poll::new(timeout);
        let mut last = String::from("not listed yet");
        loop {
            let list = match self.call("Update", host.update()).await {
                Ok(l) => l,
                Err(e) => return Verdict::Fail(e),
            };
            let new: Vec<(String, State)> = list
                .into_iter()
                .filter(|(id, _)| !before.contains(id))
                .collect();
            self.created.extend(new.iter().map(|(id, _)| id.clone()));
            if let Some((id, _)) = new.iter().find(|(_, s)| *s == State::Running) {
                self.instance = Some(id.clone());
                let mut d = format!(
                    "instance {id} running after {} (timeout {})",
                    go_duration(start.elapsed()),
                    go_duration(timeout)
                );
                if n != 1 || new.len() != 1 {
                    d.push_str(&format!(
                        "; but Increase(1) returned {n} and {} new instances are listed",
                        new.len()
                    ));
                    return Verdict::Fail(d);
                }
                return Verdict::Pass(d);
            }
            if let Some((id, s)) = new
                .iter()
                .find(|(_, s)| matches!(s, State::Timeout | State::Deleted | State::Deleting))
            {
                return Verdict::Fail(format!(
                    "instance {id} went to {s} instead of running (after {})",
                    go_duration(start.elapsed())
                ));
            }
            if let Some((id, s)) = new.first() {
                last = format!("{id} {s}");
            }
            if !poll.wait(&format!("new instance: {last}")).await {
                return Verdict::Fail(format!(
                    "no new instance running within {} (last seen: {last})",
                    go_duration(timeout)
                ));
            }
        }
    }

    async fn connect_info(&mut self) -> Verdict {
        let (host, id) = match self.instance() {
            Ok(v) => v,
            Err(v) => return v,
        };
        let ci = match self.call("ConnectInfo", host.connect_info(&id)).await {
            Ok(ci) => ci,
            Err(e) => return Verdict::Fail(e),
        };
        let c = &ci.connector;
        let mut problems = Vec::new();
        if ci.id != id {
            problems.push(format!("id {:?} does not match {id:?}", ci.id));
        }
        let addr = if self.opts.use_external_addr && !ci.external_addr.is_empty() {
            &ci.external_addr
        } else if !ci.internal_addr.is_empty() {
            &ci.internal_addr
        } else {
            &ci.external_addr
        };
        if addr.is_empty() {
            problems.push("no address (internal_addr and external_addr are empty)".to_owned());
        }
        if self.opts.use_external_addr && ci.external_addr.is_empty() {
            problems.push("use_external_addr is set but external_addr is empty".to_owned());
        }
        if !matches!(c.protocol.as_str(), "" | "ssh" | "winrm") {
            problems.push(format!(
                "protocol {:?} is not ssh or winrm",
                c.protocol.as_str()
            ));
        }
        if c.username.is_empty() {
            problems.push("no username".to_owned());
        }
        let auth = match (c.key.is_empty(), c.password.is_empty()) {
            (false, false) => "key+password",
            (false, true) => "key",
            (true, false) => "password",
            (true, true) if c.use_static_credentials => "static credentials",
            (true, true) => {
                problems.push(
                    "no credentials: key and password are empty and use_static_credentials is false"
                        .to_owned(),
                );
                "none"
            }
        };
        let expiry = match ci.expires {
            None => "no expiry".to_owned(),
            Some(t) => match t.duration_since(SystemTime::now()) {
                Ok(left) => format!("expires in {}", go_duration(left)),
                Err(_) => {
                    problems.push("expires is in the past".to_owned());
                    "expired".to_owned()
                }
            },
        };
        let protocol = if c.protocol.is_empty() {
            "ssh(default)"
        } else {
            c.protocol.as_str()
        };
        let port = if c.protocol_port == 0 || addr.contains(':') {
            String::new()
        } else {
            format!(" port {}", c.protocol_port)
        };
        let os = match (c.os.is_empty(), c.arch.is_empty()) {
            (true, true) => String::new(),
            (false, true) => format!(" {}", c.os),
            (true, false) => format!(" {}", c.arch),
            (false, false) => format!(" {}/{}", c.os, c.arch),
        };
        let d = format!(
            "{protocol} {}@{addr}{port}{os}, {auth} auth, {expiry}",
            c.username
        );
        if problems.is_empty() {
            self.info = Some(ci);
            Verdict::Pass(d)
        } else {
            Verdict::Fail(format!("{}; got {d}", problems.join("; ")))
        }
    }

    async fn ssh(&mut self) -> Verdict {
        if !self.opts.connect {
            return Verdict::Skip("pass --connect to log in over SSH and run echo".into());
        }
        let Some(info) = self.info.clone() else {
            return Verdict::Skip("needs a valid ConnectInfo".into());
        };
        let dial = DialOptions {
            use_external_addr: self.opts.use_external_addr,
        };
        let pins = HostKeyStore::new();
        let timeout = self.opts.timeout;
        let mut poll = Poll::new(timeout);
        // "running" may come before sshd accepts (a VM still booting): retry until the timeout.
        let client = loop {
            match tokio::time::timeout(timeout, Client::connect(&info, &dial, &pins)).await {
                Ok(Ok(c)) => break c,
                Ok(Err(e)) => {
                    let e = one_line(&e.to_string());
                    if !poll
                        .wait(&format!("ssh to {} not ready: {e}", info.id))
                        .await
                    {
                        return Verdict::Fail(format!(
                            "no SSH login within {}: {e}",
                            go_duration(timeout)
                        ));
                    }
                }
                Err(_) => {
                    return Verdict::Fail(format!(
                        "SSH connect did not finish within {}",
                        go_duration(timeout)
                    ));
                }
            }
        };
        let addr = client.addr().to_owned();
        let ran = tokio::time::timeout(
            timeout,
            client.run_capture(format!("echo {ECHO_TOKEN}"), Vec::new()),
        )
        .await;
        client.close().await;
        match ran {
            Ok(Ok((status, out, _))) if status.success() => {
                let out = String::from_utf8_lossy(&out);
                if out.trim() == ECHO_TOKEN {
                    Verdict::Pass(format!(
                        "logged in as {}@{addr}, `echo {ECHO_TOKEN}` printed it back",
                        info.connector.username
                    ))
                } else {
                    Verdict::Fail(format!("`echo {ECHO_TOKEN}` printed {:?}", one_line(&out)))
                }
            }
            Ok(Ok((status, _, err))) => Verdict::Fail(format!(
                "`echo` on {addr} ended with {status}: {}",
                one_line(&String::from_utf8_lossy(&err))
            )),
            Ok(Err(e)) => Verdict::Fail(format!("running echo on {addr}: {e}")),
            Err(_) => Verdict::Fail(format!(
                "`echo` on {addr} did not finish within {}",
                go_duration(timeout)
            )),
        }
    }

    async fn heartbeat(&mut self) -> Verdict {
        let (host, id) = match self.instance() {
            Ok(v) => v,
            Err(v) => return v,
        };
        match self.call("Heartbeat", host.heartbeat(&id)).await {
            Ok(()) => Verdict::Pass(format!("instance {id} healthy")),
            Err(e) => Verdict::Fail(e),
        }
    }

    /// SIGKILL the plugin; the host restarts it and re-sends the good Init; the instance must
    /// still be listed (state survives a restart, without booting anything again).
    async fn restart(&mut self) -> Verdict {
        let (host, id) = match self.instance() {
            Ok(v) => v,
            Err(v) => return v,
        };
        let Some(old) = host.pid() else {
            return Verdict::Fail("the plugin process is not running".into());
        };
        let restarts = host.restarts();
        let Ok(raw) = i32::try_from(old) else {
            return Verdict::Fail(format!("pid {old} out of range"));
        };
        if let Err(e) = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(raw),
            nix::sys::signal::Signal::SIGKILL,
        ) {
            return Verdict::Fail(format!("SIGKILL of pid {old}: {e}"));
        }
        progress(format_args!(
            "killed plugin pid {old}; waiting for the host to restart it and re-send Init"
        ));
        // Update waits for the restart (host call_wait = timeout) and retries on the new process.
        let timeout = self.opts.timeout;
        let mut poll = Poll::new(timeout);
        loop {
            let list = match self.call("Update after the restart", host.update()).await {
                Ok(l) => l,
                Err(e) => return Verdict::Fail(e),
            };
            let new_pid = host.pid();
            if host.restarts() == restarts || new_pid == Some(old) {
                // Answered by the old connection before the death was noticed: ask again.
                if !poll.wait("plugin restart").await {
                    return Verdict::Fail(format!(
                        "the host did not restart the plugin within {}",
                        go_duration(timeout)
                    ));
                }
                continue;
            }
            let new_pid = new_pid.map_or_else(|| "?".to_owned(), |p| p.to_string());
            match list.iter().find(|(i, _)| *i == id).map(|(_, s)| *s) {
                Some(State::Running) => {
                    return Verdict::Pass(format!(
                        "killed pid {old}; restarted as pid {new_pid}, Init re-sent; Update \
                         lists {id} running"
                    ));
                }
                None => {
                    // Nothing left to delete through the plugin; a cloud machine may be leaked.
                    self.instance = None;
                    self.created.remove(&id);
                    progress(format_args!(
                        "the plugin forgot instance {id}: if it is a real machine, delete it by hand"
                    ));
                    return Verdict::Fail(format!(
                        "{id} not listed after the restart (pid {old} killed, now {new_pid}): \
                         the plugin lost its instances; keep state on disk or ask the provider"
                    ));
                }
                Some(s @ (State::Creating | State::Timeout | State::Deleting | State::Deleted)) => {
                    if matches!(s, State::Timeout | State::Deleting | State::Deleted)
                        || !poll.wait(&format!("{id} {s} after the restart")).await
                    {
                        return Verdict::Fail(format!(
                            "after the restart Update lists {id} as {s}, not running"
                        ));
                    }
                }
            }
        }
    }

    async fn unknown_ids(&mut self) -> Verdict {
        let host = match self.ready() {
            Ok(h) => h,
            Err(v) => return v,
        };
        let fake = format!("slipway-check-no-such-instance-{}", std::process::id());
        let restarts = host.restarts();
        let mut problems = Vec::new();
        let mut seen = Vec::new();
        let ci = self
            .call("ConnectInfo", async {
                host.connect_info(&fake).await.map(|_| ())
            })
            .await;
        let hb = self.call("Heartbeat", host.heartbeat(&fake)).await;
        for (what, r) in [("ConnectInfo", ci), ("Heartbeat", hb)] {
            match r {
                Ok(()) => problems.push(format!("{what} of unknown id {fake} succeeded")),
                Err(e) if e.contains("Unavailable") || e.contains("no answer") => problems.push(e),
                Err(e) if e.contains("NotFound") => seen.push(format!("{what}: NotFound")),
                Err(e) => seen.push(format!("{what}: {} (NotFound preferred)", error_kind(&e))),
            }
        }
        match self
            .call("Decrease", host.decrease(std::slice::from_ref(&fake)))
            .await
        {
            Ok(ids) if ids.contains(&fake) => {
                problems.push(format!("Decrease reported unknown id {fake} as deleted"));
            }
            Ok(_) => seen.push("Decrease: not reported deleted".to_owned()),
            Err(e) if e.contains("Unavailable") || e.contains("no answer") => problems.push(e),
            Err(e) => seen.push(format!("Decrease: {}", error_kind(&e))),
        }
        if host.restarts() != restarts {
            problems.push("the plugin process died during these calls".to_owned());
        }
        if problems.is_empty() {
            Verdict::Pass(seen.join(", "))
        } else {
            Verdict::Fail(problems.join("; "))
        }
    }

    async fn decrease(&mut self) -> Verdict {
        let (host, id) = match self.instance() {
            Ok(v) => v,
            Err(v) => return v,
        };
        match self
            .call("Decrease", host.decrease(std::slice::from_ref(&id)))
            .await
        {
            Ok(ids) if ids.contains(&id) => {}
            Ok(ids) => {
                return Verdict::Fail(format!(
                    "Decrease([{id}]) did not accept it (returned {ids:?})"
                ));
            }
            Err(e) => return Verdict::Fail(e),
        }
        let timeout = self.opts.timeout;
        progress(format_args!(
            "waiting up to {} for instance {id} to be gone",
            go_duration(timeout)
        ));
        match self.wait_gone(std::slice::from_ref(&id)).await {
            Ok(took) => {
                self.created.remove(&id);
                self.instance = None;
                Verdict::Pass(format!(
                    "instance {id} gone after {} (timeout {})",
                    go_duration(took),
                    go_duration(timeout)
                ))
            }
            Err(e) => Verdict::Fail(e),
        }
    }

    /// Poll `Update` until none of `ids` is listed (or each is `deleted`).
    async fn wait_gone(&self, ids: &[String]) -> Result<Duration, String> {
        let host = self
            .host
            .clone()
            .ok_or_else(|| "the plugin is not running".to_owned())?;
        let start = Instant::now();
        let mut poll = Poll::new(self.opts.timeout);
        loop {
            let list = self.call("Update", host.update()).await?;
            let left: Vec<String> = list
                .iter()
                .filter(|(i, s)| ids.contains(i) && *s != State::Deleted)
                .map(|(i, s)| format!("{i} {s}"))
                .collect();
            if left.is_empty() {
                return Ok(start.elapsed());
            }
            let left = left.join(", ");
            if !poll.wait(&format!("still listed: {left}")).await {
                return Err(format!(
                    "still listed after {}: {left}",
                    go_duration(self.opts.timeout)
                ));
            }
        }
    }

    /// Delete whatever this run created and is still listed; restart the plugin if needed.
    async fn cleanup(&mut self) {
        // Without the list taken before Increase, this run never asked for an instance.
        let Some(before) = self.before.clone() else {
            return;
        };
        // The host may be gone (a fresh process failed, restarts given up): start another.
        let usable = match &self.host {
            Some(h) if self.initialized => self.call("Update", h.update()).await.is_ok(),
            _ => false,
        };
        if !usable {
            progress("cleanup: starting the plugin again to delete what this run created");
            if let Some(h) = self.host.take() {
                h.stop().await;
            }
            let started = match PluginHost::start(self.plugin_options()).await {
                Ok(h) => h,
                Err(e) => {
                    progress(format_args!("cleanup: cannot start the plugin: {e}"));
                    return self.left_behind();
                }
            };
            if let Err(e) = self.call("Init", started.init_from_options()).await {
                started.stop().await;
                progress(format_args!("cleanup: cannot initialize the plugin: {e}"));
                return self.left_behind();
            }
            self.host = Some(Arc::new(started));
            self.initialized = true;
        }
        let Some(host) = self.host.clone() else {
            return;
        };
        // Everything listed now that was not there before Increase is this run's.
        let ours: Vec<String> = match self.call("Update", host.update()).await {
            Ok(list) => list
                .into_iter()
                .filter(|(i, s)| {
                    (!before.contains(i) || self.created.contains(i)) && *s != State::Deleted
                })
                .map(|(i, _)| i)
                .collect(),
            Err(e) => {
                progress(format_args!("cleanup: {e}"));
                return self.left_behind();
            }
        };
        if ours.is_empty() {
            self.created.clear();
            return;
        }
        progress(format_args!(
            "cleanup: deleting {} and waiting up to {} for it",
            ours.join(", "),
            go_duration(self.opts.timeout)
        ));
        self.created.extend(ours.iter().cloned());
        if let Err(e) = self.call("Decrease", host.decrease(&ours)).await {
            progress(format_args!("cleanup: {e}"));
        }
        match self.wait_gone(&ours).await {
            Ok(_) => {
                self.created.clear();
                progress("cleanup: done");
            }
            Err(e) => {
                progress(format_args!("cleanup: {e}"));
                self.left_behind();
            }
        }
    }

    /// Say which instances may be left for the operator to delete.
    fn left_behind(&self) {
        if !self.created.is_empty() {
            let ids: Vec<&str> = self.created.iter().map(String::as_str).collect();
            progress(format_args!(
                "instances possibly left behind, delete them by hand: {}",
                ids.join(", ")
            ));
        }
    }

    /// `Shutdown`, then stop the process the go-plugin way; nothing of its group may remain.
    async fn shutdown(&mut self) -> Verdict {
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

/// Growing pauses between polls under one deadline, with a progress line now and then.
struct Poll {
    deadline: Instant,
    delay: Duration,
    started: Instant,
    last_report: Instant,
}

impl Poll {
    fn new(timeout: Duration) -> Poll {
        let now = Instant::now();
        Poll {
            deadline: now + timeout,
            delay: Duration::from_millis(100),
            started: now,
            last_report: now,
        }
    }

    /// Sleep before the next poll; false once the deadline has passed.
    async fn wait(&mut self, status: &str) -> bool {
        let now = Instant::now();
        if now >= self.deadline {
            return false;
        }
        if now.duration_since(self.last_report) >= PROGRESS_EVERY {
            self.last_report = now;
            progress(format_args!(
                "still waiting ({} of {}): {status}",
                go_duration(now.duration_since(self.started)),
                go_duration(self.deadline.duration_since(self.started))
            ));
        }
        tokio::time::sleep(self.delay.min(self.deadline - now)).await;
        self.delay = (self.delay * 2).min(POLL_MAX);
        true
    }
}

/// `InvalidArgument` out of `Call: InvalidArgument: ...` (see [`describe`]).
fn error_kind(e: &str) -> &str {
    e.split(": ").nth(1).unwrap_or(e)
}

fn versions() -> String {
    PROTOCOL_VERSIONS
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_style_durations() {
        assert_eq!(go_duration(Duration::from_secs(300)), "5m0s");
        assert_eq!(go_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(go_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_duration(Duration::from_millis(250)), "250ms");
    }

    #[test]
    fn table_has_a_row_per_check_and_a_summary() {
        let report = Report {
            plugin: "/x/fleeting-plugin-y".into(),
            passed: false,
            timeout_secs: 300,
            checks: CHECKS
                .iter()
                .enumerate()
                .map(|(i, n)| CheckResult {
                    name: n,
                    result: if i == 1 { Outcome::Fail } else { Outcome::Pass },
                    detail: "d".into(),
                    ms: 5,
                })
                .collect(),
        };
        let t = report.table();
        assert!(t.contains("timeout 5m0s"), "{t}");
        assert!(
            t.lines().any(|l| l.starts_with("cookie           fail")),
            "{t}"
        );
        assert!(
            t.ends_with("plugin check: 11 passed, 1 failed, 0 skipped\n"),
            "{t}"
        );
    }

    #[tokio::test]
    async fn connector_file_reads_key_path_and_names_bad_keys() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("id");
        std::fs::write(&key, "KEY").unwrap();
        let good = dir.path().join("good.json");
        std::fs::write(
            &good,
            format!(
                r#"{{"username":"u","key_path":"{}","timeout":"10s","use_external_addr":true}}"#,
                key.display()
            ),
        )
        .unwrap();
        let (c, external) = load_connector(&good).await.unwrap();
        assert_eq!((c.username.as_str(), c.key.as_slice()), ("u", &b"KEY"[..]));
        assert_eq!(c.timeout, Duration::from_secs(10));
        assert!(external);
        for (text, want) in [
            (r#"{"usernme":"u"}"#, "unknown key `usernme`"),
            (r#"{"protocol_port":"x"}"#, "key `protocol_port`"),
            (r#"{"timeout":"soon"}"#, "key `timeout`"),
        ] {
            let bad = dir.path().join("bad.json");
            std::fs::write(&bad, text).unwrap();
            let err = load_connector(&bad).await.unwrap_err().to_string();
            assert!(err.contains(want) && err.contains("bad.json"), "{err}");
        }
        let err = load_plugin_config(&dir.path().join("none.json"))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("none.json"), "{err}");
    }

    #[test]
    fn details_are_one_bounded_line() {
        let s = one_line(&format!("a\nb\t{}", "x".repeat(500)));
        assert!(!s.contains('\n') && s.starts_with("a b x") && s.chars().count() == DETAIL_MAX);
        assert_eq!(truncate("abcdef", 5), "ab...");
    }
}
