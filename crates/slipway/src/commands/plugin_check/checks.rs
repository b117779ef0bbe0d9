//! `slipway plugin check`: a conformance check of any fleeting plugin against the `fleeting.v1`
//! contract, run the way a manager runs it (go-plugin handshake, AutoMTLS, supervised restarts).
//!
//! [`CHECKS`] lists the checks in order; [`run`] performs them and returns a [`Report`] with one
//! [`CheckResult`] per check. Instances the check created are always deleted before [`run`]
//! returns, whatever failed, and also when `cancel` fires (Ctrl-C).
//!
//! The checks themselves live beside this file: [`process_checks`](super::process_checks) (the
//! plugin process and `Init`), [`instance_checks`](super::instance_checks) (one instance from
//! `Increase` to `Decrease`) and [`cleanup`](super::cleanup).

use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use slipway_fleeting::host::find_plugin;
use slipway_fleeting::{ConnectInfo, GroupError, PluginHost, PluginOptions};
use tokio_util::sync::CancellationToken;

use super::options::{CheckError, CheckOptions};
use super::report::{CheckResult, Outcome, Report, go_duration, one_line};

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

/// A check's verdict before timing is attached.
pub(super) enum Verdict {
    Pass(String),
    Fail(String),
    Skip(String),
}

/// Progress line on stderr: a long wait (VMs boot for minutes) stays visibly alive.
pub(super) fn progress(message: impl fmt::Display) {
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
        GroupError::Capacity(m) => ("ResourceExhausted", m.as_str()),
        GroupError::Unavailable { message, .. } => ("Unavailable", message.as_str()),
    };
    one_line(&format!("{kind}: {message}"))
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
pub(super) struct Checker<'a> {
    pub(super) opts: &'a CheckOptions,
    pub(super) path: PathBuf,
    pub(super) host: Option<Arc<PluginHost>>,
    results: Vec<CheckResult>,
    /// The good `Init` succeeded on the current host.
    pub(super) initialized: bool,
    /// Instance ids listed before `Increase`: anything else was created by this run.
    pub(super) before: Option<HashSet<String>>,
    /// Ids this run created and has not seen deleted yet: cleanup deletes them.
    pub(super) created: BTreeSet<String>,
    /// The instance the checks use, once running.
    pub(super) instance: Option<String>,
    /// Its `ConnectInfo`, once it passed.
    pub(super) info: Option<ConnectInfo>,
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

    pub(super) fn plugin_options(&self) -> PluginOptions {
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
    pub(super) async fn call<T>(
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

    pub(super) fn host(&self) -> Result<Arc<PluginHost>, Verdict> {
        self.host
            .clone()
            .ok_or_else(|| Verdict::Skip("needs a running plugin (handshake failed)".into()))
    }

    pub(super) fn ready(&self) -> Result<Arc<PluginHost>, Verdict> {
        let host = self.host()?;
        if self.initialized {
            Ok(host)
        } else {
            Err(Verdict::Skip("needs a successful init".into()))
        }
    }

    pub(super) fn instance(&self) -> Result<(Arc<PluginHost>, String), Verdict> {
        let host = self.ready()?;
        match &self.instance {
            Some(id) => Ok((host, id.clone())),
            None => Err(Verdict::Skip(
                "needs the running instance (increase or restart failed)".into(),
            )),
        }
    }
}
