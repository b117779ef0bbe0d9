//! The GitLab client against a small scripted GitLab of our own on loopback, for what
//! `gitlab-runner-mock` lacks: verify, registration, 416 resync, `Job-Status: canceling`,
//! 202-then-200 updates, 429/5xx backoff, `last_update` echoing, size limit, prefix masking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::Method;
use serde_json::{Value, json};
use slipway_gitlab::{
    Backoff, ClientConfig, FinishOutcome, GitlabClient, GitlabError, JobState, OutputInfo,
    PendingUpdate, Poller, PollerConfig, RegisterOptions, Secret, SystemId, TraceConfig,
    TraceSender, UpdateRetryPolicy, VersionInfo, limit_exceeded_message,
};
use slipway_job::JobResponse;
use tokio_util::sync::CancellationToken;

mod common;

use common::{Fake, Reply, Req};

/// The client these tests use.
trait FakeClient {
    fn client(&self) -> GitlabClient;
}

impl FakeClient for Fake {
    fn client(&self) -> GitlabClient {
        let info = VersionInfo::new("docker", "bash", [("cancel_gracefully".to_string(), true)]);
        self.client_with(info)
    }
}

fn ok_json(status: u16, v: Value) -> Reply {
    (
        status,
        vec![("content-type", "application/json".into())],
        v.to_string().into_bytes(),
    )
}

fn fast() -> Backoff {
    Backoff {
        initial: Duration::from_millis(2),
        max: Duration::from_millis(10),
    }
}

fn job(id: u64) -> JobResponse {
    JobResponse {
        id,
        token: "glcbt-job-secret".into(),
        ..JobResponse::default()
    }
}

#[tokio::test]
async fn verify_sends_token_system_id_and_info() {
    let fake = Fake::start(|req, _| {
        let body = req.json();
        if req.path != "/api/v4/runners/verify" || body["token"] != "glrt-good-token" {
            return (403, vec![], b"403 Forbidden: token glrt-bad-token".to_vec());
        }
        ok_json(
            200,
            json!({"id": 12, "token": "glrt-good-token", "token_expires_at": null}),
        )
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let sid = SystemId::load_or_create(&dir.path().join(".runner_system_id"))
        .await
        .unwrap();
    let c = fake.client();
    let creds = c
        .verify(&Secret::new("glrt-good-token"), &sid)
        .await
        .unwrap();
    assert_eq!(creds.id, 12);
    assert_eq!(creds.token.expose(), "glrt-good-token");

    let body = fake.requests()[0].json();
    assert_eq!(body["system_id"], sid.as_str());
    assert_eq!(body["info"]["name"], "slipway");
    assert_eq!(body["info"]["executor"], "docker");
    assert_eq!(body["info"]["features"]["refspecs"], true);
    assert_eq!(body["info"]["features"]["cancel_gracefully"], true);

    let err = c
        .verify(&Secret::new("glrt-bad-token"), &sid)
        .await
        .unwrap_err();
    assert!(matches!(err, GitlabError::Forbidden { .. }), "{err:?}");
    assert!(err.to_string().contains("POST /api/v4/runners/verify"));
    assert!(!format!("{err} {err:?}").contains("bad-token"));
}

#[tokio::test]
async fn legacy_verify_answers_plain_text() {
    let fake = Fake::start(|_, _| (200, vec![], b"200".to_vec())).await;
    let creds = fake
        .client()
        .verify(&Secret::new("glrt-x"), &SystemId::generate())
        .await
        .unwrap();
    assert_eq!(creds.id, 0);
    assert_eq!(creds.token.expose(), "glrt-x");
}

#[tokio::test]
async fn register_and_unregister() {
    let fake = Fake::start(|req, _| match (req.method.as_str(), req.path.as_str()) {
        ("POST", "/api/v4/runners") => ok_json(
            201,
            json!({"id": 99, "token": "glrt-new-runner", "token_expires_at": "2030-01-01T00:00:00Z"}),
        ),
        ("DELETE", "/api/v4/runners") => (204, vec![], vec![]),
        _ => (404, vec![], vec![]),
    })
    .await;
    let c = fake.client();
    let options = RegisterOptions {
        description: "slipway test".into(),
        tag_list: vec!["linux".into(), "docker".into()],
        run_untagged: true,
        ..RegisterOptions::default()
    };
    let creds = c
        .register(&Secret::new("GR1348941abc"), &options)
        .await
        .unwrap();
    assert_eq!(creds.id, 99);
    assert_eq!(creds.token.expose(), "glrt-new-runner");
    assert!(!format!("{creds:?}").contains("new-runner"));
    c.unregister(&creds.token).await.unwrap();

    let reqs = fake.requests();
    let reg = reqs[0].json();
    assert_eq!(reg["token"], "GR1348941abc");
    assert_eq!(reg["description"], "slipway test");
    assert_eq!(reg["tag_list"], json!(["linux", "docker"]));
    assert_eq!(reg["run_untagged"], true);
    assert_eq!(reg["info"]["features"]["refspecs"], true);
    assert_eq!(reqs[1].method, Method::DELETE);
    assert_eq!(reqs[1].json()["token"], "glrt-new-runner");
}

#[tokio::test]
async fn last_update_is_echoed_and_busy_answers_back_off() {
    // 204 with a queue version, then 503, then 429 with Retry-After: 0, then the job.
    let fake = Fake::start(|_, earlier| match earlier.len() {
        0 => (
            204,
            vec![("x-gitlab-last-update", "queue-v1".into())],
            vec![],
        ),
        1 => (503, vec![], b"unavailable".to_vec()),
        2 => (429, vec![("retry-after", "0".into())], vec![]),
        _ => ok_json(
            201,
            json!({"id": 5, "token": "glcbt-t", "job_info": {"name": "j"}}),
        ),
    })
    .await;
    let poller = Poller::new(
        fake.client(),
        Secret::new("glrt-runner"),
        SystemId::generate(),
        PollerConfig {
            request_concurrency: 1,
            check_interval: Duration::from_millis(5),
            backoff: fast(),
        },
    );
    let job = poller
        .next_job(&CancellationToken::new())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(job.id, 5);
    assert_eq!(job.job_info.name, "j");
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 4);
    assert!(reqs[0].json().get("last_update").is_none());
    for r in &reqs[1..] {
        assert_eq!(r.json()["last_update"], "queue-v1");
        assert_eq!(r.json()["token"], "glrt-runner");
    }
    assert_eq!(poller.last_update().as_deref(), Some("queue-v1"));
}

#[tokio::test]
async fn forbidden_runner_token_stops_the_poller() {
    let fake = Fake::start(|_, _| (403, vec![], vec![])).await;
    let poller = Poller::new(
        fake.client(),
        Secret::new("glrt-revoked"),
        SystemId::generate(),
        PollerConfig::default(),
    );
    let err = poller
        .next_job(&CancellationToken::new())
        .await
        .unwrap_err();
    assert!(matches!(err, GitlabError::Forbidden { .. }), "{err:?}");
}

/// A trace endpoint that keeps what it accepts, and may start with bytes the client does not
/// know were accepted (a lost answer).
fn trace_server(seed: &'static [u8], job_status: &'static str) -> impl Fn(&Req, &[Req]) -> Reply {
    let stored = Arc::new(Mutex::new(seed.to_vec()));
    move |req, _| {
        assert_eq!(req.method, Method::PATCH);
        assert_eq!(req.header("job-token"), Some("glcbt-job-secret"));
        assert_eq!(req.header("content-type"), Some("text/plain"));
        let range = req.header("content-range").unwrap();
        let (start, end) = range.split_once('-').unwrap();
        let (start, end): (usize, usize) = (start.parse().unwrap(), end.parse().unwrap());
        let mut stored = stored.lock().unwrap();
        if start != stored.len() || end + 1 != start + req.body.len() {
            return (416, vec![("range", format!("0-{}", stored.len()))], vec![]);
        }
        stored.extend_from_slice(&req.body);
        (
            202,
            vec![
                ("job-status", job_status.into()),
                ("x-gitlab-trace-update-interval", "7".into()),
            ],
            vec![],
        )
    }
}

fn received_trace(fake: &Fake) -> Vec<u8> {
    fake.requests()
        .iter()
        .filter(|r| r.method == Method::PATCH)
        .fold(Vec::new(), |mut acc, r| {
            // Rebuild the server's view: later PATCHes overwrite from their start.
            let start: usize = r
                .header("content-range")
                .unwrap()
                .split_once('-')
                .unwrap()
                .0
                .parse()
                .unwrap();
            if start <= acc.len() {
                acc.truncate(start);
                acc.extend_from_slice(&r.body);
            }
            acc
        })
}

#[tokio::test]
async fn range_mismatch_resyncs_from_the_range_header() {
    // The server already holds "hello" (an earlier PATCH whose answer was lost).
    let fake = Fake::start(trace_server(b"hello", "running")).await;
    let sender = TraceSender::new(
        fake.client(),
        1,
        Secret::new("glcbt-job-secret"),
        TraceConfig::default(),
    );
    sender.append(b"hello world\n");
    sender.flush().await.unwrap();
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].header("content-range"), Some("0-11"));
    assert_eq!(reqs[1].header("content-range"), Some("5-11"));
    assert_eq!(reqs[1].body, b" world\n");
    assert_eq!(reqs[0].path, "/api/v4/jobs/1/trace");
    assert_eq!(received_trace(&fake), b"hello world\n");
}

#[tokio::test]
async fn job_status_canceling_is_a_graceful_cancel() {
    let fake = Fake::start(trace_server(b"", "canceling")).await;
    let sender = TraceSender::new(
        fake.client(),
        1,
        Secret::new("glcbt-job-secret"),
        TraceConfig::default(),
    );
    sender.append(b"step 1\n");
    sender.flush().await.unwrap();
    assert!(sender.cancel_token().is_cancelled());
    assert!(!sender.abort_token().is_cancelled());
    assert_eq!(sender.update_interval(), Duration::from_secs(7));
}

#[tokio::test]
async fn forbidden_trace_aborts() {
    let fake = Fake::start(|_, _| (403, vec![], vec![])).await;
    let sender = TraceSender::new(fake.client(), 1, Secret::new("t"), TraceConfig::default());
    sender.append(b"x");
    sender.flush().await.unwrap();
    assert!(sender.abort_token().is_cancelled());
}

#[tokio::test]
async fn output_limit_truncates_masked_output_with_gitlab_message() {
    let fake = Fake::start(trace_server(b"", "running")).await;
    let sender = TraceSender::new(
        fake.client(),
        1,
        Secret::new("glcbt-job-secret"),
        TraceConfig {
            output_limit_kib: 1,
            ..TraceConfig::default()
        },
    );
    // The job's trace masks before the sender sees a byte, across writes.
    let mut masker = slipway_job::Masker::with_prefixes(["glcbt-job-secret"], ["glpat-"]);
    sender.append(&masker.push(b"token: glpat-"));
    sender.append(&masker.push(b"abcdef123 end\n"));
    sender.append(&masker.push(&[b'x'; 2000]));
    sender.append(&masker.push(b"dropped\n"));
    sender.append(&masker.finish());
    let out = sender.finish(&CancellationToken::new()).await.unwrap();
    let got = received_trace(&fake);
    let head = b"token: glpat-[MASKED] end\n";
    assert_eq!(&got[..head.len()], head);
    let mut want = head.to_vec();
    want.extend_from_slice(&[b'x'; 1024 - 26]);
    want.extend_from_slice(limit_exceeded_message(1024).as_bytes());
    assert_eq!(got, want);
    assert_eq!(out.bytesize, want.len() as u64);
}

#[tokio::test]
async fn update_is_retried_on_202_until_200() {
    let fake = Fake::start(|_, earlier| {
        if earlier.len() < 2 {
            (202, vec![], vec![])
        } else {
            (200, vec![], vec![])
        }
    })
    .await;
    let update = PendingUpdate::new(
        &job(3),
        JobState::Failed,
        Some(slipway_job::FailureReason::ImagePullFailure),
        Some(1),
        Some(OutputInfo {
            checksum: "crc32:0000abcd".into(),
            bytesize: 42,
        }),
    );
    let out = fake
        .client()
        .finish_job(
            update,
            UpdateRetryPolicy {
                backoff: fast(),
                max_attempts: 10,
            },
            &CancellationToken::new(),
        )
        .await;
    assert!(matches!(out, FinishOutcome::Accepted), "{out:?}");
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 3);
    let body = reqs[2].json();
    assert_eq!(reqs[2].method, Method::PUT);
    assert_eq!(reqs[2].path, "/api/v4/jobs/3");
    assert_eq!(body["token"], "glcbt-job-secret");
    assert_eq!(body["state"], "failed");
    // Not listed by the server (empty features.failure_reasons) → GitLab Runner's fallback.
    assert_eq!(body["failure_reason"], "runner_system_failure");
    assert_eq!(body["exit_code"], 1);
    assert_eq!(body["checksum"], "crc32:0000abcd");
    assert_eq!(
        body["output"],
        json!({"checksum": "crc32:0000abcd", "bytesize": 42})
    );
    assert_eq!(body["info"]["name"], "slipway");
}

#[tokio::test]
async fn undelivered_final_state_is_handed_back_and_resent_after_restart() {
    let fake = Fake::start(|_, _| (500, vec![], b"boom glcbt-job-secret".to_vec())).await;
    let update = PendingUpdate::new(&job(4), JobState::Success, None, Some(0), None);
    let out = fake
        .client()
        .finish_job(
            update.clone(),
            UpdateRetryPolicy {
                backoff: fast(),
                max_attempts: 3,
            },
            &CancellationToken::new(),
        )
        .await;
    let FinishOutcome::Undelivered {
        update: back,
        last_error,
    } = out
    else {
        panic!("expected undelivered, got {out:?}");
    };
    assert_eq!(back, update);
    let err = last_error.unwrap();
    assert!(
        matches!(err, GitlabError::RetryLater { status: 500, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("PUT /api/v4/jobs/4"));
    assert!(!format!("{err} {err:?} {back:?}").contains("job-secret"));
    assert_eq!(fake.requests().len(), 3);

    // The manager keeps it (JSON in its state store) and resends after a restart.
    let stored = serde_json::to_string(&back).unwrap();
    let healthy = Fake::start(|_, _| (200, vec![], vec![])).await;
    let restored: PendingUpdate = serde_json::from_str(&stored).unwrap();
    let out = healthy
        .client()
        .finish_job(
            restored,
            UpdateRetryPolicy::default(),
            &CancellationToken::new(),
        )
        .await;
    assert!(matches!(out, FinishOutcome::Accepted), "{out:?}");
    assert_eq!(healthy.requests()[0].json()["state"], "success");
}

#[tokio::test]
async fn network_errors_are_retried_then_handed_back() {
    // A port nothing listens on.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    drop(listener);
    let info = VersionInfo::new("shell", "bash", []);
    let c = GitlabClient::new(ClientConfig::new(url, info)).unwrap();
    let update = PendingUpdate::new(&job(6), JobState::Success, None, Some(0), None);
    let out = c
        .finish_job(
            update,
            UpdateRetryPolicy {
                backoff: fast(),
                max_attempts: 2,
            },
            &CancellationToken::new(),
        )
        .await;
    let FinishOutcome::Undelivered { last_error, .. } = out else {
        panic!("expected undelivered, got {out:?}");
    };
    let err = last_error.unwrap();
    assert!(matches!(err, GitlabError::Network { .. }), "{err:?}");
    assert!(err.is_retryable());
}

#[test]
fn bad_urls_are_rejected() {
    let info = VersionInfo::new("shell", "bash", []);
    for url in ["ftp://gitlab", "gitlab.example.com", "http://x/?a=b"] {
        let err = GitlabClient::new(ClientConfig::new(url, info.clone())).unwrap_err();
        assert!(
            matches!(err, GitlabError::InvalidUrl { .. }),
            "{url}: {err:?}"
        );
    }
}
