//! The data path of GitLab jobs against real servers on this machine. Today: the S3 cache,
//! a 100 MiB cache (incompressible) saved and restored through LocalStack's S3 the way the
//! manager does it (archive to zip + pre-signed PUT, also with `CACHE_COMPRESSION_LEVEL:
//! fastest`; pre-signed GET + unzip), beside `curl`
//! PUTting and GETting the same zip through the same kind of URL in the same run.
//!
//! Writes (merges into) `bench/results/gitlab-data.json`. Run with
//! `cargo bench -p slipway --bench gitlab_data`.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use slipway_cache::{Credentials, S3, S3Config, transfer};
use slipway_sim::bench::{ms, percentile, round3 as round};
use slipway_testkit::s3::{ACCESS_KEY, LocalStack, SECRET_KEY};

const COMMAND: &str = "cargo bench -p slipway --bench gitlab_data";
const BUCKET: &str = "bench-cache";
const SIZE: usize = 100 * 1024 * 1024;
const ROUNDS: usize = 5;

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(bench())
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

fn curl(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("curl")
        .args(["-sS", "-f", "-o", "/dev/null"])
        .args(args)
        .output()
        .context("running curl")?;
    anyhow::ensure!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

async fn bench() -> anyhow::Result<()> {
    let s3_server = LocalStack::start(BUCKET).map_err(|e| anyhow::anyhow!("{e}"))?;
    let s3 = S3::new(S3Config {
        server_address: s3_server.address(),
        bucket: BUCKET.into(),
        insecure: true,
        credentials: Credentials {
            access_key: ACCESS_KEY.into(),
            secret_key: SECRET_KEY.into(),
            session_token: None,
        },
        ..S3Config::default()
    });
    let client = transfer::Client::new(Duration::from_secs(600))?;
    let ttl = Duration::from_secs(3600);
    let tar = tar_of(&noise(SIZE))?;
    let dir = tempfile::tempdir()?;
    let zip_file = dir.path().join("cache.zip");

    let (mut save, mut restore, mut curl_put, mut curl_get) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut save_fastest = Vec::new();
    for round in 0..ROUNDS {
        let object = format!("ci/runner/bench/project/1/key-{round}");
        // Save as the manager does: tar -> zip, then the pre-signed PUT.
        let t = Instant::now();
        let tar_copy = tar.clone();
        let archive = tokio::task::spawn_blocking(move || {
            slipway_artifacts::archive_from_tar(&tar_copy, slipway_artifacts::Format::Zip, &|_| {
                true
            })
        })
        .await??;
        let (url, headers) = s3.put_url(&object, ttl, SystemTime::now());
        let zip = archive.bytes;
        std::fs::write(&zip_file, &zip)?;
        client.put(&url, &headers, zip.into()).await?;
        save.push(ms(t.elapsed()));

        // The same with `CACHE_COMPRESSION_LEVEL: fastest` (stored).
        let t = Instant::now();
        let tar_copy = tar.clone();
        let archive = tokio::task::spawn_blocking(move || {
            slipway_artifacts::archive_from_tar_with(
                &tar_copy,
                slipway_artifacts::Format::Zip,
                &|_| true,
                slipway_artifacts::Compression::Fastest,
            )
        })
        .await??;
        let (url, headers) = s3.put_url(&format!("{object}-fastest"), ttl, SystemTime::now());
        client.put(&url, &headers, archive.bytes.into()).await?;
        save_fastest.push(ms(t.elapsed()));

        // Restore: the pre-signed GET, then zip -> tar.
        let t = Instant::now();
        let url = s3.get_url(&object, ttl, SystemTime::now());
        let body = client
            .get(&url, 2 * SIZE)
            .await?
            .context("the object just saved is missing")?;
        let unpacked =
            tokio::task::spawn_blocking(move || slipway_artifacts::zip_to_tar(&body)).await??;
        anyhow::ensure!(unpacked.len() >= SIZE, "restored {} bytes", unpacked.len());
        restore.push(ms(t.elapsed()));

        // Baseline: curl moving the same zip through the same kind of URLs.
        let (url, _) = s3.put_url(&format!("{object}-curl"), ttl, SystemTime::now());
        let file = zip_file.display().to_string();
        let t = Instant::now();
        curl(&["-X", "PUT", "-T", &file, &url])?;
        curl_put.push(ms(t.elapsed()));
        let url = s3.get_url(&format!("{object}-curl"), ttl, SystemTime::now());
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
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let (_, text) = slipway_sim::bench::write(&repo, "gitlab-data", COMMAND, results)?;
    println!("{text}");
    Ok(())
}
