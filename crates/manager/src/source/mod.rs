//! Where jobs come from. Each source hands its jobs to the one [`crate::lifecycle`] and adds
//! only what differs: how it finds jobs, what it unpacks before their steps, where their traces
//! and final states go, and its retry rules.
//!
//! - [`queue`]: the embedded queue (`slipway submit`, served by `slipway run`), with restart
//!   recovery.
//! - [`gitlab`]: GitLab's runner API (runners with a `url` and a `token`), with the job's
//!   repository ([`gitlab::git`]) and artifacts.
//! - [`local`]: a local pipeline (`slipway exec`) in GitLab's run order.

pub mod gitlab;
pub mod local;
pub mod queue;
