//! `fleeting-plugin-static`: an instance group over machines an operator already has, reached
//! over SSH (GitLab's static fleeting plugin, with cleanup and restart safety added).
//!
//! "Creating" an instance leases a free configured host (after checking it answers SSH);
//! "deleting" one runs `cleanup_command` on the host and puts it back in the free set. Every
//! lease gets a fresh id `<host>-<n>`, so an id the taskscaler saw deleted never comes back.
//! Leases live in `<state_dir>/state.json` (written atomically) so a restarted plugin keeps
//! them and resumes unfinished cleanups; host keys are pinned on first use in
//! `<state_dir>/known_hosts`. See the README for the config keys.
//!
//! - [`config`]: the plugin's `plugin_config` JSON, validated key by key so every error names
//!   its key.
//! - [`addr`]: host addresses (`host`, `host:port`, `[v6]:port`) and the reachability probe.
//! - [`host`]: a configured host, its credentials resolved against the runner's
//!   `connector_config`.
//! - [`state`]: which hosts are leased, being cleaned or held back, persisted in `state.json`
//!   and shared safely by several plugin processes through lock files.
//! - `group`: [`StaticGroup`], the instance group over the configured hosts.

pub mod addr;
pub mod config;
mod group;
pub mod host;
pub mod state;

pub use config::{Config, ConfigError};
pub use group::StaticGroup;
