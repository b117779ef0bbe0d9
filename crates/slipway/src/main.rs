//! `slipway`: the CI job runner's manager and command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

mod cli;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use slipway::config::{self, Loaded, RunnerConfig};
use slipway::shutdown::Shutdown;
use slipway::{consume, exec, gitlab, plugin_check, runner, vm};
use slipway_jobs::queue::{Cancel, Entry, JobState, Queue};

#[derive(Debug, Parser)]
#[command(
    name = "slipway",
    version,
    about = "CI job runner with autoscaling and per-job isolation"
)]
struct Cli {
    /// Log level for the manager's own messages (error, warn, info, debug, trace).
    #[arg(long, global = true, env = "SLIPWAY_LOG")]
    log_level: Option<String>,
    /// The embedded job queue's directory (default: `.slipway-queue` beside config.toml).
    #[arg(long, global = true, env = "SLIPWAY_QUEUE")]
    queue: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a local pipeline file through the whole stack.
    Exec {
        /// Pipeline file.
        #[arg(default_value = ".gitlab-ci.yml")]
        file: PathBuf,
        /// Run only this job (repeat for more; a parallel job's name runs all of its jobs).
        #[arg(long)]
        job: Vec<String>,
        /// With --job: also run the jobs it needs, transitively.
        #[arg(long)]
        needs: bool,
        /// Play this manual job in the run (repeat for more).
        #[arg(long)]
        manual: Vec<String>,
        /// Print the jobs the pipeline has (stage, when, needs) and run nothing.
        #[arg(long)]
        list: bool,
        /// A variable for every job, over the pipeline's own: KEY=VALUE (repeat for more).
        #[arg(long = "variable", short = 'v', value_name = "KEY=VALUE")]
        variables: Vec<String>,
        /// Variables file (values masked in output unless `masked: false`); default:
        /// .slipway-variables.yml beside the pipeline, when it exists.
        #[arg(long)]
        variables_file: Option<PathBuf>,
        /// Directory holding other projects' checkouts, for include:project (DIR/group/project).
        #[arg(long)]
        include_root: Option<PathBuf>,
        /// Write a JSON report of the run (each job's status, duration, coverage, tries).
        #[arg(long)]
        report: Option<PathBuf>,
        /// config.toml to use instead of the embedded default.
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// Which [[runners]] entry of the config to use (default: the first).
        #[arg(long)]
        runner: Option<String>,
        /// Warn about pipeline keys this version does not support instead of failing.
        #[arg(long)]
        allow_unsupported: bool,
        /// Directory searched first for plugins (fleeting-plugin-*, executor-plugin-*).
        #[arg(long, env = "SLIPWAY_PLUGIN_DIR")]
        plugin_dir: Option<PathBuf>,
        /// How long a plugin may take to print its handshake (e.g. 10s).
        #[arg(long, env = "SLIPWAY_PLUGIN_START_TIMEOUT", value_parser = humantime::parse_duration)]
        plugin_start_timeout: Option<std::time::Duration>,
    },
    /// Run the manager with a config.toml until SIGTERM or Ctrl-C.
    Run {
        /// config.toml.
        #[arg(short, long, default_value = "config.toml")]
        config: PathBuf,
        /// Directory searched first for plugins (fleeting-plugin-*, executor-plugin-*).
        #[arg(long, env = "SLIPWAY_PLUGIN_DIR")]
        plugin_dir: Option<PathBuf>,
    },
    /// Add every job of a local pipeline file to the embedded queue that `slipway run` consumes.
    ///
    /// Jobs are queued flat, in file order: stages and `needs` do not order them, and no
    /// artifacts pass between them. Prints each job's id and name.
    Submit {
        /// Pipeline file.
        #[arg(default_value = ".gitlab-ci.yml")]
        file: PathBuf,
        /// config.toml whose queue to use (the queue lives beside it).
        #[arg(short, long, default_value = "config.toml")]
        config: PathBuf,
        /// Warn about pipeline keys this version does not support instead of failing.
        #[arg(long)]
        allow_unsupported: bool,
    },
    /// Cancel jobs of the embedded queue: a pending job ends at once, a running one is stopped
    /// by its manager (its `after_script` does not run), both reported `canceled`.
    Cancel {
        /// Job ids (as `slipway submit` and `slipway jobs` print them).
        #[arg(required = true)]
        ids: Vec<u64>,
        /// config.toml whose queue to use (the queue lives beside it).
        #[arg(short, long, default_value = "config.toml")]
        config: PathBuf,
    },
    /// Print the fleet as the status page shows it, from a running `slipway run`'s
    /// `/api/v1/status` (its `listen_address`, with `[status_page] token` when set).
    Status {
        /// config.toml of the running manager.
        #[arg(short, long, default_value = "config.toml")]
        config: PathBuf,
        /// Print the JSON answer instead of the summary.
        #[arg(long)]
        json: bool,
    },
    /// List the embedded queue's jobs: pending, running, and finished with their results.
    Jobs {
        /// config.toml whose queue to list (the queue lives beside it).
        #[arg(short, long, default_value = "config.toml")]
        config: PathBuf,
    },
    /// Simulate a day of jobs on a simulated cloud: GitLab's algorithm, Slipway's, and a
    /// clairvoyant bound, all through the real taskscaler on simulated time.
    Sim {
        /// Trace: `diurnal`, `burst`, `weekend`, `mixed` (jobs of three sizes: GitLab's one
        /// shape and tagged runners against Slipway's shapes, in USD), or a CSV file
        /// (arrival_s,duration_s,cpu,memory).
        #[arg(long, default_value = "diurnal")]
        trace: String,
        /// Random seed of the trace and the simulated cloud.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Sweep each policy's settings for the cheapest that meets the wait target (minutes).
        #[arg(long)]
        sweep: bool,
        /// p95 wait target in seconds.
        #[arg(long, default_value_t = 30.0)]
        target_p95: f64,
    },
    /// Check a config.toml and report every problem: wrong types and values (errors, exit 1),
    /// unknown keys and things missing on this machine (warnings).
    VerifyConfig {
        /// config.toml.
        #[arg(short, long, default_value = "config.toml")]
        config: PathBuf,
        /// Directory searched first for plugins (fleeting-plugin-*, executor-plugin-*).
        #[arg(long, env = "SLIPWAY_PLUGIN_DIR")]
        plugin_dir: Option<PathBuf>,
    },
    /// Register a runner with GitLab and append its [[runners]] entry to config.toml.
    ///
    /// Either `--token glrt-…` (a runner created in GitLab's UI) or the legacy
    /// `--registration-token`. The file is created if absent, written with mode 0600.
    Register {
        /// config.toml to append to.
        #[arg(short, long, default_value = "config.toml")]
        config: PathBuf,
        /// GitLab's URL.
        #[arg(short, long, env = "CI_SERVER_URL")]
        url: String,
        /// Runner authentication token (glrt-…) of a runner created in GitLab's UI.
        #[arg(short, long, env = "CI_SERVER_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Legacy registration token.
        #[arg(short, long, env = "REGISTRATION_TOKEN", hide_env_values = true)]
        registration_token: Option<String>,
        /// Runner name (default: the host name).
        #[arg(long, env = "RUNNER_NAME")]
        name: Option<String>,
        /// Executor: instance, docker-autoscaler, shell, docker or custom.
        #[arg(long, env = "RUNNER_EXECUTOR")]
        executor: String,
        /// Default image of the docker executors.
        #[arg(long, env = "DOCKER_IMAGE")]
        docker_image: Option<String>,
        /// Runner description (legacy flow; default: the name).
        #[arg(long)]
        description: Option<String>,
        /// Tags, comma-separated (legacy flow).
        #[arg(long, value_delimiter = ',')]
        tag_list: Vec<String>,
        /// Also run untagged jobs (legacy flow).
        #[arg(long)]
        run_untagged: bool,
        /// Lock the runner to its project (legacy flow).
        #[arg(long)]
        locked: bool,
        /// Start paused (legacy flow).
        #[arg(long)]
        paused: bool,
        /// `not_protected` or `ref_protected` (legacy flow).
        #[arg(long)]
        access_level: Option<String>,
        /// Longest job in seconds (legacy flow).
        #[arg(long)]
        maximum_timeout: Option<u64>,
        /// Maintenance note (legacy flow).
        #[arg(long)]
        maintenance_note: Option<String>,
    },
    /// The nesting daemon (one VM per slot on an instance) and calls to it.
    Nesting {
        /// The daemon's unix socket.
        #[arg(long, global = true, env = "SLIPWAY_NESTING_SOCKET", default_value = vm::DEFAULT_SOCKET)]
        socket: PathBuf,
        #[command(subcommand)]
        command: NestingCommand,
    },
    /// Guest images for the microvm and vm isolation levels.
    Image {
        #[command(subcommand)]
        command: ImageCommand,
    },
    /// Step into a failed job's VM: restore the snapshot `snapshot: on_failure` kept, on this
    /// machine, and open a shell in the job's directory (or run COMMAND there).
    Debug {
        /// The failed job's id (its snapshot is `job-<id>`), or a snapshot name.
        job: String,
        /// The nesting daemon's socket.
        #[arg(long, env = "SLIPWAY_NESTING_SOCKET", default_value = vm::DEFAULT_SOCKET)]
        socket: PathBuf,
        /// `nesting_config` JSON file, for a daemon not initialised yet.
        #[arg(long)]
        nesting_config: Option<PathBuf>,
        /// Command to run instead of an interactive shell.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Fleeting plugins: check one against the fleeting.v1 contract.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
}

#[derive(Debug, Subcommand)]
enum PluginCommand {
    /// Run a plugin through the contract the manager relies on (handshake, Init, Increase,
    /// ConnectInfo, Heartbeat, a restart, unknown ids, Decrease, Shutdown) and print a table.
    ///
    /// Exit 0 when every check passed, 1 when one failed, 2 on usage errors. Instances the
    /// check creates are deleted again, also on failure and Ctrl-C.
    Check {
        /// Plugin name (`local`, `aws`, `fleeting-plugin-x`) or path to its binary.
        plugin: String,
        /// plugin_config JSON file (the [runners.autoscaler.plugin_config] table as JSON).
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// connector_config JSON file ([runners.autoscaler.connector_config] keys as JSON).
        #[arg(long)]
        connector: Option<PathBuf>,
        /// Also log in to the instance over SSH and run `echo`.
        #[arg(long)]
        connect: bool,
        /// Directory searched first for plugins (fleeting-plugin-*, executor-plugin-*).
        #[arg(long, env = "SLIPWAY_PLUGIN_DIR")]
        plugin_dir: Option<PathBuf>,
        /// How long an instance may take to be running or gone (e.g. 90s, 5m, 1h).
        #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
        /// Print one JSON object instead of the table.
        #[arg(long)]
        json: bool,
        /// Also write the JSON object to this file (the table still goes to stdout).
        #[arg(long)]
        json_out: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum NestingCommand {
    /// Serve nesting.v1 on the socket until SIGTERM; VMs outlive the daemon.
    Serve {
        /// VM records, disk layers and snapshots.
        #[arg(long, default_value = vm::DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
        /// Where images are found when the Init config names none.
        #[arg(long, default_value = vm::DEFAULT_IMAGES_DIR)]
        images_dir: PathBuf,
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

#[derive(Debug, Subcommand)]
enum ImageCommand {
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
        #[arg(long, default_value = vm::DEFAULT_IMAGES_DIR)]
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
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_level = match cli.command {
        Command::Exec { .. } | Command::Plugin { .. } => "warn",
        // The simulator's own scaling logs would drown its table.
        Command::Sim { .. } => "error",
        _ => "info",
    };
    init_logging(cli.log_level.as_deref().unwrap_or(default_level));
    // The simulator runs its own paused-clock runtimes: keep it off the manager's runtime.
    if let Command::Sim {
        trace,
        seed,
        sweep,
        target_p95,
    } = &cli.command
    {
        let opts = slipway_sim::SimOptions {
            target_p95_s: *target_p95,
            sweep: *sweep,
            ..slipway_sim::SimOptions::default()
        };
        return match slipway_sim::run_named_table(trace, *seed, &opts) {
            Ok(table) => {
                print!("{table}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        };
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(dispatch(cli.command, cli.queue)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // Colours only for a person watching: logs piped to a file or journal stay plain text.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // stderr, or through `slipway exec`'s live lines while they are drawn.
        .with_writer(|| slipway::progress::LogWriter)
        .init();
}

async fn dispatch(command: Command, queue: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    match command {
        Command::Exec {
            file,
            job,
            needs,
            manual,
            list,
            variables,
            variables_file,
            include_root,
            report,
            config,
            runner,
            allow_unsupported,
            plugin_dir,
            plugin_start_timeout,
        } => {
            let loaded = match &config {
                Some(path) => config::load(path).await?,
                None => config::parse(config::EMBEDDED, "embedded config")?,
            };
            print_warnings(&loaded);
            let runner_cfg = pick_runner(&loaded, runner.as_deref())?;
            let opts = exec::ExecOptions {
                file,
                jobs: job,
                needs,
                manual,
                variables,
                variables_file,
                include_root,
                allow_unsupported,
                concurrent: effective_concurrency(&loaded, &runner_cfg),
                plugin_dir,
                plugin_start_timeout,
            };
            let stop = shutdown_signal()?;
            let ok = cli::exec::exec(&runner_cfg, &opts, list, report.as_ref(), stop).await?;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Run { config, plugin_dir } => {
            let loaded = config::load(&config).await?;
            print_warnings(&loaded);
            let shutdown = manager_signals()?;
            let queue = open_queue(queue, &config).await?;
            run_manager(&loaded, &config, queue, plugin_dir, shutdown).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Submit {
            file,
            config,
            allow_unsupported,
        } => {
            let queue = open_queue(queue, &config).await?;
            submit(&queue, &file, allow_unsupported).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Cancel { ids, config } => {
            let queue = open_queue(queue, &config).await?;
            let mut code = ExitCode::SUCCESS;
            for id in ids {
                let q = queue.clone();
                match consume::blocking(move || q.cancel(id)).await {
                    Ok(Cancel::Canceled) => println!("{id}\tcanceled"),
                    Ok(Cancel::Requested) => println!("{id}\tcancel requested"),
                    Ok(Cancel::AlreadyDone(status)) => println!("{id}\talready {status}"),
                    Err(e) => {
                        eprintln!("error: job {id}: {e:#}");
                        code = ExitCode::FAILURE;
                    }
                }
            }
            Ok(code)
        }
        Command::Status { config, json } => {
            let loaded = config::load(&config).await?;
            let Some(addr) = loaded.config.listen_address.as_deref() else {
                anyhow::bail!(
                    "{}: listen_address is not set, so `slipway run` serves no status; set e.g. listen_address = \"localhost:9252\"",
                    config.display()
                );
            };
            if !loaded.config.status_page.enabled {
                anyhow::bail!(
                    "{}: [status_page] enabled = false: the manager serves no status",
                    config.display()
                );
            }
            let token = loaded.config.status_page.token.as_deref();
            let (status, body) = slipway::status::fetch(addr, token).await.with_context(|| {
                format!(
                    "asking the manager at {addr} (listen_address of {})",
                    config.display()
                )
            })?;
            if json {
                println!("{body}");
            } else {
                print!("{}", slipway_status::summary::render(&status));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Jobs { config } => {
            let queue = open_queue(queue, &config).await?;
            let q = queue.clone();
            let entries = consume::blocking(move || q.list()).await?;
            print_jobs(&entries);
            Ok(ExitCode::SUCCESS)
        }
        Command::Sim { .. } => Ok(ExitCode::SUCCESS),
        Command::Nesting { socket, command } => nesting_command(&socket, command).await,
        Command::Image { command } => image_command(command).await,
        Command::Debug {
            job,
            socket,
            nesting_config,
            command,
        } => {
            let init_config = match nesting_config {
                Some(p) => tokio::fs::read(&p)
                    .await
                    .with_context(|| format!("reading {}", p.display()))?,
                None => b"{}".to_vec(),
            };
            let code = vm::debug(vm::DebugOptions {
                job,
                socket,
                init_config,
                command,
            })
            .await?;
            Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
        }
        Command::VerifyConfig { config, plugin_dir } => verify_config(&config, plugin_dir).await,
        Command::Plugin {
            command:
                PluginCommand::Check {
                    plugin,
                    config,
                    connector,
                    connect,
                    plugin_dir,
                    timeout,
                    json,
                    json_out,
                },
        } => {
            let mut opts = plugin_check::CheckOptions::new(plugin);
            opts.plugin_dir = plugin_dir;
            opts.connect = connect;
            opts.timeout = timeout;
            if let Some(path) = &config {
                opts.plugin_config = plugin_check::load_plugin_config(path).await?;
            }
            if let Some(path) = &connector {
                (opts.connector, opts.use_external_addr) =
                    plugin_check::load_connector(path).await?;
            }
            let stop = shutdown_signal()?;
            let report = plugin_check::run(&opts, &stop).await?;
            if let Some(path) = &json_out {
                tokio::fs::write(path, serde_json::to_string(&report)?)
                    .await
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                print!("{}", report.table());
            }
            Ok(if report.passed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Register {
            config,
            url,
            token,
            registration_token,
            name,
            executor,
            docker_image,
            description,
            tag_list,
            run_untagged,
            locked,
            paused,
            access_level,
            maximum_timeout,
            maintenance_note,
        } => {
            let args = slipway::register::RegisterArgs {
                config,
                url,
                registration_token: registration_token.map(slipway_jobs::gitlab::Secret::new),
                token: token.map(slipway_jobs::gitlab::Secret::new),
                name,
                // Unknown names too: `register` refuses them with the names it takes.
                executor: executor.into(),
                docker_image,
                options: slipway_jobs::gitlab::RegisterOptions {
                    description: description.unwrap_or_default(),
                    maintenance_note: maintenance_note.unwrap_or_default(),
                    tag_list: tag_list
                        .into_iter()
                        .map(|t| t.trim().to_string())
                        .filter(|t| !t.is_empty())
                        .collect(),
                    run_untagged,
                    locked,
                    access_level: access_level.unwrap_or_default(),
                    maximum_timeout: maximum_timeout.unwrap_or(0),
                    paused,
                },
            };
            let r = slipway::register::register(&args).await?;
            // The short token only: the full one is in the file, mode 0600.
            println!(
                "Registered runner {:?}: id {}, token {}… ({} {})",
                r.name,
                r.id,
                r.short_token,
                if r.created { "created" } else { "appended to" },
                r.config.display()
            );
            // What the new entry still needs (e.g. an autoscaler section) is said now, not at run.
            if let Err(e) = config::load(&r.config).await {
                eprintln!(
                    "note: {} needs editing before `slipway run`:\n{e}",
                    r.config.display()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `slipway verify-config`: every problem, in file order, then a summary; exit 1 on errors.
async fn verify_config(path: &Path, plugin_dir: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let file = path.display().to_string();
    let text = tokio::fs::read_to_string(path)
        .await
        .with_context(|| format!("cannot read {file}"))?;
    let opts = config::CheckOptions {
        plugins: true,
        plugin_dir,
    };
    let checked = config::check(&text, &file, &opts);
    let plugin_errors = check_executor_plugins(&checked, &file, opts.plugin_dir.as_deref()).await;
    let mut all: Vec<(&config::Problem, &str)> = checked
        .errors
        .iter()
        .map(|p| (p, "error"))
        .chain(checked.warnings.iter().map(|p| (p, "warning")))
        .collect();
    all.sort_by_key(|(p, _)| p.line.unwrap_or(usize::MAX));
    for (p, kind) in &all {
        eprintln!("{kind}: {p}");
    }
    let count = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    for e in &plugin_errors {
        eprintln!("error: {e}");
    }
    let (e, w) = (
        checked.errors.len() + plugin_errors.len(),
        checked.warnings.len(),
    );
    if e > 0 {
        println!("{file}: {}, {}", count(e, "error"), count(w, "warning"));
        return Ok(ExitCode::from(1));
    }
    let runners = checked.config.map_or(0, |c| c.runners.len());
    if w > 0 {
        println!(
            "{file}: valid, {} ({})",
            count(w, "warning"),
            count(runners, "runner")
        );
    } else {
        println!("{file}: valid ({})", count(runners, "runner"));
    }
    Ok(ExitCode::SUCCESS)
}

/// Start each `plugin` runner's executor plugin with an `Init` dry run: it must be installed
/// and accept its config. Messages for the ones that fail.
async fn check_executor_plugins(
    checked: &config::Checked,
    file: &str,
    plugin_dir: Option<&Path>,
) -> Vec<String> {
    let Some(cfg) = checked
        .config
        .as_ref()
        .filter(|_| checked.errors.is_empty())
    else {
        return Vec::new();
    };
    let mut errors = Vec::new();
    for (i, r) in cfg.runners.iter().enumerate() {
        let Some(p) = r
            .plugin
            .as_ref()
            .filter(|_| r.executor == config::Executor::Plugin)
        else {
            continue;
        };
        match slipway::runner::start_executor_plugin_with(r, p, plugin_dir, None, true).await {
            Ok(host) => {
                let levels =
                    slipway::runner::check_plugin_levels(r, &host.capabilities().isolation_levels);
                host.stop().await;
                if let Err(e) = levels {
                    errors.push(format!("{file}: runners[{i}]: {e:#}"));
                }
            }
            Err(e) => errors.push(format!("{file}: runners[{i}].plugin: {e:#}")),
        }
    }
    errors
}

fn print_warnings(loaded: &Loaded) {
    for w in &loaded.warnings {
        eprintln!("warning: {w}");
    }
}

fn pick_runner(loaded: &Loaded, name: Option<&str>) -> anyhow::Result<RunnerConfig> {
    let runners = &loaded.config.runners;
    match name {
        None => runners
            .first()
            .cloned()
            .context("the config has no [[runners]] entry"),
        Some(n) => runners
            .iter()
            .find(|r| r.name == n)
            .cloned()
            .with_context(|| {
                let names: Vec<&str> = runners.iter().map(|r| r.name.as_str()).collect();
                format!("no runner named {n:?}; the config has {names:?}")
            }),
    }
}

fn effective_concurrency(loaded: &Loaded, runner: &RunnerConfig) -> u32 {
    let global = loaded.config.concurrent.max(1);
    if runner.limit > 0 {
        global.min(runner.limit)
    } else {
        global
    }
}

/// The manager's shutdown: SIGQUIT drains it (no more jobs; the running ones finish within
/// `shutdown_timeout`), the first SIGTERM or SIGINT stops it, a second one exits at once.
fn manager_signals() -> anyhow::Result<Shutdown> {
    use tokio::signal::unix::{SignalKind, signal};
    let shutdown = Shutdown::new(shutdown_signal()?);
    let mut quit = signal(SignalKind::quit()).context("installing SIGQUIT handler")?;
    let drain = shutdown.drain.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = quit.recv() => {
                tracing::info!("SIGQUIT: finishing the running jobs, taking no new ones (SIGTERM to stop now)");
                drain.cancel();
            }
            _ = drain.cancelled() => {}
        }
    });
    Ok(shutdown)
}

/// A token cancelled on the first SIGTERM or SIGINT; a second one exits at once.
fn shutdown_signal() -> anyhow::Result<CancellationToken> {
    use tokio::signal::unix::{SignalKind, signal};
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let t = token.clone();
    tokio::spawn(async move {
        for round in 0..2 {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            if round == 0 {
                tracing::info!("shutting down: finishing cleanup (signal again to exit at once)");
                t.cancel();
            } else {
                eprintln!("second signal: exiting without cleanup");
                std::process::exit(130);
            }
        }
    });
    Ok(token)
}

fn config_dir(config: &Path) -> &Path {
    config
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// The queue named by `--queue`, or the one beside config.toml.
async fn open_queue(flag: Option<PathBuf>, config: &Path) -> anyhow::Result<Queue> {
    let dir = flag.unwrap_or_else(|| config_dir(config).join(".slipway-queue"));
    let queue = consume::blocking(move || Queue::open(dir))
        .await
        .context("opening the job queue")?;
    Ok(queue)
}

/// `slipway submit`: every job of the pipeline, flat, in file order.
async fn submit(queue: &Queue, file: &Path, allow_unsupported: bool) -> anyhow::Result<()> {
    let text = tokio::fs::read_to_string(file)
        .await
        .with_context(|| format!("cannot read {}", file.display()))?;
    let pipeline = slipway_jobs::Pipeline::parse(
        &text,
        &file.display().to_string(),
        slipway_jobs::PipelineOptions {
            allow_unsupported,
            ..Default::default()
        },
    )?;
    for w in &pipeline.warnings {
        eprintln!("warning: {w}");
    }
    let n = pipeline.jobs.len() as u64;
    let q = queue.clone();
    let ids = consume::blocking(move || q.next_ids(n)).await?;
    // The pipeline is named after its first job.
    let pipeline_id = ids.start;
    for (job, id) in pipeline.jobs.iter().zip(ids) {
        let payload = job.to_job_response(id, pipeline_id, &[]);
        let q = queue.clone();
        consume::blocking(move || q.enqueue(&payload)).await?;
        println!("{id}\t{}", job.name);
    }
    Ok(())
}

fn print_jobs(entries: &[Entry]) {
    let header = ["ID", "NAME", "STAGE", "STATE", "INSTANCE", "SLOT", "REASON"];
    let rows: Vec<[String; 7]> = entries
        .iter()
        .map(|e| {
            let (instance, slot, reason) = match &e.state {
                JobState::Pending | JobState::Running(None) => (None, None, String::new()),
                JobState::Running(Some(s)) => {
                    (Some(s.instance_id.clone()), Some(s.slot), String::new())
                }
                JobState::Done(r) => {
                    let mut reason = r.failure_reason.clone().unwrap_or_default();
                    if !r.message.is_empty() {
                        let msg: String = r
                            .message
                            .lines()
                            .next()
                            .unwrap_or("")
                            .chars()
                            .take(80)
                            .collect();
                        reason = if reason.is_empty() {
                            msg
                        } else {
                            format!("{reason}: {msg}")
                        };
                    }
                    (r.instance_id.clone(), r.slot, reason)
                }
            };
            [
                e.id.to_string(),
                e.name.clone(),
                e.stage.clone(),
                e.state.label().to_string(),
                instance.unwrap_or_else(|| "-".into()),
                slot.map_or_else(|| "-".into(), |s| s.to_string()),
                reason,
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cols: Vec<&str>| {
        cols.iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    println!("{}", line(header.to_vec()));
    for row in &rows {
        println!("{}", line(row.iter().map(String::as_str).collect()));
    }
}

async fn run_manager(
    loaded: &Loaded,
    config_path: &Path,
    queue: Queue,
    plugin_dir: Option<PathBuf>,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let stop = shutdown.stop.clone();
    // One manager consumes a queue: a second would report the first one's jobs as orphans.
    let q = queue.clone();
    let _consumer = consume::blocking(move || q.lock_consumer()).await?;
    // What the last manager left claimed, before this one claims anything.
    let q = queue.clone();
    let claimed = consume::blocking(move || q.running()).await?;
    let families = std::sync::Arc::new(slipway_taskscaler::metrics::MetricFamilies::default());
    let job_metrics = slipway_status::JobMetrics::default();
    let opts = runner::StartOptions {
        plugin_dir,
        state_dir: Some(config::state_dir(config_path)),
        metrics: Some(families.clone()),
        job_metrics: Some(job_metrics.clone()),
        concurrent: loaded.config.concurrent,
        ..runner::StartOptions::default()
    };
    let mut runners: Vec<Arc<runner::Runner>> = Vec::new();
    for cfg in &loaded.config.runners {
        let started = tokio::select! {
            r = runner::Runner::start(cfg, &opts) => r,
            _ = shutdown.drain.cancelled() => break,
        };
        match started {
            Ok(r) => runners.push(Arc::new(r)),
            Err(e) => {
                for r in &runners {
                    r.shutdown().await;
                }
                return Err(e);
            }
        }
    }
    tracing::info!(
        runners = runners.len(),
        queue = %queue.dir().display(),
        "manager running"
    );
    // Sampled from the start, so the page's charts cover the manager's whole life.
    let page = &loaded.config.status_page;
    let (interval, span) = page.history_durations();
    let mut status = slipway::status::StatusService::new(runners.clone(), interval, span);
    // The embedded queue feeds only the runners GitLab does not.
    if !loaded.config.runners.iter().all(gitlab::serves_gitlab) {
        status = status.with_queue(queue.clone());
    }
    let status = Arc::new(status);
    let sampler_stop = CancellationToken::new();
    // Sampled, and listed, only for someone to look at.
    let served = loaded.config.listen_address.is_some() && page.enabled;
    let sampler = served.then(|| status.clone().spawn(sampler_stop.clone()));
    let server = match &loaded.config.listen_address {
        None => None,
        Some(addr) => {
            let registry = slipway::server::registry(&families, &job_metrics);
            let routes = page.enabled.then(|| {
                let status = status.clone();
                slipway::server::StatusRoutes {
                    status: Arc::new(move || status.collect()),
                    token: page.token.clone(),
                }
            });
            match slipway::server::Server::start(addr, registry, routes).await {
                Ok(s) => Some(s),
                Err(e) => {
                    sampler_stop.cancel();
                    if let Some(s) = sampler {
                        let _ = s.await;
                    }
                    for r in &runners {
                        r.shutdown().await;
                    }
                    return Err(e);
                }
            }
        }
    };
    // The job source: restart recovery, then one dispatcher per runner. All end on `stop`.
    let mut sources = tokio::task::JoinSet::new();
    {
        // A drain stops it too: it only reports what the last manager left.
        let (queue, runners, drain) = (queue.clone(), runners.clone(), shutdown.drain.clone());
        sources.spawn(async move {
            if let Err(e) = consume::recover(&queue, claimed, &runners, &drain).await {
                tracing::error!("recovering the jobs of the last run: {e:#}");
            }
        });
    }
    let global = Arc::new(Semaphore::new(loaded.config.concurrent.max(1) as usize));
    for (r, cfg) in runners.iter().zip(&loaded.config.runners) {
        let limits = consume::Limits {
            runner: Arc::new(Semaphore::new(effective_concurrency(loaded, cfg) as usize)),
            global: global.clone(),
        };
        if gitlab::serves_gitlab(cfg) {
            let opts = gitlab::SourceOptions {
                state_dir: config::state_dir(config_path),
                check_interval: std::time::Duration::from_secs(
                    match loaded.config.check_interval {
                        0 => 3,
                        s => s,
                    },
                ),
                runner_limit: limits.runner,
                global_limit: limits.global,
            };
            let (r, cfg, shutdown) = (r.clone(), cfg.clone(), shutdown.clone());
            sources.spawn(async move {
                // A runner GitLab refuses stops serving; the others go on.
                if let Err(e) = gitlab::serve(r, &cfg, opts, shutdown).await {
                    tracing::error!("{e}");
                }
            });
            continue;
        }
        sources.spawn(consume::serve(
            r.clone(),
            queue.clone(),
            limits,
            shutdown.clone(),
        ));
    }
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(60));
    // Policies follow config.toml edits (GitLab reloads only [[runners.autoscaler.policy]]).
    let mut reload = tokio::time::interval(std::time::Duration::from_secs(2));
    let mut seen = modified(config_path).await;
    loop {
        tokio::select! {
            // A stop drains too.
            _ = shutdown.drain.cancelled() => break,
            _ = reload.tick() => {
                let now = modified(config_path).await;
                if now != seen {
                    seen = now;
                    reload_policies(config_path, &runners).await;
                }
            }
            _ = tick.tick() => {
                for r in &runners {
                    let s = r.stats();
                    tracing::info!(runner = %r.name, instances = s.instances, running = s.running,
                        acquired = s.acquired, pending = s.pending, "status");
                }
            }
        }
    }
    // Draining: no source takes another job; the running ones have `shutdown_timeout` to end.
    let timer = (!stop.is_cancelled()).then(|| {
        let timeout = slipway::shutdown::timeout_of(loaded.config.shutdown_timeout);
        tracing::info!(
            ?timeout,
            "draining: taking no more jobs, waiting for the running ones"
        );
        shutdown.drain_within(timeout)
    });
    // Running jobs end (or, on a stop, are canceled) and are reported before their runners
    // stop.
    while let Some(r) = sources.join_next().await {
        if let Err(e) = r {
            tracing::error!("job source task failed: {e}");
        }
    }
    if let Some(timer) = timer {
        timer.abort();
    }
    if let Some(server) = server {
        server.stop().await;
    }
    sampler_stop.cancel();
    if let Some(s) = sampler {
        let _ = s.await;
    }
    for r in &runners {
        r.shutdown().await;
    }
    Ok(())
}

async fn modified(path: &Path) -> Option<std::time::SystemTime> {
    tokio::fs::metadata(path)
        .await
        .and_then(|m| m.modified())
        .ok()
}

/// Apply the policies of an edited config; a broken file keeps the old ones.
async fn reload_policies(path: &Path, runners: &[Arc<runner::Runner>]) {
    let loaded = match config::load(path).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("config changed but cannot be used; keeping the old policies:\n{e}");
            return;
        }
    };
    for r in runners {
        let Some(auto) = loaded
            .config
            .runners
            .iter()
            .find(|c| c.name == r.name)
            .and_then(|c| c.autoscaler.as_ref())
        else {
            continue;
        };
        let policies: Vec<_> = auto.policy.iter().map(|p| p.to_policy()).collect();
        match r.set_policies(&policies) {
            Ok(()) => {
                tracing::info!(runner = %r.name, policies = policies.len(), "policies reloaded")
            }
            Err(e) => tracing::warn!(runner = %r.name, error = %e, "reloaded policies refused"),
        }
    }
}

async fn nesting_command(
    socket: &std::path::Path,
    command: NestingCommand,
) -> anyhow::Result<ExitCode> {
    if let NestingCommand::Serve {
        state_dir,
        images_dir,
    } = command
    {
        let stop = shutdown_signal()?;
        let opts = slipway_nesting::daemon::DaemonOptions {
            state_dir,
            images_dir,
        };
        vm::serve(socket, opts, stop).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut client = vm::connect(socket).await?;
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
            vm::print_vms(&[vm]);
        }
        NestingCommand::Delete { id } => client.delete(&id).await?,
        NestingCommand::List => vm::print_vms(&client.list().await?),
        NestingCommand::Shutdown => client.shutdown().await?,
        NestingCommand::Snapshot { vm, name } => {
            let (snap, expired) = client.snapshot(&vm, &name, Default::default()).await?;
            vm::print_snapshots(&[snap]);
            for e in expired {
                eprintln!("removed snapshot {e}: retention limit exceeded");
            }
        }
        NestingCommand::Restore { snapshot, slot } => {
            let (vm, stomped) = client.restore(&snapshot, slot).await?;
            if let Some(id) = stomped {
                eprintln!("stomped VM {id}");
            }
            vm::print_vms(&[vm]);
        }
        NestingCommand::Snapshots => vm::print_snapshots(&client.list_snapshots().await?),
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
    let mut opts = slipway_nesting::image::BuildOptions::new(name, level, images_dir, agent);
    opts.kernel = kernel;
    opts.cache_dir = cache_dir;
    opts.sshd = sshd;
    let manifest = vm::build_image(&opts).await?;
    println!(
        "built {} image {:?} in {} (kernel {})",
        manifest.level.as_str(),
        manifest.name,
        opts.out_dir.join(&manifest.name).display(),
        manifest.kernel_version
    );
    Ok(ExitCode::SUCCESS)
}
