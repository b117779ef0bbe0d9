//! The daemon's configuration: the JSON a runner's `vm_isolation.nesting_config` table becomes,
//! sent with `Init`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Which accelerator the configuration asks for (the daemon resolves `auto` by probing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccelChoice {
    /// KVM if the probe shows it works, else TCG.
    #[default]
    Auto,
    /// KVM, whatever the probe says.
    Kvm,
    /// Software emulation.
    Tcg,
}

/// Which hypervisor backend runs the VMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HypervisorKind {
    /// QEMU (KVM or TCG).
    #[default]
    Qemu,
    /// Firecracker (KVM only).
    Firecracker,
    /// Cloud Hypervisor (KVM only).
    CloudHypervisor,
}

impl HypervisorKind {
    /// The name as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            HypervisorKind::Qemu => "qemu",
            HypervisorKind::Firecracker => "firecracker",
            HypervisorKind::CloudHypervisor => "cloud-hypervisor",
        }
    }
}

/// How many snapshots are kept and for how long; the oldest go first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retention {
    /// At most this many snapshots (0: no limit).
    #[serde(default = "default_max_count")]
    pub max_count: usize,
    /// Snapshots older than this many seconds are removed (0: no limit).
    #[serde(default = "default_max_age_secs")]
    pub max_age_secs: u64,
}

fn default_max_count() -> usize {
    20
}

fn default_max_age_secs() -> u64 {
    7 * 24 * 3600
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            max_count: default_max_count(),
            max_age_secs: default_max_age_secs(),
        }
    }
}

/// Where QEMU guests keep their RAM (Firecracker and Cloud Hypervisor always map their
/// memory files).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryChoice {
    /// A file when this QEMU supports it (≥ 5.0), else anonymous memory.
    #[default]
    Auto,
    /// A file: snapshots keep it, restores map it copy-on-write. Init fails on an older QEMU.
    File,
    /// Anonymous memory: snapshots stream RAM and restores read it all (the pre-file path;
    /// no guest RAM is written back to the state directory's disk).
    Anonymous,
}

/// The `Init` configuration.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The backend.
    #[serde(default)]
    pub hypervisor: HypervisorKind,
    /// Where images built by `slipway image build` live (`<images_dir>/<name>/image.json`);
    /// default: the daemon's `--images-dir`.
    #[serde(default)]
    pub images_dir: Option<PathBuf>,
    /// `auto` (probe KVM), `kvm` or `tcg`.
    #[serde(default)]
    pub accel: AccelChoice,
    /// vCPUs per VM (default: the image's).
    #[serde(default)]
    pub vcpus: Option<u32>,
    /// Memory per VM in MiB (default: the image's).
    #[serde(default)]
    pub memory_mib: Option<u32>,
    /// Seconds a VM may take from start to its agent's first answer (default: 30 with KVM,
    /// 120 under TCG).
    #[serde(default)]
    pub boot_timeout_secs: Option<u64>,
    /// Snapshot retention.
    #[serde(default)]
    pub snapshots: Retention,
    /// Path of the hypervisor binary (default: by name on PATH).
    #[serde(default)]
    pub binary: Option<PathBuf>,
    /// Where QEMU guests keep their RAM: `auto`, `file` or `anonymous`.
    #[serde(default)]
    pub memory: MemoryChoice,
    /// Warm slots: a VM started ahead of the job in every free slot (off when absent).
    #[serde(default)]
    pub warm: Option<WarmConfig>,
}

/// Warm slots: the daemon keeps a ready VM in each of slots `0..slots`, restored from a base
/// snapshot of its image, and hands it to the next `Create` of that slot and image.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmConfig {
    /// Slots kept warm: `0..slots` (the instance's capacity).
    pub slots: u32,
    /// Images kept warm: a slot keeps the image its last job asked for, else the first of
    /// these. Empty: only images jobs asked for.
    #[serde(default)]
    pub images: Vec<String>,
    /// MiB of guest memory all warm VMs may hold at once (0: half of the memory the instance
    /// has available at `Init`).
    #[serde(default)]
    pub memory_budget_mib: u64,
    /// Keep slots warm only where guests run under KVM (the manager's default when config.toml
    /// leaves `warm` unset): under emulation a fill costs seconds of the jobs' CPU.
    #[serde(default)]
    pub only_with_kvm: bool,
}

impl Config {
    /// Parse the `Init` bytes; an empty body is the default configuration.
    pub fn parse(bytes: &[u8]) -> Result<Config, String> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Config::default());
        }
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            if path == "." {
                format!("nesting config: {}", e.inner())
            } else {
                format!("nesting config: {path}: {}", e.inner())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_config_is_the_default() {
        assert_eq!(Config::parse(b"").unwrap(), Config::default());
        assert_eq!(
            Config::parse(b"{}").unwrap().hypervisor,
            HypervisorKind::Qemu
        );
    }

    #[test]
    fn keys_parse() {
        let c = Config::parse(
            br#"{"hypervisor":"cloud-hypervisor","accel":"tcg","memory_mib":512,
                 "snapshots":{"max_count":3,"max_age_secs":60},"memory":"anonymous"}"#,
        )
        .unwrap();
        assert_eq!(c.memory, MemoryChoice::Anonymous);
        assert_eq!(c.hypervisor, HypervisorKind::CloudHypervisor);
        assert_eq!(c.accel, AccelChoice::Tcg);
        assert_eq!(c.memory_mib, Some(512));
        assert_eq!(c.snapshots.max_count, 3);
    }

    #[test]
    fn warm_slots_parse_and_a_bad_key_is_named() {
        let c = Config::parse(br#"{"warm":{"slots":4,"images":["m"],"memory_budget_mib":1024}}"#)
            .unwrap();
        let w = c.warm.unwrap();
        assert_eq!(
            (w.slots, w.images, w.memory_budget_mib),
            (4, vec!["m".to_string()], 1024)
        );
        let e = Config::parse(br#"{"warm":{"slots":2,"budget":1}}"#).unwrap_err();
        assert!(e.contains("warm") && e.contains("budget"), "{e}");
    }

    #[test]
    fn errors_name_the_key() {
        let e = Config::parse(br#"{"snapshots":{"max_count":"many"}}"#).unwrap_err();
        assert!(e.contains("snapshots.max_count"), "{e}");
        let e = Config::parse(br#"{"hypervisr":"qemu"}"#).unwrap_err();
        assert!(e.contains("unknown field `hypervisr`"), "{e}");
        let e = Config::parse(br#"{"hypervisor":"xen"}"#).unwrap_err();
        assert!(e.contains("hypervisor") && e.contains("xen"), "{e}");
    }
}
