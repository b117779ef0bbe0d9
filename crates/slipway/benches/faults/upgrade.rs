//! The upgrade phase of the faults bench: two `slipway run` managers on one static pool of
//! real sshd hosts, the second started while the first runs [`FIRST`] jobs, the first then
//! drained with SIGQUIT; [`LATER`] jobs submitted meanwhile run on the second.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::support::slipway;
use slipway_job::JobStatus;
use slipway_manager::source::queue::spool::{JobState, Queue};

/// Hosts in the pool (two slots each).
const HOSTS: usize = 4;
/// Jobs running on the first manager when the second starts.
pub const FIRST: usize = 8;
/// Jobs submitted while both run.
pub const LATER: usize = 4;

/// What the upgrade came to.
#[derive(Debug, Default)]
pub struct Upgrade {
    /// Jobs of the first manager that did not succeed.
    pub killed_by_upgrade: usize,
    /// The first manager's hosts given back or taken while it ran, plus hosts the second
    /// removed "for safety" (it had no record of them).
    pub removed_by_non_owner: usize,
    /// Jobs that ran on a host the second manager adopted from the first.
    pub later_on_adopted_hosts: usize,
    /// From the first manager's exit to the last later job's end.
    pub takeover_s: f64,
}

fn pipeline(prefix: &str, n: usize, secs: u32) -> String {
    let mut p = String::from("stages: [test]\n");
    for i in 1..=n {
        p.push_str(&format!(
            "{prefix}-{i}:\n  script: [\"echo begin\", \"sleep {secs}\", \"echo end\"]\n"
        ));
    }
    p
}

fn submit(dir: &Path, plugins: &Path, name: &str, text: &str) -> anyhow::Result<Vec<u64>> {
    std::fs::write(dir.join(name), text)?;
    let out = slipway(dir, plugins, &["submit", "-c", "config.toml", name]).output()?;
    if !out.status.success() {
        bail!("slipway submit: {}", String::from_utf8_lossy(&out.stderr));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| Ok(l.split('\t').next().unwrap_or_default().parse()?))
        .collect()
}

fn manager(dir: &Path, plugins: &Path, log: &str) -> anyhow::Result<Child> {
    let log = std::fs::File::create(dir.join(log))?;
    Ok(slipway(dir, plugins, &["run", "-c", "config.toml"])
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()?)
}

fn leases(dir: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(dir.join("static-state/state.json"))?;
    let v: serde_json::Value = serde_json::from_str(&text)?;
    Ok(v["leases"]
        .as_object()
        .context("no leases")?
        .iter()
        .map(|(id, l)| {
            (
                id.clone(),
                l["state"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect())
}

fn wait(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    while !cond() {
        if Instant::now() > deadline {
            bail!("{what}: not within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

fn signal(child: &Child, sig: &str) -> anyhow::Result<()> {
    let st = Command::new("kill")
        .args([format!("-{sig}"), child.id().to_string()])
        .status()?;
    if !st.success() {
        bail!("kill -{sig} {} failed", child.id());
    }
    Ok(())
}

/// Run the upgrade on a fresh pool; `plugins` holds `fleeting-plugin-static`.
pub fn run(plugins: &Path) -> anyhow::Result<Upgrade> {
    let rt = tokio::runtime::Runtime::new()?;
    let hosts = rt.block_on(async {
        let mut hosts = Vec::new();
        for _ in 0..HOSTS {
            hosts.push(slipway_testkit::Sshd::start().await?);
        }
        anyhow::Ok(hosts)
    })?;
    let run_dir = tempfile::Builder::new()
        .prefix("slipway-upgrade-")
        .tempdir()?;
    let dir = run_dir.path();
    std::fs::create_dir_all(dir.join("tmp"))?;
    let user = hosts[0].info()?.connector.username;
    let mut text = format!(
        "concurrent = 16\nshutdown_timeout = 120\n[[runners]]\n  name = \"pool\"\n  \
         executor = \"instance\"\n  builds_dir = \"{}\"\n  [runners.autoscaler]\n    \
         plugin = \"static\"\n    capacity_per_instance = 2\n    max_instances = {HOSTS}\n    \
         update_interval = \"1s\"\n    update_interval_when_expecting = \"200ms\"\n    \
         [runners.autoscaler.plugin_config]\n      state_dir = \"{}\"\n",
        dir.join("builds").display(),
        dir.join("static-state").display()
    );
    text.push_str(&slipway_testkit::Sshd::static_hosts(&hosts, &user));
    std::fs::write(dir.join("config.toml"), text)?;
    let queue = Queue::open(dir.join(".slipway-queue"))?;

    let first = submit(dir, plugins, "first.yml", &pipeline("first", FIRST, 8))?;
    let mut old = manager(dir, plugins, "old.log")?;
    let running = || {
        queue.list().map_or(0, |l| {
            l.iter()
                .filter(|e| matches!(e.state, JobState::Running(Some(_))))
                .count()
        })
    };
    wait("the first jobs running", Duration::from_secs(120), || {
        running() == FIRST
    })?;
    let before = leases(dir)?;
    let mut new = manager(dir, plugins, "new.log")?;
    let later = submit(dir, plugins, "later.yml", &pipeline("later", LATER, 1))?;
    std::thread::sleep(Duration::from_secs(2));
    let during = leases(dir)?;
    let mut result = Upgrade {
        removed_by_non_owner: before.iter().filter(|l| !during.contains(l)).count(),
        ..Upgrade::default()
    };
    signal(&old, "QUIT")?;
    old.wait()?;
    let stopped = Instant::now();
    wait("the later jobs done", Duration::from_secs(120), || {
        later
            .iter()
            .all(|id| queue.result(*id).ok().flatten().is_some())
    })?;
    result.takeover_s = stopped.elapsed().as_secs_f64();
    for id in &first {
        let ok = queue
            .result(*id)?
            .is_some_and(|r| r.status == JobStatus::Success);
        result.killed_by_upgrade += usize::from(!ok);
    }
    for id in &later {
        if let Some(r) = queue.result(*id)?
            && r.instance_id
                .is_some_and(|i| before.iter().any(|(l, _)| *l == i))
        {
            result.later_on_adopted_hosts += 1;
        }
    }
    let log = std::fs::read_to_string(dir.join("new.log"))?;
    result.removed_by_non_owner += log.matches("removing it for safety").count();
    signal(&new, "TERM")?;
    new.wait()?;
    drop(hosts);
    Ok(result)
}
