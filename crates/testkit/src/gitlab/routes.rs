//! GitLab's runner API as the fake plays it, one function per endpoint.

use super::server::*;
use super::*;
/// GitLab's stuck-jobs worker: running jobs untouched for `stale_after` fail.
pub(super) fn drop_stale(st: &mut State) {
    let Some(after) = st.stale_after else {
        return;
    };
    for job in st.jobs.values_mut() {
        let stale = job.touched.is_some_and(|t| t.elapsed() > after);
        if stale && is_active(&job.record.state) {
            job.record.state = "failed".into();
            job.record.dropped_reason = Some("stuck_or_timeout_failure".into());
        }
    }
}

pub(super) fn route(st: &mut State, req: &Req) -> Resp {
    drop_stale(st);
    if let Some(rest) = req.path.strip_prefix("/object-storage/") {
        return match (req.method.as_str(), rest.parse::<u64>()) {
            ("GET", Ok(id)) => object_storage(st, req, id),
            _ => reply(404, &[], "404 Not Found"),
        };
    }
    let Some(rest) = req.path.strip_prefix("/api/v4/") else {
        return reply(404, &[], "404 Not Found");
    };
    let segs: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
    match (req.method.as_str(), segs.as_slice()) {
        ("POST", ["runners", "verify"]) => verify(st, req),
        ("POST", ["runners"]) => register(st, req),
        ("DELETE", ["runners", "managers"]) => {
            if runner_id(st, req).is_some() {
                reply(204, &[], "")
            } else {
                reply(403, &[], "403 Forbidden")
            }
        }
        // The runner is gone: its token is refused from now on.
        ("DELETE", ["runners"]) => match runner_id(st, req) {
            Some(id) => {
                st.runners.retain(|(_, r)| *r != id);
                reply(204, &[], "")
            }
            None => reply(403, &[], "403 Forbidden"),
        },
        ("POST", ["jobs", "request"]) => request_job(st, req),
        (method, ["jobs", id, tail @ ..]) => {
            let Ok(id) = id.parse::<u64>() else {
                return reply(404, &[], "404 Not Found");
            };
            if !st.jobs.contains_key(&id) {
                return reply(404, &[], "404 Job Not Found");
            }
            match (method, tail) {
                ("PUT", []) => update_job(st, req, id),
                ("PATCH", ["trace"]) => patch_trace(st, req, id),
                ("POST", ["artifacts"]) => upload_artifacts(st, req, id),
                ("GET", ["artifacts"]) => download_artifacts(st, req, id),
                _ => reply(404, &[], "404 Not Found"),
            }
        }
        _ => reply(404, &[], "404 Not Found"),
    }
}

/// The runner id of the body's `token` (or `RUNNER-TOKEN` header), when valid.
pub(super) fn runner_id(st: &State, req: &Req) -> Option<u64> {
    let body = req.json();
    let token = body
        .get("token")
        .and_then(Value::as_str)
        .or_else(|| req.header("runner-token"))?;
    st.runners
        .iter()
        .find(|(t, _)| t == token)
        .map(|(_, id)| *id)
}

pub(super) fn verify(st: &mut State, req: &Req) -> Resp {
    let Some(id) = runner_id(st, req) else {
        return reply(403, &[], "403 Forbidden");
    };
    let token = req.json().get("token").cloned().unwrap_or(Value::Null);
    json_reply(
        200,
        &[],
        &json!({"id": id, "token": token, "token_expires_at": null}),
    )
}

pub(super) fn register(st: &mut State, req: &Req) -> Resp {
    if req.json().get("token").and_then(Value::as_str) != Some(REGISTRATION_TOKEN) {
        return reply(403, &[], "403 Forbidden");
    }
    let id = st.next_runner_id;
    st.next_runner_id += 1;
    // GitLab prefixes only the tokens of runners created in its UI (`glrt-`); those of runners
    // registered with a registration token have none, and GitLab Runner tells them apart so.
    let token = format!("t1_fAkEnEwToKeN{id:06}");
    st.runners.push((token.clone(), id));
    json_reply(
        201,
        &[],
        &json!({"id": id, "token": token, "token_expires_at": null}),
    )
}

pub(super) fn request_job(st: &mut State, req: &Req) -> Resp {
    let last_update = |st: &State| {
        (
            "x-gitlab-last-update",
            format!("lu-{:08x}", st.queue_version),
        )
    };
    if runner_id(st, req).is_none() {
        return reply(403, &[last_update(st)], "403 Forbidden");
    }
    let body = req.json();
    if let Some(features) = body.pointer("/info/features") {
        st.last_features = Some(features.clone());
    }
    while let Some(id) = st.queue.pop_front() {
        st.queue_version += 1;
        let Some(job) = st.jobs.get_mut(&id) else {
            continue;
        };
        if job.record.state != "pending" {
            continue;
        }
        job.record.state = "running".into();
        job.touched = Some(Instant::now());
        job.record.handed_out_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .and_then(|d| i64::try_from(d.as_millis()).ok());
        let payload = job.record.payload.clone();
        return json_reply(201, &[last_update(st)], &payload);
    }
    reply(204, &[last_update(st)], "")
}

/// `JOB-TOKEN` header (or, with `body_token`, the JSON body's `token`) matches job `id`.
pub(super) fn job_token_ok(st: &State, req: &Req, id: u64, body_token: bool) -> bool {
    let Some(job) = st.jobs.get(&id) else {
        return false;
    };
    let body = if body_token { req.json() } else { Value::Null };
    let token = body
        .get("token")
        .and_then(Value::as_str)
        .or_else(|| req.header("job-token"));
    token == Some(job.record.token.as_str())
}

pub(super) fn is_active(state: &str) -> bool {
    state == "running" || state == "canceling"
}

pub(super) fn patch_trace(st: &mut State, req: &Req, id: u64) -> Resp {
    if !job_token_ok(st, req, id, false) {
        return reply(403, &[], "403 Forbidden");
    }
    let interval = st.trace_update_interval.to_string();
    let Some(job) = st.jobs.get_mut(&id) else {
        return reply(404, &[], "404 Job Not Found");
    };
    let status = |job: &Job| ("job-status", job.record.state.clone());
    let iv = ("x-gitlab-trace-update-interval", interval);
    if !is_active(&job.record.state) {
        return reply(
            403,
            &[status(job), iv],
            "403 Forbidden - Job is not running",
        );
    }
    let start = req
        .header("content-range")
        .and_then(|r| r.split_once('-'))
        .and_then(|(s, e)| {
            Some((
                s.trim().parse::<usize>().ok()?,
                e.trim().parse::<usize>().ok()?,
            ))
        })
        .map(|(s, _end)| s);
    let Some(start) = start else {
        return reply(400, &[status(job), iv], "400 Missing header Content-Range");
    };
    let len = job.record.trace.len();
    if start != len {
        let range = ("range", format!("0-{len}"));
        return reply(416, &[status(job), iv, range], "416 Range Not Satisfiable");
    }
    job.record.trace.extend_from_slice(&req.body);
    job.record.trace_patches += 1;
    job.touched = Some(Instant::now());
    let range = ("range", format!("0-{}", job.record.trace.len()));
    reply(202, &[status(job), iv, range], "")
}

pub(super) fn update_job(st: &mut State, req: &Req, id: u64) -> Resp {
    if !job_token_ok(st, req, id, true) {
        return reply(403, &[], "403 Forbidden");
    }
    let accept_after = st.update_accepted_after;
    let Some(job) = st.jobs.get_mut(&id) else {
        return reply(404, &[], "404 Job Not Found");
    };
    let body = req.json();
    let wanted = body
        .get("state")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let current = job.record.state.clone();
    job.touched = Some(Instant::now());
    let (code, new_state) = match (current.as_str(), wanted) {
        ("running" | "canceling", "running") => (200, None),
        ("running" | "canceling", "success" | "failed") => {
            if job.accepted_202 < accept_after {
                job.accepted_202 += 1;
                (202, None)
            } else if current == "canceling" {
                (200, Some("canceled"))
            } else {
                (200, Some(wanted))
            }
        }
        ("success", "success") | ("failed", "failed") => (200, None),
        (_, "running" | "success" | "failed" | "pending") => (403, None),
        _ => (400, None),
    };
    if let Some(s) = new_state {
        job.record.state = s.to_owned();
    }
    job.record.updates.push(body);
    job.record.update_statuses.push(code);
    let status = ("job-status", job.record.state.clone());
    let text = match code {
        200 => "200 OK",
        202 => "202 Accepted",
        403 => "403 Forbidden - Job is not running",
        _ => "400 Bad Request - state",
    };
    reply(code, &[status], text)
}

pub(super) fn upload_artifacts(st: &mut State, req: &Req, id: u64) -> Resp {
    if !job_token_ok(st, req, id, false) {
        return reply(403, &[], "403 Forbidden");
    }
    let Some(job) = st.jobs.get_mut(&id) else {
        return reply(404, &[], "404 Job Not Found");
    };
    if !is_active(&job.record.state) {
        let status = ("job-status", job.record.state.clone());
        return reply(403, &[status], "403 Forbidden - Job is not running");
    }
    let content_type = req.header("content-type").unwrap_or_default();
    let Some((filename, bytes)) = multipart_file(content_type, &req.body) else {
        return reply(400, &[], "400 Bad Request - file is missing");
    };
    let query = req
        .query
        .iter()
        .filter(|(k, _)| {
            matches!(
                k.as_str(),
                "artifact_format" | "artifact_type" | "expire_in"
            )
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    job.record.artifacts.push(UploadedArtifact {
        filename,
        query,
        bytes,
    });
    json_reply(201, &[], &json!({"id": id}))
}

/// The job's latest `archive` artifact (the one dependencies download).
pub(super) fn archive(job: &Job) -> Option<&UploadedArtifact> {
    job.record
        .artifacts
        .iter()
        .rev()
        .find(|a| a.query.get("artifact_type").is_none_or(|t| t == "archive"))
}

pub(super) fn signature(id: u64) -> String {
    format!("fAkEsIg{:016x}", id.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

pub(super) fn download_artifacts(st: &mut State, req: &Req, id: u64) -> Resp {
    // The job's own token, or (as GitLab hands a dependent job its own token for its
    // dependencies) the token of any job still running.
    let token = req.header("job-token");
    let allowed = token.is_some_and(|t| {
        st.jobs
            .iter()
            .any(|(jid, j)| j.record.token == t && (*jid == id || is_active(&j.record.state)))
    });
    if !allowed {
        return reply(403, &[], "403 Forbidden");
    }
    if st.jobs.get(&id).and_then(archive).is_none() {
        return reply(404, &[], "404 Not Found");
    }
    let location = format!("{}/object-storage/{id}?signature={}", st.url, signature(id));
    reply(302, &[("location", location)], "")
}

pub(super) fn object_storage(st: &mut State, req: &Req, id: u64) -> Resp {
    let job_token_sent = req.header("job-token").is_some();
    let signed = req.query.get("signature") == Some(&signature(id));
    let zip = st.jobs.get(&id).and_then(archive).map(|a| a.bytes.clone());
    let resp = match (signed, zip) {
        (false, _) => reply(403, &[], "SignatureDoesNotMatch"),
        (true, None) => reply(404, &[], "NoSuchKey"),
        (true, Some(zip)) => {
            let mut r = reply(200, &[], zip);
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/zip"),
            );
            r
        }
    };
    st.downloads.push(ObjectDownload {
        job_id: id,
        job_token_sent,
        status: resp.status().as_u16(),
    });
    resp
}
