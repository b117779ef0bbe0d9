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

mod payload;
mod routes;
mod server;

pub use payload::{job_payload, job_payload_with_vars};
use routes::drop_stale;
use server::accept_loop;

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

    /// Start one on `ip:0`: an address jobs in containers reach too (the Docker bridge's
    /// gateway, [`crate::docker_gateway`]). Panics when it cannot be bound.
    pub async fn start_on(ip: std::net::IpAddr) -> FakeGitlab {
        match Self::try_start_on(ip, None).await {
            Ok(f) => f,
            Err(e) => panic!("FakeGitlab: binding {ip}:0: {e}"),
        }
    }

    async fn try_start_with(tls: Option<Arc<rustls::ServerConfig>>) -> std::io::Result<FakeGitlab> {
        Self::try_start_on(std::net::Ipv4Addr::LOCALHOST.into(), tls).await
    }

    /// Start one serving HTTPS on `127.0.0.1:0` with `tls` (see [`crate::tls::TestCa`]);
    /// panics when loopback cannot be bound.
    pub async fn start_tls(tls: Arc<rustls::ServerConfig>) -> FakeGitlab {
        match Self::try_start_with(Some(tls)).await {
            Ok(f) => f,
            Err(e) => panic!("FakeGitlab: binding 127.0.0.1:0: {e}"),
        }
    }

    async fn try_start_on(
        ip: std::net::IpAddr,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> std::io::Result<FakeGitlab> {
        let listener = tokio::net::TcpListener::bind((ip, 0)).await?;
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

    /// Job `id`'s state and the sizes of its uploaded artifacts, without copying them (a
    /// benchmark polls this while gigabytes are uploaded).
    pub fn job_state(&self, id: u64) -> Option<(String, Vec<usize>)> {
        let mut st = self.shared.lock();
        drop_stale(&mut st);
        st.jobs.get(&id).map(|j| {
            let sizes = j.record.artifacts.iter().map(|a| a.bytes.len()).collect();
            (j.record.state.clone(), sizes)
        })
    }

    /// Forget the bytes of every uploaded artifact (their records stay): a benchmark that
    /// uploads gigabytes would otherwise make the server's memory grow under every later
    /// upload.
    pub fn forget_artifact_bytes(&self) {
        let mut st = self.shared.lock();
        for job in st.jobs.values_mut() {
            for a in &mut job.record.artifacts {
                a.bytes = Default::default();
            }
        }
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
