//! Fuzz targets for every parser of hostile input (issue 15): each module exposes `check`, which
//! runs the real parser of the real crate on one input and asserts "no panic, and either a clear
//! error or a valid result" plus the invariants the module names. `tests/fuzz.rs` runs each for a
//! few seconds under `bolero::check!`; `make fuzz` runs them for millions of execs
//! (`benches/fuzz.rs`, [`driver`]).
//!
//! - [`archive`]: artifact archives: hostile zips through `zip_to_tar`, tar streams through
//!   `archive_from_tar`, and a counted subset really extracted into a fresh directory.
//! - [`config`]: `config.toml` and the plugins' `plugin_config` JSON, seeds mutated.
//! - [`content_range`]: the client's reading of a 416 reply's `Range: 0-N`.
//! - [`gitlab`]: GitLab's replies as the client reads them: the job payload, runner
//!   credentials and reply headers.
//! - [`guest_frame`]: the guest agent's request and reply frames, and their round trip.
//! - [`paths`]: cache keys and artifact paths; none accepted may name a place outside the cache
//!   or project directory.
//! - [`pipeline`]: `.gitlab-ci.yml` with its includes: the pipeline crate's corpus, mutated.
//! - [`plugin_reply`]: fleeting and nesting plugin replies, decoded and converted in process.
//! - [`plugin_process`]: the real plugin host against a fake plugin process that sends random
//!   replies; every call returns and the process is gone after `stop`.
//! - [`masking`]: the job log's masker: random secrets, output and split points.
//! - [`extremes`]: numbers and durations at their type's edges in a job payload and config.toml.
//! - [`mutate`]: structured mutation of seed files (bytes, dictionary tokens, whole lines),
//!   because random bytes alone never get deep into YAML, TOML or JSON.
//! - [`driver`]: runs a target for a number of execs on seeded generated inputs, catching panics.

// A target's assertion is a panic by design: the driver and bolero catch and report it.
#![allow(clippy::expect_used, clippy::unwrap_used)]

pub mod archive;
pub mod config;
pub mod content_range;
pub mod driver;
pub mod extremes;
pub mod gitlab;
pub mod guest_frame;
pub mod masking;
pub mod mutate;
pub mod paths;
pub mod pipeline;
pub mod plugin_process;
pub mod plugin_reply;
