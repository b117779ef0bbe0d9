//! `slipway register`: GitLab Runner's two registration flows, then a new `[[runners]]` entry
//! appended to `config.toml`.
//!
//! - Legacy: a registration token (`--registration-token`) → `POST /api/v4/runners` creates the
//!   runner and returns its ID and authentication token.
//! - Current: a runner authentication token created in GitLab's UI (`--token glrt-…`) →
//!   `POST /api/v4/runners/verify` with this manager's `system_id`, the same file `slipway run`
//!   uses, so both register one manager.
//!
//! The existing file is kept byte for byte (comments, layout) and the entry appended; the result
//! is written atomically with mode 0600, since it holds the token.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use slipway_gitlab::{
    ClientConfig, GitlabClient, GitlabError, RegisterOptions, RunnerCredentials, Secret, SystemId,
    TlsFiles,
};

use slipway_config::{self as config, Executor};

/// What to register and where to write it.
#[derive(Clone, Default)]
pub struct RegisterArgs {
    /// `config.toml` to append to (created if absent).
    pub config: PathBuf,
    /// GitLab's URL.
    pub url: String,
    /// Legacy registration token (`POST /runners`).
    pub registration_token: Option<Secret>,
    /// Runner authentication token created in GitLab's UI (`POST /runners/verify`).
    pub token: Option<Secret>,
    /// Runner name in config.toml (default: the host name).
    pub name: Option<String>,
    /// Executor of the new entry (`--executor`; an [`Executor::Unknown`] name is refused).
    pub executor: Executor,
    /// Default image of docker executors (`[runners.docker] image`).
    pub docker_image: Option<String>,
    /// What the legacy flow sends besides the token.
    pub options: RegisterOptions,
    /// `--tls-ca-file`, `--tls-cert-file`, `--tls-key-file`: used to reach GitLab and written
    /// to the entry.
    pub tls: TlsFiles,
}

impl std::fmt::Debug for RegisterArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Tokens are `Secret`s: their Debug prints a mask.
        f.debug_struct("RegisterArgs")
            .field("config", &self.config)
            .field("url", &self.url)
            .field("registration_token", &self.registration_token)
            .field("token", &self.token)
            .field("name", &self.name)
            .field("executor", &self.executor)
            .finish_non_exhaustive()
    }
}

/// The runner that was registered and written.
#[derive(Debug, Clone)]
pub struct Registered {
    /// Name of the new entry.
    pub name: String,
    /// The runner's ID in GitLab (0 when a legacy server did not say).
    pub id: u64,
    /// The token's short form, safe to print.
    pub short_token: String,
    /// The file written.
    pub config: PathBuf,
    /// Whether the file was created.
    pub created: bool,
}

/// Why registration failed; no variant carries a token.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The command line asks for something that cannot work.
    #[error("{0}")]
    Usage(String),
    /// The existing config file cannot be read or appended to.
    #[error("{file}: {message}")]
    Config {
        /// The file.
        file: String,
        /// What is wrong.
        message: String,
    },
    /// The `system_id` file cannot be read or created.
    #[error("{0}")]
    SystemId(GitlabError),
    /// GitLab refused the registration token.
    #[error(
        "GitLab refused the registration token (HTTP 403): it is wrong, was reset, or belongs to another instance; \
         or create the runner in GitLab's UI and use --token glrt-…"
    )]
    RegistrationRefused,
    /// GitLab no longer accepts registration tokens.
    #[error(
        "GitLab does not accept registration tokens (HTTP {0}): registration tokens are disabled on this instance; \
         create the runner in GitLab's UI and use --token glrt-…"
    )]
    RegistrationDisabled(u16),
    /// GitLab refused the runner authentication token.
    #[error(
        "GitLab refused the runner authentication token (HTTP 403): it is wrong, expired or the runner was deleted"
    )]
    TokenRefused,
    /// Any other failure talking to GitLab.
    #[error("registering with GitLab failed: {0}")]
    Gitlab(GitlabError),
    /// The runner was registered but config.toml could not be written.
    #[error(
        "runner {id} was registered in GitLab (token {short}…) but {file} could not be written: {source}"
    )]
    Write {
        /// The runner's ID, so it can be found and removed in GitLab.
        id: u64,
        /// The token's short form.
        short: String,
        /// The file.
        file: String,
        /// Why.
        source: std::io::Error,
    },
}

/// Options the runner-token flow cannot take: GitLab keeps them with the runner created in its
/// UI (GitLab Runner refuses them the same way).
fn ui_only_options(o: &RegisterOptions) -> Vec<&'static str> {
    let mut v = Vec::new();
    if !o.tag_list.is_empty() {
        v.push("--tag-list");
    }
    if o.run_untagged {
        v.push("--run-untagged");
    }
    if o.locked {
        v.push("--locked");
    }
    if !o.maintenance_note.is_empty() {
        v.push("--maintenance-note");
    }
    if !o.access_level.is_empty() {
        v.push("--access-level");
    }
    if o.maximum_timeout != 0 {
        v.push("--maximum-timeout");
    }
    if o.paused {
        v.push("--paused");
    }
    v
}

/// What `slipway register` takes.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// config.toml to append to.
    #[arg(short, long, default_value = "config.toml")]
    pub config: PathBuf,
    /// GitLab's URL.
    #[arg(short, long, env = "CI_SERVER_URL")]
    pub url: String,
    /// Runner authentication token (glrt-…) of a runner created in GitLab's UI.
    #[arg(short, long, env = "CI_SERVER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Legacy registration token.
    #[arg(short, long, env = "REGISTRATION_TOKEN", hide_env_values = true)]
    pub registration_token: Option<String>,
    /// Runner name (default: the host name).
    #[arg(long, env = "RUNNER_NAME")]
    pub name: Option<String>,
    /// Executor: instance, docker-autoscaler, shell, docker or custom.
    #[arg(long, env = "RUNNER_EXECUTOR")]
    pub executor: String,
    /// Default image of the docker executors.
    #[arg(long, env = "DOCKER_IMAGE")]
    pub docker_image: Option<String>,
    /// Runner description (legacy flow; default: the name).
    #[arg(long)]
    pub description: Option<String>,
    /// Tags, comma-separated (legacy flow).
    #[arg(long, value_delimiter = ',')]
    pub tag_list: Vec<String>,
    /// Also run untagged jobs (legacy flow).
    #[arg(long)]
    pub run_untagged: bool,
    /// Lock the runner to its project (legacy flow).
    #[arg(long)]
    pub locked: bool,
    /// Start paused (legacy flow).
    #[arg(long)]
    pub paused: bool,
    /// `not_protected` or `ref_protected` (legacy flow).
    #[arg(long)]
    pub access_level: Option<String>,
    /// Longest job in seconds (legacy flow).
    #[arg(long)]
    pub maximum_timeout: Option<u64>,
    /// Maintenance note (legacy flow).
    #[arg(long)]
    pub maintenance_note: Option<String>,
    /// PEM certificates trusted besides the system's roots (a GitLab behind a private CA).
    #[arg(long = "tls-ca-file", env = "CI_SERVER_TLS_CA_FILE")]
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate presented to GitLab.
    #[arg(long = "tls-cert-file", env = "CI_SERVER_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM key of the client certificate.
    #[arg(long = "tls-key-file", env = "CI_SERVER_TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,
}

/// `slipway register`: the arguments as GitLab Runner takes them, then the registration.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let Args {
        config,
        url,
        token,
        registration_token,
        name,
        executor,
        docker_image,
        description,
        tag_list,
        run_untagged,
        locked,
        paused,
        access_level,
        maximum_timeout,
        maintenance_note,
        tls_ca_file,
        tls_cert_file,
        tls_key_file,
    } = args;
    let args = RegisterArgs {
        config,
        url,
        registration_token: registration_token.map(slipway_gitlab::Secret::new),
        token: token.map(slipway_gitlab::Secret::new),
        name,
        // Unknown names too: `register` refuses them with the names it takes.
        executor: executor.into(),
        docker_image,
        options: slipway_gitlab::RegisterOptions {
            description: description.unwrap_or_default(),
            maintenance_note: maintenance_note.unwrap_or_default(),
            tag_list: tag_list
                .into_iter()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
                .collect(),
            run_untagged,
            locked,
            access_level: access_level.unwrap_or_default(),
            maximum_timeout: maximum_timeout.unwrap_or(0),
            paused,
        },
        tls: TlsFiles {
            ca_file: tls_ca_file,
            cert_file: tls_cert_file,
            key_file: tls_key_file,
        },
    };
    let r = register(&args).await?;
    // The short token only: the full one is in the file, mode 0600.
    println!(
        "Registered runner {:?}: id {}, token {}… ({} {})",
        r.name,
        r.id,
        r.short_token,
        if r.created { "created" } else { "appended to" },
        r.config.display()
    );
    // What the new entry still needs (e.g. an autoscaler section) is said now, not at run.
    if let Err(e) = slipway_config::load(&r.config).await {
        eprintln!(
            "note: {} needs editing before `slipway run`:\n{e}",
            r.config.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Register with GitLab and append the runner to `args.config`.
pub async fn register(args: &RegisterArgs) -> Result<Registered, RegisterError> {
    if !args.executor.is_known() {
        return Err(RegisterError::Usage(format!(
            "--executor {:?} is not supported; expected one of {}",
            args.executor.as_str(),
            Executor::names().join(", ")
        )));
    }
    if args.url.trim().is_empty() {
        return Err(RegisterError::Usage("--url is required".into()));
    }
    // Read (and check) the file first: never register a runner that cannot be written down.
    let file = args.config.display().to_string();
    let existing = match tokio::fs::read_to_string(&args.config).await {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            return Err(RegisterError::Config {
                file,
                message: format!("cannot read: {e}"),
            });
        }
    };
    if let Some(text) = &existing {
        appendable(text).map_err(|message| RegisterError::Config {
            file: file.clone(),
            message,
        })?;
    }
    let name = args.name.clone().unwrap_or_else(hostname);
    // GitLab Runner's well-known files beside the config count here as in `slipway run`.
    let tls = args
        .tls
        .clone()
        .with_defaults(&config::certs_dir(&args.config), args.url.trim());
    let client = GitlabClient::new(
        ClientConfig::new(
            args.url.trim(),
            slipway_manager::source::gitlab::version_info(&args.executor),
        )
        .with_tls(tls),
    )
    .map_err(RegisterError::Gitlab)?;
    let creds = match (&args.registration_token, &args.token) {
        (Some(_), Some(_)) => {
            return Err(RegisterError::Usage(
                "give either --registration-token (legacy) or --token (runner authentication token), not both".into(),
            ));
        }
        (None, None) => {
            return Err(RegisterError::Usage(
                "give --token with the runner authentication token (glrt-…) created in GitLab's UI, \
                 or --registration-token for the legacy flow"
                    .into(),
            ));
        }
        (Some(reg), None) => {
            let mut options = args.options.clone();
            if options.description.is_empty() {
                options.description = name.clone();
            }
            client.register(reg, &options).await.map_err(|e| match e {
                GitlabError::Forbidden { .. } => RegisterError::RegistrationRefused,
                GitlabError::Status {
                    status: s @ (410 | 422),
                    ..
                } => RegisterError::RegistrationDisabled(s),
                e => RegisterError::Gitlab(e),
            })?
        }
        (None, Some(token)) => {
            let refused = ui_only_options(&args.options);
            if !refused.is_empty() {
                return Err(RegisterError::Usage(format!(
                    "{} cannot be given with --token: set them on the runner in GitLab's UI",
                    refused.join(", ")
                )));
            }
            let setting = config::state_dir_setting(&args.config)
                .await
                .map_err(|e| RegisterError::Usage(e.to_string()))?;
            let state = config::state_dir(&args.config, setting.as_deref());
            let system_id =
                SystemId::load_or_create(&slipway_manager::source::gitlab::system_id_path(&state))
                    .await
                    .map_err(RegisterError::SystemId)?;
            let mut creds = client
                .verify(token, &system_id)
                .await
                .map_err(|e| match e {
                    GitlabError::Forbidden { .. } => RegisterError::TokenRefused,
                    e => RegisterError::Gitlab(e),
                })?;
            // Verify confirms the token it was given; keep that one if the answer has none.
            if creds.token.expose().is_empty() {
                creds.token = token.clone();
            }
            creds
        }
    };
    let entry = runner_entry(&NewRunner {
        name: &name,
        url: args.url.trim(),
        creds: &creds,
        obtained_at: &humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        executor: &args.executor,
        docker_image: args.docker_image.as_deref(),
        tls: &args.tls,
    });
    let created = existing.is_none();
    let text = append(existing.as_deref(), &entry);
    let short = creds.token.short();
    write_private(&args.config, &text)
        .await
        .map_err(|source| RegisterError::Write {
            id: creds.id,
            short: short.clone(),
            file,
            source,
        })?;
    Ok(Registered {
        name,
        id: creds.id,
        short_token: short,
        config: args.config.clone(),
        created,
    })
}

/// Whether `text` is TOML that a `[[runners]]` table can be appended to.
fn appendable(text: &str) -> Result<(), String> {
    let doc = toml_edit::Document::parse(text.to_string())
        .map_err(|e| format!("not valid TOML, not changed: {}", e.message()))?;
    match doc.as_table().get("runners") {
        None | Some(toml_edit::Item::ArrayOfTables(_)) => Ok(()),
        Some(_) => Err(
            "`runners` is not written as [[runners]] tables; cannot append an entry".to_string(),
        ),
    }
}

/// The fields of a new `[[runners]]` entry.
struct NewRunner<'a> {
    name: &'a str,
    url: &'a str,
    creds: &'a RunnerCredentials,
    obtained_at: &'a str,
    executor: &'a Executor,
    docker_image: Option<&'a str>,
    /// The TLS files given to `register`, written as GitLab Runner writes them.
    tls: &'a TlsFiles,
}

/// A TOML string literal.
fn quote(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// A TOML datetime as GitLab Runner writes it; a text GitLab sent that is not one stays a string.
fn datetime(s: &str) -> String {
    match s.trim().parse::<toml::value::Datetime>() {
        Ok(d) => d.to_string(),
        Err(_) => quote(s),
    }
}

/// The entry as GitLab Runner lays it out (two-space indents, zero time for "never expires").
fn runner_entry(r: &NewRunner<'_>) -> String {
    let expires = r
        .creds
        .token_expires_at
        .as_deref()
        .filter(|s| !s.trim().is_empty())
        .map_or_else(|| "0001-01-01T00:00:00Z".to_string(), datetime);
    let mut s = String::new();
    s.push_str("[[runners]]\n");
    s.push_str(&format!("  name = {}\n", quote(r.name)));
    s.push_str(&format!("  url = {}\n", quote(r.url)));
    s.push_str(&format!("  id = {}\n", r.creds.id));
    s.push_str(&format!("  token = {}\n", quote(r.creds.token.expose())));
    s.push_str(&format!(
        "  token_obtained_at = {}\n",
        datetime(r.obtained_at)
    ));
    s.push_str(&format!("  token_expires_at = {expires}\n"));
    for (key, file) in [
        ("tls-ca-file", &r.tls.ca_file),
        ("tls-cert-file", &r.tls.cert_file),
        ("tls-key-file", &r.tls.key_file),
    ] {
        if let Some(f) = file {
            s.push_str(&format!("  {key} = {}\n", quote(&f.display().to_string())));
        }
    }
    s.push_str(&format!("  executor = {}\n", quote(r.executor.as_str())));
    if matches!(r.executor, Executor::Docker | Executor::DockerAutoscaler) {
        s.push_str("  [runners.docker]\n");
        s.push_str(&format!(
            "    image = {}\n",
            quote(r.docker_image.unwrap_or("alpine:latest"))
        ));
    }
    if r.executor.autoscaled() {
        // Which cloud and group are the operator's choice: left for them to fill in.
        s.push_str(
            "  # Fill in and uncomment: the fleeting plugin (fleeting-plugin-<name> on PATH or in\n  \
             # --plugin-dir) and its instance group.\n  \
             # [runners.autoscaler]\n  \
             #   plugin = \"aws\"\n  \
             #   capacity_per_instance = 1\n  \
             #   max_use_count = 1\n  \
             #   max_instances = 10\n  \
             #   [runners.autoscaler.plugin_config]\n  \
             #     name = \"my-asg\"\n  \
             #   [runners.autoscaler.connector_config]\n  \
             #     username = \"ec2-user\"\n  \
             #   [[runners.autoscaler.policy]]\n  \
             #     idle_count = 1\n  \
             #     idle_time = \"20m0s\"\n",
        );
    }
    s
}

/// `existing` unchanged with `entry` appended; a new file starts with GitLab Runner's globals.
fn append(existing: Option<&str>, entry: &str) -> String {
    match existing {
        None => format!("concurrent = 1\ncheck_interval = 0\n\n{entry}"),
        Some(text) => {
            let mut out = text.to_string();
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(entry);
            out
        }
    }
}

/// Write `text` to `path` through a temporary file in the same directory and a rename, so a
/// crash leaves the old file or the new one, never half of one; mode 0600 (it holds tokens).
pub async fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    let path = path.to_path_buf();
    let text = text.to_string();
    tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        // NamedTempFile is created 0600; set it anyway in case a umask or platform differs.
        let mut tmp = tempfile::Builder::new()
            .prefix(".config.toml.")
            .tempfile_in(dir)?;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o600))?;
        tmp.write_all(text.as_bytes())?;
        tmp.as_file().sync_all()?;
        tmp.persist(&path).map_err(|e| e.error)?;
        Ok(())
    })
    .await
    .map_err(std::io::Error::other)?
}

/// GitLab Runner's default runner name: the host name.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "slipway".into())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn creds(expires: Option<&str>) -> RunnerCredentials {
        RunnerCredentials {
            id: 42,
            token: Secret::new("glrt-abcdefghijklmnopqrstu"),
            token_expires_at: expires.map(str::to_string),
        }
    }

    fn entry(executor: &str, expires: Option<&str>) -> String {
        let executor = executor.parse().expect("an executor");
        runner_entry(&NewRunner {
            name: "ci \"one\"",
            url: "https://gitlab.example.com/",
            creds: &creds(expires),
            obtained_at: "2026-08-20T10:00:00Z",
            executor: &executor,
            docker_image: None,
            tls: &TlsFiles::default(),
        })
    }

    #[test]
    fn tls_files_are_written_as_gitlab_runner_writes_them() {
        let tls = TlsFiles {
            ca_file: Some("/etc/gitlab-runner/certs/ca.crt".into()),
            ..TlsFiles::default()
        };
        let text = runner_entry(&NewRunner {
            name: "ci",
            url: "https://gitlab.example.com/",
            creds: &creds(None),
            obtained_at: "2026-08-20T10:00:00Z",
            executor: &Executor::Shell,
            docker_image: None,
            tls: &tls,
        });
        assert!(
            text.contains("  tls-ca-file = \"/etc/gitlab-runner/certs/ca.crt\"\n"),
            "{text}"
        );
        assert!(!text.contains("tls-cert-file"), "{text}");
    }

    #[test]
    fn new_file_is_a_valid_config() {
        let text = append(None, &entry("shell", None));
        assert!(
            text.starts_with("concurrent = 1\ncheck_interval = 0\n"),
            "{text}"
        );
        let loaded = config::parse(&text, "config.toml").expect("valid");
        let r = &loaded.config.runners[0];
        assert_eq!(r.name, "ci \"one\"");
        assert_eq!(r.id, 42);
        assert_eq!(r.token, "glrt-abcdefghijklmnopqrstu");
        assert_eq!(r.token_obtained_at.as_deref(), Some("2026-08-20T10:00:00Z"));
        assert_eq!(r.token_expires_at.as_deref(), Some("0001-01-01T00:00:00Z"));
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    }

    #[test]
    fn appending_keeps_the_file_and_adds_an_entry() {
        let original = "# keep me\nconcurrent = 3 # and me\n\n[[runners]]\n  name = \"a\"\n  executor = \"shell\"";
        appendable(original).expect("appendable");
        let text = append(
            Some(original),
            &entry("docker", Some("2026-09-01T00:00:00.000Z")),
        );
        assert!(text.starts_with(original), "{text}");
        let loaded = config::parse(&text, "config.toml").expect("valid");
        assert_eq!(loaded.config.runners.len(), 2);
        let r = &loaded.config.runners[1];
        // Written as a TOML datetime (fractional zeros may be shortened).
        assert!(
            r.token_expires_at
                .as_deref()
                .is_some_and(|t| t.starts_with("2026-09-01T00:00:00")),
            "{:?}",
            r.token_expires_at
        );
        assert!(
            text.contains("token_expires_at = 2026-09-01T00:00:00"),
            "{text}"
        );
        assert_eq!(
            r.docker.as_ref().and_then(|d| d.image.as_deref()),
            Some("alpine:latest")
        );
    }

    #[test]
    fn runners_as_inline_array_cannot_be_appended_to() {
        assert!(appendable("runners = []\n").is_err());
        assert!(appendable("[[runners]\n").is_err());
    }

    #[test]
    fn autoscaled_skeleton_is_commented_out() {
        let text = append(None, &entry("instance", None));
        let e = config::parse(&text, "config.toml").expect_err("needs an autoscaler");
        assert!(
            e.to_string()
                .contains("the instance executor needs a [runners.autoscaler] section"),
            "{e}"
        );
    }
}
