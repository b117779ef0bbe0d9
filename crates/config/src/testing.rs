//! Config texts and helpers the modules' tests share.

use crate::check::{ConfigError, parse};

/// Every error `text` gives, as printed.
pub(crate) fn errors(text: &str) -> Vec<String> {
    match parse(text, "config.toml") {
        Err(ConfigError::Invalid(p)) => p.iter().map(ToString::to_string).collect(),
        Err(e) => vec![e.to_string()],
        Ok(_) => Vec::new(),
    }
}

/// A valid `instance` runner with an autoscaler (line numbers matter to the tests).
pub(crate) const GOOD: &str = r#"
concurrent = 4

[[runners]]
  name = "local"
  token = "glrt-secret-token"
  executor = "instance"
  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = 2
    max_instances = 2
    max_use_count = 5
    instance_acquire_timeout = "1m"
    [runners.autoscaler.plugin_config]
      provisioning_delay = "1s"
    [[runners.autoscaler.policy]]
      idle_count = 1
      idle_time = "20m0s"
"#;

/// A `shell` runner as `gitlab-runner register` writes it.
pub(crate) const GITLAB_WRITTEN: &str = r#"
concurrent = 1
check_interval = 0
connection_max_age = "15m0s"
shutdown_timeout = 0

[session_server]
  session_timeout = 1800

[[runners]]
  name = "shell"
  url = "https://gitlab.example.com"
  id = 7
  token = "glrt-t1_secret-token-value"
  token_obtained_at = 2024-05-01T12:00:00Z
  token_expires_at = 0001-01-01T00:00:00Z
  executor = "shell"
  shell = "sh"
  cache_dir = "/cache"
  environment = ["A=1", "B=two=2"]
  pre_build_script = "echo pre"
  tls-ca-file = "/"
  [runners.custom_build_dir]
  [runners.cache]
    MaxUploadedArchiveSize = 0
    [runners.cache.s3]
    [runners.cache.gcs]
    [runners.cache.azure]
  [runners.feature_flags]
    FF_USE_FASTZIP = true
"#;
