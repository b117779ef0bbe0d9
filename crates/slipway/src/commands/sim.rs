//! `slipway sim`: a day of jobs on a simulated cloud, through the real taskscaler on simulated
//! time. It runs its own paused-clock runtimes: keep it off the manager's runtime.

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
}

/// Run the simulation and print its table.
pub fn run(args: &Args) -> ExitCode {
    let opts = slipway_sim::SimOptions {
        target_p95_s: args.target_p95,
        sweep: args.sweep,
        ..slipway_sim::SimOptions::default()
    };
    match slipway_sim::run_named_table(&args.trace, args.seed, &opts) {
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
