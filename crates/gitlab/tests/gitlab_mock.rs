//! The GitLab client against `gitlab-runner-mock`, an independent mock of GitLab's runner API.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use gitlab_runner_mock::{GitlabRunnerMock, MockJobState, MockJobStepName, MockJobStepWhen};
use slipway_gitlab::{
    Backoff, ClientConfig, FinishOutcome, GitlabClient, GitlabError, JobState, PendingUpdate,
    Poller, PollerConfig, RemoteJobState, Secret, SystemId, TraceConfig, TraceSender,
    UpdateRetryPolicy, VersionInfo, crc32,
};
use slipway_job::{FailureReason, JobResponse, StepName};
use tokio_util::sync::CancellationToken;

fn client(mock: &GitlabRunnerMock) -> GitlabClient {
    let info = VersionInfo::new("shell", "bash", [("variables".to_string(), true)]);
    GitlabClient::new(ClientConfig::new(mock.uri().as_str(), info)).unwrap()
}

fn fast_policy() -> UpdateRetryPolicy {
    UpdateRetryPolicy {
        backoff: Backoff {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(20),
        },
        max_attempts: 5,
    }
}

fn queue_job(mock: &GitlabRunnerMock, name: &str) -> u64 {
    let mut b = mock.job_builder(name.to_string());
    b.add_step(
        MockJobStepName::Script,
        vec!["echo hello".into(), "make".into()],
        3600,
        MockJobStepWhen::OnSuccess,
        false,
    );
    b.add_variable("SECRET".into(), "hunter22".into(), false, true);
    let job = b.build();
    let id = job.id();
    mock.enqueue_job(job);
    id
}

async fn request(mock: &GitlabRunnerMock, c: &GitlabClient) -> Box<JobResponse> {
    let token = Secret::new(mock.runner_token());
    c.request_job(&token, &SystemId::generate(), None)
        .await
        .unwrap()
        .job
        .expect("a job is queued")
}

fn sender_for(c: &GitlabClient, job: &JobResponse, config: TraceConfig) -> TraceSender {
    TraceSender::new(c.clone(), job.id, Secret::new(job.token.clone()), config)
}

#[tokio::test]
async fn requests_a_queued_job_and_parses_the_payload() {
    let mock = GitlabRunnerMock::start().await;
    let c = client(&mock);
    let token = Secret::new(mock.runner_token());
    let sid = SystemId::generate();

    let none = c.request_job(&token, &sid, None).await.unwrap();
    assert!(none.job.is_none(), "empty queue answers 204");

    let id = queue_job(&mock, "build");
    let job = c
        .request_job(&token, &sid, None)
        .await
        .unwrap()
        .job
        .unwrap();
    assert_eq!(job.id, id);
    assert!(!job.token.is_empty());
    assert_eq!(job.job_info.name, "build");
    assert_eq!(job.job_info.stage, "build");
    assert_eq!(job.job_info.project_id, 4);
    assert_eq!(job.git_info.git_ref, "custom");
    assert_eq!(job.git_info.sha, "265c14cf140a66cfc61e40e4ab45c95ba8df5ed1");
    assert_eq!(job.git_info.refspecs.len(), 2);
    assert_eq!(job.git_info.depth, 50);
    assert_eq!(job.runner_info.timeout, 3600);
    assert_eq!(job.steps[0].name, StepName::Script);
    assert_eq!(job.steps[0].script, vec!["echo hello", "make"]);
    assert_eq!(job.variable("SECRET"), Some("hunter22"));
    assert!(job.masked_values().contains(&"hunter22"));
    assert_eq!(job.credentials.len(), 2);
    assert!(job.image.is_none());
    assert!(
        job.features
            .failure_reasons
            .contains(&"script_failure".to_string())
    );
    assert_eq!(mock.get_job(id).unwrap().state(), MockJobState::Running);

    // The job is taken: nothing more.
    assert!(
        c.request_job(&token, &sid, None)
            .await
            .unwrap()
            .job
            .is_none()
    );
}

#[tokio::test]
async fn wrong_runner_token_is_forbidden_and_not_leaked() {
    let mock = GitlabRunnerMock::start().await;
    let c = client(&mock);
    let bad = Secret::new("glrt-not-the-token");
    let err = c
        .request_job(&bad, &SystemId::generate(), None)
        .await
        .unwrap_err();
    assert!(matches!(err, GitlabError::Forbidden { .. }), "{err:?}");
    let text = format!("{err} {err:?}");
    assert!(text.contains("POST /api/v4/jobs/request"), "{text}");
    assert!(!text.contains("not-the-token"), "{text}");
}

#[tokio::test]
async fn poller_polls_until_a_job_arrives_and_stops_on_cancel() {
    let mock = GitlabRunnerMock::start().await;
    let poller = Poller::new(
        client(&mock),
        Secret::new(mock.runner_token()),
        SystemId::generate(),
        PollerConfig {
            request_concurrency: 2,
            check_interval: Duration::from_millis(10),
            backoff: Backoff::default(),
        },
    );
    let cancel = CancellationToken::new();

    // Empty queue: the poller keeps asking (check_interval) until a job is queued.
    let (job, ()) = tokio::join!(poller.next_job(&cancel), async {
        while mock.n_requests().await < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        queue_job(&mock, "late");
    });
    assert_eq!(job.unwrap().unwrap().job_info.name, "late");

    // Nothing queued and the caller cancels: no job, no error.
    let (job, ()) = tokio::join!(poller.next_job(&cancel), async {
        let before = mock.n_requests().await;
        while mock.n_requests().await < before + 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        cancel.cancel();
    });
    assert!(job.unwrap().is_none());
}

#[tokio::test]
async fn trace_arrives_complete_and_in_order_then_success() {
    let mock = GitlabRunnerMock::start().await;
    queue_job(&mock, "build");
    let c = client(&mock);
    let job = request(&mock, &c).await;
    let sender = sender_for(
        &c,
        &job,
        TraceConfig {
            max_patch_size: 16,
            ..TraceConfig::default()
        },
    );
    let mut expected = Vec::new();
    for i in 0..10 {
        let line = format!("line {i}: \x1b[32mok\x1b[0m ünïcødé\n");
        sender.append(line.as_bytes());
        expected.extend_from_slice(line.as_bytes());
        if i % 3 == 0 {
            assert_eq!(sender.flush().await.unwrap(), RemoteJobState::Running);
        }
    }
    let cancel = CancellationToken::new();
    let output = sender.finish(&cancel).await.unwrap();
    let mock_job = mock.get_job(job.id).unwrap();
    assert_eq!(mock_job.log(), expected, "byte-identical trace");
    assert!(mock_job.log_patches() > 5, "sent in several PATCHes");
    assert_eq!(output.bytesize, expected.len() as u64);
    assert_eq!(
        output.checksum,
        format!("crc32:{:08x}", crc32(&mock_job.log()))
    );

    let update = PendingUpdate::new(&job, JobState::Success, None, Some(0), Some(output));
    let out = c.finish_job(update, fast_policy(), &cancel).await;
    assert!(matches!(out, FinishOutcome::Accepted), "{out:?}");
    assert_eq!(mock_job.state(), MockJobState::Success);
}

#[tokio::test]
async fn failed_job_is_reported_failed() {
    let mock = GitlabRunnerMock::start().await;
    queue_job(&mock, "test");
    let c = client(&mock);
    let job = request(&mock, &c).await;
    let sender = sender_for(&c, &job, TraceConfig::default());
    sender.append(b"$ make test\nerror: 1 test failed\n");
    let cancel = CancellationToken::new();
    let output = sender.finish(&cancel).await.unwrap();
    let update = PendingUpdate::new(
        &job,
        JobState::Failed,
        Some(FailureReason::ScriptFailure),
        Some(2),
        Some(output),
    );
    assert_eq!(update.failure_reason.as_deref(), Some("script_failure"));
    let out = c.finish_job(update, fast_policy(), &cancel).await;
    assert!(matches!(out, FinishOutcome::Accepted), "{out:?}");
    let mock_job = mock.get_job(job.id).unwrap();
    assert_eq!(mock_job.state(), MockJobState::Failed);
    assert_eq!(mock_job.log(), b"$ make test\nerror: 1 test failed\n");
}

#[tokio::test]
async fn cancel_in_gitlab_reaches_the_trace_sender() {
    let mock = GitlabRunnerMock::start().await;
    queue_job(&mock, "long");
    let c = client(&mock);
    let job = request(&mock, &c).await;
    let sender = sender_for(&c, &job, TraceConfig::default());
    let abort = sender.abort_token();
    sender.append(b"working...\n");
    sender.flush().await.unwrap();
    assert!(!abort.is_cancelled());

    mock.get_job(job.id).unwrap().cancel();
    sender.append(b"still working...\n");
    let status = sender.flush().await.unwrap();
    assert_eq!(status, RemoteJobState::Canceled);
    assert!(abort.is_cancelled(), "cancel reached the sender");

    // The final update finds the job gone; nothing to retry.
    let update = PendingUpdate::new(&job, JobState::Failed, None, None, None);
    let out = c
        .finish_job(update, fast_policy(), &CancellationToken::new())
        .await;
    assert!(
        matches!(out, FinishOutcome::JobGone { status: 403 }),
        "{out:?}"
    );
}

#[tokio::test]
async fn run_loop_uploads_until_stopped_and_adopts_gitlab_interval() {
    let mock = GitlabRunnerMock::start().await;
    queue_job(&mock, "loop");
    let c = client(&mock);
    let job = request(&mock, &c).await;
    let sender = sender_for(
        &c,
        &job,
        TraceConfig {
            update_interval: Duration::from_millis(10),
            ..TraceConfig::default()
        },
    );
    let stop = CancellationToken::new();
    let mock_job = mock.get_job(job.id).unwrap();
    tokio::join!(sender.run(&stop), async {
        sender.append(b"first\n");
        while mock_job.log().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.cancel();
    });
    assert_eq!(mock_job.log(), b"first\n");
    // GitLab's interval (the mock sends 3 s) replaces the configured one.
    assert_eq!(sender.update_interval(), Duration::from_secs(3));
}
