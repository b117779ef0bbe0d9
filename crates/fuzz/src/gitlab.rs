//! GitLab's replies as the client reads them: the job payload of `jobs/request` (a 201 body),
//! the runner credentials of `runners/verify` and `runners`, and the reply headers (`Job-Status`,
//! `X-GitLab-Trace-Update-Interval`, `Location` of an artifacts download redirect).

use slipway_gitlab::{RemoteJobState, RunnerCredentials, resolve_redirect, update_interval};
use slipway_job::JobResponse;

use crate::mutate::{self, Mutated};

/// The input: a seed reply, edits, and a header value.
#[derive(Debug, Clone, bolero::generator::TypeGenerator)]
pub struct Input {
    /// The body: a seed (job payload or credentials) and edits.
    pub body: Mutated,
    /// A header value (`Job-Status`, the update interval, a redirect `Location`).
    pub header: String,
}

const SEEDS: &[&[u8]] = &[
    include_bytes!("../seeds/job.json"),
    include_bytes!("../seeds/credentials.json"),
    b"{}",
    b"{\"id\": 1, \"token\": \"t\", \"variables\": null, \"steps\": [{}]}",
];

/// JSON words the edits insert.
pub const DICT: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    "\"",
    "null",
    "true",
    "false",
    "-1",
    "1e400",
    "0.5",
    "18446744073709551616",
    "-9223372036854775809",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "\"💥\"",
    "\"variables\": [{\"key\": \"K\", \"value\": \"$K${K}\"}]",
    "\"steps\": []",
    "\"cache\": [{}]",
    "\"image\": \"alpine\"",
    "\"services\": [\"x\"]",
    "\"artifacts\": [{\"paths\": [\"../x\"]}]",
    "\"project_full_path\": \"../../etc\"",
    "\"timeout\": -5",
    "\"when\": \"sometimes\"",
    "\"token_expires_at\": \"never\"",
    "\"GIT_STRATEGY\"",
    "\"none\"",
    "\"empty\"",
];

const BASES: &[&str] = &[
    "https://gitlab.example.com/api/v4/jobs/1/artifacts",
    "http://127.0.0.1:8080/sub/path/api/v4/jobs/1/artifacts",
];

/// Every reply parser: a decoded reply or an error; a decoded reply encodes and decodes back to
/// itself; a followed redirect is always an absolute `http(s)` URL with a host.
pub fn check(input: &Input) {
    let bytes = mutate::apply(SEEDS, DICT, &input.body);
    check_body(&bytes);
    check_headers(&input.header);
}

/// A `jobs/request` 201 body and a `runners/verify` / `runners` body.
pub fn check_body(bytes: &[u8]) {
    if let Ok(text) = std::str::from_utf8(bytes)
        && let Ok(job) = JobResponse::from_json(text)
    {
        let again = serde_json::to_string(&job).expect("a job payload serializes");
        let back = JobResponse::from_json(&again).expect("a serialized payload parses");
        assert!(back == job, "the job payload does not round-trip: {again}");
        // What the runner reads from a payload before running it.
        let _ = job.git_strategy();
        let _ = job.masked_values();
        let _ = job.ships_sources();
        let _ = slipway_executor::cache::project_root("cache", &job);
        for c in &job.cache {
            let _ = job.expand(&c.key);
        }
    }
    if let Ok(creds) = serde_json::from_slice::<RunnerCredentials>(bytes) {
        let again = serde_json::to_vec(&creds).expect("credentials serialize");
        let back: RunnerCredentials =
            serde_json::from_slice(&again).expect("credentials parse back");
        assert_eq!(back, creds, "runner credentials do not round-trip");
    }
}

/// Reply headers.
pub fn check_headers(value: &str) {
    match RemoteJobState::parse(Some(value)) {
        RemoteJobState::Other(s) => assert!(!s.is_empty() && s == value.trim()),
        RemoteJobState::Unknown => assert!(value.trim().is_empty()),
        _ => {}
    }
    if let Some(d) = update_interval(value) {
        assert!(d.as_secs() > 0, "a zero update interval from {value:?}");
    }
    for base in BASES {
        if let Some(url) = resolve_redirect(base, value) {
            let uri: http::Uri = url.parse().expect("a followed redirect is a URI");
            assert!(
                matches!(uri.scheme_str(), Some("http" | "https")) && uri.authority().is_some(),
                "redirect {value:?} resolved to {url:?}"
            );
        }
    }
}
