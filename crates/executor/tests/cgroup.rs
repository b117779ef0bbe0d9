//! The `cgroup` isolation level, each case a real job in a real slot cgroup on this machine:
//! memory, pids and CPU limits hold, and nothing a job started outlives it.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use slipway_cgroups::{Limits, SlotTemplate};
use slipway_executor::cgroup::SlotCgroups;
use slipway_executor::{JobRunner, JobSlot, LocalHost};
use slipway_job::JobResponse;
use slipway_job::{FailureReason, JobOutcome, Trace};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

fn job(id: u64, script: &[&str]) -> JobResponse {
    let json = serde_json::json!({
        "id": id,
        "runner_info": {"timeout": 120},
        "steps": [{"name": "script", "script": script, "timeout": 120, "when": "on_success"}],
    });
    JobResponse::from_json(&json.to_string()).unwrap()
}

/// Slot cgroups under a parent unique to this test.
fn slots(test: &str) -> SlotCgroups {
    SlotCgroups {
        template: SlotTemplate::parse(&format!(
            "slipway-test-{}-{test}/slot-{{slot}}",
            std::process::id()
        ))
        .unwrap(),
        ..SlotCgroups::default()
    }
}

struct Ran {
    outcome: JobOutcome,
    output: String,
}

async fn run(cgroups: &SlotCgroups, slot: u32, limits: Limits, job: &JobResponse) -> Ran {
    let dir = tempfile::tempdir().unwrap();
    let mut runner = JobRunner {
        builds_dir: dir.path().display().to_string(),
        ..JobRunner::default()
    };
    cgroups.apply(&mut runner, "local", slot, &limits).unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut trace = Trace::new(Vec::<String>::new(), tx);
    let result = runner
        .run(
            job,
            &LocalHost::default(),
            JobSlot {
                cgroup: None,
                slot,
                trace: &mut trace,
                cancel: CancellationToken::new(),
                abort: None,
                artifacts_in: Vec::new(),
                scratch_dir: None,
                max_collected: None,
                sources: None,
                data: None,
            },
        )
        .await;
    trace.finish();
    drop(trace);
    let mut output = Vec::new();
    while let Some(chunk) = rx.recv().await {
        output.extend(chunk);
    }
    Ran {
        outcome: result.outcome,
        output: String::from_utf8_lossy(&output).into_owned(),
    }
}

fn limits(cpu: Option<f64>, memory_mib: Option<u64>, pids: Option<u64>) -> Limits {
    Limits {
        cpu,
        memory_bytes: memory_mib.map(|m| m << 20),
        pids,
    }
}

fn alive(marker: &str) -> bool {
    std::process::Command::new("pgrep")
        .args(["-f", marker])
        .status()
        .unwrap()
        .success()
}

/// The test's slot cgroup is gone from every hierarchy after its jobs; removes the (empty)
/// test parent too.
fn parent_gone(test: &str) -> bool {
    let name = format!("slipway-test-{}-{test}", std::process::id());
    let mounts: Vec<std::path::PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .filter_map(Result::ok)
        .map(|m| m.path())
        .collect();
    let gone = mounts
        .iter()
        .all(|m| !m.join(&name).join("slot-0").exists() && !m.join(&name).join("slot-1").exists());
    for m in &mounts {
        let _ = std::fs::remove_dir(m.join(&name));
    }
    gone
}

#[tokio::test]
async fn a_memory_hog_is_oom_killed_while_its_neighbour_finishes() {
    let cg = slots("oom");
    let hog = job(1, &["echo hogging", "tail /dev/zero"]);
    let neighbour = job(
        2,
        &[
            "python3 -c 'b = bytearray(24 << 20); import time; time.sleep(2); print(\"neighbour done\", len(b))'",
        ],
    );
    let (hogged, fine) = tokio::join!(
        run(&cg, 0, limits(None, Some(64), Some(64)), &hog),
        run(&cg, 1, limits(None, Some(256), Some(64)), &neighbour),
    );
    match &hogged.outcome {
        JobOutcome::Failed {
            reason, message, ..
        } => {
            assert_eq!(*reason, FailureReason::ScriptFailure, "{}", hogged.output);
            assert!(
                message.contains("OOM-killed") && message.contains("64 MiB"),
                "{message}"
            );
        }
        other => panic!("the hog was not stopped: {other:?}\n{}", hogged.output),
    }
    assert!(
        hogged.output.contains("the job was OOM-killed"),
        "{}",
        hogged.output
    );
    assert!(fine.outcome.is_success(), "{}", fine.output);
    assert!(
        fine.output.contains("neighbour done 25165824"),
        "{}",
        fine.output
    );
    assert!(parent_gone("oom"));
}

#[tokio::test]
async fn a_fork_bomb_stops_at_pids_max_and_the_slot_stays_usable() {
    let cg = slots("forks");
    let marker = format!("slipway-bomb-{}", std::process::id());
    // Fork until the kernel refuses; children sleep under a marker name (bash would retry a
    // refused fork for minutes, so the bomb is Python's).
    let bomb = job(
        3,
        &[&format!(
            "python3 -c '
import os, sys, time
n = 0
try:
    for _ in range(500):
        if os.fork() == 0:
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 1)
            os.dup2(null, 2)
            os.execvp(\"sleep\", [\"{marker}\", \"300\"])
        n += 1
except OSError as e:
    print(\"refused after\", n, e.strerror)
sys.stdout.flush()
'"
        )],
    );
    let ran = run(&cg, 0, limits(None, None, Some(32)), &bomb).await;
    let forked: usize = ran
        .output
        .lines()
        .find_map(|l| l.strip_prefix("refused after "))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("the bomb was never refused:\n{}", ran.output));
    assert!(forked < 32, "pids.max let {forked} processes start");
    assert!(ran.outcome.is_success(), "{}", ran.output);
    assert!(!alive(&marker), "bomb processes survived the job");
    // The same slot takes the next job normally.
    let after = run(
        &cg,
        0,
        limits(None, None, Some(32)),
        &job(4, &["echo still fine"]),
    )
    .await;
    assert!(after.outcome.is_success(), "{}", after.output);
    assert!(after.output.contains("still fine"));
    assert!(parent_gone("forks"));
}

#[tokio::test]
async fn a_busy_loop_in_a_half_cpu_slot_gets_at_most_half_a_cpu() {
    let cg = slots("cpu");
    // Measure the loop's own CPU time over 5 s of wall time, from inside the job.
    let busy = job(
        5,
        &[
            "( while :; do :; done ) & p=$!",
            "read -r -a a < /proc/$p/stat; t0=$(date +%s%N)",
            "sleep 5",
            "read -r -a b < /proc/$p/stat; t1=$(date +%s%N); kill $p",
            "hz=$(getconf CLK_TCK)",
            "echo \"cpu_ms $(( ((b[13]+b[14]) - (a[13]+a[14])) * 1000 / hz )) wall_ms $(( (t1-t0)/1000000 ))\"",
        ],
    );
    let ran = run(&cg, 0, limits(Some(0.5), None, Some(64)), &busy).await;
    assert!(ran.outcome.is_success(), "{}", ran.output);
    let line = ran
        .output
        .lines()
        .find(|l| l.starts_with("cpu_ms "))
        .unwrap_or_else(|| panic!("{}", ran.output));
    let nums: Vec<f64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let share = nums[0] / nums[1];
    // The quota is a ceiling: on a loaded machine the loop may get less, never more (that the
    // kernel throttles it is checked in slipway-cgroups' own tests).
    assert!(share <= 0.6, "a 0.5-CPU slot gave {share:.2} CPU ({line})");
    assert!(share > 0.05, "the loop hardly ran: {share:.2} CPU ({line})");
    assert!(parent_gone("cpu"));
}

#[tokio::test]
async fn a_setsid_daemon_does_not_outlive_its_job() {
    let cg = slots("daemon");
    let marker = format!("slipway-daemon-{}", std::process::id());
    let daemon = job(
        6,
        &[
            &format!("setsid bash -c 'exec -a {marker} sleep 600' < /dev/null > /dev/null 2>&1 &"),
            "sleep 0.5",
            &format!("pgrep -f {marker} > /dev/null && echo daemon started"),
            "echo \"in $SLIPWAY_CGROUP\"",
        ],
    );
    let ran = run(&cg, 0, limits(None, None, Some(64)), &daemon).await;
    assert!(ran.outcome.is_success(), "{}", ran.output);
    assert!(ran.output.contains("daemon started"), "{}", ran.output);
    assert!(
        ran.output.contains(&format!(
            "in slipway-test-{}-daemon/slot-0",
            std::process::id()
        )),
        "{}",
        ran.output
    );
    // Let a straggler show itself before looking.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!alive(&marker), "the setsid daemon outlived its job");
    assert!(parent_gone("daemon"));
}
