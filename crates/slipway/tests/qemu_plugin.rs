//! End to end on `fleeting-plugin-qemu`: `slipway exec` with `examples/config/qemu.toml`, every
//! job on a real QEMU VM (TCG here) reached over SSH; isolation `none` and `cgroup` in the guest.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Run, World};
use nix::fcntl::{Flock, FlockArg};

const IMAGE: &str = "test-vm-sshd";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn mtime(p: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// The sshd guest image (as the plugin's own tests build it) and the plugin binary.
fn prepare() -> PathBuf {
    slipway_testkit::guest::ensure_vm_tools().unwrap();
    let bins = common::slipway().parent().unwrap().to_path_buf();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    for (bin, package) in [
        ("fleeting-plugin-qemu", "fleeting-plugin-qemu"),
        ("slipway-guest-agent", "slipway-guest-agent"),
    ] {
        if !bins.join(bin).exists() {
            let st = Command::new(&cargo)
                .args(["build", "-p", package])
                .status()
                .unwrap();
            assert!(st.success(), "building {package} failed");
        }
    }
    let images = bins.join("slipway-test-images");
    std::fs::create_dir_all(&images).unwrap();
    let lock = std::fs::File::create(images.join(format!(".{IMAGE}.lock"))).unwrap();
    // Test processes run in parallel: one builds, the others wait and reuse.
    let _held = Flock::lock(lock, FlockArg::LockExclusive).unwrap();
    let agent = bins.join("slipway-guest-agent");
    let fresh = mtime(&images.join(IMAGE).join("image.json")).is_some_and(|built| {
        [&agent, &common::slipway()]
            .iter()
            .all(|b| mtime(b).is_some_and(|t| t <= built))
    });
    if !fresh {
        let out = Command::new(common::slipway())
            .args(["image", "build", "--name", IMAGE, "--level", "vm", "--sshd"])
            .arg("--images-dir")
            .arg(&images)
            .arg("--agent")
            .arg(&agent)
            .args(["--cache-dir", "/var/tmp/slipway-debootstrap-cache"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "slipway image build failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    images.join(IMAGE)
}

/// `examples/config/qemu.toml` pointed at the test image and a state dir in `w`.
fn config(w: &World, image: &Path) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("examples/config/qemu.toml")).unwrap();
    let state = w.path().join("qemu-state");
    let text = text
        .replace(
            r#"dir = "/var/lib/slipway/qemu""#,
            &format!("dir = {:?}", state.display().to_string()),
        )
        .replace(
            r#"image = "qemu-sshd""#,
            &format!("image = {:?}", image.display().to_string()),
        );
    assert!(text.contains("plugin = \"qemu\"") && text.contains(&*state.to_string_lossy()));
    w.write("config.toml", &text)
}

/// `slipway exec` to completion (bounded generously: VMs boot under emulation).
fn exec(w: &World, config: &Path, pipeline: &Path) -> Run {
    let child = w
        .slipway(&[
            "exec",
            "-c",
            config.to_str().unwrap(),
            pipeline.to_str().unwrap(),
        ])
        .spawn()
        .unwrap();
    Run::from(common::wait_with_timeout(child, Duration::from_secs(1800)))
}

/// Nothing of the run is left: no QEMU, no instance directory.
fn assert_clean(w: &World) {
    assert!(
        w.processes().is_empty(),
        "left running: {:?}",
        w.processes()
    );
    let instances: Vec<_> = std::fs::read_dir(w.path().join("qemu-state/instances"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(instances.is_empty(), "instances left: {instances:?}");
}

#[test]
fn example_pipeline_and_isolation_levels_run_on_qemu_vms() {
    let image = prepare();
    let w = World::new();
    let cfg = config(&w, &image);

    // The example pipeline: five jobs, artifacts between stages, an allowed failure.
    let run = exec(&w, &cfg, &repo().join("examples/pipeline.yml"));
    assert_eq!(run.code, Some(0), "{}", run.explain());
    assert!(
        run.stdout.contains("Pipeline succeeded"),
        "{}",
        run.explain()
    );
    let on = run
        .job_lines("compile")
        .into_iter()
        .find(|l| l.starts_with("on "))
        .unwrap_or_default();
    // The VM's host name is its instance id; logins are root.
    assert!(on.contains(" as root in "), "{}", run.explain());
    assert!(on.starts_with("on default-"), "{on}");
    let rows = run.summary();
    assert_eq!(rows.len(), 5, "{}", run.explain());
    assert!(
        rows.iter().all(|r| r.instance.starts_with("default-")),
        "{}",
        run.explain()
    );
    assert!(
        rows.iter()
            .any(|r| on.starts_with(&format!("on {} ", r.instance))),
        "the job ran on the VM named in the summary: {}",
        run.explain()
    );
    assert!(
        run.job_lines("unit-tests")
            .iter()
            .all(|l| !l.contains("No such file")),
        "{}",
        run.explain()
    );
    assert_clean(&w);

    // Isolation levels on a VM instance: none, and cgroup (cgroup v2 in the guest).
    let pipeline = w.write(
        "isolation.yml",
        r#"
stages: [test]
plain:
  stage: test
  isolation: none
  script:
    - uname -r
    - echo "plain ok"
slot:
  stage: test
  isolation: cgroup
  variables:
    SLIPWAY_MEMORY: 64Mi
  script:
    - echo "in $SLIPWAY_CGROUP"
    - grep -q "$SLIPWAY_CGROUP" /proc/self/cgroup && echo "inside the slot cgroup"
hog:
  stage: test
  isolation: cgroup
  allow_failure: true
  variables:
    SLIPWAY_MEMORY: 64Mi
  script:
    - tail /dev/zero
"#,
    );
    let run = exec(&w, &cfg, &pipeline);
    let row = |job: &str| {
        run.summary()
            .into_iter()
            .find(|r| r.job == job)
            .unwrap_or_else(|| panic!("no row for {job}: {}", run.explain()))
    };
    assert_eq!(run.code, Some(0), "{}", run.explain());
    assert_eq!(row("plain").status, "success", "{}", run.explain());
    let plain = run.job_lines("plain");
    assert!(
        plain.iter().any(|l| l.ends_with("-cloud-amd64")),
        "a guest kernel: {plain:?}"
    );
    assert_eq!(row("slot").status, "success", "{}", run.explain());
    assert!(
        run.job_lines("slot")
            .contains(&"inside the slot cgroup".to_string()),
        "{}",
        run.explain()
    );
    assert_eq!(row("hog").status, "failed (allowed)", "{}", run.explain());
    assert!(
        run.job_lines("hog")
            .join("\n")
            .contains("the job was OOM-killed"),
        "{}",
        run.explain()
    );
    assert_clean(&w);
}

/// Two concurrent `instance` jobs on QEMU VMs: each gets a VM of its own, and each VM is
/// removed after its job (not kept for reuse: `max_use_count = 0`, `idle_time` 10m). With
/// `max_instances = 2` both VMs are taken by the whole-instance jobs, so the later `check` job
/// can only run once one of them is gone, on a freshly booted VM.
#[test]
fn instance_jobs_get_a_vm_each_which_is_removed_after_the_job() {
    let image = prepare();
    let w = World::new();
    let cfg = config(&w, &image);
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        r#"allowed_isolation = ["none", "cgroup"]"#,
        r#"allowed_isolation = ["none", "cgroup", "instance"]"#,
    );
    assert!(text.contains(r#""instance"]"#));
    std::fs::write(&cfg, text).unwrap();
    let pipeline = w.write(
        "instance.yml",
        r#"
stages: [whole, check]
a:
  stage: whole
  isolation: instance
  script:
    - echo "vm $(hostname)"
    - sleep 2
b:
  stage: whole
  isolation: instance
  script:
    - echo "vm $(hostname)"
    - sleep 2
check:
  stage: check
  script:
    - echo "vm $(hostname)"
"#,
    );
    // At info level the manager logs each removal with its cause.
    let child = w
        .slipway(&[
            "--log-level",
            "info",
            "exec",
            "-c",
            cfg.to_str().unwrap(),
            pipeline.to_str().unwrap(),
        ])
        .spawn()
        .unwrap();
    let run = Run::from(common::wait_with_timeout(child, Duration::from_secs(1800)));
    assert_eq!(run.code, Some(0), "{}", run.explain());
    let row = |job: &str| {
        run.summary()
            .into_iter()
            .find(|r| r.job == job)
            .unwrap_or_else(|| panic!("no row for {job}: {}", run.explain()))
    };
    let vm = |job: &str| {
        run.job_lines(job)
            .into_iter()
            .find_map(|l| l.strip_prefix("vm ").map(str::to_string))
            .unwrap_or_else(|| panic!("{job} printed no host name: {}", run.explain()))
    };
    for job in ["a", "b", "check"] {
        assert_eq!(row(job).status, "success", "{job}: {}", run.explain());
        // The guest's host name is the instance id the summary names.
        assert_eq!(vm(job), row(job).instance, "{}", run.explain());
    }
    let (a, b, check) = (vm("a"), vm("b"), vm("check"));
    assert_ne!(a, b, "two instance jobs shared a VM");
    assert!(
        check != a && check != b,
        "a later job ran on a whole-instance job's VM"
    );
    for id in [&a, &b] {
        assert!(
            run.stderr.lines().any(|l| l.contains("removing instance")
                && l.contains(id.as_str())
                && l.contains("isolation_instance")),
            "{id} was not removed for its instance job: {}",
            run.explain()
        );
    }
    assert_clean(&w);
}
