//! `slipway verify-config`: every problem of a config.toml with its line, and the executor
//! plugins it names started for a dry run.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use slipway_config::Executor;

/// What `slipway verify-config` takes.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// config.toml.
    #[arg(short, long, default_value = "config.toml")]
    pub config: PathBuf,
    /// Directory searched first for plugins (fleeting-plugin-*, executor-plugin-*).
    #[arg(long, env = "SLIPWAY_PLUGIN_DIR")]
    pub plugin_dir: Option<PathBuf>,
}

/// `slipway verify-config`: every problem, in file order, then a summary; exit 1 on errors.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (path, plugin_dir) = (args.config, args.plugin_dir);
    let file = path.display().to_string();
    let text = tokio::fs::read_to_string(&path)
        .await
        .with_context(|| format!("cannot read {file}"))?;
    let opts = slipway_config::CheckOptions {
        plugins: true,
        plugin_dir,
    };
    let checked = slipway_config::check(&text, &file, &opts);
    let plugin_errors = check_executor_plugins(&checked, &file, opts.plugin_dir.as_deref()).await;
    let mut all: Vec<(&slipway_config::Problem, &str)> = checked
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
    checked: &slipway_config::Checked,
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
        let Some(p) = r.plugin.as_ref().filter(|_| r.executor == Executor::Plugin) else {
            continue;
        };
        match slipway_manager::runner::start_executor_plugin_with(r, p, plugin_dir, None, true)
            .await
        {
            Ok(host) => {
                let levels = slipway_manager::runner::check_plugin_levels(
                    r,
                    &host.capabilities().isolation_levels,
                );
                host.stop().await;
                if let Err(e) = levels.map_err(anyhow::Error::from) {
                    errors.push(format!("{file}: runners[{i}]: {e:#}"));
                }
            }
            Err(e) => {
                // Through anyhow: `{:#}` shows the error's causes too.
                let e = anyhow::Error::from(e);
                errors.push(format!("{file}: runners[{i}].plugin: {e:#}"))
            }
        }
    }
    errors
}
