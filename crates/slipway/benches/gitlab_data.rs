//! The data path of GitLab jobs against real servers on this machine, in three parts:
//!
//! - **fleet**: `slipway run` serving the GitLab test server, 8 concurrent jobs each fetching a
//!   1 GiB repository of incompressible blobs (smart HTTP, `git http-backend`) and uploading a
//!   512 MiB artifact; the manager process's resident memory idle and at its peak (VmHWM).
//! - **upload**: a 512 MiB artifact (one incompressible file) uploaded by the job helper as a
//!   job's host runs it (collected by the executors' collect script, zipped while it is
//!   POSTed), and by the manager's GitLab
//!   client from an archive file (the `job_data = "manager"` path), beside `curl` POSTing the
//!   archive to the same endpoint.
//! - **host**: `slipway run` with the job helper on an instance sharing this machine's network:
//!   one job with a 1 GiB dependency, a 512 MiB artifact and a 100 MiB cache (LocalStack's
//!   S3), all incompressible. The bytes the manager read and wrote during it beyond those of a
//!   job without data (measured first, in the same run, after the helper was copied) are the
//!   job data that crossed it (`/proc/<pid>/io`: files, sockets, pipes).
//! - **cache**: a 100 MiB cache (incompressible) saved and restored through LocalStack's S3
//!   the way the manager does it (the collected tar file zipped into a file and PUT from it
//!   through a pre-signed URL, also with `CACHE_COMPRESSION_LEVEL: fastest`; pre-signed GET
//!   into a file, unzipped file to file), beside `curl` PUTting and GETting the same zip
//!   through the same kind of URL.
//! - **realistic**: the `node_modules` of a mid-size npm project (webpack, TypeScript, ESLint,
//!   Jest, Express, Babel, lodash; installed with npm once, kept under `target/bench-trees`)
//!   saved and restored by the job helper as a job's host runs it (the executors' collect
//!   script writing the cache's paths into the stage's scratch directory, then `slipway-helper run` with the
//!   plan on stdin), in GitLab Runner's `tarzstd` and default `zip` formats at the default
//!   level, beside the pipeline `tar c | zstd -T0 | curl -T -` and `curl | zstd -d | tar x`
//!   on the same S3 server.
//!
//! `SLIPWAY_BENCH_PARTS` (comma-separated; all by default) picks parts; `SLIPWAY_BENCH_REPO_MIB`,
//! `SLIPWAY_BENCH_ARTIFACT_MIB` and `SLIPWAY_BENCH_JOBS` scale the fleet part (the sizes used
//! are in the results). Writes `bench/results/gitlab-data.json` (with only some parts, replaces
//! their keys in it). Run with
//! `cargo bench -p slipway --bench gitlab_data`.

#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use slipway_cache::{Credentials, S3Config, Store, StoreConfig, transfer};
use slipway_testkit::bench::{ms, percentile, round3 as round};
use slipway_testkit::s3::{ACCESS_KEY, LocalStack, SECRET_KEY};

const COMMAND: &str = "cargo bench -p slipway --bench gitlab_data";
const BUCKET: &str = "bench-cache";
const SIZE: usize = 100 * 1024 * 1024;
const ROUNDS: usize = 5;

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let all = std::env::var("SLIPWAY_BENCH_PARTS").is_err();
    let parts = std::env::var("SLIPWAY_BENCH_PARTS")
        .unwrap_or_else(|_| "host,fleet,upload,cache,realistic".into());
    let mut results = serde_json::Map::new();
    for part in parts.split(',').map(str::trim) {
        let got = match part {
            "host" => rt.block_on(host())?,
            "fleet" => rt.block_on(fleet())?,
            "upload" => rt.block_on(upload())?,
            "cache" => rt.block_on(bench())?,
            "realistic" => rt.block_on(realistic())?,
            other => {
                anyhow::bail!(
                    "SLIPWAY_BENCH_PARTS: unknown part {other:?} (host, fleet, upload, cache, \
                     realistic)"
                )
            }
        };
        if let serde_json::Value::Object(m) = got {
            results.extend(m);
        }
    }
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    // Some parts only: their keys replace those of the file, the others stay.
    let (_, text) = if all {
        slipway_testkit::bench::write(&repo, "gitlab-data", COMMAND, results.into())?
    } else {
        slipway_testkit::bench::merge(&repo, "gitlab-data", results)?
    };
    println!("{text}");
    Ok(())
}

const MIB: u64 = 1024 * 1024;

fn env_u64(name: &str, default: u64) -> anyhow::Result<u64> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .with_context(|| format!("{name}: expected a whole number, got {v:?}")),
        Err(_) => Ok(default),
    }
}

/// Writes `len` incompressible bytes to `path`, in 8 MiB pieces (never all in memory).
fn write_noise(path: &std::path::Path, len: u64, seed: u64) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ seed.wrapping_mul(0x2545_f491_4f6c_dd1d);
    let mut buf = vec![0u8; 8 * MIB as usize];
    let mut left = len;
    while left > 0 {
        for chunk in buf.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.flush()?;
    Ok(())
}

/// A field of `/proc/<pid>/status` in bytes (`VmRSS`, `VmHWM`).
fn proc_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
}

/// The fleet part: the manager's memory while jobs move repositories and artifacts far larger
/// than the bound the issue sets (64 MiB between idle and peak).
async fn fleet() -> anyhow::Result<serde_json::Value> {
    let repo_mib = env_u64("SLIPWAY_BENCH_REPO_MIB", 1024)?;
    let artifact_mib = env_u64("SLIPWAY_BENCH_ARTIFACT_MIB", 512)?;
    let jobs = env_u64("SLIPWAY_BENCH_JOBS", 8)?;
    let w = common::World::new();
    let gl = slipway_testkit::gitlab::FakeGitlab::start().await;
    let root = w.path().join("srv");
    let _repos = gl.serve_git(&root);
    // The repository: 64 MiB blobs of noise, stored uncompressed (zlib cannot shrink them and
    // would only cost time on both sides).
    let work = w.path().join("authoring");
    std::fs::create_dir_all(work.join("blobs"))?;
    let blob = 64.min(repo_mib.max(1));
    for i in 0..repo_mib.div_ceil(blob) {
        write_noise(&work.join(format!("blobs/{i:03}.bin")), blob * MIB, i)?;
    }
    let t = Instant::now();
    common::git(&work, &["init", "-q", "-b", "main"]);
    common::git(&work, &["config", "core.compression", "0"]);
    common::git(&work, &["config", "core.bigFileThreshold", "1m"]);
    common::git(&work, &["add", "-A"]);
    common::git(&work, &["commit", "-q", "-m", "blobs"]);
    let sha = common::git(&work, &["rev-parse", "HEAD"])
        .trim()
        .to_string();
    let bare = root.join("group/big.git");
    std::fs::create_dir_all(root.join("group"))?;
    common::git(
        &root,
        &[
            "clone",
            "-q",
            "--bare",
            &work.display().to_string(),
            &bare.display().to_string(),
        ],
    );
    common::git(&bare, &["config", "pack.compression", "0"]);
    // Noise has no deltas: searching for them would cost minutes on every fetch.
    common::git(&bare, &["config", "core.bigFileThreshold", "1m"]);
    common::git(&bare, &["repack", "-q", "-a", "-d", "--window=0"]);
    std::fs::remove_dir_all(&work)?;
    eprintln!(
        "fleet: a {repo_mib} MiB repository made in {:.0} s",
        t.elapsed().as_secs_f64()
    );

    let name = "fleet";
    let cfg = w.write(
        "config.toml",
        &format!(
            r#"
concurrent = {jobs}
check_interval = 1
[[runners]]
  name = "{name}"
  url = "{url}"
  token = "{token}"
  executor = "instance"
{autoscaler}"#,
            url = gl.url(),
            token = gl.runner_token(),
            // The instances share this machine's network: the job helper uploads from there.
            autoscaler = common::on_loopback(&common::local_autoscaler_of(
                &w,
                name,
                jobs.div_ceil(2) as u32
            )),
        ),
    );
    let child = common::start_manager(&w, &cfg);
    let pid = child.id();
    // Measured in a block so that every way out stops the manager.
    let measured = async {
        // Idle: started, polling, its runner's state loaded.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let idle = proc_kib(pid, "VmRSS").context("reading the manager's VmRSS")?;
        let token = "glcbt-1_benchTokenForTheJob01";
        let mut ids = Vec::new();
        for n in 0..jobs {
            let mut job = slipway_testkit::gitlab::job_payload_with_vars(
                &format!("big-{n}"),
                &[
                    "test -d .git || exit 3",
                    // The job's disk is the bench's: the sources go once checked.
                    "rm -rf .git",
                    &format!("head -c {artifact_mib}M /dev/urandom > out.bin"),
                ],
                &[
                    ("GIT_STRATEGY", "fetch"),
                    ("GIT_CHECKOUT", "false"),
                    ("ARTIFACT_COMPRESSION_LEVEL", "fastest"),
                ],
            );
            job["token"] = serde_json::json!(token);
            job["job_info"]["project_full_path"] = serde_json::json!("group/big");
            job["git_info"]["repo_url"] = serde_json::json!(gl.repo_url("group/big", token));
            job["git_info"]["sha"] = serde_json::json!(sha);
            job["git_info"]["depth"] = serde_json::json!(1);
            job["artifacts"] = serde_json::json!([{"paths": ["out.bin"], "when": "on_success",
            "artifact_type": "archive", "artifact_format": "zip", "name": "out"}]);
            ids.push(gl.enqueue(job));
        }
        let started = Instant::now();
        // VmHWM is the process's own peak; sampled RSS says when.
        let mut samples = Vec::new();
        let mut ended = Vec::new();
        while ended.len() < ids.len() {
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(3600),
                "fleet: jobs still running after an hour"
            );
            if let Some(rss) = proc_kib(pid, "VmRSS") {
                samples.push(rss);
            }
            ended = ids
                .iter()
                .filter_map(|id| {
                    gl.job_state(*id)
                        .filter(|(state, _)| state == "success" || state == "failed")
                        .map(|(state, sizes)| (*id, state, sizes))
                })
                .collect();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let elapsed = started.elapsed();
        let peak = proc_kib(pid, "VmHWM").context("reading the manager's VmHWM")?;
        let sampled_peak = samples.iter().copied().max().unwrap_or(idle);
        for (id, state, _) in &ended {
            if state != "success" {
                let trace = gl.job(*id).map(|j| j.trace_text()).unwrap_or_default();
                anyhow::bail!("fleet: job {id} {state}:\n{trace}");
            }
        }
        let stored: u64 = ended
            .iter()
            .flat_map(|(_, _, sizes)| sizes.iter())
            .map(|n| *n as u64)
            .sum();
        anyhow::ensure!(
            stored >= jobs * artifact_mib * MIB,
            "fleet: {stored} bytes of artifacts stored, expected {jobs} × {artifact_mib} MiB"
        );
        anyhow::Ok((idle, peak, sampled_peak, elapsed))
    }
    .await;
    let _ = common::stop_manager(&w, child);
    let (idle, peak, sampled_peak, elapsed) = measured?;
    eprintln!(
        "fleet: {jobs} jobs in {:.0} s; manager RSS idle {} MiB, peak {} MiB (sampled {} MiB)",
        elapsed.as_secs_f64(),
        idle / MIB,
        peak / MIB,
        sampled_peak / MIB
    );
    Ok(serde_json::json!({
        "fleet_jobs": jobs,
        "fleet_repository_bytes": repo_mib * MIB,
        "fleet_artifact_bytes": artifact_mib * MIB,
        "fleet_seconds": round(elapsed.as_secs_f64()),
        "manager_rss_idle_bytes": idle,
        "manager_rss_peak_bytes": peak,
        "manager_rss_sampled_peak_bytes": sampled_peak,
        "manager_rss_growth_bytes": peak.saturating_sub(idle),
        "manager_rss_growth_goal_bytes": 64 * MIB,
    }))
}

/// Bytes the process `pid` read and wrote through system calls (`rchar` + `wchar`).
fn io_bytes(pid: u32) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/io"))?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(": ")?;
            matches!(k, "rchar" | "wchar").then(|| v.trim().parse::<u64>().ok())?
        })
        .sum())
}

/// The host part: the job data that crossed the manager for one job of the issue's shape.
async fn host() -> anyhow::Result<serde_json::Value> {
    let dep_mib = env_u64("SLIPWAY_BENCH_DEP_MIB", 1024)?;
    let artifact_mib = env_u64("SLIPWAY_BENCH_ARTIFACT_MIB", 512)?;
    let cache_mib = env_u64("SLIPWAY_BENCH_CACHE_MIB", 100)?;
    let s3 = LocalStack::start(BUCKET).map_err(|e| anyhow::anyhow!("{e}"))?;
    let w = common::World::new();
    let gl = slipway_testkit::gitlab::FakeGitlab::start().await;
    // The dependency: noise, stored in its zip (deflate cannot shrink it).
    let src = w.path().join("dep");
    std::fs::create_dir_all(src.join("dep"))?;
    write_noise(&src.join("dep/payload.bin"), dep_mib * MIB, 11)?;
    let zip = w.path().join("dep.zip");
    let st = Command::new("python3")
        .args([
            "-c",
            "import sys, zipfile\n\
             with zipfile.ZipFile(sys.argv[1], 'w', zipfile.ZIP_STORED) as z: \
             z.write('dep/payload.bin')",
        ])
        .arg(&zip)
        .current_dir(&src)
        .status()?;
    anyhow::ensure!(st.success(), "host: zipping the dependency failed");
    std::fs::remove_dir_all(&src)?;
    let dep_id = 700;
    gl.put_artifact(dep_id, "glcbt-1_benchDependency1", std::fs::read(&zip)?);
    std::fs::remove_file(&zip)?;
    let cfg = w.write(
        "config.toml",
        &format!(
            r#"
concurrent = 1
check_interval = 1
[[runners]]
  name = "host"
  url = "{url}"
  token = "{token}"
  executor = "instance"
  [runners.cache]
    Type = "s3"
    Path = "ci"
    [runners.cache.s3]
      ServerAddress = "{server}"
      AccessKey = "{ACCESS_KEY}"
      SecretKey = "{SECRET_KEY}"
      BucketName = "{BUCKET}"
      Insecure = true
{autoscaler}"#,
            url = gl.url(),
            token = gl.runner_token(),
            server = s3.address(),
            autoscaler = common::on_loopback(&common::local_autoscaler_of(&w, "host", 1)),
        ),
    );
    let child = common::start_manager(&w, &cfg);
    let pid = child.id();
    let measured = async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let idle = proc_kib(pid, "VmRSS").context("reading the manager's VmRSS")?;
        // The baseline: a job without data beyond a one-byte artifact (which copies the
        // helper to the instance, as the first job of an instance does).
        let run = |job: serde_json::Value| {
            let id = gl.enqueue(job);
            let gl = &gl;
            async move {
                let before = io_bytes(pid)?;
                let t = Instant::now();
                let (state, trace) = common::job_ended(gl, id).await;
                anyhow::ensure!(state == "success", "host: job {id} {state}:\n{trace}");
                anyhow::Ok((io_bytes(pid)? - before, t.elapsed()))
            }
        };
        let mut warm = slipway_testkit::gitlab::job_payload_with_vars(
            "warm",
            &["mkdir -p out && echo x > out/x"],
            &[("GIT_STRATEGY", "none")],
        );
        warm["artifacts"] = serde_json::json!([{"paths": ["out/"], "when": "on_success",
            "artifact_type": "archive", "artifact_format": "zip"}]);
        run(warm.clone()).await?;
        let (baseline, _) = run(warm).await?;
        let mut job = slipway_testkit::gitlab::job_payload_with_vars(
            "data",
            &[
                "test -f dep/payload.bin",
                "rm -f dep/payload.bin",
                &format!(
                    "mkdir -p out vendor && head -c {artifact_mib}M /dev/urandom > out/app.bin \
                     && head -c {cache_mib}M /dev/urandom > vendor/deps.bin"
                ),
            ],
            &[("GIT_STRATEGY", "none")],
        );
        job["dependencies"] = serde_json::json!([{"id": dep_id,
            "token": "glcbt-1_benchDependency1", "name": "prepare",
            "artifacts_file": {"filename": "artifacts.zip", "size": dep_mib * MIB}}]);
        job["artifacts"] = serde_json::json!([{"paths": ["out/"], "when": "on_success",
            "artifact_type": "archive", "artifact_format": "zip"}]);
        job["cache"] = serde_json::json!([{"key": "deps", "paths": ["vendor/"],
            "policy": "pull-push", "when": "on_success"}]);
        let (data, took) = run(job).await?;
        let peak = proc_kib(pid, "VmHWM").context("reading the manager's VmHWM")?;
        anyhow::Ok((baseline, data, took, idle, peak))
    }
    .await;
    let _ = common::stop_manager(&w, child);
    let (baseline, data, took, idle, peak) = measured?;
    let moved = (dep_mib + artifact_mib + cache_mib) * MIB;
    eprintln!(
        "host: the data job moved {} MiB in {:.1} s; the manager read and wrote {data} bytes \
         during it, {baseline} during a job without data",
        moved / MIB,
        took.as_secs_f64()
    );
    Ok(serde_json::json!({
        "host_job_data_bytes": moved,
        "host_job_seconds": round(took.as_secs_f64()),
        "manager_io_bytes_data_job": data,
        "manager_io_bytes_baseline_job": baseline,
        "manager_job_bytes_per_job": data.saturating_sub(baseline),
        "manager_job_bytes_goal": 0,
        "host_manager_rss_growth_bytes": peak.saturating_sub(idle),
    }))
}

/// The upload part: one archive, our client against curl, same file, same server, same run.
async fn upload() -> anyhow::Result<serde_json::Value> {
    use slipway_gitlab::{
        ClientConfig, GitlabClient, Secret, SystemId, UploadOptions, VersionInfo,
    };
    let size_mib = env_u64("SLIPWAY_BENCH_UPLOAD_MIB", 512)?;
    let rounds = 3;
    let gl = slipway_testkit::gitlab::FakeGitlab::start().await;
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("artifacts.zip");
    write_noise(&file, size_mib * MIB, 7)?;
    let client = GitlabClient::new(ClientConfig::new(
        gl.url(),
        VersionInfo::new("instance", "bash", [("artifacts".to_string(), true)]),
    ))?;
    // The job helper's upload from the job's host: the collected tar (the artifact's one file)
    // zipped (stored: incompressible) while it is POSTed as GitLab's form.
    let helper = static_helper()?;
    let project = dir.path().join("project");
    std::fs::create_dir_all(project.join("out"))?;
    std::fs::hard_link(&file, project.join("out/app.bin"))?;
    let mut from_host = Vec::new();
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    let opts = UploadOptions {
        name: None,
        artifact_type: "archive".into(),
        artifact_format: "zip".into(),
        expire_in: None,
    };
    for round in 0..rounds {
        // A running job per upload: the server keeps what it is sent.
        let running = |token: String| {
            let (gl, client) = (&gl, &client);
            async move {
                let mut job =
                    slipway_testkit::gitlab::job_payload_with_vars("upload", &["true"], &[]);
                job["token"] = serde_json::json!(token);
                gl.enqueue(job);
                let runner = Secret::new(gl.runner_token());
                client
                    .request_job(&runner, &SystemId::generate(), None)
                    .await
            }
        };
        let got = running(format!("glcbt-1_upload{round:04}"))
            .await?
            .job
            .context("a job to upload for")?;
        let t = Instant::now();
        client
            .upload_artifacts_file(got.id, &Secret::new(got.token.clone()), &file, &opts)
            .await?;
        ours.push(t.elapsed().as_secs_f64());
        // The fake server keeps what it is sent: forgotten after each upload, so none is
        // made into a server holding the ones before.
        gl.forget_artifact_bytes();
        let url = format!(
            "{}/api/v4/jobs/{}/artifacts?artifact_format=zip&artifact_type=archive",
            gl.url().trim_end_matches('/'),
            got.id
        );
        let t = Instant::now();
        curl(&[
            "-X",
            "POST",
            "-H",
            &format!("JOB-TOKEN: {}", got.token),
            "-F",
            &format!("file=@{};filename=artifacts.zip", file.display()),
            &url,
        ])?;
        theirs.push(t.elapsed().as_secs_f64());
        gl.forget_artifact_bytes();

        let got = running(format!("glcbt-1_helper{round:04}"))
            .await?
            .job
            .context("a job to upload for")?;
        let plan = serde_json::json!({"steps": [{"do": "upload", "job_id": got.id,
            "succeeded": true, "url": client.upload_artifacts_url(got.id, &opts),
            "token": got.token, "artifact_type": "archive", "artifact_format": "zip",
            "name": null, "expire_in": null, "compression": "", "paths": ["out/"],
            "exclude": [], "untracked": false, "tar": "collected.tar"}]});
        sh("sync")?;
        let t = Instant::now();
        let said = helper_stage(&helper, &project, Some(&["out"]), &plan)?;
        from_host.push(t.elapsed().as_secs_f64());
        anyhow::ensure!(said.contains("201 Created"), "{said}");
        gl.forget_artifact_bytes();
        eprintln!(
            "upload round {round}: manager client {:.2} s, helper on the host {:.2} s, curl {:.2} s",
            ours[round], from_host[round], theirs[round]
        );
    }
    let p50 = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        percentile(v, 50.0)
    };
    let (ours, theirs) = (p50(&mut ours), p50(&mut theirs));
    let host = p50(&mut from_host);
    let mib = size_mib as f64;
    Ok(serde_json::json!({
        "upload_bytes": size_mib * MIB,
        "upload_rounds": rounds,
        // The helper on the job's host: collecting the file, archiving it and POSTing it,
        // against curl POSTing an archive already made (higher is better).
        "artifact_upload_mib_s": round(mib / host),
        "curl_upload_mib_s": round(mib / theirs),
        "artifact_upload_over_curl": round(theirs / host),
        "manager_client_upload_mib_s": round(mib / ours),
        "manager_client_upload_over_curl": round(theirs / ours),
    }))
}

/// Incompressible bytes (xorshift), so neither zip nor the wire can shrink them.
fn noise(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A tar stream holding `deps/blob.bin` (what the executor collects for a cache).
fn tar_of(data: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    b.append_data(&mut h, "deps/blob.bin", data)?;
    Ok(b.into_inner()?)
}

/// The `node_modules` tree of the realistic part: its project directory, installed with npm
/// when missing.
fn npm_tree() -> anyhow::Result<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-trees/npm");
    if dir.join("node_modules/.package-lock.json").exists() {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("package.json"),
        r#"{"name":"bench-tree","version":"1.0.0","private":true,"dependencies":{"webpack":"5","typescript":"5","eslint":"8","jest":"29","express":"4","lodash":"4","@babel/core":"7"}}"#,
    )?;
    let out = Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
        .current_dir(&dir)
        .output()
        .context("running npm install (install Node.js and npm)")?;
    anyhow::ensure!(
        out.status.success(),
        "npm install: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(dir)
}

/// Files and bytes under `dir`.
fn tree_size(dir: &std::path::Path) -> (u64, u64) {
    let (mut files, mut bytes) = (0, 0);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            if m.is_dir() {
                stack.push(e.path());
            } else {
                files += 1;
                bytes += m.len();
            }
        }
    }
    (files, bytes)
}

/// `bash -c script`, failing on a non-zero exit.
fn sh(script: &str) -> anyhow::Result<()> {
    succeeds(
        Command::new("bash").args(["-o", "pipefail", "-c", script]),
        script,
    )
}

/// Run `cmd`; its stderr in the error when it fails, named `what`.
fn succeeds(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    anyhow::ensure!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// One helper stage run as a host runs it: `plan` on stdin, a fresh scratch directory,
/// the `collect` paths first (the executors' collect script writing `$S/collected.tar`); what
/// the helper said.
fn helper_stage(
    helper: &std::path::Path,
    project: &std::path::Path,
    collect: Option<&[&str]>,
    plan: &serde_json::Value,
) -> anyhow::Result<String> {
    use std::io::Write as _;
    let scratch = tempfile::tempdir()?;
    if let Some(paths) = collect {
        // The executors' own collect script, in a builds directory whose job directory is
        // the project.
        let builds = tempfile::tempdir()?;
        std::fs::create_dir_all(builds.path().join("slot-0"))?;
        std::os::unix::fs::symlink(project, builds.path().join("slot-0/job-1"))?;
        let dirs = slipway_executor::script::JobDirs {
            builds_dir: builds.path().display().to_string(),
            slot: 0,
            job_id: 1,
            clone_path: None,
        };
        let paths: Vec<String> = paths.iter().map(|p| p.to_string()).collect();
        let script = slipway_executor::script::collect_script(&dirs, &paths);
        let tar = std::fs::File::create(scratch.path().join("collected.tar"))?;
        let out = Command::new("bash")
            .arg("-c")
            .arg(&script)
            .stdout(tar)
            .stderr(std::process::Stdio::piped())
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "collecting: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut child = Command::new(helper)
        .args(["run", "--scratch"])
        .arg(scratch.path())
        .current_dir(project)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("starting the job helper")?;
    child
        .stdin
        .take()
        .context("helper stdin")?
        .write_all(&serde_json::to_vec(plan)?)?;
    let out = child.wait_with_output()?;
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    anyhow::ensure!(out.status.success(), "the job helper failed: {said}");
    Ok(said)
}

/// Pre-signed URLs for the bench bucket on `server`.
fn signer(server: &LocalStack) -> anyhow::Result<Store> {
    Ok(Store::new(&StoreConfig::S3(S3Config {
        server_address: server.address(),
        bucket: BUCKET.into(),
        insecure: true,
        credentials: Credentials {
            access_key: ACCESS_KEY.into(),
            secret_key: SECRET_KEY.into(),
            session_token: None,
        },
        ..S3Config::default()
    }))?)
}

/// The static job helper `make helper` builds.
fn static_helper() -> anyhow::Result<PathBuf> {
    let helper = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/x86_64-unknown-linux-gnu/release/slipway-helper");
    anyhow::ensure!(
        helper.exists(),
        "{} is missing: run `make helper`",
        helper.display()
    );
    Ok(helper)
}

/// The realistic part.
async fn realistic() -> anyhow::Result<serde_json::Value> {
    const ROUNDS: usize = 3;
    let helper = static_helper()?;
    let tree = npm_tree()?;
    let (files, bytes) = tree_size(&tree.join("node_modules"));
    let s3_server = LocalStack::start(BUCKET).map_err(|e| anyhow::anyhow!("{e}"))?;
    let s3 = signer(&s3_server)?;
    let ttl = Duration::from_secs(3600);
    let mut times: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    let mut sizes: std::collections::BTreeMap<&str, u64> = Default::default();
    for round in 0..ROUNDS {
        // Warm the page cache alike for everyone: each round reads the tree first.
        sh(&format!(
            "tar -c -C {} node_modules > /dev/null",
            tree.display()
        ))?;
        // (format, and the keys of its save and restore times and of its size)
        for (format, save, restore, size) in [
            ("tarzstd", "save_zstd", "restore_zstd", "zstd"),
            ("zip", "save_zip", "restore_zip", "zip"),
        ] {
            let object = format!("ci/runner/bench/project/1/npm-{format}-{round}");
            let (url, headers) = s3.put_url(&object, ttl).await?;
            let plan = serde_json::json!({"steps": [{"do": "save_cache", "key": "npm",
                "url": url, "headers": headers, "max_upload": 0, "paths": ["node_modules"],
                "untracked": false, "compression": "", "format": format, "timeout_secs": 600,
                "tar": "collected.tar"}]});
            // Dirty pages of the previous step written back first, so none is billed for them.
            sh("sync")?;
            let t = Instant::now();
            let said = helper_stage(&helper, &tree, Some(&["node_modules"]), &plan)?;
            times.entry(save).or_default().push(ms(t.elapsed()));
            anyhow::ensure!(said.contains("Created cache npm"), "{said}");
            let stored = s3_server
                .object(BUCKET, &object)
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .len() as u64;
            sizes.insert(size, stored);

            let project = tempfile::tempdir()?;
            let url = s3.get_url(&object, ttl).await?;
            let plan = serde_json::json!({"steps": [{"do": "restore_cache",
                "sources": [["npm", url]], "attempts": 1, "timeout_secs": 600}]});
            sh("sync")?;
            let t = Instant::now();
            let said = helper_stage(&helper, project.path(), None, &plan)?;
            times.entry(restore).or_default().push(ms(t.elapsed()));
            anyhow::ensure!(said.contains("Successfully extracted cache"), "{said}");
            let restored = tree_size(&project.path().join("node_modules"));
            anyhow::ensure!(
                restored == (files, bytes),
                "restored {restored:?} of {:?}",
                (files, bytes)
            );
        }
        // The pipeline: GNU tar, zstd on every core, curl streaming to and from the same S3.
        let object = format!("ci/runner/bench/project/1/npm-pipeline-{round}");
        let (url, _) = s3.put_url(&object, ttl).await?;
        sh("sync")?;
        let t = Instant::now();
        sh(&format!(
            "tar -c -C {} node_modules | zstd -q -T0 | curl -sS -f -o /dev/null -T - '{url}'",
            tree.display()
        ))?;
        times
            .entry("save_pipeline")
            .or_default()
            .push(ms(t.elapsed()));
        let project = tempfile::tempdir()?;
        let url = s3.get_url(&object, ttl).await?;
        sh("sync")?;
        let t = Instant::now();
        sh(&format!(
            "curl -sS -f '{url}' | zstd -q -d | tar -x -C {}",
            project.path().display()
        ))?;
        times
            .entry("restore_pipeline")
            .or_default()
            .push(ms(t.elapsed()));
        eprintln!(
            "round {round}: {:?}",
            times
                .iter()
                .map(|(k, v)| (*k, v[round].round()))
                .collect::<Vec<_>>()
        );
    }
    let p50: std::collections::BTreeMap<&str, f64> = times
        .into_iter()
        .map(|(k, mut v)| {
            v.sort_by(f64::total_cmp);
            (k, round(percentile(&v, 50.0)))
        })
        .collect();
    Ok(serde_json::json!({
        "realistic_tree": "node_modules of webpack, typescript, eslint, jest, express, lodash, @babel/core (npm)",
        "realistic_tree_files": files,
        "realistic_tree_bytes": bytes,
        "realistic_rounds": ROUNDS,
        "cache_save_realistic_ms_p50": p50["save_zstd"],
        "cache_save_realistic_zip_ms_p50": p50["save_zip"],
        "pipeline_save_realistic_ms_p50": p50["save_pipeline"],
        "cache_save_realistic_over_pipeline": round(p50["save_zstd"] / p50["save_pipeline"]),
        "cache_save_realistic_zip_over_pipeline": round(p50["save_zip"] / p50["save_pipeline"]),
        "cache_restore_realistic_ms_p50": p50["restore_zstd"],
        "cache_restore_realistic_zip_ms_p50": p50["restore_zip"],
        "pipeline_restore_realistic_ms_p50": p50["restore_pipeline"],
        "cache_restore_realistic_over_pipeline": round(p50["restore_zstd"] / p50["restore_pipeline"]),
        "cache_restore_realistic_zip_over_pipeline": round(p50["restore_zip"] / p50["restore_pipeline"]),
        "cache_realistic_tarzstd_bytes": sizes.get("zstd"),
        "cache_realistic_zip_bytes": sizes.get("zip"),
    }))
}

fn curl(args: &[&str]) -> anyhow::Result<()> {
    succeeds(
        Command::new("curl")
            .args(["-sS", "-f", "-o", "/dev/null"])
            .args(args),
        "curl",
    )
}

/// The cache part.
async fn bench() -> anyhow::Result<serde_json::Value> {
    let s3_server = LocalStack::start(BUCKET).map_err(|e| anyhow::anyhow!("{e}"))?;
    let s3 = signer(&s3_server)?;
    let client = transfer::Client::new(Duration::from_secs(600))?;
    let ttl = Duration::from_secs(3600);
    let dir = tempfile::tempdir()?;
    let tar_file = dir.path().join("collected.tar");
    std::fs::write(&tar_file, tar_of(&noise(SIZE))?)?;
    let zip_file = dir.path().join("cache.zip");

    let (mut save, mut restore, mut curl_put, mut curl_get) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut save_fastest = Vec::new();
    for round in 0..ROUNDS {
        let object = format!("ci/runner/bench/project/1/key-{round}");
        // Save as the manager does it: the collected tar file zipped into a file, then PUT
        // from it through the pre-signed URL.
        let t = Instant::now();
        let archive = |compression| {
            let (tar, out) = (tar_file.clone(), zip_file.clone());
            tokio::task::spawn_blocking(move || {
                slipway_artifacts::archive_file_from_tar_file(
                    &tar,
                    &out,
                    slipway_artifacts::Format::Zip,
                    &|_| true,
                    compression,
                )
            })
        };
        archive(slipway_artifacts::Compression::Default).await??;
        let (url, headers) = s3.put_url(&object, ttl).await?;
        client.put_file(&url, &headers, &zip_file).await?;
        save.push(ms(t.elapsed()));

        // The same with `CACHE_COMPRESSION_LEVEL: fastest` (stored).
        let t = Instant::now();
        archive(slipway_artifacts::Compression::Fastest).await??;
        let (url, headers) = s3.put_url(&format!("{object}-fastest"), ttl).await?;
        client.put_file(&url, &headers, &zip_file).await?;
        save_fastest.push(ms(t.elapsed()));

        // Restore: the pre-signed GET into a file, then zip -> tar file to file.
        let t = Instant::now();
        let url = s3.get_url(&object, ttl).await?;
        let (got, back) = (dir.path().join("got.zip"), dir.path().join("back.tar"));
        anyhow::ensure!(
            client.get_to_file(&url, &got, 2 * SIZE).await?,
            "the object just saved is missing"
        );
        let (from, to) = (got.clone(), back.clone());
        tokio::task::spawn_blocking(move || {
            slipway_artifacts::zip_file_to_tar_file(
                &from,
                &to,
                &slipway_artifacts::Limits::default(),
            )
        })
        .await??;
        let unpacked = std::fs::metadata(&back)?.len();
        anyhow::ensure!(unpacked >= SIZE as u64, "restored {unpacked} bytes");
        restore.push(ms(t.elapsed()));

        // The archive of the default level again, for curl (the fastest one overwrote it).
        archive(slipway_artifacts::Compression::Default).await??;
        // Baseline: curl moving the same zip through the same kind of URLs.
        let (url, _) = s3.put_url(&format!("{object}-curl"), ttl).await?;
        let file = zip_file.display().to_string();
        let t = Instant::now();
        curl(&["-X", "PUT", "-T", &file, &url])?;
        curl_put.push(ms(t.elapsed()));
        let url = s3.get_url(&format!("{object}-curl"), ttl).await?;
        let t = Instant::now();
        curl(&[&url])?;
        curl_get.push(ms(t.elapsed()));
        eprintln!(
            "round {round}: save {:.0} ms, restore {:.0} ms, curl put {:.0} ms, curl get {:.0} ms",
            save[round], restore[round], curl_put[round], curl_get[round]
        );
    }
    let p50 = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        round(percentile(v, 50.0))
    };
    let (save50, restore50) = (p50(&mut save), p50(&mut restore));
    let fastest50 = p50(&mut save_fastest);
    let (put50, get50) = (p50(&mut curl_put), p50(&mut curl_get));
    let results = serde_json::json!({
        "cache_bytes": SIZE,
        "cache_rounds": ROUNDS,
        "cache_save_ms_p50": save50,
        "cache_restore_ms_p50": restore50,
        "curl_cache_put_ms_p50": put50,
        "curl_cache_get_ms_p50": get50,
        "cache_save_over_curl_put_p50": round(save50 / put50),
        "cache_save_fastest_ms_p50": fastest50,
        "cache_save_fastest_over_curl_put_p50": round(fastest50 / put50),
        "cache_restore_over_curl_get_p50": round(restore50 / get50),
    });
    Ok(results)
}
