//! `[runners.autoscaler.vm_isolation]`: a nesting VM per job (the `microvm` and `vm` levels of
//! the `instance` executor).

use std::fmt;

use serde::Deserialize;
use slipway_executor::NestingConfig;

use crate::connector::ConnectorConfigToml;
use crate::executor::Executor;
use crate::problem::Report;

/// `[runners.autoscaler.vm_isolation]`: a nesting VM per job (the `microvm` and `vm` levels of
/// the `instance` executor).
#[derive(Clone, Deserialize, Default)]
#[serde(default)]
pub struct VmIsolationConfig {
    /// Create a nesting VM per job.
    pub enabled: bool,
    /// Nesting daemon address as seen from the instance.
    pub nesting_host: String,
    /// Table sent as JSON to the nesting daemon's `Init`.
    pub nesting_config: toml::Table,
    /// VM image of jobs that name none.
    pub image: String,
    /// Slipway: VM image of `microvm` jobs that name none (default: `image`).
    pub microvm_image: String,
    /// Slipway: VM image of `vm` jobs that name none (default: `image`).
    pub vm_image: String,
    /// Slipway: builds directory inside VMs.
    pub builds_dir: String,
    /// `[runners.autoscaler.vm_isolation.connector_config]`: how to reach the nested VM.
    pub connector_config: ConnectorConfigToml,
}

impl fmt::Debug for VmIsolationConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // nesting_config may hold credentials (a registry's, say): left out.
        f.debug_struct("VmIsolationConfig")
            .field("enabled", &self.enabled)
            .field("nesting_host", &self.nesting_host)
            .field("image", &self.image)
            .field("connector_config", &self.connector_config)
            .finish_non_exhaustive()
    }
}

impl VmIsolationConfig {
    /// The executor's settings for the `microvm` and `vm` levels; `allowed_images` comes from
    /// `[runners.instance]`.
    pub fn to_nesting_config(&self, allowed_images: Vec<String>) -> NestingConfig {
        let pick = |s: &str| Some(s.to_string()).filter(|s| !s.is_empty());
        NestingConfig {
            socket: self
                .nesting_host
                .strip_prefix("unix://")
                .unwrap_or(&self.nesting_host)
                .to_string(),
            init_config: self.init_config(),
            image: pick(&self.image),
            microvm_image: pick(&self.microvm_image),
            vm_image: pick(&self.vm_image),
            allowed_images,
            builds_dir: pick(&self.builds_dir).unwrap_or_else(|| "/work/builds".into()),
            cache_dir: "/work/cache".into(),
        }
    }

    /// `nesting_config` as the JSON the daemon's `Init` takes.
    fn init_config(&self) -> Vec<u8> {
        serde_json::to_vec(&self.nesting_config).unwrap_or_else(|_| b"{}".to_vec())
    }

    /// Checks of the section (`report` is at it) of a runner with `executor`.
    pub(crate) fn validate(&self, executor: &Executor, report: &mut Report<'_>) {
        if self.enabled && *executor != Executor::Instance {
            report.warning(
                &["enabled"],
                format!(
                    "VM isolation is supported with the instance executor only; {executor} jobs run without a VM"
                ),
            );
        }
        if self.enabled
            && !self.nesting_host.starts_with("unix://")
            && !self.nesting_host.starts_with('/')
        {
            report.error(
                &["nesting_host"],
                format!(
                    "expected unix:///path/to/nesting.sock on the instance, got {:?}",
                    self.nesting_host
                ),
            );
        }
        if self.enabled {
            if let Err(e) = slipway_nesting::config::Config::parse(&self.init_config()) {
                report.error(&["nesting_config"], e);
            }
            if !self.connector_config.username.is_empty()
                || !self.connector_config.key_path.is_empty()
            {
                report.warning(
                    &["connector_config"],
                    "not used: Slipway reaches a VM through its guest agent over the instance's connection, not SSH into the VM",
                );
            }
        }
        self.connector_config
            .validate(&mut report.section(&["connector_config"]));
    }
}

#[cfg(test)]
mod tests {
    use crate::problem::parse;
    use crate::testing::GOOD;

    #[test]
    fn vm_isolation_and_instance_sections_parse() {
        let text = GOOD.replace(
            "    [runners.autoscaler.plugin_config]",
            "    [runners.autoscaler.vm_isolation]\n      enabled = false\n      nesting_host = \"unix:///n.sock\"\n      image = \"macos\"\n      [runners.autoscaler.vm_isolation.nesting_config]\n        x = 1\n      [runners.autoscaler.vm_isolation.connector_config]\n        username = \"u\"\n    [runners.autoscaler.plugin_config]",
        ) + "  [runners.instance]\n    allowed_images = [\"*\"]\n";
        let loaded = parse(&text, "config.toml").expect("valid");
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        let r = &loaded.config.runners[0];
        let v = r
            .autoscaler
            .as_ref()
            .and_then(|a| a.vm_isolation.as_ref())
            .expect("vm");
        assert_eq!(v.image, "macos");
        assert_eq!(
            r.instance.as_ref().map(|i| i.allowed_images.clone()),
            Some(vec!["*".into()])
        );
    }
}
