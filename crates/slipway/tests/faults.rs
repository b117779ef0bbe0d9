//! Faults: a plugin that dies, a plugin that lies or hangs, and SIGTERM in the middle of a job.

// Helpers here are test fixtures: a failure should stop the test at once.
#![allow(clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::Child;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{World, environ_of, instances_of, processes_matching, signal, wait_with_timeout};

/// Spawn `slipway` and forward its stdout lines to a channel, keeping a copy.
fn spawn_streaming(w: &World, args: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut child = w.slipway(args).spawn().expect("spawn slipway");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// `slipway exec -c cfg file`, its stdout lines forwarded as [`spawn_streaming`] does.
fn spawn_exec(
    w: &World,
    cfg: &std::path::Path,
    file: &std::path::Path,
) -> (Child, mpsc::Receiver<String>) {
    let (cfg, file) = (cfg.to_str().expect("c"), file.to_str().expect("p"));
    spawn_streaming(w, &["exec", "-c", cfg, file])
}

/// `slipway exec -c cfg file` until its job `doomed` printed `started`: the process, its
/// output, the lines seen so far and the instance the job runs on.
fn start_doomed(
    w: &World,
    cfg: &std::path::Path,
    file: &std::path::Path,
) -> (Child, mpsc::Receiver<String>, Vec<String>, String) {
    let (child, rx) = spawn_exec(w, cfg, file);
    let mut seen = Vec::new();
    wait_for_line(&rx, &mut seen, "[doomed] started");
    let instance = instances_of(&seen, "doomed")
        .into_iter()
        .next()
        .expect("instance named");
    (child, rx, seen, instance)
}

fn wait_for_line(rx: &mpsc::Receiver<String>, seen: &mut Vec<String>, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            let hit = line.contains(needle);
            seen.push(line);
            if hit {
                return;
            }
        }
    }
    panic!("never saw {needle:?}; output so far:\n{}", seen.join("\n"));
}

/// The plugin processes this test's slipway started (they inherit its TMPDIR).
fn plugin_pids(w: &World) -> Vec<u32> {
    let tmp = format!("TMPDIR={}", w.tmp().display());
    processes_matching("fleeting-plugin-local")
        .iter()
        .filter_map(|l| l.split_whitespace().next()?.parse::<u32>().ok())
        .filter(|pid| environ_of(*pid).lines().any(|l| l == tmp))
        .collect()
}

fn config(max_use: u32) -> String {
    format!(
        r#"
concurrent = 2
[[runners]]
  name = "t"
  executor = "instance"
  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = 1
    max_instances = 2
    max_use_count = {max_use}
    update_interval = "1s"
    update_interval_when_expecting = "100ms"
    delete_instances_on_shutdown = true
"#
    )
}

#[test]
fn killed_plugin_is_restarted_and_the_pipeline_finishes() {
    let w = World::new();
    let cfg = w.write("config.toml", &config(1));
    let file = w.write(
        "p.yml",
        "stages: [one, two]\nfirst:\n  stage: one\n  script:\n    - echo started\n    - sleep 3\n    - echo first done\nsecond:\n  stage: two\n  script: [echo second done]\n",
    );
    let (mut child, rx) = spawn_exec(&w, &cfg, &file);
    let mut seen = Vec::new();
    wait_for_line(&rx, &mut seen, "[first] started");
    let before = plugin_pids(&w);
    assert_eq!(before.len(), 1, "one plugin process: {before:?}");
    signal(before[0], "KILL");

    // `second` needs a new instance (max_use_count = 1): only a restarted plugin can make it.
    let out = wait_with_timeout_reading(&mut child, rx, &mut seen);
    assert_eq!(
        out.0,
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        seen.join("\n"),
        out.1
    );
    assert!(
        seen.iter().any(|l| l == "[first] first done"),
        "{}",
        seen.join("\n")
    );
    assert!(
        seen.iter().any(|l| l == "[second] second done"),
        "{}",
        seen.join("\n")
    );
    assert!(
        out.1.to_lowercase().contains("restart"),
        "restart not logged:\n{}",
        out.1
    );
    assert!(
        w.processes().is_empty(),
        "left running: {:?}",
        w.processes()
    );
}

fn wait_with_timeout_reading(
    child: &mut Child,
    rx: mpsc::Receiver<String>,
    seen: &mut Vec<String>,
) -> (Option<i32>, String) {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        while let Ok(line) = rx.try_recv() {
            seen.push(line);
        }
        if let Ok(Some(status)) = child.try_wait() {
            // Drain what is left.
            while let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
                seen.push(line);
            }
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            return (status.code(), err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("slipway did not finish; output:\n{}", seen.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn fake_plugin(w: &World, name: &str, body: &str) -> String {
    let path = w.path().join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write plugin");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path.display().to_string()
}

fn config_with_plugin(plugin: &str) -> String {
    format!(
        "[[runners]]\n  name = \"t\"\n  executor = \"instance\"\n  [runners.autoscaler]\n    plugin = \"{plugin}\"\n"
    )
}

#[test]
fn garbage_handshake_is_a_clear_error_naming_the_plugin() {
    let w = World::new();
    let plugin = fake_plugin(
        &w,
        "fleeting-plugin-liar",
        "echo 'hello, I am definitely a plugin'\nexec sleep 300",
    );
    let cfg = w.write("config.toml", &config_with_plugin(&plugin));
    let file = w.write("p.yml", "job:\n  script: [echo hi]\n");
    let started = Instant::now();
    let run = w.run(&[
        "exec",
        "-c",
        cfg.to_str().expect("c"),
        file.to_str().expect("p"),
    ]);
    assert_eq!(run.code, Some(2), "{}", run.explain());
    assert!(
        run.stderr.contains("liar"),
        "plugin not named: {}",
        run.explain()
    );
    assert!(run.stderr.contains("handshake"), "{}", run.explain());
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        w.processes().is_empty(),
        "plugin left running: {:?}",
        w.processes()
    );
}

#[test]
fn silent_plugin_times_out_with_a_clear_error() {
    let w = World::new();
    let plugin = fake_plugin(&w, "fleeting-plugin-mute", "exec sleep 300");
    let cfg = w.write("config.toml", &config_with_plugin(&plugin));
    let file = w.write("p.yml", "job:\n  script: [echo hi]\n");
    let mut cmd = w.slipway(&[
        "exec",
        "-c",
        cfg.to_str().expect("c"),
        file.to_str().expect("p"),
    ]);
    cmd.env("SLIPWAY_PLUGIN_START_TIMEOUT", "2s");
    let run = common::Run::from(wait_with_timeout(
        cmd.spawn().expect("spawn"),
        Duration::from_secs(60),
    ));
    assert_eq!(run.code, Some(2), "{}", run.explain());
    assert!(
        run.stderr.contains("mute"),
        "plugin not named: {}",
        run.explain()
    );
    assert!(
        run.stderr.contains("2s"),
        "timeout not named: {}",
        run.explain()
    );
    assert!(
        w.processes().is_empty(),
        "plugin left running: {:?}",
        w.processes()
    );
}

#[test]
fn sigterm_leaves_no_instance_plugin_or_temporary_file() {
    let w = World::new();
    // The job's long sleep runs from a copy under the instance's $HOME, so it is findable by path.
    let file = w.write(
        "p.yml",
        "stuck:\n  script:\n    - cp \"$(command -v sleep)\" \"$HOME/slw-sleeper\"\n    - echo sleeping\n    - \"\\\"$HOME/slw-sleeper\\\" 300\"\n",
    );
    let (mut child, rx) = spawn_streaming(&w, &["exec", file.to_str().expect("p")]);
    let mut seen = Vec::new();
    wait_for_line(&rx, &mut seen, "[stuck] sleeping");
    assert!(!w.processes().is_empty(), "instances should be running now");
    assert!(!plugin_pids(&w).is_empty(), "plugin should be running now");

    signal(child.id(), "TERM");
    let sent = Instant::now();
    let (code, stderr) = wait_with_timeout_reading(&mut child, rx, &mut seen);
    let took = sent.elapsed();
    assert!(took < Duration::from_secs(10), "exit took {took:?}");
    assert_ne!(code, Some(0), "an interrupted pipeline is not a success");
    assert!(
        w.processes().is_empty(),
        "left running: {:?}\n{stderr}",
        w.processes()
    );
    assert!(plugin_pids(&w).is_empty(), "plugin left running");
    // Namespaced instances (as root) must take their network namespace with them.
    let instances = instances_of(&seen, "stuck");
    assert!(!instances.is_empty(), "{}", seen.join("\n"));
    let netns = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for id in &instances {
        let short = id.rsplit('-').next().unwrap_or(id);
        assert!(
            !netns.contains(&format!("slw-{short}")),
            "namespace of {id} left: {netns}"
        );
    }
    assert!(
        w.leftovers().is_empty(),
        "left in TMPDIR: {:?}",
        w.leftovers()
    );
    assert!(
        seen.iter()
            .any(|l| l.starts_with("stuck") && l.contains("canceled")),
        "{}",
        seen.join("\n")
    );
}

#[test]
fn an_instance_that_vanishes_fails_its_job_as_a_system_failure_quickly() {
    let w = World::new();
    let cfg = w.write("config.toml", &config(0));
    let file = w.write(
        "p.yml",
        "doomed:\n  script:\n    - echo started\n    - sleep 120\n",
    );
    let (mut child, rx, mut seen, instance) = start_doomed(&w, &cfg, &file);
    // The cloud deletes the instance behind the runner's back: every process of it dies.
    let killed = Instant::now();
    let st = std::process::Command::new("pkill")
        .args(["-KILL", "-f", &format!("instances/{instance}/")])
        .status()
        .expect("pkill");
    assert!(st.success(), "no process of {instance} found");
    let (code, stderr) = wait_with_timeout_reading(&mut child, rx, &mut seen);
    let failed_at = seen
        .iter()
        .position(|l| l.starts_with("[doomed] Job failed"))
        .expect("job failure reported");
    assert!(
        seen[failed_at].contains("runner_system_failure"),
        "{}\n{stderr}",
        seen.join("\n")
    );
    assert!(
        killed.elapsed() < Duration::from_secs(30),
        "took {:?}",
        killed.elapsed()
    );
    assert_eq!(code, Some(1), "{}\n{stderr}", seen.join("\n"));
    assert!(
        w.processes().is_empty(),
        "left running: {:?}",
        w.processes()
    );
}

/// The soak's `instance_sshd_killed` fault under a running job: the plugin then reports the
/// instance failed, the taskscaler removes it, and the plugin's deletion SIGTERMs the job's
/// shell. The runner sent no signal and the script did not kill itself: the job is the
/// instance's failure, never the script's. On the loopback network the job's own SSH session
/// survives the deletion's TERM (it is no longer a child of the killed listener), so the
/// shell's death arrives as a clean `exit-signal TERM`, the race the soak hit once.
#[test]
fn a_job_whose_instance_is_removed_under_it_is_a_system_failure_not_the_scripts() {
    let w = World::new();
    let cfg = w.write(
        "config.toml",
        &format!(
            "{}    [runners.autoscaler.plugin_config]\n      network = \"loopback\"\n",
            config(0)
        ),
    );
    let file = w.write(
        "p.yml",
        "doomed:\n  script:\n    - echo started\n    - sleep 120\n    - echo finished\n",
    );
    let (mut child, rx, mut seen, instance) = start_doomed(&w, &cfg, &file);
    // SIGKILL the instance's sshd listener (its pid file sits beside its sshd_config).
    let listener: u32 = w
        .processes()
        .iter()
        .filter(|p| p.contains("sshd") && p.contains(&format!("instances/{instance}/")))
        .find_map(|p| {
            let cfg = p.split_whitespace().skip_while(|a| *a != "-f").nth(1)?;
            let pid = std::path::Path::new(cfg).with_file_name("sshd.pid");
            std::fs::read_to_string(pid).ok()?.trim().parse().ok()
        })
        .expect("sshd listener of the instance");
    signal(listener, "KILL");
    let (code, stderr) = wait_with_timeout_reading(&mut child, rx, &mut seen);
    let failed = seen
        .iter()
        .find(|l| l.starts_with("[doomed] Job failed"))
        .unwrap_or_else(|| panic!("job failure reported:\n{}\n{stderr}", seen.join("\n")));
    assert!(
        failed.contains("runner_system_failure"),
        "{}\n{stderr}",
        seen.join("\n")
    );
    assert!(
        seen.iter()
            .any(|l| l.contains(&format!("instance {instance} was removed under the job"))),
        "{}\n{stderr}",
        seen.join("\n")
    );
    // Its script had started: it is not run a second time.
    assert!(
        !seen.iter().any(|l| l.contains("trying it again")),
        "{}",
        seen.join("\n")
    );
    assert_eq!(code, Some(1), "{}\n{stderr}", seen.join("\n"));
}

/// Every process of local instance `instance` (its sshd listener and sessions) SIGKILLed:
/// the cloud deleting it behind the runner's back.
fn kill_instance(instance: &str) {
    let st = std::process::Command::new("pkill")
        .args(["-KILL", "-f", &format!("instances/{instance}/")])
        .status()
        .expect("pkill");
    assert!(st.success(), "no process of {instance} found");
}

/// A runner whose jobs first run `pre_get_sources_script` where they run: on the first try
/// only it says `hook-waits` and sleeps, a window before the job's script in which the test
/// kills the instance.
fn config_with_hook(w: &World) -> String {
    let marker = w.path().join("hooked");
    config(0).replacen(
        "  executor = \"instance\"\n",
        &format!(
            "  executor = \"instance\"\n  pre_get_sources_script = \"\"\"\nif [ ! -e {m} ]; then touch {m}; echo hook-waits; sleep 30; fi\n\"\"\"\n  post_get_sources_script = \"echo sources-in-place\"\n",
            m = marker.display()
        ),
        1,
    )
}

#[test]
fn a_job_whose_instance_dies_before_its_script_runs_again_on_another_instance() {
    let w = World::new();
    let cfg = w.write("config.toml", &config_with_hook(&w));
    let file = w.write(
        "p.yml",
        "doomed:\n  script:\n    - echo started\n    - echo ran to the end\n",
    );
    let (mut child, rx) = spawn_exec(&w, &cfg, &file);
    let mut seen = Vec::new();
    wait_for_line(&rx, &mut seen, "[doomed] hook-waits");
    let first = instances_of(&seen, "doomed")
        .into_iter()
        .next()
        .expect("instance named");
    kill_instance(&first);
    let (code, stderr) = wait_with_timeout_reading(&mut child, rx, &mut seen);
    let all = seen.join("\n");
    assert_eq!(code, Some(0), "{all}\n{stderr}");
    let tries = instances_of(&seen, "doomed");
    assert_eq!(tries.len(), 2, "{all}");
    assert_ne!(tries[0], tries[1], "{all}");
    assert!(
        all.contains(
            "the job's script had not started: trying it again on another instance (attempt 2 of 3)"
        ),
        "{all}"
    );
    // The script ran once, on the second instance, to its end.
    assert_eq!(
        seen.iter().filter(|l| *l == "[doomed] started").count(),
        1,
        "{all}"
    );
    assert!(all.contains("[doomed] ran to the end"), "{all}");
    assert!(
        w.processes().is_empty(),
        "left running: {:?}",
        w.processes()
    );
}

#[test]
fn a_job_whose_instances_all_die_before_its_script_fails_as_a_system_failure() {
    let w = World::new();
    // The hook waits on every try: each instance is killed in turn.
    let cfg = config(0).replacen(
        "  executor = \"instance\"\n",
        "  executor = \"instance\"\n  pre_get_sources_script = \"echo hook-waits; sleep 30\"\n",
        1,
    );
    let cfg = w.write(
        "config.toml",
        &cfg.replacen(
            "[runners.autoscaler]\n",
            "[runners.autoscaler]\n    start_attempts = 2\n",
            1,
        ),
    );
    let file = w.write("p.yml", "doomed:\n  script:\n    - echo started\n");
    let (mut child, rx) = spawn_exec(&w, &cfg, &file);
    let mut seen = Vec::new();
    for attempt in 1..=2 {
        // Each try's instance, once its hook is waiting.
        let deadline = Instant::now() + Duration::from_secs(120);
        while seen.iter().filter(|l| *l == "[doomed] hook-waits").count() < attempt {
            assert!(Instant::now() < deadline, "{}", seen.join("\n"));
            if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
                seen.push(line);
            }
        }
        let instance = instances_of(&seen, "doomed").pop().expect("instance named");
        kill_instance(&instance);
    }
    let (code, stderr) = wait_with_timeout_reading(&mut child, rx, &mut seen);
    let all = seen.join("\n");
    assert_eq!(code, Some(1), "{all}\n{stderr}");
    let failed = seen
        .iter()
        .find(|l| l.starts_with("[doomed] Job failed"))
        .unwrap_or_else(|| panic!("job failure reported:\n{all}\n{stderr}"));
    assert!(failed.contains("runner_system_failure"), "{all}");
    assert!(
        all.contains(
            "failed before its script started on 2 instance(s) in a row (start_attempts = 2)"
        ),
        "{all}"
    );
    assert!(!all.contains("[doomed] started"), "{all}");
    assert!(
        w.processes().is_empty(),
        "left running: {:?}",
        w.processes()
    );
}

#[test]
fn an_idle_instance_found_dead_is_never_handed_a_job() {
    let w = World::new();
    // Idle instances stay (idle_time): the second job would go to the first one's.
    let cfg = w.write(
        "config.toml",
        &format!(
            "{}    [[runners.autoscaler.policy]]\n      idle_count = 0\n      idle_time = \"5m\"\n",
            config(0)
        ),
    );
    let file = w.write(
        "p.yml",
        r#"
stages: [build, test]
first:
  stage: build
  script:
    - echo first-done
second:
  stage: test
  when: delayed
  start_in: 4 seconds
  script:
    - echo second-ran
"#,
    );
    let (mut child, rx) = spawn_exec(&w, &cfg, &file);
    let mut seen = Vec::new();
    wait_for_line(&rx, &mut seen, "[first] Job succeeded");
    let first = instances_of(&seen, "first")
        .into_iter()
        .next()
        .expect("instance named");
    // Idle now, and dead before the delayed job asks for a slot.
    kill_instance(&first);
    let (code, stderr) = wait_with_timeout_reading(&mut child, rx, &mut seen);
    let all = seen.join("\n");
    assert_eq!(code, Some(0), "{all}\n{stderr}");
    let second = instances_of(&seen, "second");
    assert_eq!(second.len(), 1, "handed one instance, at once: {all}");
    assert_ne!(second[0], first, "{all}");
    assert!(all.contains("[second] second-ran"), "{all}");
    assert!(!all.contains("trying it again"), "{all}");
    assert!(
        w.processes().is_empty(),
        "left running: {:?}",
        w.processes()
    );
}

/// The same on a static pool: two hosts (real sshd on loopback); the one the job was handed
/// dies while the job's `pre_get_sources_script` runs, and the job runs on the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_static_pool_a_job_whose_host_dies_before_its_script_runs_on_the_other() {
    let w = World::new();
    let hosts = [
        slipway_testkit::Sshd::start().await.expect("sshd"),
        slipway_testkit::Sshd::start().await.expect("sshd"),
    ];
    let user = hosts[0].info().expect("info").connector.username;
    let marker = w.path().join("hooked");
    let mut text = format!(
        r#"
concurrent = 2
[[runners]]
  name = "pool"
  executor = "instance"
  builds_dir = "{builds}"
  pre_get_sources_script = """
if [ ! -e {m} ]; then touch {m}; echo hook-waits; sleep 30; fi
"""
  [runners.autoscaler]
    plugin = "static"
    capacity_per_instance = 1
    max_instances = 2
    update_interval = "1s"
    update_interval_when_expecting = "100ms"
    [runners.autoscaler.plugin_config]
      state_dir = "{state}"
"#,
        builds = w.path().join("builds").display(),
        m = marker.display(),
        state = w.path().join("static-state").display(),
    );
    text.push_str(&slipway_testkit::Sshd::static_hosts(&hosts, &user));
    let cfg = w.write("config.toml", &text);
    let file = w.write(
        "p.yml",
        "doomed:\n  script:\n    - echo started\n    - echo ran to the end\n",
    );
    let (mut child, rx) = spawn_exec(&w, &cfg, &file);
    let (code, seen, stderr) = tokio::task::spawn_blocking(move || {
        let mut seen = Vec::new();
        wait_for_line(&rx, &mut seen, "[doomed] hook-waits");
        let first = instances_of(&seen, "doomed")
            .into_iter()
            .next()
            .expect("instance named");
        // `web<N>-<lease>`.
        let index: usize = first
            .strip_prefix("web")
            .and_then(|r| r.split('-').next()?.parse().ok())
            .unwrap_or_else(|| panic!("a static host's name: {first}"));
        hosts[index].kill();
        let (code, stderr) = wait_with_timeout_reading(&mut child, rx, &mut seen);
        (code, seen, stderr)
    })
    .await
    .expect("the test's thread");
    let all = seen.join("\n");
    assert_eq!(code, Some(0), "{all}\n{stderr}");
    let tries = instances_of(&seen, "doomed");
    assert_eq!(tries.len(), 2, "{all}");
    assert_ne!(tries[0], tries[1], "{all}");
    assert!(
        all.contains("trying it again on another instance (attempt 2 of 3)"),
        "{all}"
    );
    assert_eq!(
        seen.iter().filter(|l| *l == "[doomed] started").count(),
        1,
        "{all}"
    );
    assert!(all.contains("[doomed] ran to the end"), "{all}");
}

/// EC2's instance metadata, as far as spot interruptions go: `GET
/// /latest/meta-data/spot/instance-action` answers 404 until [`Metadata::interrupt`], then
/// the notice's JSON. On loopback, where the local plugin's instances (this machine) reach it.
struct Metadata {
    port: u16,
    notice: std::sync::Arc<std::sync::Mutex<Option<String>>>,
}

impl Metadata {
    fn start() -> Metadata {
        use std::io::{Read as _, Write as _};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let notice = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
        let shared = notice.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut buf = [0u8; 2048];
                let n = conn.read(&mut buf).unwrap_or(0);
                let request = String::from_utf8_lossy(&buf[..n]);
                let body = shared.lock().expect("notice").clone();
                let answer = match body {
                    Some(b)
                        if request.starts_with("GET /latest/meta-data/spot/instance-action ") =>
                    {
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
                            b.len()
                        )
                    }
                    _ => "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        .to_string(),
                };
                let _ = conn.write_all(answer.as_bytes());
            }
        });
        Metadata { port, notice }
    }

    /// From now on the instance is to be terminated `in_s` seconds from now.
    fn interrupt(&self, in_s: u64) {
        let at = std::time::SystemTime::now() + Duration::from_secs(in_s);
        let time = humantime::format_rfc3339_seconds(at);
        *self.notice.lock().expect("notice") =
            Some(format!(r#"{{"action": "terminate", "time": "{time}"}}"#));
    }
}

#[test]
fn a_preempted_instance_takes_no_new_job_and_its_unfinished_job_is_a_system_failure() {
    let w = World::new();
    let metadata = Metadata::start();
    // Two slots per instance: the later job would fit beside the victim if the notice let it.
    // The instances share this machine's network, where the metadata stub listens.
    let cfg = w.write(
        "config.toml",
        &format!(
            "{}    preemption_check_command = \"curl -sf http://127.0.0.1:{}/latest/meta-data/spot/instance-action\"\n    preemption_check_interval = \"500ms\"\n    [runners.autoscaler.plugin_config]\n      network = \"loopback\"\n    [[runners.autoscaler.policy]]\n      idle_count = 0\n      idle_time = \"5m\"\n",
            config(0).replace("capacity_per_instance = 1", "capacity_per_instance = 2"),
            metadata.port
        ),
    );
    let file = w.write(
        "p.yml",
        r#"
victim:
  script:
    - echo started
    - sleep 120
later:
  when: delayed
  start_in: 4 seconds
  script:
    - echo later-ran
"#,
    );
    let (mut child, rx) = spawn_exec(&w, &cfg, &file);
    let mut seen = Vec::new();
    wait_for_line(&rx, &mut seen, "[victim] started");
    let victim_on = instances_of(&seen, "victim")
        .into_iter()
        .next()
        .expect("instance named");
    let noticed = Instant::now();
    metadata.interrupt(8);
    let (code, stderr) = wait_with_timeout_reading(&mut child, rx, &mut seen);
    let all = seen.join("\n");
    assert_eq!(code, Some(1), "{all}\n{stderr}");
    // The job still running when the notice ran out: the instance's failure, not the script's.
    let failed = seen
        .iter()
        .find(|l| l.starts_with("[victim] Job failed"))
        .unwrap_or_else(|| panic!("victim's failure reported:\n{all}\n{stderr}"));
    assert!(failed.contains("runner_system_failure"), "{all}");
    assert!(
        all.contains(&format!(
            "instance {victim_on} was preempted by its cloud and removed under the job"
        )),
        "{all}"
    );
    // It got the notice's time, not less (the check runs every 500 ms).
    assert!(
        noticed.elapsed() >= Duration::from_secs(6),
        "{:?}",
        noticed.elapsed()
    );
    // No new job went to the preempted instance, though it had a free slot.
    let later = instances_of(&seen, "later");
    assert_eq!(later.len(), 1, "{all}");
    assert_ne!(later[0], victim_on, "{all}");
    assert!(all.contains("[later] later-ran"), "{all}");
    assert!(
        w.processes().is_empty(),
        "left running: {:?}",
        w.processes()
    );
}
