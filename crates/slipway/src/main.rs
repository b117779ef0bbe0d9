//! `slipway`: the CI job runner's command line. The manager is `slipway-manager`, the config
//! `slipway-config`; this binary parses arguments, sets up logging and runs one command.

mod cli;
mod commands;
mod helper;
mod logging;
mod progress;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser as _;

use cli::{Cli, Command};
use commands::{
    exec, plugin_check, queue, register, run, runners, service, sim, status, verify_config, vm,
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_level = match cli.command {
        Command::Exec(_) | Command::Plugin(_) => "warn",
        // The simulator's own scaling logs would drown its table.
        Command::Sim(_) => "error",
        _ => "info",
    };
    logging::init(cli.log_level.as_deref().unwrap_or(default_level));
    // The simulator runs its own paused-clock runtimes: keep it off the manager's runtime.
    if let Command::Sim(args) = &cli.command {
        return sim::run(args);
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

/// Run `command`; `queue` is the global `--queue`.
async fn dispatch(command: Command, queue: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    match command {
        Command::Exec(args) => exec::run(args).await,
        Command::Run(args) => run::run(args, queue).await,
        Command::Submit(args) => queue::submit(args, queue).await,
        Command::Cancel(args) => queue::cancel(args, queue).await,
        Command::Jobs(args) => queue::jobs(args, queue).await,
        Command::Status(args) => status::run(args).await,
        Command::Sim(args) => Ok(sim::run(&args)),
        Command::VerifyConfig(args) => verify_config::run(args).await,
        Command::Register(args) => register::run(args).await,
        Command::List(args) => runners::list(args).await,
        Command::Unregister(args) => runners::unregister(args).await,
        Command::Verify(args) => runners::verify(args).await,
        Command::Install(args) => service::install(args).await,
        Command::Start(args) => service::start(args).await,
        Command::Stop(args) => service::stop(args).await,
        Command::Uninstall(args) => service::uninstall(args).await,
        Command::Nesting(args) => vm::nesting(args).await,
        Command::Image(args) => vm::image(args).await,
        Command::Debug(args) => vm::debug_command(args).await,
        Command::Plugin(args) => plugin_check::run(args).await,
    }
}
