//! `slipway run` serving GitLab: jobs queued on `gitlab-runner-mock` run on an autoscaled
//! `fleeting-plugin-local` instance with the instance executor; traces and final states arrive.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use common::World;
use gitlab_runner_mock::{GitlabRunnerMock, MockJobState, MockJobStepName, MockJobStepWhen};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// One request that went through the recording proxy.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    body: Bytes,
}

#[derive(Clone)]
struct Proxy {
    upstream: String,
    client: Client<HttpConnector, Full<Bytes>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

/// Forwards to the mock and records what slipway sent (the mock does not keep `failure_reason`
/// or `exit_code`).
async fn forward(State(p): State<Proxy>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let path = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str().to_string())
        .unwrap_or_default();
    p.seen.lock().unwrap().push(Seen {
        method: parts.method.to_string(),
        path: path.clone(),
        body: body.clone(),
    });
    let mut out = http::Request::builder()
        .method(parts.method)
        .uri(format!("{}{}", p.upstream, path));
    for (k, v) in &parts.headers {
        if k != http::header::HOST {
            out = out.header(k, v);
        }
    }
    let resp = p.client.request(out.body(Full::new(body)).unwrap()).await;
    match resp {
        Ok(resp) => {
            let (parts, body) = resp.into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            Response::from_parts(parts, Body::from(body))
        }
        Err(e) => Response::builder()
            .status(502)
            .body(Body::from(e.to_string()))
            .unwrap(),
    }
}

async fn start_proxy(
    upstream: String,
) -> (String, Arc<Mutex<Vec<Seen>>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let proxy = Proxy {
        upstream: upstream.trim_end_matches('/').to_string(),
        client: Client::builder(TokioExecutor::new()).build_http(),
        seen: seen.clone(),
    };
    let app = axum::Router::new().fallback(forward).with_state(proxy);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), seen, server)
}

fn queue(mock: &GitlabRunnerMock, name: &str, script: &[&str]) -> u64 {
    queue_with(mock, name, script, &[])
}

/// Queue a job; `artifacts` are its `artifacts: paths` (zip archive, on success).
fn queue_with(mock: &GitlabRunnerMock, name: &str, script: &[&str], artifacts: &[&str]) -> u64 {
    let mut b = mock.job_builder(name.to_string());
    if !artifacts.is_empty() {
        b.add_artifact_paths(artifacts.iter().map(|s| s.to_string()).collect());
    }
    // The mock's repository (https://bla/dummy.git) does not exist.
    b.add_variable("GIT_STRATEGY".into(), "none".into(), true, false);
    b.add_step(
        MockJobStepName::Script,
        script.iter().map(|s| s.to_string()).collect(),
        3600,
        MockJobStepWhen::OnSuccess,
        false,
    );
    b.add_variable("SECRET".into(), "hunter22-s3cr3t".into(), false, true);
    let job = b.build();
    let id = job.id();
    mock.enqueue_job(job);
    id
}

/// The final `PUT /api/v4/jobs/:id` body slipway sent for `id`.
fn final_update(seen: &Mutex<Vec<Seen>>, id: u64) -> serde_json::Value {
    let path = format!("/api/v4/jobs/{id}");
    let seen = seen.lock().unwrap();
    let put = seen
        .iter()
        .rev()
        .find(|s| s.method == "PUT" && s.path == path)
        .unwrap_or_else(|| panic!("no PUT {path}"));
    serde_json::from_slice(&put.body).unwrap()
}

/// The trace from its first script line `first` on (what precedes it depends on how long the
/// job waited for capacity, and on the executor).
fn from_script<'a>(text: &'a str, first: &str) -> &'a str {
    let at = text
        .find(first)
        .unwrap_or_else(|| panic!("no {first:?} in trace:\n{text}"));
    &text[at..]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitlab_jobs_run_on_an_autoscaled_instance() {
    mock_pipeline("instance", "", "gl").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitlab_jobs_run_in_docker_autoscaler_containers() {
    slipway_testkit::ensure_docker_engine().expect("Docker Engine");
    // The mock's jobs name no image: the runner's default one is used.
    // The mock is on loopback, which build containers do not reach: the manager moves the
    // job's artifacts (tests/job_data.rs has containers that reach their servers).
    mock_pipeline(
        "docker-autoscaler",
        "  job_data = \"manager\"\n  [runners.docker]\n    image = \"slipway-busybox:latest\"\n    pull_policy = \"never\"\n",
        "gd",
    )
    .await;
}

/// A successful and a failing job queued on `gitlab-runner-mock`, run by `executor` on an
/// autoscaled `fleeting-plugin-local` instance: traces byte-compared, artifacts, final states.
async fn mock_pipeline(executor: &str, extra: &str, prefix: &str) {
    let mock = GitlabRunnerMock::start().await;
    let (url, seen, proxy) = start_proxy(mock.uri().to_string()).await;
    let ok = queue_with(
        &mock,
        "build",
        &[
            "echo first-line",
            "echo \"the secret is $SECRET\"",
            "for i in 1 2 3; do echo counted-$i; done",
            "mkdir -p out && echo built-by-slipway > out/report.txt",
            "echo last-line",
        ],
        &["out/"],
    );
    let bad = queue(&mock, "broken", &["echo before-failing", "exit 3"]);

    let w = World::new();
    let cfg = w.write(
        "config.toml",
        &format!(
            r#"
concurrent = 2
check_interval = 1
[[runners]]
  name = "gitlab-{prefix}"
  url = "{url}"
  token = "{token}"
  executor = "{executor}"
{extra}
{autoscaler}"#,
            token = mock.runner_token(),
            // The instance shares this machine's network: the job helper reaches the mock.
            autoscaler = common::loopback_autoscaler(&w, prefix),
        ),
    );
    let child = w
        .slipway(&["run", "-c", cfg.to_str().unwrap()])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");

    let finished = |id: u64| mock.get_job(id).is_some_and(|j| j.state().finished());
    let done = tokio::task::spawn_blocking({
        let mock = mock.clone();
        move || {
            common::wait_until(Duration::from_secs(180), || {
                [ok, bad]
                    .iter()
                    .all(|id| mock.get_job(*id).is_some_and(|j| j.state().finished()))
            })
        }
    })
    .await
    .unwrap();
    if !done {
        common::signal(child.id(), "TERM");
        let out = common::wait_with_timeout(child, Duration::from_secs(30));
        panic!(
            "jobs did not finish: ok={:?} bad={:?}\nstderr:\n{}",
            mock.get_job(ok).map(|j| j.state()),
            mock.get_job(bad).map(|j| j.state()),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(finished(ok) && finished(bad));

    // The successful job: complete trace, in order, the masked value never sent.
    let job = mock.get_job(ok).unwrap();
    let log = job.log();
    let text = String::from_utf8_lossy(&log).into_owned();
    assert_eq!(job.state(), MockJobState::Success, "trace:\n{text}");
    // Everything after the slot line is the job's own output, byte for byte.
    assert_eq!(
        from_script(&text, "$ echo first-line"),
        format!(
            "$ echo first-line\nfirst-line\n\
         $ echo \"the secret is $SECRET\"\nthe secret is [MASKED]\n\
         $ for i in 1 2 3; do echo counted-$i; done\ncounted-1\ncounted-2\ncounted-3\n\
         $ mkdir -p out && echo built-by-slipway > out/report.txt\n\
         $ echo last-line\nlast-line\n\
         Collecting artifacts\n\
         Uploading artifacts for successful job\n\
         2 files and directories; uploading artifacts as \"archive\" to coordinator...\n\
         Uploading artifacts as \"archive\" to coordinator... 201 Created  id={ok}\n\
         Job succeeded\n"
        ),
        "trace:\n{text}"
    );
    assert!(
        !log.windows(b"hunter22".len()).any(|w| w == b"hunter22"),
        "masked value leaked:\n{text}"
    );
    // Its artifacts arrived as a zip holding what the job wrote.
    let uploaded: Vec<_> = job.uploaded_artifacts().collect();
    assert_eq!(uploaded.len(), 1, "one archive uploaded");
    assert_eq!(uploaded[0].artifact_format.as_deref(), Some("zip"));
    assert_eq!(uploaded[0].artifact_type.as_deref(), Some("archive"));
    let files = common::unzip(&uploaded[0].data);
    assert_eq!(
        files.get("out/report.txt").map(String::as_str),
        Some("built-by-slipway\n"),
        "{files:?}"
    );
    let update = final_update(&seen, ok);
    assert_eq!(update["state"], "success");
    assert_eq!(update["output"]["bytesize"], log.len() as u64, "{update}");
    assert_eq!(
        update["checksum"],
        format!("crc32:{:08x}", slipway_gitlab::crc32(&log))
    );
    assert!(
        !String::from_utf8_lossy(&seen_bodies(&seen)).contains("hunter22"),
        "masked value sent to GitLab"
    );

    // The failing job: failed, script_failure, exit code 3; its output before the failure kept.
    let job = mock.get_job(bad).unwrap();
    let text = String::from_utf8_lossy(&job.log()).into_owned();
    assert_eq!(job.state(), MockJobState::Failed, "trace:\n{text}");
    assert_eq!(
        from_script(&text, "$ echo before-failing"),
        "$ echo before-failing\nbefore-failing\n$ exit 3\n\
         ERROR: Job failed: exit code 3\nJob failed (script_failure)\n",
        "trace:\n{text}"
    );
    let update = final_update(&seen, bad);
    assert_eq!(update["state"], "failed", "{update}");
    assert_eq!(update["failure_reason"], "script_failure", "{update}");
    assert_eq!(update["exit_code"], 3, "{update}");

    // The token never appears in the manager's output.
    common::signal(child.id(), "TERM");
    let out = common::wait_with_timeout(child, Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        !stderr.contains(mock.runner_token()),
        "token printed:\n{stderr}"
    );
    assert!(stderr.contains("serving GitLab jobs"), "{stderr}");
    assert!(
        text_of(&mock, ok).contains("Skipping Git repository setup"),
        "GIT_STRATEGY=none honoured"
    );
    assert!(
        w.processes().is_empty(),
        "left running: {:?}",
        w.processes()
    );
    proxy.abort();
}

fn text_of(mock: &GitlabRunnerMock, id: u64) -> String {
    String::from_utf8_lossy(&mock.get_job(id).unwrap().log()).into_owned()
}

fn seen_bodies(seen: &Mutex<Vec<Seen>>) -> Vec<u8> {
    seen.lock()
        .unwrap()
        .iter()
        .flat_map(|s| s.body.to_vec())
        .collect()
}
