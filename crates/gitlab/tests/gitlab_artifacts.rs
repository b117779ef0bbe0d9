//! Artifact upload and download against small loopback servers of our own (statuses, retries,
//! redirects to a second host) and against `gitlab-runner-mock`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use axum::http::Method;
use gitlab_runner_mock::{GitlabRunnerMock, MockJobStepName, MockJobStepWhen};
use slipway_gitlab::{
    ClientConfig, GitlabClient, GitlabError, Secret, SystemId, UploadOptions, VersionInfo,
};

const JOB_TOKEN: &str = "glcbt-artifact-secret";

mod common;

use common::{Fake as Server, Req};

/// The client these tests use.
trait ServerClient {
    fn client(&self) -> GitlabClient;
}

impl ServerClient for Server {
    fn client(&self) -> GitlabClient {
        client_for(&self.url)
    }
}

fn client_for(url: &str) -> GitlabClient {
    let info = VersionInfo::new("shell", "bash", [("artifacts".to_string(), true)]);
    GitlabClient::new(ClientConfig::new(url, info)).unwrap()
}

fn zip_options() -> UploadOptions {
    UploadOptions {
        name: None,
        artifact_type: "archive".into(),
        artifact_format: "zip".into(),
        expire_in: Some("1 week".into()),
    }
}

/// The parts of a `multipart/form-data` body: (name, filename, content).
fn parse_multipart(req: &Req) -> Vec<(String, Option<String>, Vec<u8>)> {
    let content_type = req.header("content-type").unwrap();
    let boundary = content_type
        .strip_prefix("multipart/form-data; boundary=")
        .expect("multipart content type");
    let delimiter = format!("--{boundary}");
    let body = &req.body;
    let mut parts = Vec::new();
    let positions: Vec<usize> = (0..body.len())
        .filter(|&i| body[i..].starts_with(delimiter.as_bytes()))
        .collect();
    for pair in positions.windows(2) {
        // Each part: delimiter, CRLF, headers, CRLF CRLF, content, CRLF, next delimiter.
        let part = &body[pair[0] + delimiter.len() + 2..pair[1] - 2];
        let split = part.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        let headers = std::str::from_utf8(&part[..split]).unwrap();
        let content = part[split + 4..].to_vec();
        let disposition = headers
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("content-disposition"))
            .unwrap();
        let field = |key: &str| {
            disposition
                .split(';')
                .map(str::trim)
                .find_map(|kv| kv.strip_prefix(&format!("{key}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
        };
        parts.push((field("name").unwrap(), field("filename"), content));
    }
    assert!(body.ends_with(format!("--{boundary}--\r\n").as_bytes()));
    parts
}

#[tokio::test]
async fn upload_sends_the_archive_query_and_job_token() {
    let server = Server::start(|_, _| (201, vec![], b"{}".to_vec())).await;
    let archive: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    server
        .client()
        .upload_artifacts(42, &Secret::new(JOB_TOKEN), archive.clone(), &zip_options())
        .await
        .unwrap();

    let reqs = server.requests();
    assert_eq!(reqs.len(), 1);
    let req = &reqs[0];
    assert_eq!(req.method, Method::POST);
    assert_eq!(req.path, "/api/v4/jobs/42/artifacts");
    assert_eq!(
        req.query,
        "artifact_format=zip&artifact_type=archive&expire_in=1%20week"
    );
    assert_eq!(req.header("job-token"), Some(JOB_TOKEN));
    let parts = parse_multipart(req);
    let file = parts.iter().find(|p| p.0 == "file").unwrap();
    assert_eq!(file.1.as_deref(), Some("artifacts.zip"));
    assert!(file.2 == archive, "archive arrives byte for byte");
}

#[tokio::test]
async fn gzip_uploads_are_named_after_the_artifact() {
    let server = Server::start(|_, _| (201, vec![], vec![])).await;
    let opts = UploadOptions {
        name: Some("junit".into()),
        artifact_type: "junit".into(),
        artifact_format: "gzip".into(),
        expire_in: None,
    };
    server
        .client()
        .upload_artifacts(7, &Secret::new(JOB_TOKEN), b"\x1f\x8b...".to_vec(), &opts)
        .await
        .unwrap();
    let req = &server.requests()[0];
    assert_eq!(req.query, "artifact_format=gzip&artifact_type=junit");
    let parts = parse_multipart(req);
    assert_eq!(
        parts.iter().find(|p| p.0 == "file").unwrap().1.as_deref(),
        Some("junit.gz")
    );
}

#[tokio::test]
async fn upload_retries_a_503_once_then_succeeds() {
    let server = Server::start(|_, earlier| {
        let n = earlier.len();
        if n == 0 {
            (503, vec![], b"busy".to_vec())
        } else {
            (201, vec![], vec![])
        }
    })
    .await;
    server
        .client()
        .upload_artifacts(1, &Secret::new(JOB_TOKEN), b"PK".to_vec(), &zip_options())
        .await
        .unwrap();
    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].body, reqs[1].body, "the same body is sent again");
}

#[tokio::test]
async fn upload_gives_up_after_three_retries() {
    let server = Server::start(|_, _| (502, vec![("retry-after", "0".into())], vec![])).await;
    let err = server
        .client()
        .upload_artifacts(1, &Secret::new(JOB_TOKEN), b"PK".to_vec(), &zip_options())
        .await
        .unwrap_err();
    assert!(
        matches!(err, GitlabError::RetryLater { status: 502, .. }),
        "{err}"
    );
    assert_eq!(server.requests().len(), 4, "first attempt and 3 retries");
}

#[tokio::test]
async fn upload_too_large_is_not_retried() {
    let server = Server::start(|_, _| (413, vec![], JOB_TOKEN.as_bytes().to_vec())).await;
    let started = Instant::now();
    let err = server
        .client()
        .upload_artifacts(1, &Secret::new(JOB_TOKEN), vec![0; 1000], &zip_options())
        .await
        .unwrap_err();
    assert!(err.is_too_large(), "{err}");
    let text = err.to_string();
    assert!(text.contains("too large"), "{text}");
    assert!(!text.contains(JOB_TOKEN), "{text}");
    assert_eq!(server.requests().len(), 1);
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn upload_forbidden_gives_up() {
    let server = Server::start(|_, _| (403, vec![], vec![])).await;
    let err = server
        .client()
        .upload_artifacts(1, &Secret::new(JOB_TOKEN), vec![1], &zip_options())
        .await
        .unwrap_err();
    assert!(matches!(err, GitlabError::Forbidden { .. }), "{err}");
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn download_follows_a_redirect_to_another_host_without_the_job_token() {
    let storage = Server::start(|_, _| (200, vec![], b"PK zip bytes".to_vec())).await;
    let target = format!("{}bucket/artifacts.zip?X-Amz-Signature=s3cr3t", storage.url);
    let gitlab = Server::start(move |_, _| (302, vec![("location", target.clone())], vec![])).await;

    let bytes = gitlab
        .client()
        .download_artifacts(9, &Secret::new(JOB_TOKEN))
        .await
        .unwrap();
    assert_eq!(&bytes[..], b"PK zip bytes");

    let to_gitlab = gitlab.requests();
    assert_eq!(to_gitlab.len(), 1);
    assert_eq!(to_gitlab[0].path, "/api/v4/jobs/9/artifacts");
    assert_eq!(to_gitlab[0].header("job-token"), Some(JOB_TOKEN));
    let to_storage = storage.requests();
    assert_eq!(to_storage.len(), 1);
    assert_eq!(to_storage[0].path, "/bucket/artifacts.zip");
    assert_eq!(to_storage[0].query, "X-Amz-Signature=s3cr3t");
    assert!(
        to_storage[0].header("job-token").is_none(),
        "job token leaked to object storage"
    );
}

#[tokio::test]
async fn download_keeps_the_token_on_same_host_redirects_and_retries_5xx() {
    let gitlab = Server::start(|req, earlier| match (req.path.as_str(), earlier.len()) {
        ("/api/v4/jobs/3/artifacts", 0) => (500, vec![], vec![]),
        ("/api/v4/jobs/3/artifacts", _) => (307, vec![("location", "/blobs/3".into())], vec![]),
        ("/blobs/3", _) => (200, vec![], b"zip".to_vec()),
        _ => (500, vec![], vec![]),
    })
    .await;
    let bytes = gitlab
        .client()
        .download_artifacts(3, &Secret::new(JOB_TOKEN))
        .await
        .unwrap();
    assert_eq!(&bytes[..], b"zip");
    let reqs = gitlab.requests();
    assert_eq!(reqs.len(), 3);
    assert_eq!(reqs[2].path, "/blobs/3");
    assert_eq!(reqs[2].header("job-token"), Some(JOB_TOKEN));
}

#[tokio::test]
async fn download_404_says_there_are_no_artifacts() {
    let gitlab =
        Server::start(|_, _| (404, vec![], b"{\"message\":\"404 Not Found\"}".to_vec())).await;
    let err = gitlab
        .client()
        .download_artifacts(5, &Secret::new(JOB_TOKEN))
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert!(err.to_string().contains("no artifacts"), "{err}");
    assert_eq!(gitlab.requests().len(), 1, "404 is not retried");
}

#[tokio::test]
async fn download_stops_after_five_redirects() {
    let gitlab = Server::start(|_, earlier| {
        let n = earlier.len();
        (302, vec![("location", format!("/loop/{n}"))], vec![])
    })
    .await;
    let err = gitlab
        .client()
        .download_artifacts(5, &Secret::new(JOB_TOKEN))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("redirects"), "{err}");
    assert_eq!(gitlab.requests().len(), 6);
}

/// A zip archive built by `slipway-artifacts` from a tar stream, as the manager will.
fn artifacts_zip() -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(6);
    header.set_mode(0o755);
    tar.append_data(&mut header, "./out/run.sh", &b"echo\n\n"[..])
        .unwrap();
    let tar = tar.into_inner().unwrap();
    slipway_artifacts::archive_from_tar(&tar, slipway_artifacts::Format::Zip, &|_| true)
        .unwrap()
        .bytes
}

#[tokio::test]
async fn mock_stores_the_upload_and_serves_it_back() {
    let mock = GitlabRunnerMock::start().await;
    let mut builder = mock.job_builder("build".to_string());
    builder.add_step(
        MockJobStepName::Script,
        vec!["make".into()],
        3600,
        MockJobStepWhen::OnSuccess,
        false,
    );
    mock.enqueue_job(builder.build());

    let client = client_for(mock.uri().as_str());
    let job = client
        .request_job(
            &Secret::new(mock.runner_token()),
            &SystemId::generate(),
            None,
        )
        .await
        .unwrap()
        .job
        .expect("a job is queued");
    let token = Secret::new(job.token.clone());
    let zip = artifacts_zip();
    let opts = UploadOptions {
        expire_in: None,
        ..zip_options()
    };
    client
        .upload_artifacts(job.id, &token, zip.clone(), &opts)
        .await
        .unwrap();

    let stored: Vec<_> = mock.get_job(job.id).unwrap().uploaded_artifacts().collect();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].filename.as_deref(), Some("artifacts.zip"));
    assert_eq!(stored[0].artifact_type.as_deref(), Some("archive"));
    assert_eq!(stored[0].artifact_format.as_deref(), Some("zip"));
    assert_eq!(stored[0].data.as_slice(), zip.as_slice());

    let downloaded = client.download_artifacts(job.id, &token).await.unwrap();
    assert_eq!(&downloaded[..], zip.as_slice());
    let tar = slipway_artifacts::zip_to_tar(&downloaded).unwrap();
    let mut unpacked = tar::Archive::new(tar.as_slice());
    let entry = unpacked.entries().unwrap().next().unwrap().unwrap();
    assert_eq!(entry.path().unwrap().to_str(), Some("out/run.sh"));
    assert_eq!(entry.header().mode().unwrap(), 0o755);

    // The same through files, streamed: what large archives take.
    let dir = tempfile::tempdir().unwrap();
    let (up, down) = (dir.path().join("up.zip"), dir.path().join("down.zip"));
    std::fs::write(&up, &zip).unwrap();
    let named = UploadOptions {
        name: Some("from-file".into()),
        ..opts.clone()
    };
    client
        .upload_artifacts_file(job.id, &token, &up, &named)
        .await
        .unwrap();
    let stored: Vec<_> = mock.get_job(job.id).unwrap().uploaded_artifacts().collect();
    assert_eq!(stored.len(), 2);
    assert_eq!(stored[1].filename.as_deref(), Some("from-file.zip"));
    assert_eq!(stored[1].data.as_slice(), zip.as_slice());
    client
        .download_artifacts_to(job.id, &token, &down)
        .await
        .unwrap();
    assert_eq!(std::fs::read(&down).unwrap(), zip);
    let missing = dir.path().join("missing.zip");
    let err = client
        .upload_artifacts_file(job.id, &token, &missing, &named)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("missing.zip"), "{err}");

    let err = client
        .upload_artifacts(job.id, &Secret::new("wrong"), zip, &opts)
        .await
        .unwrap_err();
    assert!(matches!(err, GitlabError::Forbidden { .. }), "{err}");
}
