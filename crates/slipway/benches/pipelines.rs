//! The pipeline corpus under `slipway exec` (shell runner) and under gitlab-ci-local, one case
//! at a time, each tool in a fresh checkout: how many cases agree, and the total wall time of
//! each tool over the corpus, measured in the same run.
//!
//! Writes `bench/results/pipelines.json`. Run with `make bench-pipelines`.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;
use slipway_testkit::peer;

const COMMAND: &str = "make bench-pipelines";

fn main() -> anyhow::Result<()> {
    peer::ensure_peer()?;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../pipeline/tests/pipelines");
    let slipway = slipway_testkit::plugin_check::slipway_binary()?;
    let cases = peer::cases(&root)?;
    let (mut ours, mut theirs) = (Duration::ZERO, Duration::ZERO);
    let (mut agree, mut deviations) = (0usize, 0usize);
    let mut disagree = Vec::new();
    for case in &cases {
        let c = peer::compare(&slipway, case)?;
        ours += c.ours_time;
        theirs += c.peer_time;
        if c.agrees() {
            agree += 1;
        } else {
            disagree.push(c.case.clone());
        }
        if c.deviation.is_some() {
            deviations += 1;
        }
        eprintln!(
            "{:<50} slipway {:>6.2}s  gitlab-ci-local {:>6.2}s  {}",
            c.case,
            c.ours_time.as_secs_f64(),
            c.peer_time.as_secs_f64(),
            if c.agrees() { "agree" } else { "DISAGREE" }
        );
    }
    let results = json!({
        "cases": cases.len(),
        "agree": agree,
        "disagree": disagree,
        "peer_deviations_documented": deviations,
        "slipway_s": (ours.as_secs_f64() * 100.0).round() / 100.0,
        "peer_s": (theirs.as_secs_f64() * 100.0).round() / 100.0,
        "slipway_over_peer": (ours.as_secs_f64() / theirs.as_secs_f64() * 1000.0).round() / 1000.0,
        "peer": format!("gitlab-ci-local {} (--shell-isolation --force-shell-executor)", peer::PEER_VERSION),
        "setup": "each case in its own git checkout (main pushed to a bare origin, branch/tag/changes per case.json); slipway exec with a shell runner (release build); wall time from start to exit of each tool",
    });
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let (path, text) = slipway_testkit::bench::write(&repo, "pipelines", COMMAND, results)?;
    println!("{text}");
    eprintln!("wrote {}", path.display());
    Ok(())
}
