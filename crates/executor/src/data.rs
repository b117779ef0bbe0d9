//! A job's data moved where the job runs: the job helper (`slipway-helper`) restores the cache
//! and downloads the dependencies' artifacts before the job's script, and saves the cache and
//! uploads the job's artifacts after it, on the host its steps run on. No byte of it crosses
//! the manager.
//!
//! The source (GitLab) and the runner's cache know what to move and where; the executor knows
//! the job's directories and how to run a script there. [`HostData`] carries the former; the
//! functions here render the stage scripts. The helper is copied to the host at most once per
//! version (its content hash), into a directory of the job's user (a guest's home, a
//! container's `/tmp`, which only the job sees) unless the host has it already in a shared
//! read-only directory (a Docker engine's helper volume); each stage's plan, with its secrets,
//! goes on the helper's stdin, as the here-document after the stage script.

use std::path::{Path, PathBuf};
use std::time::Duration;

use slipway_job::When;
use slipway_job::data::{ArchiveLimits, DataPlan, DataStep, FAILED, REFUSED};
use tokio_util::sync::CancellationToken;

use crate::artifact_paths;
use crate::host::Host;
use crate::script::{JobDirs, quote};
use slipway_job::Trace;

/// The exit status of a stage script that found no helper of its version on the host: the
/// executor copies it there and runs the stage again.
pub const NO_HELPER: u32 = 96;

/// The job helper on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Helper {
    /// The static binary.
    pub path: PathBuf,
    /// Its version: the first 16 hex digits of its SHA-256, so a rebuilt helper is copied
    /// again and hosts keep one file per version.
    pub version: String,
}

impl Helper {
    /// The helper at `path`, its version computed from its content (blocking: read once at a
    /// runner's start).
    pub fn at(path: &Path) -> std::io::Result<Helper> {
        use sha2::Digest as _;
        let bytes = std::fs::read(path)?;
        let digest = sha2::Sha256::digest(&bytes);
        let version = digest
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect::<String>();
        Ok(Helper {
            path: path.to_path_buf(),
            version,
        })
    }
}

/// Files a job collects for the helper to archive after its script: one `artifacts:` entry or
/// one cache.
#[derive(Debug, Clone)]
pub struct Collect {
    /// When it is collected, given how the job went.
    pub when: When,
    /// Its paths as the job wrote them (made relative to the project directory here).
    pub paths: Vec<String>,
    /// Its `exclude` patterns, likewise.
    pub exclude: Vec<String>,
    /// Its `untracked`.
    pub untracked: bool,
    /// The helper's step ([`DataStep::Upload`] or [`DataStep::SaveCache`]); its paths,
    /// exclude, untracked and tar are filled in where the job ran.
    pub step: DataStep,
}

impl Collect {
    /// Whether this is a cache (never fails its job).
    pub fn is_cache(&self) -> bool {
        matches!(self.step, DataStep::SaveCache { .. })
    }
}

/// What the helper moves for one job.
#[derive(Debug, Clone)]
pub struct HostData {
    /// The helper binary to copy to the host.
    pub helper: Helper,
    /// How far a downloaded archive may expand.
    pub limits: ArchiveLimits,
    /// PEM certificates trusted for GitLab (`tls-ca-file`).
    pub ca_pem: Option<String>,
    /// Caches to restore ([`DataStep::RestoreCache`]), after the sources.
    pub restore: Vec<DataStep>,
    /// Dependencies' artifacts to download ([`DataStep::Download`]), after the cache.
    pub downloads: Vec<DataStep>,
    /// What to archive and upload after the script: caches first, then artifacts (GitLab's
    /// order).
    pub collect: Vec<Collect>,
    /// The job's `artifacts:` are in `collect` (uploaded from where the job ran): the executor
    /// collects none for the manager.
    pub artifacts: bool,
    /// The paths git tracks, when the sources were fetched on the manager (what `untracked`
    /// leaves out).
    pub tracked: std::sync::Arc<std::collections::BTreeSet<String>>,
}

impl HostData {
    /// The plan of `steps` for the helper's stdin.
    pub fn plan(&self, steps: Vec<DataStep>, tracked: Vec<String>) -> Vec<u8> {
        let plan = DataPlan {
            limits: self.limits,
            ca_pem: self.ca_pem.clone(),
            tracked,
            steps,
        };
        serde_json::to_vec(&plan).unwrap_or_default()
    }
}

/// The helper's path on the host, as a bash expression, under `home` (a bash expression).
pub fn helper_on_host(home: &str, helper: &Helper) -> String {
    format!("{home}/bin/slipway-helper-{}", helper.version)
}

/// Where a build container finds the helper its engine keeps in a read-only volume.
pub const SHARED_HELPER_DIR: &str = "/opt/slipway-helper";

/// The helper's path where `host` runs scripts, as a bash expression: the host's shared copy
/// when it has one of this version, else its own copy under the host's helper home, or the
/// helper itself on this machine.
pub fn helper_for(host: &dyn Host, helper: &Helper) -> String {
    helper_expr(
        host.helper_home().as_deref(),
        host.shared_helper_dir().as_deref(),
        helper,
    )
}

/// [`helper_for`] from the host's helper home and shared directory.
fn helper_expr(home: Option<&str>, shared: Option<&str>, helper: &Helper) -> String {
    match (home, shared) {
        (Some(home), None) => helper_on_host(home, helper),
        (Some(home), Some(dir)) => format!(
            "$(__p={dir}/slipway-helper-{}; if [ -x \"$__p\" ]; then echo \"$__p\"; else echo {}; fi)",
            helper.version,
            helper_on_host(home, helper)
        ),
        (None, _) => quote(&helper.path.display().to_string()),
    }
}

/// The script that copies the helper from stdin to its place under `home`, atomically (a
/// concurrent job of the same host sees the old file or the whole new one).
pub fn install_script(home: &str, helper: &Helper) -> String {
    let target = helper_on_host(home, helper);
    format!(
        "set -e\numask 077\nmkdir -p {home}/bin\n__t={target}.$$\ncat > \"$__t\"\n\
         chmod 700 \"$__t\"\nmv -f \"$__t\" {target}\n"
    )
}

/// The start of every helper stage: the helper there (else [`NO_HELPER`]), a private scratch
/// directory removed when the stage ends. The script is bash's stdin, so nothing in it may
/// read stdin but the helper, whose plan follows the script's last line as a here-document.
fn preamble(helper: &str) -> String {
    format!(
        "__h={helper}\n[ -x \"$__h\" ] || exit {NO_HELPER}\n\
         __s=$(umask 077; mktemp -d \"${{TMPDIR:-/tmp}}/slipway-data.XXXXXXXX\") || exit 1\n\
         trap 'rm -rf \"$__s\"' EXIT\n"
    )
}

/// The line that ends the plan's here-document. A plan is one line of JSON (a JSON string
/// holds no raw newline), so no line of it can be this one.
const PLAN_END: &str = "__SLIPWAY_PLAN__";

/// The helper run on the plan that [`run_stage`] appends: the last line of every stage script.
fn run_helper() -> String {
    format!("\"$__h\" run --scratch \"$__s\" <<'{PLAN_END}'\n")
}

/// A stage that runs the helper (at `helper`, a bash expression: [`helper_for`]) in the
/// project directory (made if missing): restoring the cache, downloading dependencies'
/// artifacts.
pub fn run_script(dirs: &JobDirs, helper: &str) -> String {
    let dir = dirs.project_dir();
    format!(
        "{}mkdir -p {dir}\ncd {dir} || exit 1\n{}",
        preamble(helper),
        run_helper()
    )
}

/// A stage that collects each of `collected` (the tar file name in the scratch directory and
/// the bash that writes the tar to stdout) and then runs the helper on them.
pub fn collect_script(dirs: &JobDirs, helper: &str, collected: &[(String, String)]) -> String {
    let mut s = preamble(helper);
    for (tar, body) in collected {
        // The collect script's warnings go to the trace with the helper's words.
        s.push_str(&format!(
            "( {body} ) </dev/null 2>&1 > \"$__s\"/{} || {{ echo {}; exit 1; }}\n",
            quote(tar),
            quote(&format!("ERROR: collecting artifacts failed ({tar})"))
        ));
    }
    let dir = dirs.project_dir();
    s.push_str(&format!("cd {dir} || exit 1\n{}", run_helper()));
    s
}

/// How one helper stage ended.
#[derive(Debug)]
pub enum StageEnd {
    /// Done; what the helper said for the trace.
    Done(Vec<u8>),
    /// The helper failed in a way that fails the job ([`FAILED`]); what it said.
    Failed(Vec<u8>),
    /// An archive broke the runner's limits ([`REFUSED`]); what the helper said.
    Refused(Vec<u8>),
    /// The stage could not run (the host, a timeout, a cancel): why.
    System(String),
}

/// Run one helper stage on `host`: `body` (from [`run_script`] or [`collect_script`]) fed to
/// bash with `plan` after it as the helper's here-document (stdin, never a command line),
/// within `limit` and stopped by `cancel`. A host without the helper's
/// version gets it copied first, once.
#[allow(clippy::too_many_arguments)]
pub async fn run_stage(
    host: &dyn Host,
    stage: &str,
    body: &str,
    plan: Vec<u8>,
    helper: &Helper,
    limit: Duration,
    cancel: &CancellationToken,
) -> StageEnd {
    let mut script = body.to_string();
    script.push_str(&String::from_utf8_lossy(&plan).replace('\n', " "));
    script.push('\n');
    script.push_str(PLAN_END);
    script.push('\n');
    let bounded = async {
        let mut installed = false;
        loop {
            let (status, out) = stage_output(host, stage, script.clone()).await?;
            match status.code {
                Some(0) => return Ok(StageEnd::Done(out)),
                Some(NO_HELPER) if !installed => {
                    installed = true;
                    install(host, helper).await?;
                }
                Some(c) if c == FAILED as u32 => return Ok(StageEnd::Failed(out)),
                Some(c) if c == REFUSED as u32 => return Ok(StageEnd::Refused(out)),
                _ => {
                    let said = String::from_utf8_lossy(&out);
                    return Err(format!("the job helper: {status}: {}", said.trim()));
                }
            }
        }
    };
    tokio::select! {
        r = tokio::time::timeout(limit, bounded) => match r {
            Ok(Ok(end)) => end,
            Ok(Err(msg)) => StageEnd::System(msg),
            Err(_) => StageEnd::System(format!("the job helper took longer than {}s", limit.as_secs())),
        },
        () = cancel.cancelled() => StageEnd::System("canceled".into()),
    }
}

/// Bytes of a stage's output kept from its start, and from its end: the helper says a few
/// lines per archive, but the collect scripts print a warning per unreadable file, and a job
/// decides how many of those there are.
const KEPT_HEAD: usize = 256 << 10;
const KEPT_TAIL: usize = 64 << 10;

/// Run `script` as `stage` on `host`, streamed, keeping at most [`KEPT_HEAD`] + [`KEPT_TAIL`] bytes of
/// its output (stdout and stderr as they come); its exit status and what was kept.
async fn stage_output(
    host: &dyn Host,
    stage: &str,
    script: String,
) -> Result<(slipway_connector::ExitStatus, Vec<u8>), String> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let gather = async {
        let mut kept = Kept::default();
        while let Some(chunk) = rx.recv().await {
            match chunk {
                slipway_connector::Output::Stdout(b) | slipway_connector::Output::Stderr(b) => {
                    kept.push(&b)
                }
            }
        }
        kept.into_bytes()
    };
    // `run_stage` owns the sender, so the gathering ends when it returns.
    let (status, out) = tokio::join!(host.run_stage(stage, script, tx), gather);
    Ok((status.map_err(|e| e.to_string())?, out))
}

/// The start and the end of a stream, and how much of its middle was left out.
#[derive(Debug, Default)]
struct Kept {
    head: Vec<u8>,
    tail: std::collections::VecDeque<u8>,
    dropped: u64,
}

impl Kept {
    fn push(&mut self, mut bytes: &[u8]) {
        let room = KEPT_HEAD - self.head.len();
        let now = bytes.len().min(room);
        self.head.extend_from_slice(&bytes[..now]);
        bytes = &bytes[now..];
        self.tail.extend(bytes);
        let over = self.tail.len().saturating_sub(KEPT_TAIL);
        self.tail.drain(..over);
        self.dropped += over as u64;
    }

    fn into_bytes(self) -> Vec<u8> {
        let mut out = self.head;
        if self.dropped > 0 {
            out.extend_from_slice(
                format!(
                    "\n[{} bytes of the job helper's output left out]\n",
                    self.dropped
                )
                .as_bytes(),
            );
        }
        out.extend(self.tail);
        out
    }
}

/// The helper's own words for why a stage failed: its last `ERROR: ` line.
pub fn said_error(out: &[u8]) -> String {
    String::from_utf8_lossy(out)
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("ERROR: "))
        .unwrap_or("the job helper failed")
        .to_string()
}

/// `c`'s paths to collect (relative to the project directory; the whole directory with
/// `untracked`) and its step filled in, reading the collected tar from `tar`; `None` when
/// nothing of it lies in the project directory. Paths outside it are warnings, as GitLab
/// Runner gives.
pub fn collected_step(
    c: &Collect,
    dirs: &JobDirs,
    tar: &str,
    succeeded: bool,
    trace: &mut Trace,
) -> Option<(Vec<String>, DataStep)> {
    let included = artifact_paths::relative_in_project(&c.paths, "artifact path", dirs, trace);
    let excluded =
        artifact_paths::relative_in_project(&c.exclude, "artifacts:exclude pattern", dirs, trace);
    let collect = if c.untracked {
        vec![".".to_string()]
    } else {
        included.clone()
    };
    if collect.is_empty() {
        return None;
    }
    let mut step = c.step.clone();
    match &mut step {
        DataStep::Upload {
            succeeded: after_success,
            paths,
            exclude,
            untracked,
            tar: file,
            ..
        } => {
            trace.message("Collecting artifacts");
            (*after_success, *paths, *exclude, *untracked, *file) =
                (succeeded, included, excluded, c.untracked, tar.to_string());
        }
        DataStep::SaveCache {
            key,
            paths,
            untracked,
            tar: file,
            ..
        } => {
            trace.message(&format!("Creating cache {key}..."));
            (*paths, *untracked, *file) = (included, c.untracked, tar.to_string());
        }
        DataStep::Download { .. } | DataStep::RestoreCache { .. } => return None,
    }
    Some((collect, step))
}

/// Copy the helper to `host` (its home for the helper comes from the host).
async fn install(host: &dyn Host, helper: &Helper) -> Result<(), String> {
    let Some(home) = host.helper_home() else {
        return Err(format!(
            "the job helper {} is missing or not executable",
            helper.path.display()
        ));
    };
    let script = install_script(&home, helper);
    let (status, _, err) = host
        .transfer_stage("install_helper", &script, Some(&helper.path), None)
        .await
        .map_err(|e| format!("copying the job helper to the job's host: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "copying the job helper to the job's host: {status}: {}",
            String::from_utf8_lossy(&err).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_helper_is_named_by_its_content() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, b"one").unwrap();
        std::fs::write(&b, b"two").unwrap();
        let (ha, hb) = (Helper::at(&a).unwrap(), Helper::at(&b).unwrap());
        assert_eq!(ha.version.len(), 16);
        assert_ne!(ha.version, hb.version);
        assert!(helper_on_host("\"$HOME\"/.slipway", &ha).ends_with(&ha.version));
    }

    #[test]
    fn a_shared_helper_is_used_when_there_else_the_hosts_own_copy() {
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        let bin = dir.path().join("h");
        std::fs::write(&bin, b"#!/bin/sh\n").unwrap();
        let helper = Helper::at(&bin).unwrap();
        let home = dir.path().join("home").display().to_string();
        let expr = helper_expr(Some(&home), Some(&shared.display().to_string()), &helper);
        let resolve = || {
            let out = std::process::Command::new("bash")
                .arg("-c")
                .arg(format!("echo {expr}"))
                .output()
                .unwrap();
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        };
        assert!(resolve().starts_with(&dir.path().join("home/bin").display().to_string()));
        let placed = shared.join(format!("slipway-helper-{}", helper.version));
        std::fs::copy(&bin, &placed).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&placed, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(resolve(), placed.display().to_string());
    }

    #[test]
    fn a_flood_of_output_keeps_its_start_and_its_end() {
        let mut k = Kept::default();
        k.push(b"first line\n");
        for _ in 0..10_000 {
            k.push(&[b'w'; 1000]);
        }
        k.push(b"\nERROR: the last word\n");
        let out = k.into_bytes();
        assert!(out.len() < KEPT_HEAD + KEPT_TAIL + 100, "{}", out.len());
        assert!(out.starts_with(b"first line\n"));
        assert!(out.ends_with(b"ERROR: the last word\n"));
        assert_eq!(said_error(&out), "the last word");
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.contains("bytes of the job helper's output left out"),
            "{text}"
        );
    }
}
