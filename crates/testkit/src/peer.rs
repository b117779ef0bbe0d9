//! Local pipelines run by `slipway exec` and by the peer, `gitlab-ci-local`, on the same
//! project, compared as a user would: which jobs ran, with what status, printing what.
//!
//! A case is a directory of `crates/pipeline/tests/pipelines/`: a `.gitlab-ci.yml` and the files
//! around it, and an optional `case.json`:
//!
//! - `variables`: `{KEY: VALUE}` given to both tools (gitlab-ci-local's `--variable`, Slipway's
//!   `--plain-variable`: both show the value);
//! - `branch` / `tag`: checked out after the first commit on `main` (default: `main`);
//! - `changes`: `{path: content}` committed on the branch, so `rules:changes` sees them against
//!   `origin/main`;
//! - `error`: the pipeline is refused (by GitLab too): Slipway exits non-zero and says this;
//! - `deviation`: where gitlab-ci-local departs from GitLab's documented behaviour, why; then
//!   `gitlab` holds GitLab's outcome (`{job: status}`) and `gitlab_out` the lines GitLab's jobs
//!   print (`{job: [lines]}`), which Slipway must give instead.
//!
//! Statuses compared: `success`, `failed`, `allowed` (failed, allowed to), or absent (not run:
//! skipped, manual, left out). Key output: the lines a job prints that start with `OUT`.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{FixtureError, err};

/// The peer's version, the newest that runs on Node 20.
pub const PEER_VERSION: &str = "4.60.1";

/// One case of the corpus.
#[derive(Debug, Clone)]
pub struct Case {
    /// Directory name.
    pub name: String,
    /// Its directory.
    pub dir: PathBuf,
    /// `case.json`, or `{}`.
    pub spec: Value,
}

/// What one tool did with a case.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Job name → status (`success`, `failed`, `allowed`); jobs that did not run are absent.
    pub jobs: BTreeMap<String, String>,
    /// Job name → its `OUT` lines, in order.
    pub out: BTreeMap<String, Vec<String>>,
    /// The tool's exit code.
    pub code: Option<i32>,
    /// Everything it printed, for messages.
    pub log: String,
}

/// Every case under `root`, sorted by name.
pub fn cases(root: &Path) -> Result<Vec<Case>, FixtureError> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(root).map_err(|e| err("reading the pipeline corpus", e))?;
    for e in entries.flatten() {
        let dir = e.path();
        if !dir.join(".gitlab-ci.yml").is_file() {
            continue;
        }
        let spec = match std::fs::read_to_string(dir.join("case.json")) {
            Ok(t) => serde_json::from_str(&t).map_err(|e| err("reading case.json", e))?,
            Err(_) => Value::Object(Default::default()),
        };
        out.push(Case {
            name: e.file_name().to_string_lossy().into_owned(),
            dir,
            spec,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// gitlab-ci-local at [`PEER_VERSION`] (and rsync), installed when missing.
pub fn ensure_peer() -> Result<(), FixtureError> {
    let have = |cmd: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {cmd}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    for (cmd, package) in [("rsync", "rsync"), ("node", "nodejs"), ("npm", "npm")] {
        if !have(cmd) {
            crate::apt_install(package)?;
        }
    }
    let version = Command::new("gitlab-ci-local")
        .arg("--version")
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    if version != PEER_VERSION {
        let st = Command::new("npm")
            .args(["install", "-g", "--silent"])
            .arg(format!("gitlab-ci-local@{PEER_VERSION}"))
            .status()
            .map_err(|e| err("npm install gitlab-ci-local", e))?;
        if !st.success() {
            return Err(err("npm install gitlab-ci-local", st));
        }
    }
    Ok(())
}

fn git(dir: &Path, args: &[&str]) -> Result<(), FixtureError> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "Ada Lovelace")
        .env("GIT_AUTHOR_EMAIL", "ada@example.com")
        .env("GIT_COMMITTER_NAME", "Ada Lovelace")
        .env("GIT_COMMITTER_EMAIL", "ada@example.com")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| err("running git", e))?;
    if !out.status.success() {
        return Err(err(
            "git",
            format!(
                "git {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> Result<(), FixtureError> {
    std::fs::create_dir_all(to).map_err(|e| err("copying a case", e))?;
    for e in std::fs::read_dir(from).map_err(|e| err("copying a case", e))? {
        let e = e.map_err(|e| err("copying a case", e))?;
        let target = to.join(e.file_name());
        if e.file_type()
            .map_err(|e| err("copying a case", e))?
            .is_dir()
        {
            copy_dir(&e.path(), &target)?;
        } else if e.file_name() != "case.json" {
            std::fs::copy(e.path(), &target).map_err(|e| err("copying a case", e))?;
        }
    }
    Ok(())
}

/// A git checkout of the case as its `case.json` describes it: `main` committed and pushed to
/// a bare `origin` (whose URL then reads as a GitLab project's), the branch or tag checked out,
/// `changes` committed on it.
pub fn prepare(case: &Case, into: &Path) -> Result<PathBuf, FixtureError> {
    let work = into.join("project");
    copy_dir(&case.dir, &work)?;
    let bare = into.join("origin.git");
    git(&work, &["init", "-q", "-b", "main"])?;
    git(&work, &["add", "-A"])?;
    git(&work, &["commit", "-q", "-m", "Initial commit"])?;
    git(into, &["init", "-q", "--bare", "-b", "main", "origin.git"])?;
    let bare_url = bare.display().to_string();
    git(&work, &["remote", "add", "origin", &bare_url])?;
    git(&work, &["push", "-q", "origin", "main"])?;
    git(&work, &["fetch", "-q", "origin"])?;
    git(&work, &["remote", "set-head", "origin", "main"])?;
    git(
        &work,
        &[
            "remote",
            "set-url",
            "origin",
            "git@gitlab.example.com:group/project.git",
        ],
    )?;
    if let Some(branch) = case.spec["branch"].as_str() {
        git(&work, &["checkout", "-q", "-b", branch])?;
    }
    if let Some(changes) = case.spec["changes"].as_object() {
        for (path, content) in changes {
            let p = work.join(path);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent).map_err(|e| err("writing a change", e))?;
            }
            std::fs::write(&p, content.as_str().unwrap_or_default())
                .map_err(|e| err("writing a change", e))?;
        }
        git(&work, &["add", "-A"])?;
        git(&work, &["commit", "-q", "-m", "Change files"])?;
    }
    if let Some(tag) = case.spec["tag"].as_str() {
        git(&work, &["tag", tag])?;
        git(&work, &["checkout", "-q", tag])?;
    }
    Ok(work)
}

fn variables(case: &Case) -> Vec<String> {
    case.spec["variables"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default()
}

fn run(mut cmd: Command, timeout: Duration) -> Result<(Option<i32>, String), FixtureError> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| err("starting a pipeline tool", e))?;
    let pid = child.id();
    let start = Instant::now();
    let out = std::thread::spawn(move || {
        let mut o = String::new();
        let mut e = String::new();
        use std::io::Read as _;
        if let Some(mut s) = child.stdout.take() {
            let _ = s.read_to_string(&mut o);
        }
        if let Some(mut s) = child.stderr.take() {
            let _ = s.read_to_string(&mut e);
        }
        let st = child.wait().ok().and_then(|s| s.code());
        (st, format!("{o}{e}"))
    });
    while !out.is_finished() {
        if start.elapsed() > timeout {
            crate::kill_tree(pid);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    out.join()
        .map_err(|_| err("a pipeline tool", "its reader thread panicked"))
}

/// `slipway exec` on the prepared project with a shell runner; `slipway` is the binary.
pub fn run_slipway(slipway: &Path, case: &Case, project: &Path) -> Result<Outcome, FixtureError> {
    let config = project
        .parent()
        .unwrap_or(project)
        .join("slipway-shell.toml");
    std::fs::write(
        &config,
        "concurrent = 4\n[[runners]]\n  name = \"corpus\"\n  executor = \"shell\"\n",
    )
    .map_err(|e| err("writing the runner config", e))?;
    let report = project.parent().unwrap_or(project).join("report.json");
    let mut cmd = Command::new(slipway);
    cmd.current_dir(project)
        .args(["exec", ".gitlab-ci.yml", "-c"])
        .arg(&config)
        .arg("--report")
        .arg(&report)
        // The kept cache of `slipway exec` goes with the case, not into the user's.
        .env(
            "XDG_CACHE_HOME",
            project.parent().unwrap_or(project).join("xdg-cache"),
        )
        .env_remove("RUST_LOG");
    // gitlab-ci-local shows `--variable` values; Slipway masks them unless given as plain.
    for v in variables(case) {
        cmd.arg("--plain-variable").arg(v);
    }
    let (code, log) = run(cmd, Duration::from_secs(300))?;
    let report: Value = std::fs::read_to_string(&report)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    let mut o = Outcome {
        code,
        log: log.clone(),
        ..Outcome::default()
    };
    let names: Vec<String> = report["jobs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|j| j["name"].as_str().map(String::from))
        .collect();
    for j in report["jobs"].as_array().into_iter().flatten() {
        let name = j["name"].as_str().unwrap_or_default().to_string();
        let status = match j["status"].as_str().unwrap_or_default() {
            "success" => "success",
            "failed" => "failed",
            "failed (allowed)" => "allowed",
            _ => continue,
        };
        o.jobs.insert(name, status.to_string());
    }
    for line in log.lines() {
        // `[name] text`; names may hold `]` (matrix jobs), so match the known ones.
        let Some(name) = names
            .iter()
            .filter(|n| line.starts_with(&format!("[{n}] ")))
            .max_by_key(|n| n.len())
        else {
            continue;
        };
        let text = &line[name.len() + 3..];
        if text.starts_with("OUT") {
            o.out
                .entry(name.clone())
                .or_default()
                .push(text.trim_end().to_string());
        }
    }
    Ok(o)
}

/// Job names as GitLab gives them. gitlab-ci-local names `parallel: N` jobs `name: [i/N]`
/// (GitLab: `name i/N`) and matrix jobs `name: [a,b]` (GitLab: `name: [a, b]`): a naming
/// deviation of the peer, mapped here so the cases compare what the jobs did.
///
/// A child pipeline's job is `[trigger] -> job` there (`[a -> b] -> job` one level down), and
/// `trigger > job` in Slipway (`a > b > job`): mapped the same way.
fn gitlab_name(peer: &str) -> String {
    if let Some(rest) = peer.strip_prefix('[')
        && let Some((triggers, job)) = rest.split_once("] -> ")
    {
        return format!("{} > {}", triggers.replace(" -> ", " > "), gitlab_name(job));
    }
    if let Some((base, rest)) = peer.split_once(": [")
        && let Some(inner) = rest.strip_suffix(']')
    {
        if let Some((i, n)) = inner.split_once('/')
            && i.parse::<u32>().is_ok()
            && n.parse::<u32>().is_ok()
        {
            return format!("{base} {inner}");
        }
        let values: Vec<&str> = inner.split(',').map(str::trim).collect();
        return format!("{base}: [{}]", values.join(", "));
    }
    peer.to_string()
}

/// gitlab-ci-local on the prepared project (shell executor: no image is pulled).
pub fn run_peer(case: &Case, project: &Path) -> Result<Outcome, FixtureError> {
    let mut cmd = Command::new("gitlab-ci-local");
    // It wants a relative --cwd.
    cmd.current_dir(project).args([
        "--cwd",
        ".",
        "--no-color",
        "--shell-isolation",
        // Jobs with an image run in the shell too, as under Slipway's shell runner.
        "--force-shell-executor",
    ]);
    for v in variables(case) {
        cmd.arg("--variable").arg(v);
    }
    let (code, log) = run(cmd, Duration::from_secs(300))?;
    let mut o = Outcome {
        code,
        log: log.clone(),
        ..Outcome::default()
    };
    // Status lines name jobs that started; a " WARN " line of the peer's own (a duplicated
    // YAML key, say) is not a job.
    let started: std::collections::HashSet<&str> = log
        .lines()
        .filter(|l| !l.starts_with(' '))
        .filter_map(|l| l.split_once(" starting ").map(|(n, _)| n.trim()))
        .collect();
    for line in log.lines() {
        for (word, status) in [
            (" PASS  ", "success"),
            (" WARN  ", "allowed"),
            (" FAIL  ", "failed"),
        ] {
            if let Some(rest) = line.strip_prefix(word) {
                let mut name = rest.split("  ").next().unwrap_or_default().trim();
                // `name 87.50% coverage`: the job's coverage after its name.
                if let Some(head) = name.strip_suffix("% coverage")
                    && let Some((n, _)) = head.rsplit_once(' ')
                {
                    name = n;
                }
                // A failed child job is named without its `[trigger] -> ` in the peer's
                // summary: the one started child job of that name is meant.
                let child: Vec<&&str> = started
                    .iter()
                    .filter(|s| s.starts_with('[') && s.ends_with(&format!("] -> {name}")))
                    .collect();
                // A trigger job prints no `starting` line; its child's jobs do.
                let trigger = format!("{} > ", gitlab_name(name));
                let triggered = started.iter().any(|s| gitlab_name(s).starts_with(&trigger));
                if started.contains(name) || triggered {
                    o.jobs.insert(gitlab_name(name), status.to_string());
                } else if let [only] = child.as_slice() {
                    o.jobs.insert(gitlab_name(only), status.to_string());
                }
            }
        }
        if line.starts_with(' ') {
            continue;
        }
        if let Some((name, text)) = line.split_once(" > ")
            && text.starts_with("OUT")
        {
            o.out
                .entry(gitlab_name(name.trim()))
                .or_default()
                .push(text.trim_end().to_string());
        }
    }
    Ok(o)
}

/// Differences between two outcomes, as lines; empty when they agree.
pub fn differences(ours: &Outcome, peer: &Outcome) -> Vec<String> {
    let mut out = Vec::new();
    let names: std::collections::BTreeSet<&String> =
        ours.jobs.keys().chain(peer.jobs.keys()).collect();
    for n in names {
        let a = ours.jobs.get(n).map_or("not run", String::as_str);
        let b = peer.jobs.get(n).map_or("not run", String::as_str);
        if a != b {
            out.push(format!("job {n:?}: slipway {a}, gitlab-ci-local {b}"));
        }
        let (oa, ob) = (ours.out.get(n), peer.out.get(n));
        if a != "not run" && b != "not run" && oa != ob {
            out.push(format!(
                "job {n:?} printed: slipway {:?}, gitlab-ci-local {:?}",
                oa.cloned().unwrap_or_default(),
                ob.cloned().unwrap_or_default()
            ));
        }
    }
    out
}

/// Differences between Slipway's outcome and GitLab's documented one: `case.json`'s `gitlab`
/// (`{job: status}`) and `gitlab_out` (`{job: [OUT lines]}`, for the jobs it names).
pub fn against_gitlab(ours: &Outcome, case: &Case) -> Vec<String> {
    let mut want = Outcome::default();
    for (k, v) in case.spec["gitlab"].as_object().into_iter().flatten() {
        if let Some(s) = v.as_str().filter(|s| *s != "not run") {
            want.jobs.insert(k.clone(), s.to_string());
        }
    }
    let mut ours = ours.clone();
    let named = case.spec["gitlab_out"].as_object();
    ours.out
        .retain(|k, _| named.is_some_and(|n| n.contains_key(k)));
    for (k, v) in named.into_iter().flatten() {
        let lines = v
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l.as_str().map(String::from))
            .collect();
        want.out.insert(k.clone(), lines);
    }
    differences(&ours, &want)
}

/// The result of one case under both tools.
#[derive(Debug, Clone)]
pub struct Compared {
    /// The case.
    pub case: String,
    /// What Slipway did.
    pub ours: Outcome,
    /// What gitlab-ci-local did.
    pub peer: Outcome,
    /// Differences from the peer.
    pub differences: Vec<String>,
    /// Differences from GitLab's documented outcome, for a documented peer deviation.
    pub gitlab_differences: Vec<String>,
    /// The peer's deviation, when the case names one.
    pub deviation: Option<String>,
    /// Wall time of each.
    pub ours_time: Duration,
    /// Wall time of the peer.
    pub peer_time: Duration,
}

impl Compared {
    /// Whether the case agrees: with the peer, or with GitLab where the peer deviates.
    pub fn agrees(&self) -> bool {
        self.disagreements().is_empty()
    }

    /// What disagrees: with the peer, or with GitLab where the peer deviates.
    pub fn disagreements(&self) -> &[String] {
        match &self.deviation {
            Some(_) => &self.gitlab_differences,
            None => &self.differences,
        }
    }
}

/// Runs `case` under both tools in a fresh checkout.
pub fn compare(slipway: &Path, case: &Case) -> Result<Compared, FixtureError> {
    let tmp = tempfile::Builder::new()
        .prefix("slw-corpus")
        .tempdir()
        .map_err(|e| err("a temporary directory", e))?;
    let project = prepare(case, tmp.path())?;
    let t = Instant::now();
    let ours = run_slipway(slipway, case, &project)?;
    let ours_time = t.elapsed();
    // The peer in its own copy, so neither sees the other's files.
    let tmp2 = tempfile::Builder::new()
        .prefix("slw-corpus-peer")
        .tempdir()
        .map_err(|e| err("a temporary directory", e))?;
    let peer_project = prepare(case, tmp2.path())?;
    let t = Instant::now();
    let peer = run_peer(case, &peer_project)?;
    let peer_time = t.elapsed();
    let mut differences = differences(&ours, &peer);
    let mut gitlab_differences = against_gitlab(&ours, case);
    // `error`: the pipeline is refused, and Slipway's message says this.
    if let Some(want) = case.spec["error"].as_str()
        && (ours.code == Some(0) || !ours.log.contains(want))
    {
        let d = format!("slipway must refuse the pipeline saying {want:?}");
        differences.push(d.clone());
        gitlab_differences.push(d);
    }
    Ok(Compared {
        case: case.name.clone(),
        differences,
        gitlab_differences,
        deviation: case.spec["deviation"].as_str().map(String::from),
        ours,
        peer,
        ours_time,
        peer_time,
    })
}
