//! `include:remote` against a loopback HTTP server started here: a reachable file is included
//! (through a redirect too), and an unreachable one fails with the URL and the cause.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use slipway_pipeline::{Pipeline, PipelineOptions};

const REMOTE: &str = "\
remote-build:
  stage: build
  script: [echo from remote]
";

/// Serves `/ci/jobs.yml`, `/moved` (a redirect to it) and 404 elsewhere, on 127.0.0.1.
async fn serve() -> String {
    let app = Router::new()
        .route("/ci/jobs.yml", get(|| async { REMOTE }))
        .route(
            "/moved",
            get(|| async {
                (StatusCode::FOUND, [(header::LOCATION, "/ci/jobs.yml")]).into_response()
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// Reads `ci` as the project's `.gitlab-ci.yml` on a blocking thread, as `slipway exec` does.
async fn read(dir: &Path, ci: String) -> Result<Pipeline, String> {
    let file = dir.join(".gitlab-ci.yml");
    std::fs::write(&file, ci).unwrap();
    tokio::task::spawn_blocking(move || {
        Pipeline::from_file(&file, PipelineOptions::default()).map_err(|e| e.to_string())
    })
    .await
    .unwrap()
}

fn names(p: &Pipeline) -> Vec<&str> {
    p.jobs.iter().map(|j| j.name.as_str()).collect()
}

#[tokio::test]
async fn a_reachable_remote_file_is_included() {
    let url = serve().await;
    let dir = tempfile::tempdir().unwrap();
    for include in [
        format!("include:\n  - remote: {url}/ci/jobs.yml\n"),
        format!("include: {url}/ci/jobs.yml\n"),
        format!("include:\n  - remote: {url}/moved\n"),
    ] {
        let ci = format!("{include}local-test:\n  script: [echo local]\n");
        let p = read(dir.path(), ci).await.unwrap();
        assert_eq!(names(&p), ["remote-build", "local-test"], "{include}");
    }
}

#[tokio::test]
async fn a_missing_remote_file_fails_naming_the_url_and_the_status() {
    let url = serve().await;
    let dir = tempfile::tempdir().unwrap();
    let missing = format!("{url}/ci/missing.yml");
    let err = read(
        dir.path(),
        format!("job:\n  script: [x]\ninclude:\n  - remote: {missing}\n"),
    )
    .await
    .unwrap_err();
    assert!(err.contains(&format!(".gitlab-ci.yml:4: include: {missing}: include:remote could not be fetched: the server answered HTTP 404 Not Found")), "{err}");
}

#[tokio::test]
async fn an_unreachable_remote_fails_naming_the_url_and_the_cause() {
    // A port nobody listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("http://127.0.0.1:{port}/ci.yml");
    let err = read(dir.path(), format!("include: {url}\njob:\n  script: [x]\n"))
        .await
        .unwrap_err();
    assert!(
        err.contains(&format!(
            ".gitlab-ci.yml:1: include: {url}: include:remote could not be fetched: "
        )),
        "{err}"
    );
    assert!(err.contains("Connection refused"), "{err}");
}

#[tokio::test]
async fn https_goes_through_tls() {
    // An HTTPS URL at a plain HTTP server: the TLS handshake fails, and says so.
    let url = serve().await.replace("http://", "https://");
    let dir = tempfile::tempdir().unwrap();
    let err = read(
        dir.path(),
        format!("include: {url}/ci/jobs.yml\njob:\n  script: [x]\n"),
    )
    .await
    .unwrap_err();
    assert!(
        err.contains(&format!(
            "include: {url}/ci/jobs.yml: include:remote could not be fetched: "
        )),
        "{err}"
    );
}

#[tokio::test]
async fn integrity_is_checked_and_secrets_in_the_url_are_not_shown() {
    let url = serve().await;
    let dir = tempfile::tempdir().unwrap();
    // `printf '%s' "$REMOTE" | openssl dgst -sha256 -binary | base64`
    let good = "sha256-xFZmb0UKsmDikeovLzyclPKaEHyJD9aZwW6xgaA5Vzw=";
    let ci = |integrity: &str| {
        format!(
            "include:\n  - remote: {url}/ci/jobs.yml\n    integrity: '{integrity}'\njob:\n  script: [x]\n"
        )
    };
    let p = read(dir.path(), ci(good)).await.unwrap();
    assert_eq!(names(&p), ["remote-build", "job"]);
    let err = read(dir.path(), ci("sha256-AAAA")).await.unwrap_err();
    assert!(err.contains("fails its integrity check"), "{err}");
    // A token in the query never reaches the message.
    let err = read(
        dir.path(),
        format!("include:\n  - remote: '{url}/ci/missing.yml?private_token=s3cret'\njob:\n  script: [x]\n"),
    )
    .await
    .unwrap_err();
    assert!(err.contains("HTTP 404"), "{err}");
    assert!(!err.contains("s3cret"), "{err}");
}
