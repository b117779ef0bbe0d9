//! `slipway plugin check` run as a user runs it, for the conformance tests beside each plugin.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::FixtureError;
use crate::guest::bin_dir;

/// One `slipway plugin check --json` run.
#[derive(Debug)]
pub struct CheckRun {
    /// Exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    /// The JSON report on stdout.
    pub report: Value,
    /// Progress and errors (stderr).
    pub stderr: String,
}

impl CheckRun {
    /// The result (`pass`, `fail`, `skip`) of the check `name`, or `missing`.
    pub fn result(&self, name: &str) -> &str {
        self.check(name)
            .and_then(|c| c["result"].as_str())
            .unwrap_or("missing")
    }

    /// The JSON row of check `name`.
    pub fn check(&self, name: &str) -> Option<&Value> {
        self.report["checks"]
            .as_array()?
            .iter()
            .find(|c| c["name"] == name)
    }

    /// Names of the checks that did not pass (failed or missing), with why.
    pub fn failures(&self) -> Vec<String> {
        self.report["checks"]
            .as_array()
            .map(|checks| {
                checks
                    .iter()
                    .filter(|c| c["result"] == "fail")
                    .map(|c| format!("{}: {}", c["name"], c["detail"]))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Everything, for an assertion message.
    pub fn explain(&self) -> String {
        format!(
            "exit {:?}\n--- report\n{:#}\n--- stderr\n{}",
            self.code, self.report, self.stderr
        )
    }
}

/// The `slipway` binary beside the test (built with `cargo build -p slipway` when absent).
pub fn slipway_binary() -> Result<PathBuf, FixtureError> {
    let path = bin_dir().join("slipway");
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = Command::new(cargo)
            .args(["build", "-p", "slipway"])
            .status()
            .map_err(|e| crate::err("cargo build -p slipway", e))?;
        if !st.success() {
            return Err(crate::err("cargo build -p slipway", st));
        }
    }
    Ok(path)
}

/// `slipway plugin check PLUGIN -c CONFIG --json ARGS…` to its end, on a blocking thread's
/// terms (call it from `spawn_blocking` in async tests).
pub fn plugin_check(
    plugin: &Path,
    config: &Path,
    args: &[&str],
    env: &[(String, String)],
) -> Result<CheckRun, FixtureError> {
    let json = tempfile::NamedTempFile::new().map_err(|e| crate::err("a temporary file", e))?;
    let out = Command::new(slipway_binary()?)
        .args(["plugin", "check"])
        .arg(plugin)
        .arg("-c")
        .arg(config)
        .arg("--json-out")
        .arg(json.path())
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| crate::err("running slipway plugin check", e))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let written = std::fs::read_to_string(json.path()).unwrap_or_default();
    let report =
        serde_json::from_str(written.trim()).unwrap_or(Value::String(stdout.clone().into()));
    // The table a user sees, kept for the docs (target/plugin-check/<plugin>.txt).
    let tables = bin_dir().join("plugin-check");
    if std::fs::create_dir_all(&tables).is_ok()
        && let Some(name) = plugin.file_name()
    {
        let _ = std::fs::write(
            tables.join(format!("{}.txt", name.to_string_lossy())),
            stdout.as_bytes(),
        );
    }
    Ok(CheckRun {
        code: out.status.code(),
        report,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}
