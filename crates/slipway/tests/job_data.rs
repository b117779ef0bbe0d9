//! A job's data moves where the job runs: the job helper downloads its dependency's artifacts
//! from the test GitLab, saves and restores its cache on the real S3 server (LocalStack's), and
//! uploads its artifacts, at the `none` level (an instance's shell), the `docker` level (the
//! build container) and the `microvm` level (the VM's guest, on QEMU's user-mode network). Every artifacts request reached GitLab from the helper, and the manager's
//! own reads and writes during a job stay far below one of the job's files: no artifact or
//! cache byte crossed it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use common::World;
use serde_json::{Value, json};
use slipway_testkit::gitlab::{FakeGitlab, job_payload_with_vars};
use slipway_testkit::s3::{LocalStack, SECRET_KEY};

const BUCKET: &str = "runner-cache";
/// Each file the jobs move: random, so no archive shrinks it.
const SIZE: usize = 24 << 20;

/// Bytes the process `pid` has read and written through system calls (files, sockets, pipes).
fn io_bytes(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(": ")?;
            matches!(k, "rchar" | "wchar").then(|| v.trim().parse::<u64>().ok())?
        })
        .sum()
}

/// A zip holding `dep/payload.bin` of random bytes, and their SHA-256.
fn dependency_zip(w: &World) -> (Vec<u8>, String) {
    let dir = w.path().join("dep-src");
    std::fs::create_dir_all(dir.join("dep")).unwrap();
    let payload = dir.join("dep/payload.bin");
    let st = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "head -c {SIZE} /dev/urandom > {}",
            payload.display()
        ))
        .status()
        .unwrap();
    assert!(st.success());
    let zip = w.path().join("dep.zip");
    let st = std::process::Command::new("python3")
        .args(["-m", "zipfile", "-c"])
        .arg(&zip)
        .arg("dep")
        .current_dir(&dir)
        .status()
        .unwrap();
    assert!(st.success());
    (std::fs::read(&zip).unwrap(), sha256_of(&payload))
}

/// `sha256sum`'s digest of `file`.
fn sha256_of(file: &Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(file)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// The job that uses the dependency, writes an artifact and fills the cache (in
/// `CACHE_COMPRESSION_FORMAT` `format`).
fn first_job(dep_id: u64, level: &str, format: &str) -> Value {
    let mut job = job_payload_with_vars(
        "build",
        &[
            "sha256sum dep/payload.bin",
            &format!(
                "mkdir -p out vendor && head -c {SIZE} /dev/urandom > out/app.bin && \
                 head -c {SIZE} /dev/urandom > vendor/deps.bin"
            ),
            "sha256sum out/app.bin vendor/deps.bin",
        ],
        &[
            ("GIT_STRATEGY", "none"),
            ("SLIPWAY_ISOLATION", level),
            ("CACHE_COMPRESSION_FORMAT", format),
        ],
    );
    job["dependencies"] = json!([
        {"id": dep_id, "token": "glcbt-1_depTokenData01", "name": "prepare",
         "artifacts_file": {"filename": "artifacts.zip", "size": SIZE}}
    ]);
    job["artifacts"] = json!([{"name": "app", "paths": ["out/"], "when": "on_success",
        "artifact_type": "archive", "artifact_format": "zip"}]);
    job["cache"] = json!([{"key": "deps", "paths": ["vendor/"], "policy": "pull-push",
        "when": "on_success"}]);
    job
}

/// The job that finds the cache the first one saved.
fn second_job(level: &str) -> Value {
    let mut job = job_payload_with_vars(
        "test",
        &["sha256sum vendor/deps.bin"],
        &[("GIT_STRATEGY", "none"), ("SLIPWAY_ISOLATION", level)],
    );
    job["cache"] = json!([{"key": "deps", "paths": ["vendor/"], "policy": "pull",
        "when": "on_success"}]);
    job
}

/// The SHA-256 a trace printed for `file` (`sha256sum` output).
fn printed_sha(trace: &str, file: &str) -> String {
    trace
        .lines()
        .find_map(|l| l.strip_suffix(&format!("  {file}")))
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|| panic!("no sha256 of {file}:\n{trace}"))
}

/// A runner of `executor` serving `gl` with the S3 cache on `s3`; its instance shares this
/// machine's network (the job helper reaches the servers from there). A `plugin` runner's
/// plugin places its jobs on this machine itself: no autoscaler.
fn config(w: &World, gl: &FakeGitlab, s3: &LocalStack, executor: &str, extra: &str) -> PathBuf {
    let text = config_text(w, gl, s3, executor, extra);
    let text = if executor == "plugin" {
        let cut = text.find("  [runners.autoscaler]").unwrap();
        text[..cut].replace(r#"["none", "docker"]"#, r#"["none"]"#)
    } else {
        text
    };
    w.write("config.toml", &text)
}

/// The config.toml text of [`config`], with an autoscaler on this machine.
fn config_text(w: &World, gl: &FakeGitlab, s3: &LocalStack, executor: &str, extra: &str) -> String {
    format!(
        r#"
concurrent = 1
check_interval = 1
[[runners]]
  name = "data"
  url = "{url}"
  token = "{token}"
  executor = "{executor}"
  allowed_isolation = ["none", "docker"{vm}]
{extra}
{cache}  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = 1
    max_instances = 1
    update_interval = "200ms"
    update_interval_when_expecting = "100ms"
    delete_instances_on_shutdown = true
    [runners.autoscaler.plugin_config]
      dir = "{state}"
      name = "jd{pid}"
      network = "loopback"
    [[runners.autoscaler.policy]]
      idle_count = 0
      idle_time = "10m"
"#,
        url = gl.url(),
        token = gl.runner_token(),
        cache = common::s3_cache_section(&s3.address(), BUCKET, SECRET_KEY),
        state = w.path().join("plugin-state").display(),
        pid = std::process::id(),
        vm = if extra.contains("vm_isolation") {
            ", \"microvm\""
        } else {
            ""
        },
    )
}

/// The static job helper `make helper` builds (the one `slipway` finds in a build tree).
fn helper_size() -> u64 {
    let bin = common::slipway();
    let target = bin.parent().and_then(Path::parent).unwrap();
    let helper = target.join("x86_64-unknown-linux-gnu/release/slipway-helper");
    std::fs::metadata(&helper)
        .unwrap_or_else(|e| panic!("{}: {e} (run `make helper`)", helper.display()))
        .len()
}

/// Run both jobs at `level`, the cache in `format`, and check where their data went.
async fn data_moves_where_the_job_runs(
    (level, format): (&str, &str),
    ip: IpAddr,
    executor: &str,
    extra: &str,
) {
    let s3 = LocalStack::start_on(BUCKET, ip).expect("LocalStack");
    let w = World::new();
    let gl = FakeGitlab::start_on(ip).await;
    let (zip, dep_sha) = dependency_zip(&w);
    let dep_id = 700;
    gl.put_artifact(dep_id, "glcbt-1_depTokenData01", zip);
    let cfg = config(&w, &gl, &s3, executor, extra);
    let child = common::start_manager(&w, &cfg);
    // What the manager may move for one job besides job data: the helper (read and sent
    // once per instance, or per build container), traces, API calls. Through an executor
    // plugin the manager's first job also reads about one helper's worth more whether or not
    // it installs it (measured: 9.9 MB without the install, 25.1 MB with it; not yet
    // explained). One 24 MiB file of the job's data through the manager would still cost it
    // 48 MiB in reads and writes.
    let helpers = if executor == "plugin" { 3 } else { 2 };
    let allowance = helpers * helper_size() + (8 << 20);

    let before = io_bytes(child.id());
    let first = gl.enqueue(first_job(dep_id, level, format));
    let (state, trace) = common::job_ended(&gl, first).await;
    assert_eq!(state, "success", "{trace}");
    let during_first = io_bytes(child.id()) - before;
    assert_eq!(printed_sha(&trace, "dep/payload.bin"), dep_sha, "{trace}");
    if level == "microvm" {
        assert!(
            trace.contains("Creating a microvm VM from image"),
            "{trace}"
        );
    }
    for want in [
        "Downloading artifacts for prepare (700)...",
        "Creating cache deps...",
        if format == "tarzstd" {
            "Uploading cache.tar.zst to"
        } else {
            "Uploading cache.zip to"
        },
        "Created cache deps",
        "Uploading artifacts as \"archive\" to coordinator... 201 Created",
    ] {
        assert!(trace.contains(want), "{want:?} missing:\n{trace}");
    }
    // The artifact GitLab got is the file the job made.
    let uploaded = gl.job(first).unwrap().artifacts;
    assert_eq!(uploaded.len(), 1, "{trace}");
    let unzipped = w.path().join("uploaded");
    std::fs::create_dir_all(&unzipped).unwrap();
    std::fs::write(w.path().join("uploaded.zip"), &uploaded[0].bytes).unwrap();
    let st = std::process::Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(w.path().join("uploaded.zip"))
        .arg(&unzipped)
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(
        sha256_of(&unzipped.join("out/app.bin")),
        printed_sha(&trace, "out/app.bin")
    );
    // The cache is in the bucket under GitLab Runner's name.
    let objects = s3.objects(BUCKET).unwrap();
    assert_eq!(
        objects,
        vec!["ci/runner/fAkErUnNe/project/1/deps"],
        "{trace}"
    );
    // In the format the job named: a Zstandard stream or a zip.
    let object = s3.object(BUCKET, &objects[0]).unwrap();
    let magic: &[u8] = if format == "tarzstd" {
        &[0x28, 0xb5, 0x2f, 0xfd]
    } else {
        b"PK\x03\x04"
    };
    assert!(object.starts_with(magic), "{:02x?}", &object[..8]);

    let before = io_bytes(child.id());
    let second = gl.enqueue(second_job(level));
    let (state, trace2) = common::job_ended(&gl, second).await;
    assert_eq!(state, "success", "{trace2}");
    let during_second = io_bytes(child.id()) - before;
    assert!(trace2.contains("Successfully extracted cache"), "{trace2}");
    assert_eq!(
        printed_sha(&trace2, "vendor/deps.bin"),
        printed_sha(&trace, "vendor/deps.bin")
    );

    // Every artifacts request came from the helper, none from the manager's own client.
    let artifact_requests: Vec<_> = gl
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("/artifacts"))
        .collect();
    assert_eq!(artifact_requests.len(), 2, "one download, one upload");
    for r in &artifact_requests {
        let agent = r.header("user-agent").unwrap_or_default();
        assert!(
            agent.starts_with("slipway-helper/"),
            "{} {}: {agent}",
            r.method,
            r.path
        );
    }
    // 72 MiB moved in the first job and 24 MiB in the second: one of those files through the
    // manager would have cost it twice its size in reads and writes.
    eprintln!(
        "manager I/O: {during_first} bytes during the first job, {during_second} during the \
         second; data moved: {} and {} bytes",
        3 * SIZE,
        SIZE
    );
    // The helper is copied once per version: an instance keeps it in its home, a Docker
    // engine in a read-only volume its build containers share. (A VM is new for every job
    // and gets its own copy over its agent's channel.)
    if level != "microvm" {
        assert!(
            during_second < helper_size(),
            "the manager moved {during_second} bytes during the second job: the helper again?"
        );
    }
    for (job, bytes) in [("first", during_first), ("second", during_second)] {
        assert!(
            bytes < allowance,
            "the manager read and wrote {bytes} bytes during the {job} job (allowance \
             {allowance})"
        );
    }
    common::stop_manager(&w, child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_none_level_the_instance_moves_its_jobs_data() {
    // The cache as GitLab Runner's `tarzstd`: written and read back on the instance.
    data_moves_where_the_job_runs(("none", "tarzstd"), [127, 0, 0, 1].into(), "instance", "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_plugin_that_offers_job_data_has_its_environment_move_it() {
    // executor-plugin-shell runs jobs on this machine and says so in Init (`job_data`): the
    // helper is copied through its install_helper stage and runs in its stages.
    let plugin = "  [runners.plugin]\n    name = \"shell\"\n";
    data_moves_where_the_job_runs(("none", "zip"), [127, 0, 0, 1].into(), "plugin", plugin).await;
}

/// A nesting daemon serving this world's VMs (killed on drop; the world's own drop kills
/// the QEMUs left under its directory).
struct Nest {
    child: std::process::Child,
    socket: PathBuf,
}

impl Nest {
    fn start(w: &World, images: &Path) -> Nest {
        let socket = w.path().join("n.sock");
        let state = w.path().join("ns");
        let child = w
            .slipway(&["nesting", "--socket"])
            .arg(&socket)
            .arg("serve")
            .arg("--state-dir")
            .arg(&state)
            .arg("--images-dir")
            .arg(images)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        assert!(
            common::wait_until(std::time::Duration::from_secs(20), || {
                std::os::unix::net::UnixStream::connect(&socket).is_ok()
            }),
            "the nesting daemon did not listen on {}",
            socket.display()
        );
        Nest { child, socket }
    }
}

impl Drop for Nest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_microvm_level_the_vms_guest_moves_its_jobs_data() {
    use slipway_testkit::guest::{MICROVM_IMAGE, guest_image};
    slipway_testkit::ensure_docker_engine().expect("Docker Engine");
    // The guest reaches the host's own addresses through QEMU's user-mode network, except
    // loopback (its 127.0.0.1 is its own): the servers listen on docker0's address.
    let gateway = slipway_testkit::docker_gateway().expect("docker0");
    let images = guest_image(MICROVM_IMAGE, "microvm").unwrap();
    let w = World::new();
    let nest = Nest::start(&w, &images);
    let vm = format!(
        r#"  [runners.instance]
    allowed_images = ["test-*"]
  [runners.autoscaler.vm_isolation]
    enabled = true
    nesting_host = "unix://{socket}"
    microvm_image = "{MICROVM_IMAGE}"
    [runners.autoscaler.vm_isolation.nesting_config]
      accel = "tcg"
      memory_mib = 512
      images_dir = "{images}"
"#,
        socket = nest.socket.display(),
        images = images.display(),
    );
    data_moves_where_the_job_runs(("microvm", "zip"), gateway, "instance", &vm).await;
    drop(nest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_docker_level_the_build_container_moves_its_jobs_data() {
    slipway_testkit::ensure_docker_engine().expect("Docker Engine");
    let gateway = slipway_testkit::docker_gateway().expect("docker0");
    let docker = "  [runners.docker]\n    image = \"slipway-busybox:latest\"\n    \
                  pull_policy = \"never\"\n";
    // The engine's helper volume made afresh (one in use by another test stays: then this
    // test checks the reuse).
    let helper_volumes = || {
        let out = std::process::Command::new("docker")
            .args(["volume", "ls", "-q", "--filter", "label=com.slipway.helper"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    for v in helper_volumes() {
        let _ = std::process::Command::new("docker")
            .args(["volume", "rm", &v])
            .output();
    }
    data_moves_where_the_job_runs(("docker", "zip"), gateway, "instance", docker).await;
    assert_eq!(helper_volumes().len(), 1, "{:?}", helper_volumes());
    // Filled by a container of Slipway's own that is gone now.
    let out = std::process::Command::new("docker")
        .args(["ps", "-aq", "--filter", "label=com.slipway.helper"])
        .output()
        .unwrap();
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
