//! The command line: `slipway` and its commands (each command's arguments live with it in
//! [`crate::commands`]).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::commands::{
    exec, plugin_check, queue, register, run, runners, service, sim, status, verify_config, vm,
};

/// `slipway`'s arguments.
#[derive(Debug, Parser)]
#[command(
    name = "slipway",
    version,
    about = "CI job runner with autoscaling and per-job isolation"
)]
pub struct Cli {
    /// Log level for the manager's own messages (error, warn, info, debug, trace).
    #[arg(long, global = true, env = "SLIPWAY_LOG")]
    pub log_level: Option<String>,
    /// The embedded job queue's directory (default: `queue` in config.toml's `state_dir`, else
    /// `.slipway-queue` beside config.toml).
    #[arg(long, global = true, env = "SLIPWAY_QUEUE")]
    pub queue: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a local pipeline file through the whole stack.
    Exec(exec::Args),
    /// Run the manager with a config.toml until SIGTERM or Ctrl-C (SIGQUIT: once the running
    /// jobs have finished, within shutdown_timeout).
    Run(run::Args),
    /// Add every job of a local pipeline file to the embedded queue that `slipway run` consumes.
    ///
    /// Jobs are queued flat, in file order: stages and `needs` do not order them, and no
    /// artifacts pass between them. Prints each job's id and name.
    Submit(queue::SubmitArgs),
    /// Cancel jobs of the embedded queue: a pending job ends at once, a running one is stopped
    /// by its manager (its `after_script` does not run), both reported `canceled`.
    Cancel(queue::CancelArgs),
    /// Print the fleet as the status page shows it, from a running `slipway run`'s
    /// `/api/v1/status` (its `listen_address`, with `[status_page] token` when set); with
    /// `--service`, whether the systemd service runs (exit 0) or not (exit 1), as
    /// `gitlab-runner status`.
    Status(status::Args),
    /// List the embedded queue's jobs: pending, running, and finished with their results.
    Jobs(queue::JobsArgs),
    /// Simulate a day of jobs on a simulated cloud: GitLab's algorithm, Slipway's, and a
    /// clairvoyant bound, all through the real taskscaler on simulated time.
    Sim(sim::Args),
    /// Check a config.toml and report every problem: wrong types and values (errors, exit 1),
    /// unknown keys and things missing on this machine (warnings).
    VerifyConfig(verify_config::Args),
    /// Register a runner with GitLab and append its [[runners]] entry to config.toml.
    ///
    /// Either `--token glrt-…` (a runner created in GitLab's UI) or the legacy
    /// `--registration-token`. The file is created if absent, written with mode 0600.
    Register(register::Args),
    /// List the runners config.toml names: name, executor, URL, token (short form).
    List(runners::ListArgs),
    /// Remove a runner (`--name`) or every runner (`--all`) from GitLab and from config.toml.
    ///
    /// A runner created in GitLab's UI (glrt- token) loses this manager; delete the runner in
    /// the UI. One registered with a registration token is deleted.
    Unregister(runners::UnregisterArgs),
    /// Check each runner's token with GitLab; `--delete` removes the runners GitLab no longer
    /// knows from config.toml.
    Verify(runners::VerifyArgs),
    /// Write and enable a systemd unit running `slipway run` as a service (or print it where
    /// systemd does not run).
    Install(service::InstallArgs),
    /// Start the service.
    Start(service::ServiceArgs),
    /// Stop the service: a drain (SIGQUIT), so running jobs finish within shutdown_timeout.
    Stop(service::ServiceArgs),
    /// Drain and stop the service, disable it and remove the unit `install` wrote.
    Uninstall(service::ServiceArgs),
    /// The nesting daemon (one VM per slot on an instance) and calls to it.
    Nesting(vm::NestingArgs),
    /// Guest images for the microvm and vm isolation levels.
    Image(vm::ImageArgs),
    /// Step into a failed job's VM: restore the snapshot `snapshot: on_failure` kept, on this
    /// machine, and open a shell in the job's directory (or run COMMAND there).
    Debug(vm::DebugArgs),
    /// Fleeting plugins: check one against the fleeting.v1 contract.
    Plugin(plugin_check::PluginArgs),
}
