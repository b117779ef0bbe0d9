//! `slipway`: the CI job runner's manager and command line.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use slipway::config::{self, Loaded, RunnerConfig};
use slipway::{exec, runner};

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
        /// Run only this job.
        #[arg(long)]
        job: Option<String>,
        /// config.toml to use instead of the embedded default.
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// Which [[runners]] entry of the config to use (default: the first).
        #[arg(long)]
        runner: Option<String>,
        /// Warn about pipeline keys this version does not support instead of failing.
        #[arg(long)]
        allow_unsupported: bool,
        /// Directory searched first for fleeting plugins.
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
        /// Directory searched first for fleeting plugins.
        #[arg(long, env = "SLIPWAY_PLUGIN_DIR")]
        plugin_dir: Option<PathBuf>,
    },
    /// Simulate a day of jobs on a simulated cloud: GitLab's algorithm, Slipway's, and a
    /// clairvoyant bound, all through the real taskscaler on simulated time.
    Sim {
        /// Trace: `diurnal`, `burst`, `weekend`, or a CSV file (arrival_s,duration_s,cpu,memory).
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
    /// Check a config.toml and report every problem.
    VerifyConfig {
        /// config.toml.
        #[arg(short, long, default_value = "config.toml")]
        config: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_level = match cli.command {
        Command::Exec { .. } => "warn",
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
        return match slipway_sim::run_named(trace, *seed, &opts) {
            Ok(report) => {
                print!("{}", report.table());
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
    match runtime.block_on(dispatch(cli.command)) {
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
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

async fn dispatch(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Exec {
            file,
            job,
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
                job,
                allow_unsupported,
                concurrent: effective_concurrency(&loaded, &runner_cfg),
                plugin_dir,
                plugin_start_timeout,
            };
            let stop = shutdown_signal()?;
            let ok = exec::run(&runner_cfg, &opts, stop).await?;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Run { config, plugin_dir } => {
            let loaded = config::load(&config).await?;
            print_warnings(&loaded);
            let stop = shutdown_signal()?;
            let config_dir = config
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."));
            run_manager(&loaded, &config, config_dir, plugin_dir, stop).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Sim { .. } => Ok(ExitCode::SUCCESS),
        Command::VerifyConfig { config } => {
            let loaded = config::load(&config).await?;
            print_warnings(&loaded);
            println!(
                "{}: ok ({} runner(s))",
                config.display(),
                loaded.config.runners.len()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
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

async fn run_manager(
    loaded: &Loaded,
    config_path: &std::path::Path,
    config_dir: &std::path::Path,
    plugin_dir: Option<PathBuf>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let families = std::sync::Arc::new(slipway_taskscaler::metrics::MetricFamilies::default());
    let opts = runner::StartOptions {
        plugin_dir,
        state_dir: Some(config_dir.join(".slipway-state")),
        metrics: Some(families.clone()),
        ..runner::StartOptions::default()
    };
    let mut runners = Vec::new();
    for cfg in &loaded.config.runners {
        let started = tokio::select! {
            r = runner::Runner::start(cfg, &opts) => r,
            _ = stop.cancelled() => break,
        };
        match started {
            Ok(r) => runners.push(r),
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
        "manager running; job sources arrive with GitLab support"
    );
    let server = match &loaded.config.listen_address {
        None => None,
        Some(addr) => {
            let mut registry = prometheus_client::registry::Registry::default();
            families.register(&mut registry);
            match slipway::server::Server::start(addr, registry).await {
                Ok(s) => Some(s),
                Err(e) => {
                    for r in &runners {
                        r.shutdown().await;
                    }
                    return Err(e);
                }
            }
        }
    };
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(60));
    // Policies follow config.toml edits (GitLab reloads only [[runners.autoscaler.policy]]).
    let mut reload = tokio::time::interval(std::time::Duration::from_secs(2));
    let mut seen = modified(config_path).await;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
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
    if let Some(server) = server {
        server.stop().await;
    }
    for r in &runners {
        r.shutdown().await;
    }
    Ok(())
}

async fn modified(path: &std::path::Path) -> Option<std::time::SystemTime> {
    tokio::fs::metadata(path)
        .await
        .and_then(|m| m.modified())
        .ok()
}

/// Apply the policies of an edited config; a broken file keeps the old ones.
async fn reload_policies(path: &std::path::Path, runners: &[runner::Runner]) {
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
