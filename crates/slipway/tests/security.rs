//! The security boundaries of docs/security.md, each checked with real parts: `slipway run`
//! against the GitLab fake, instances from `fleeting-plugin-local` (real sshd), real cgroups,
//! Docker Engine, and `openssl s_server` as a GitLab whose certificate nobody trusts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::World;
use serde_json::{Value, json};
use slipway_testkit::gitlab::{FakeGitlab, job_payload_with_vars};

/// A masked variable's value: it may reach the job, never a log, a trace or `ps`.
const MASKED: &str = "masked-s3cr3t-value-4711";

/// An instance-executor runner on `fleeting-plugin-local` serving `gl`, allowing none and cgroup.
fn instance_config(w: &World, gl: &FakeGitlab, name: &str) -> PathBuf {
    w.write(
        "config.toml",
        &format!(
            r#"
concurrent = 2
check_interval = 1
[[runners]]
  name = "{name}"
  url = "{url}"
  token = "{token}"
  executor = "instance"
  cache_dir = "{cache}"
  allowed_isolation = ["none", "cgroup"]
  slot_cgroup_template = "slipway-sec-{pid}/slot-${{slot}}"
{autoscaler}"#,
            url = gl.url(),
            token = gl.runner_token(),
            cache = w.path().join("cache").display(),
            pid = std::process::id(),
            // The instances share this machine's network: the job helper uploads from there.
            autoscaler = common::loopback_autoscaler(w, name),
        ),
    )
}

/// `slipway run` with debug logs (a secret must not leak even there).
fn start(w: &World, cfg: &Path) -> Child {
    w.slipway(&["run", "-c", cfg.to_str().unwrap()])
        .env("RUST_LOG", "debug")
        .spawn()
        .expect("spawn slipway run")
}

/// SIGTERM the manager; its stdout and stderr together.
fn stop(w: &World, child: Child) -> String {
    common::signal(child.id(), "TERM");
    let out = common::wait_with_timeout(child, Duration::from_secs(60));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(w.processes().is_empty(), "left: {:?}", w.processes());
    all
}

async fn wait_state(gl: &FakeGitlab, id: u64, state: &str) {
    let ended = common::wait_until(Duration::from_secs(240), || {
        gl.job(id)
            .is_some_and(|j| j.state == state || j.state == "success" || j.state == "failed")
    });
    if !ended || gl.job(id).is_none_or(|j| j.state != state) {
        let j = gl.job(id);
        panic!(
            "job {id} never reached {state}: {:?}\n{}",
            j.as_ref().map(|j| j.state.clone()),
            j.map(|j| j.trace_text()).unwrap_or_default()
        );
    }
}

/// The entries of a zip artifacts archive: (path, contents) of files, (path, "-> target") of
/// symlinks, never followed.
fn zip_entries(zip: &[u8]) -> Vec<(String, String)> {
    let tar = slipway_artifacts::zip_to_tar(zip).expect("a valid zip");
    let mut out = Vec::new();
    let mut archive = tar::Archive::new(&tar[..]);
    for e in archive.entries().unwrap() {
        let mut e = e.unwrap();
        let path = e.path().unwrap().display().to_string();
        let data = match e.link_name().unwrap() {
            Some(target) => format!("-> {}", target.display()),
            None => {
                let mut s = String::new();
                let _ = std::io::Read::read_to_string(&mut e, &mut s);
                s
            }
        };
        out.push((path, data));
    }
    out
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
}

/// Every file and directory under `dir` (not following symlinks) with its mode.
fn modes_under(dir: &Path) -> Vec<(PathBuf, u32, bool)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(md) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            let is_dir = md.is_dir();
            out.push((p.clone(), md.permissions().mode() & 0o777, is_dir));
            if is_dir {
                stack.push(p);
            }
        }
    }
    out
}

/// `ps -eo args` of the whole machine, sampled every 100 ms until `stop` is set.
fn sample_ps(stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<String>> {
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            if let Ok(o) = Command::new("ps").args(["-eo", "args"]).output() {
                seen.push(String::from_utf8_lossy(&o.stdout).into_owned());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        seen
    })
}

/// A job that shows what it can see: its environment, every process's command line, the
/// readable files of its instance's home outside its own directory, the sockets it can reach.
fn snooping_job(name: &str, isolation: &str) -> Value {
    let mut job = job_payload_with_vars(
        name,
        &[
            "echo \"masked: $SECRET_VALUE\"",
            "env > env.txt",
            "ps -eo args > ps.txt",
            // Everything readable in the instance's home but this job's own directory.
            "find \"$HOME\" -type f -not -path \"$CI_PROJECT_DIR/*\" -readable -size -1M -exec cat {} + > home.txt 2>/dev/null || true",
            "sleep 3",
        ],
        &[("GIT_STRATEGY", "none"), ("SLIPWAY_ISOLATION", isolation)],
    );
    job["variables"].as_array_mut().unwrap().push(json!({
        "key": "SECRET_VALUE", "value": MASKED, "public": false, "masked": true, "file": false
    }));
    job["artifacts"] = json!([{"paths": ["env.txt", "ps.txt", "home.txt"], "when": "always",
        "artifact_type": "archive", "artifact_format": "zip"}]);
    job
}

/// none and cgroup: the runner token reaches neither the job's environment, nor any command
/// line on the machine, nor a readable file of the instance; the job token and a masked
/// variable reach the job (that is their point) but no trace, log or command line. The state
/// the manager keeps is owner-only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_stay_out_of_jobs_logs_traces_and_ps_at_none_and_cgroup() {
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let ids = [
        gl.enqueue(snooping_job("at-none", "none")),
        gl.enqueue(snooping_job("at-cgroup", "cgroup")),
    ];
    let cfg = instance_config(&w, &gl, "sec");
    let stop_ps = Arc::new(AtomicBool::new(false));
    let ps = sample_ps(stop_ps.clone());
    let child = start(&w, &cfg);
    // Plugin sockets live in private directories while the manager runs.
    let tmp_modes = Arc::new(Mutex::new(Vec::new()));
    for id in ids {
        while gl.job(id).is_none_or(|j| j.state == "pending") {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tmp_modes.lock().unwrap().extend(modes_under(&w.tmp()));
        wait_state(&gl, id, "success").await;
    }
    let state_dir = w.path().join(".slipway-state");
    let state = modes_under(&state_dir);
    let logs = stop(&w, child);
    stop_ps.store(true, Ordering::Relaxed);
    let ps = ps.join().unwrap();

    let runner_token = gl.runner_token();
    for id in ids {
        let job = gl.job(id).unwrap();
        let trace = job.trace_text();
        assert!(trace.contains("masked: [MASKED]"), "{trace}");
        for (what, secret) in [
            ("runner token", runner_token.as_str()),
            ("job token", job.token.as_str()),
            ("masked variable", MASKED),
        ] {
            assert!(!trace.contains(secret), "{what} in the trace:\n{trace}");
            assert!(!logs.contains(secret), "{what} in the manager's logs");
            assert!(
                !ps.iter().any(|p| p.contains(secret)),
                "{what} in `ps -eo args`"
            );
        }
        let files = common::unzip(&job.artifacts[0].bytes);
        for f in ["env.txt", "ps.txt", "home.txt"] {
            let text = files.get(f).unwrap_or_else(|| panic!("no {f}: {files:?}"));
            assert!(
                !text.contains(&runner_token),
                "runner token in the job's {f}"
            );
        }
        // The job's own credentials are in its environment, as GitLab hands them to jobs.
        let env = &files["env.txt"];
        assert!(
            env.contains(&format!("CI_JOB_TOKEN={}", job.token)),
            "{env}"
        );
        assert!(env.contains(&format!("SECRET_VALUE={MASKED}")), "{env}");
        assert!(!files["ps.txt"].contains(&job.token), "job token in ps");
    }

    // The state store, outbox and system id: directories 0700, files without group or other
    // bits; so are the private directories of the plugin sockets.
    assert!(!state.is_empty(), "no state in {}", state_dir.display());
    assert_eq!(mode(&state_dir), 0o700);
    for (p, m, is_dir) in state.iter().chain(tmp_modes.lock().unwrap().iter()) {
        if *is_dir {
            assert_eq!(*m, 0o700, "{} is {m:o}", p.display());
        } else {
            assert_eq!(m & 0o077, 0, "{} is {m:o}", p.display());
        }
    }
}

/// Artifact and cache paths that leave the project directory (`..`, absolute, through a
/// symlink, a cache key with `/`) are refused with a warning naming them; nothing outside the
/// project directory is collected or written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifact_and_cache_paths_cannot_leave_the_project_directory() {
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let outside = w.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("private.txt"), "not-for-artifacts\n").unwrap();
    let mut job = job_payload_with_vars(
        "escape",
        &[
            "mkdir -p out && echo inside > out/a.txt",
            &format!("ln -s {} link", outside.display()),
            &format!("ln -s {}/private.txt file-link", outside.display()),
        ],
        &[("GIT_STRATEGY", "none")],
    );
    job["artifacts"] = json!([{"paths": [
            "out/", "../../etc", "/etc/passwd", "link/", "link/private.txt", "link/*",
            "file-link", "a/../../x"
        ], "when": "always", "artifact_type": "archive", "artifact_format": "zip"}]);
    job["cache"] = json!([
        {"key": "../escape", "paths": ["out/"], "policy": "push", "when": "always"},
        {"key": "..", "paths": ["out/"], "policy": "push", "when": "always"},
        {"key": "ok", "paths": ["out/", "link/*", "../outside", "/etc/hostname"],
         "policy": "push", "when": "always"}
    ]);
    let id = gl.enqueue(job);
    let cfg = instance_config(&w, &gl, "esc");
    let child = start(&w, &cfg);
    wait_state(&gl, id, "success").await;
    stop(&w, child);

    let job = gl.job(id).unwrap();
    let trace = job.trace_text();
    for refused in [
        "WARNING: artifact path \"../../etc\" leaves the project directory; skipped",
        "WARNING: artifact path \"/etc/passwd\" is not inside the project directory; skipped",
        "WARNING: artifact path \"a/../../x\" leaves the project directory; skipped",
        "WARNING: artifact path \"link/private.txt\" leaves the project directory through a symlink; skipped",
        "WARNING: cache key \"../escape\" skipped: a cache key cannot contain \"/\"",
        "WARNING: cache key \"..\" skipped: a cache key cannot be only dots",
        "WARNING: cache path \"link/private.txt\" leaves the project directory through a symlink; skipped",
    ] {
        assert!(trace.contains(refused), "no {refused:?} in:\n{trace}");
    }
    // The artifacts hold the project's files and its symlinks as symlinks, never what they
    // point at.
    let entries = zip_entries(&job.artifacts[0].bytes);
    let names: Vec<&str> = entries.iter().map(|(p, _)| p.as_str()).collect();
    assert!(
        entries.contains(&("out/a.txt".to_string(), "inside\n".to_string())),
        "{entries:?}"
    );
    assert!(
        entries
            .iter()
            .all(|(_, data)| !data.contains("not-for-artifacts")),
        "{entries:?}"
    );
    assert!(
        !names
            .iter()
            .any(|n| n.contains("passwd") || n.contains("private")),
        "{names:?}"
    );
    // The cache: only under the project's directory of the cache, and without the outside file.
    let cache = w.path().join("cache");
    let archives: Vec<PathBuf> = modes_under(&cache)
        .into_iter()
        .map(|(p, _, _)| p)
        .filter(|p| p.is_file())
        .collect();
    assert_eq!(
        archives,
        vec![cache.join("group/project/ok/cache.tar.gz")],
        "{trace}"
    );
    let listing = Command::new("tar")
        .arg("-tzvf")
        .arg(&archives[0])
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    assert!(listing.contains("out/a.txt"), "{listing}");
    assert!(!listing.contains("private.txt"), "{listing}");
    assert!(!listing.contains("hostname"), "{listing}");
    assert!(!w.path().join("escape").exists() && !cache.join("group/escape").exists());
}

/// docker: a job sees neither another job's files (running at the same time on the same
/// instance), nor the runner token, nor a Docker socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_jobs_see_no_other_job_no_runner_token_and_no_docker_socket() {
    slipway_testkit::ensure_docker_engine().expect("Docker Engine");
    let w = World::new();
    // Where the build containers reach it: the job helper uploads from inside them.
    let gl = FakeGitlab::start_on(slipway_testkit::docker_gateway().expect("docker0")).await;
    let marker = format!("sec-marker-{}", std::process::id());
    let mut first = job_payload_with_vars(
        "holder",
        &[
            &format!("echo {marker} > {marker}.txt"),
            "sleep 8",
            &format!("cat {marker}.txt"),
        ],
        &[("GIT_STRATEGY", "none")],
    );
    first["image"] = json!({"name": slipway_testkit::BUSYBOX_IMAGE});
    let mut second = job_payload_with_vars(
        "looker",
        &[
            "sleep 3",
            &format!(
                "if find / -xdev -name '{marker}.txt' 2>/dev/null | grep -q .; then echo saw-other-job; else echo no-other-job; fi"
            ),
            "ls /builds",
            "for s in /var/run/docker.sock /run/docker.sock /run/containerd/containerd.sock; do [ -e $s ] && echo \"found-$s\"; done; echo sockets-checked",
            "echo \"docker_host=${DOCKER_HOST:-unset}\"",
            "env > env.txt",
        ],
        &[("GIT_STRATEGY", "none")],
    );
    second["image"] = json!({"name": slipway_testkit::BUSYBOX_IMAGE});
    second["artifacts"] = json!([{"paths": ["env.txt"], "when": "always",
        "artifact_type": "archive", "artifact_format": "zip"}]);
    let holder = gl.enqueue(first);
    let looker = gl.enqueue(second);
    let runner = format!("sec{}", std::process::id());
    let cfg = w.write(
        "config.toml",
        &format!(
            r#"
concurrent = 2
check_interval = 1
[[runners]]
  name = "{runner}"
  url = "{url}"
  token = "{token}"
  executor = "docker-autoscaler"
  [runners.docker]
    image = "{image}"
    pull_policy = "never"
  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = 2
    max_instances = 1
    update_interval = "5s"
    update_interval_when_expecting = "200ms"
    delete_instances_on_shutdown = true
    shutdown_deletion_interval = "1s"
    [runners.autoscaler.plugin_config]
      dir = "{state}"
      name = "{runner}"
"#,
            url = gl.url(),
            token = gl.runner_token(),
            image = slipway_testkit::BUSYBOX_IMAGE,
            state = w.path().join("plugin-state").display(),
        ),
    );
    let child = start(&w, &cfg);
    wait_state(&gl, holder, "success").await;
    wait_state(&gl, looker, "success").await;
    let logs = stop(&w, child);
    // Nothing of the runner's stays on the engine once the manager has stopped.
    let left = common::runner_networks(&runner);
    assert!(left.is_empty(), "networks left: {left:?}\n{logs}");

    let h = gl.job(holder).unwrap();
    let l = gl.job(looker).unwrap();
    let trace = l.trace_text();
    assert!(trace.contains("no-other-job"), "{trace}");
    assert!(trace.contains("sockets-checked"), "{trace}");
    assert!(!trace.contains("found-/"), "{trace}");
    assert!(trace.contains("docker_host=unset"), "{trace}");
    let env = &common::unzip(&l.artifacts[0].bytes)["env.txt"];
    assert!(!env.contains(&gl.runner_token()), "{env}");
    for j in [&h, &l] {
        assert!(!j.trace_text().contains(&gl.runner_token()));
        assert!(!logs.contains(&j.token), "job token in the manager's logs");
    }
    assert!(
        !logs.contains(&gl.runner_token()),
        "runner token in the logs"
    );
}

/// A self-signed certificate for 127.0.0.1 and `openssl s_server` on a free port using it;
/// everything a client sends after a handshake is echoed to the server's stdout.
struct UntrustedTls {
    _dir: tempfile::TempDir,
    child: Child,
    url: String,
    cert: PathBuf,
    out: PathBuf,
}

impl UntrustedTls {
    fn start() -> UntrustedTls {
        // Outside the world: its processes must be gone when a manager stops, this one not.
        let dir = tempfile::Builder::new()
            .prefix("slw-tls-")
            .tempdir()
            .unwrap();
        let cert = dir.path().join("untrusted.pem");
        let key = dir.path().join("untrusted.key");
        let st = Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:P-256", "-nodes", "-days", "1"])
            .args([
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
            ])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("openssl req");
        assert!(st.success());
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let out = dir.path().join("s_server.out");
        let child = Command::new("openssl")
            .args(["s_server", "-quiet", "-accept"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("-cert")
            .arg(&cert)
            .arg("-key")
            .arg(&key)
            .stdin(Stdio::piped())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .expect("openssl s_server");
        assert!(common::wait_until(Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        }));
        UntrustedTls {
            _dir: dir,
            child,
            url: format!("https://127.0.0.1:{port}"),
            cert,
            out,
        }
    }

    /// What clients managed to send through a completed handshake.
    fn received(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }
}

impl Drop for UntrustedTls {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The manager checks GitLab's certificate (an unknown issuer gets no request), and a job's
/// variables (`GIT_SSL_NO_VERIFY`, `GIT_SSL_CAINFO`, `SSL_CERT_FILE`,
/// `CI_SERVER_TLS_CA_FILE`) do not make the manager trust a server it does not: the job's
/// repository on that server is not fetched and its job token is not sent there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_variables_cannot_turn_off_tls_verification() {
    let w = World::new();
    let tls = UntrustedTls::start();

    // 1. GitLab itself behind a certificate nobody trusts: not one request goes through.
    let cfg = w.write(
        "config.toml",
        &format!(
            "concurrent = 1\ncheck_interval = 1\n[[runners]]\n  name = \"tls\"\n  url = \"{}\"\n  \
             token = \"glrt-never-sent-0123456789\"\n  executor = \"shell\"\n",
            tls.url
        ),
    );
    let child = start(&w, &cfg);
    std::thread::sleep(Duration::from_secs(4));
    let logs = stop(&w, child);
    assert!(
        logs.to_lowercase().contains("certificate"),
        "no certificate error in the logs:\n{logs}"
    );
    assert!(!tls.received().contains("/api/v4"), "{}", tls.received());

    // 2. A job from a trusted GitLab asks the manager to fetch from the untrusted server and
    // to stop checking certificates.
    let gl = FakeGitlab::start().await;
    let pem = std::fs::read_to_string(&tls.cert).unwrap();
    let cert = tls.cert.display().to_string();
    let mut job = job_payload_with_vars(
        "fetch",
        &["echo never-runs"],
        &[
            ("GIT_SSL_NO_VERIFY", "1"),
            ("GIT_SSL_CAINFO", &cert),
            ("SSL_CERT_FILE", &cert),
            ("CI_SERVER_TLS_CA_FILE", &pem),
            ("GET_SOURCES_ATTEMPTS", "1"),
        ],
    );
    job["git_info"]["repo_url"] = json!(format!(
        "{}/group/project.git",
        tls.url
            .replace("https://", "https://gitlab-ci-token:glcbt-tls-secret@")
    ));
    let id = gl.enqueue(job);
    // The manager's fetch is the one under test: the runner fetches there.
    let cfg = instance_config(&w, &gl, "tls");
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        "  executor = \"instance\"\n",
        "  executor = \"instance\"\n  fetch_sources = \"manager\"\n",
    );
    std::fs::write(&cfg, text).unwrap();
    let child = start(&w, &cfg);
    wait_state(&gl, id, "failed").await;
    stop(&w, child);
    let trace = gl.job(id).unwrap().trace_text();
    assert!(!trace.contains("never-runs\n"), "{trace}");
    assert!(trace.to_lowercase().contains("certificate"), "{trace}");
    let received = tls.received();
    assert!(
        !received.contains("group/project") && !received.contains("Authorization"),
        "the untrusted server got a request:\n{received}"
    );
}
