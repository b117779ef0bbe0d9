//! The `microvm` and `vm` levels: `NestingExecutor` over the bench's SSH connection to a
//! nesting daemon on this machine (in-process, serving its unix socket), as the manager runs
//! them on an instance. Three ways a job's VM starts, each its own row:
//!
//! - `LEVEL_warm`: the slot's warm VM is ready when the job is queued (the bench waits for it,
//!   untimed: "ready capacity"); the job is handed it.
//! - `LEVEL_cold`: warm slots configured but the pool is empty (no memory budget for a warm
//!   VM) while the image's base snapshot exists: the job's VM is restored from it.
//! - `LEVEL_boot`: warm slots off: the job's VM boots.
//!
//! Primitives, measured right after each job through the daemon's socket (no SSH, no executor):
//! `restore`: `Restore` of the base snapshot and the guest's first command (`echo first`
//! through its agent); `boot`: `Create` and the same first command. Goals: `microvm_warm` within
//! 1.2 × `docker_start_ms_p50` + 10 ms of the same run; `microvm_cold` within the restore
//! primitive + 100 ms (issue 27); `*_boot` and the `vm` rows within 1.2 × their primitive +
//! 10 ms.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use slipway_connector::Client;
use slipway_executor::nesting::NestingConfig;
use slipway_executor::{Isolation, NestingExecutor};
use slipway_job::JobResponse;
use slipway_nesting::Level as ImageLevel;
use slipway_nesting::client::{AgentAddr, NestingClient};
use slipway_nesting::proto::VirtualMachine;
use slipway_nesting_daemon::daemon::{Daemon, DaemonOptions};
use slipway_nesting_daemon::image::{self, BuildOptions};
use tokio_util::sync::CancellationToken;

use super::{Goal, Level, measure, ms, run_watched, stats};

/// Jobs (measured, warm-up) per row: a restore is a fraction of a second, a boot seconds
/// under emulation, a `vm` guest's boot tens of seconds.
const MICROVM_FAST: (usize, usize) = (30, 2);
const MICROVM_BOOT: (usize, usize) = (8, 1);
const VM_FAST: (usize, usize) = (12, 1);
const VM_BOOT: (usize, usize) = (4, 1);

/// The daemon and its images, for the time of the bench.
struct Nest {
    socket: PathBuf,
    direct: NestingClient,
    stop: CancellationToken,
    server: tokio::task::JoinHandle<()>,
    _work: tempfile::TempDir,
}

/// The rows of both VM levels; `docker_p50` is this run's `docker_start_ms_p50`.
pub async fn levels(
    client: &Arc<Client>,
    job: &JobResponse,
    docker_p50: f64,
) -> anyhow::Result<Vec<Level>> {
    let mut nest = start().await?;
    let result = rows(&mut nest, client, job, docker_p50).await;
    let _ = nest.direct.shutdown().await;
    nest.stop.cancel();
    let _ = nest.server.await;
    result
}

async fn rows(
    nest: &mut Nest,
    client: &Arc<Client>,
    job: &JobResponse,
    docker_p50: f64,
) -> anyhow::Result<Vec<Level>> {
    let mut out = Vec::new();
    for (level, image, fast, boot) in [
        (
            Isolation::Microvm,
            "bench-microvm",
            MICROVM_FAST,
            MICROVM_BOOT,
        ),
        (Isolation::Vm, "bench-vm", VM_FAST, VM_BOOT),
    ] {
        let key = level.as_str();
        let exec = |init: &str| NestingExecutor {
            client: Arc::clone(client),
            instance: "bench".into(),
            config: NestingConfig {
                socket: nest.socket.display().to_string(),
                init_config: init.as_bytes().to_vec(),
                microvm_image: Some(image.into()),
                vm_image: Some(image.into()),
                builds_dir: "/work/builds".into(),
                cache_dir: "/work/cache".into(),
                ..NestingConfig::default()
            },
            level,
            starts: None,
        };
        let base = slipway_nesting_daemon::daemon::warm::base_name(image);

        // Boot: warm slots off.
        let init = r#"{"accel":"auto"}"#.to_string();
        reinit(&mut nest.direct, &init).await?;
        let e = exec(&init);
        let ready = RefCell::new(Vec::new());
        let direct = nest.direct.clone();
        let (start, primitive) = measure(
            &format!("{key}-boot"),
            job,
            boot,
            |j| run_vm(&e, j, &ready),
            || first_command(direct.clone(), Start::Boot(image)),
        )
        .await?;
        out.push(Level {
            key: leak(format!("{key}_boot")),
            name: leak(format!("{key} (boot)")),
            jobs: boot.0,
            start,
            primitive,
            goal: Goal::OverPrimitive,
            extra: vec![("vm_ready_ms".into(), settled(&ready, boot.1))],
        });

        // Warm: one warm slot (0), ready before each job.
        let warm = format!(r#"{{"accel":"auto","warm":{{"slots":1,"images":["{image}"]}}}}"#);
        reinit(&mut nest.direct, &warm).await?;
        let e = exec(&warm);
        let ready = RefCell::new(Vec::new());
        let direct = nest.direct.clone();
        let (start, primitive) = measure(
            &format!("{key}-warm"),
            job,
            fast,
            |j| {
                let (e, ready, mut waiting) = (&e, &ready, direct.clone());
                async move {
                    warm_ready(&mut waiting, image).await?;
                    run_vm(e, j, ready).await
                }
            },
            || first_command(direct.clone(), Start::Restore(&base)),
        )
        .await?;
        let restore = primitive;
        let goal = if level == Isolation::Microvm {
            Goal::Fixed(
                1.2 * docker_p50 + 10.0,
                "1.2 x docker_start_ms_p50 + 10 ms (this run)",
            )
        } else {
            Goal::OverPrimitive
        };
        out.push(Level {
            key: leak(format!("{key}_warm")),
            name: leak(format!("{key} (warm)")),
            jobs: fast.0,
            start,
            primitive,
            goal,
            extra: vec![("vm_ready_ms".into(), settled(&ready, fast.1))],
        });

        // Cold: warm slots on, no memory for a warm VM, the base snapshot there.
        let empty = format!(
            r#"{{"accel":"auto","warm":{{"slots":1,"images":["{image}"],"memory_budget_mib":1}}}}"#
        );
        reinit(&mut nest.direct, &empty).await?;
        let e = exec(&empty);
        let ready = RefCell::new(Vec::new());
        let direct = nest.direct.clone();
        let (start, primitive) = measure(
            &format!("{key}-cold"),
            job,
            fast,
            |j| run_vm(&e, j, &ready),
            || first_command(direct.clone(), Start::Restore(&base)),
        )
        .await?;
        let goal = if level == Isolation::Microvm {
            Goal::Fixed(
                restore.p50.min(primitive.p50) + 100.0,
                "the restore primitive's p50 + 100 ms",
            )
        } else {
            Goal::OverPrimitive
        };
        out.push(Level {
            key: leak(format!("{key}_cold")),
            name: leak(format!("{key} (cold)")),
            jobs: fast.0,
            start,
            primitive,
            goal,
            extra: vec![("vm_ready_ms".into(), settled(&ready, fast.1))],
        });
    }
    Ok(out)
}

/// A row's key lives as long as the bench.
fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// The p50 of what `samples` gathered after the warm-up.
fn settled(samples: &RefCell<Vec<f64>>, warmup: usize) -> f64 {
    let mut v = samples.borrow().clone();
    stats(v.split_off(warmup.min(v.len()))).p50
}

/// Shut the daemon's VMs down and initialise it with `config` (its base snapshots stay).
async fn reinit(c: &mut NestingClient, config: &str) -> anyhow::Result<()> {
    c.shutdown().await?;
    c.init(config.as_bytes()).await?;
    Ok(())
}

/// Until slot 0 holds a ready warm VM of `image` (up to 5 minutes: the first fill takes the
/// base snapshot).
async fn warm_ready(c: &mut NestingClient, image: &str) -> anyhow::Result<()> {
    for _ in 0..3000 {
        let ready = c
            .list()
            .await?
            .iter()
            .any(|v| v.warm && v.slot == Some(0) && v.image == image);
        if ready {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("slot 0 never held a warm VM of {image}")
}

/// One job through the executor in slot 0: to its first output line; the time to the trace's
/// "VM … ready" line goes to `ready`.
async fn run_vm(
    exec: &NestingExecutor,
    job: &JobResponse,
    ready: &RefCell<Vec<f64>>,
) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    let (took, marks) = run_watched(exec, job).await?;
    if let Some(at) = marks {
        ready.borrow_mut().push(ms(at.duration_since(t0)));
    }
    Ok(took)
}

/// How a primitive's VM starts.
#[derive(Clone, Copy)]
enum Start<'a> {
    /// `Create` of the image, warm slots off: a boot.
    Boot(&'a str),
    /// `Restore` of the snapshot.
    Restore(&'a str),
}

/// The daemon's own start of a VM in slot 1 (clear of the warm slot 0) and the guest's first
/// command; the VM's deletion is not timed.
async fn first_command(mut c: NestingClient, start: Start<'_>) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let (vm, _) = match start {
        Start::Boot(image) => c.create(image, Some(1)).await?,
        Start::Restore(snapshot) => c.restore(snapshot, Some(1)).await?,
    };
    let out = echo_first(&vm).await;
    let took = t.elapsed();
    c.delete(&vm.id).await?;
    ensure!(out?.trim() == "first", "the guest did not say `first`");
    Ok(took)
}

async fn echo_first(vm: &VirtualMachine) -> anyhow::Result<String> {
    let Some(AgentAddr::Unix(path)) = AgentAddr::parse(&vm.addr) else {
        bail!("unexpected VM address {}", vm.addr);
    };
    let agent = slipway_nesting::agent::connect_unix(Path::new(&path)).await?;
    let (code, out, err) = agent
        .run_capture(
            vec!["sh".into(), "-c".into(), "echo first".into()],
            Vec::new(),
        )
        .await?;
    ensure!(
        code == Some(0),
        "echo first failed: {}",
        String::from_utf8_lossy(&err)
    );
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Build the guest agent and both images, start the daemon.
async fn start() -> anyhow::Result<Nest> {
    slipway_testkit::guest::ensure_vm_tools().map_err(|e| anyhow::anyhow!("{e}"))?;
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    // Short paths: unix sockets are limited to 108 bytes.
    let work = tempfile::Builder::new()
        .prefix("isobench")
        .tempdir_in("/tmp")?;
    let agent = slipway_testkit::release_binary(&repo, "slipway-guest-agent").await?;
    let images = work.path().join("images");
    for (name, level) in [
        ("bench-microvm", ImageLevel::Microvm),
        ("bench-vm", ImageLevel::Vm),
    ] {
        eprintln!("building the {name} guest image");
        let opts = BuildOptions::new(name.into(), level, images.clone(), agent.clone());
        image::build(&opts, &mut |_| {})
            .await
            .with_context(|| format!("building the {name} image"))?;
    }
    let socket = work.path().join("n.sock");
    let daemon = Daemon::new(DaemonOptions {
        state_dir: work.path().join("s"),
        images_dir: images,
    })
    .await?;
    let stop = CancellationToken::new();
    let server = tokio::spawn({
        let (stop, socket) = (stop.clone(), socket.clone());
        async move {
            if let Err(e) = daemon.serve(&socket, stop).await {
                eprintln!("the nesting daemon stopped: {e}");
            }
        }
    });
    for _ in 0..200 {
        if let Ok(direct) = NestingClient::connect_unix(&socket).await {
            return Ok(Nest {
                socket,
                direct,
                stop,
                server,
                _work: work,
            });
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.cancel();
    bail!("the nesting daemon did not listen on {}", socket.display())
}
