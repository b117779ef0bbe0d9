//! VM start: cold boot vs snapshot restore on the same guest, and the disk four branches of one
//! snapshot take vs four full copies, measured in one run on this machine.
//!
//! - `cold_boot_ms_*`: `Create` on the nesting daemon (disk layer, QEMU started, guest boots)
//!   until the guest agent's first answer — the daemon's `Create` returns at that moment.
//! - `restore_ms_*`: `Restore` of a snapshot of that same guest (taken once it had booted) until
//!   the agent's first answer.
//! - `branch4_disk_bytes`: after 32 MiB were written to the guest's disk and the VM was
//!   snapshotted, four branches restored and each wrote 1 MiB of its own: the bytes allocated by
//!   the snapshot (memory image + frozen disk layer) plus the four branch layers.
//! - `full_copy4_disk_bytes`: four independent copies of the same state: per copy the memory
//!   image plus the disk chain flattened into one qcow2 (`qemu-img convert`), plus the same
//!   1 MiB of writes each.
//! - `accel`: `kvm` or `tcg` (this machine's KVM does not run guests: expect `tcg`).
//!
//! Goals (issue 6): restore p50 at most a quarter of cold boot p50; four branches under 1.2 × the
//! disk of one full copy.
//!
//! Regenerate with `cargo bench -p slipway-nesting --bench vm` (as root: it installs QEMU and the
//! image tools when missing and builds a guest image). Every VM it starts is deleted at the end.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use slipway_nesting::Level;
use slipway_nesting::agent;
use slipway_nesting::client::{AgentAddr, NestingClient};
use slipway_nesting::daemon::{Daemon, DaemonOptions};
use slipway_nesting::disk::allocated_bytes;
use slipway_nesting::image::{self, BuildOptions};
use slipway_nesting::proto::VirtualMachine;
use tokio_util::sync::CancellationToken;

const COMMAND: &str = "cargo bench -p slipway-nesting --bench vm";
/// Samples of each start kind.
const SAMPLES: usize = 10;

fn p(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

async fn sh(vm: &VirtualMachine, script: &str) -> anyhow::Result<String> {
    let Some(AgentAddr::Unix(path)) = AgentAddr::parse(&vm.addr) else {
        bail!("unexpected VM address {}", vm.addr);
    };
    let client = agent::connect_unix(Path::new(&path)).await?;
    let (code, out, err) = client
        .run_capture(vec!["sh".into(), "-c".into(), script.into()], Vec::new())
        .await?;
    if code != Some(0) {
        bail!("`{script}` failed: {}", String::from_utf8_lossy(&err));
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

async fn build_agent(repo: &Path) -> anyhow::Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = tokio::process::Command::new(cargo)
        .args(["build", "--release", "-p", "slipway-guest-agent"])
        .current_dir(repo)
        .status()
        .await?;
    if !st.success() {
        bail!("building slipway-guest-agent failed");
    }
    Ok(repo.join("target/release/slipway-guest-agent"))
}

async fn flattened_bytes(layer: &Path, out: &Path) -> anyhow::Result<u64> {
    let st = tokio::process::Command::new("qemu-img")
        .args(["convert", "-q", "-U", "-O", "qcow2"])
        .arg(layer)
        .arg(out)
        .status()
        .await?;
    if !st.success() {
        bail!("qemu-img convert {} failed", layer.display());
    }
    let bytes = allocated_bytes(out);
    std::fs::remove_file(out)?;
    Ok(bytes)
}

async fn run(repo: &Path, work: &Path) -> anyhow::Result<serde_json::Value> {
    slipway_testkit::guest::ensure_vm_tools().map_err(|e| anyhow::anyhow!("{e}"))?;
    let images = work.join("images");
    let agent_bin = build_agent(repo).await?;
    let opts = BuildOptions::new("bench".into(), Level::Microvm, images.clone(), agent_bin);
    image::build(&opts, &mut |_| {})
        .await
        .context("building the guest image")?;

    let state = work.join("s");
    let socket = work.join("n.sock");
    let daemon = Daemon::new(DaemonOptions {
        state_dir: state.clone(),
        images_dir: images,
    })
    .await?;
    let stop = CancellationToken::new();
    let server = tokio::spawn({
        let (stop, socket) = (stop.clone(), socket.clone());
        async move { daemon.serve(&socket, stop).await }
    });
    let mut c = None;
    for _ in 0..200 {
        if let Ok(cl) = NestingClient::connect_unix(&socket).await {
            c = Some(cl);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut c = c.context("the daemon did not listen")?;
    // `auto`: KVM only where a guest really runs under it.
    c.init(br#"{"accel":"auto"}"#).await?;
    let result = measure(&mut c, &state, work).await;
    let _ = c.shutdown().await;
    stop.cancel();
    let _ = server.await;
    result
}

async fn measure(
    c: &mut NestingClient,
    state: &Path,
    work: &Path,
) -> anyhow::Result<serde_json::Value> {
    // Warm the page cache (kernel, initrd, QEMU) with one unmeasured boot of each kind.
    let (vm, _) = c.create("bench", Some(0)).await?;
    sh(
        &vm,
        "mkdir -p /work/data && head -c 33554432 /dev/urandom > /work/data/blob && sync",
    )
    .await?;
    c.snapshot(&vm.id, "base", Default::default()).await?;
    let (vm, _) = c.restore("base", Some(0)).await?;
    c.delete(&vm.id).await?;

    let mut cold = Vec::new();
    let mut restore = Vec::new();
    for _ in 0..SAMPLES {
        let t = Instant::now();
        let (vm, _) = c.create("bench", Some(0)).await?;
        cold.push(t.elapsed().as_secs_f64() * 1000.0);
        c.delete(&vm.id).await?;
        let t = Instant::now();
        let (vm, _) = c.restore("base", Some(0)).await?;
        restore.push(t.elapsed().as_secs_f64() * 1000.0);
        c.delete(&vm.id).await?;
    }
    cold.sort_by(f64::total_cmp);
    restore.sort_by(f64::total_cmp);

    // Four branches, each writing 1 MiB of its own.
    let mut branches = Vec::new();
    for slot in 0..4 {
        let (vm, _) = c.restore("base", Some(slot)).await?;
        sh(
            &vm,
            &format!("head -c 1048576 /dev/urandom > /work/data/branch-{slot} && sync"),
        )
        .await?;
        branches.push(vm);
    }
    let snap_dir = state.join("snapshots/base");
    let snapshot_bytes =
        allocated_bytes(&snap_dir.join("state")) + allocated_bytes(&snap_dir.join("disk.qcow2"));
    let mut branch4 = snapshot_bytes;
    let mut full4 = 0;
    for (i, vm) in branches.iter().enumerate() {
        let layer = state.join("vms").join(&vm.id).join("disk.qcow2");
        branch4 += allocated_bytes(&layer);
        // A full copy: the memory image and the whole disk chain as one standalone file.
        full4 += allocated_bytes(&snap_dir.join("state"))
            + flattened_bytes(&layer, &work.join(format!("full-{i}.qcow2"))).await?;
    }
    for vm in &branches {
        c.delete(&vm.id).await?;
    }
    let accel = c
        .list_snapshots()
        .await?
        .into_iter()
        .find(|s| s.name == "base")
        .map(|s| s.accel)
        .unwrap_or_default();
    let (cold50, restore50) = (p(&cold, 0.5), p(&restore, 0.5));
    let one_copy = full4 as f64 / 4.0;
    println!(
        "accel {accel}: cold boot p50 {cold50:.1} ms, restore p50 {restore50:.1} ms ({:.3} of cold)",
        restore50 / cold50
    );
    println!(
        "disk: 4 branches {:.1} MiB, 4 full copies {:.1} MiB ({:.3} x one copy)",
        branch4 as f64 / 1048576.0,
        full4 as f64 / 1048576.0,
        branch4 as f64 / one_copy
    );
    Ok(serde_json::json!({
        "accel": accel,
        "samples": SAMPLES,
        "guest": "microvm image from `slipway image build` (Debian cloud kernel, busybox initramfs, 1 vCPU, 256 MiB), QEMU -M microvm",
        "cold_boot_ms_p50": round(cold50),
        "cold_boot_ms_p95": round(p(&cold, 0.95)),
        "restore_ms_p50": round(restore50),
        "restore_ms_p95": round(p(&restore, 0.95)),
        "restore_over_cold_boot": round(restore50 / cold50),
        "restore_goal_met": restore50 <= cold50 / 4.0,
        "branch4_disk_bytes": branch4,
        "full_copy4_disk_bytes": full4,
        "branch4_over_one_copy": round(branch4 as f64 / one_copy),
        "branch_goal_met": (branch4 as f64) < 1.2 * one_copy,
        "disk_writes": "32 MiB on the disk before the snapshot; 1 MiB per branch after it",
        "goal": "restore_ms_p50 <= cold_boot_ms_p50 / 4; branch4_disk_bytes < 1.2 x full_copy4_disk_bytes / 4",
    }))
}

fn main() -> anyhow::Result<()> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()?;
    // Short paths: unix sockets are limited to 108 bytes.
    let work = tempfile::Builder::new()
        .prefix("vmbench")
        .tempdir_in("/tmp")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let results = rt.block_on(run(&repo, work.path()))?;
    let (path, _) = slipway_sim::bench::write(&repo, "vm", COMMAND, results)?;
    println!("wrote {}", path.display());
    Ok(())
}
