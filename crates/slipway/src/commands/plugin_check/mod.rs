//! `slipway plugin check`: a fleeting plugin run through the `fleeting.v1` contract the
//! manager relies on ([`checks`]), with a table or JSON report.

mod checks;
mod cleanup;
mod instance_checks;
mod options;
mod process_checks;
mod report;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;

use options::CheckOptions;

use super::signals;

/// What `slipway plugin` takes.
#[derive(Debug, clap::Args)]
pub struct PluginArgs {
    #[command(subcommand)]
    pub command: PluginCommand,
}

/// Fleeting plugin commands.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
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

/// Run the plugin command.
pub async fn run(args: PluginArgs) -> anyhow::Result<ExitCode> {
    let PluginCommand::Check {
        plugin,
        config,
        connector,
        connect,
        plugin_dir,
        timeout,
        json,
        json_out,
    } = args.command;
    let mut opts = CheckOptions::new(plugin);
    opts.plugin_dir = plugin_dir;
    opts.connect = connect;
    opts.timeout = timeout;
    if let Some(path) = &config {
        opts.plugin_config = options::load_plugin_config(path).await?;
    }
    if let Some(path) = &connector {
        (opts.connector, opts.use_external_addr) = options::load_connector(path).await?;
    }
    let stop = signals::shutdown_signal()?;
    let report = checks::run(&opts, &stop).await?;
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
