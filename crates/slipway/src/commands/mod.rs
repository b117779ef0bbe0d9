//! One module per command of the `slipway` binary, each with its arguments and what it does.

pub mod exec;
pub mod plugin_check;
pub mod queue;
pub mod register;
pub mod run;
pub mod runners;
pub mod service;
pub mod signals;
pub mod sim;
pub mod status;
pub mod verify_config;
pub mod vm;

use anyhow::Context as _;
use slipway_config::{Loaded, RunnerConfig};

/// Print the warnings of a loaded config.toml on stderr.
pub fn print_warnings(loaded: &Loaded) {
    for w in &loaded.warnings {
        eprintln!("warning: {w}");
    }
}

/// The runner named `name`, or the config's first.
pub fn pick_runner(loaded: &Loaded, name: Option<&str>) -> anyhow::Result<RunnerConfig> {
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
