//! The long chaos soak: 2,000 jobs (`SLIPWAY_SOAK_JOBS` to change) through `slipway run`, once
//! on the embedded queue and once on the GitLab fake, over 16 slots on up to five instances,
//! with every fault of the schedule (see `tests/chaos`). Writes `bench/results/soak.json` and
//! fails when a goal is missed: a job lost or reported twice, anything left behind, or the
//! last manager's RSS growing more than 10 % over the last half of its life.

#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../tests/chaos/mod.rs"]
mod chaos;
#[path = "../tests/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::time::Duration;

use chaos::{Plan, Source};
use serde_json::json;

const COMMAND: &str = "make soak";

fn main() -> anyhow::Result<()> {
    let jobs: usize = std::env::var("SLIPWAY_SOAK_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let mut runs = serde_json::Map::new();
    let mut failures = Vec::new();
    for source in [Source::Queue, Source::Gitlab] {
        let plan = Plan {
            source,
            jobs,
            seed: 2026,
            capacity_per_instance: 4,
            max_instances: 5,
            concurrent: 16,
            max_use_count: 60,
            outage: Duration::from_secs(30),
            disk_full: Duration::from_secs(30),
            stall: Duration::from_secs(300),
        };
        let report = chaos::run(&plan);
        let entry = report.to_json(&plan);
        eprintln!("{entry:#}");
        for p in report.problems() {
            failures.push(format!("{}: {p}", source.as_str()));
        }
        if report.rss_growth_last_half() > 0.10 {
            failures.push(format!(
                "{}: the manager's RSS grew {:.1} % over the last half",
                source.as_str(),
                report.rss_growth_last_half() * 100.0
            ));
        }
        runs.insert(source.as_str().to_string(), entry);
    }
    let results = json!({
        "runs": runs,
        "goals": {"lost": 0, "duplicated": 0, "orphans": 0, "manager_rss_growth_last_half_max": 0.10},
        "goals_met": failures.is_empty(),
        "dispatch_from": "queue: the slot acquired (the queue's start record); gitlab: the job handed out by jobs/request; to the job's first script line",
    });
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let (path, text) = slipway_testkit::bench::write(&repo, "soak", COMMAND, results)?;
    println!("{text}");
    eprintln!("wrote {}", path.display());
    if !failures.is_empty() {
        anyhow::bail!("soak goals missed:\n{}", failures.join("\n"));
    }
    Ok(())
}
