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
    /// Slipway: keep a VM ready in every free slot (unset: where guests run under KVM; the
    /// daemon keeps within `warm_memory_mib`, see docs/nesting.md).
    pub warm: Option<bool>,
    /// Slipway: images kept warm (default: `microvm_image`, else `image`); a slot then keeps
    /// the image its last job asked for.
    pub warm_images: Vec<String>,
    /// Slipway: MiB of guest memory all warm VMs of an instance may hold (0: half of what the
    /// instance has available when the daemon starts).
    pub warm_memory_mib: u64,
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
    pub fn to_nesting_config(&self, allowed_images: Vec<String>, slots: u32) -> NestingConfig {
        let pick = |s: &str| Some(s.to_string()).filter(|s| !s.is_empty());
        NestingConfig {
            socket: self
                .nesting_host
                .strip_prefix("unix://")
                .unwrap_or(&self.nesting_host)
                .to_string(),
            init_config: self.init_config_with_warm(slots),
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

    /// [`Self::init_config`] with the warm slots (`slots` of them) added unless `warm = false`
    /// (unset: only where the daemon's guests run under KVM), unless `nesting_config` has its
    /// own `warm` table.
    fn init_config_with_warm(&self, slots: u32) -> Vec<u8> {
        let mut table = self.nesting_config.clone();
        if self.warm != Some(false) && slots > 0 && !table.contains_key("warm") {
            let images: Vec<String> = if self.warm_images.is_empty() {
                [&self.microvm_image, &self.image]
                    .into_iter()
                    .find(|i| !i.is_empty())
                    .cloned()
                    .into_iter()
                    .collect()
            } else {
                self.warm_images.clone()
            };
            let mut warm = toml::Table::new();
            warm.insert("slots".into(), toml::Value::Integer(i64::from(slots)));
            warm.insert(
                "images".into(),
                toml::Value::Array(images.into_iter().map(toml::Value::String).collect()),
            );
            warm.insert(
                "memory_budget_mib".into(),
                toml::Value::Integer(i64::try_from(self.warm_memory_mib).unwrap_or(i64::MAX)),
            );
            if self.warm.is_none() {
                warm.insert("only_with_kvm".into(), toml::Value::Boolean(true));
            }
            table.insert("warm".into(), toml::Value::Table(warm));
        }
        serde_json::to_vec(&table).unwrap_or_else(|_| b"{}".to_vec())
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
            if let Some(bad) = self
                .warm_images
                .iter()
                .find(|i| slipway_nesting::check_name("image", i).is_err())
            {
                report.error(
                    &["warm_images"],
                    format!("{bad:?} is not an image name (letters, digits, '.', '_', '-')"),
                );
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
    use crate::check::parse;
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

    #[test]
    fn warm_slots_follow_warm_and_are_left_to_kvm_when_unset() {
        let warm_of = |warm: Option<bool>| {
            let v = super::VmIsolationConfig {
                warm,
                microvm_image: "ci-microvm".into(),
                ..Default::default()
            };
            let init: serde_json::Value =
                serde_json::from_slice(&v.to_nesting_config(Vec::new(), 4).init_config).unwrap();
            init.get("warm").cloned()
        };
        assert_eq!(
            warm_of(Some(true)),
            Some(serde_json::json!({"slots": 4, "images": ["ci-microvm"], "memory_budget_mib": 0}))
        );
        assert_eq!(
            warm_of(None),
            Some(serde_json::json!({
                "slots": 4, "images": ["ci-microvm"], "memory_budget_mib": 0, "only_with_kvm": true
            }))
        );
        assert_eq!(warm_of(Some(false)), None);
    }
}
