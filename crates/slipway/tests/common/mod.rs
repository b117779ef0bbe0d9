//! Shared helpers for the `slipway` binary's integration tests: real plugin processes, real sshd.

// Test helpers fail loudly: a broken fixture should stop the test, not limp on.
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The `slipway` binary under test.
pub fn slipway() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_slipway"))
}

/// Plugins the tests start from the binary directory.
const PLUGINS: [&str; 4] = [
    "fleeting-plugin-local",
    "fleeting-plugin-static",
    "executor-plugin-nesting",
    "executor-plugin-shell",
];

/// Directory holding the [`PLUGINS`] (`fleeting-plugin-local`, `-static`, `executor-plugin-nesting`,
/// `executor-plugin-shell`), building them first
/// if this test run did not.
pub fn plugin_dir() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = slipway().parent().expect("bin dir").to_path_buf();
            if PLUGINS.iter().any(|p| !dir.join(p).exists()) {
                let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
                let st = Command::new(cargo)
                    .arg("build")
                    .args(PLUGINS.iter().flat_map(|p| ["-p", p]))
                    .status()
                    .expect("cargo build the plugins");
                assert!(st.success(), "building {PLUGINS:?} failed");
            }
            dir
        })
        .clone()
}

/// A test's private world: its own TMPDIR (every file a run creates lands there) and files.
pub struct World {
    pub dir: tempfile::TempDir,
}

impl World {
    pub fn new() -> World {
        World {
            dir: tempfile::Builder::new()
                .prefix("slw-test-")
                .tempdir()
                .expect("tempdir"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The TMPDIR given to slipway: empty after a clean run.
    pub fn tmp(&self) -> PathBuf {
        let t = self.dir.path().join("tmp");
        std::fs::create_dir_all(&t).expect("tmp");
        t
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).expect("write");
        p
    }

    /// `slipway submit` the pipeline `text` (written to file `name`) to the queue of config
    /// `cfg`; the job ids it printed.
    pub fn submit(&self, cfg: &Path, name: &str, text: &str) -> Vec<u64> {
        let file = self.write(name, text);
        let run = self.run(&[
            "submit",
            "-c",
            cfg.to_str().unwrap(),
            file.to_str().unwrap(),
        ]);
        assert_eq!(run.code, Some(0), "{}", run.explain());
        run.stdout
            .lines()
            .map(|l| l.split('\t').next().unwrap().parse().unwrap())
            .collect()
    }

    /// The text of file `name` in this world (empty when missing).
    pub fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default()
    }

    /// A `slipway` command with this world's TMPDIR and plugin dir.
    pub fn slipway(&self, args: &[&str]) -> Command {
        let mut c = Command::new(slipway());
        c.args(args)
            .env("TMPDIR", self.tmp())
            // `slipway exec` keeps its cache under XDG_CACHE_HOME: never the user's own.
            .env("XDG_CACHE_HOME", self.dir.path().join("xdg-cache"))
            .env("SLIPWAY_PLUGIN_DIR", plugin_dir())
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Run to completion, with a generous bound so a hang fails the test instead of CI.
    pub fn run(&self, args: &[&str]) -> Run {
        let child = self.slipway(args).spawn().expect("spawn slipway");
        let out = wait_with_timeout(child, Duration::from_secs(240));
        Run::from(out)
    }

    /// Files and directories left in TMPDIR.
    pub fn leftovers(&self) -> Vec<String> {
        std::fs::read_dir(self.tmp())
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Processes whose command line mentions this world's directory (sshd instances, plugins).
    pub fn processes(&self) -> Vec<String> {
        processes_matching(&self.dir.path().display().to_string())
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // Never leave instances behind, even when a test fails half-way.
        let me = self.dir.path().display().to_string();
        let _ = Command::new("pkill").args(["-KILL", "-f", &me]).status();
    }
}

pub fn processes_matching(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return found;
    };
    for e in rd.filter_map(Result::ok) {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(needle) {
            found.push(format!("{pid} {cmd}"));
        }
    }
    found
}

/// Environment variables of a process (for finding a run's children).
pub fn environ_of(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', "\n"))
        .unwrap_or_default()
}

pub fn wait_with_timeout(mut child: std::process::Child, limit: Duration) -> Output {
    let start = std::time::Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return child.wait_with_output().expect("output"),
            Ok(None) if start.elapsed() > limit => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("output");
                panic!(
                    "slipway did not finish within {limit:?}\nstdout:\n{}\nstderr:\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("waiting for slipway: {e}"),
        }
    }
}

/// A finished run.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(o: Output) -> Run {
        Run {
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

/// One row of the summary table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub job: String,
    pub stage: String,
    pub status: String,
    pub instance: String,
    pub slot: String,
}

impl Run {
    pub fn explain(&self) -> String {
        format!(
            "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }

    /// Lines a job printed, without the `[job] ` prefix.
    pub fn job_lines(&self, job: &str) -> Vec<String> {
        let prefix = format!("[{job}] ");
        self.stdout
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix).map(str::to_string))
            .collect()
    }

    /// The summary table, parsed by its header's column positions.
    pub fn summary(&self) -> Vec<Row> {
        let lines: Vec<&str> = self.stdout.lines().collect();
        let Some(h) = lines.iter().rposition(|l| l.starts_with("JOB ")) else {
            return Vec::new();
        };
        let header = lines[h];
        let col = |name: &str| header.find(name).expect("column");
        let cols = [
            col("JOB"),
            col("STAGE"),
            col("STATUS"),
            col("DURATION"),
            col("INSTANCE"),
            col("SLOT"),
        ];
        let cell = |line: &str, i: usize| -> String {
            let start = cols[i];
            let end = cols
                .get(i + 1)
                .copied()
                .unwrap_or(line.len())
                .min(line.len());
            line.get(start..end).unwrap_or("").trim().to_string()
        };
        lines[h + 1..]
            .iter()
            .take_while(|l| !l.trim().is_empty() && !l.starts_with("Pipeline "))
            .map(|l| Row {
                job: cell(l, 0),
                stage: cell(l, 1),
                status: cell(l, 2),
                instance: cell(l, 4),
                slot: cell(l, 5),
            })
            .collect()
    }
}

/// Send `sig` (`TERM`, `KILL`, …) to a process, failing the test if it cannot be sent.
pub fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .expect("kill");
    assert!(st.success(), "kill -{sig} {pid} failed");
}

/// Start `slipway run -c cfg` in this world.
pub fn start_manager(w: &World, cfg: &Path) -> std::process::Child {
    w.slipway(&["run", "-c", &cfg.display().to_string()])
        .spawn()
        .expect("spawn slipway run")
}

/// SIGTERM a `slipway run` manager: it must exit 0 and leave nothing of this world running.
/// Its stderr.
pub fn stop_manager(w: &World, child: std::process::Child) -> String {
    signal(child.id(), "TERM");
    let out = wait_with_timeout(child, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        w.processes().is_empty(),
        "left running: {:?}",
        w.processes()
    );
    stderr
}

/// Instances a job ran on, from its `[job] Running on instance ID slot N` lines.
pub fn instances_of(lines: &[String], job: &str) -> Vec<String> {
    let prefix = format!("[{job}] Running on instance ");
    lines
        .iter()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Distinct `fleeting-plugin-local` instances among `processes`, by their sshd config path
/// (sshd forks a child per connection that shows the same command line).
pub fn sshd_instances(processes: &[String]) -> std::collections::BTreeSet<String> {
    processes
        .iter()
        .filter(|p| p.contains("sshd"))
        .filter_map(|p| {
            let i = p.find("/instances/")? + "/instances/".len();
            let rest = &p[i..];
            Some(rest[..rest.find('/')?].to_string())
        })
        .collect()
}

/// The world's sshd instances, as the union of three looks 30 ms apart: an sshd listener
/// rewrites its title as connections come and go (health checks), and one read of its
/// `/proc/<pid>/cmdline` at that moment can miss it.
pub fn live_sshd_instances(w: &World) -> std::collections::BTreeSet<String> {
    let mut all = sshd_instances(&w.processes());
    for _ in 0..2 {
        std::thread::sleep(std::time::Duration::from_millis(30));
        all.extend(sshd_instances(&w.processes()));
    }
    all
}

/// Live `fleeting-plugin-local` processes started on behalf of this world (found by the
/// TMPDIR they inherited: their command line does not name the world).
pub fn plugin_processes(w: &World) -> Vec<String> {
    let tmp = format!("TMPDIR={}", w.tmp().display());
    processes_matching("fleeting-plugin-local")
        .into_iter()
        .filter(|p| {
            p.split_whitespace()
                .next()
                .and_then(|pid| pid.parse::<u32>().ok())
                .is_some_and(|pid| environ_of(pid).lines().any(|l| l == tmp))
        })
        .collect()
}

/// Network namespaces that exist now (`ip netns list`; empty where `ip` is unavailable).
pub fn netns_list() -> Vec<String> {
    Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.split_whitespace().next())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The namespace `fleeting-plugin-local` gives instance `id` (`<name>-<hex>` → `slw-<hex>`).
pub fn netns_of(instance: &str) -> String {
    format!("slw-{}", instance.rsplit('-').next().unwrap_or(instance))
}

/// The names of the Docker networks labelled with runner `runner`.
pub fn runner_networks(runner: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args(["network", "ls", "--format", "{{.Name}}", "--filter"])
        .arg(format!("label=com.slipway.runner={runner}"))
        .output()
        .expect("docker network ls");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Wait for `cond` to hold, polling, up to `limit`; returns whether it held.
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A zip bomb: about 1 MB that expands to 1 GiB of zeros in `zeros.bin` (written by Python's
/// `zipfile`, as any tool would write one).
pub fn zip_bomb() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("python3")
        .current_dir(dir.path())
        .args([
            "-c",
            "import zipfile\n\
             with zipfile.ZipFile('bomb.zip', 'w', zipfile.ZIP_DEFLATED, compresslevel=9) as z:\n\
             \x20   with z.open('zeros.bin', 'w', force_zip64=True) as f:\n\
             \x20       block = bytes(1 << 20)\n\
             \x20       for _ in range(1024): f.write(block)\n",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let zip = std::fs::read(dir.path().join("bomb.zip")).unwrap();
    assert!(zip.len() < 2 << 20, "a bomb of {} bytes", zip.len());
    zip
}

/// Asserts the manager's scratch directory (`<world>/.slipway-state/tmp`) holds nothing: what
/// a refused archive passed through is gone.
pub fn assert_scratch_empty(w: &World) {
    let scratch = w.path().join(".slipway-state/tmp");
    let left: Vec<std::ffi::OsString> = std::fs::read_dir(&scratch)
        .unwrap_or_else(|e| panic!("{}: {e}", scratch.display()))
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left in {}: {left:?}", scratch.display());
}

/// The files of a zip archive (as GitLab stores artifacts), by path, unpacked with
/// slipway-artifacts and `tar`.
pub fn unzip(zip: &[u8]) -> std::collections::BTreeMap<String, String> {
    let tar = slipway_artifacts::zip_to_tar(zip).expect("a valid zip");
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new("tar")
        .args(["-x", "-f", "-", "-C"])
        .arg(dir.path())
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), &tar).unwrap();
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.path().to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir.path()).unwrap().display().to_string();
                out.insert(rel, std::fs::read_to_string(&p).unwrap_or_default());
            }
        }
    }
    out
}

/// A `[runners.autoscaler]` section on `fleeting-plugin-local` for GitLab-served runners: one
/// instance with two slots, quick updates, instances deleted at shutdown; `name` keeps this
/// test's instances apart.
pub fn local_autoscaler(w: &World, name: &str) -> String {
    local_autoscaler_of(w, name, 1)
}

/// A runner's `[runners.cache]` section for the S3 server at `server` (LocalStack's, which
/// checks signatures against `secret`), objects under `ci/` in `bucket`.
pub fn s3_cache_section(server: &str, bucket: &str, secret: &str) -> String {
    format!(
        r#"  [runners.cache]
    Type = "s3"
    Path = "ci"
    [runners.cache.s3]
      ServerAddress = "{server}"
      AccessKey = "{}"
      SecretKey = "{secret}"
      BucketName = "{bucket}"
      Insecure = true
"#,
        slipway_testkit::s3::ACCESS_KEY
    )
}

/// [`local_autoscaler`] with its instance on this machine's network (the local plugin's
/// `loopback`): its jobs reach servers on loopback, as the job helper needs to.
pub fn loopback_autoscaler(w: &World, name: &str) -> String {
    on_loopback(&local_autoscaler(w, name))
}

/// `autoscaler` (a local plugin's section) with its instances on this machine's network.
pub fn on_loopback(autoscaler: &str) -> String {
    autoscaler.replace(
        "[runners.autoscaler.plugin_config]\n",
        "[runners.autoscaler.plugin_config]\n      network = \"loopback\"\n",
    )
}

/// [`local_autoscaler`] with up to `max_instances` instances of two slots.
pub fn local_autoscaler_of(w: &World, name: &str, max_instances: u32) -> String {
    format!(
        r#"  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = 2
    max_instances = {max_instances}
    update_interval = "200ms"
    update_interval_when_expecting = "100ms"
    delete_instances_on_shutdown = true
    [runners.autoscaler.plugin_config]
      dir = "{}"
      name = "{name}{}"
    [[runners.autoscaler.policy]]
      idle_count = 0
      idle_time = "10m"
"#,
        w.path().join("plugin-state").display(),
        std::process::id(),
    )
}

/// Wait (up to 4 minutes) for GitLab job `id` of `gl` to succeed or fail; its state and trace.
pub async fn job_ended(gl: &slipway_testkit::gitlab::FakeGitlab, id: u64) -> (String, String) {
    for _ in 0..2400 {
        if let Some(j) = gl
            .job(id)
            .filter(|j| j.state == "success" || j.state == "failed")
        {
            return (j.state.clone(), j.trace_text());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "job {id} never ended: {:?}",
        gl.job(id).map(|j| (j.state.clone(), j.trace_text()))
    );
}

/// Run git in `dir` as a test author, panicking with its output on failure; its stdout.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        // Authoring repositories here reads local paths (submodules): allowed for tests only.
        .env("GIT_ALLOW_PROTOCOL", "file")
        .output()
        .expect("git");
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// A TCP port free on loopback now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// The body of `GET path` from a manager on `port` (empty until it answers).
pub fn http_body(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut conn) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = conn.read_to_string(&mut out);
    out.split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default()
}
