//! `slipway sim`: a day of jobs on a simulated cloud, through the real taskscaler on simulated
//! time. It runs its own paused-clock runtimes: keep it off the manager's runtime.

use std::collections::HashMap;
use std::process::ExitCode;

/// What `slipway sim` takes.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Trace: `diurnal`, `burst`, `weekend`, `mixed` (jobs of three sizes: GitLab's one
    /// shape and tagged runners against Slipway's shapes, in USD), or a CSV file
    /// (arrival_s,duration_s,cpu,memory).
    #[arg(long, default_value = "diurnal")]
    pub trace: String,
    /// Random seed of the trace and the simulated cloud.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Sweep each policy's settings for the cheapest that meets the wait target (minutes).
    #[arg(long)]
    pub sweep: bool,
    /// p95 wait target in seconds.
    #[arg(long, default_value_t = 30.0)]
    target_p95: f64,
    /// Price the mixed trace's instance types as this config.toml does: each shape's (or
    /// runner's) `price_per_hour` applies to the instance type its `plugin_config`
    /// `instance_type` names, or to the type its shape is named after.
    #[arg(long, value_name = "PATH")]
    pub config: Option<std::path::PathBuf>,
}

/// Instance type → price per hour from the `price_per_hour` keys of `cfg`.
fn prices_of(cfg: &slipway_config::Config) -> (HashMap<String, f64>, Vec<String>) {
    let mut prices = HashMap::new();
    let mut currencies = Vec::new();
    let type_of = |table: &toml::Table, name: &str| {
        table
            .get("instance_type")
            .and_then(toml::Value::as_str)
            .unwrap_or(name)
            .to_string()
    };
    for r in &cfg.runners {
        let Some(auto) = &r.autoscaler else { continue };
        let mut add = |value: Option<&slipway_config::PriceValue>, ty: String| {
            if let Some(p) = value.and_then(|v| v.price(auto.currency.as_deref()).ok()) {
                currencies.push(p.currency.clone());
                prices.insert(ty, p.per_hour);
            }
        };
        add(
            auto.price_per_hour.as_ref(),
            type_of(&auto.plugin_config, &r.name),
        );
        for shape in &auto.shape {
            let mut table = auto.plugin_config.clone();
            table.extend(shape.plugin_config.clone());
            add(
                shape
                    .price_per_hour
                    .as_ref()
                    .or(auto.price_per_hour.as_ref()),
                type_of(&table, &shape.name),
            );
        }
    }
    currencies.sort();
    currencies.dedup();
    (prices, currencies)
}

/// Run the simulation and print its table.
pub fn run(args: &Args) -> ExitCode {
    let opts = slipway_sim::SimOptions {
        target_p95_s: args.target_p95,
        sweep: args.sweep,
        ..slipway_sim::SimOptions::default()
    };
    let prices = match &args.config {
        None => HashMap::new(),
        Some(path) => {
            let text = match std::fs::read_to_string(path) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("error: reading {}: {e}", path.display());
                    return ExitCode::from(2);
                }
            };
            let loaded = match slipway_config::parse(&text, &path.display().to_string()) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            let (prices, currencies) = prices_of(&loaded.config);
            if currencies.iter().any(|c| c != "USD") {
                eprintln!(
                    "warning: {} prices in {}: the table's USD column holds them as written",
                    path.display(),
                    currencies.join(", ")
                );
            }
            prices
        }
    };
    match slipway_sim::run_named_table_priced(&args.trace, args.seed, &opts, &prices) {
        Ok(table) => {
            print!("{table}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
