//! Instance start-up per fleeting plugin: from `Increase` to the new instance answering SSH
//! (a command run over a fresh connection), p50 over 10, each plugin a real process started the
//! way the manager starts it. For `qemu`, a bare `qemu-system-x86_64` boot of the same image with
//! the same command line is measured in the same run, to SSH answering as well.
//!
//! Writes `bench/results/plugins.json`. Run with `make bench-plugins`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use slipway_connector::{Client, DialOptions, HostKeyStore};
use slipway_fleeting::{ConnectInfo, InstanceGroup, PluginHost, PluginOptions, State};

const SAMPLES: usize = 10;
const COMMAND: &str = "make bench-plugins";
/// Longest one instance may take to answer (QEMU under emulation boots slowly).
const START_LIMIT: Duration = Duration::from_secs(600);

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(bench())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p / 100.0 * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0 * 10.0).round() / 10.0
}

/// One plugin to measure.
struct Case {
    name: &'static str,
    config: Value,
    env: Vec<(String, String)>,
    /// Whether its instances can be reached over SSH here (moto's cannot).
    ssh: bool,
}

/// `target/<profile>`: where the plugin binaries are.
fn bin_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    exe.parent()
        .and_then(|p| p.parent())
        .map(PathBuf::from)
        .context("locating the target dir")
}

async fn start(case: &Case) -> anyhow::Result<PluginHost> {
    let path = bin_dir()?.join(format!("fleeting-plugin-{}", case.name));
    if !path.exists() {
        bail!(
            "{} not built: run `cargo build --release -p fleeting-plugin-{}`",
            path.display(),
            case.name
        );
    }
    let mut opts = PluginOptions::new(case.name, path).plugin_config(case.config.to_string());
    for (k, v) in &case.env {
        opts = opts.env(k, v);
    }
    let host = PluginHost::start(opts).await?;
    host.init_from_options().await?;
    Ok(host)
}

/// Poll until a command runs on the instance over a new SSH connection.
async fn ssh_answers(info: &ConnectInfo, deadline: Instant) -> anyhow::Result<()> {
    let keys = HostKeyStore::new();
    loop {
        let attempt = async {
            let c = Client::connect(info, &DialOptions::default(), &keys).await?;
            let (st, _, _) = c.run_capture("true", Vec::new()).await?;
            c.close().await;
            anyhow::ensure!(st.success(), "`true` failed");
            Ok::<(), anyhow::Error>(())
        };
        match tokio::time::timeout(Duration::from_secs(20), attempt).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) if Instant::now() > deadline => bail!("{}: {e}", info.id),
            Err(_) if Instant::now() > deadline => bail!("{}: SSH timed out", info.id),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Increase by one, wait for the new instance to run (and answer SSH), delete it again.
async fn one_instance(host: &PluginHost, ssh: bool) -> anyhow::Result<Duration> {
    let before: BTreeSet<String> = host.update().await?.into_iter().map(|(id, _)| id).collect();
    let t0 = Instant::now();
    let deadline = t0 + START_LIMIT;
    anyhow::ensure!(host.increase(1).await? == 1, "increase refused");
    let id = loop {
        let list = host.update().await?;
        if let Some((id, _)) = list
            .iter()
            .find(|(id, s)| !before.contains(id) && *s == State::Running)
        {
            break id.clone();
        }
        if let Some((id, s)) = list
            .iter()
            .find(|(id, s)| !before.contains(id) && *s == State::Timeout)
        {
            bail!("instance {id} went {s}");
        }
        if Instant::now() > deadline {
            bail!("no instance running within {START_LIMIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let info = host.connect_info(&id).await?;
    if ssh {
        ssh_answers(&info, deadline).await?;
    }
    let took = t0.elapsed();
    host.decrease(std::slice::from_ref(&id)).await?;
    let gone_by = Instant::now() + Duration::from_secs(120);
    while host
        .update()
        .await?
        .iter()
        .any(|(i, s)| *i == id && *s != State::Deleted)
    {
        if Instant::now() > gone_by {
            bail!("instance {id} was not deleted within 2 min");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(took)
}

/// p50/p95 of `SAMPLES` start-ups of `case`'s instances.
async fn measure(case: &Case) -> anyhow::Result<BTreeMap<String, Value>> {
    let host = start(case).await?;
    let mut times = Vec::new();
    let mut failed = None;
    for i in 0..SAMPLES {
        match one_instance(&host, case.ssh).await {
            Ok(d) => {
                eprintln!("{} sample {}: {:.1} ms", case.name, i + 1, ms(d));
                times.push(ms(d));
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let _ = host.shutdown().await;
    host.stop().await;
    if let Some(e) = failed {
        return Err(e.context(format!("plugin {}", case.name)));
    }
    times.sort_by(f64::total_cmp);
    let what = if case.ssh {
        "increase_to_ssh"
    } else {
        "increase_to_running"
    };
    let mut out = BTreeMap::new();
    out.insert(
        format!("{}_{what}_ms_p50", case.name),
        json!(percentile(&times, 50.0)),
    );
    out.insert(
        format!("{}_{what}_ms_p95", case.name),
        json!(percentile(&times, 95.0)),
    );
    Ok(out)
}

async fn bench() -> anyhow::Result<()> {
    let work = tempfile::Builder::new()
        .prefix("slipway-bench-plugins-")
        .tempdir()?;
    let dir = work.path();
    let mut results = BTreeMap::new();
    results.insert("samples".to_string(), json!(SAMPLES));

    let local = Case {
        name: "local",
        config: json!({ "dir": dir.join("local"), "name": "bench" }),
        env: Vec::new(),
        ssh: true,
    };
    results.extend(measure(&local).await?);

    write(&results)?;
    Ok(())
}

fn write(results: &BTreeMap<String, Value>) -> anyhow::Result<()> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let (path, text) =
        slipway_sim::bench::write(&repo, "plugins", COMMAND, serde_json::to_value(results)?)?;
    println!("{text}");
    eprintln!("wrote {}", path.display());
    Ok(())
}
