//! The Debian package and the container image, as an operator meets them: the package installed
//! with dpkg into a fresh Debian root made by debootstrap (its files, its user, its unit checked
//! by that root's `systemd-analyze verify`, then `slipway run` from the installed paths taking a
//! job from the embedded queue and draining on SIGQUIT), and the image made from such a root
//! running the manager against the GitLab test server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use slipway_testkit::gitlab::{FakeGitlab, job_payload_with_vars};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `scripts/package.sh ARGS` with this test build's target directory; its output.
/// The tests' image tag (never an operator's `slipway:VERSION` or `slipway:latest`).
const TEST_IMAGE: &str = "slipway-test:latest";

fn package(args: &[&str]) -> Output {
    let target = common::slipway()
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf();
    let out = Command::new("bash")
        .arg(repo().join("scripts/package.sh"))
        .args(args)
        .env("CARGO_TARGET_DIR", target)
        .env("SLIPWAY_IMAGE_TAG", TEST_IMAGE)
        .output()
        .expect("running scripts/package.sh");
    assert!(
        out.status.success(),
        "scripts/package.sh {args:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The package of this build (debug binaries), at `dir/slipway.deb`.
fn deb_in(dir: &Path) -> PathBuf {
    let deb = dir.join("slipway.deb");
    package(&["deb", "--dev", deb.to_str().unwrap()]);
    assert!(deb.is_file(), "no package at {}", deb.display());
    deb
}

/// A root (a few hundred MB) removed with its test, mounts or not.
struct Root(PathBuf);

impl Drop for Root {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The scenario run inside the root: an upgrade from a version whose service user was in the
/// docker group (the postinst takes it out), a Docker socket as dockerd makes it, the manager
/// as root from the installed paths, one job through the embedded queue, then a drain, then
/// what is left running.
const SCENARIO: &str = r#"
set -e
groupadd -f docker
gpasswd --add slipway docker >/dev/null
/var/lib/dpkg/info/slipway.postinst configure 0.0.1
echo "groups of slipway: $(id -Gn slipway)"
perl -MIO::Socket::UNIX -e '
  my $s = IO::Socket::UNIX->new(Type => SOCK_STREAM(), Local => "/run/docker.sock", Listen => 5)
    or die "docker.sock: $!";
  chown 0, scalar(getgrnam("docker")), "/run/docker.sock";
  chmod 0660, "/run/docker.sock";
  while (my $c = $s->accept) { close $c }' &
sock=$!
cd /tmp/project
slipway run -c /etc/slipway/config.toml > /tmp/manager.log 2>&1 &
mgr=$!
slipway submit -c /etc/slipway/config.toml .gitlab-ci.yml
for i in $(seq 1 180); do
  jobs=$(slipway jobs -c /etc/slipway/config.toml)
  case "$jobs" in *success*|*failed*|*canceled*) break ;; esac
  sleep 1
done
echo "$jobs"
kill -QUIT $mgr
wait $mgr && echo "manager exit=0" || echo "manager exit=$?"
kill $sock 2>/dev/null || true; wait $sock 2>/dev/null || true
echo "--- processes"
ps -eo user=,comm= | grep -Ev ' (sh|ps|grep)$' || true
echo "--- end"
"#;

/// What the job of the scenario tries, as a merge request's code would: read the manager's
/// config, its state (the queue holds every job's record; an outbox would sit beside it), the
/// local plugin's SSH key, and reach the Docker socket. Each line says what happened.
const PROBE: &str = r#"hello:
  script:
    - echo "hello from $(id -un) in $HOME groups=$(id -Gn)"
    - |
      for f in /etc/slipway/config.toml /var/lib/slipway /var/lib/slipway/queue /var/lib/slipway-local/id_ed25519; do
        if err=$( (if [ -d "$f" ]; then ls "$f"; else cat "$f"; fi) 2>&1 >/dev/null); then echo "READ $f"; else echo "denied $f: $err"; fi
      done
    - |
      perl -MIO::Socket::UNIX -e 'print IO::Socket::UNIX->new(Peer => "/run/docker.sock") ? "REACHED /run/docker.sock\n" : "denied /run/docker.sock: $!\n"'
"#;

#[test]
fn the_package_installs_into_a_fresh_debian_root_and_runs_a_job() {
    let w = common::World::new();
    let deb = deb_in(w.path());
    let root = Root(w.path().join("root"));
    package(&["root", deb.to_str().unwrap(), root.0.to_str().unwrap()]);
    let r = &root.0;

    // The files where an operator looks for them.
    for bin in [
        "slipway",
        "fleeting-plugin-local",
        "fleeting-plugin-static",
        "fleeting-plugin-qemu",
        "fleeting-plugin-aws",
        "slipway-guest-agent",
    ] {
        let p = r.join("usr/bin").join(bin);
        let mode = std::fs::metadata(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .permissions()
            .mode();
        assert_eq!(mode & 0o755, 0o755, "{} mode {mode:o}", p.display());
    }
    let passwd = std::fs::read_to_string(r.join("etc/passwd")).unwrap();
    let user = passwd
        .lines()
        .find(|l| l.starts_with("slipway:"))
        .unwrap_or_else(|| panic!("no slipway user:\n{passwd}"));
    let fields: Vec<&str> = user.split(':').collect();
    assert_eq!(fields[5], "/var/lib/slipway-local", "{user}");
    let uid: u32 = fields[2].parse().unwrap();
    assert!(uid < 1000 && uid > 0, "not a system user: {user}");
    // The manager's files are root's alone; the job user owns none of them.
    for (path, mode) in [
        ("etc/slipway", 0o700),
        ("etc/slipway/config.toml", 0o600),
        ("var/lib/slipway", 0o700),
    ] {
        let m = std::fs::metadata(r.join(path)).unwrap();
        assert_eq!((m.uid(), m.gid()), (0, 0), "{path}'s owner");
        assert_eq!(m.mode() & 0o777, mode, "{path}'s mode");
    }
    let packaged = std::fs::read_to_string(r.join("etc/slipway/config.toml")).unwrap();
    assert!(packaged.contains("user = \"slipway\""), "{packaged}");
    let shipped = std::fs::read_to_string(r.join("lib/systemd/system/slipway.service")).unwrap();
    assert!(
        shipped.contains("ExecStart=/usr/bin/slipway run --config /etc/slipway/config.toml"),
        "{shipped}"
    );
    assert!(
        // A link to /lib/systemd/system/slipway.service inside the root: not followed here.
        std::fs::symlink_metadata(
            r.join("etc/systemd/system/multi-user.target.wants/slipway.service")
        )
        .is_ok(),
        "the unit is not enabled"
    );

    // The root's own systemd checks the unit: directives, the user, the binary it starts.
    let verify = package(&[
        "in-root",
        r.to_str().unwrap(),
        "systemd-analyze verify /lib/systemd/system/slipway.service 2>&1; echo verified",
    ]);
    let said = stdout(&verify);
    assert_eq!(
        said.trim(),
        "verified",
        "systemd-analyze verify said:\n{said}"
    );

    // The packaged config, as installed, runs a job from the embedded queue.
    let project = r.join("tmp/project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join(".gitlab-ci.yml"), PROBE).unwrap();
    std::fs::set_permissions(&project, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Another port than the packaged one: tests run side by side on this machine.
    let cfg_path = r.join("etc/slipway/config.toml");
    let cfg = std::fs::read_to_string(&cfg_path).unwrap();
    assert!(cfg.contains("state_dir = \"/var/lib/slipway\""), "{cfg}");
    let port = common::free_port();
    std::fs::write(&cfg_path, cfg.replace(":9252", &format!(":{port}"))).unwrap();
    std::fs::write(r.join("tmp/scenario.sh"), SCENARIO).unwrap();
    let run = package(&["in-root", r.to_str().unwrap(), "sh /tmp/scenario.sh"]);
    let said = stdout(&run);
    let log = std::fs::read_to_string(r.join("tmp/manager.log")).unwrap_or_default();
    let job = said
        .lines()
        // `slipway jobs`' row (submit printed "1\thello" before it).
        .find(|l| l.contains("hello") && l.contains("test"))
        .unwrap_or_else(|| panic!("no job listed:\n{said}\nmanager:\n{log}"));
    assert!(job.contains("success"), "{said}\nmanager:\n{log}");
    let trace = std::fs::read_to_string(r.join("var/lib/slipway/queue/logs/1.log")).unwrap();
    assert!(
        trace.contains("hello from slipway in /var/lib/slipway-local/instances/"),
        "{trace}"
    );
    let groups = said
        .lines()
        .find_map(|l| l.strip_prefix("groups of slipway: "))
        .unwrap_or_else(|| panic!("{said}"));
    assert!(
        !groups.split(' ').any(|g| g == "docker" || g == "kvm"),
        "{said}"
    );
    // Each attempt on the manager's secrets failed, and the job's trace says so.
    for path in [
        "/etc/slipway/config.toml",
        "/var/lib/slipway",
        "/var/lib/slipway/queue",
        "/var/lib/slipway-local/id_ed25519",
        "/run/docker.sock",
    ] {
        // Refused for want of permission (not missing: the files are there, below).
        let line = trace
            .lines()
            .find(|l| l.starts_with(&format!("denied {path}:")))
            .unwrap_or_else(|| panic!("{path}:\n{trace}"));
        assert!(line.contains("Permission denied"), "{line}");
    }
    for path in [
        "etc/slipway/config.toml",
        "var/lib/slipway/queue",
        "var/lib/slipway-local/id_ed25519",
    ] {
        assert!(r.join(path).exists(), "{path} is not in the root");
    }
    // What the job printed, not its script's echo (which holds the words too).
    assert!(
        !trace
            .lines()
            .any(|l| l.starts_with("READ ") || l.starts_with("REACHED ")),
        "{trace}"
    );
    assert!(trace.contains("Permission denied"), "{trace}");
    assert!(said.contains("manager exit=0"), "{said}\nmanager:\n{log}");
    assert!(log.contains("SIGQUIT"), "the drain was not logged:\n{log}");
    let left = said
        .split("--- processes")
        .nth(1)
        .and_then(|s| s.split("--- end").next())
        .unwrap_or_default()
        .trim()
        .to_string();
    assert!(
        left.is_empty(),
        "processes left after the drain:\n{left}\nmanager:\n{log}"
    );
}

/// The image's uid for the slipway user.
fn image_uid(tag: &str) -> u32 {
    let out = Command::new("docker")
        .args(["run", "--rm", "--entrypoint", "id", tag, "-u"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    stdout(&out).trim().parse().unwrap()
}

/// A container removed with its test.
struct Container(String);

impl Container {
    /// `docker run -d` of `tag` with `args`, named `<kind>-<pid>`.
    fn run(kind: &str, args: &[&str], tag: &str) -> Container {
        let c = Container(format!("{kind}-{}", std::process::id()));
        let mut all = vec!["run", "-d", "--name", &c.0];
        all.extend_from_slice(args);
        all.push(tag);
        let started = docker(&all);
        assert!(started.status.success(), "{started:?}");
        c
    }

    /// What it printed, stdout then stderr.
    fn logs(&self) -> String {
        output_text(&docker(&["logs", &self.0]))
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rm", "-f", "-v", &self.0])
            .output();
    }
}

fn docker(args: &[&str]) -> Output {
    Command::new("docker").args(args).output().unwrap()
}

/// stdout then stderr.
fn output_text(out: &Output) -> String {
    stdout(out) + &String::from_utf8_lossy(&out.stderr)
}

/// The image of this build, made once per test process; its tag.
fn image() -> String {
    static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TAG.get_or_init(|| {
        slipway_testkit::ensure_docker_engine().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let deb = deb_in(dir.path());
        let built = package(&["image", deb.to_str().unwrap()]);
        let tag = stdout(&built).trim().to_string();
        assert_eq!(tag, TEST_IMAGE);
        tag
    })
    .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_runs_the_manager_against_gitlab() {
    let w = common::World::new();
    let tag = image();

    let gl = FakeGitlab::start().await;
    let id = gl.enqueue(job_payload_with_vars(
        "in-the-image",
        &["echo \"job on $(cat /etc/debian_version) as $(id -un)\""],
        &[("GIT_STRATEGY", "none")],
    ));
    // Config and state as volumes, owned by the image's slipway user.
    let etc = w.path().join("etc-slipway");
    let state = w.path().join("var-lib-slipway");
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::create_dir_all(&state).unwrap();
    let port = common::free_port();
    std::fs::write(
        etc.join("config.toml"),
        format!(
            r#"concurrent = 2
check_interval = 1
state_dir = "/var/lib/slipway"
listen_address = "127.0.0.1:{port}"
shutdown_timeout = 30
[[runners]]
  name = "image"
  url = "{url}"
  token = "{token}"
  executor = "instance"
  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = 1
    max_instances = 1
    delete_instances_on_shutdown = true
    [runners.autoscaler.plugin_config]
      dir = "/var/lib/slipway/fleeting-local"
      provisioning_delay = "0s"
    [[runners.autoscaler.policy]]
      idle_count = 0
"#,
            url = gl.url(),
            token = gl.runner_token(),
        ),
    )
    .unwrap();
    let uid = image_uid(&tag);
    for p in [&etc, &state, &etc.join("config.toml")] {
        std::os::unix::fs::chown(p, Some(uid), Some(uid)).unwrap();
    }
    let container = Container::run(
        "slipway-image-test",
        &[
            // The GitLab test server listens on this machine's loopback.
            "--network",
            "host",
            "-v",
            &format!("{}:/etc/slipway", etc.display()),
            "-v",
            &format!("{}:/var/lib/slipway", state.display()),
        ],
        &tag,
    );
    let name = container.0.clone();
    let logs = || container.logs();
    let done = common::wait_until(Duration::from_secs(180), || {
        gl.job(id)
            .is_some_and(|j| matches!(j.state.as_str(), "success" | "failed"))
    });
    let job = gl.job(id).unwrap();
    assert!(done, "job not finished: {}\n{}", job.state, logs());
    assert_eq!(job.state, "success", "{}\n{}", job.trace_text(), logs());
    let trace = job.trace_text();
    assert!(trace.contains("as slipway"), "{trace}");

    // `docker stop` drains (STOPSIGNAL SIGQUIT): the manager exits 0 and says so.
    let stopped = docker(&["stop", "-t", "120", &name]);
    assert!(stopped.status.success(), "{stopped:?}");
    let inspect = docker(&["inspect", "-f", "{{.State.ExitCode}}", &name]);
    assert_eq!(stdout(&inspect).trim(), "0", "{}", logs());
    assert!(logs().contains("SIGQUIT"), "{}", logs());
    drop(container);
}

/// `docker exec C sh -c SCRIPT`: exit code and output (stdout and stderr).
fn exec(container: &str, script: &str) -> (i32, String) {
    let out = docker(&["exec", container, "sh", "-c", script]);
    (out.status.code().unwrap_or(-1), output_text(&out))
}

/// A job that takes a while, submitted to the embedded queue as the slipway user.
const SUBMIT_SLOW_JOB: &str = r#"
set -e
mkdir -p /tmp/project && cd /tmp/project
printf 'slow:\n  script:\n    - echo slow-job-started\n    - sleep 6\n    - echo slow-job-finished\n' > .gitlab-ci.yml
chmod -R a+rX /tmp/project
slipway submit -c /etc/slipway/config.toml .gitlab-ci.yml
"#;

fn jobs(container: &str) -> String {
    exec(container, "slipway jobs -c /etc/slipway/config.toml").1
}

/// The service commands under a real systemd (PID 1 of a container made from the image, whose
/// root is the package installed in Debian): the packaged unit runs at boot; `install` writes
/// and enables another; `start`; `stop` drains a running job to its end; `status --service`;
/// `uninstall`.
#[test]
fn service_commands_drive_systemd() {
    let tag = image();
    let container = Container::run(
        "slipway-systemd-test",
        &[
            "--user",
            "root",
            "--entrypoint",
            "/lib/systemd/systemd",
            // What systemd needs as a container's init (no --privileged on this machine).
            "--cap-add",
            "SYS_ADMIN",
            "--security-opt",
            "seccomp=unconfined",
            "--cgroupns",
            "host",
            "-v",
            "/sys/fs/cgroup:/sys/fs/cgroup:rw",
            "--tmpfs",
            "/run",
            "--tmpfs",
            "/run/lock",
        ],
        &tag,
    );
    let name = container.0.clone();
    // Until systemd's bus is up, systemctl cannot even ask.
    let mut state = String::new();
    common::wait_until(Duration::from_secs(60), || {
        state = exec(&name, "systemctl is-system-running --wait").1;
        !state.contains("Failed to connect")
    });
    assert!(
        state.trim() == "running" || state.trim() == "degraded",
        "systemd: {state}"
    );
    let failed = exec(&name, "systemctl --failed --no-legend --plain").1;
    assert!(!failed.contains("slipway"), "{failed}");

    // The packaged unit, enabled by the package, runs.
    let (code, said) = exec(&name, "slipway status --service");
    assert_eq!(code, 0, "{said}");
    assert!(said.contains("slipway: Service is running"), "{said}");
    let (code, said) = exec(&name, "slipway stop");
    assert_eq!(code, 0, "{said}");
    let (code, said) = exec(&name, "slipway status --service");
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("not running"), "{said}");

    // The package's unit is not shadowed by one `install` would write in /etc.
    let (code, said) = exec(&name, "slipway install --user root");
    assert_ne!(code, 0, "{said}");
    assert!(
        said.contains("already installed at /lib/systemd/system/slipway.service"),
        "{said}"
    );
    // `install` writes and enables a unit of its own; `start` starts it.
    let (code, said) = exec(
        &name,
        "slipway install --service runner2 --user root --config /etc/slipway/config.toml \
         --working-directory /var/lib/slipway",
    );
    assert_eq!(code, 0, "{said}");
    let unit = exec(&name, "cat /etc/systemd/system/runner2.service").1;
    // As the packaged unit: the manager is root, its jobs the unprivileged `slipway`.
    assert!(unit.contains("User=root"), "{unit}");
    assert!(
        unit.contains("ExecStart=/usr/bin/slipway run --config /etc/slipway/config.toml"),
        "{unit}"
    );
    let (_, enabled) = exec(&name, "systemctl is-enabled runner2.service");
    assert_eq!(enabled.trim(), "enabled");
    let (code, said) = exec(&name, "slipway install --service runner2 --user root");
    assert_ne!(code, 0, "a second install must not overwrite: {said}");
    assert!(said.contains("uninstall"), "{said}");
    let (code, said) = exec(&name, "slipway start --service runner2");
    assert_eq!(code, 0, "{said}");
    let (code, said) = exec(&name, "slipway status --service runner2");
    assert_eq!(code, 0, "{said}");

    // `stop` while a job runs: the job finishes and is reported, then the service stops.
    let (code, said) = exec(&name, SUBMIT_SLOW_JOB);
    assert_eq!(code, 0, "{said}");
    let running = common::wait_until(Duration::from_secs(120), || {
        exec(
            &name,
            "cat /var/lib/slipway/queue/logs/1.log 2>/dev/null || true",
        )
        .1
        .contains("slow-job-started")
    });
    assert!(running, "the job never started: {}", jobs(&name));
    let (code, said) = exec(&name, "slipway stop --service runner2");
    assert_eq!(code, 0, "{said}");
    let listed = jobs(&name);
    let row = listed
        .lines()
        .find(|l| l.contains("slow") && l.contains("test"))
        .unwrap_or_else(|| panic!("{listed}"));
    assert!(
        row.contains("success"),
        "the drain did not let the job finish: {listed}"
    );
    let trace = exec(&name, "cat /var/lib/slipway/queue/logs/1.log").1;
    assert!(trace.contains("slow-job-finished"), "{trace}");
    let journal = exec(&name, "journalctl -u runner2 --no-pager").1;
    assert!(journal.contains("SIGQUIT"), "{journal}");

    // `uninstall` takes the unit away.
    let (code, said) = exec(&name, "slipway uninstall --service runner2");
    assert_eq!(code, 0, "{said}");
    let (code, _) = exec(&name, "test -e /etc/systemd/system/runner2.service");
    assert_ne!(code, 0, "the unit file is still there");
    let (code, said) = exec(&name, "slipway status --service runner2");
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("not installed"), "{said}");
}

/// `install --print` gives the unit for the flags; where systemd does not run (this machine),
/// `install` prints it too and the other service commands say what to do instead.
#[test]
fn install_prints_the_unit_and_without_systemd_the_rest_say_why_not() {
    let w = common::World::new();
    let cfg = w.write(
        "config.toml",
        "concurrent = 1\nshutdown_timeout = 60\n[[runners]]\n  name = \"x\"\n  executor = \"shell\"\n",
    );
    let cfg = cfg.to_str().unwrap();
    let out = w.run(&["install", "--print", "--user", "root", "--config", cfg]);
    assert_eq!(out.code, Some(0), "{}", out.explain());
    let unit = &out.stdout;
    assert!(unit.contains(&format!("--config {cfg}")), "{unit}");
    assert!(unit.contains("User=root"), "{unit}");
    assert!(
        unit.contains("TimeoutStopSec=360"),
        "shutdown_timeout 60 s + 300 s to report and remove: {unit}"
    );
    let out = w.run(&["install", "--print", "--user", "no-such-user-here"]);
    assert!(out.stderr.contains("--user: no user"), "{}", out.explain());
    let out = w.run(&[
        "install",
        "--print",
        "--user",
        "root",
        "--config",
        "/a b/config.toml",
    ]);
    assert!(out.stderr.contains("--config: "), "{}", out.explain());
    if Path::new("/run/systemd/system").exists() {
        // A systemd host: the commands would act on it (service_commands_drive_systemd covers
        // them in a container).
        return;
    }
    let out = w.run(&["install", "--user", "root", "--config", cfg]);
    assert_eq!(out.code, Some(0), "{}", out.explain());
    assert_eq!(
        &out.stdout, unit,
        "without systemd, install prints the unit"
    );
    assert!(
        out.stderr.contains("systemd is not running"),
        "{}",
        out.explain()
    );
    for cmd in ["start", "stop", "uninstall"] {
        let out = w.run(&[cmd]);
        assert_ne!(out.code, Some(0), "{cmd}: {}", out.explain());
        assert!(
            out.stderr.contains("systemd is not running"),
            "{cmd}: {}",
            out.explain()
        );
    }
}
