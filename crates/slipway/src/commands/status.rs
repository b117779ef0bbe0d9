//! `slipway status`: the fleet of a running `slipway run`, from its `/api/v1/status`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;

/// What `slipway status` takes.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// config.toml of the running manager.
    #[arg(short, long, default_value = "config.toml")]
    pub config: PathBuf,
    /// Print the JSON answer instead of the summary.
    #[arg(long)]
    pub json: bool,
    /// Whether the systemd service NAME (default: slipway) runs, instead of the fleet.
    #[arg(long, value_name = "NAME", num_args = 0..=1, default_missing_value = "slipway")]
    pub service: Option<String>,
}

/// Ask the manager the config names and print its answer.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let Args {
        config,
        json,
        service,
    } = args;
    if let Some(service) = service {
        return super::service::status(super::service::ServiceArgs { service }).await;
    }
    let loaded = slipway_config::load(&config).await?;
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
    let (status, body) = slipway_manager::status::fetch(addr, token)
        .await
        .with_context(|| {
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
