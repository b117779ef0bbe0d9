//! The docker and docker-autoscaler executors against the real Docker Engine (started by
//! `scripts/docker-engine.sh`) with the local `slipway-busybox` image: services by alias,
//! failure reasons, timeout/cancel/failed-start cleanup, isolation between jobs and from the
//! host's socket, masking, and the engine reached through `docker system dial-stdio` over a
//! real sshd.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use slipway_connector::{Client, DialOptions, HostKeyStore};
use slipway_docker::{Docker, ExecSpec, Transport};
use slipway_executor::docker::{LABEL_RUNNER, LABEL_SLOT_NETWORK, service_aliases};
use slipway_executor::{DockerConfig, DockerExecutor, JobSlot, PullPolicy};
use slipway_job::JobResponse;
use slipway_job::model::Image;
use slipway_job::{FailureReason, JobOutcome, Trace};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const IMAGE: &str = "slipway-busybox:latest";

// ---------------------------------------------------------------------------------------------
// Fixtures

/// Makes sure the engine runs and the test image exists (once per test process).
fn ensure_engine() {
    slipway_testkit::ensure_docker_engine().expect("Docker Engine");
}

async fn docker() -> Docker {
    ensure_engine();
    Docker::connect(Transport::unix("/var/run/docker.sock"))
        .await
        .unwrap()
}

static N: AtomicU64 = AtomicU64::new(0);

/// `slipway-test-<what>-<pid>-<n>`.
fn unique(what: &str) -> String {
    format!(
        "slipway-test-{what}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A job id unique to this process and call.
fn job_id() -> u64 {
    u64::from(std::process::id()) * 1000 + N.fetch_add(1, Ordering::Relaxed)
}

/// Removes everything a runner's jobs left (by the runner label) and the test's cgroup parent
/// directories when dropped, even after a panic.
struct Guard {
    runner: String,
    cgroup: Option<String>,
}

impl Guard {
    fn new(test: &str) -> Guard {
        Guard {
            runner: unique(test),
            cgroup: None,
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let label = format!("{LABEL_RUNNER}={}", self.runner);
        // Our own runtime on our own thread: Drop cannot await, and may run inside a runtime.
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let docker = Docker::connect_local().await?;
                docker.cleanup_by_label(&label).await
            })
        })
        .join();
        if let Ok(Err(e)) = done {
            eprintln!("cleanup failed: {e}");
        }
        if let Some(cg) = &self.cgroup {
            // The engine creates the parent in every v1 hierarchy and leaves it: remove the
            // (now empty) directories, deepest first.
            let top = cg.trim_start_matches('/').split('/').next().unwrap_or("");
            if top.is_empty() {
                return;
            }
            if let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") {
                for h in entries.flatten() {
                    remove_tree(&h.path().join(top));
                }
            }
        }
    }
}

fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

fn config() -> DockerConfig {
    DockerConfig {
        image: Some(IMAGE.into()),
        pull_policy: vec![PullPolicy::IfNotPresent],
        ..DockerConfig::default()
    }
}

async fn executor(guard: &Guard, config: DockerConfig) -> DockerExecutor {
    let mut exec = DockerExecutor::new(docker().await, config);
    exec.runner_name = guard.runner.clone();
    exec.kill_grace_secs = 2;
    exec
}

/// A busybox `httpd` service serving `$PAGE` as `/index.html`.
fn web_service(alias: &str, page: &str) -> serde_json::Value {
    serde_json::json!({
        "name": IMAGE,
        "alias": alias,
        "command": ["sh", "-c",
            "printf '%s %s\\n' \"$PAGE\" \"$GREETING\" > /var/www/index.html && exec httpd -f -p 80 -h /var/www"],
        "variables": [{"key": "PAGE", "value": page, "public": true}],
    })
}

/// `fetch HOST PATH`: an HTTP GET with busybox `nc` (its `wget` crashes in this static build).
const FETCH: &str = "fetch() { printf 'GET /%s HTTP/1.0\\r\\n\\r\\n' \"$2\" | nc -w 2 \"$1\" 80; }";

/// Retries `fetch HOST PATH` until the answer contains WANT (the service may still start).
fn fetch_until(host: &str, path: &str, want: &str) -> String {
    format!(
        "for i in $(seq 1 100); do if fetch {host} {path} > /tmp/page 2>/dev/null && grep -q {want} /tmp/page; then break; fi; sleep 0.1; done; grep {want} /tmp/page"
    )
}

fn job(
    id: u64,
    script: &[&str],
    timeout_s: u64,
    services: Vec<serde_json::Value>,
    image: Option<serde_json::Value>,
) -> JobResponse {
    let mut json = serde_json::json!({
        "id": id,
        "token": "glcbt-job-token-secret",
        "job_info": {"project_id": 42, "name": "test"},
        "runner_info": {"timeout": timeout_s},
        "variables": [
            {"key": "GREETING", "value": "hello", "public": true, "masked": false},
            {"key": "SECRET", "value": "s3cr3t-value", "public": false, "masked": true},
        ],
        "steps": [
            {"name": "script", "script": script, "timeout": timeout_s, "when": "on_success"},
        ],
        "services": services,
    });
    if let Some(image) = image {
        json["image"] = image;
    }
    JobResponse::from_json(&json.to_string()).unwrap()
}

struct Ran {
    outcome: JobOutcome,
    output: String,
}

/// Runs `job`, calling `watch` with the whole trace so far after every chunk.
async fn run_watch(
    exec: &DockerExecutor,
    job: &JobResponse,
    cancel: CancellationToken,
    cgroup_parent: Option<String>,
    mut watch: impl FnMut(&str),
) -> Ran {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let trace = Trace::new(job.masked_values(), tx);
    let run = async move {
        let mut trace = trace;
        let result = exec
            .run(
                job,
                JobSlot {
                    slot: 0,
                    cgroup: cgroup_parent,
                    trace: &mut trace,
                    cancel,
                    abort: None,
                    artifacts_in: Vec::new(),
                    scratch_dir: None,
                    max_collected: None,
                    sources: None,
                    data: None,
                },
            )
            .await;
        trace.finish();
        result
    };
    let read = async {
        let mut all = String::new();
        while let Some(chunk) = rx.recv().await {
            all.push_str(&String::from_utf8_lossy(&chunk));
            watch(&all);
        }
        all
    };
    let (result, output) = tokio::join!(run, read);
    Ran {
        outcome: result.outcome,
        output,
    }
}

async fn run(exec: &DockerExecutor, job: &JobResponse) -> Ran {
    run_watch(exec, job, CancellationToken::new(), None, |_| {}).await
}

/// Containers, networks and volumes still carrying the runner's label, but for the slots'
/// warm networks (the executor's, not a job's; see [`slot_networks`]).
async fn leftovers(docker: &Docker, runner: &str) -> (usize, usize, usize) {
    let label = format!("{LABEL_RUNNER}={runner}");
    let networks = docker.list_networks(Some(&label)).await.unwrap();
    let job_networks = networks
        .iter()
        .filter(|n| {
            !n.labels
                .as_ref()
                .is_some_and(|l| l.contains_key(LABEL_SLOT_NETWORK))
        })
        .count();
    (
        docker.list_containers(Some(&label)).await.unwrap().len(),
        job_networks,
        docker.list_volumes(Some(&label)).await.unwrap().len(),
    )
}

/// The executor's warm slot networks' ids.
async fn slot_networks(exec: &DockerExecutor) -> Vec<String> {
    let label = exec.slot_network_label();
    let nets = exec.docker().list_networks(Some(&label)).await.unwrap();
    nets.into_iter().map(|n| n.id).collect()
}

fn assert_failed(ran: &Ran, reason: FailureReason) -> (Option<i32>, String) {
    match &ran.outcome {
        JobOutcome::Failed {
            reason: r,
            exit_code,
            message,
        } if *r == reason => (*exit_code, message.clone()),
        other => panic!(
            "expected {reason}, got {other:?}\n--- trace ---\n{}",
            ran.output
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// docker executor

#[tokio::test]
async fn a_configured_service_runs_beside_the_jobs_own() {
    // `[[runners.docker.services]]`: every job gets it, as GitLab Runner starts it.
    let guard = Guard::new("cfgsvc");
    let configured: DockerConfig = toml::from_str(&format!(
        r#"
        image = "{IMAGE}"
        pull_policy = "if-not-present"
        [[services]]
          name = "{IMAGE}"
          alias = "shared"
          command = ["sh", "-c", "printf '%s\\n' \"$PAGE\" > /var/www/index.html && exec httpd -f -p 80 -h /var/www"]
          environment = ["PAGE=from-config"]
        "#
    ))
    .unwrap();
    let exec = executor(&guard, configured).await;
    let j = job(
        job_id(),
        &[
            FETCH,
            &fetch_until("shared", "index.html", "from-config"),
            &fetch_until("own", "index.html", "from-job"),
        ],
        120,
        vec![web_service("own", "from-job")],
        None,
    );
    let ran = run_watch(&exec, &j, CancellationToken::new(), None, |_| {}).await;
    assert!(
        ran.outcome.is_success(),
        "{:?}\n{}",
        ran.outcome,
        ran.output
    );
    assert!(ran.output.contains("from-config"), "{}", ran.output);
    assert!(ran.output.contains("from-job"), "{}", ran.output);
}

#[tokio::test]
async fn a_job_uses_a_service_by_its_alias_within_its_limits() {
    let mut guard = Guard::new("svc");
    let cgroup = format!("/{}/slot-0", unique("cg"));
    guard.cgroup = Some(cgroup.clone());
    let exec = executor(
        &guard,
        DockerConfig {
            memory: Some("64m".into()),
            cpus: Some("0.5".into()),
            ..config()
        },
    )
    .await;
    let by_alias = fetch_until("web", "index.html", "from-service");
    // The alias GitLab derives from the image name works too.
    let by_name = fetch_until("slipway-busybox", "index.html", "from-service");
    let j = job(
        job_id(),
        &[
            FETCH,
            &by_alias,
            &by_name,
            "echo \"mem=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes)\"",
            "echo \"quota=$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us)/$(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)\"",
            "grep memory /proc/self/cgroup",
            "echo \"pwd=$PWD\"",
        ],
        120,
        vec![web_service("web", "from-service")],
        None,
    );
    let ran = run_watch(
        &exec,
        &j,
        CancellationToken::new(),
        Some(cgroup.clone()),
        |_| {},
    )
    .await;
    assert!(
        ran.outcome.is_success(),
        "{:?}\n{}",
        ran.outcome,
        ran.output
    );
    // The page, with the job's variable passed to the service.
    assert!(ran.output.contains("from-service hello"), "{}", ran.output);
    assert!(ran.output.contains("mem=67108864"), "{}", ran.output);
    assert!(ran.output.contains("quota=50000/100000"), "{}", ran.output);
    assert!(ran.output.contains(&cgroup), "{}", ran.output);
    assert!(
        ran.output
            .contains(&format!("pwd=/builds/slot-0/job-{}", j.id)),
        "{}",
        ran.output
    );
    assert_eq!(leftovers(exec.docker(), &guard.runner).await, (0, 0, 0));
}

#[tokio::test]
async fn a_failing_script_is_a_script_failure_with_its_exit_code() {
    let guard = Guard::new("fail");
    let exec = executor(&guard, config()).await;
    let j = job(
        job_id(),
        &["echo before", "sh -c 'exit 7'", "echo never-printed"],
        60,
        vec![],
        None,
    );
    let ran = run(&exec, &j).await;
    let (code, _) = assert_failed(&ran, FailureReason::ScriptFailure);
    assert_eq!(code, Some(7), "{}", ran.output);
    assert!(ran.output.contains("before"), "{}", ran.output);
    assert!(!ran.output.contains("\nnever-printed"), "{}", ran.output);
    assert_eq!(leftovers(exec.docker(), &guard.runner).await, (0, 0, 0));
}

#[tokio::test]
async fn a_timeout_stops_the_job_and_leaves_nothing() {
    let guard = Guard::new("timeout");
    let exec = executor(&guard, config()).await;
    let j = job(
        job_id(),
        &["echo started", "sleep 300 &", "sleep 300"],
        4,
        vec![web_service("web", "x")],
        None,
    );
    let ran = run(&exec, &j).await;
    let (_, msg) = assert_failed(&ran, FailureReason::JobExecutionTimeout);
    assert!(msg.contains("timeout"), "{msg}");
    assert!(ran.output.contains("started"), "{}", ran.output);
    assert_eq!(leftovers(exec.docker(), &guard.runner).await, (0, 0, 0));
}

#[tokio::test]
async fn a_cancel_stops_the_job_and_leaves_nothing() {
    let guard = Guard::new("cancel");
    let exec = executor(&guard, config()).await;
    let j = job(
        job_id(),
        &["echo started-$((40+2))", "sleep 300"],
        600,
        vec![web_service("web", "x")],
        None,
    );
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    let ran = run_watch(&exec, &j, cancel, None, |out| {
        if out.contains("started-42") {
            trigger.cancel();
        }
    })
    .await;
    assert_failed(&ran, FailureReason::JobCanceled);
    assert_eq!(leftovers(exec.docker(), &guard.runner).await, (0, 0, 0));

    // Canceled before it starts: nothing is created, or all of it is removed.
    let cancel = CancellationToken::new();
    cancel.cancel();
    let ran = run_watch(&exec, &j, cancel, None, |_| {}).await;
    assert_failed(&ran, FailureReason::JobCanceled);
    assert_eq!(leftovers(exec.docker(), &guard.runner).await, (0, 0, 0));
}

#[tokio::test]
async fn a_missing_image_with_pull_policy_never_is_an_image_pull_failure() {
    let guard = Guard::new("pull");
    let exec = executor(
        &guard,
        DockerConfig {
            pull_policy: vec![PullPolicy::Never],
            ..config()
        },
    )
    .await;
    let missing = format!("{}:latest", unique("missing"));
    let j = job(
        job_id(),
        &["echo never"],
        60,
        vec![],
        Some(serde_json::json!({ "name": missing })),
    );
    let ran = run(&exec, &j).await;
    let (_, msg) = assert_failed(&ran, FailureReason::ImagePullFailure);
    // The engine's own message.
    assert!(msg.contains("No such image"), "{msg}");
    assert!(msg.contains(&missing), "{msg}");
    assert!(ran.output.contains("No such image"), "{}", ran.output);
    assert_eq!(leftovers(exec.docker(), &guard.runner).await, (0, 0, 0));

    // A job asking for a policy the runner does not allow fails before anything is created.
    let mut j = job(job_id(), &["echo never"], 60, vec![], None);
    j.image = Some(Image {
        pull_policy: vec!["always".into()],
        ..Image::named(IMAGE)
    });
    let ran = run(&exec, &j).await;
    assert_failed(&ran, FailureReason::RunnerConfigurationError);
}

#[tokio::test]
async fn a_failed_start_leaves_nothing() {
    let guard = Guard::new("start");
    let exec = executor(&guard, config()).await;
    // The service, network and volume exist by the time the build container fails to start.
    let j = job(
        job_id(),
        &["echo never"],
        60,
        vec![web_service("web", "x")],
        Some(serde_json::json!({ "name": IMAGE, "entrypoint": ["/nonexistent"] })),
    );
    let ran = run(&exec, &j).await;
    let (_, msg) = assert_failed(&ran, FailureReason::RunnerSystemFailure);
    assert!(msg.contains("build container"), "{msg}");
    assert_eq!(leftovers(exec.docker(), &guard.runner).await, (0, 0, 0));
}

#[tokio::test]
async fn jobs_see_neither_each_other_nor_the_host_socket() {
    let guard_a = Guard::new("iso-a");
    let guard_b = Guard::new("iso-b");
    let exec_a = executor(&guard_a, config()).await;
    let exec_b = executor(&guard_b, config()).await;
    let docker = docker().await;

    let wait_a = fetch_until("web-a", "index.html", "page-a");
    let done_a = fetch_until("web-a", "done", "finished");
    let job_a = job(
        job_id(),
        &[FETCH, &wait_a, "echo A-READY", &done_a],
        300,
        vec![web_service("web-a", "page-a")],
        None,
    );
    let a_ready = CancellationToken::new();
    let signal = a_ready.clone();
    let run_a = run_watch(&exec_a, &job_a, CancellationToken::new(), None, |out| {
        if out.contains("\nA-READY") {
            signal.cancel();
        }
    });
    let run_b = async {
        a_ready.cancelled().await;
        // A's service and build container, as the test sees them from the host.
        let label = format!("{LABEL_RUNNER}={}", guard_a.runner);
        let a = docker.list_containers(Some(&label)).await.unwrap();
        let svc = a
            .iter()
            .find(|c| {
                c.labels
                    .as_ref()
                    .unwrap()
                    .contains_key("com.slipway.service")
            })
            .unwrap();
        let build = a
            .iter()
            .find(|c| {
                !c.labels
                    .as_ref()
                    .unwrap()
                    .contains_key("com.slipway.service")
            })
            .unwrap();
        let svc_ip = docker
            .inspect_container(&svc.id)
            .await
            .unwrap()
            .network_settings
            .unwrap()
            .networks
            .unwrap()
            .into_values()
            .next()
            .unwrap()
            .ip_address;
        let build_name = build.names[0].trim_start_matches('/').to_string();
        assert!(!svc_ip.is_empty());
        let own = fetch_until("web-b", "index.html", "page-b");
        let script = [
            FETCH.to_string(),
            own,
            "if nslookup web-a >/dev/null 2>&1; then echo RESOLVED-A-ALIAS; exit 1; fi".into(),
            format!(
                "if nslookup {build_name} >/dev/null 2>&1; then echo RESOLVED-A-BUILD; exit 1; fi"
            ),
            format!("if fetch {svc_ip} index.html; then echo REACHED-A-BY-IP; exit 1; fi"),
            "if ls -l /var/run/docker.sock; then echo SOCKET-VISIBLE; exit 1; fi".into(),
            "if ls /run/docker.sock; then echo SOCKET-VISIBLE; exit 1; fi".into(),
            "echo B-ISOLATED".into(),
        ];
        let lines: Vec<&str> = script.iter().map(String::as_str).collect();
        let job_b = job(
            job_id(),
            &lines,
            120,
            vec![web_service("web-b", "page-b")],
            None,
        );
        let ran_b = run(&exec_b, &job_b).await;
        // Let A finish: its service now serves /done.
        let out = docker
            .exec_run(
                &svc.id,
                &ExecSpec::new(["sh", "-c", "echo finished > /var/www/done"]),
                None,
            )
            .await
            .unwrap();
        assert_eq!(out.exit_code, 0);
        ran_b
    };
    let (ran_a, ran_b) = tokio::join!(run_a, run_b);
    assert!(
        ran_b.outcome.is_success(),
        "{:?}\n{}",
        ran_b.outcome,
        ran_b.output
    );
    assert!(ran_b.output.contains("page-b"), "{}", ran_b.output);
    assert!(ran_b.output.contains("\nB-ISOLATED"), "{}", ran_b.output);
    assert!(
        ran_a.outcome.is_success(),
        "{:?}\n{}",
        ran_a.outcome,
        ran_a.output
    );
    assert_eq!(leftovers(&docker, &guard_a.runner).await, (0, 0, 0));
    assert_eq!(leftovers(&docker, &guard_b.runner).await, (0, 0, 0));
}

#[tokio::test]
async fn masked_variables_never_reach_the_trace() {
    let guard = Guard::new("mask");
    let exec = executor(&guard, config()).await;
    let j = job(
        job_id(),
        &[
            "echo \"plain $SECRET\"",
            "echo \"stderr $SECRET\" >&2",
            // Split across two output chunks.
            "printf 's3cr'; sleep 0.5; printf '3t-value\\n'",
            "echo \"token $CI_JOB_TOKEN glcbt-job-token-secret\"",
            "exit 3",
        ],
        60,
        vec![],
        None,
    );
    let ran = run(&exec, &j).await;
    let (code, msg) = assert_failed(&ran, FailureReason::ScriptFailure);
    assert_eq!(code, Some(3));
    assert!(!ran.output.contains("s3cr3t-value"), "{}", ran.output);
    assert!(
        !ran.output.contains("glcbt-job-token-secret"),
        "{}",
        ran.output
    );
    assert!(!msg.contains("s3cr3t-value"));
    assert!(ran.output.contains("plain [MASKED]"), "{}", ran.output);
    assert!(ran.output.contains("stderr [MASKED]"), "{}", ran.output);
    assert!(
        ran.output.matches("[MASKED]").count() >= 4,
        "{}",
        ran.output
    );
    assert_eq!(leftovers(exec.docker(), &guard.runner).await, (0, 0, 0));
}

#[test]
fn service_aliases_follow_gitlab() {
    let mut svc = Image::named("tutum/wordpress:latest");
    assert_eq!(
        service_aliases(&svc),
        ["tutum-wordpress", "tutum__wordpress"]
    );
    svc.alias = "wp".into();
    assert_eq!(
        service_aliases(&svc),
        ["wp", "tutum-wordpress", "tutum__wordpress"]
    );
}

// ---------------------------------------------------------------------------------------------
// docker-autoscaler: the engine through `docker system dial-stdio` over a real sshd

use slipway_testkit::Sshd;

/// Bounds a future so a hung tunnel fails the test instead of hanging it.
async fn bounded<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(std::time::Duration::from_secs(180), fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish"))
}

#[tokio::test]
async fn docker_autoscaler_runs_a_job_with_a_service_through_dial_stdio_over_ssh() {
    ensure_engine();
    let guard = Guard::new("autoscaler");
    let sshd = Sshd::start().await.expect("sshd");
    let client = Client::connect(
        &sshd.info().expect("sshd info"),
        &DialOptions::default(),
        &HostKeyStore::new(),
    )
    .await
    .unwrap();
    let client = Arc::new(client);
    let mut exec = DockerExecutor::connect_ssh(Arc::clone(&client), config())
        .await
        .unwrap();
    exec.runner_name = guard.runner.clone();
    exec.kill_grace_secs = 2;
    let transport = format!("{:?}", exec.docker().transport());
    assert!(transport.contains("dial-stdio"), "{transport}");

    let page = fetch_until("web", "index.html", "via-ssh");
    let j = job(
        job_id(),
        &[FETCH, &page, "echo \"masked: $SECRET\""],
        120,
        vec![web_service("web", "via-ssh")],
        None,
    );
    let ran = bounded("the job", run(&exec, &j)).await;
    assert!(
        ran.outcome.is_success(),
        "{:?}\n{}",
        ran.outcome,
        ran.output
    );
    assert!(ran.output.contains("via-ssh hello"), "{}", ran.output);
    assert!(ran.output.contains("masked: [MASKED]"), "{}", ran.output);

    // A failing job through the tunnel too: exit code and cleanup.
    let j = job(job_id(), &["exit 5"], 60, vec![], None);
    let ran = bounded("the failing job", run(&exec, &j)).await;
    let (code, _) = assert_failed(&ran, FailureReason::ScriptFailure);
    assert_eq!(code, Some(5));
    assert_eq!(leftovers(&docker().await, &guard.runner).await, (0, 0, 0));
    drop(exec);
    if let Ok(client) = Arc::try_unwrap(client) {
        client.close().await;
    }
}

#[tokio::test]
async fn a_slot_network_stays_warm_across_its_jobs_and_goes_at_shutdown() {
    let guard = Guard::new("warm");
    let exec = executor(&guard, config()).await;
    let j = job(job_id(), &["echo one"], 60, vec![], None);
    let ran = run(&exec, &j).await;
    assert!(
        ran.outcome.is_success(),
        "{:?}\n{}",
        ran.outcome,
        ran.output
    );
    let warm = slot_networks(&exec).await;
    assert_eq!(warm.len(), 1);
    assert_eq!(leftovers(exec.docker(), &guard.runner).await, (0, 0, 0));

    // The next job of the slot uses it again, with a service reachable by alias.
    let wait = fetch_until("web", "index.html", "again");
    let j = job(
        job_id(),
        &[FETCH, &wait],
        120,
        vec![web_service("web", "again")],
        None,
    );
    let ran = run(&exec, &j).await;
    assert!(
        ran.outcome.is_success(),
        "{:?}\n{}",
        ran.outcome,
        ran.output
    );
    assert_eq!(slot_networks(&exec).await, warm);
    assert_eq!(leftovers(exec.docker(), &guard.runner).await, (0, 0, 0));

    // Two jobs claiming the same slot at once: the second gets a network of its own.
    let a = job(job_id(), &["sleep 1", "echo a"], 60, vec![], None);
    let b = job(job_id(), &["sleep 1", "echo b"], 60, vec![], None);
    let (ra, rb) = tokio::join!(run(&exec, &a), run(&exec, &b));
    assert!(ra.outcome.is_success(), "{:?}\n{}", ra.outcome, ra.output);
    assert!(rb.outcome.is_success(), "{:?}\n{}", rb.outcome, rb.output);
    assert_eq!(slot_networks(&exec).await, warm);
    assert_eq!(leftovers(exec.docker(), &guard.runner).await, (0, 0, 0));

    exec.shutdown().await.unwrap();
    assert!(slot_networks(&exec).await.is_empty());
    let label = format!("{LABEL_RUNNER}={}", guard.runner);
    assert!(
        exec.docker()
            .list_networks(Some(&label))
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn the_first_step_in_the_main_shell_keeps_after_script_and_artifacts() {
    let guard = Guard::new("first");
    let exec = executor(&guard, config()).await;
    let json = serde_json::json!({
        "id": job_id(),
        "token": "t",
        "job_info": {"project_id": 42, "name": "test"},
        "runner_info": {"timeout": 60},
        "steps": [
            {"name": "script", "script": ["echo out-line", "echo err-line >&2", "echo data > art.txt", "printf no-newline", "exit 3"], "timeout": 60, "when": "on_success"},
            {"name": "after_script", "script": ["echo after-ran", "cat art.txt"], "timeout": 60, "when": "always"},
        ],
        "artifacts": [{"name": "a", "paths": ["art.txt"], "when": "always", "artifact_type": "archive"}],
    });
    let j = JobResponse::from_json(&json.to_string()).unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut trace = Trace::new(Vec::<String>::new(), tx);
    let result = exec
        .run(
            &j,
            JobSlot {
                slot: 3,
                cgroup: None,
                trace: &mut trace,
                cancel: CancellationToken::new(),
                abort: None,
                artifacts_in: Vec::new(),
                scratch_dir: None,
                max_collected: None,
                sources: None,
                data: None,
            },
        )
        .await;
    trace.finish();
    drop(trace);
    let mut output = String::new();
    while let Some(chunk) = rx.recv().await {
        output.push_str(&String::from_utf8_lossy(&chunk));
    }
    match &result.outcome {
        JobOutcome::Failed {
            reason: FailureReason::ScriptFailure,
            exit_code: Some(3),
            ..
        } => {}
        other => panic!("{other:?}\n{output}"),
    }
    for want in ["out-line", "err-line", "no-newline", "after-ran", "\ndata"] {
        assert!(output.contains(want), "{want:?} missing:\n{output}");
    }
    assert!(!output.contains("__slipway_end_"), "{output}");
    let tar = &result.artifacts.first().expect("artifacts").tar;
    assert!(!tar.is_empty());
    assert_eq!(leftovers(exec.docker(), &guard.runner).await, (0, 0, 0));
    exec.shutdown().await.unwrap();
}
