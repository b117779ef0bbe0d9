//! A GitLab job's sources as GitLab projects have them: repositories served over smart HTTP
//! (`git http-backend` behind the GitLab test server) with the job token, submodules with
//! relative URLs, LFS objects through the batch API, and a GitLab behind a private CA (with a
//! client certificate required in one variant).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{World, git};
use serde_json::{Value, json};
use slipway_testkit::gitlab::{FakeGitlab, job_payload_with_vars};
use slipway_testkit::tls::TestCa;

/// A bare repository `<root>/<project>.git` made from the files `files` (and the submodules
/// `subs`: path → URL as written in `.gitmodules`, added from `<root>/<name>.git`); the sha of
/// its one commit.
fn publish(
    root: &Path,
    work: &Path,
    project: &str,
    files: &[(&str, &str)],
    subs: &[(&str, &str, &str)],
) -> String {
    let dir = work.join(project.replace('/', "-"));
    std::fs::create_dir_all(&dir).unwrap();
    git(&dir, &["init", "-q", "-b", "main"]);
    for (path, text) in files {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    for (path, from, url) in subs {
        // Added from the local bare repository, then pointed at the URL a project uses.
        let local = format!("file://{}", root.join(format!("{from}.git")).display());
        git(
            &dir,
            &[
                "-c",
                "protocol.file.allow=always",
                "submodule",
                "add",
                "-q",
                &local,
                path,
            ],
        );
        git(
            &dir,
            &[
                "config",
                "-f",
                ".gitmodules",
                &format!("submodule.{path}.url"),
                url,
            ],
        );
    }
    git(&dir, &["add", "-A"]);
    git(&dir, &["commit", "-q", "-m", "publish"]);
    let bare = root.join(format!("{project}.git"));
    std::fs::create_dir_all(bare.parent().unwrap()).unwrap();
    let out = Command::new("git")
        .args(["clone", "-q", "--bare"])
        .arg(&dir)
        .arg(&bare)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    git(&dir, &["rev-parse", "HEAD"]).trim().to_string()
}

/// An LFS pointer file for `content` stored under `oid`.
fn lfs_pointer(oid: &str, content: &[u8]) -> String {
    format!(
        "version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {}\n",
        content.len()
    )
}

/// A job of `project` at `sha`, fetched with `token`, running `script` with `vars`.
fn job_of(
    gl: &FakeGitlab,
    project: &str,
    sha: &str,
    token: &str,
    script: &[&str],
    vars: &[(&str, &str)],
) -> Value {
    let mut job = job_payload_with_vars(project, script, vars);
    job["token"] = json!(token);
    job["git_info"]["repo_url"] = json!(gl.repo_url(project, token));
    job["git_info"]["sha"] = json!(sha);
    job["git_info"]["depth"] = json!(20);
    job
}

/// A config with one instance-executor runner serving `gl`, with `extra` runner keys. Its
/// instances share this machine's network (the local plugin's `loopback`), so they reach the
/// GitLab test server on loopback and fetch the sources themselves, as instances reaching
/// GitLab do.
fn config(w: &World, gl: &FakeGitlab, name: &str, extra: &str) -> PathBuf {
    config_with(w, gl, name, extra, true)
}

/// [`config`], with instances in network namespaces of their own unless `loopback`: they do
/// not reach the test server there, and the manager fetches for them.
fn config_with(w: &World, gl: &FakeGitlab, name: &str, extra: &str, loopback: bool) -> PathBuf {
    let mut autoscaler = common::local_autoscaler(w, name)
        .replace("capacity_per_instance = 2", "capacity_per_instance = 1");
    if loopback {
        autoscaler = common::on_loopback(&autoscaler);
    }
    w.write(
        "config.toml",
        &format!(
            r#"
concurrent = 2
check_interval = 1
[[runners]]
  name = "{name}"
  url = "{url}"
  token = "{token}"
  executor = "instance"
{extra}
{autoscaler}"#,
            url = gl.url(),
            token = gl.runner_token(),
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submodules_and_lfs_objects_come_over_http_with_the_job_token_only() {
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let root = w.path().join("srv");
    let work = w.path().join("authoring");
    let repos = gl.serve_git(&root);
    let big = b"large binary content kept in LFS\n".repeat(64);
    let oid = repos.put_lfs_object(&big);
    publish(
        &root,
        &work,
        "group/deep",
        &[("deep.txt", "from the nested submodule\n")],
        &[],
    );
    publish(
        &root,
        &work,
        "group/lib",
        &[("lib.txt", "from the submodule\n")],
        &[("deep", "group/deep", "../deep.git")],
    );
    let sha = publish(
        &root,
        &work,
        "group/project",
        &[
            ("README.md", "the project\n"),
            (
                ".gitattributes",
                "*.bin filter=lfs diff=lfs merge=lfs -text\n",
            ),
            ("data/big.bin", &lfs_pointer(&oid, &big)),
        ],
        &[("libs/lib", "group/lib", "../lib.git")],
    );
    // Fetched where the job runs, then on the manager (one level at a time there, each
    // submodule's URL judged: these are all on the server).
    for (n, name, extra) in [
        (1, "sources", ""),
        (2, "sourcesm", "  fetch_sources = \"manager\""),
    ] {
        let token = format!("glcbt-1_srcTokenForTheJob000{n}");
        let id = gl.enqueue(job_of(
            &gl,
            "group/project",
            &sha,
            &token,
            &[
                "cat README.md libs/lib/lib.txt libs/lib/deep/deep.txt",
                "head -c 32 data/big.bin; echo",
                "test \"$(wc -c < data/big.bin)\" = 2112 && echo lfs-object-whole",
                "grep -rl glcbt .git/config .git/modules && exit 9 || echo no-token-in-git-files",
            ],
            &[
                ("GIT_SUBMODULE_STRATEGY", "recursive"),
                ("GIT_SUBMODULE_DEPTH", "1"),
            ],
        ));
        let cfg = config(&w, &gl, name, extra);
        let child = common::start_manager(&w, &cfg);
        let (state, trace) = common::job_ended(&gl, id).await;
        let stderr = common::stop_manager(&w, child);
        assert_eq!(state, "success", "{name}: {trace}\n{stderr}");
        for want in [
            "the project",
            "from the submodule",
            "from the nested submodule",
            "large binary content kept in L",
            "lfs-object-whole",
            "no-token-in-git-files",
            "Updating/initializing submodules recursively...",
        ] {
            assert!(
                trace.contains(want),
                "{name}: {want:?} missing:\n{trace}\nrequests: {:?}",
                gl.requests()
                    .iter()
                    .map(|r| (r.method.clone(), r.path.clone(), r.status))
                    .collect::<Vec<_>>()
            );
        }
        assert!(!trace.contains(&token), "job token in the trace");
        assert!(!trace.contains("WARNING"), "{name}: {trace}");
    }
    // Every repository and the LFS batch API were asked with the job token.
    let requests = gl.requests();
    for path in [
        "/group/project.git/info/refs",
        "/group/lib.git/info/refs",
        "/group/deep.git/info/refs",
        "/group/project.git/info/lfs/objects/batch",
    ] {
        let asked: Vec<_> = requests
            .iter()
            .filter(|r| r.path.starts_with(path))
            .collect();
        assert!(!asked.is_empty(), "{path} never asked");
        assert!(
            asked
                .iter()
                .any(|r| r.status == 200 && r.header("authorization").is_some()),
            "{path}: no authorized request: {:?}",
            asked.iter().map(|r| r.status).collect::<Vec<_>>()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_a_missing_lfs_object_and_a_foreign_submodule_say_which() {
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let root = w.path().join("srv");
    let work = w.path().join("authoring");
    let repos = gl.serve_git(&root);
    let sha = publish(&root, &work, "group/plain", &[("a.txt", "a\n")], &[]);
    let missing = b"never uploaded\n";
    let lfs_sha = publish(
        &root,
        &work,
        "group/lfs",
        &[
            (
                ".gitattributes",
                "*.bin filter=lfs diff=lfs merge=lfs -text\n",
            ),
            ("x.bin", &lfs_pointer(&"ab".repeat(32), missing)),
        ],
        &[],
    );
    // The same server under another name: another host, so the token is not sent there.
    let foreign = format!(
        "{}/group/plain.git",
        gl.url().replace("127.0.0.1", "localhost")
    );
    let sub_sha = publish(
        &root,
        &work,
        "group/withsub",
        &[("b.txt", "b\n")],
        &[("ext/plain", "group/plain", &foreign)],
    );
    let _ = repos;
    let mut refused = job_of(
        &gl,
        "group/plain",
        &sha,
        "glcbt-1_srcTokenRefused00001",
        &["true"],
        &[],
    );
    refused["git_info"]["repo_url"] = json!(gl.repo_url("group/plain", "glcbt-not-a-job-token"));
    let refused = gl.enqueue(refused);
    let lfs = gl.enqueue(job_of(
        &gl,
        "group/lfs",
        &lfs_sha,
        "glcbt-1_srcTokenLfs000000001",
        &["true"],
        &[],
    ));
    let sub = gl.enqueue(job_of(
        &gl,
        "group/withsub",
        &sub_sha,
        "glcbt-1_srcTokenSub000000001",
        &["true"],
        &[("GIT_SUBMODULE_STRATEGY", "normal")],
    ));
    let cfg = config(&w, &gl, "sourcefail", "");
    let child = common::start_manager(&w, &cfg);
    let mut seen = Vec::new();
    for id in [refused, lfs, sub] {
        seen.push(common::job_ended(&gl, id).await);
    }
    let stderr = common::stop_manager(&w, child);
    for ((state, trace), want) in seen.iter().zip([
        [
            "fetching the repository",
            "the server refused the job token",
        ],
        ["fetching LFS objects", "Object does not exist"],
        ["fetching the submodules", "localhost"],
    ]) {
        assert_eq!(state, "failed", "{trace}\n{stderr}");
        for w in want {
            assert!(trace.contains(w), "{w:?} missing:\n{trace}");
        }
    }
    for id in [refused, lfs, sub] {
        let job = gl.job(id).unwrap();
        let last = job.updates.last().cloned().unwrap_or_default();
        assert_eq!(last["failure_reason"], "runner_system_failure", "{last}");
    }
    // The token went to the project's host only.
    let foreign_asked = gl
        .requests()
        .into_iter()
        .filter(|r| {
            r.path.starts_with("/group/plain.git")
                && r.header("host").is_some_and(|h| h.starts_with("localhost"))
        })
        .collect::<Vec<_>>();
    assert!(
        !foreign_asked.is_empty(),
        "the foreign submodule was never asked"
    );
    assert!(
        foreign_asked
            .iter()
            .all(|r| r.header("authorization").is_none()),
        "the job token went to another host"
    );
}

/// Config keys for `ca` (and its client certificate when `client`).
fn tls_keys(ca: &TestCa, client: bool) -> String {
    let mut keys = format!("  tls-ca-file = \"{}\"\n", ca.ca_file.display());
    if client {
        keys.push_str(&format!(
            "  tls-cert-file = \"{}\"\n  tls-key-file = \"{}\"\n",
            ca.client_cert.display(),
            ca.client_key.display()
        ));
    }
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gitlab_behind_a_private_ca_is_served_with_tls_ca_file_and_a_client_certificate() {
    let w = World::new();
    let ca = TestCa::new(w.path(), "corp");
    for client in [false, true] {
        let gl = FakeGitlab::start_tls(ca.server_config(client)).await;
        let root = w.path().join(format!("srv-{client}"));
        gl.serve_git(&root);
        let sha = publish(
            &root,
            &w.path().join(format!("authoring-{client}")),
            "group/project",
            &[("README.md", "over https\n")],
            &[],
        );
        let id = gl.enqueue(job_of(
            &gl,
            "group/project",
            &sha,
            "glcbt-1_srcTokenTls000000001",
            &[
                "cat README.md",
                "grep -q 'BEGIN CERTIFICATE' \"$CI_SERVER_TLS_CA_FILE\" && echo ca-file-given",
            ],
            &[],
        ));
        let cfg = config(&w, &gl, &format!("tls{client}"), &tls_keys(&ca, client));
        let verify = w.run(&["verify-config", "-c", cfg.to_str().unwrap()]);
        assert_eq!(verify.code, Some(0), "{}", verify.explain());
        assert!(!verify.stderr.contains("tls-"), "{}", verify.explain());
        let child = common::start_manager(&w, &cfg);
        let (state, trace) = common::job_ended(&gl, id).await;
        let stderr = common::stop_manager(&w, child);
        assert_eq!(state, "success", "{trace}\n{stderr}");
        assert!(trace.contains("over https"), "{trace}");
        assert!(trace.contains("ca-file-given"), "{trace}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_gitlab_or_a_missing_client_certificate_is_one_clear_error() {
    let w = World::new();
    let ca = TestCa::new(w.path(), "corp");
    for (client_required, keys, want) in [
        (false, String::new(), "set tls-ca-file"),
        (true, tls_keys(&ca, false), "refused our client certificate"),
    ] {
        let gl = FakeGitlab::start_tls(ca.server_config(client_required)).await;
        let cfg = config(&w, &gl, "untrusted", &keys);
        let child = common::start_manager(&w, &cfg);
        let url = gl.url();
        // Long enough for a retry storm to show.
        tokio::time::sleep(Duration::from_secs(6)).await;
        let stderr = common::stop_manager(&w, child);
        let errors: Vec<&str> = stderr.lines().filter(|l| l.contains(want)).collect();
        assert_eq!(errors.len(), 1, "want one {want:?} error:\n{stderr}");
        assert!(
            errors[0].contains(&url),
            "the server is not named: {}",
            errors[0]
        );
        assert!(!stderr.contains("retrying"), "retried:\n{stderr}");
    }
}

/// The command lines of every process now (what `ps` shows).
fn command_lines() -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            out.push(String::from_utf8_lossy(&c).replace('\0', " "));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_token_is_in_no_command_line_while_git_fetches() {
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let root = w.path().join("srv");
    let repos = gl.serve_git(&root);
    let sha = publish(
        &root,
        &w.path().join("authoring"),
        "group/slow",
        &[("a.txt", "a\n")],
        &[],
    );
    // Every git answer takes a while: the fetch is long enough to be watched.
    repos.set_delay(Duration::from_millis(700));
    let token = "glcbt-1_srcTokenPs0000000001";
    let id = gl.enqueue(job_of(&gl, "group/slow", &sha, token, &["cat a.txt"], &[]));
    let cfg = config(&w, &gl, "pswatch", "");
    let child = common::start_manager(&w, &cfg);
    let mut gits_seen = 0;
    let mut leaks = Vec::new();
    while gl
        .job(id)
        .is_none_or(|j| j.state != "success" && j.state != "failed")
    {
        for line in command_lines() {
            if line.starts_with("git ")
                || line.contains("/git ")
                || line.contains("git-remote-http")
            {
                gits_seen += 1;
            }
            if line.contains(token) {
                leaks.push(line);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (state, trace) = common::job_ended(&gl, id).await;
    let stderr = common::stop_manager(&w, child);
    assert_eq!(state, "success", "{trace}\n{stderr}");
    assert!(
        gits_seen > 0,
        "no git process was ever seen: the watch proves nothing"
    );
    assert!(
        leaks.is_empty(),
        "the job token in a command line: {leaks:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_clone_path_places_the_project_when_custom_build_dir_allows_it() {
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let root = w.path().join("srv");
    gl.serve_git(&root);
    let sha = publish(
        &root,
        &w.path().join("authoring"),
        "group/placed",
        &[("README.md", "placed\n")],
        &[],
    );
    let script = ["pwd", "cat README.md"];
    let vars = [("GIT_CLONE_PATH", "$CI_BUILDS_DIR/src/$CI_JOB_NAME")];
    let allowed = gl.enqueue(job_of(
        &gl,
        "group/placed",
        &sha,
        "glcbt-1_srcTokenClone00001",
        &script,
        &vars,
    ));
    let cfg = config(
        &w,
        &gl,
        "clonepath",
        "  [runners.custom_build_dir]\n    enabled = true",
    );
    let child = common::start_manager(&w, &cfg);
    let (state, trace) = common::job_ended(&gl, allowed).await;
    common::stop_manager(&w, child);
    assert_eq!(state, "success", "{trace}");
    assert!(
        trace.lines().any(|l| l.ends_with("/src/group/placed")),
        "not in the clone path:\n{trace}"
    );
    assert!(trace.contains("placed"), "{trace}");

    // Without custom_build_dir (the instance executor's default): GitLab's refusal.
    let refused = gl.enqueue(job_of(
        &gl,
        "group/placed",
        &sha,
        "glcbt-1_srcTokenClone00002",
        &script,
        &vars,
    ));
    let cfg = config(&w, &gl, "clonepath2", "");
    let child = common::start_manager(&w, &cfg);
    let (state, trace) = common::job_ended(&gl, refused).await;
    common::stop_manager(&w, child);
    assert_eq!(state, "failed", "{trace}");
    assert!(
        trace.contains("setting GIT_CLONE_PATH is not allowed, enable `custom_build_dir` feature"),
        "{trace}"
    );
    let last = gl
        .job(refused)
        .unwrap()
        .updates
        .last()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        last["failure_reason"], "runner_configuration_error",
        "{last}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sources_are_fetched_on_the_instance_into_a_working_copy_its_slot_keeps() {
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let root = w.path().join("srv");
    let work = w.path().join("authoring");
    gl.serve_git(&root);
    let first_sha = publish(&root, &work, "group/kept", &[("v.txt", "one\n")], &[]);
    let vars = [("GIT_STRATEGY", "fetch")];
    let script = [
        "pwd",
        "cat v.txt",
        "if [ -e left-over ]; then echo left-over-found; fi",
        "touch left-over",
    ];
    let first = gl.enqueue(job_of(
        &gl,
        "group/kept",
        &first_sha,
        "glcbt-1_srcTokenKept00001",
        &script,
        &vars,
    ));
    let cfg = config(&w, &gl, "kept", "");
    let child = common::start_manager(&w, &cfg);
    let (state, trace) = common::job_ended(&gl, first).await;
    assert_eq!(state, "success", "{trace}");
    // Fetched on the instance: the manager neither fetched nor sent the sources.
    assert!(!trace.contains("the manager fetches"), "{trace}");
    assert!(trace.contains("Created fresh repository."), "{trace}");
    assert!(
        trace.lines().any(|l| l.ends_with("/slot-0/group/project")),
        "not in the slot's working copy:\n{trace}"
    );
    assert!(trace.contains("one"), "{trace}");

    // A new commit; the slot's next job updates the same working copy, cleaned.
    let second_sha = {
        let repo = work.join("group-kept");
        std::fs::write(repo.join("v.txt"), "two\n").unwrap();
        git(&repo, &["commit", "-q", "-am", "two"]);
        let bare = root.join("group/kept.git");
        git(&repo, &["push", "-q", bare.to_str().unwrap(), "HEAD:main"]);
        git(&repo, &["rev-parse", "HEAD"]).trim().to_string()
    };
    let second = gl.enqueue(job_of(
        &gl,
        "group/kept",
        &second_sha,
        "glcbt-1_srcTokenKept00002",
        &script,
        &vars,
    ));
    let (state, trace) = common::job_ended(&gl, second).await;
    let stderr = common::stop_manager(&w, child);
    assert_eq!(state, "success", "{trace}\n{stderr}");
    assert!(
        trace.contains("Reinitialized existing Git repository"),
        "{trace}"
    );
    assert!(trace.contains("two"), "{trace}");
    assert!(
        !trace.lines().any(|l| l == "left-over-found"),
        "git clean did not run:\n{trace}"
    );
    assert!(
        !trace.contains("glcbt-1_srcTokenKept"),
        "job token in the trace"
    );
}

/// The git requests `gl` received for `project` (`group/name`), from the job's host or the
/// manager alike.
fn git_requests(gl: &FakeGitlab, project: &str) -> usize {
    let prefix = format!("/{project}.git");
    gl.requests()
        .iter()
        .filter(|r| r.path.starts_with(&prefix))
        .count()
}

/// The last `failure_reason` GitLab was told for job `id`.
fn failure_reason(gl: &FakeGitlab, id: u64) -> Value {
    let job = gl.job(id).unwrap();
    job.updates.last().cloned().unwrap_or_default()["failure_reason"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_cannot_reach_gitlab_fails_unless_the_runner_lets_the_manager_fetch() {
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let root = w.path().join("srv");
    gl.serve_git(&root);
    let sha = publish(
        &root,
        &w.path().join("authoring"),
        "group/far",
        &[("f.txt", "far away\n")],
        &[],
    );
    let job = |n: u32| {
        job_of(
            &gl,
            "group/far",
            &sha,
            &format!("glcbt-1_srcTokenFar00000{n}"),
            &["cat f.txt"],
            &[],
        )
    };

    // The default (`instance`): instances in namespaces of their own, out of reach of the test
    // server on loopback, and the manager does not fetch in their place.
    let id = gl.enqueue(job(1));
    let cfg = config_with(&w, &gl, "far0", "", false);
    let child = common::start_manager(&w, &cfg);
    let (state, trace) = common::job_ended(&gl, id).await;
    let stderr = common::stop_manager(&w, child);
    assert_eq!(state, "failed", "{trace}\n{stderr}");
    assert!(
        trace.contains(
            "ERROR: getting the sources failed: the job's host cannot reach the repository's server"
        ) && trace.contains("(fetch_sources = \"instance\")")
            && trace.contains("\"instance_or_manager\" in [[runners]]"),
        "{trace}"
    );
    assert!(!trace.contains("the manager fetches"), "{trace}");
    assert!(!trace.contains("far away"), "{trace}");
    assert_eq!(failure_reason(&gl, id), "runner_system_failure");
    assert_eq!(git_requests(&gl, "group/far"), 0, "the manager fetched");

    // `instance_or_manager`: the manager fetches for the instance.
    let id = gl.enqueue(job(2));
    let cfg = config_with(
        &w,
        &gl,
        "far1",
        "  fetch_sources = \"instance_or_manager\"",
        false,
    );
    let child = common::start_manager(&w, &cfg);
    let (state, trace) = common::job_ended(&gl, id).await;
    let stderr = common::stop_manager(&w, child);
    assert_eq!(state, "success", "{trace}\n{stderr}");
    assert!(
        trace.contains(
            "WARNING: the repository's server cannot be reached, or its certificate is not trusted, from where the job runs: the manager fetches the sources and sends them"
        ),
        "{trace}"
    );
    assert!(trace.contains("far away"), "{trace}");
    assert!(git_requests(&gl, "group/far") > 0);

    // `fetch_sources = "manager"`: no attempt on the instance at all.
    let id = gl.enqueue(job(3));
    let cfg = config_with(&w, &gl, "far2", "  fetch_sources = \"manager\"", false);
    let child = common::start_manager(&w, &cfg);
    let (state, trace) = common::job_ended(&gl, id).await;
    common::stop_manager(&w, child);
    assert_eq!(state, "success", "{trace}");
    assert!(!trace.contains("cannot be reached"), "{trace}");
    assert!(trace.contains("far away"), "{trace}");
}

/// A directory with a `git` that says it is 2.25 (too old to take the job token from its
/// environment) and is the real git otherwise: a job's host without a usable git, while the
/// manager (which never asks for the version) still fetches with it.
fn old_git(w: &World) -> PathBuf {
    let real = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("git"))
        .find(|g| g.is_file())
        .expect("git on PATH");
    let bin = w.path().join("old-git");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(
        bin.join("git"),
        format!(
            "#!/bin/sh\nif [ \"$*\" = version ]; then echo 'git version 2.25.1'; exit 0; fi\n\
             exec {} \"$@\"\n",
            real.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        bin.join("git"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    bin
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_without_usable_git_fails_the_job_unless_the_runner_lets_the_manager_fetch() {
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let root = w.path().join("srv");
    gl.serve_git(&root);
    let sha = publish(
        &root,
        &w.path().join("authoring"),
        "group/nogit",
        &[("n.txt", "fetched for a host without git\n")],
        &[],
    );
    // The shell executor: the job's host is this machine, with the manager's PATH, where `git`
    // is too old.
    let path = std::env::join_paths(std::iter::once(old_git(&w)).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .unwrap();
    let run = |name: &str, extra: &str, n: u32| {
        let id = gl.enqueue(job_of(
            &gl,
            "group/nogit",
            &sha,
            &format!("glcbt-1_srcTokenNoGit0000{n}"),
            &["cat n.txt"],
            &[],
        ));
        let cfg = w.write(
            "config.toml",
            &format!(
                "concurrent = 1\ncheck_interval = 1\n[[runners]]\n  name = \"{name}\"\n  \
                 url = \"{url}\"\n  token = \"{token}\"\n  executor = \"shell\"\n  \
                 builds_dir = \"{builds}\"\n{extra}\n",
                url = gl.url(),
                token = gl.runner_token(),
                builds = w.path().join(format!("builds-{name}")).display(),
            ),
        );
        let child = w
            .slipway(&["run", "-c", cfg.to_str().unwrap()])
            .env("PATH", &path)
            .spawn()
            .expect("spawn slipway run");
        (id, child)
    };

    // The default (`instance`): the job fails before its script, saying why; nothing fetched.
    let (id, child) = run("nogit0", "", 1);
    let (state, trace) = common::job_ended(&gl, id).await;
    let stderr = common::stop_manager(&w, child);
    assert_eq!(state, "failed", "{trace}\n{stderr}");
    assert!(
        trace.contains("ERROR: getting the sources failed: the job's host has no git 2.31+")
            && trace.contains("(fetch_sources = \"instance\")")
            && trace.contains(
                "set fetch_sources = \"manager\" or \"instance_or_manager\" in [[runners]]"
            ),
        "{trace}"
    );
    assert!(!trace.contains("the manager fetches"), "{trace}");
    assert!(!trace.contains("fetched for a host without git"), "{trace}");
    assert_eq!(failure_reason(&gl, id), "runner_system_failure");
    assert_eq!(git_requests(&gl, "group/nogit"), 0, "something fetched");

    // `instance_or_manager`: the manager fetches, and says so.
    let (id, child) = run("nogit1", "  fetch_sources = \"instance_or_manager\"", 2);
    let (state, trace) = common::job_ended(&gl, id).await;
    let stderr = common::stop_manager(&w, child);
    assert_eq!(state, "success", "{trace}\n{stderr}");
    assert!(
        trace.contains(
            "git (2.31 or later) is not installed where the job runs: the manager fetches the sources and sends them"
        ),
        "{trace}"
    );
    assert!(trace.contains("fetched for a host without git"), "{trace}");
    assert!(git_requests(&gl, "group/nogit") > 0);
}

/// A loopback listener that counts the connections it accepts (and drops them), until dropped.
struct Probe {
    port: u16,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Probe {
    fn start() -> Probe {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (count, done) = (accepted.clone(), stop.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok(_) => {
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Probe {
            port,
            accepted,
            stop,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manager_fetches_submodules_and_lfs_objects_only_from_the_repository_s_server() {
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let root = w.path().join("srv");
    let work = w.path().join("authoring");
    let repos = gl.serve_git(&root);
    // A service on the manager's loopback that a repository names: it must hear nothing.
    let probe = Probe::start();
    let foreign = |path: &str| format!("http://probe:s3cr3t@127.0.0.1:{}/{path}", probe.port);
    let big = b"large binary content kept in LFS\n".repeat(64);
    let oid = repos.put_lfs_object(&big);
    publish(
        &root,
        &work,
        "group/deep",
        &[("deep.txt", "from the nested submodule\n")],
        &[],
    );
    // A submodule on the server whose own submodule is elsewhere: judged a level down.
    publish(
        &root,
        &work,
        "group/lib",
        &[("lib.txt", "from the submodule\n")],
        &[("deep", "group/deep", &foreign("group/deep.git"))],
    );
    let sha = publish(
        &root,
        &work,
        "group/probed",
        &[
            ("README.md", "the project\n"),
            (
                ".gitattributes",
                "*.bin filter=lfs diff=lfs merge=lfs -text\n",
            ),
            ("data/big.bin", &lfs_pointer(&oid, &big)),
            (
                ".lfsconfig",
                &format!("[lfs]\n\turl = {}\n", foreign("lfs")),
            ),
        ],
        &[
            ("libs/lib", "group/lib", "../lib.git"),
            ("ext/probe", "group/deep", &foreign("group/deep.git")),
        ],
    );
    let token = "glcbt-1_srcTokenProbe0000001";
    let id = gl.enqueue(job_of(
        &gl,
        "group/probed",
        &sha,
        token,
        &[
            "cat README.md libs/lib/lib.txt",
            "echo \"probe entries: $(ls -A ext/probe | wc -l)\"",
            "echo \"deep entries: $(ls -A libs/lib/deep | wc -l)\"",
            "head -c 40 data/big.bin; echo",
        ],
        &[("GIT_SUBMODULE_STRATEGY", "recursive")],
    ));
    // The manager fetches (the operator's choice), from its own network position.
    let cfg = config(&w, &gl, "probed", "  fetch_sources = \"manager\"");
    let child = common::start_manager(&w, &cfg);
    let (state, trace) = common::job_ended(&gl, id).await;
    let stderr = common::stop_manager(&w, child);
    assert_eq!(state, "success", "{trace}\n{stderr}");
    assert_eq!(probe.accepted(), 0, "the probe was reached:\n{trace}");
    let shown = format!("http://127.0.0.1:{}/", probe.port);
    let server = gl.url().trim_start_matches("http://").to_string();
    for want in [
        format!(
            "WARNING: submodule ext/probe is not fetched from {shown}group/deep.git: on the \
             manager, submodules come only from the repository's server ({server})"
        ),
        format!("WARNING: submodule libs/lib/deep is not fetched from {shown}group/deep.git"),
        format!("WARNING: LFS objects are not fetched from {shown}lfs: on the manager"),
        "from the submodule".to_string(),
        "probe entries: 0".to_string(),
        "deep entries: 0".to_string(),
        // The pointer stays.
        "version https://git-lfs.github.com/spec".to_string(),
    ] {
        assert!(trace.contains(&want), "{want:?} missing:\n{trace}");
    }
    // The warnings name the URLs without their credentials (git's own lines show
    // `.gitmodules` as the project wrote it).
    assert!(
        trace
            .lines()
            .filter(|l| l.starts_with("WARNING:"))
            .all(|l| !l.contains("s3cr3t")),
        "credentials in a warning:\n{trace}"
    );
    assert!(!trace.contains(token), "job token in the trace");
    // The submodule on the server was fetched.
    assert!(git_requests(&gl, "group/lib") > 0);
}
