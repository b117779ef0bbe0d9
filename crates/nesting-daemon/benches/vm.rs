//! VM start: cold boot vs snapshot restore on the same guest, and the disk and memory four
//! branches of one snapshot take, measured in one run on this machine.
//!
//! - `cold_boot_ms_*`: `Create` on the nesting daemon (disk layer, QEMU started, guest boots)
//!   until the guest agent's first answer — the daemon's `Create` returns at that moment.
//! - `restore_ms_*`: `Restore` of a snapshot of that same guest (taken once it had booted) until
//!   the agent's first answer.
//! - `restore_steps_ms_p50`: where a restore's time goes, from the daemon's own timings: disk
//!   layer (`qemu-img create`), QEMU start until QMP answers, device state loaded, running, and
//!   the guest agent's first answer.
//! - `restore_memory`: how the snapshot holds guest RAM — `mapped` (a memory file the restore
//!   maps copy-on-write, device state alone in the stream) or `streamed` (RAM in the stream).
//! - `branch4_disk_bytes`: after 32 MiB were written to the guest's disk and the VM was
//!   snapshotted, four branches restored and each wrote 1 MiB of its own: the bytes allocated by
//!   the snapshot (device state + memory file + frozen disk layer) plus the four branch layers.
//! - `full_copy4_disk_bytes`: four independent copies of the same state: per copy the memory
//!   image (state stream + memory file) plus the disk chain flattened into one qcow2
//!   (`qemu-img convert`), plus the same 1 MiB of writes each.
//! - `one_restored_rss_bytes`: one VM restored alone that wrote 1 MiB to its disk and 16 MiB to
//!   its RAM (`/tmp`, the initramfs root: RAM-backed): its QEMU process's proportional set size
//!   (`Pss` of `/proc/<pid>/smaps_rollup`). `branch4_rss_bytes`: the same for four branches
//!   running at once, summed — pages they share count once in the sum.
//! - `accel`: `kvm` or `tcg` (this machine's KVM does not run guests: expect `tcg`).
//!
//! Warm slots (issue 27), measured after the above on the same daemon, re-initialised:
//! - `microvm_warm_start_ms_*`: a `Create` in a slot whose warm VM is ready, until the guest
//!   ran its first command (`true` through the agent); `_create_ms_*` without that command.
//! - `microvm_cold_start_ms_*`: the same with the pool empty (no warm VM kept: budget 1 MiB)
//!   where the image's base snapshot exists: the daemon restores it. `microvm_boot_start_ms_*`:
//!   warm slots off, a cold boot.
//! - `warm1_pss_bytes`, `warm4_rss_bytes`: the PSS of one idle warm VM alone, and of four idle
//!   warm VMs of one image (one base snapshot) summed.
//! - `throughput_jobs_per_min_{warm,cold}`: 16 jobs (`true`) through 4 slots, 4 after one
//!   another per slot, with warm slots and with cold boots.
//! - `docker_cli_run_ms_p50`: `docker run --rm slipway-busybox true` in the same run, a
//!   reference only (the CLI's own start included); `isolation.json`'s `docker_start_ms_p50`
//!   is the executor's figure from its own run.
//!
//! Goals (issue 16): restore p50 at most 1/20 of cold boot p50; four branches' PSS at most 1.5 ×
//! one restored guest's; four branches' disk under 1.2 × one full copy (issue 6).
//!
//! `SLIPWAY_BENCH_MEMORY=anonymous` runs the same on the streamed path (RAM in the snapshot's
//! stream, as before issue 16) and merges its figures into `vm.json` as `anonymous_comparison`.
//!
//! Regenerate with `cargo bench -p slipway-nesting-daemon --bench vm` (as root: it installs QEMU and the
//! image tools when missing and builds a guest image). Every VM it starts is deleted at the end.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use slipway_nesting::Level;
use slipway_nesting::agent;
use slipway_nesting::client::{AgentAddr, NestingClient};
use slipway_nesting::proto::VirtualMachine;
use slipway_nesting_daemon::daemon::{Daemon, DaemonOptions};
use slipway_nesting_daemon::disk::allocated_bytes;
use slipway_nesting_daemon::image::{self, BuildOptions};
use tokio_util::sync::CancellationToken;

const COMMAND: &str = "cargo bench -p slipway-nesting-daemon --bench vm";
/// Samples of each start kind.
const SAMPLES: usize = 10;

/// What each branch does after its restore: 1 MiB to its disk, 16 MiB to its RAM.
const BRANCH_WORK: &str = "head -c 1048576 /dev/urandom > /work/data/branch && sync && \
     head -c 16777216 /dev/urandom > /tmp/w";

/// The daemon's step timings (`VM started`, `restored` debug events), by field name.
#[derive(Clone, Default)]
struct Steps(Arc<Mutex<BTreeMap<String, Vec<f64>>>>);

struct StepVisitor<'a>(&'a mut Vec<(String, f64)>, &'a mut bool);

impl tracing::field::Visit for StepVisitor<'_> {
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.0.push((field.name().to_string(), value));
    }
    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        if field.name() == "restore" {
            *self.1 = value;
        }
    }
    fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Steps {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut fields = Vec::new();
        // `restored` events come from restores only; `VM started` say which they are.
        let mut restore = event.metadata().target().ends_with("qemu");
        event.record(&mut StepVisitor(&mut fields, &mut restore));
        if !restore || fields.is_empty() {
            return;
        }
        if let Ok(mut m) = self.0.lock() {
            for (k, v) in fields {
                m.entry(k).or_default().push(v);
            }
        }
    }
}

impl Steps {
    fn clear(&self) {
        if let Ok(mut m) = self.0.lock() {
            m.clear();
        }
    }
    fn p50(&self) -> serde_json::Value {
        let Ok(m) = self.0.lock() else {
            return serde_json::Value::Null;
        };
        let mut out = serde_json::Map::new();
        for (k, v) in m.iter() {
            let mut v = v.clone();
            v.sort_by(f64::total_cmp);
            out.insert(k.clone(), round(p(&v, 0.5)).into());
        }
        out.into()
    }
}

/// Proportional set size of process `pid` (its unique pages plus its share of shared ones),
/// and the anonymous and file parts of it.
fn pss(pid: u32) -> anyhow::Result<(u64, u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))?;
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .unwrap_or(0)
    };
    Ok((field("Pss:"), field("Pss_Anon:"), field("Pss_File:")))
}

/// The pid of `vm`'s hypervisor.
fn vm_pid(state: &Path, vm: &VirtualMachine) -> anyhow::Result<u32> {
    slipway_nesting_daemon::store::processes_under(state)
        .into_iter()
        .find(|(_, id)| *id == vm.id)
        .map(|(pid, _)| pid)
        .with_context(|| format!("no process for VM {}", vm.id))
}

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

async fn run(repo: &Path, work: &Path, steps: &Steps) -> anyhow::Result<serde_json::Value> {
    slipway_testkit::guest::ensure_vm_tools().map_err(|e| anyhow::anyhow!("{e}"))?;
    let images = work.join("images");
    let agent_bin = slipway_testkit::release_binary(repo, "slipway-guest-agent").await?;
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
    c.init(format!(r#"{{"accel":"auto","memory":"{}"}}"#, memory_choice()).as_bytes())
        .await?;
    let mut result = measure(&mut c, &state, work, steps).await;
    if let Ok(r) = &mut result {
        match measure_warm(&mut c, &state).await {
            Ok(warm) => {
                if let (Some(r), serde_json::Value::Object(w)) = (r.as_object_mut(), warm) {
                    r.extend(w);
                }
            }
            Err(e) => result = Err(e.context("measuring warm slots")),
        }
    }
    let _ = c.shutdown().await;
    stop.cancel();
    let _ = server.await;
    result
}

async fn measure(
    c: &mut NestingClient,
    state: &Path,
    work: &Path,
    steps: &Steps,
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
    let guest_tmp = sh(
        &vm,
        "grep -E ' /tmp | / ' /proc/mounts | cut -d' ' -f2,3 | tr '\\n' ' '",
    )
    .await?
    .trim()
    .to_string();
    c.delete(&vm.id).await?;
    let snap_dir = state.join("snapshots/base");
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(snap_dir.join("meta.json"))?)?;
    let memory_file = meta["files"]["memory"].as_str().map(|m| snap_dir.join(m));
    let restore_memory = if memory_file.is_some() {
        "mapped"
    } else {
        "streamed"
    };

    let mut cold = Vec::new();
    let mut restore = Vec::new();
    steps.clear();
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
    let restore_steps = steps.p50();

    // One restored guest alone, after the branch work.
    let (vm, _) = c.restore("base", Some(0)).await?;
    let pid = vm_pid(state, &vm)?;
    let (one_before, _, _) = pss(pid)?;
    sh(&vm, BRANCH_WORK).await?;
    let (one, one_anon, one_file) = pss(pid)?;
    c.delete(&vm.id).await?;

    // Four branches at once, each doing the same work.
    let mut branches = Vec::new();
    for slot in 0..4 {
        let (vm, _) = c.restore("base", Some(slot)).await?;
        sh(&vm, BRANCH_WORK).await?;
        branches.push(vm);
    }
    let mut branch4_rss = 0;
    let mut branch4_anon = 0;
    for vm in &branches {
        let (all, anon, _) = pss(vm_pid(state, vm)?)?;
        branch4_rss += all;
        branch4_anon += anon;
    }
    let memory_bytes = allocated_bytes(&snap_dir.join("state"))
        + memory_file.as_deref().map(allocated_bytes).unwrap_or(0);
    let snapshot_bytes = memory_bytes
        + allocated_bytes(&snap_dir.join("disk.qcow2"))
        + allocated_bytes(&snap_dir.join(slipway_nesting_daemon::disk::LAYER_TEMPLATE));
    let mut branch4 = snapshot_bytes;
    let mut full4 = 0;
    for (i, vm) in branches.iter().enumerate() {
        let layer = state.join("vms").join(&vm.id).join("disk.qcow2");
        branch4 += allocated_bytes(&layer);
        // A full copy: the memory image and the whole disk chain as standalone files.
        full4 +=
            memory_bytes + flattened_bytes(&layer, &work.join(format!("full-{i}.qcow2"))).await?;
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
    let mib = |b: u64| b as f64 / 1048576.0;
    println!(
        "accel {accel}, memory {restore_memory}: cold boot p50 {cold50:.1} ms, restore p50 \
         {restore50:.1} ms ({:.4} of cold, goal <= 0.05)",
        restore50 / cold50
    );
    println!("restore steps p50 (ms, cumulative within each part): {restore_steps}");
    println!(
        "memory: one restored {:.1} MiB PSS ({:.1} MiB before its writes; anon {:.1}, file \
         {:.1}), 4 branches {:.1} MiB ({:.3} x one, goal <= 1.5; anon {:.1})",
        mib(one),
        mib(one_before),
        mib(one_anon),
        mib(one_file),
        mib(branch4_rss),
        branch4_rss as f64 / one as f64,
        mib(branch4_anon),
    );
    println!(
        "disk: 4 branches {:.1} MiB, 4 full copies {:.1} MiB ({:.3} x one copy)",
        mib(branch4),
        mib(full4),
        branch4 as f64 / one_copy
    );
    Ok(serde_json::json!({
        "accel": accel,
        "samples": SAMPLES,
        "guest": "microvm image from `slipway image build` (Debian cloud kernel, busybox initramfs, 1 vCPU, 256 MiB), QEMU -M microvm",
        "guest_root_and_tmp": guest_tmp,
        "restore_memory": restore_memory,
        "cold_boot_ms_p50": round(cold50),
        "cold_boot_ms_p95": round(p(&cold, 0.95)),
        "restore_ms_p50": round(restore50),
        "restore_ms_p95": round(p(&restore, 0.95)),
        "restore_steps_ms_p50": restore_steps,
        "restore_over_cold_boot": round(restore50 / cold50),
        "restore_goal_met": restore50 <= cold50 / 20.0,
        "one_restored_rss_bytes": one,
        "one_restored_rss_before_writes_bytes": one_before,
        "one_restored_pss_anon_bytes": one_anon,
        "one_restored_pss_file_bytes": one_file,
        "branch4_rss_bytes": branch4_rss,
        "branch4_pss_anon_bytes": branch4_anon,
        "branch4_rss_over_one": round(branch4_rss as f64 / one as f64),
        "branch_rss_goal_met": (branch4_rss as f64) <= 1.5 * one as f64,
        "snapshot_memory_bytes": memory_bytes,
        "branch4_disk_bytes": branch4,
        "full_copy4_disk_bytes": full4,
        "branch4_over_one_copy": round(branch4 as f64 / one_copy),
        "branch_goal_met": (branch4 as f64) < 1.2 * one_copy,
        "disk_writes": "32 MiB on the disk before the snapshot; per branch 1 MiB to the disk and 16 MiB to /tmp after it",
        "goal": "restore_ms_p50 <= cold_boot_ms_p50 / 20; branch4_rss_bytes <= 1.5 x one_restored_rss_bytes; branch4_disk_bytes < 1.2 x full_copy4_disk_bytes / 4",
    }))
}

/// `SLIPWAY_BENCH_MEMORY=anonymous` measures the streamed path for comparison (printed only).
/// Re-initialise the daemon with `warm` (JSON of the warm table, or none).
async fn reinit(c: &mut NestingClient, warm: Option<&str>) -> anyhow::Result<()> {
    c.shutdown().await?;
    let warm = warm.map(|w| format!(r#","warm":{w}"#)).unwrap_or_default();
    c.init(format!(r#"{{"accel":"auto","memory":"{}"{warm}}}"#, memory_choice()).as_bytes())
        .await?;
    Ok(())
}

/// The warm VMs listed once `n` of them are ready (up to 5 minutes).
async fn warm_ready(c: &mut NestingClient, n: usize) -> anyhow::Result<Vec<VirtualMachine>> {
    for _ in 0..3000 {
        let warm: Vec<_> = c.list().await?.into_iter().filter(|v| v.warm).collect();
        if warm.len() >= n {
            return Ok(warm);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("{n} warm VMs never became ready")
}

/// A job's start in `slot`: `Create`, then the guest's first command; both in ms, and
/// whether the VM was warm.
async fn job_start(c: &mut NestingClient, slot: i32) -> anyhow::Result<(f64, f64, bool)> {
    let t = Instant::now();
    let (vm, _) = c.create("bench", Some(slot)).await?;
    let created = t.elapsed().as_secs_f64() * 1000.0;
    sh(&vm, "true").await?;
    let first = t.elapsed().as_secs_f64() * 1000.0;
    c.delete(&vm.id).await?;
    Ok((created, first, vm.warm))
}

/// 16 jobs through 4 slots (4 after one another in each), in jobs per minute.
async fn throughput(socket_of: &NestingClient) -> anyhow::Result<f64> {
    let t = Instant::now();
    let mut workers = Vec::new();
    for slot in 0..4 {
        let mut c = socket_of.clone();
        workers.push(tokio::spawn(async move {
            for _ in 0..4 {
                job_start(&mut c, slot).await?;
            }
            anyhow::Ok(())
        }));
    }
    for w in workers {
        w.await??;
    }
    Ok(16.0 / t.elapsed().as_secs_f64() * 60.0)
}

async fn measure_warm(c: &mut NestingClient, state: &Path) -> anyhow::Result<serde_json::Value> {
    // One idle warm VM alone, then four of one base snapshot.
    reinit(c, Some(r#"{"slots":1,"images":["bench"]}"#)).await?;
    let one = warm_ready(c, 1).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (warm1, _, _) = pss(vm_pid(state, &one[0])?)?;
    reinit(c, Some(r#"{"slots":4,"images":["bench"]}"#)).await?;
    let four = warm_ready(c, 4).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut warm4 = 0;
    for vm in &four {
        warm4 += pss(vm_pid(state, vm)?)?.0;
    }

    // Warm starts: each Create finds slot 0's next VM ready.
    let (mut warm_create, mut warm_first) = (Vec::new(), Vec::new());
    for _ in 0..SAMPLES {
        warm_ready(c, 4).await?;
        let (created, first, warm) = job_start(c, 0).await?;
        if !warm {
            bail!("a Create in a ready warm slot was not handed its warm VM");
        }
        warm_create.push(created);
        warm_first.push(first);
    }
    let jobs_warm = {
        warm_ready(c, 4).await?;
        throughput(c).await?
    };

    // The pool empty (no memory for warm VMs), the base snapshot there: restored.
    reinit(
        c,
        Some(r#"{"slots":4,"images":["bench"],"memory_budget_mib":1}"#),
    )
    .await?;
    let mut cold_first = Vec::new();
    for _ in 0..SAMPLES {
        let (_, first, warm) = job_start(c, 0).await?;
        if warm {
            bail!("a warm VM with no memory budget for it");
        }
        cold_first.push(first);
    }
    // Warm slots off: cold boots.
    reinit(c, None).await?;
    let mut boot_first = Vec::new();
    for _ in 0..SAMPLES {
        boot_first.push(job_start(c, 0).await?.1);
    }
    let jobs_cold = throughput(c).await?;
    let docker = docker_runs().await;

    for v in [
        &mut warm_create,
        &mut warm_first,
        &mut cold_first,
        &mut boot_first,
    ] {
        v.sort_by(f64::total_cmp);
    }
    let mib = |b: u64| b as f64 / 1048576.0;
    println!(
        "warm slots: start p50 {:.1} ms (Create {:.1} ms), pool empty {:.1} ms, cold boot {:.1} ms; \
         4 idle warm VMs {:.1} MiB PSS vs one {:.1} MiB ({:.3} x); {jobs_warm:.1} jobs/min warm, \
         {jobs_cold:.1} cold",
        p(&warm_first, 0.5),
        p(&warm_create, 0.5),
        p(&cold_first, 0.5),
        p(&boot_first, 0.5),
        mib(warm4),
        mib(warm1),
        warm4 as f64 / warm1 as f64,
    );
    let mut out = serde_json::json!({
        "microvm_warm_start_ms_p50": round(p(&warm_first, 0.5)),
        "microvm_warm_start_ms_p95": round(p(&warm_first, 0.95)),
        "microvm_warm_create_ms_p50": round(p(&warm_create, 0.5)),
        "microvm_cold_start_ms_p50": round(p(&cold_first, 0.5)),
        "microvm_cold_start_ms_p95": round(p(&cold_first, 0.95)),
        "microvm_boot_start_ms_p50": round(p(&boot_first, 0.5)),
        "microvm_boot_start_ms_p95": round(p(&boot_first, 0.95)),
        "warm1_pss_bytes": warm1,
        "warm4_rss_bytes": warm4,
        "warm4_over_one": round(warm4 as f64 / warm1 as f64),
        "warm4_goal_met": warm4 as f64 <= 1.5 * warm1 as f64,
        "throughput_jobs_per_min_warm": round(jobs_warm),
        "throughput_jobs_per_min_cold": round(jobs_cold),
        "warm_goal": "warm4_rss_bytes <= 1.5 x warm1_pss_bytes; microvm_cold_start_ms_p50 <= restore_ms_p50 + 100; microvm_warm_start_ms_p50 <= 1.2 x docker_start_ms_p50 (isolation.json) + 10",
    });
    if let (Some(o), Some(d)) = (out.as_object_mut(), docker) {
        o.insert("docker_cli_run_ms_p50".into(), round(d).into());
        o.insert(
            "microvm_warm_over_docker_cli_run".into(),
            round(p(&warm_first, 0.5) / d).into(),
        );
    }
    Ok(out)
}

/// `docker run --rm slipway-busybox true`, p50 of 10 in ms; `None` without a Docker Engine.
async fn docker_runs() -> Option<f64> {
    slipway_testkit::ensure_docker_engine().ok()?;
    let mut runs = Vec::new();
    for _ in 0..SAMPLES {
        let t = Instant::now();
        let ok = tokio::process::Command::new("docker")
            .args(["run", "--rm", slipway_testkit::BUSYBOX_IMAGE, "true"])
            .output()
            .await
            .ok()?
            .status
            .success();
        if !ok {
            return None;
        }
        runs.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    runs.sort_by(f64::total_cmp);
    Some(p(&runs, 0.5))
}

fn memory_choice() -> String {
    std::env::var("SLIPWAY_BENCH_MEMORY").unwrap_or_else(|_| "auto".into())
}

fn main() -> anyhow::Result<()> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()?;
    // Short paths: unix sockets are limited to 108 bytes.
    let work = tempfile::Builder::new()
        .prefix("vmbench")
        .tempdir_in("/tmp")?;
    let steps = Steps::default();
    {
        use tracing_subscriber::Layer as _;
        use tracing_subscriber::layer::SubscriberExt as _;
        let fmt = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(tracing_subscriber::EnvFilter::from_default_env());
        tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(steps.clone()).with(fmt),
        )?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let results = rt.block_on(run(&repo, work.path(), &steps))?;
    if memory_choice() == "auto" {
        // Comparisons measured by other runs (each says how and when) stay beside the new figures.
        let kept = kept_comparisons(&repo);
        let (path, _) = slipway_testkit::bench::write(&repo, "vm", COMMAND, results)?;
        if !kept.is_empty() {
            slipway_testkit::bench::merge(&repo, "vm", kept)?;
        }
        println!("wrote {}", path.display());
    } else {
        println!("{results:#}");
        // Kept next to the main figures, saying how and when it was measured (another run).
        let mut results = results;
        results["command"] = format!("SLIPWAY_BENCH_MEMORY={} {COMMAND}", memory_choice()).into();
        results["measured_at_unix"] = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs()
            .into();
        let mut entry = serde_json::Map::new();
        entry.insert(format!("{}_comparison", memory_choice()), results);
        let (path, _) = slipway_testkit::bench::merge(&repo, "vm", entry)?;
        println!("merged into {}", path.display());
    }
    Ok(())
}

/// The `*_comparison` entries of the current `vm.json`, if any.
fn kept_comparisons(repo: &Path) -> serde_json::Map<String, serde_json::Value> {
    let path = repo.join("bench/results/vm.json");
    let doc: serde_json::Value = std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    doc.get("results")
        .and_then(serde_json::Value::as_object)
        .map(|r| {
            r.iter()
                .filter(|(k, _)| k.ends_with("_comparison"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}
