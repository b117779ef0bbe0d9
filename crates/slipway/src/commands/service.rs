//! Service commands, as GitLab Runner's: `install` writes and enables a systemd unit that runs
//! `slipway run` (or prints it where systemd does not run), `start`, `stop` (a drain: SIGQUIT),
//! `status` and `uninstall`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};

/// Where `install` writes units (the administrator's directory, above packaged units).
const UNIT_DIR: &str = "/etc/systemd/system";
/// What a unit gives the manager past `shutdown_timeout` to report jobs and remove instances.
const STOP_MARGIN: Duration = Duration::from_secs(300);

/// What `slipway install` takes.
#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    /// The service's name (`NAME.service`).
    #[arg(long, default_value = "slipway")]
    pub service: String,
    /// The user the manager runs as (default: the one running this command).
    #[arg(long)]
    pub user: Option<String>,
    /// config.toml the service runs with.
    #[arg(short, long, default_value = "/etc/slipway/config.toml")]
    pub config: PathBuf,
    /// The manager's working directory (default: the user's home).
    #[arg(long)]
    pub working_directory: Option<PathBuf>,
    /// Print the unit instead of installing it.
    #[arg(long)]
    pub print: bool,
}

/// What `start`, `stop`, `status` and `uninstall` take.
#[derive(Debug, clap::Args)]
pub struct ServiceArgs {
    /// The service's name (`NAME.service`).
    #[arg(long, default_value = "slipway")]
    pub service: String,
}

/// A systemd unit running `slipway run`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    /// The `slipway` binary.
    pub exe: PathBuf,
    /// The user it runs as.
    pub user: String,
    /// Its config.toml.
    pub config: PathBuf,
    /// Its working directory.
    pub working_directory: PathBuf,
    /// How long `systemctl stop` waits for the drain before killing.
    pub stop_timeout: Duration,
}

impl Unit {
    /// The unit the Debian package ships (`/lib/systemd/system/slipway.service`).
    #[cfg(test)]
    pub fn packaged() -> Unit {
        Unit {
            exe: "/usr/bin/slipway".into(),
            // root, as GitLab Runner's service: jobs on the host run as `slipway`.
            user: "root".into(),
            config: "/etc/slipway/config.toml".into(),
            working_directory: "/var/lib/slipway".into(),
            stop_timeout: Duration::from_secs(30) + STOP_MARGIN,
        }
    }

    /// The unit file's text.
    pub fn render(&self) -> String {
        format!(
            "\
# Slipway's manager as a service: `slipway install` writes this unit, `slipway uninstall`
# removes it. `systemctl stop` drains the manager (SIGQUIT): it takes no new jobs and the
# running ones finish, within shutdown_timeout, before it stops.
[Unit]
Description=Slipway CI job runner
After=network-online.target docker.service
Wants=network-online.target

[Service]
Type=simple
User={user}
WorkingDirectory={wd}
ExecStart={exe} run --config {config}
KillSignal=SIGQUIT
# The drain signal goes to the manager only; its plugins stop when it says so.
KillMode=mixed
TimeoutStopSec={stop}
# A drained manager exits 0 and stays stopped; a crash restarts it.
Restart=on-failure
RestartSec=5

[Install]
WantedBy=multi-user.target
",
            user = self.user,
            wd = self.working_directory.display(),
            exe = self.exe.display(),
            config = self.config.display(),
            stop = self.stop_timeout.as_secs(),
        )
    }
}

/// Refuse what a unit line cannot hold unquoted (whitespace, quotes, `%` specifiers, `\`).
fn plain(flag: &str, value: &str) -> anyhow::Result<()> {
    if value.is_empty()
        || value
            .chars()
            .any(|c| c.is_whitespace() || matches!(c, '"' | '\'' | '%' | '\\' | ';'))
    {
        bail!(
            "{flag}: {value:?} cannot go into a systemd unit: expected no spaces, quotes, \
             '%', '\\' or ';'"
        );
    }
    Ok(())
}

/// `path` made absolute against the current directory.
fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("resolving {}", path.display()))
}

/// Whether systemd manages this machine (`sd_booted`: `/run/systemd/system` exists).
fn systemd_runs() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

fn no_systemd(what: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "cannot {what}: systemd is not running on this machine (no /run/systemd/system); run \
         `slipway run -c CONFIG` under your own supervisor, and send it SIGQUIT to drain it"
    )
}

/// A service name: what systemd accepts in a unit name, and no path.
fn service_name(name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'));
    if !ok {
        bail!("--service: {name:?}: expected letters, digits, '-', '_', '.' or '@'");
    }
    Ok(())
}

/// The passwd entry of `user`, or of this process's user (NSS lookups block: off the runtime).
async fn passwd_entry(user: Option<String>) -> anyhow::Result<nix::unistd::User> {
    tokio::task::spawn_blocking(move || match user {
        Some(u) => nix::unistd::User::from_name(&u)
            .with_context(|| format!("--user: looking up {u:?}"))?
            .with_context(|| format!("--user: no user {u:?} on this machine")),
        None => nix::unistd::User::from_uid(nix::unistd::geteuid())
            .ok()
            .flatten()
            .context("this process's user has no passwd entry: give --user"),
    })
    .await
    .context("looking up the user")?
}

/// The unit `args` describe, checked.
async fn unit_of(args: &InstallArgs) -> anyhow::Result<Unit> {
    service_name(&args.service)?;
    let entry = passwd_entry(args.user.clone()).await?;
    let user = entry.name.clone();
    plain("--user", &user)?;
    let config = absolute(&args.config)?;
    plain("--config", &config.display().to_string())?;
    let working_directory = match &args.working_directory {
        Some(d) => absolute(d)?,
        None => entry.dir,
    };
    plain(
        "--working-directory",
        &working_directory.display().to_string(),
    )?;
    let exe = std::env::current_exe().context("locating this binary")?;
    plain("the slipway binary's path", &exe.display().to_string())?;
    // The drain may take shutdown_timeout; the config may not exist yet (`register` makes it).
    let shutdown = match slipway_config::load(&config).await {
        Ok(loaded) => Duration::from_secs(loaded.config.shutdown_timeout),
        Err(e) => {
            eprintln!(
                "warning: {e}\nwarning: the service will not start until {} is a valid \
                 config (`slipway register -c {}` makes one)",
                config.display(),
                config.display()
            );
            Duration::from_secs(30)
        }
    };
    Ok(Unit {
        exe,
        user,
        config,
        working_directory,
        stop_timeout: shutdown + STOP_MARGIN,
    })
}

/// `slipway install`.
pub async fn install(args: InstallArgs) -> anyhow::Result<ExitCode> {
    let unit = unit_of(&args).await?;
    let text = unit.render();
    if args.print || !systemd_runs() {
        if !args.print {
            eprintln!(
                "systemd is not running on this machine: here is the unit; on a systemd host \
                 it goes to {UNIT_DIR}/{}.service",
                args.service
            );
        }
        print!("{text}");
        return Ok(ExitCode::SUCCESS);
    }
    let path = Path::new(UNIT_DIR).join(unit_name(&args.service));
    if tokio::fs::try_exists(&path).await.unwrap_or(false) {
        bail!(
            "{} exists: `slipway uninstall --service {}` first",
            path.display(),
            args.service
        );
    }
    // A unit of this name elsewhere (the package's, in /lib/systemd/system) would be shadowed
    // while it keeps running as it was: change that one instead.
    let shown = properties(&unit_name(&args.service), "FragmentPath").await?;
    let fragment = shown.get("FragmentPath");
    if !fragment.is_empty() {
        bail!(
            "{}.service is already installed at {fragment}: change it with `systemctl edit {}` \
             (e.g. [Service] User=root), or give another --service",
            args.service,
            args.service
        );
    }
    let tmp = path.with_extension("service.tmp");
    if let Err(e) = tokio::fs::write(&tmp, &text).await {
        let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
            " (installing a service needs root)"
        } else {
            ""
        };
        bail!("writing {}: {e}{hint}", tmp.display());
    }
    if let Err(e) = tokio::fs::rename(&tmp, &path).await {
        let _ = tokio::fs::remove_file(&tmp).await;
        bail!("renaming {} to {}: {e}", tmp.display(), path.display());
    }
    systemctl(&["daemon-reload"]).await?;
    systemctl(&["enable", &unit_name(&args.service)]).await?;
    println!(
        "installed and enabled {} (runs as {} with {}); start it with `slipway start`",
        path.display(),
        unit.user,
        unit.config.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `slipway start`.
pub async fn start(args: ServiceArgs) -> anyhow::Result<ExitCode> {
    let unit = service_unit(&args, "start the service")?;
    systemctl(&["start", &unit]).await?;
    println!("{}: started", args.service);
    Ok(ExitCode::SUCCESS)
}

/// `slipway stop`: a drain (the unit's stop signal is SIGQUIT).
pub async fn stop(args: ServiceArgs) -> anyhow::Result<ExitCode> {
    let unit = service_unit(&args, "stop the service")?;
    println!(
        "{}: draining (no new jobs; running jobs finish within shutdown_timeout)",
        args.service
    );
    systemctl(&["stop", &unit]).await?;
    println!("{}: stopped", args.service);
    Ok(ExitCode::SUCCESS)
}

/// `slipway status`: exit 0 when the service runs, 1 otherwise.
pub async fn status(args: ServiceArgs) -> anyhow::Result<ExitCode> {
    let unit = service_unit(&args, "read the service's status")?;
    let shown = properties(&unit, "LoadState,ActiveState,SubState,MainPID").await?;
    let prop = |k: &str| shown.get(k);
    let name = &args.service;
    if prop("LoadState") == "not-found" {
        println!("{name}: not installed (`slipway install` installs it)");
        return Ok(ExitCode::FAILURE);
    }
    match prop("ActiveState") {
        "active" => {
            println!("{name}: Service is running (pid {})", prop("MainPID"));
            Ok(ExitCode::SUCCESS)
        }
        "deactivating" => {
            println!("{name}: Service is draining (pid {})", prop("MainPID"));
            Ok(ExitCode::FAILURE)
        }
        state => {
            println!(
                "{name}: Service is not running ({state}, {})",
                prop("SubState")
            );
            Ok(ExitCode::FAILURE)
        }
    }
}

/// `slipway uninstall`: drain and stop the service, disable it, remove the unit `install` wrote.
pub async fn uninstall(args: ServiceArgs) -> anyhow::Result<ExitCode> {
    let unit = service_unit(&args, "uninstall the service")?;
    let path = Path::new(UNIT_DIR).join(&unit);
    if !tokio::fs::try_exists(&path).await.unwrap_or(false) {
        bail!(
            "{} does not exist: the service was not installed by `slipway install` (a packaged \
             unit goes with the package: apt-get remove slipway)",
            path.display()
        );
    }
    systemctl(&["stop", &unit]).await?;
    systemctl(&["disable", &unit]).await?;
    tokio::fs::remove_file(&path)
        .await
        .with_context(|| format!("removing {}", path.display()))?;
    systemctl(&["daemon-reload"]).await?;
    println!("{}: stopped, disabled and removed", args.service);
    Ok(ExitCode::SUCCESS)
}

fn unit_name(service: &str) -> String {
    format!("{service}.service")
}

/// The unit `args` name, once its name is checked and systemd is known to run (`what`: for the
/// message when it does not).
fn service_unit(args: &ServiceArgs, what: &str) -> anyhow::Result<String> {
    service_name(&args.service)?;
    if !systemd_runs() {
        return Err(no_systemd(what));
    }
    Ok(unit_name(&args.service))
}

/// `systemctl show UNIT --property=PROPS`, as `key=value` lines.
struct Properties(String);

impl Properties {
    /// The value of `key` ("" when absent).
    fn get(&self, key: &str) -> &str {
        self.0
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or("")
    }
}

async fn properties(unit: &str, props: &str) -> anyhow::Result<Properties> {
    let out = systemctl(&["show", unit, &format!("--property={props}")]).await?;
    Ok(Properties(out))
}

/// Run `systemctl ARGS`; its stdout, or an error with its stderr.
async fn systemctl(args: &[&str]) -> anyhow::Result<String> {
    let out = tokio::process::Command::new("systemctl")
        .args(args)
        .output()
        .await
        .context("running systemctl")?;
    if !out.status.success() {
        bail!(
            "systemctl {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The unit the package ships is the one `slipway install` writes for its defaults.
    #[test]
    fn the_packaged_unit_is_the_rendered_default() {
        let shipped = include_str!("../../../../packaging/slipway.service");
        assert_eq!(shipped, Unit::packaged().render());
    }

    #[test]
    fn the_unit_drains_the_manager_alone_and_waits_for_it() {
        let text = Unit::packaged().render();
        for line in [
            "ExecStart=/usr/bin/slipway run --config /etc/slipway/config.toml",
            "User=root",
            "WorkingDirectory=/var/lib/slipway",
            "KillSignal=SIGQUIT",
            "KillMode=mixed",
            "TimeoutStopSec=330",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
    }

    #[test]
    fn values_a_unit_cannot_hold_are_refused_naming_the_flag() {
        for bad in ["a b", "x%i", "it's", ""] {
            let e = plain("--user", bad).unwrap_err().to_string();
            assert!(e.starts_with("--user: "), "{e}");
        }
        plain("--config", "/etc/slipway/config.toml").unwrap();
        for bad in ["../x", "a/b", "", "a b"] {
            let e = service_name(bad).unwrap_err().to_string();
            assert!(e.starts_with("--service: "), "{e}");
        }
        service_name("slipway-2@x.y_z").unwrap();
    }
}
