//! `slipway nesting …`, `slipway image build` and `slipway debug`: the nesting daemon and its
//! client on an instance, guest images, and stepping into a failed job's VM.

use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use slipway_nesting::agent::{AgentClient, Exec, ExecEvent};
use slipway_nesting::client::{AgentAddr, NestingClient};
use slipway_nesting::proto;
use slipway_nesting_daemon::daemon::{Daemon, DaemonOptions};
use slipway_nesting_daemon::image::{self, BuildOptions, ImageError, ImageManifest};
use tokio::io::AsyncReadExt as _;
use tokio_util::sync::CancellationToken;

use crate::progress;

/// Default socket of the nesting daemon.
pub const DEFAULT_SOCKET: &str = "/run/slipway/nesting.sock";
/// Default state directory of the nesting daemon.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/slipway/nesting";
/// Default images directory.
pub const DEFAULT_IMAGES_DIR: &str = "/var/lib/slipway/images";

/// Run the daemon until `stop` fires; VMs keep running after it stops.
pub async fn serve(
    socket: &Path,
    opts: DaemonOptions,
    init: Option<(PathBuf, Vec<u8>)>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let daemon = Daemon::new(opts.clone()).await.with_context(|| {
        format!(
            "starting the nesting daemon in {}",
            opts.state_dir.display()
        )
    })?;
    if let Some((path, bytes)) = init {
        daemon
            .init(&bytes)
            .await
            .with_context(|| format!("applying the init file {}", path.display()))?;
    }
    let running = daemon.list().await;
    tracing::info!(
        socket = %socket.display(),
        state_dir = %opts.state_dir.display(),
        vms = running.len(),
        "nesting daemon listening"
    );
    daemon.serve(socket, stop).await?;
    Ok(())
}

/// A client of the daemon at `socket`.
pub async fn connect(socket: &Path) -> anyhow::Result<NestingClient> {
    Ok(NestingClient::connect_unix(socket).await?)
}

/// How often a running build step's spinner turns.
const SPINNER_EVERY: Duration = Duration::from_millis(100);

/// Build a guest image, showing its steps on stderr: on a terminal, the running step's line
/// with a spinner and its elapsed time, replaced by `… done in 48.2 s` when it ends; otherwise
/// one plain line when a step starts and one when it ends.
pub async fn build_image(opts: &BuildOptions) -> Result<ImageManifest, ImageError> {
    if !std::io::stderr().is_terminal() {
        return image::build(opts, &mut |p| {
            write_stderr(&format!("{}\n", image::render_progress(&p)));
        })
        .await;
    }
    let running: Arc<Mutex<Option<Running>>> = Arc::default();
    let spinner = Spinner(tokio::spawn({
        let running = running.clone();
        async move {
            let mut tick = tokio::time::interval(SPINNER_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            for frame in 0usize.. {
                tick.tick().await;
                let guard = running.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(r) = guard.as_ref() {
                    // The lock is held while writing: a step ending cannot write in between.
                    write_stderr(&r.line(frame));
                }
            }
        }
    }));
    let result = image::build(opts, &mut |p| {
        let mut guard = running.lock().unwrap_or_else(PoisonError::into_inner);
        if p.done {
            *guard = None;
            write_stderr(&format!("\r\x1b[K{}\n", image::render_progress(&p)));
        } else {
            let r = Running {
                head: image::render_progress(&p),
                started: Instant::now(),
            };
            write_stderr(&r.line(0));
            *guard = Some(r);
        }
    })
    .await;
    drop(spinner);
    // A failed step's line is ended, so the error prints on a line of its own.
    let failed = running
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    if let Some(r) = failed {
        write_stderr(&format!(
            "\r\x1b[K{} failed after {:.1} s\n",
            r.head,
            r.started.elapsed().as_secs_f64()
        ));
    }
    result
}

/// The build step running now.
#[derive(Debug)]
struct Running {
    /// `[2/8] debootstrap bookworm …`.
    head: String,
    started: Instant,
}

impl Running {
    /// Its line with spinner frame `frame`, overwriting the line the cursor is on.
    fn line(&self, frame: usize) -> String {
        let size = progress::terminal_size(&std::io::stderr());
        let width = progress::width_of(size, std::env::var("COLUMNS").ok().as_deref());
        format!(
            "\r{}\x1b[K",
            progress::step_line(&self.head, self.started.elapsed(), frame, width)
        )
    }
}

/// The spinner's redraw task, stopped when the build ends (or is dropped half-way).
struct Spinner(tokio::task::JoinHandle<()>);

impl Drop for Spinner {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Write to stderr (a closed stderr must not fail the build).
fn write_stderr(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes());
    let _ = err.flush();
}

/// Print VMs as a table (`WARM`: started ahead of a job, waiting in its slot).
pub fn print_vms(vms: &[proto::VirtualMachine]) {
    println!(
        "{:<10} {:<18} {:>4}  {:<8} {:<16} {:<16} {:<4}  ADDR",
        "ID", "NAME", "SLOT", "LEVEL", "IMAGE", "SNAPSHOT", "WARM"
    );
    for v in vms {
        println!(
            "{:<10} {:<18} {:>4}  {:<8} {:<16} {:<16} {:<4}  {}",
            v.id,
            v.name,
            v.slot.map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
            v.level,
            v.image,
            if v.snapshot.is_empty() {
                "-"
            } else {
                &v.snapshot
            },
            if v.warm { "yes" } else { "-" },
            v.addr
        );
    }
}

/// Print snapshots as a table.
pub fn print_snapshots(snaps: &[proto::Snapshot]) {
    println!(
        "{:<24} {:<16} {:<8} {:<28} {:>10} {:>10}  LABELS",
        "NAME", "IMAGE", "LEVEL", "HYPERVISOR", "MEMORY", "DISK"
    );
    for s in snaps {
        let mut labels: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        labels.sort();
        println!(
            "{:<24} {:<16} {:<8} {:<28} {:>8}Mi {:>8}Mi  {}",
            s.name,
            s.image,
            s.level,
            format!(
                "{} {} {}/{}",
                s.hypervisor, s.hypervisor_version, s.machine, s.accel
            ),
            s.memory_bytes >> 20,
            s.disk_bytes >> 20,
            labels.join(",")
        );
    }
}

/// Options of `slipway debug`.
#[derive(Debug)]
pub struct DebugOptions {
    /// The failed job's id, or a snapshot name.
    pub job: String,
    /// The daemon's socket.
    pub socket: PathBuf,
    /// `nesting_config` JSON for a daemon not yet initialised.
    pub init_config: Vec<u8>,
    /// A command to run instead of an interactive shell.
    pub command: Vec<String>,
}

/// Restore the failed job's snapshot into a new VM on this machine, run a shell (or
/// `command`) in the job's directory, delete the VM; the exit code of the shell.
pub async fn debug(opts: DebugOptions) -> anyhow::Result<i32> {
    let mut nesting = connect(&opts.socket).await?;
    let name = if opts.job.chars().all(|c| c.is_ascii_digit()) {
        slipway_executor::nesting::failure_snapshot_name(opts.job.parse().unwrap_or(0))
    } else {
        opts.job.clone()
    };
    let snaps = nesting.list_snapshots().await?;
    let Some(snap) = snaps.iter().find(|s| s.name == name) else {
        let known: Vec<&str> = snaps.iter().map(|s| s.name.as_str()).collect();
        bail!(
            "no snapshot {name:?} on this machine's nesting daemon ({}); snapshots: {}",
            opts.socket.display(),
            if known.is_empty() {
                "none".into()
            } else {
                known.join(", ")
            }
        );
    };
    let workdir = snap.labels.get("workdir").cloned();
    eprintln!(
        "Restoring snapshot {name} ({} {}, taken at unix time {})…",
        snap.level, snap.image, snap.created
    );
    let started = std::time::Instant::now();
    let (vm, _) = nesting
        .restore_initialized(&name, None, &opts.init_config)
        .await
        .with_context(|| format!("restoring snapshot {name}"))?;
    eprintln!(
        "VM {} ready in {:.1} s",
        vm.id,
        started.elapsed().as_secs_f64()
    );
    let code = shell(&vm, workdir.as_deref(), &opts.command).await;
    if let Err(e) = nesting.delete(&vm.id).await {
        eprintln!("warning: deleting VM {}: {e}", vm.id);
    }
    code
}

async fn shell(
    vm: &proto::VirtualMachine,
    workdir: Option<&str>,
    command: &[String],
) -> anyhow::Result<i32> {
    let addr = AgentAddr::parse(&vm.addr).with_context(|| format!("VM address {:?}", vm.addr))?;
    let agent = std::sync::Arc::new(match &addr {
        AgentAddr::Unix(path) => slipway_nesting::agent::connect_unix(Path::new(path)).await?,
        AgentAddr::Vsock { port, socket } => AgentClient::new(
            slipway_nesting::vsock::connect_vsock(Path::new(socket), *port, Duration::from_secs(5))
                .await?,
        ),
    });
    agent.hello(Duration::from_secs(10)).await?;
    let cd = workdir
        .map(|w| format!("cd {w} 2>/dev/null || cd /work 2>/dev/null; "))
        .unwrap_or_default();
    let interactive = command.is_empty();
    let body = if interactive {
        format!(
            "{cd}echo \"slipway debug: in $(pwd) of the failed job's VM; exit to leave\" >&2; exec bash --noprofile --norc -i"
        )
    } else {
        format!("{cd}{}", command.join(" "))
    };
    let mut exec = agent
        .exec(Exec {
            argv: vec![
                "bash".into(),
                "--noprofile".into(),
                "--norc".into(),
                "-c".into(),
                body,
            ],
            env: vec![("PS1".into(), "(slipway debug) \\w# ".into())],
            cwd: None,
            stdin: None,
            keep_stdin: interactive,
        })
        .await?;
    let id = exec.id;
    let pump = interactive.then(|| {
        let agent = agent.clone();
        tokio::spawn(async move {
            let mut stdin = tokio::io::stdin();
            let mut buf = vec![0u8; 4096];
            loop {
                match stdin.read(&mut buf).await {
                    Ok(0) | Err(_) => {
                        let _ = agent.stdin(id, None, true).await;
                        break;
                    }
                    Ok(n) => {
                        if agent
                            .stdin(id, Some(buf[..n].to_vec()), false)
                            .await
                            .is_err()
                        {
                            break;
                        }
                    }
                }
            }
        })
    });
    // Ctrl-C goes to what runs in the guest; SIGTERM or a closed terminal ends the session,
    // and the caller still deletes the VM.
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let mut code = 1;
    loop {
        let ev = tokio::select! {
            ev = exec.events.recv() => ev,
            _ = int.recv() => {
                let _ = agent.signal(id, 2).await;
                continue;
            }
            _ = term.recv() => {
                code = 143;
                break;
            }
            _ = hup.recv() => {
                code = 129;
                break;
            }
        };
        let Some(ev) = ev else { break };
        match ev {
            ExecEvent::Started(_) => {}
            ExecEvent::Stdout(b) => {
                let mut out = std::io::stdout();
                let _ = out.write_all(&b);
                let _ = out.flush();
            }
            ExecEvent::Stderr(b) => {
                let mut err = std::io::stderr();
                let _ = err.write_all(&b);
                let _ = err.flush();
            }
            ExecEvent::Exit { code: c, signal } => {
                code = c.unwrap_or(128 + signal.unwrap_or(0));
                break;
            }
            ExecEvent::Error(e) => bail!("the VM's agent: {e}"),
        }
    }
    if let Some(p) = pump {
        p.abort();
    }
    Ok(code)
}

/// What `slipway nesting` takes.
#[derive(Debug, clap::Args)]
pub struct NestingArgs {
    /// The daemon's unix socket.
    #[arg(long, global = true, env = "SLIPWAY_NESTING_SOCKET", default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
    #[command(subcommand)]
    pub command: NestingCommand,
}

/// Nesting daemon commands.
#[derive(Debug, Subcommand)]
pub enum NestingCommand {
    /// Serve nesting.v1 on the socket until SIGTERM; VMs outlive the daemon.
    Serve {
        /// VM records, disk layers and snapshots.
        #[arg(long, default_value = DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
        /// Where images are found when the Init config names none.
        #[arg(long, default_value = DEFAULT_IMAGES_DIR)]
        images_dir: PathBuf,
        /// A nesting_config JSON file applied at start, as `init` would: warm slots then fill
        /// before the first job asks (a manager's own Init is then answered "already
        /// initialized" and the daemon keeps this configuration).
        #[arg(long)]
        init: Option<PathBuf>,
    },
    /// Configure the daemon with a nesting_config JSON file.
    Init {
        /// JSON file (`-`: stdin).
        config: PathBuf,
    },
    /// Start a VM from an image.
    Create {
        /// Image name.
        image: String,
        /// Slot (a VM already there is stomped).
        #[arg(long)]
        slot: Option<i32>,
    },
    /// Delete a VM.
    Delete {
        /// VM id.
        id: String,
    },
    /// List the running VMs.
    List,
    /// Delete every VM and forget the configuration.
    Shutdown,
    /// Save a VM as a snapshot (the VM stops).
    Snapshot {
        /// VM id.
        vm: String,
        /// Snapshot name.
        name: String,
    },
    /// Start a VM from a snapshot.
    Restore {
        /// Snapshot name.
        snapshot: String,
        /// Slot (a VM already there is stomped).
        #[arg(long)]
        slot: Option<i32>,
    },
    /// List the snapshots.
    Snapshots,
    /// Delete a snapshot.
    DeleteSnapshot {
        /// Snapshot name.
        name: String,
    },
}

/// What `slipway image` takes.
#[derive(Debug, clap::Args)]
pub struct ImageArgs {
    #[command(subcommand)]
    pub command: ImageCommand,
}

/// Guest image commands.
#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Build a bootable guest: Debian's cloud kernel, a busybox initramfs with the guest agent,
    /// and a disk (an empty work disk for microvm, a debootstrap root for vm).
    Build {
        /// Image name.
        #[arg(long)]
        name: String,
        /// `microvm` or `vm`.
        #[arg(long, default_value = "microvm")]
        level: String,
        /// Images directory.
        #[arg(long, default_value = DEFAULT_IMAGES_DIR)]
        images_dir: PathBuf,
        /// The guest agent binary (default: slipway-guest-agent beside this binary).
        #[arg(long)]
        agent: Option<PathBuf>,
        /// Kernel (default: the newest /boot/vmlinuz-*-cloud-amd64).
        #[arg(long)]
        kernel: Option<PathBuf>,
        /// Cache for the debootstrap tree of vm images.
        #[arg(long, default_value = "/var/cache/slipway/debootstrap")]
        cache_dir: PathBuf,
        /// vm images: add OpenSSH's sshd, started at boot (for fleeting-plugin-qemu).
        #[arg(long)]
        sshd: bool,
        /// No network in the guest: its VMs get no NIC, and talk only to their agent (runners
        /// using the image then need `job_data = "manager"`).
        #[arg(long)]
        no_network: bool,
    },
}

/// What `slipway debug` takes.
#[derive(Debug, clap::Args)]
pub struct DebugArgs {
    /// The failed job's id (its snapshot is `job-<id>`), or a snapshot name.
    pub job: String,
    /// The nesting daemon's socket.
    #[arg(long, env = "SLIPWAY_NESTING_SOCKET", default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// `nesting_config` JSON file, for a daemon not initialised yet.
    #[arg(long)]
    pub nesting_config: Option<PathBuf>,
    /// Command to run instead of an interactive shell.
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// `slipway nesting …`.
pub async fn nesting(args: NestingArgs) -> anyhow::Result<ExitCode> {
    nesting_command(&args.socket, args.command).await
}

/// `slipway image …`.
pub async fn image(args: ImageArgs) -> anyhow::Result<ExitCode> {
    image_command(args.command).await
}

/// `slipway debug`.
pub async fn debug_command(args: DebugArgs) -> anyhow::Result<ExitCode> {
    let DebugArgs {
        job,
        socket,
        nesting_config,
        command,
    } = args;
    let init_config = match nesting_config {
        Some(p) => tokio::fs::read(&p)
            .await
            .with_context(|| format!("reading {}", p.display()))?,
        None => b"{}".to_vec(),
    };
    let code = debug(DebugOptions {
        job,
        socket,
        init_config,
        command,
    })
    .await?;
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

async fn nesting_command(
    socket: &std::path::Path,
    command: NestingCommand,
) -> anyhow::Result<ExitCode> {
    if let NestingCommand::Serve {
        state_dir,
        images_dir,
        init,
    } = command
    {
        let init = match init {
            Some(p) => Some(
                tokio::fs::read(&p)
                    .await
                    .with_context(|| format!("reading the init file {}", p.display()))
                    .map(|bytes| (p, bytes))?,
            ),
            None => None,
        };
        let stop = super::signals::shutdown_signal()?;
        let opts = slipway_nesting_daemon::daemon::DaemonOptions {
            state_dir,
            images_dir,
        };
        serve(socket, opts, init, stop).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut client = connect(socket).await?;
    match command {
        NestingCommand::Serve { .. } => {}
        NestingCommand::Init { config } => {
            let bytes = if config.as_os_str() == "-" {
                let mut b = Vec::new();
                tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut b).await?;
                b
            } else {
                tokio::fs::read(&config)
                    .await
                    .with_context(|| format!("reading {}", config.display()))?
            };
            client.init(&bytes).await?;
        }
        NestingCommand::Create { image, slot } => {
            let (vm, stomped) = client.create(&image, slot).await?;
            if let Some(id) = stomped {
                eprintln!("stomped VM {id}");
            }
            print_vms(&[vm]);
        }
        NestingCommand::Delete { id } => client.delete(&id).await?,
        NestingCommand::List => print_vms(&client.list().await?),
        NestingCommand::Shutdown => client.shutdown().await?,
        NestingCommand::Snapshot { vm, name } => {
            let (snap, expired) = client.snapshot(&vm, &name, Default::default()).await?;
            print_snapshots(&[snap]);
            for e in expired {
                eprintln!("removed snapshot {e}: retention limit exceeded");
            }
        }
        NestingCommand::Restore { snapshot, slot } => {
            let (vm, stomped) = client.restore(&snapshot, slot).await?;
            if let Some(id) = stomped {
                eprintln!("stomped VM {id}");
            }
            print_vms(&[vm]);
        }
        NestingCommand::Snapshots => print_snapshots(&client.list_snapshots().await?),
        NestingCommand::DeleteSnapshot { name } => client.delete_snapshot(&name).await?,
    }
    Ok(ExitCode::SUCCESS)
}

async fn image_command(command: ImageCommand) -> anyhow::Result<ExitCode> {
    let ImageCommand::Build {
        name,
        level,
        images_dir,
        agent,
        kernel,
        cache_dir,
        sshd,
        no_network,
    } = command;
    let level = match level.as_str() {
        "microvm" => slipway_nesting::Level::Microvm,
        "vm" => slipway_nesting::Level::Vm,
        other => anyhow::bail!("--level: expected microvm or vm, got {other:?}"),
    };
    let agent = match agent {
        Some(a) => a,
        None => std::env::current_exe()
            .context("locating this binary")?
            .with_file_name("slipway-guest-agent"),
    };
    let mut opts = slipway_nesting_daemon::image::BuildOptions::new(name, level, images_dir, agent);
    opts.kernel = kernel;
    opts.cache_dir = cache_dir;
    opts.sshd = sshd;
    opts.network = !no_network;
    let manifest = build_image(&opts).await?;
    println!(
        "built {} image {:?} in {} (kernel {})",
        manifest.level.as_str(),
        manifest.name,
        opts.out_dir.join(&manifest.name).display(),
        manifest.kernel_version
    );
    Ok(ExitCode::SUCCESS)
}
