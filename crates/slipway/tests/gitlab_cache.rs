//! GitLab's distributed cache on a real S3-compatible server (LocalStack's S3, signatures
//! checked): with `max_use_count = 1` every job gets a fresh instance, and still finds what an
//! earlier job saved; objects sit under GitLab Runner's names as zip archives, and a zip put
//! there by someone else (GitLab Runner) is restored too. The same on Google Cloud Storage
//! (`gcp-storage-emulator`) and Azure Blob Storage (Azurite, SAS signatures checked).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::World;
use serde_json::{Value, json};
use slipway_testkit::gitlab::{FakeGitlab, job_payload_with_vars};
use slipway_testkit::s3::{ACCESS_KEY, LocalStack, SECRET_KEY};

const BUCKET: &str = "runner-cache";

/// A runner on fresh instances (one job each) with the S3 cache on `s3`.
fn config(w: &World, gl: &FakeGitlab, s3: &LocalStack, secret: &str) -> PathBuf {
    let cache = format!(
        r#"Type = "s3"
    [runners.cache.s3]
      ServerAddress = "{server}"
      AccessKey = "{ACCESS_KEY}"
      SecretKey = "{secret}"
      BucketName = "{BUCKET}"
      Insecure = true"#,
        server = s3.address()
    );
    config_with(w, gl, &cache)
}

/// A runner on fresh instances (one job each) with `cache` (its `Type` and section) under
/// `[runners.cache]`.
fn config_with(w: &World, gl: &FakeGitlab, cache: &str) -> PathBuf {
    w.write(
        "config.toml",
        &format!(
            r#"
concurrent = 1
check_interval = 1
[[runners]]
  name = "distcache"
  url = "{url}"
  token = "{token}"
  executor = "instance"
  [runners.cache]
    Path = "ci"
    MaxUploadedArchiveSize = 0
    {cache}
  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = 1
    max_use_count = 1
    max_instances = 1
    update_interval = "200ms"
    update_interval_when_expecting = "100ms"
    delete_instances_on_shutdown = true
    [runners.autoscaler.plugin_config]
      dir = "{state}"
      name = "s3c{pid}"
      # The instances share this machine's network: the job helper reaches S3 from there.
      network = "loopback"
    [[runners.autoscaler.policy]]
      idle_count = 0
      idle_time = "10m"
"#,
            url = gl.url(),
            token = gl.runner_token(),
            state = w.path().join("plugin-state").display(),
            pid = std::process::id(),
        ),
    )
}

/// Put `body` in the bucket as `key`, as another runner (GitLab Runner, or an attacker with
/// the bucket's keys) would.
async fn put_object(s3: &LocalStack, key: &str, body: Vec<u8>) {
    let put = slipway_cache::Store::new(&slipway_cache::StoreConfig::S3(slipway_cache::S3Config {
        server_address: s3.address(),
        bucket: BUCKET.into(),
        insecure: true,
        credentials: slipway_cache::Credentials {
            access_key: ACCESS_KEY.into(),
            secret_key: SECRET_KEY.into(),
            session_token: None,
        },
        ..slipway_cache::S3Config::default()
    }))
    .unwrap();
    let (url, headers) = put.put_url(key, Duration::from_secs(300)).await.unwrap();
    slipway_cache::transfer::Client::new(Duration::from_secs(60))
        .unwrap()
        .put(&url, &headers, body.into())
        .await
        .unwrap_or_else(|e| panic!("putting {key}: {e}"));
}

/// A job without sources running `script` with `cache`.
fn job(name: &str, script: &[&str], cache: Value) -> Value {
    let mut job = job_payload_with_vars(name, script, &[("GIT_STRATEGY", "none")]);
    job["cache"] = cache;
    job
}

/// The instance a trace ran on.
fn instance(trace: &str) -> String {
    trace
        .lines()
        .find_map(|l| l.strip_prefix("Running on instance "))
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_instance_restores_what_another_saved_in_s3() {
    let s3 = LocalStack::start(BUCKET).expect("LocalStack");
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let project = "ci/runner/fAkErUnNe/project/1";
    // A cache GitLab Runner saved: a zip under its object name.
    let zip = {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("vendor")).unwrap();
        std::fs::write(
            dir.path().join("vendor/lib.txt"),
            "saved by gitlab-runner\n",
        )
        .unwrap();
        let out = std::process::Command::new("python3")
            .current_dir(dir.path())
            .args([
                "-c",
                "import zipfile; z = zipfile.ZipFile('cache.zip', 'w', zipfile.ZIP_DEFLATED); \
                 z.write('vendor/'); z.write('vendor/lib.txt'); z.close()",
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        std::fs::read(dir.path().join("cache.zip")).unwrap()
    };
    put_object(&s3, &format!("{project}/from-gitlab-runner"), zip).await;

    let save = gl.enqueue(job(
        "build",
        &["mkdir -p deps && echo saved-on-the-first > deps/lib.txt"],
        json!([{"key": "deps-$CI_JOB_NAME", "paths": ["deps/"], "policy": "pull-push"}]),
    ));
    let restore = gl.enqueue(job(
        "test",
        &["cat deps/lib.txt vendor/lib.txt"],
        json!([
            {"key": "missing", "fallback_keys": ["deps-build"], "paths": ["deps/"], "policy": "pull"},
            {"key": "from-gitlab-runner", "paths": ["vendor/"], "policy": "pull"}
        ]),
    ));
    let cfg = config(&w, &gl, &s3, SECRET_KEY);
    let (trace1, trace2, stderr) = save_and_restore(&w, &gl, &cfg, save, restore).await;
    assert!(trace2.contains("saved-on-the-first"), "{trace2}");
    assert!(trace2.contains("saved by gitlab-runner"), "{trace2}");
    // GitLab Runner's object name, holding a zip archive; no credential in any trace.
    let objects = s3.objects(BUCKET).unwrap();
    assert!(
        objects.contains(&format!("{project}/deps-build")),
        "{objects:?}"
    );
    let saved = s3.object(BUCKET, &format!("{project}/deps-build")).unwrap();
    assert!(saved.starts_with(b"PK"), "not a zip archive");
    // Signed URLs are shown without their query: no signature, no credential.
    for t in [&trace1, &trace2, &stderr] {
        assert!(!t.contains("X-Amz-Signature"), "a signed URL leaked");
        assert!(!t.contains(ACCESS_KEY), "the access key leaked");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_bucket_is_a_warning_never_a_failed_job() {
    let s3 = LocalStack::start(BUCKET).expect("LocalStack");
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let id = gl.enqueue(job(
        "build",
        &["mkdir -p deps && echo x > deps/lib.txt"],
        json!([{"key": "deps", "paths": ["deps/"]}]),
    ));
    let cfg = config(&w, &gl, &s3, "not-the-secret");
    let child = common::start_manager(&w, &cfg);
    let (state, trace) = common::job_ended(&gl, id).await;
    let stderr = common::stop_manager(&w, child);
    assert_eq!(state, "success", "{trace}\n{stderr}");
    assert!(
        trace.contains("WARNING: Failed to download the cache"),
        "{trace}"
    );
    assert!(
        trace.contains("WARNING: uploading the cache failed"),
        "{trace}"
    );
    assert!(trace.contains("HTTP 403"), "{trace}");
    assert!(s3.objects(BUCKET).unwrap().is_empty());
}

/// A cache archive in the bucket that is a 1 MB zip of 1 GiB is refused while it streams (on
/// the default limits): the job fails before its script, saying which limit, and the
/// manager's scratch directory is left empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zip_bomb_in_the_cache_fails_its_job_and_leaves_the_disk_as_it_was() {
    let s3 = LocalStack::start(BUCKET).expect("LocalStack");
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let project = "ci/runner/fAkErUnNe/project/1";
    put_object(&s3, &format!("{project}/bomb"), common::zip_bomb()).await;
    let id = gl.enqueue(job(
        "test",
        &["echo never-runs"],
        json!([{"key": "bomb", "paths": ["vendor/"], "policy": "pull"}]),
    ));
    let cfg = config(&w, &gl, &s3, SECRET_KEY);
    let child = common::start_manager(&w, &cfg);
    let (state, trace) = common::job_ended(&gl, id).await;
    let stderr = common::stop_manager(&w, child);
    assert_eq!(state, "failed", "{trace}\n{stderr}");
    for want in ["extracting the cache bomb", "refused", "max_ratio"] {
        assert!(trace.contains(want), "{want:?} missing:\n{trace}");
    }
    assert!(!trace.contains("never-runs"), "{trace}");
    common::assert_scratch_empty(&w);
}

/// Jobs `save` and `restore` run by a manager on `cfg` (which `verify-config` takes without a
/// word about the cache), each on a fresh instance, both successful, the first saving its
/// cache: their traces and the manager's stderr.
async fn save_and_restore(
    w: &World,
    gl: &FakeGitlab,
    cfg: &std::path::Path,
    save: u64,
    restore: u64,
) -> (String, String, String) {
    let verify = w.run(&["verify-config", "-c", cfg.to_str().unwrap()]);
    assert_eq!(verify.code, Some(0), "{}", verify.explain());
    for said in ["not supported", "ignored"] {
        assert!(!verify.stderr.contains(said), "{}", verify.explain());
    }
    let child = common::start_manager(w, cfg);
    let (state1, trace1) = common::job_ended(gl, save).await;
    let (state2, trace2) = common::job_ended(gl, restore).await;
    let stderr = common::stop_manager(w, child);
    assert_eq!(state1, "success", "{trace1}\n{stderr}");
    assert_eq!(state2, "success", "{trace2}\n{stderr}");
    assert!(trace1.contains("Created cache deps-build"), "{trace1}");
    assert_ne!(
        instance(&trace1),
        instance(&trace2),
        "a fresh instance each"
    );
    (trace1, trace2, stderr)
}

/// A save on one fresh instance and a restore on the next, through `cache` (a `Type` and its
/// section); `stored` reads an object back from the bucket. Returns the saved object.
async fn save_then_restore(
    cache: &str,
    stored: impl Fn(&str) -> Option<Vec<u8>>,
    secrets: &[&str],
) -> Vec<u8> {
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let save = gl.enqueue(job(
        "build",
        &["mkdir -p deps && echo saved-on-the-first > deps/lib.txt"],
        json!([{"key": "deps-$CI_JOB_NAME", "paths": ["deps/"]}]),
    ));
    let restore = gl.enqueue(job(
        "test",
        &["cat deps/lib.txt"],
        json!([{"key": "deps-build", "paths": ["deps/"], "policy": "pull"}]),
    ));
    let cfg = config_with(&w, &gl, cache);
    let (trace1, trace2, stderr) = save_and_restore(&w, &gl, &cfg, save, restore).await;
    assert!(trace2.contains("Successfully extracted cache"), "{trace2}");
    assert!(trace2.contains("saved-on-the-first"), "{trace2}");
    for t in [&trace1, &trace2, &stderr] {
        for secret in secrets {
            assert!(!t.contains(secret), "{secret:?} leaked:\n{t}");
        }
    }
    // GitLab Runner's object name, holding a zip archive.
    let saved = stored("ci/runner/fAkErUnNe/project/1/deps-build").expect("the saved object");
    assert!(saved.starts_with(b"PK"), "not a zip archive");
    saved
}

/// `Type = "gcs"` with GitLab Runner's `CredentialsFile`: URLs signed with the service
/// account's RSA key (V4), objects under GitLab Runner's names in the emulator's bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gcs_cache_is_shared_by_fresh_instances() {
    use slipway_testkit::cloud_storage::GcsEmulator;
    let gcs = GcsEmulator::start(BUCKET).expect("the GCS emulator");
    let keys = tempfile::tempdir().unwrap();
    let key_file = gcs.key_file(keys.path()).unwrap();
    let cache = format!(
        r#"Type = "gcs"
    [runners.cache.gcs]
      CredentialsFile = "{}"
      BucketName = "{BUCKET}""#,
        key_file.display()
    );
    save_then_restore(
        &cache,
        |name| gcs.object(BUCKET, name).unwrap(),
        &["X-Goog-Signature", "BEGIN PRIVATE KEY"],
    )
    .await;
}

/// `Type = "azure"` with GitLab Runner's `AccountName`, `AccountKey` and `ContainerName`
/// (and Slipway's `BlobEndpoint` for the emulator): service SAS URLs that Azurite checks,
/// block blobs under GitLab Runner's names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_azure_cache_is_shared_by_fresh_instances() {
    use slipway_testkit::cloud_storage::{AZURE_ACCOUNT, AZURE_KEY, Azurite};
    let azurite = Azurite::start(BUCKET).expect("Azurite");
    let cache = format!(
        r#"Type = "azure"
    [runners.cache.azure]
      AccountName = "{AZURE_ACCOUNT}"
      AccountKey = "{AZURE_KEY}"
      ContainerName = "{BUCKET}"
      BlobEndpoint = "{}""#,
        azurite.endpoint()
    );
    save_then_restore(
        &cache,
        |name| azurite.object(BUCKET, name).unwrap(),
        &["sig=", AZURE_KEY],
    )
    .await;
}
