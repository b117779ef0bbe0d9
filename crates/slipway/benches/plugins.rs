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
use slipway_testkit::bench::percentile;

use slipway_testkit::moto::Moto;

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

    // Static hosts: sshd hosts the operator already has, here three kept up by the local plugin.
    let hosts = start(&Case {
        name: "local",
        config: json!({ "dir": dir.join("hosts"), "name": "static-hosts" }),
        env: Vec::new(),
        ssh: true,
    })
    .await?;
    let static_case = static_case(&hosts, dir).await;
    let measured = match static_case {
        Ok(case) => measure(&case).await,
        Err(e) => Err(e),
    };
    let _ = hosts.shutdown().await;
    hosts.stop().await;
    results.extend(measured?);

    // AWS on moto: the API round trips only (moto's instances run nothing, so no SSH).
    let moto = Moto::start(dir).await?;
    moto.create_groups(&["bench-asg"], 20).await?;
    let aws = Case {
        name: "aws",
        config: json!({ "name": "bench-asg", "region": slipway_testkit::moto::REGION }),
        env: moto.env(),
        ssh: false,
    };
    let measured = measure(&aws).await;
    moto.stop().await;
    results.extend(measured?);

    // QEMU VMs, beside a bare qemu-system boot of the same image with the same command line.
    let qemu = qemu::prepare(dir).await?;
    results.extend(measure(&qemu.case).await?);
    let mut bare = Vec::new();
    for i in 0..SAMPLES {
        let d = qemu.bare_boot(i).await?;
        eprintln!("bare qemu sample {}: {:.1} ms", i + 1, ms(d));
        bare.push(ms(d));
    }
    bare.sort_by(f64::total_cmp);
    let bare_p50 = percentile(&bare, 50.0);
    results.insert("qemu_bare_boot_to_ssh_ms_p50".into(), json!(bare_p50));
    results.insert("qemu_accel".into(), json!(qemu.accel.as_str()));
    if let Some(plugin) = results
        .get("qemu_increase_to_ssh_ms_p50")
        .and_then(Value::as_f64)
    {
        results.insert(
            "qemu_plugin_vs_bare_ratio".into(),
            json!((plugin / bare_p50 * 1000.0).round() / 1000.0),
        );
    }

    write(&results)?;
    Ok(())
}

/// The QEMU case: the sshd image (built once into `target/<profile>/slipway-test-images`, as the
/// tests build it) and what a bare boot of it needs.
mod qemu {
    use std::path::{Path, PathBuf};
    use std::time::{Duration, Instant};

    use anyhow::{Context as _, bail};
    use fleeting_plugin_qemu::command::Launch;
    use serde_json::json;
    use slipway_fleeting::{ConnectInfo, ConnectorConfig};
    use slipway_nesting::Accel;
    use slipway_nesting_daemon::image::ImageManifest;

    use super::{Case, START_LIMIT, bin_dir, ssh_answers};

    const IMAGE: &str = "test-vm-sshd";

    /// The case plus the bare-boot baseline's inputs.
    pub struct Qemu {
        pub case: Case,
        pub accel: Accel,
        image_dir: PathBuf,
        manifest: ImageManifest,
        work: PathBuf,
    }

    pub async fn prepare(dir: &Path) -> anyhow::Result<Qemu> {
        let bins = bin_dir()?;
        let images = bins.join("slipway-test-images");
        let image_dir = images.join(IMAGE);
        if !image_dir.join("image.json").exists() {
            let st = tokio::process::Command::new(bins.join("slipway"))
                .args(["image", "build", "--name", IMAGE, "--level", "vm", "--sshd"])
                .arg("--images-dir")
                .arg(&images)
                .arg("--agent")
                .arg(bins.join("slipway-guest-agent"))
                .args(["--cache-dir", "/var/tmp/slipway-debootstrap-cache"])
                .status()
                .await?;
            anyhow::ensure!(st.success(), "slipway image build --sshd failed");
        }
        let manifest: ImageManifest =
            serde_json::from_slice(&tokio::fs::read(image_dir.join("image.json")).await?)?;
        let probe = slipway_nesting_daemon::accel::resolve(
            slipway_nesting::config::AccelChoice::Auto,
            "qemu-system-x86_64",
            Some(&manifest.kernel_path(&image_dir)),
        )
        .await;
        let work = dir.join("qemu");
        let case = Case {
            name: "qemu",
            config: json!({
                "dir": work.join("plugin"),
                "name": "bench",
                "image": image_dir,
                "accel": probe.accel.as_str(),
                "max_size": 1,
            }),
            env: Vec::new(),
            ssh: true,
        };
        Ok(Qemu {
            case,
            accel: probe.accel,
            image_dir,
            manifest,
            work,
        })
    }

    impl Qemu {
        /// Overlay, then `qemu-system-x86_64` in the foreground with the plugin's command line,
        /// until a command runs over SSH; the VM is killed after.
        pub async fn bare_boot(&self, n: usize) -> anyhow::Result<Duration> {
            let plugin_dir = self.work.join("plugin");
            let (key, public) = fleeting_plugin_qemu::key::client_key(&plugin_dir).await?;
            let run_dir = self.work.join(format!("bare-{n}"));
            tokio::fs::create_dir_all(&run_dir).await?;
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let id = format!("bare-{n}");
            let mut launch = Launch::for_image(
                Path::new("qemu-system-x86_64"),
                &self.manifest,
                &self.image_dir,
                &id,
                self.accel,
                None,
                None,
                &public,
                port,
                &run_dir,
            )?;
            launch.daemonize = false;
            let argv = launch.argv()?;
            let t0 = Instant::now();
            let out = tokio::process::Command::new("qemu-img")
                .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
                .arg(self.manifest.disk_path(&self.image_dir))
                .arg(&launch.disk)
                .output()
                .await?;
            anyhow::ensure!(
                out.status.success(),
                "qemu-img create: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let mut child = tokio::process::Command::new(&argv[0])
                .args(&argv[1..])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .context("starting qemu-system-x86_64")?;
            let info = ConnectInfo {
                id: id.clone(),
                connector: ConnectorConfig {
                    os: "linux".into(),
                    arch: "amd64".into(),
                    protocol: "ssh".into(),
                    protocol_port: port,
                    username: "root".into(),
                    key: key.0.clone(),
                    ..ConnectorConfig::default()
                },
                internal_addr: format!("127.0.0.1:{port}"),
                external_addr: String::new(),
                expires: None,
            };
            let answered = tokio::select! {
                r = ssh_answers(&info, t0 + START_LIMIT) => r,
                st = child.wait() => match st {
                    Ok(st) => Err(anyhow::anyhow!("qemu exited first: {st}")),
                    Err(e) => Err(e.into()),
                },
            };
            let took = t0.elapsed();
            let _ = child.kill().await;
            let _ = tokio::fs::remove_dir_all(&run_dir).await;
            match answered {
                Ok(()) => Ok(took),
                Err(e) => bail!("bare boot {n}: {e}"),
            }
        }
    }
}

/// Three hosts from `hosts` (a local plugin) as a static plugin's `instances`.
async fn static_case(hosts: &PluginHost, dir: &std::path::Path) -> anyhow::Result<Case> {
    const N: usize = 3;
    anyhow::ensure!(
        hosts.increase(N as u32).await? == N as u32,
        "local refused hosts"
    );
    let deadline = Instant::now() + START_LIMIT;
    let ids = loop {
        let running: Vec<String> = hosts
            .update()
            .await?
            .into_iter()
            .filter(|(_, s)| *s == State::Running)
            .map(|(id, _)| id)
            .collect();
        if running.len() >= N {
            break running;
        }
        if Instant::now() > deadline {
            bail!("local hosts did not start");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut instances = serde_json::Map::new();
    for (i, id) in ids.iter().enumerate() {
        let info = hosts.connect_info(id).await?;
        let key_path = dir.join(format!("host{i}.key"));
        std::fs::write(&key_path, &info.connector.key)?;
        std::fs::set_permissions(
            &key_path,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )?;
        // The local plugin fills in only the address it has (internal, in a namespace).
        let mut host = json!({ "username": info.connector.username, "key_path": key_path });
        for (key, addr) in [
            ("external_addr", &info.external_addr),
            ("internal_addr", &info.internal_addr),
        ] {
            if !addr.is_empty() {
                host[key] = json!(addr);
            }
        }
        instances.insert(format!("host{i}"), host);
    }
    Ok(Case {
        name: "static",
        config: json!({ "instances": instances, "state_dir": dir.join("static") }),
        env: Vec::new(),
        ssh: true,
    })
}

fn write(results: &BTreeMap<String, Value>) -> anyhow::Result<()> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let (path, text) =
        slipway_testkit::bench::write(&repo, "plugins", COMMAND, serde_json::to_value(results)?)?;
    println!("{text}");
    eprintln!("wrote {}", path.display());
    Ok(())
}
