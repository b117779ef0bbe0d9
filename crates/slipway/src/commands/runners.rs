//! `slipway list`, `unregister` and `verify`: the runners a config.toml names, as GitLab
//! Runner's commands of those names treat them.
//!
//! - `list` prints each runner: name, executor, URL and its token's short form.
//! - `unregister --name N | --all` removes runners from GitLab and from config.toml. As GitLab
//!   Runner does, a runner created in GitLab's UI (a `glrt-` token) loses this manager
//!   (`DELETE /runners/managers`; the runner itself is deleted in the UI), one registered with
//!   a registration token is deleted (`DELETE /runners`).
//! - `verify [--delete]` checks each runner's token (`POST /runners/verify`); with `--delete`,
//!   runners GitLab no longer knows are removed from config.toml.
//!
//! config.toml is edited in place: comments and every other key stay as written.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use slipway_config::{Loaded, RunnerConfig};
use slipway_gitlab::{ClientConfig, GitlabClient, GitlabError, Secret, SystemId};
use slipway_manager::source::gitlab::{serves_gitlab, system_id_path, version_info};

/// `slipway list`.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// config.toml to read.
    #[arg(short, long, default_value = "config.toml")]
    pub config: PathBuf,
}

/// `slipway unregister`.
#[derive(Debug, clap::Args)]
pub struct UnregisterArgs {
    /// config.toml to edit.
    #[arg(short, long, default_value = "config.toml")]
    pub config: PathBuf,
    /// The runner to remove (its `name`).
    #[arg(long, required_unless_present = "all", conflicts_with = "all")]
    pub name: Option<String>,
    /// Every runner of the file.
    #[arg(long, visible_alias = "all-runners")]
    pub all: bool,
}

/// `slipway verify`.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// config.toml to check.
    #[arg(short, long, default_value = "config.toml")]
    pub config: PathBuf,
    /// Remove from config.toml the runners GitLab no longer knows.
    #[arg(long)]
    pub delete: bool,
}

/// Print the configured runners.
pub async fn list(args: ListArgs) -> anyhow::Result<ExitCode> {
    let loaded = slipway_config::load(&args.config).await?;
    println!("Listing configs config={}", args.config.display());
    let rows: Vec<[String; 4]> = loaded
        .config
        .runners
        .iter()
        .map(|r| {
            [
                r.name.clone(),
                r.executor.as_str().to_string(),
                if r.url.trim().is_empty() {
                    "(embedded queue)".into()
                } else {
                    r.url.trim().to_string()
                },
                if r.token.trim().is_empty() {
                    "-".into()
                } else {
                    Secret::new(r.token.trim()).short()
                },
            ]
        })
        .collect();
    crate::commands::exec::print_table(&["NAME", "EXECUTOR", "URL", "TOKEN"], &rows);
    Ok(ExitCode::SUCCESS)
}

/// Remove runners from GitLab, then from config.toml.
pub async fn unregister(args: UnregisterArgs) -> anyhow::Result<ExitCode> {
    let loaded = slipway_config::load(&args.config).await?;
    let chosen: Vec<&RunnerConfig> = loaded
        .config
        .runners
        .iter()
        .filter(|r| args.all || args.name.as_deref() == Some(r.name.as_str()))
        .collect();
    if chosen.is_empty() {
        match &args.name {
            Some(n) => bail!(
                "{}: no runner named {n:?} (it has: {})",
                args.config.display(),
                names(&loaded.config.runners)
            ),
            None => {
                println!("{}: no runners", args.config.display());
                return Ok(ExitCode::SUCCESS);
            }
        }
    }
    let mut removed = Vec::new();
    let mut failed = false;
    for r in chosen {
        if serves_gitlab(r) {
            match unregister_one(r, &args.config, &loaded).await {
                Ok(what) => println!(
                    "Unregistering runner from GitLab succeeded runner={} ({what})",
                    r.name
                ),
                // Already gone from GitLab: it goes from the file too.
                Err(e) if matches!(e.downcast_ref(), Some(GitlabError::Forbidden { .. })) => {
                    println!("runner {} is not known to GitLab any more", r.name);
                }
                Err(e) => {
                    eprintln!("error: unregistering runner {}: {e:#}", r.name);
                    failed = true;
                    continue;
                }
            }
        }
        removed.push((r.name.clone(), r.token.trim().to_string()));
    }
    if !removed.is_empty() {
        remove_runners(&args.config, &removed).await?;
        println!(
            "Removed from {}: {}",
            args.config.display(),
            removed
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Check each runner's token with GitLab; with `delete`, drop the dead ones from the file.
pub async fn verify(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let loaded = slipway_config::load(&args.config).await?;
    let system_id = system_id_of(&args.config, &loaded).await?;
    let mut dead = Vec::new();
    let mut failed = false;
    for r in loaded.config.runners.iter().filter(|r| serves_gitlab(r)) {
        let token = Secret::new(r.token.trim());
        match client_of(r, &args.config)?.verify(&token, &system_id).await {
            Ok(_) => println!("Verifying runner... is valid runner={}", r.name),
            Err(GitlabError::Forbidden { .. }) => {
                println!("Verifying runner... is removed runner={}", r.name);
                dead.push((r.name.clone(), r.token.trim().to_string()));
            }
            Err(e) => {
                eprintln!("error: verifying runner {}: {e}", r.name);
                failed = true;
            }
        }
    }
    if !dead.is_empty() {
        if args.delete {
            remove_runners(&args.config, &dead).await?;
            println!(
                "Removed from {}: {}",
                args.config.display(),
                dead.iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        } else {
            println!(
                "Run with --delete to remove them from {}",
                args.config.display()
            );
            failed = true;
        }
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn names(runners: &[RunnerConfig]) -> String {
    if runners.is_empty() {
        return "none".into();
    }
    runners
        .iter()
        .map(|r| format!("{:?}", r.name))
        .collect::<Vec<_>>()
        .join(", ")
}

fn client_of(r: &RunnerConfig, config: &Path) -> anyhow::Result<GitlabClient> {
    let tls = r.tls_files(Some(&slipway_config::certs_dir(config)));
    GitlabClient::new(ClientConfig::new(r.url.trim(), version_info(&r.executor)).with_tls(tls))
        .with_context(|| format!("runner {}: GitLab client for {}", r.name, r.url.trim()))
}

/// This manager's system id, in the state directory of `loaded` (read from `config`).
async fn system_id_of(config: &Path, loaded: &Loaded) -> anyhow::Result<SystemId> {
    let state = slipway_config::state_dir(config, loaded.config.state_dir.as_deref());
    let path = system_id_path(&state);
    SystemId::load_or_create(&path)
        .await
        .with_context(|| format!("system id {}", path.display()))
}

/// Unregister one runner as GitLab Runner does; what was removed.
async fn unregister_one(
    r: &RunnerConfig,
    config: &Path,
    loaded: &Loaded,
) -> anyhow::Result<&'static str> {
    let token = Secret::new(r.token.trim());
    let client = client_of(r, config)?;
    if token.expose().starts_with("glrt-") {
        let system_id = system_id_of(config, loaded).await?;
        client.unregister_manager(&token, &system_id).await?;
        Ok("this manager removed; delete the runner itself in GitLab's UI")
    } else {
        client.unregister(&token).await?;
        Ok("runner deleted")
    }
}

/// Remove the `[[runners]]` entries with these (name, token) pairs from `path`, keeping the
/// rest as written: names may repeat (the default is the host name), tokens tell them apart.
async fn remove_runners(path: &Path, gone: &[(String, String)]) -> anyhow::Result<()> {
    let text = tokio::fs::read_to_string(path)
        .await
        .with_context(|| format!("reading {}", path.display()))?;
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .with_context(|| format!("{}: not TOML", path.display()))?;
    let Some(runners) = doc
        .get_mut("runners")
        .and_then(toml_edit::Item::as_array_of_tables_mut)
    else {
        bail!("{}: [[runners]] is not an array of tables", path.display());
    };
    let field = |t: &toml_edit::Table, key: &str| {
        t.get(key)
            .and_then(toml_edit::Item::as_str)
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    runners.retain(|t| {
        let (name, token) = (field(t, "name"), field(t, "token"));
        !gone.iter().any(|(n, k)| *n == name && *k == token)
    });
    crate::commands::register::write_private(path, &doc.to_string())
        .await
        .with_context(|| format!("writing {}", path.display()))
}
