//! What instances dying under jobs cost: a pipeline of [`JOBS`] jobs through `slipway exec` on
//! the local plugin while the bench kills instances behind the manager's back (every process of
//! one, as a cloud deleting it would), [`KILLS`] times, one every [`KILL_EVERY`]. Each job first
//! runs the runner's `pre_get_sources_script` (2 s, where the job runs), then its script (2 s):
//! a kill lands before some jobs' scripts and in others'.
//!
//! Counted from the jobs' own lines: jobs that ran again on another instance and succeeded
//! (`retried_transparently`), jobs failed by reason (`failed_by_reason`: a job killed in its
//! script must be `runner_system_failure`, never `script_failure`), and the run's wall time
//! against the same pipeline without kills in the same run (`wall_over_baseline`).
//!
//! Spot capacity: `fleeting-plugin-aws` on moto, a spot group whose every scale-up the fault
//! proxy refuses (`InsufficientInstanceCapacity`) with an on-demand fallback; `fallback_after_s`
//! is the time from the first refusal until a waiting job holds a slot on the fallback.
//!
//! A rolling upgrade ([`upgrade`]): a second manager started beside the first on one static
//! pool while the first runs jobs, the first drained: `killed_by_upgrade` counts the first
//! manager's jobs that did not succeed, `removed_by_non_owner` the first manager's hosts given
//! back or taken while it ran (and hosts the second removed for want of a record).
//!
//! Writes `bench/results/faults.json`; regenerate with `cargo bench -p slipway --bench faults`.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

mod support;
#[path = "faults/upgrade.rs"]
mod upgrade;

const JOBS: usize = 40;
const KILLS: usize = 10;
const KILL_EVERY: Duration = Duration::from_millis(1500);
const COMMAND: &str = "cargo bench -p slipway --bench faults";

/// What one run of the pipeline came to.
#[derive(Debug, Default)]
struct Run {
    wall_s: f64,
    kills: usize,
    succeeded: usize,
    retried_transparently: usize,
    retried_then_failed: usize,
    failed_by_reason: BTreeMap<String, usize>,
    tries: usize,
}

fn main() -> anyhow::Result<()> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let plugins = support::build_plugins(
        &repo,
        &[
            "fleeting-plugin-local",
            "fleeting-plugin-aws",
            "fleeting-plugin-static",
        ],
    )?;
    let spot = tokio::runtime::Runtime::new()?.block_on(spot_fallback(&plugins))?;
    println!("spot: {spot:?}");
    let upgraded = upgrade::run(&plugins)?;
    println!("upgrade: {upgraded:?}");
    let baseline = run(&plugins, false)?;
    let faults = run(&plugins, true)?;
    if baseline.succeeded != JOBS {
        bail!("the pipeline without kills did not pass: {baseline:?}");
    }
    println!("baseline: {baseline:?}\nwith kills: {faults:?}");
    let results = serde_json::json!({
        "jobs": JOBS,
        "kills": faults.kills,
        "kill_every_s": KILL_EVERY.as_secs_f64(),
        "retried_transparently": faults.retried_transparently,
        "retried_then_failed": faults.retried_then_failed,
        "failed_by_reason": faults.failed_by_reason,
        "succeeded": faults.succeeded,
        "tries": faults.tries,
        "script_failures": faults.failed_by_reason.get("script_failure").copied().unwrap_or(0),
        "wall_s": round(faults.wall_s),
        "baseline_wall_s": round(baseline.wall_s),
        "wall_over_baseline": round(faults.wall_s / baseline.wall_s),
        "setup": format!(
            "slipway exec, local plugin (capacity_per_instance 2, max_instances 4, start_attempts 3), \
             {JOBS} jobs in one stage: pre_get_sources_script `sleep 2`, script `echo go; sleep 2`; \
             {KILLS} kills (pkill -KILL of every process of a random live instance), one every {:.1} s",
            KILL_EVERY.as_secs_f64()
        ),
        "goal": "script_failures = 0: a job whose instance dies is never the script's failure; jobs killed before their script run again without failing",
        "fallback_after_s": round(spot.fallback_after_s),
        "fallback_after_setting_s": SPOT_FALLBACK_AFTER.as_secs_f64(),
        "capacity_refusals_before_fallback": spot.refusals,
        "spot_setup": format!(
            "fleeting-plugin-aws on moto: a spot group behind a fault proxy refusing every \
             SetDesiredCapacity with InsufficientInstanceCapacity, fallback_after {}s, an on-demand \
             fallback group; one job reserved on spot, timed from the first refusal to its slot on \
             the fallback",
            SPOT_FALLBACK_AFTER.as_secs()
        ),
        "killed_by_upgrade": upgraded.killed_by_upgrade,
        "removed_by_non_owner": upgraded.removed_by_non_owner,
        "upgrade_later_jobs_on_adopted_hosts": upgraded.later_on_adopted_hosts,
        "upgrade_takeover_s": round(upgraded.takeover_s),
        "upgrade_setup": format!(
            "slipway run twice on one static pool of 4 real sshd hosts (2 slots each), same \
             config and state: the second started while the first ran {} jobs (sleep 8), {} more \
             submitted, the first drained with SIGQUIT; takeover: from its exit to the last later \
             job's end",
            upgrade::FIRST,
            upgrade::LATER
        ),
    });
    let (path, text) = slipway_testkit::bench::write(&repo, "faults", COMMAND, results)?;
    println!("{}\n{text}", path.display());
    Ok(())
}

/// `fallback_after` of the spot shape in the spot phase.
const SPOT_FALLBACK_AFTER: Duration = Duration::from_secs(10);

/// What the spot phase came to.
#[derive(Debug)]
struct Spot {
    fallback_after_s: f64,
    refusals: u64,
}

/// One job on a spot shape without capacity, until it holds a slot on the fallback.
async fn spot_fallback(plugins: &Path) -> anyhow::Result<Spot> {
    use slipway_fleeting::{PluginHost, PluginOptions};
    use slipway_taskscaler::{Config, Fallback, Placement, Policy, Shape, Taskscaler};
    use slipway_testkit::aws_faults::{FaultKind, FaultProxy};
    use slipway_testkit::moto::{Moto, REGION};

    let dir = tempfile::tempdir()?;
    let moto = Moto::start(dir.path()).await?;
    moto.create_groups(&["spot", "on-demand"], 4).await?;
    let proxy = FaultProxy::start(&moto.url).await?;
    proxy.fail("SetDesiredCapacity", FaultKind::NoCapacity, None);
    let start = |name: &'static str, endpoint: String| async move {
        let mut opts = PluginOptions::new("aws", plugins.join("fleeting-plugin-aws"))
            .plugin_config(serde_json::json!({ "name": name, "region": REGION }).to_string());
        for (k, v) in Moto::env_for(&endpoint) {
            opts = opts.env(&k, &v);
        }
        let host = std::sync::Arc::new(PluginHost::start(opts).await?);
        let info = host.init_from_options().await?;
        anyhow::Ok((host, info))
    };
    let (spot_host, spot_info) = start("spot", proxy.url.clone()).await?;
    let (od_host, od_info) = start("on-demand", moto.url.clone()).await?;
    let cfg = Config {
        capacity_per_instance: 1,
        max_instances: 4,
        policies: vec![Policy {
            idle_time: Duration::from_secs(600),
            ..Policy::default()
        }],
        instance_acquire_timeout: Duration::from_secs(120),
        delete_instances_on_shutdown: true,
        shutdown_deletion_interval: Duration::from_millis(500),
        ..Config::default()
    };
    let placement = Placement::new(vec![
        Shape {
            name: "spot".into(),
            scaler: Taskscaler::start(
                spot_host.clone(),
                spot_info,
                Config {
                    instance_cost: 0.3,
                    ..cfg.clone()
                },
            )?,
        },
        Shape {
            name: "on-demand".into(),
            scaler: Taskscaler::start(od_host.clone(), od_info, cfg)?,
        },
    ])
    .with_spot(0)
    .with_fallback(
        0,
        Fallback {
            to: 1,
            after: SPOT_FALLBACK_AFTER,
            return_after: Duration::from_secs(600),
        },
    );
    let job = slipway_taskscaler::Resources::default();
    placement.reserve("job", &job)?;
    let acquired = placement.acquire("job").await;
    let refusals = placement.shapes()[0].scaler.capacity_refusals();
    let result = match (&acquired, refusals.first) {
        (Ok(_), Some(first))
            if placement
                .shape_of("job")
                .is_some_and(|s| s.name == "on-demand") =>
        {
            Ok(Spot {
                fallback_after_s: first.elapsed().as_secs_f64(),
                refusals: refusals.count,
            })
        }
        _ => Err(anyhow::anyhow!(
            "the job did not move to the fallback: {acquired:?}, {refusals:?}"
        )),
    };
    placement.release("job");
    placement.shutdown().await;
    spot_host.stop().await;
    od_host.stop().await;
    moto.stop().await;
    result
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn config(run_dir: &Path) -> String {
    format!(
        r#"
concurrent = 8
[[runners]]
  name = "faults"
  executor = "instance"
  pre_get_sources_script = "sleep 2"
  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = 2
    max_instances = 4
    start_attempts = 3
    update_interval = "1s"
    update_interval_when_expecting = "100ms"
    delete_instances_on_shutdown = true
    [runners.autoscaler.plugin_config]
      dir = "{}"
    [[runners.autoscaler.policy]]
      idle_count = 0
      idle_time = "1m"
"#,
        run_dir.join("plugin-state").display()
    )
}

fn pipeline() -> String {
    let mut p = String::from("stages: [work]\n");
    for i in 0..JOBS {
        p.push_str(&format!(
            "job{i:02}:\n  stage: work\n  script:\n    - echo go\n    - sleep 2\n"
        ));
    }
    p
}

/// One run of the pipeline, with kills when `kill` is set.
fn run(plugins: &Path, kill: bool) -> anyhow::Result<Run> {
    let run_dir = tempfile::Builder::new()
        .prefix("slipway-faults-")
        .tempdir()?;
    let dir = run_dir.path();
    std::fs::write(dir.join("config.toml"), config(dir))?;
    std::fs::write(dir.join("pipeline.yml"), pipeline())?;
    std::fs::create_dir_all(dir.join("tmp"))?;
    let t0 = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_slipway"))
        .arg("exec")
        .arg("-c")
        .arg(dir.join("config.toml"))
        .arg(dir.join("pipeline.yml"))
        .current_dir(dir)
        .env("TMPDIR", dir.join("tmp"))
        .env("SLIPWAY_PLUGIN_DIR", plugins)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting slipway exec")?;
    let stdout = child.stdout.take().context("no stdout")?;
    let lines = Arc::new(Mutex::new(Vec::new()));
    let reader = {
        let lines = lines.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                lines.lock().unwrap_or_else(|p| p.into_inner()).push(l);
            }
        })
    };
    let done = Arc::new(AtomicBool::new(false));
    let killer = kill.then(|| {
        let (done, instances) = (done.clone(), dir.join("plugin-state/instances"));
        std::thread::spawn(move || killer(&instances, &done))
    });
    let status = child.wait()?;
    let wall_s = t0.elapsed().as_secs_f64();
    done.store(true, Ordering::SeqCst);
    let kills = killer
        .map(|k| k.join().unwrap_or_default())
        .unwrap_or_default();
    let _ = reader.join();
    let lines = lines.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut out = Run {
        wall_s,
        kills,
        ..Run::default()
    };
    for i in 0..JOBS {
        let prefix = format!("[job{i:02}] ");
        let mine: Vec<&str> = lines
            .iter()
            .filter_map(|l| l.strip_prefix(&prefix))
            .collect();
        let retried = mine.iter().any(|l| l.contains("trying it again"));
        out.tries += mine
            .iter()
            .filter(|l| l.starts_with("Running on instance"))
            .count();
        if mine.contains(&"Job succeeded") {
            out.succeeded += 1;
            if retried {
                out.retried_transparently += 1;
            }
        } else {
            let reason = mine
                .iter()
                .find_map(|l| l.strip_prefix("Job failed ("))
                .and_then(|r| r.strip_suffix(')'))
                .unwrap_or("no ending line");
            *out.failed_by_reason.entry(reason.to_string()).or_default() += 1;
            if retried {
                out.retried_then_failed += 1;
            }
        }
    }
    if !kill && !status.success() {
        bail!("the pipeline without kills failed:\n{}", lines.join("\n"));
    }
    Ok(out)
}

/// Until `done`: every [`KILL_EVERY`], SIGKILL every process of one live instance under
/// `instances` (picked by a fixed sequence, so runs are comparable); the number of kills.
fn killer(instances: &Path, done: &AtomicBool) -> usize {
    let mut kills = 0;
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    while kills < KILLS && !done.load(Ordering::SeqCst) {
        std::thread::sleep(KILL_EVERY);
        let mut live: Vec<PathBuf> = std::fs::read_dir(instances)
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        live.sort();
        live.retain(|p| {
            Command::new("pgrep")
                .args(["-f", &format!("{}/", p.display())])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
        if live.is_empty() {
            continue;
        }
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let victim = &live[(seed % live.len() as u64) as usize];
        let killed = Command::new("pkill")
            .args(["-KILL", "-f", &format!("{}/", victim.display())])
            .status()
            .is_ok_and(|s| s.success());
        if killed {
            kills += 1;
        }
    }
    kills
}
