//! The pipeline corpus (`crates/pipeline/tests/pipelines/`, over 60 projects) run by `slipway exec`
//! on a shell runner and by gitlab-ci-local, the peer: every case must agree on which jobs run,
//! with what status, printing what; where the peer departs from GitLab's documented behaviour
//! (the case names it), Slipway must give GitLab's outcome instead.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use slipway_testkit::peer;

#[test]
fn the_corpus_agrees_with_gitlab_ci_local() {
    peer::ensure_peer().unwrap();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../pipeline/tests/pipelines");
    let slipway = slipway_testkit::plugin_check::slipway_binary().unwrap();
    let mut cases = peer::cases(&root).unwrap();
    // SLIPWAY_CORPUS=NAME runs the cases whose name contains NAME (while writing one).
    match std::env::var("SLIPWAY_CORPUS") {
        Ok(only) => cases.retain(|c| c.name.contains(&only)),
        Err(_) => assert!(cases.len() >= 60, "only {} cases", cases.len()),
    }
    assert!(!cases.is_empty(), "no case matches SLIPWAY_CORPUS");
    // A case whose point is a refusal runs no job by design.
    let refusals: std::collections::HashSet<String> = cases
        .iter()
        .filter(|c| c.spec["error"].is_string())
        .map(|c| c.name.clone())
        .collect();
    // Two at a time: the peer's start-up is mostly one core's work.
    let queue = Arc::new(Mutex::new(cases));
    let results = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (queue, results, slipway) = (queue.clone(), results.clone(), slipway.clone());
            std::thread::spawn(move || {
                loop {
                    let Some(case) = queue.lock().unwrap().pop() else {
                        break;
                    };
                    let r = peer::compare(&slipway, &case);
                    results.lock().unwrap().push((case.name.clone(), r));
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let mut results = std::mem::take(&mut *results.lock().unwrap());
    results.sort_by(|a, b| a.0.cmp(&b.0));
    let mut bad = Vec::new();
    for (name, r) in &results {
        match r {
            Err(e) => bad.push(format!("{name}: {e}")),
            Ok(c) if !c.agrees() => bad.push(format!(
                "{name}:\n  {}\n--- slipway\n{}\n--- gitlab-ci-local\n{}",
                c.disagreements().join("\n  "),
                c.ours.log,
                c.peer.log
            )),
            // A case where nothing ran proves little (unless that is its point).
            Ok(c)
                if c.ours.jobs.is_empty()
                    && !c.case.contains("workflow-filtered")
                    && !refusals.contains(name) =>
            {
                bad.push(format!("{name}: no job ran\n{}", c.ours.log))
            }
            Ok(_) => {}
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {} cases disagree:\n\n{}",
        bad.len(),
        results.len(),
        bad.join("\n\n")
    );
}
