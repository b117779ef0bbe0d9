//! `FakeGitlab` driven with plain hyper client calls on loopback: the job flow, 416 resync,
//! cancellation, outages, artifacts up and down.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use slipway_testkit::gitlab::{FakeGitlab, Outage, job_payload, job_payload_with_vars};
use tokio::task::JoinHandle;

/// One keep-alive HTTP/1 connection to the fake; its connection task is aborted on drop.
struct Conn {
    sender: SendRequest<Full<Bytes>>,
    task: JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Debug)]
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

impl Conn {
    async fn open(gl: &FakeGitlab) -> Result<Conn, String> {
        let stream = tokio::net::TcpStream::connect(gl.addr())
            .await
            .map_err(|e| e.to_string())?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        let task = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn { sender, task })
    }

    async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Answer, String> {
        self.sender.ready().await.map_err(|e| e.to_string())?;
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "127.0.0.1");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(body.into())).unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(5), self.sender.send_request(req))
            .await
            .map_err(|_| "timed out".to_string())?
            .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(Answer {
            status,
            headers,
            body,
        })
    }
}

/// One request on a fresh connection.
async fn call(
    gl: &FakeGitlab,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Result<Answer, String> {
    Conn::open(gl)
        .await?
        .send(method, path, headers, body)
        .await
}

async fn post_json(gl: &FakeGitlab, path: &str, body: Value) -> Answer {
    call(
        gl,
        "POST",
        path,
        &[("content-type", "application/json")],
        body.to_string(),
    )
    .await
    .unwrap()
}

async fn request_job(gl: &FakeGitlab) -> Answer {
    post_json(
        gl,
        "/api/v4/jobs/request",
        json!({
            "token": gl.runner_token(),
            "system_id": "s_0123456789ab",
            "info": {"name": "slipway", "features": {"trace_checksum": true, "cancelable": true}},
            "last_update": "",
        }),
    )
    .await
}

async fn patch(gl: &FakeGitlab, id: u64, token: &str, start: usize, data: &str) -> Answer {
    let range = format!("{start}-{}", start + data.len() - 1);
    call(
        gl,
        "PATCH",
        &format!("/api/v4/jobs/{id}/trace"),
        &[
            ("job-token", token),
            ("content-range", &range),
            ("content-type", "text/plain"),
        ],
        data.to_owned(),
    )
    .await
    .unwrap()
}

async fn put(gl: &FakeGitlab, id: u64, token: &str, state: &str) -> Answer {
    let body = json!({"token": token, "state": state, "exit_code": 0,
        "output": {"checksum": "crc32:00000000", "bytesize": 0}});
    call(
        gl,
        "PUT",
        &format!("/api/v4/jobs/{id}"),
        &[("content-type", "application/json")],
        body.to_string(),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn runner_registration_and_verify() {
    let gl = FakeGitlab::start().await;
    assert!(gl.url().starts_with("http://127.0.0.1:") && !gl.url().ends_with('/'));
    let ok = post_json(
        &gl,
        "/api/v4/runners/verify",
        json!({"token": gl.runner_token(), "system_id": "s_1"}),
    )
    .await;
    assert_eq!(ok.status, 200);
    assert_eq!(ok.json()["token"], gl.runner_token());
    assert_eq!(ok.json()["token_expires_at"], Value::Null);
    let bad = post_json(&gl, "/api/v4/runners/verify", json!({"token": "glrt-nope"})).await;
    assert_eq!(bad.status, 403);

    let reg = post_json(
        &gl,
        "/api/v4/runners",
        json!({"token": gl.registration_token()}),
    )
    .await;
    assert_eq!(reg.status, 201);
    let new_token = reg.json()["token"].as_str().unwrap().to_owned();
    assert!(
        !new_token.starts_with("glrt-"),
        "a registered runner's token has no prefix"
    );
    assert_ne!(new_token, gl.runner_token());
    let v = post_json(&gl, "/api/v4/runners/verify", json!({"token": new_token})).await;
    assert_eq!(v.status, 200);
    assert_eq!(v.json()["id"], reg.json()["id"]);
    let refused = post_json(&gl, "/api/v4/runners", json!({"token": "GR1348941wrong"})).await;
    assert_eq!(refused.status, 403);

    let del = call(
        &gl,
        "DELETE",
        "/api/v4/runners",
        &[("content-type", "application/json")],
        json!({"token": new_token}).to_string(),
    )
    .await
    .unwrap();
    assert_eq!(del.status, 204);
    // A deleted runner's token is refused from then on.
    let gone = post_json(&gl, "/api/v4/runners/verify", json!({"token": new_token})).await;
    assert_eq!(gone.status, 403);
}

#[tokio::test]
async fn job_request_trace_resync_and_final_update() {
    let gl = FakeGitlab::start().await;
    gl.set_update_accepted_after(2);

    let none = request_job(&gl).await;
    assert_eq!(none.status, 204);
    let lu0 = none.header("x-gitlab-last-update").unwrap().to_owned();

    let id = gl.enqueue(job_payload_with_vars(
        "build",
        &["echo hi"],
        &[("FOO", "bar")],
    ));
    assert_eq!(gl.job(id).unwrap().state, "pending");
    let wrong = post_json(&gl, "/api/v4/jobs/request", json!({"token": "glrt-wrong"})).await;
    assert_eq!(wrong.status, 403);

    let got = request_job(&gl).await;
    assert_eq!(got.status, 201);
    assert_ne!(got.header("x-gitlab-last-update").unwrap(), lu0);
    let job = got.json();
    assert_eq!(job["id"], id);
    let token = job["token"].as_str().unwrap().to_owned();
    assert!(token.starts_with("glcbt-"));
    assert_eq!(job["job_info"]["name"], "build");
    assert_eq!(job["steps"][0]["script"], json!(["echo hi"]));
    let vars = job["variables"].as_array().unwrap();
    let var = |k: &str| vars.iter().find(|v| v["key"] == k).unwrap().clone();
    assert_eq!(var("CI_JOB_ID")["value"], id.to_string());
    assert_eq!(var("CI_JOB_TOKEN")["value"], token);
    assert_eq!(var("CI_JOB_TOKEN")["masked"], true);
    assert_eq!(var("CI_SERVER_URL")["value"], gl.url());
    assert_eq!(var("FOO")["value"], "bar");
    assert_eq!(gl.job(id).unwrap().state, "running");
    assert_eq!(gl.last_features().unwrap()["cancelable"], true);
    assert_eq!(request_job(&gl).await.status, 204);

    // Trace: wrong token, then 0..6, then a gap (416 with Range 0-6), then the resync.
    assert_eq!(
        patch(&gl, id, "glcbt-wrong", 0, "hello\n").await.status,
        403
    );
    let a = patch(&gl, id, &token, 0, "hello\n").await;
    assert_eq!(a.status, 202);
    assert_eq!(a.header("job-status"), Some("running"));
    assert_eq!(a.header("x-gitlab-trace-update-interval"), Some("1"));
    assert_eq!(a.header("range"), Some("0-6"));
    let gap = patch(&gl, id, &token, 10, "lost\n").await;
    assert_eq!(gap.status, 416);
    assert_eq!(gap.header("range"), Some("0-6"));
    assert_eq!(gap.header("job-status"), Some("running"));
    let again = patch(&gl, id, &token, 0, "hello\n").await;
    assert_eq!(again.status, 416, "a resend of stored bytes is refused too");
    gl.set_trace_update_interval(3);
    let b = patch(&gl, id, &token, 6, "world\n").await;
    assert_eq!(b.status, 202);
    assert_eq!(b.header("x-gitlab-trace-update-interval"), Some("3"));
    let rec = gl.job(id).unwrap();
    assert_eq!(rec.trace_text(), "hello\nworld\n");
    assert_eq!(rec.trace_patches, 2);

    // Final update: wrong token 403, keep-alive 200, two 202s, then 200, then idempotent.
    assert_eq!(put(&gl, id, "glcbt-wrong", "success").await.status, 403);
    let alive = put(&gl, id, &token, "running").await;
    assert_eq!(
        (alive.status, alive.header("job-status")),
        (200, Some("running"))
    );
    assert_eq!(put(&gl, id, &token, "success").await.status, 202);
    assert_eq!(gl.job(id).unwrap().state, "running");
    assert_eq!(put(&gl, id, &token, "success").await.status, 202);
    let done = put(&gl, id, &token, "success").await;
    assert_eq!(
        (done.status, done.header("job-status")),
        (200, Some("success"))
    );
    assert_eq!(put(&gl, id, &token, "success").await.status, 200);
    assert_eq!(put(&gl, id, &token, "failed").await.status, 403);
    let rec = gl.job(id).unwrap();
    assert_eq!(rec.state, "success");
    assert_eq!(rec.updates.len(), 6);
    assert_eq!(rec.update_statuses, vec![200, 202, 202, 200, 200, 403]);
    assert_eq!(rec.updates[1]["state"], "success");
    assert_eq!(rec.accepted_final_states(), vec!["success", "success"]);

    // Trace after the end is refused with the state.
    let late = patch(&gl, id, &token, 12, "late\n").await;
    assert_eq!(
        (late.status, late.header("job-status")),
        (403, Some("success"))
    );

    let reqs = gl.requests_to("/api/v4/jobs/request");
    assert_eq!(reqs.len(), 4);
    assert_eq!(reqs[0].status, 204);
    assert_eq!(reqs[0].json()["system_id"], "s_0123456789ab");
}

#[tokio::test]
async fn graceful_and_hard_cancel() {
    let gl = FakeGitlab::start().await;
    let a = gl.enqueue(job_payload("a", &["sleep 100"]));
    let b = gl.enqueue(job_payload("b", &["sleep 100"]));
    let queued = gl.enqueue(job_payload("c", &["true"]));
    let ta = request_job(&gl).await.json()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let tb = request_job(&gl).await.json()["token"]
        .as_str()
        .unwrap()
        .to_owned();

    // A queued job canceled never reaches a runner.
    gl.cancel(queued, false);
    assert_eq!(gl.job(queued).unwrap().state, "canceled");
    assert_eq!(request_job(&gl).await.status, 204);

    // Graceful: canceling shows in Job-Status; the runner's failed makes it canceled.
    gl.cancel(a, true);
    assert_eq!(gl.job(a).unwrap().state, "canceling");
    let p = patch(&gl, a, &ta, 0, "x").await;
    assert_eq!((p.status, p.header("job-status")), (202, Some("canceling")));
    let alive = put(&gl, a, &ta, "running").await;
    assert_eq!(alive.header("job-status"), Some("canceling"));
    let fin = put(&gl, a, &ta, "failed").await;
    assert_eq!(
        (fin.status, fin.header("job-status")),
        (200, Some("canceled"))
    );
    assert_eq!(gl.job(a).unwrap().state, "canceled");

    // Hard: trace and updates get 403 with Job-Status canceled.
    gl.cancel(b, false);
    let p = patch(&gl, b, &tb, 0, "x").await;
    assert_eq!((p.status, p.header("job-status")), (403, Some("canceled")));
    let u = put(&gl, b, &tb, "failed").await;
    assert_eq!((u.status, u.header("job-status")), (403, Some("canceled")));
    assert!(gl.job(b).unwrap().accepted_final_states().is_empty());
    assert!(
        gl.wait_for_state(b, "canceled", Duration::from_millis(50))
            .await
            .is_some()
    );
}

#[tokio::test]
async fn outages_then_recovery() {
    let gl = FakeGitlab::start().await;
    // A keep-alive connection opened before the outage.
    let mut kept = Conn::open(&gl).await.unwrap();
    let body = json!({"token": gl.runner_token()}).to_string();
    let ok = kept
        .send("POST", "/api/v4/jobs/request", &[], body.clone())
        .await
        .unwrap();
    assert_eq!(ok.status, 204);

    gl.set_outage(Outage::Unavailable);
    let u = request_job(&gl).await;
    assert_eq!(u.status, 503);
    assert_eq!(&u.body[..], b"GitLab is not responding");

    gl.set_outage(Outage::Drop);
    let dropped = call(&gl, "POST", "/api/v4/jobs/request", &[], body.clone()).await;
    assert!(dropped.is_err(), "{dropped:?}");
    let on_kept = kept
        .send("POST", "/api/v4/jobs/request", &[], body.clone())
        .await;
    assert!(on_kept.is_err(), "{on_kept:?}");
    // Object storage is not GitLab's API: it keeps answering.
    let os = call(&gl, "GET", "/object-storage/1?signature=x", &[], "")
        .await
        .unwrap();
    assert_eq!(os.status, 403);

    gl.set_outage(Outage::None);
    let id = gl.enqueue(job_payload("after", &["true"]));
    let r = request_job(&gl).await;
    assert_eq!((r.status, r.json()["id"].as_u64()), (201, Some(id)));

    let statuses: Vec<u16> = gl
        .requests_to("/api/v4/jobs/request")
        .iter()
        .map(|r| r.status)
        .collect();
    assert_eq!(statuses, vec![204, 503, 0, 0, 201]);
    assert_eq!(
        gl.requests_to("/api/v4/jobs/request")[2].json()["token"],
        gl.runner_token()
    );
}

fn multipart(boundary: &str, filename: &str, data: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nx\r\n\
             --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n\
             Content-Type: application/octet-stream\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(data);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    body
}

#[tokio::test]
async fn artifacts_upload_and_dependency_download() {
    let gl = FakeGitlab::start().await;
    let id = gl.enqueue(job_payload("build", &["make"]));
    let token = request_job(&gl).await.json()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let zip: Vec<u8> = b"PK\x03\x04\r\n--not-a-boundary\r\n\x00\xff".to_vec();
    let path = format!(
        "/api/v4/jobs/{id}/artifacts?artifact_format=zip&artifact_type=archive&expire_in=1%20week"
    );
    let ct = "multipart/form-data; boundary=b0undary42";
    let body = multipart("b0undary42", "artifacts.zip", &zip);

    let refused = call(
        &gl,
        "POST",
        &path,
        &[("job-token", "glcbt-x"), ("content-type", ct)],
        body.clone(),
    )
    .await
    .unwrap();
    assert_eq!(refused.status, 403);
    let up = call(
        &gl,
        "POST",
        &path,
        &[("job-token", &token), ("content-type", ct)],
        body,
    )
    .await
    .unwrap();
    assert_eq!(up.status, 201);
    let art = gl.job(id).unwrap().artifacts;
    assert_eq!(art.len(), 1);
    assert_eq!(art[0].filename, "artifacts.zip");
    assert_eq!(art[0].bytes, zip);
    assert_eq!(art[0].query["artifact_format"], "zip");
    assert_eq!(art[0].query["artifact_type"], "archive");
    assert_eq!(art[0].query["expire_in"], "1 week");

    // Download of an earlier job's artifacts (put by the test), by a running job's token.
    gl.put_artifact(500, "glcbt-earlier", b"PKzip".to_vec());
    let dl_path = "/api/v4/jobs/500/artifacts?direct_download=true";
    let none = call(&gl, "GET", dl_path, &[("job-token", "glcbt-x")], "")
        .await
        .unwrap();
    assert_eq!(none.status, 403);
    let redirect = call(&gl, "GET", dl_path, &[("job-token", &token)], "")
        .await
        .unwrap();
    assert_eq!(redirect.status, 302);
    let loc = redirect.header("location").unwrap().to_owned();
    let prefix = format!("{}/object-storage/500?signature=", gl.url());
    assert!(loc.starts_with(&prefix), "{loc}");
    let own = call(&gl, "GET", dl_path, &[("job-token", "glcbt-earlier")], "")
        .await
        .unwrap();
    assert_eq!(own.status, 302);

    let obj_path = loc.strip_prefix(&gl.url()).unwrap();
    let got = call(&gl, "GET", obj_path, &[], "").await.unwrap();
    assert_eq!((got.status, &got.body[..]), (200, &b"PKzip"[..]));
    let leaky = call(&gl, "GET", obj_path, &[("job-token", &token)], "")
        .await
        .unwrap();
    assert_eq!(leaky.status, 200);
    let bad_sig = call(&gl, "GET", "/object-storage/500?signature=forged", &[], "")
        .await
        .unwrap();
    assert_eq!(bad_sig.status, 403);
    let downloads = gl.object_downloads();
    assert_eq!(downloads.len(), 3);
    assert!(!downloads[0].job_token_sent);
    assert!(downloads[1].job_token_sent);

    // A job without artifacts: 404.
    let other = gl.enqueue(job_payload("lint", &["true"]));
    let _ = request_job(&gl).await;
    let missing = call(
        &gl,
        "GET",
        &format!("/api/v4/jobs/{other}/artifacts"),
        &[("job-token", &token)],
        "",
    )
    .await
    .unwrap();
    assert_eq!(missing.status, 404);
    // Unknown job: 404.
    assert_eq!(put(&gl, 9999, &token, "success").await.status, 404);
}

#[tokio::test]
async fn drop_stops_the_server() {
    let gl = FakeGitlab::start().await;
    let addr = gl.addr();
    let mut kept = Conn::open(&gl).await.unwrap();
    drop(gl);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    let r = kept.send("POST", "/api/v4/jobs/request", &[], "{}").await;
    assert!(r.is_err(), "{r:?}");
}
