//! `fleeting-plugin-aws`: an AWS EC2 Auto Scaling group as a fleeting instance group, on the
//! Rust AWS SDK.
//!
//! Increase sets the group's desired capacity, Decrease terminates named instances (lowering the
//! desired capacity), Update reads the group and EC2, ConnectInfo pushes a one-off ed25519 key
//! with EC2 Instance Connect. The plugin keeps no state on disk: the ASG is the source of truth,
//! and the only memory is the set of ids reported last, so an instance that leaves the group
//! (terminated, replaced by the ASG, group deleted) is reported `deleted` once.
//!
//! - [`config`]: the plugin's `plugin_config` JSON, read the way GitLab's AWS plugin reads it.
//! - [`group`]: [`AwsGroup`], the instance group implementation.
//! - [`aws`]: the AWS side: SDK configuration (credentials, region, retries) and the API calls.
//! - [`keys`]: one-off SSH key pairs pushed with EC2 Instance Connect.
//! - [`state`]: how an ASG instance's lifecycle state and its EC2 state map to a fleeting state.

pub mod aws;
pub mod config;
pub mod group;
pub mod keys;
pub mod state;

pub use crate::aws::AwsError;
pub use crate::config::{Config, ConfigError};
pub use crate::group::AwsGroup;
