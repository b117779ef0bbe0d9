//! `slipway-helper run --scratch DIR`: one data stage of a job, its plan on stdin, run in the
//! project directory (the working directory). Exit 0: done; 1: the job fails; 3: an archive
//! broke the runner's limits; 2: bad usage or plan.

use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;

use slipway_helper::{Ending, Stage};
use slipway_job::data::{DataPlan, FAILED, REFUSED};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["--version"] => {
            println!("slipway-helper {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        ["run", "--scratch", dir] => run(PathBuf::from(dir)),
        _ => {
            eprintln!("usage: slipway-helper run --scratch DIR  (the stage's plan on stdin)");
            ExitCode::from(2)
        }
    }
}

fn run(scratch: PathBuf) -> ExitCode {
    // Other processes of the job's user must not read the plan's secrets from /proc.
    let _ = nix::sys::prctl::set_dumpable(false);
    let mut text = Vec::new();
    let plan = std::io::stdin()
        .read_to_end(&mut text)
        .map_err(|e| e.to_string())
        .and_then(|_| serde_json::from_slice::<DataPlan>(&text).map_err(|e| e.to_string()));
    let plan = match plan {
        Ok(p) => p,
        Err(e) => {
            println!("ERROR: slipway-helper: reading the plan on stdin: {e}");
            return ExitCode::from(2);
        }
    };
    let project = match std::env::current_dir() {
        Ok(d) => d,
        Err(e) => {
            println!("ERROR: slipway-helper: the project directory: {e}");
            return ExitCode::from(2);
        }
    };
    let mut stage = Stage {
        project: &project,
        scratch: &scratch,
        out: std::io::stdout().lock(),
    };
    let code = match stage.run(&plan) {
        Ending::Done => 0,
        Ending::Failed => FAILED,
        Ending::Refused => REFUSED,
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
