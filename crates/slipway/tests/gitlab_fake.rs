//! `slipway run` against a stateful mock GitLab of our own on loopback (`FakeGitlab`), for what
//! `gitlab-runner-mock` cannot do: real repositories to fetch, dependencies' artifacts behind a
//! redirect, the cache across jobs, cancel from GitLab, a GitLab outage in the middle of a job,
//! a manager killed under a running job, and docker-autoscaler jobs with images.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use common::World;
use serde_json::{Value, json};
use slipway_testkit::gitlab::{FakeGitlab, Outage, job_payload_with_vars};

/// A git repository with one commit on `main`; its `file://` URL and the commit's sha.
fn repository(w: &World) -> (String, String) {
    let dir = w.path().join("repo");
    std::fs::create_dir_all(&dir).unwrap();
    let git = |args: &[&str]| common::git(&dir, args);
    git(&["init", "-q", "-b", "main"]);
    std::fs::write(dir.join("README.md"), "hello from the repository\n").unwrap();
    std::fs::write(dir.join(".gitignore"), "ignored.log\n").unwrap();
    git(&["add", "."]);
    git(&["commit", "-q", "-m", "first"]);
    let sha = git(&["rev-parse", "HEAD"]).trim().to_string();
    // GitLab puts the job token in the URL; it must reach neither the job nor its trace.
    (
        format!("file://gitlab-ci-token:glcbt-repo-secret@{}", dir.display()),
        sha,
    )
}

/// `payload` pointing at `repo` (url, sha) on `main`.
fn with_repo(mut payload: Value, repo: &(String, String)) -> Value {
    payload["git_info"]["repo_url"] = json!(repo.0);
    payload["git_info"]["sha"] = json!(repo.1);
    payload["git_info"]["depth"] = json!(20);
    payload
}

/// Give `payload` an `after_script` that leaves `marker` on this machine (the local instance's).
fn with_after_script(payload: &mut Value, marker: &Path) {
    payload["steps"].as_array_mut().unwrap().push(json!({
        "name": "after_script",
        "script": [format!("echo after-script-ran && touch {}", marker.display())],
        "timeout": 60, "when": "always", "allow_failure": false,
    }));
}

/// A config with one instance-executor runner on `fleeting-plugin-local` serving `gl`.
fn instance_config(w: &World, gl: &FakeGitlab, extra: &str) -> std::path::PathBuf {
    w.write(
        "config.toml",
        &format!(
            r#"
concurrent = 2
check_interval = 1
[[runners]]
  name = "fake"
  url = "{url}"
  token = "{token}"
  executor = "instance"
  cache_dir = "{cache}"
{extra}
{autoscaler}"#,
            url = gl.url(),
            token = gl.runner_token(),
            cache = w.path().join("cache").display(),
            // Its instances share this machine's network: the job helper reaches the test
            // GitLab on loopback from there, as instances reaching GitLab do.
            autoscaler = common::loopback_autoscaler(w, "gf"),
        ),
    )
}

/// How many times the artifacts of job `dep_id` were downloaded.
fn artifact_downloads(gl: &FakeGitlab, dep_id: u64) -> usize {
    let path = format!("/api/v4/jobs/{dep_id}/artifacts");
    gl.requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path.starts_with(&path))
        .count()
}

/// Wait (up to 3 minutes) for job `id`'s trace to hold `text`; whether it did.
fn trace_shows(gl: &FakeGitlab, id: u64, text: &str) -> bool {
    common::wait_until(Duration::from_secs(180), || {
        gl.job(id).is_some_and(|j| j.trace_text().contains(text))
    })
}

/// Wait for job `id` to reach `state`; on timeout, stop the manager and show everything.
async fn finished(gl: &FakeGitlab, id: u64, state: &str, w: &World, child: &mut Option<Child>) {
    if gl
        .wait_for_state(id, state, Duration::from_secs(240))
        .await
        .is_some()
    {
        return;
    }
    let job = gl.job(id);
    let stderr = child.take().map(|c| {
        common::signal(c.id(), "TERM");
        String::from_utf8_lossy(&common::wait_with_timeout(c, Duration::from_secs(60)).stderr)
            .into_owned()
    });
    let _ = w;
    panic!(
        "job {id} never reached {state}: {:?}\ntrace:\n{}\nmanager:\n{}",
        job.as_ref().map(|j| j.state.clone()),
        job.as_ref().map(|j| j.trace_text()).unwrap_or_default(),
        stderr.unwrap_or_default()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sources_artifacts_dependencies_and_cache_flow_between_jobs() {
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let repo = repository(&w);

    let mut build = with_repo(
        job_payload_with_vars(
            "build",
            &[
                "cat README.md",
                "test \"$(git rev-parse HEAD)\" = \"$CI_COMMIT_SHA\" || git rev-parse HEAD",
                "grep -c o-secr .git/config && exit 9 || echo no-token-in-git-config",
                "mkdir -p out deps && echo from-build > out/a.txt && echo scratch > out/skip.tmp",
                "echo cached-dependency > deps/lib.txt && echo noise > ignored.log",
                "echo '<testsuite/>' > report.xml && echo '{}' > gl-sast-report.json",
                "echo \"env: $FROM_RUNNER\"",
            ],
            &[],
        ),
        &repo,
    );
    build["variables"]
        .as_array_mut()
        .unwrap()
        .push(json!({"key": "CI_COMMIT_SHA", "value": repo.1, "public": true}));
    build["artifacts"] = json!([
        {"name": "binaries", "paths": ["out/"], "exclude": ["out/*.tmp", "deps/**"],
         "untracked": true, "when": "on_success",
         "artifact_type": "archive", "artifact_format": "zip", "expire_in": "1 week"},
        {"name": "junit", "paths": ["report.xml"], "when": "always",
         "artifact_type": "junit", "artifact_format": "gzip"},
        {"paths": ["gl-sast-report.json"], "when": "always",
         "artifact_type": "sast", "artifact_format": "raw"}
    ]);
    build["cache"] = json!([
        {"key": "deps-$CI_JOB_NAME", "paths": ["deps/"], "policy": "push", "when": "on_success"}
    ]);
    let build_id = gl.enqueue(build);

    let cfg = instance_config(
        &w,
        &gl,
        "  environment = [\"FROM_RUNNER=set-in-config\"]\n  pre_build_script = \"echo pre-build-ran\"",
    );
    let mut child = Some(common::start_manager(&w, &cfg));
    finished(&gl, build_id, "success", &w, &mut child).await;
    let job = gl.job(build_id).unwrap();
    let trace = job.trace_text();
    assert!(trace.contains("hello from the repository"), "{trace}");
    assert!(trace.contains("no-token-in-git-config"), "{trace}");
    assert!(trace.contains("pre-build-ran"), "{trace}");
    assert!(trace.contains("env: set-in-config"), "{trace}");
    assert!(trace.contains("Created cache deps-build"), "{trace}");
    // In the runner's cache_dir, under the project's path and the expanded key.
    let archive = w.path().join("cache/group/project/deps-build/cache.tar.gz");
    assert!(archive.is_file(), "no {}", archive.display());
    assert!(
        !trace.contains(job.token.as_str()),
        "job token in the trace"
    );
    assert!(
        !trace.contains("repo-secret"),
        "repository token in the trace"
    );
    assert_eq!(job.artifacts.len(), 3, "{trace}");
    let binaries = &job.artifacts[0];
    assert_eq!(binaries.query.get("artifact_format").unwrap(), "zip");
    assert_eq!(binaries.query.get("expire_in").unwrap(), "1 week");
    // paths + untracked (what git does not track), minus exclude; nothing git tracks.
    let files = common::unzip(&binaries.bytes);
    assert_eq!(
        files.keys().cloned().collect::<Vec<_>>(),
        vec![
            "gl-sast-report.json",
            "ignored.log",
            "out/a.txt",
            "report.xml"
        ],
        "{files:?}"
    );
    assert_eq!(files["out/a.txt"], "from-build\n");
    // The junit report, gzip format, as GitLab stores reports.
    let junit = &job.artifacts[1];
    assert_eq!(junit.query.get("artifact_type").unwrap(), "junit");
    assert_eq!(junit.query.get("artifact_format").unwrap(), "gzip");
    let mut gunzip = Command::new("gzip")
        .args(["-d", "-c"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(gunzip.stdin.as_mut().unwrap(), &junit.bytes).unwrap();
    drop(gunzip.stdin.take());
    let out = gunzip.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "<testsuite/>\n");
    // A raw report: the file itself, under its own name.
    let sast = &job.artifacts[2];
    assert_eq!(sast.query.get("artifact_format").unwrap(), "raw");
    assert_eq!(sast.filename, "gl-sast-report.json");
    assert_eq!(sast.bytes, b"{}\n");

    // A later job of the pipeline: the build's artifacts and the cache, sources fetched into
    // the kept working copy.
    let mut test = with_repo(
        job_payload_with_vars(
            "test",
            &[
                "cat out/a.txt",
                "test ! -e out/skip.tmp && echo excluded-file-absent",
                "cat deps/lib.txt",
                "cat README.md",
            ],
            &[("GIT_STRATEGY", "fetch")],
        ),
        &repo,
    );
    test["cache"] = json!([
        {"key": "deps-missing", "fallback_keys": ["deps-build"], "paths": ["deps/"], "policy": "pull"}
    ]);
    test["dependencies"] = json!([
        {"id": build_id, "token": job.token, "name": "build",
         "artifacts_file": {"filename": "artifacts.zip", "size": binaries.bytes.len()}}
    ]);
    let test_id = gl.enqueue(test);
    finished(&gl, test_id, "success", &w, &mut child).await;
    let trace = gl.job(test_id).unwrap().trace_text();
    for want in [
        "from-build",
        "excluded-file-absent",
        "cached-dependency",
        "Successfully extracted cache",
        "hello from the repository",
    ] {
        assert!(trace.contains(want), "{want:?} missing:\n{trace}");
    }
    // The artifacts came through GitLab's redirect to object storage (same host here, so the
    // token may follow; a redirect to another host drops it: crates/gitlab gitlab_artifacts).
    let downloads = gl.object_downloads();
    assert!(
        downloads
            .iter()
            .any(|d| d.job_id == build_id && d.status == 200),
        "{downloads:?}"
    );
    // The runner says what it supports.
    let features = gl.last_features().unwrap();
    for f in [
        "artifacts",
        "cache",
        "refspecs",
        "upload_multiple_artifacts",
        "cancelable",
    ] {
        assert_eq!(features[f], true, "{f}: {features}");
    }
    common::stop_manager(&w, child.take().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_from_gitlab_stops_the_job() {
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let marker = w.path().join("after-script-ran");
    let mut payload = job_payload_with_vars(
        "long",
        &["echo started-long-job", "sleep 307", "echo never-printed"],
        &[("GIT_STRATEGY", "none")],
    );
    with_after_script(&mut payload, &marker);
    let id = gl.enqueue(payload);
    let cfg = instance_config(&w, &gl, "");
    let mut child = Some(common::start_manager(&w, &cfg));
    let started = trace_shows(&gl, id, "started-long-job");
    assert!(
        started,
        "job never started: {:?}",
        gl.job(id).map(|j| j.state)
    );
    gl.cancel(id, true);
    finished(&gl, id, "canceled", &w, &mut child).await;
    let job = gl.job(id).unwrap();
    let trace = job.trace_text();
    assert!(!trace.contains("never-printed"), "{trace}");
    assert!(trace.contains("job canceled"), "{trace}");
    // A graceful cancel (GitLab's `canceling`) still runs after_script, as GitLab Runner does.
    assert!(trace.contains("Running after_script"), "{trace}");
    assert!(marker.exists(), "after_script did not run:\n{trace}");
    assert!(
        common::processes_matching("sleep 307").is_empty(),
        "the job's process survived: {:?}",
        common::processes_matching("sleep 307")
    );
    common::stop_manager(&w, child.take().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_canceled_outright_in_gitlab_is_stopped_and_its_slot_freed() {
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let marker = w.path().join("after-script-ran");
    let mut payload = job_payload_with_vars(
        "doomed-by-gitlab",
        &["echo started-hard-cancel", "sleep 313"],
        &[("GIT_STRATEGY", "none")],
    );
    with_after_script(&mut payload, &marker);
    let id = gl.enqueue(payload);
    let cfg = instance_config(&w, &gl, "");
    let mut child = Some(common::start_manager(&w, &cfg));
    let started = trace_shows(&gl, id, "started-hard-cancel");
    assert!(started, "job never started");
    // GitLab's state is `canceled` at once: the runner learns it from its next trace call.
    gl.cancel(id, false);
    let stopped = common::wait_until(Duration::from_secs(120), || {
        common::processes_matching("sleep 313").is_empty()
    });
    assert!(stopped, "{:?}", common::processes_matching("sleep 313"));
    // Both slots serve the next jobs.
    let next: Vec<u64> = (0..2)
        .map(|i| {
            gl.enqueue(job_payload_with_vars(
                &format!("after-{i}"),
                &["echo next-job-ran"],
                &[("GIT_STRATEGY", "none")],
            ))
        })
        .collect();
    for n in next {
        finished(&gl, n, "success", &w, &mut child).await;
    }
    assert_eq!(gl.job(id).unwrap().state, "canceled");
    // Canceled outright: nothing more of the job runs, after_script included.
    assert!(
        !marker.exists(),
        "after_script ran after an outright cancel"
    );
    common::stop_manager(&w, child.take().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gitlab_outage_during_a_job_loses_nothing() {
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let id = gl.enqueue(job_payload_with_vars(
        "steady",
        &["for i in $(seq 1 45); do echo line-$i; sleep 1; done"],
        &[("GIT_STRATEGY", "none")],
    ));
    let cfg = instance_config(&w, &gl, "");
    let mut child = Some(common::start_manager(&w, &cfg));
    let started = trace_shows(&gl, id, "line-2\n");
    assert!(started, "job never started");
    // 30 s without GitLab: dropped connections, then 503s.
    gl.set_outage(Outage::Drop);
    tokio::time::sleep(Duration::from_secs(15)).await;
    gl.set_outage(Outage::Unavailable);
    tokio::time::sleep(Duration::from_secs(15)).await;
    gl.set_outage(Outage::None);
    finished(&gl, id, "success", &w, &mut child).await;
    let job = gl.job(id).unwrap();
    let trace = job.trace_text();
    for i in 1..=45 {
        let line = format!("line-{i}\n");
        assert_eq!(trace.matches(&line).count(), 1, "{line:?} in:\n{trace}");
    }
    let positions: Vec<usize> = (1..=45)
        .map(|i| trace.find(&format!("line-{i}\n")).unwrap())
        .collect();
    assert!(positions.windows(2).all(|p| p[0] < p[1]), "out of order");
    assert_eq!(job.accepted_final_states(), vec!["success".to_string()]);
    let last = job.updates.last().unwrap();
    assert_eq!(last["output"]["bytesize"], job.trace.len() as u64, "{last}");
    // Requests really failed during the outage.
    let refused = gl
        .requests()
        .iter()
        .filter(|r| r.status == 0 || r.status == 503)
        .count();
    assert!(refused > 0, "no request hit the outage");
    common::stop_manager(&w, child.take().unwrap());
}

/// The runner's state files out of reach at start (a full disk, here a file where its outbox
/// directory goes): the runner waits and retries instead of giving up, and serves once they are
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_whose_state_is_out_of_reach_at_start_serves_once_it_is_back() {
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let id = gl.enqueue(job_payload_with_vars(
        "after-the-outage",
        &["echo served-at-last"],
        &[("GIT_STRATEGY", "none")],
    ));
    let cfg = instance_config(&w, &gl, "");
    let state = w.path().join(".slipway-state");
    std::fs::create_dir_all(&state).unwrap();
    let blocker = state.join("gitlab");
    std::fs::write(&blocker, "not a directory").unwrap();
    let child = common::start_manager(&w, &cfg);
    // Tried, refused, tried again: nothing is asked of GitLab meanwhile.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(gl.job(id).unwrap().state, "pending");
    std::fs::remove_file(&blocker).unwrap();
    let mut child = Some(child);
    finished(&gl, id, "success", &w, &mut child).await;
    assert!(gl.job(id).unwrap().trace_text().contains("served-at-last"));
    let stderr = common::stop_manager(&w, child.take().unwrap());
    assert!(stderr.contains("retrying in"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_running_when_the_manager_dies_is_reported_after_restart() {
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let id = gl.enqueue(job_payload_with_vars(
        "doomed",
        &["echo started-doomed", "sleep 311"],
        &[("GIT_STRATEGY", "none")],
    ));
    let cfg = instance_config(&w, &gl, "");
    let child = common::start_manager(&w, &cfg);
    let started = trace_shows(&gl, id, "started-doomed");
    assert!(started, "job never started");
    common::signal(child.id(), "KILL");
    let _ = common::wait_with_timeout(child, Duration::from_secs(30));
    assert_eq!(gl.job(id).unwrap().state, "running");

    let mut child = Some(common::start_manager(&w, &cfg));
    finished(&gl, id, "failed", &w, &mut child).await;
    let job = gl.job(id).unwrap();
    let last = job.updates.last().unwrap();
    assert_eq!(last["failure_reason"], "runner_system_failure", "{last}");
    assert_eq!(job.accepted_final_states(), vec!["failed".to_string()]);
    // The trace keeps what the job printed and says why it ended.
    let trace = job.trace_text();
    assert!(trace.contains("started-doomed"), "{trace}");
    assert!(
        trace.ends_with(
            "\nERROR: Job failed: the runner manager stopped while the job was running\n"
        ),
        "{trace}"
    );
    let stderr = common::stop_manager(&w, child.take().unwrap());
    assert!(
        stderr.contains("left by an earlier run"),
        "restart did not say why:\n{stderr}"
    );
    // Killed with the manager's instance: the job's process does not outlive the cleanup.
    assert!(
        common::wait_until(Duration::from_secs(30), || common::processes_matching(
            "sleep 311"
        )
        .is_empty()),
        "{:?}",
        common::processes_matching("sleep 311")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_autoscaler_jobs_from_gitlab() {
    slipway_testkit::ensure_docker_engine().expect("Docker Engine");
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let repo = repository(&w);
    let mut ok = with_repo(
        job_payload_with_vars(
            "in-container",
            &[
                "cat README.md",
                "mkdir -p out && echo made-in-docker > out/result.txt",
            ],
            &[],
        ),
        &repo,
    );
    ok["image"] = json!({"name": "slipway-busybox:latest"});
    ok["artifacts"] = json!([{"paths": ["out/"], "when": "on_success",
        "artifact_type": "archive", "artifact_format": "zip"}]);
    let ok_id = gl.enqueue(ok);
    let mut bad = job_payload_with_vars(
        "fails",
        &["echo before-failing", "exit 3"],
        &[("GIT_STRATEGY", "none")],
    );
    bad["image"] = json!({"name": "slipway-busybox:latest"});
    let bad_id = gl.enqueue(bad);

    let runner = format!("gfd{}", std::process::id());
    let cfg = w.write(
        "config.toml",
        &format!(
            r#"
concurrent = 1
check_interval = 1
[[runners]]
  name = "{runner}"
  url = "{url}"
  token = "{token}"
  executor = "docker-autoscaler"
  # busybox has no git: its sources come from the manager, which this runner allows.
  fetch_sources = "instance_or_manager"
  # The test GitLab is on loopback, which the build containers do not reach: the manager
  # moves the job's artifacts (tests/job_data.rs has containers that reach it).
  job_data = "manager"
  [runners.docker]
    image = "slipway-busybox:latest"
    pull_policy = "never"
  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = 1
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
            state = w.path().join("plugin-state").display(),
        ),
    );
    let mut child = Some(common::start_manager(&w, &cfg));
    finished(&gl, ok_id, "success", &w, &mut child).await;
    finished(&gl, bad_id, "failed", &w, &mut child).await;

    let job = gl.job(ok_id).unwrap();
    let trace = job.trace_text();
    assert!(trace.contains("hello from the repository"), "{trace}");
    let files = common::unzip(&job.artifacts[0].bytes);
    assert_eq!(
        files.get("out/result.txt").map(String::as_str),
        Some("made-in-docker\n")
    );
    let bad = gl.job(bad_id).unwrap();
    let text = bad.trace_text();
    let at = text.find("Skipping Git repository setup").unwrap();
    let tail = &text[at..];
    assert!(
        tail.ends_with(
            "$ echo before-failing\nbefore-failing\n$ exit 3\n\
             ERROR: Job failed: exit code 3\nJob failed (script_failure)\n"
        ),
        "{text}"
    );
    let last = bad.updates.last().unwrap();
    assert_eq!(last["failure_reason"], "script_failure", "{last}");
    assert_eq!(last["exit_code"], 3, "{last}");
    assert_eq!(gl.last_features().unwrap()["image"], true);
    let logs = common::stop_manager(&w, child.take().unwrap());
    // Nothing of the runner's stays on the engine once the manager has stopped.
    let left = common::runner_networks(&runner);
    assert!(left.is_empty(), "networks left: {left:?}\n{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_state_gitlab_missed_is_sent_after_a_restart() {
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let id = gl.enqueue(job_payload_with_vars(
        "unlucky",
        &["echo started-unlucky", "sleep 4", "echo finishing-unlucky"],
        &[("GIT_STRATEGY", "none")],
    ));
    let cfg = instance_config(&w, &gl, "");
    let child = common::start_manager(&w, &cfg);
    let started = trace_shows(&gl, id, "started-unlucky");
    assert!(started, "job never started");
    // GitLab goes away before the job ends, and the manager is stopped while it still is.
    gl.set_outage(Outage::Unavailable);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let stderr = common::stop_manager(&w, child);
    assert!(
        stderr.contains("kept in the outbox"),
        "shutdown did not keep the state:\n{stderr}"
    );
    assert_eq!(gl.job(id).unwrap().state, "running");

    gl.set_outage(Outage::None);
    let mut child = Some(common::start_manager(&w, &cfg));
    finished(&gl, id, "success", &w, &mut child).await;
    let job = gl.job(id).unwrap();
    assert_eq!(job.accepted_final_states(), vec!["success".to_string()]);
    let stderr = common::stop_manager(&w, child.take().unwrap());
    assert!(stderr.contains("left by an earlier run"), "{stderr}");
}

/// A dependency's archive that cannot be unpacked is downloaded `ARTIFACT_DOWNLOAD_ATTEMPTS`
/// times, then fails the job saying which; the files it passed through are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_dependency_is_tried_artifact_download_attempts_times() {
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let dep_id = 900;
    gl.put_artifact(
        dep_id,
        "glcbt-1_depToken00001",
        b"not a zip archive".to_vec(),
    );
    let mut job = job_payload_with_vars(
        "test",
        &["echo never-runs"],
        &[
            ("GIT_STRATEGY", "none"),
            ("ARTIFACT_DOWNLOAD_ATTEMPTS", "2"),
        ],
    );
    job["dependencies"] = json!([
        {"id": dep_id, "token": "glcbt-1_depToken00001", "name": "build",
         "artifacts_file": {"filename": "artifacts.zip", "size": 17}}
    ]);
    let id = gl.enqueue(job);
    let cfg = instance_config(&w, &gl, "");
    let mut child = Some(common::start_manager(&w, &cfg));
    finished(&gl, id, "failed", &w, &mut child).await;
    let trace = gl.job(id).unwrap().trace_text();
    for want in [
        "Retrying to download the artifacts of build (attempt 2 of 2)",
        "invalid zip archive",
    ] {
        assert!(trace.contains(want), "{want:?} missing:\n{trace}");
    }
    assert!(!trace.contains("never-runs"), "{trace}");
    let downloads = artifact_downloads(&gl, dep_id);
    assert_eq!(downloads, 2, "one download per attempt");
    common::assert_scratch_empty(&w);
    common::stop_manager(&w, child.take().unwrap());
}

/// A dependency's 1 MB zip that expands to 1 GiB is refused while it streams, on the default
/// limits: the job fails before its script, saying which limit, after one download (a retry
/// would be refused again), and the manager's scratch directory is left empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zip_bomb_dependency_fails_its_job_and_leaves_the_disk_as_it_was() {
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let dep_id = 901;
    let bomb = common::zip_bomb();
    let size = bomb.len();
    gl.put_artifact(dep_id, "glcbt-1_depToken00002", bomb);
    let mut job = job_payload_with_vars(
        "test",
        &["echo never-runs"],
        &[
            ("GIT_STRATEGY", "none"),
            ("ARTIFACT_DOWNLOAD_ATTEMPTS", "3"),
        ],
    );
    job["dependencies"] = json!([
        {"id": dep_id, "token": "glcbt-1_depToken00002", "name": "build",
         "artifacts_file": {"filename": "artifacts.zip", "size": size}}
    ]);
    let id = gl.enqueue(job);
    let cfg = instance_config(&w, &gl, "");
    let mut child = Some(common::start_manager(&w, &cfg));
    finished(&gl, id, "failed", &w, &mut child).await;
    let trace = gl.job(id).unwrap().trace_text();
    for want in ["downloading the artifacts of build", "refused", "max_ratio"] {
        assert!(trace.contains(want), "{want:?} missing:\n{trace}");
    }
    assert!(!trace.contains("never-runs"), "{trace}");
    let downloads = artifact_downloads(&gl, dep_id);
    assert_eq!(downloads, 1, "a refused archive is not downloaded again");
    common::assert_scratch_empty(&w);
    common::stop_manager(&w, child.take().unwrap());
}

/// A job whose collected artifacts pass `[runners.archives] max_size` (1 GiB made from a 1 MB
/// zip where it runs, against a 256 MiB limit) fails saying so, and what it sent is gone from
/// the manager's scratch directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collected_artifacts_past_max_size_fail_the_job_and_leave_nothing() {
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let bomb = w.path().join("bomb.zip");
    std::fs::write(&bomb, common::zip_bomb()).unwrap();
    let mut job = job_payload_with_vars(
        "build",
        &[&format!(
            "mkdir -p out && python3 -m zipfile -e {} out/ && echo expanded",
            bomb.display()
        )],
        &[("GIT_STRATEGY", "none")],
    );
    job["artifacts"] = json!([
        {"name": "out", "untracked": false, "paths": ["out/"], "when": "on_success",
         "artifact_type": "archive", "artifact_format": "zip"}
    ]);
    let id = gl.enqueue(job);
    let cfg = instance_config(&w, &gl, "  [runners.archives]\n    max_size = 268435456\n");
    let mut child = Some(common::start_manager(&w, &cfg));
    finished(&gl, id, "failed", &w, &mut child).await;
    let trace = gl.job(id).unwrap().trace_text();
    for want in ["expanded", "collecting artifacts failed", "max_size"] {
        assert!(trace.contains(want), "{want:?} missing:\n{trace}");
    }
    assert!(gl.job(id).unwrap().artifacts.is_empty(), "nothing uploaded");
    common::assert_scratch_empty(&w);
    common::stop_manager(&w, child.take().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_priced_runner_closes_each_trace_with_the_jobs_cost() {
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let mut payload = job_payload_with_vars(
        "priced",
        &["echo working", "sleep 1"],
        &[("GIT_STRATEGY", "none")],
    );
    payload["job_info"]["project_full_path"] = json!("group/app");
    let id = gl.enqueue(payload);
    let cfg = instance_config(&w, &gl, "");
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        "    plugin = \"local\"\n",
        "    plugin = \"local\"\n    price_per_hour = \"0.36 EUR\"\n",
    );
    std::fs::write(&cfg, text).unwrap();
    let mut child = Some(common::start_manager(&w, &cfg));
    finished(&gl, id, "success", &w, &mut child).await;
    let trace = gl.job(id).unwrap().trace_text();
    let lines: Vec<&str> = trace.lines().map(str::trim).collect();
    let last = lines
        .iter()
        .rposition(|l| l.contains("Job succeeded"))
        .unwrap_or_else(|| panic!("no closing line:\n{trace}"));
    let cost = lines[..last]
        .iter()
        .rev()
        .find(|l| !l.is_empty())
        .copied()
        .unwrap_or_default();
    // Half the instance (one slot of two) for at least its second of sleep, at 0.0001 EUR/s.
    assert!(
        cost.contains("Job cost: 0.0") && cost.contains(" EUR (50% of a default instance for "),
        "the line before the closing one: {cost:?}\n{trace}"
    );
    let amount: f64 = cost
        .split("Job cost: ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("{cost:?}"));
    assert!((0.00005..0.01).contains(&amount), "{cost:?}");
    assert_eq!(trace.matches("Job cost:").count(), 1, "{trace}");
    common::stop_manager(&w, child.take().unwrap());
}
