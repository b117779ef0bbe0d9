//! `slipway run`: the manager, until SIGTERM or Ctrl-C (SIGQUIT: after the running jobs).

use std::path::PathBuf;
use std::process::ExitCode;

use slipway_manager::Manager;

use super::{print_warnings, queue, signals};

/// What `slipway run` takes.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// config.toml.
    #[arg(short, long, default_value = "config.toml")]
    pub config: PathBuf,
    /// Directory searched first for plugins (fleeting-plugin-*, executor-plugin-*).
    #[arg(long, env = "SLIPWAY_PLUGIN_DIR")]
    pub plugin_dir: Option<PathBuf>,
}

/// Load the config, open the queue and run the manager.
pub async fn run(args: Args, queue_flag: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let loaded = slipway_config::load(&args.config).await?;
    print_warnings(&loaded);
    let shutdown = signals::manager_signals()?;
    // The config is loaded already: its state_dir names the queue.
    let dir = queue_flag.unwrap_or_else(|| {
        slipway_config::queue_dir(&args.config, loaded.config.state_dir.as_deref())
    });
    let queue = queue::open_dir(dir).await?;
    Manager {
        loaded: &loaded,
        config_path: &args.config,
        queue,
        plugin_dir: args.plugin_dir,
        helper: crate::helper::find().await,
    }
    .run(shutdown)
    .await?;
    Ok(ExitCode::SUCCESS)
}
