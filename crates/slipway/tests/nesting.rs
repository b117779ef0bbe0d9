//! The `microvm` and `vm` isolation levels end to end, with real QEMU guests (emulated here):
//! `slipway exec` on `fleeting-plugin-local` instances whose nesting daemon (`slipway nesting
//! serve`) starts a VM per job, reached through the instance's SSH connection. Snapshots kept on
//! failure and stepped into with `slipway debug`, saved and restored, branched four ways; a hung
//! VM killed at the job's timeout; a daemon killed and restarted.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{World, wait_until, wait_with_timeout};
use slipway_testkit::guest::{MICROVM_IMAGE, VM_IMAGE, guest_image};

/// A nesting daemon process of this test's world.
struct Nest {
    child: Option<Child>,
    socket: PathBuf,
    state: PathBuf,
    images: PathBuf,
}

impl Nest {
    fn start(w: &World, images: &Path) -> Nest {
        let mut n = Nest {
            child: None,
            socket: w.path().join("n.sock"),
            state: w.path().join("ns"),
            images: images.to_path_buf(),
        };
        n.spawn(w);
        n
    }

    fn spawn(&mut self, w: &World) {
        let child = w
            .slipway(&["nesting", "--socket"])
            .arg(&self.socket)
            .arg("serve")
            .arg("--state-dir")
            .arg(&self.state)
            .arg("--images-dir")
            .arg(&self.images)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        assert!(
            wait_until(Duration::from_secs(20), || {
                std::os::unix::net::UnixStream::connect(&self.socket).is_ok()
            }),
            "the nesting daemon did not listen on {}",
            self.socket.display()
        );
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `slipway nesting <args>` against this daemon.
    fn cli(&self, w: &World, args: &[&str]) -> common::Run {
        let child = w
            .slipway(&["nesting", "--socket"])
            .arg(&self.socket)
            .args(args)
            .spawn()
            .unwrap();
        common::Run::from(wait_with_timeout(child, Duration::from_secs(240)))
    }

    /// The directory of the first VM whose guest agent has started (its console says so).
    fn wait_for_guest(&self) -> PathBuf {
        let vms = self.state.join("vms");
        let mut found = None;
        let started = wait_until(Duration::from_secs(180), || {
            found = std::fs::read_dir(&vms).ok().and_then(|rd| {
                rd.flatten().map(|e| e.path()).find(|dir| {
                    std::fs::read_to_string(dir.join("console.log"))
                        .unwrap_or_default()
                        .contains("agent started")
                })
            });
            found.is_some()
        });
        assert!(started, "no guest agent started under {}", vms.display());
        found.unwrap()
    }

    /// QEMU processes of this daemon's VMs.
    fn qemus(&self) -> Vec<String> {
        common::processes_matching(&format!("{}/vms/", self.state.display()))
            .into_iter()
            .filter(|p| p.contains("qemu-system"))
            .collect()
    }
}

impl Drop for Nest {
    fn drop(&mut self) {
        self.kill();
    }
}

fn images() -> PathBuf {
    guest_image(MICROVM_IMAGE, "microvm").unwrap();
    guest_image(VM_IMAGE, "vm").unwrap()
}

/// A world with a nesting daemon and a config.toml whose runner uses it.
fn vm_world() -> (World, Nest, PathBuf) {
    vm_world_by(false)
}

/// [`vm_world`], with the VM levels in-process or behind the executor plugin boundary.
fn vm_world_by(plugin: bool) -> (World, Nest, PathBuf) {
    let w = World::new();
    let nest = Nest::start(&w, &images());
    let cfg = if plugin {
        plugin_config(&w, &nest)
    } else {
        config(&w, &nest)
    };
    (w, nest, cfg)
}

fn config(w: &World, nest: &Nest) -> PathBuf {
    config_with(w, nest, "")
}

/// `[runners.autoscaler]` of the VM runners: one local instance with four slots.
fn local_instances(w: &World) -> String {
    format!(
        r#"  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = 4
    max_instances = 1
    instance_acquire_timeout = "2m"
    update_interval = "5s"
    update_interval_when_expecting = "200ms"
    delete_instances_on_shutdown = true
    shutdown_deletion_interval = "1s"
    [runners.autoscaler.plugin_config]
      dir = "{}"
"#,
        w.path().join("plugin-state").display()
    )
}

/// The VM runner's config.toml; `source` adds keys to `[[runners]]` (a GitLab url and token).
fn config_with(w: &World, nest: &Nest, source: &str) -> PathBuf {
    let text = format!(
        r#"
concurrent = 4
check_interval = 1
[[runners]]
  name = "vms"
  executor = "instance"
  {source}
  [runners.instance]
    allowed_images = ["test-*"]
{autoscaler}    [runners.autoscaler.vm_isolation]
      enabled = true
      nesting_host = "unix://{socket}"
      microvm_image = "{MICROVM_IMAGE}"
      vm_image = "{VM_IMAGE}"
      [runners.autoscaler.vm_isolation.nesting_config]
        accel = "tcg"
        images_dir = "{images}"
    [[runners.autoscaler.policy]]
      idle_count = 0
      idle_time = "5m"
"#,
        autoscaler = local_instances(w),
        socket = nest.socket.display(),
        images = nest.images.display(),
    );
    w.write("config.toml", &text)
}

/// `slipway exec` of `pipeline` in the background (for tests that act while it runs).
fn spawn_exec(w: &World, cfg: &Path, pipeline: &str) -> Child {
    let file = w.write("pipeline.yml", pipeline);
    w.slipway(&["exec", "-c", cfg.to_str().unwrap(), file.to_str().unwrap()])
        .spawn()
        .unwrap()
}

/// Only the header of a `slipway nesting list|snapshots` table.
fn assert_empty_table(run: &common::Run) {
    assert_eq!(
        run.stdout.lines().count(),
        1,
        "only the header: {}",
        run.explain()
    );
}

fn exec(w: &World, cfg: &Path, pipeline: &str) -> common::Run {
    let file = w.write("pipeline.yml", pipeline);
    w.run(&["exec", "-c", cfg.to_str().unwrap(), file.to_str().unwrap()])
}

fn status(run: &common::Run, job: &str) -> String {
    run.summary()
        .into_iter()
        .find(|r| r.job == job)
        .unwrap_or_else(|| panic!("no row for {job}: {}", run.explain()))
        .status
}

#[test]
fn microvm_and_vm_jobs_each_run_in_a_vm_of_their_own() {
    let (w, nest, cfg) = vm_world();
    let run = exec(
        &w,
        &cfg,
        r#"
stages: [build, test]
micro:
  stage: build
  isolation: microvm
  script:
    - echo "kernel $(uname -r)"
    - grep -q slipway.root /proc/cmdline && echo "root disk" || echo "initramfs root"
    - echo "pwd $PWD"
    - mkdir -p out && echo "built in a microvm" > out/result.txt
  artifacts:
    paths: [out/]
full:
  stage: test
  isolation: vm
  script:
    - echo "kernel $(uname -r)"
    - grep -q slipway.root /proc/cmdline && echo "root disk" || echo "initramfs root"
    - test -f /etc/debian_version && echo "debian $(cat /etc/debian_version)"
    - echo "artifact says $(cat out/result.txt)"
"#,
    );
    assert_eq!(run.code, Some(0), "{}", run.explain());
    let micro = run.job_lines("micro").join("\n");
    let full = run.job_lines("full").join("\n");
    assert!(
        micro.contains("Creating a microvm VM from image test-microvm in slot"),
        "{micro}"
    );
    assert!(
        micro.contains("cloud-amd64") && micro.contains("initramfs root"),
        "{micro}"
    );
    assert!(micro.contains("pwd /work/builds/"), "{micro}");
    assert!(
        full.contains("Creating a vm VM from image test-vm in slot"),
        "{full}"
    );
    assert!(
        full.contains("root disk") && full.contains("debian 12"),
        "{full}"
    );
    assert!(nest.qemus().is_empty(), "VMs left: {:?}", nest.qemus());
    let list = nest.cli(&w, &["list"]);
    assert_empty_table(&list);
}

#[test]
fn a_microvm_job_is_handed_the_vm_its_slot_kept_warm() {
    let (w, nest, cfg) = vm_world();
    // Warm slots on under emulation too (unset, they are on only where guests run under KVM).
    let text = std::fs::read_to_string(&cfg).unwrap().replacen(
        "\n      vm_image = ",
        "\n      warm = true\n      vm_image = ",
        1,
    );
    std::fs::write(&cfg, text).unwrap();
    // The daemon learns of warm slots with the first job's Create (GitLab's create, "not
    // initialized", init, create): it takes the image's base snapshot and fills the free slots,
    // the first job's own slot included. While the first job runs, the others are filled; the
    // second job is handed one of those VMs.
    let run = exec(
        &w,
        &cfg,
        r#"
stages: [build, test]
first:
  stage: build
  isolation: microvm
  script:
    - sleep 10
    - echo "first $(cat /etc/machine-id)"
second:
  stage: test
  isolation: microvm
  script:
    - echo "second $(cat /etc/machine-id)"
"#,
    );
    assert_eq!(run.code, Some(0), "{}", run.explain());
    let first = run.job_lines("first").join("\n");
    let second = run.job_lines("second").join("\n");
    assert!(
        first.contains("Creating a microvm VM from image test-microvm"),
        "{first}"
    );
    assert!(
        second.contains("Warm start: VM") && second.contains("is handed over"),
        "{second}"
    );
    // A warm VM is a restore of the base snapshot, renewed: not the first VM's identity.
    let id = |text: &str, job: &str| {
        text.lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix(&format!("{job} "))
                    .map(str::to_string)
            })
            .unwrap_or_default()
    };
    let (a, b) = (id(&first, "first"), id(&second, "second"));
    assert!(a.len() == 32 && b.len() == 32 && a != b, "{a:?} {b:?}");
    // The slots are warm again, and the VMs waiting in them are listed as such.
    let mut listed = String::new();
    assert!(
        wait_until(Duration::from_secs(120), || {
            listed = nest.cli(&w, &["list"]).stdout;
            listed.lines().skip(1).any(|l| l.contains(" yes "))
        }),
        "{listed}"
    );
    assert!(
        listed.lines().next().unwrap_or_default().contains("WARM"),
        "{listed}"
    );
    // The daemon's shutdown removes them.
    let down = nest.cli(&w, &["shutdown"]);
    assert_eq!(down.code, Some(0), "{}", down.explain());
    assert!(
        wait_until(Duration::from_secs(30), || nest.qemus().is_empty()),
        "{:?}",
        nest.qemus()
    );
}

#[test]
fn a_daemon_started_with_an_init_file_keeps_its_slots_warm_before_any_job() {
    let w = World::new();
    let images = images();
    let (socket, state) = (w.path().join("n.sock"), w.path().join("ns"));
    let serve = |init: &Path| {
        w.slipway(&["nesting", "--socket"])
            .arg(&socket)
            .arg("serve")
            .arg("--state-dir")
            .arg(&state)
            .arg("--images-dir")
            .arg(&images)
            .arg("--init")
            .arg(init)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // A bad file: the daemon does not start, and says which file and what is wrong.
    let bad = w.write("bad-init.json", r#"{"accel":"tcg","warm":{"slots":"two"}}"#);
    let out = wait_with_timeout(serve(&bad), Duration::from_secs(60));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad-init.json") && err.contains("warm.slots"),
        "{err}"
    );
    let init = w.write(
        "init.json",
        &format!(r#"{{"accel":"tcg","warm":{{"slots":2,"images":["{MICROVM_IMAGE}"]}}}}"#),
    );
    let mut child = serve(&init);
    let nest = Nest {
        child: None,
        socket: socket.clone(),
        state: state.clone(),
        images: images.clone(),
    };
    let mut listed = String::new();
    let warm = wait_until(Duration::from_secs(180), || {
        listed = nest.cli(&w, &["list"]).stdout;
        listed
            .lines()
            .skip(1)
            .filter(|l| l.contains(" yes "))
            .count()
            == 2
    });
    assert!(warm, "{listed}");
    let down = nest.cli(&w, &["shutdown"]);
    assert_eq!(down.code, Some(0), "{}", down.explain());
    common::signal(child.id(), "TERM");
    let _ = child.wait();
    assert!(
        wait_until(Duration::from_secs(30), || nest.qemus().is_empty()),
        "{:?}",
        nest.qemus()
    );
}

/// The same runner with the VM levels behind the executor plugin boundary:
/// `executor-plugin-nesting`, built from the in-process executor's code.
fn plugin_config(w: &World, nest: &Nest) -> PathBuf {
    let text = format!(
        r#"
concurrent = 4
[[runners]]
  name = "vms-by-plugin"
  executor = "plugin"
  [runners.plugin]
    name = "nesting"
    prepare_timeout = "4m"
    [runners.plugin.config]
      nesting_host = "unix://{socket}"
      microvm_image = "{MICROVM_IMAGE}"
      vm_image = "{VM_IMAGE}"
      allowed_images = ["test-*"]
      [runners.plugin.config.nesting_config]
        accel = "tcg"
        images_dir = "{images}"
{autoscaler}    [[runners.autoscaler.policy]]
      idle_count = 0
      idle_time = "5m"
"#,
        autoscaler = local_instances(w),
        socket = nest.socket.display(),
        images = nest.images.display(),
    );
    w.write("plugin-config.toml", &text)
}

#[test]
fn microvm_and_vm_jobs_run_in_vms_through_the_nesting_executor_plugin() {
    let w = World::new();
    let nest = Nest::start(&w, &images());
    let cfg = plugin_config(&w, &nest);
    let run = exec(
        &w,
        &cfg,
        r#"
stages: [build, test]
micro:
  stage: build
  isolation: microvm
  script:
    - echo "kernel $(uname -r)"
    - grep -q slipway.root /proc/cmdline && echo "root disk" || echo "initramfs root"
    - mkdir -p out && echo "built in a microvm" > out/result.txt
  artifacts:
    paths: [out/]
full:
  stage: test
  isolation: vm
  script:
    - test -f /etc/debian_version && echo "debian $(cat /etc/debian_version)"
    - echo "artifact says $(cat out/result.txt)"
broken:
  stage: test
  isolation: microvm
  snapshot: on_failure
  allow_failure: true
  script:
    - echo "half-way state" > progress.txt
    - exit 4
"#,
    );
    assert_eq!(run.code, Some(0), "{}", run.explain());
    let micro = run.job_lines("micro").join("\n");
    let full = run.job_lines("full").join("\n");
    let broken = run.job_lines("broken").join("\n");
    assert!(
        micro.contains("Using executor plugin nesting")
            && micro.contains("Creating a microvm VM from image test-microvm in slot"),
        "{micro}"
    );
    assert!(
        micro.contains("cloud-amd64") && micro.contains("initramfs root"),
        "{micro}"
    );
    assert!(
        full.contains("Creating a vm VM from image test-vm in slot") && full.contains("debian 12"),
        "{full}"
    );
    assert!(full.contains("artifact says built in a microvm"), "{full}");
    // Cleanup kept the failed job's VM as a snapshot, as in-process.
    assert_eq!(status(&run, "broken"), "failed (allowed)");
    assert!(broken.contains("Saved the VM as snapshot job-"), "{broken}");
    assert!(nest.qemus().is_empty(), "VMs left: {:?}", nest.qemus());
    let list = nest.cli(&w, &["list"]);
    assert_empty_table(&list);
    // The plugin process of this run (it inherited the run's TMPDIR) is gone.
    let tmp = format!("TMPDIR={}", w.tmp().display());
    let plugins: Vec<String> = common::processes_matching("executor-plugin-nesting")
        .into_iter()
        .filter(|p| {
            let pid = p.split_whitespace().next().unwrap_or_default();
            common::environ_of(pid.parse().unwrap_or(0))
                .lines()
                .any(|l| l == tmp)
        })
        .collect();
    assert!(plugins.is_empty(), "{plugins:?}");
}

#[test]
fn a_failed_microvm_job_leaves_a_snapshot_that_slipway_debug_steps_into() {
    let (w, nest, cfg) = vm_world();
    let run = exec(
        &w,
        &cfg,
        r#"
broken:
  isolation: microvm
  snapshot: on_failure
  script:
    - echo "half-way state" > progress.txt
    - echo "in memory too" > /tmp/notes
    - echo failing now
    - exit 4
"#,
    );
    assert_eq!(run.code, Some(1), "{}", run.explain());
    assert_eq!(status(&run, "broken"), "failed");
    let lines = run.job_lines("broken").join("\n");
    assert!(lines.contains("Saved the VM as snapshot job-"), "{lines}");
    let hint = lines
        .lines()
        .find_map(|l| l.split("run `slipway debug ").nth(1))
        .unwrap_or_else(|| panic!("no debug hint: {lines}"));
    let job_id: String = hint.chars().take_while(char::is_ascii_digit).collect();
    assert!(nest.qemus().is_empty(), "the snapshot consumed the VM");
    let snaps = nest.cli(&w, &["snapshots"]);
    assert!(
        snaps.stdout.contains(&format!("job-{job_id}")),
        "{}",
        snaps.explain()
    );

    let debug = w
        .slipway(&["debug", &job_id, "--socket"])
        .arg(&nest.socket)
        .args(["--", "cat progress.txt /tmp/notes; pwd"])
        .spawn()
        .unwrap();
    let out = common::Run::from(wait_with_timeout(debug, Duration::from_secs(240)));
    assert_eq!(out.code, Some(0), "{}", out.explain());
    assert!(
        out.stdout.contains("half-way state\nin memory too\n"),
        "{}",
        out.explain()
    );
    assert!(
        out.stdout.contains(&format!("/job-{job_id}")),
        "in the job's directory: {}",
        out.explain()
    );
    assert!(
        nest.qemus().is_empty(),
        "the debug VM is deleted afterwards"
    );

    let missing = w
        .slipway(&["debug", "999999", "--socket"])
        .arg(&nest.socket)
        .spawn()
        .unwrap();
    let missing = common::Run::from(wait_with_timeout(missing, Duration::from_secs(60)));
    assert_ne!(missing.code, Some(0));
    assert!(
        missing.stderr.contains("no snapshot \"job-999999\""),
        "{}",
        missing.explain()
    );
}

#[test]
fn a_saved_snapshot_is_restored_and_branched_four_ways() {
    let (w, nest, cfg) = vm_world();
    let run = exec(
        &w,
        &cfg,
        r#"
stages: [prepare, test]
deps:
  stage: prepare
  isolation: microvm
  snapshot:
    save: deps
  script:
    - mkdir -p /work/deps && echo "libfoo 1.2" > /work/deps/installed
test:
  stage: test
  isolation: microvm
  restore: deps
  parallel:
    matrix:
      - BRANCH: [a, b, c, d]
  script:
    - cat /work/deps/installed
    - echo $BRANCH > /work/deps/branch-$BRANCH
    - sleep 3
    - ls /work/deps | tr '\n' ' '; echo
"#,
    );
    assert_eq!(run.code, Some(0), "{}", run.explain());
    assert!(
        run.job_lines("deps")
            .join("\n")
            .contains("Saved the VM as snapshot deps"),
        "{}",
        run.explain()
    );
    for b in ["a", "b", "c", "d"] {
        let job = format!("test: [{b}]");
        let lines = run.job_lines(&job).join("\n");
        assert!(
            lines.contains("Restoring a microvm VM from snapshot deps"),
            "{job}: {lines}"
        );
        assert!(lines.contains("libfoo 1.2"), "{job}: {lines}");
        let listing = lines
            .lines()
            .find(|l| l.starts_with("branch-") || l.contains(" branch-"))
            .unwrap_or_default()
            .to_string();
        assert!(listing.contains(&format!("branch-{b}")), "{job}: {lines}");
        for other in ["a", "b", "c", "d"].iter().filter(|o| **o != b) {
            assert!(
                !listing.contains(&format!("branch-{other}")),
                "{job} sees branch {other}: {lines}"
            );
        }
    }
    assert!(nest.qemus().is_empty(), "VMs left: {:?}", nest.qemus());
}

#[test]
fn a_hung_vm_is_killed_at_the_job_timeout_and_leaves_no_qemu() {
    hung_vm_killed_at_timeout(false);
}

#[test]
fn a_hung_vm_is_killed_at_the_job_timeout_through_the_nesting_executor_plugin() {
    hung_vm_killed_at_timeout(true);
}

fn hung_vm_killed_at_timeout(plugin: bool) {
    let (w, nest, cfg) = vm_world_by(plugin);
    let child = spawn_exec(
        &w,
        &cfg,
        r#"
hang:
  isolation: microvm
  timeout: 30s
  script:
    - echo started
    - sleep 600
"#,
    );
    // Freeze the guest's vCPUs once its agent runs: from then on nothing inside answers.
    let qmp = nest.wait_for_guest().join("qmp.sock");
    std::thread::sleep(Duration::from_secs(3));
    {
        use std::io::{BufRead as _, BufReader, Write as _};
        let mut s = std::os::unix::net::UnixStream::connect(&qmp).unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        s.write_all(b"{\"execute\":\"qmp_capabilities\"}\n{\"execute\":\"stop\"}\n")
            .unwrap();
        // Two replies (capabilities, stop), with events such as STOP in between.
        let mut returns = 0;
        for _ in 0..10 {
            line.clear();
            r.read_line(&mut line).unwrap();
            returns += usize::from(line.contains("\"return\""));
            if returns == 2 {
                break;
            }
        }
        assert_eq!(returns, 2, "stop: {line}");
    }
    let run = common::Run::from(wait_with_timeout(child, Duration::from_secs(240)));
    assert_eq!(run.code, Some(1), "{}", run.explain());
    assert_eq!(status(&run, "hang"), "failed");
    let lines = run.job_lines("hang").join("\n");
    assert!(lines.contains("job execution timeout"), "{lines}");
    assert!(
        nest.qemus().is_empty(),
        "qemu left after the timeout: {:?}",
        nest.qemus()
    );
}

#[test]
fn a_killed_daemon_restarted_lists_its_vms_and_cleans_them_later() {
    let w = World::new();
    let mut nest = Nest::start(&w, &images());
    let init = w.write(
        "nesting.json",
        &format!(
            r#"{{"accel":"tcg","images_dir":"{}"}}"#,
            nest.images.display()
        ),
    );
    let r = nest.cli(&w, &["init", init.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let a = nest.cli(&w, &["create", MICROVM_IMAGE, "--slot", "0"]);
    assert_eq!(a.code, Some(0), "{}", a.explain());
    let b = nest.cli(&w, &["create", MICROVM_IMAGE, "--slot", "1"]);
    assert_eq!(b.code, Some(0), "{}", b.explain());
    let id = |r: &common::Run| {
        r.stdout
            .lines()
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    let (a_id, b_id) = (id(&a), id(&b));
    assert_eq!(nest.qemus().len(), 2);

    nest.kill();
    assert_eq!(nest.qemus().len(), 2, "VMs outlive their daemon");
    // One VM dies while the daemon is down.
    let b_qemu = nest
        .qemus()
        .into_iter()
        .find(|p| p.contains(&b_id))
        .unwrap();
    let pid: u32 = b_qemu.split_whitespace().next().unwrap().parse().unwrap();
    Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || nest.qemus().len() == 1));

    nest.spawn(&w);
    let list = nest.cli(&w, &["list"]);
    assert!(list.stdout.contains(&a_id), "{}", list.explain());
    assert!(!list.stdout.contains(&b_id), "{}", list.explain());
    assert!(
        !nest.state.join("vms").join(&b_id).exists(),
        "the dead VM's files are removed"
    );

    // The restarted daemon is uninitialised: GitLab's client initialises on demand; here by hand.
    let r = nest.cli(&w, &["init", init.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let c = nest.cli(&w, &["create", MICROVM_IMAGE, "--slot", "0"]);
    assert_eq!(c.code, Some(0), "{}", c.explain());
    assert!(
        c.stderr.contains(&format!("stomped VM {a_id}")),
        "{}",
        c.explain()
    );
    let r = nest.cli(&w, &["shutdown"]);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(nest.qemus().is_empty(), "{:?}", nest.qemus());
}

#[test]
fn a_canceled_job_deletes_its_vm() {
    canceled_job_deletes_its_vm(false);
}

#[test]
fn a_canceled_job_deletes_its_vm_through_the_nesting_executor_plugin() {
    canceled_job_deletes_its_vm(true);
}

fn canceled_job_deletes_its_vm(plugin: bool) {
    let (w, nest, cfg) = vm_world_by(plugin);
    let child = spawn_exec(
        &w,
        &cfg,
        r#"
long:
  isolation: microvm
  snapshot: on_failure
  script:
    - echo started
    - sleep 600
"#,
    );
    nest.wait_for_guest();
    std::thread::sleep(Duration::from_secs(3));
    common::signal(child.id(), "TERM");
    let run = common::Run::from(wait_with_timeout(child, Duration::from_secs(120)));
    assert!(
        nest.qemus().is_empty(),
        "VM left after the cancel: {:?}\n{}",
        nest.qemus(),
        run.explain()
    );
    // A canceled job is not a failure to keep.
    let snaps = nest.cli(&w, &["snapshots"]);
    assert_empty_table(&snaps);
}

#[test]
fn a_job_canceled_while_its_vm_boots_leaves_no_vm_and_a_usable_slot() {
    let (w, nest, cfg) = vm_world();
    let child = spawn_exec(
        &w,
        &cfg,
        "boot:\n  isolation: vm\n  script:\n    - echo never seen\n",
    );
    // Cancel as soon as the daemon has started the VM's process, long before its agent answers.
    let vms = nest.state.join("vms");
    assert!(wait_until(Duration::from_secs(120), || {
        std::fs::read_dir(&vms)
            .is_ok_and(|rd| rd.flatten().any(|e| e.path().join("qmp.sock").exists()))
    }));
    common::signal(child.id(), "TERM");
    let run = common::Run::from(wait_with_timeout(child, Duration::from_secs(180)));
    assert!(!run.stdout.contains("never seen"), "{}", run.explain());
    assert!(
        wait_until(Duration::from_secs(15), || nest.qemus().is_empty()),
        "VM left after a cancel during boot: {:?}\n{}",
        nest.qemus(),
        run.explain()
    );
    // The slot is not left marked busy: the next job gets a VM in it.
    let again = exec(
        &w,
        &cfg,
        "next:\n  isolation: microvm\n  script:\n    - echo fine\n",
    );
    assert_eq!(again.code, Some(0), "{}", again.explain());
    assert!(nest.qemus().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitlab_jobs_run_in_vms_and_a_cancel_from_gitlab_removes_the_vm() {
    use slipway_testkit::gitlab::{FakeGitlab, job_payload_with_vars};
    let w = World::new();
    let nest = Nest::start(&w, &images());
    let gl = FakeGitlab::start().await;
    let source = format!(
        "url = \"{}\"\n  token = \"{}\"",
        gl.url(),
        gl.runner_token()
    );
    let cfg = config_with(&w, &nest, &source);
    // The status page's JSON follows the jobs and the snapshot they leave.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap();
    let text = std::fs::read_to_string(&cfg).unwrap().replacen(
        "\n[[runners]]",
        "\nlisten_address = \"127.0.0.1:PORT\"\n[status_page]\n  history_interval = \"1s\"\n[[runners]]",
        1,
    );
    std::fs::write(&cfg, text.replace("PORT", &port.to_string())).unwrap();
    let vars = [("GIT_STRATEGY", "none"), ("SLIPWAY_ISOLATION", "microvm")];
    let ok = gl.enqueue(job_payload_with_vars(
        "in-a-vm",
        &["echo guest $(uname -r)"],
        &vars,
    ));
    let saved = gl.enqueue(job_payload_with_vars(
        "saves-a-snapshot",
        &["echo kept > /tmp/kept"],
        &[
            ("GIT_STRATEGY", "none"),
            ("SLIPWAY_ISOLATION", "microvm"),
            ("SLIPWAY_SNAPSHOT_SAVE", "kept-by-status"),
        ],
    ));
    let long = gl.enqueue(job_payload_with_vars(
        "canceled-in-a-vm",
        &["echo started-in-vm", "sleep 600"],
        &vars,
    ));
    let child = w
        .slipway(&["run", "-c", cfg.to_str().unwrap()])
        .spawn()
        .unwrap();
    let done = gl
        .wait_for_state(ok, "success", Duration::from_secs(240))
        .await;
    let trace = gl.job(ok).map(|j| j.trace_text()).unwrap_or_default();
    assert!(done.is_some(), "{trace}");
    assert!(
        trace.contains("Creating a microvm VM from image test-microvm"),
        "{trace}"
    );
    assert!(
        trace.contains("guest 6.1.0") && trace.contains("cloud-amd64"),
        "{trace}"
    );

    assert!(wait_until(Duration::from_secs(180), || {
        gl.job(long)
            .is_some_and(|j| j.trace_text().contains("started-in-vm"))
    }));
    assert!(
        gl.wait_for_state(saved, "success", Duration::from_secs(240))
            .await
            .is_some(),
        "{:?}",
        gl.job(saved).map(|j| j.trace_text())
    );
    // What /api/v1/status shows of GitLab's jobs: the finished ones with their level, the
    // running one on its slot, and the snapshot on its instance with its size.
    let mut seen = None;
    let shown = wait_until(Duration::from_secs(60), || {
        let s = status_json(port);
        let r = &s["runners"][0];
        let on_slot = r["shapes"][0]["instances"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|i| i["slots"].as_array().cloned().unwrap_or_default())
            .any(|sl| sl["job"]["name"] == "canceled-in-a-vm" && sl["job"]["level"] == "microvm");
        let ended =
            |name: &str| {
                r["recent"].as_array().into_iter().flatten().any(|j| {
                    j["name"] == name && j["outcome"] == "success" && j["level"] == "microvm"
                })
            };
        let snapshot = r["shapes"][0]["instances"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|i| i["snapshots"].as_array().cloned().unwrap_or_default())
            .any(|sn| sn["name"] == "kept-by-status" && sn["bytes"].as_u64() > Some(0));
        let done = on_slot && ended("in-a-vm") && ended("saves-a-snapshot") && snapshot;
        seen = Some(s);
        done
    });
    assert!(shown, "{}", seen.unwrap_or_default());
    // Three VMs started for their jobs, none warm: under emulation warm slots stay off unless
    // config.toml sets `warm = true`.
    let starts = &status_json(port)["runners"][0]["vm_starts"];
    assert_eq!(
        *starts,
        serde_json::json!([{"image": "test-microvm", "warm": 0, "cold": 3}]),
        "{starts}"
    );
    let metrics = common::http_body(port, "/metrics");
    assert!(
        metrics.contains(
            r#"slipway_vm_starts_total{runner="vms",image="test-microvm",start="cold"} 3"#
        ),
        "{metrics}"
    );
    gl.cancel(long, true);
    let canceled = gl
        .wait_for_state(long, "canceled", Duration::from_secs(120))
        .await;
    assert!(
        canceled.is_some(),
        "{:?}",
        gl.job(long).map(|j| j.trace_text())
    );
    assert!(
        wait_until(Duration::from_secs(30), || nest.qemus().is_empty()),
        "VM left after GitLab's cancel: {:?}",
        nest.qemus()
    );
    assert!(
        wait_until(Duration::from_secs(30), || {
            status_json(port)["runners"][0]["recent"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|j| j["name"] == "canceled-in-a-vm" && j["outcome"] == "canceled")
        }),
        "{}",
        status_json(port)
    );
    // The manager stops cleanly; the daemon (this world's, outliving it) keeps no VM.
    common::signal(child.id(), "TERM");
    let out = wait_with_timeout(child, Duration::from_secs(60));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(nest.qemus().is_empty(), "{:?}", nest.qemus());
}

/// `GET /api/v1/status` of a manager on `port`, as JSON (`null` until it answers).
fn status_json(port: u16) -> serde_json::Value {
    serde_json::from_str(&common::http_body(port, "/api/v1/status")).unwrap_or_default()
}

/// The nesting executor plugin SIGKILLed while its job runs in a VM: that job fails as a
/// system failure, the restarted plugin runs the next job, and no VM is left.
#[test]
fn a_nesting_plugin_killed_mid_job_fails_that_job_and_the_next_runs_on_the_restarted_plugin() {
    let (w, nest, cfg) = vm_world_by(true);
    let child = spawn_exec(
        &w,
        &cfg,
        r#"
stages: [one, two]
victim:
  stage: one
  isolation: microvm
  allow_failure: true
  script:
    - echo started
    - sleep 600
after:
  stage: two
  isolation: microvm
  script:
    - echo "ran after the crash"
"#,
    );
    nest.wait_for_guest();
    std::thread::sleep(Duration::from_secs(3));
    // This run's plugin: it inherited the run's TMPDIR.
    let tmp = format!("TMPDIR={}", w.tmp().display());
    let ours = || -> Vec<u32> {
        common::processes_matching("executor-plugin-nesting")
            .into_iter()
            .filter_map(|p| p.split_whitespace().next()?.parse().ok())
            .filter(|&pid| common::environ_of(pid).lines().any(|l| l == tmp))
            .collect()
    };
    let victims = ours();
    assert_eq!(victims.len(), 1, "{victims:?}");
    common::signal(victims[0], "KILL");
    let run = common::Run::from(wait_with_timeout(child, Duration::from_secs(600)));
    assert_eq!(run.code, Some(0), "{}", run.explain());
    assert_eq!(status(&run, "victim"), "failed (allowed)");
    let victim = run.job_lines("victim").join("\n");
    assert!(victim.contains("system failure"), "{}", run.explain());
    assert_eq!(status(&run, "after"), "success");
    assert!(
        run.job_lines("after")
            .contains(&"ran after the crash".to_string()),
        "{}",
        run.explain()
    );
    assert!(
        wait_until(Duration::from_secs(30), || nest.qemus().is_empty()),
        "VMs left: {:?}",
        nest.qemus()
    );
    assert!(ours().is_empty(), "plugin left: {:?}", ours());
}
