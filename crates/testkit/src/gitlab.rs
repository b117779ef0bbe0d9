//! [`FakeGitlab`]: a stateful mock of GitLab's runner API (`/api/v4`) on 127.0.0.1, faithful
//! enough for end-to-end tests of a real runner process, with fault injection.
//!
//! What it plays, as GitLab does (see `gitlab-runner-compat.md` section 6):
//!
//! - `POST runners/verify`, `POST runners` (legacy registration), `DELETE runners`,
//!   `DELETE runners/managers`.
//! - `POST jobs/request`: pops the queue (201 with the job, else 204), always answers an
//!   `X-GitLab-Last-Update` header that changes whenever the queue does.
//! - `PATCH jobs/:id/trace`: `JOB-TOKEN` and `Content-Range: start-end` required. Like GitLab,
//!   only `start` is checked (the end is ignored, as GitLab computes it from the body): a `start`
//!   other than the bytes already stored answers **416 with `Range: 0-<len>`**, where `<len>` is
//!   the number of bytes stored, i.e. the offset to resend from (`0-0` when empty); the 202
//!   answer carries the same header with the new length. Every answer for a known job with the
//!   right token carries `Job-Status` and `X-GitLab-Trace-Update-Interval`.
//! - `PUT jobs/:id`: final states (optionally 202 first, for two-phase commit), graceful
//!   cancellation, keep-alive `state: running`; every answer carries `Job-Status`.
//! - `POST`/`GET jobs/:id/artifacts` and a signed `/object-storage/:id` the GET redirects to.
//!
//! - Git over smart HTTP and LFS ([`FakeGitlab::serve_git`], see [`crate::git_http`]), and
//!   HTTPS with a test CA ([`FakeGitlab::start_tls`]).
//!
//! [`Outage`] applies to `/api/v4/*` only. Each accepted connection is served by its own task
//! in a `JoinSet` owned by the accept task, which [`FakeGitlab`]'s `Drop` aborts.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};

use crate::git_http::{GitRepos, GitRequest};

/// The legacy registration token [`FakeGitlab`] accepts on `POST /api/v4/runners`.
pub const REGISTRATION_TOKEN: &str = "GR1348941fakeregtoken";
/// The runner authentication token [`FakeGitlab`] accepts from the start.
pub const RUNNER_TOKEN: &str = "glrt-t1_fAkErUnNeRtOkEn0123";
/// The failure reasons a [`job_payload`] lists in `features.failure_reasons`.
pub const FAILURE_REASONS: &[&str] = &[
    "unknown_failure",
    "script_failure",
    "api_failure",
    "stuck_or_timeout_failure",
    "runner_system_failure",
    "missing_dependency_failure",
    "runner_unsupported",
    "job_execution_timeout",
    "archived_failure",
    "unmet_prerequisites",
    "scheduler_failure",
    "data_integrity_failure",
    "runner_configuration_error",
    "image_pull_failure",
];

/// How the fake's `/api/v4` is failing, if at all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Outage {
    /// Answer normally.
    #[default]
    None,
    /// Every `/api/v4` request answers 503 "GitLab is not responding".
    Unavailable,
    /// Every `/api/v4` request is read, recorded with status 0, and its connection closed
    /// without any response.
    Drop,
    /// Every `/api/v4` request answers this status (500, 502, …) with a short body.
    Status(u16),
    /// Every `/api/v4` request is read, recorded with status 0, and never answered: the
    /// client's timeout is what ends it.
    Hang,
}

/// One artifact uploaded with `POST jobs/:id/artifacts` (or put with
/// [`FakeGitlab::put_artifact`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UploadedArtifact {
    /// The `filename` of the multipart `file` part.
    pub filename: String,
    /// The query: `artifact_format`, `artifact_type`, `expire_in` as sent.
    pub query: BTreeMap<String, String>,
    /// The file's bytes.
    pub bytes: Vec<u8>,
}

/// A snapshot of one job as the fake sees it.
#[derive(Clone, Debug)]
pub struct JobRecord {
    /// Job id.
    pub id: u64,
    /// Job token (`glcbt-…`).
    pub token: String,
    /// `pending`, `running`, `success`, `failed`, `canceling` or `canceled`.
    pub state: String,
    /// The trace bytes accepted so far.
    pub trace: Vec<u8>,
    /// Every `PUT jobs/:id` body with the right token, in order (`null` when not JSON).
    pub updates: Vec<Value>,
    /// The status answered to each of `updates`, same order.
    pub update_statuses: Vec<u16>,
    /// Uploaded artifacts, in order.
    pub artifacts: Vec<UploadedArtifact>,
    /// Trace PATCHes accepted (202); refused ones are in [`FakeGitlab::requests`] only.
    pub trace_patches: usize,
    /// The payload `jobs/request` hands out (with `id` and `token` filled in).
    pub payload: Value,
    /// When `jobs/request` handed the job out (Unix milliseconds).
    pub handed_out_ms: Option<i64>,
    /// Why GitLab itself failed the job (no runner did), as its stuck-jobs worker does with a
    /// running job no runner has touched for a while: see [`FakeGitlab::set_stale_after`].
    pub dropped_reason: Option<String>,
}

impl JobRecord {
    /// The final states the fake accepted (PUTs answered 200 with `success` or `failed`),
    /// so a test can assert exactly one.
    pub fn accepted_final_states(&self) -> Vec<String> {
        self.updates
            .iter()
            .zip(&self.update_statuses)
            .filter(|(_, s)| **s == 200)
            .filter_map(|(u, _)| u.get("state")?.as_str().map(str::to_owned))
            .filter(|s| s == "success" || s == "failed")
            .collect()
    }

    /// The trace as (lossy) UTF-8.
    pub fn trace_text(&self) -> String {
        String::from_utf8_lossy(&self.trace).into_owned()
    }
}

/// One request the fake received, with what it answered.
#[derive(Clone, Debug)]
pub struct RequestRecord {
    /// `GET`, `POST`, ...
    pub method: String,
    /// Path with query, e.g. `/api/v4/jobs/1/artifacts?artifact_format=zip`.
    pub path: String,
    /// The status answered; 0 when the connection was dropped without an answer.
    pub status: u16,
    /// Request headers, names lowercase, in order.
    pub headers: Vec<(String, String)>,
    /// The request body.
    pub body: Vec<u8>,
}

impl RequestRecord {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON (`null` when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// One `GET /object-storage/:id` (where artifact downloads are redirected).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectDownload {
    /// Whose artifacts.
    pub job_id: u64,
    /// Whether the request carried a `JOB-TOKEN` header (a runner must not send it there).
    pub job_token_sent: bool,
    /// The status answered.
    pub status: u16,
}

#[derive(Debug)]
struct Job {
    record: JobRecord,
    /// Final PUTs answered 202 so far.
    accepted_202: u32,
    /// When a runner last handled it (handed out, trace PATCH, PUT).
    touched: Option<Instant>,
}

#[derive(Debug)]
struct State {
    url: String,
    /// Valid runner tokens and their runner ids.
    runners: Vec<(String, u64)>,
    next_runner_id: u64,
    next_job_id: u64,
    queue: VecDeque<u64>,
    jobs: BTreeMap<u64, Job>,
    outage: Outage,
    requests: Vec<RequestRecord>,
    downloads: Vec<ObjectDownload>,
    update_accepted_after: u32,
    trace_update_interval: u32,
    stale_after: Option<Duration>,
    queue_version: u64,
    last_features: Option<Value>,
    /// Repositories served over smart HTTP, once [`FakeGitlab::serve_git`] is called.
    git: Option<Arc<GitRepos>>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A mock GitLab serving the runner API on `127.0.0.1`; dropping it stops the server and
/// closes every connection.
pub struct FakeGitlab {
    shared: Arc<Shared>,
    addr: SocketAddr,
    server: JoinHandle<()>,
}

impl std::fmt::Debug for FakeGitlab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeGitlab")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Drop for FakeGitlab {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeGitlab {
    /// Start one on `127.0.0.1:0`; panics when loopback cannot be bound (see
    /// [`FakeGitlab::try_start`]). Needs a Tokio runtime.
    pub async fn start() -> FakeGitlab {
        match Self::try_start().await {
            Ok(f) => f,
            Err(e) => panic!("FakeGitlab: binding 127.0.0.1:0: {e}"),
        }
    }

    /// Start one on `127.0.0.1:0`.
    pub async fn try_start() -> std::io::Result<FakeGitlab> {
        Self::try_start_with(None).await
    }

    /// Start one serving HTTPS on `127.0.0.1:0` with `tls` (see [`crate::tls::TestCa`]);
    /// panics when loopback cannot be bound.
    pub async fn start_tls(tls: Arc<rustls::ServerConfig>) -> FakeGitlab {
        match Self::try_start_with(Some(tls)).await {
            Ok(f) => f,
            Err(e) => panic!("FakeGitlab: binding 127.0.0.1:0: {e}"),
        }
    }

    async fn try_start_with(tls: Option<Arc<rustls::ServerConfig>>) -> std::io::Result<FakeGitlab> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                url: format!("{scheme}://{addr}"),
                runners: vec![(RUNNER_TOKEN.to_owned(), 1)],
                next_runner_id: 2,
                next_job_id: 1,
                queue: VecDeque::new(),
                jobs: BTreeMap::new(),
                outage: Outage::None,
                requests: Vec::new(),
                downloads: Vec::new(),
                update_accepted_after: 0,
                trace_update_interval: 1,
                stale_after: None,
                queue_version: 1,
                last_features: None,
                git: None,
            }),
        });
        let tls = tls.map(tokio_rustls::TlsAcceptor::from);
        let server = tokio::spawn(accept_loop(listener, shared.clone(), tls));
        Ok(FakeGitlab {
            shared,
            addr,
            server,
        })
    }

    /// `http://127.0.0.1:PORT` (`https://` when started with TLS), no trailing slash.
    pub fn url(&self) -> String {
        self.shared.lock().url.clone()
    }

    /// Serve the bare repositories under `root` (`<root>/<group>/<project>.git`) over smart
    /// HTTP, with the LFS endpoint; a running job's token is the password of `gitlab-ci-token`.
    pub fn serve_git(&self, root: &std::path::Path) -> Arc<GitRepos> {
        let repos = Arc::new(GitRepos::new(root));
        self.shared.lock().git = Some(repos.clone());
        repos
    }

    /// The URL GitLab puts in a job's `repo_url` for `project` (`group/name`), with `token`.
    pub fn repo_url(&self, project: &str, token: &str) -> String {
        let url = self.url();
        let (scheme, rest) = url.split_once("://").unwrap_or(("http", &url));
        format!("{scheme}://gitlab-ci-token:{token}@{rest}/{project}.git")
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The runner authentication token it accepts ([`RUNNER_TOKEN`]).
    pub fn runner_token(&self) -> String {
        RUNNER_TOKEN.to_owned()
    }

    /// The legacy registration token it accepts ([`REGISTRATION_TOKEN`]).
    pub fn registration_token(&self) -> String {
        REGISTRATION_TOKEN.to_owned()
    }

    /// Queue a job payload (see [`job_payload`]); `id` (when absent or 0) and `token` (when
    /// absent or empty) are assigned, and the `CI_JOB_ID`, `CI_JOB_TOKEN` and (when empty)
    /// `CI_SERVER_URL` variables filled in to match. Returns the id.
    pub fn enqueue(&self, mut job: Value) -> u64 {
        let mut st = self.shared.lock();
        let given = job.get("id").and_then(Value::as_u64).filter(|id| *id != 0);
        let id = given.unwrap_or(st.next_job_id);
        st.next_job_id = st.next_job_id.max(id + 1);
        let token = job
            .get("token")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .unwrap_or_else(|| format!("glcbt-1_fAkEjObToKeN{id:06}"));
        let url = st.url.clone();
        if let Some(obj) = job.as_object_mut() {
            obj.insert("id".into(), json!(id));
            obj.insert("token".into(), json!(token));
        }
        if let Some(vars) = job.get_mut("variables").and_then(Value::as_array_mut) {
            for var in vars {
                let key = var.get("key").and_then(Value::as_str).unwrap_or_default();
                let value = match key {
                    "CI_JOB_ID" => Some(id.to_string()),
                    "CI_JOB_TOKEN" => Some(token.clone()),
                    "CI_SERVER_URL" if var.get("value").and_then(Value::as_str) == Some("") => {
                        Some(url.clone())
                    }
                    _ => None,
                };
                if let (Some(v), Some(obj)) = (value, var.as_object_mut()) {
                    obj.insert("value".into(), json!(v));
                }
            }
        }
        st.jobs.insert(
            id,
            Job {
                record: JobRecord {
                    id,
                    token,
                    state: "pending".into(),
                    trace: Vec::new(),
                    updates: Vec::new(),
                    update_statuses: Vec::new(),
                    artifacts: Vec::new(),
                    trace_patches: 0,
                    payload: job,
                    handed_out_ms: None,
                    dropped_reason: None,
                },
                accepted_202: 0,
                touched: None,
            },
        );
        st.queue.push_back(id);
        st.queue_version += 1;
        id
    }

    /// A snapshot of job `id`.
    pub fn job(&self, id: u64) -> Option<JobRecord> {
        let mut st = self.shared.lock();
        drop_stale(&mut st);
        st.jobs.get(&id).map(|j| j.record.clone())
    }

    /// Every job, by id.
    pub fn jobs(&self) -> Vec<JobRecord> {
        let mut st = self.shared.lock();
        drop_stale(&mut st);
        st.jobs.values().map(|j| j.record.clone()).collect()
    }

    /// Cancel job `id` from the UI: a queued job leaves the queue as `canceled`; a running
    /// one becomes `canceling` (graceful) or `canceled`; a finished one is left alone.
    pub fn cancel(&self, id: u64, graceful: bool) {
        let mut st = self.shared.lock();
        let Some(job) = st.jobs.get_mut(&id) else {
            return;
        };
        match job.record.state.as_str() {
            "pending" => job.record.state = "canceled".into(),
            "running" if graceful => job.record.state = "canceling".into(),
            "running" | "canceling" => job.record.state = "canceled".into(),
            _ => return,
        }
        st.queue.retain(|q| *q != id);
        st.queue_version += 1;
    }

    /// Set (or end, with [`Outage::None`]) an outage of `/api/v4`.
    pub fn set_outage(&self, outage: Outage) {
        self.shared.lock().outage = outage;
    }

    /// Every request received so far, in order of answer.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.lock().requests.clone()
    }

    /// Requests whose path (without query) is `path`, e.g. `/api/v4/jobs/request`.
    pub fn requests_to(&self, path: &str) -> Vec<RequestRecord> {
        self.shared
            .lock()
            .requests
            .iter()
            .filter(|r| r.path.split('?').next() == Some(path))
            .cloned()
            .collect()
    }

    /// Every `GET /object-storage/:id` so far.
    pub fn object_downloads(&self) -> Vec<ObjectDownload> {
        self.shared.lock().downloads.clone()
    }

    /// The first `n` final PUTs (`success`/`failed`) of each job answer 202 (accepted, not
    /// done) before one answers 200 and the state changes.
    pub fn set_update_accepted_after(&self, n: u32) {
        self.shared.lock().update_accepted_after = n;
    }

    /// Fail a running job no runner has touched (trace PATCH, PUT) for `after` with
    /// `stuck_or_timeout_failure`, as GitLab's stuck-jobs worker does (there: after an hour).
    /// A job handed out to a runner that died before it read the answer ends this way.
    pub fn set_stale_after(&self, after: Duration) {
        self.shared.lock().stale_after = Some(after);
    }

    /// The `X-GitLab-Trace-Update-Interval` the trace PATCH answers carry (default 1).
    pub fn set_trace_update_interval(&self, secs: u32) {
        self.shared.lock().trace_update_interval = secs;
    }

    /// `info.features` of the last `jobs/request`.
    pub fn last_features(&self) -> Option<Value> {
        self.shared.lock().last_features.clone()
    }

    /// Store `zip` as the `archive` artifacts of job `job_id` (created as a finished
    /// `success` job with `token` when unknown), for a later job's dependencies download.
    pub fn put_artifact(&self, job_id: u64, token: &str, zip: Vec<u8>) {
        let mut st = self.shared.lock();
        st.next_job_id = st.next_job_id.max(job_id + 1);
        let job = st.jobs.entry(job_id).or_insert_with(|| Job {
            record: JobRecord {
                id: job_id,
                token: token.to_owned(),
                state: "success".into(),
                trace: Vec::new(),
                updates: Vec::new(),
                update_statuses: Vec::new(),
                artifacts: Vec::new(),
                trace_patches: 0,
                payload: Value::Null,
                handed_out_ms: None,
                dropped_reason: None,
            },
            accepted_202: 0,
            touched: None,
        });
        job.record.artifacts.push(UploadedArtifact {
            filename: "artifacts.zip".into(),
            query: BTreeMap::from([
                ("artifact_format".into(), "zip".into()),
                ("artifact_type".into(), "archive".into()),
            ]),
            bytes: zip,
        });
    }

    /// Wait until job `id` is in `state` (polling every 10 ms); its snapshot, or `None` on
    /// timeout.
    pub async fn wait_for_state(
        &self,
        id: u64,
        state: &str,
        timeout: Duration,
    ) -> Option<JobRecord> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(j) = self.job(id).filter(|j| j.state == state) {
                return Some(j);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A job payload shaped like GitLab's `POST jobs/request` 201 body, with id 0 (assigned by
/// [`FakeGitlab::enqueue`]) and one `script` step.
pub fn job_payload(name: &str, script: &[&str]) -> Value {
    job_payload_with_vars(name, script, &[])
}

/// [`job_payload`] with `extra` public variables after the predefined ones.
pub fn job_payload_with_vars(name: &str, script: &[&str], extra: &[(&str, &str)]) -> Value {
    let var = |key: &str, value: &str, public: bool, masked: bool| json!({"key": key, "value": value, "public": public, "file": false, "masked": masked});
    let mut variables = vec![
        var("CI_JOB_ID", "0", true, false),
        var("CI_JOB_NAME", name, true, false),
        var("CI_PROJECT_PATH", "group/project", true, false),
        var("CI_SERVER_URL", "", true, false),
        var("CI_JOB_TOKEN", "", false, true),
    ];
    variables.extend(extra.iter().map(|(k, v)| var(k, v, true, false)));
    json!({
        "id": 0,
        "token": "",
        "allow_git_fetch": true,
        "job_info": {
            "name": name,
            "stage": "test",
            "project_id": 1,
            "project_name": "project",
            "project_full_path": "group/project",
            "pipeline_id": 1,
        },
        "git_info": {
            "repo_url": "https://gitlab.example.com/group/project.git",
            "ref": "main",
            "sha": "69b18e5ed3610cf646119c3e38f462c64ec462b7",
            "before_sha": "0000000000000000000000000000000000000000",
            "ref_type": "branch",
            "refspecs": ["+refs/heads/main:refs/remotes/origin/main"],
            "depth": 0,
        },
        "runner_info": {"timeout": 3600},
        "variables": variables,
        "steps": [{
            "name": "script",
            "script": script,
            "timeout": 3600,
            "when": "on_success",
            "allow_failure": false,
        }],
        "image": null,
        "services": [],
        "artifacts": [],
        "cache": [],
        "credentials": [],
        "dependencies": [],
        "features": {
            "trace_sections": true,
            "token_mask_prefixes": ["glpat-", "glcbt-"],
            "failure_reasons": FAILURE_REASONS,
        },
    })
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    // Dropping this set (when the accept task is aborted) aborts every connection task.
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let shared = shared.clone();
                match tls.clone() {
                    None => {
                        conns.spawn(serve_connection(stream, shared));
                    }
                    Some(acceptor) => {
                        conns.spawn(async move {
                            // A refused handshake (an untrusted or missing client
                            // certificate) just ends the connection, as a server does.
                            if let Ok(stream) = acceptor.accept(stream).await {
                                serve_connection(stream, shared).await;
                            }
                        });
                    }
                }
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn serve_connection<S>(stream: S, shared: Arc<Shared>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let kill = Arc::new(Notify::new());
    let k = kill.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let shared = shared.clone();
        let kill = k.clone();
        async move { Ok::<_, Infallible>(handle(shared, req, kill).await) }
    });
    let conn =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    // `Outage::Drop`: the handler never answers and notifies; dropping `conn` closes the socket.
    tokio::select! {
        _ = conn => {}
        _ = kill.notified() => {}
    }
}

type Resp = Response<Full<Bytes>>;

/// A response; header values that are not valid are left out.
fn reply(status: u16, headers: &[(&'static str, String)], body: impl Into<Bytes>) -> Resp {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (name, value) in headers {
        if let Ok(v) = HeaderValue::from_str(value) {
            resp.headers_mut().insert(HeaderName::from_static(name), v);
        }
    }
    resp
}

fn json_reply(status: u16, headers: &[(&'static str, String)], body: &Value) -> Resp {
    let mut resp = reply(status, headers, body.to_string());
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// A parsed request, body read in full.
struct Req {
    method: String,
    path: String,
    query: BTreeMap<String, String>,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Req {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>, kill: Arc<Notify>) -> Resp {
    let (parts, body) = req.into_parts();
    let full_path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_owned(), |pq| pq.as_str().to_owned());
    let headers: Vec<(String, String)> = parts
        .headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes().to_vec(),
        Err(_) => {
            // The client went away mid-body: nothing to answer.
            kill.notify_one();
            return std::future::pending().await;
        }
    };
    let req = Req {
        method: parts.method.as_str().to_owned(),
        path: parts.uri.path().to_owned(),
        query: parse_query(parts.uri.query().unwrap_or_default()),
        headers,
        body,
    };
    let git = shared.lock().git.clone();
    if let Some(repos) = git.filter(|_| GitRepos::handles(&req.path)) {
        let base_url = shared.lock().url.clone();
        let header = |name: &str| req.header(name).map(str::to_owned);
        let query = parts.uri.query().unwrap_or_default().to_owned();
        let git_req = GitRequest {
            method: &req.method,
            path: &req.path,
            query: &query,
            header: &header,
            body: &req.body,
            base_url: &base_url,
        };
        let token_ok = |token: &str| {
            let st = shared.lock();
            st.jobs
                .values()
                .any(|j| j.record.token == token && is_active(&j.record.state))
        };
        let (status, headers, body) = repos.serve(&git_req, &token_ok).await;
        let mut resp = Response::new(Full::new(body));
        *resp.status_mut() =
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        for (k, v) in headers {
            if let (Ok(k), Ok(v)) = (HeaderName::try_from(k), HeaderValue::try_from(v)) {
                resp.headers_mut().append(k, v);
            }
        }
        shared.lock().requests.push(RequestRecord {
            method: req.method,
            path: full_path,
            status,
            headers: req.headers,
            body: Vec::new(),
        });
        return resp;
    }
    let hang = shared.lock().outage == Outage::Hang;
    let resp = {
        let mut st = shared.lock();
        let api = req.path == "/api/v4" || req.path.starts_with("/api/v4/");
        let (status, resp) = match (api, st.outage) {
            (true, Outage::Drop) => (0, None),
            (true, Outage::Unavailable) => (503, Some(reply(503, &[], "GitLab is not responding"))),
            (true, Outage::Status(code)) => (code, Some(reply(code, &[], "GitLab is failing"))),
            (true, Outage::Hang) => (0, None),
            _ => {
                let resp = route(&mut st, &req);
                (resp.status().as_u16(), Some(resp))
            }
        };
        st.requests.push(RequestRecord {
            method: req.method,
            path: full_path,
            status,
            headers: req.headers,
            body: req.body,
        });
        resp
    };
    match resp {
        Some(resp) => resp,
        None if hang => std::future::pending().await,
        None => {
            kill.notify_one();
            std::future::pending().await
        }
    }
}

/// GitLab's stuck-jobs worker: running jobs untouched for `stale_after` fail.
fn drop_stale(st: &mut State) {
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

fn route(st: &mut State, req: &Req) -> Resp {
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
        ("DELETE", ["runners"] | ["runners", "managers"]) => {
            if runner_id(st, req).is_some() {
                reply(204, &[], "")
            } else {
                reply(403, &[], "403 Forbidden")
            }
        }
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
fn runner_id(st: &State, req: &Req) -> Option<u64> {
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

fn verify(st: &mut State, req: &Req) -> Resp {
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

fn register(st: &mut State, req: &Req) -> Resp {
    if req.json().get("token").and_then(Value::as_str) != Some(REGISTRATION_TOKEN) {
        return reply(403, &[], "403 Forbidden");
    }
    let id = st.next_runner_id;
    st.next_runner_id += 1;
    let token = format!("glrt-t1_fAkEnEwToKeN{id:06}");
    st.runners.push((token.clone(), id));
    json_reply(
        201,
        &[],
        &json!({"id": id, "token": token, "token_expires_at": null}),
    )
}

fn request_job(st: &mut State, req: &Req) -> Resp {
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
fn job_token_ok(st: &State, req: &Req, id: u64, body_token: bool) -> bool {
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

fn is_active(state: &str) -> bool {
    state == "running" || state == "canceling"
}

fn patch_trace(st: &mut State, req: &Req, id: u64) -> Resp {
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

fn update_job(st: &mut State, req: &Req, id: u64) -> Resp {
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

fn upload_artifacts(st: &mut State, req: &Req, id: u64) -> Resp {
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
fn archive(job: &Job) -> Option<&UploadedArtifact> {
    job.record
        .artifacts
        .iter()
        .rev()
        .find(|a| a.query.get("artifact_type").is_none_or(|t| t == "archive"))
}

fn signature(id: u64) -> String {
    format!("fAkEsIg{:016x}", id.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

fn download_artifacts(st: &mut State, req: &Req, id: u64) -> Resp {
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

fn object_storage(st: &mut State, req: &Req, id: u64) -> Resp {
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

fn parse_query(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = b
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok());
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// The `file` part of a `multipart/form-data` body: its filename and bytes.
fn multipart_file(content_type: &str, body: &[u8]) -> Option<(String, Vec<u8>)> {
    let (mime, params) = content_type.split_once(';')?;
    if !mime.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    let boundary = params
        .split(';')
        .map(str::trim)
        .find_map(|p| p.strip_prefix("boundary="))?
        .trim_matches('"');
    let delim = format!("--{boundary}").into_bytes();
    let mut next_delim = b"\r\n".to_vec();
    next_delim.extend_from_slice(&delim);
    let mut pos = find(body, &delim, 0)?;
    loop {
        let after = pos + delim.len();
        let rest = body.get(after..)?;
        if rest.starts_with(b"--") {
            return None; // the closing delimiter: no file part
        }
        let headers_start = after + if rest.starts_with(b"\r\n") { 2 } else { 0 };
        let headers_end = find(body, b"\r\n\r\n", headers_start)?;
        let headers = String::from_utf8_lossy(body.get(headers_start..headers_end)?);
        let data_start = headers_end + 4;
        let data_end = find(body, &next_delim, data_start)?;
        let disposition = headers
            .split("\r\n")
            .find_map(|h| {
                let (k, v) = h.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case("content-disposition")
                    .then_some(v)
            })
            .unwrap_or_default();
        let param = |name: &str| {
            disposition.split(';').map(str::trim).find_map(|p| {
                p.strip_prefix(name)
                    .and_then(|v| v.strip_prefix('='))
                    .map(|v| v.trim_matches('"').to_owned())
            })
        };
        if param("name").as_deref() == Some("file") {
            let filename = param("filename").unwrap_or_default();
            return Some((filename, body.get(data_start..data_end)?.to_vec()));
        }
        pos = data_end + 2;
    }
}
