//! Fuzz targets for every parser of hostile input (issue 15): each module exposes `check`, which
//! runs the real parser of the real crate on one input and asserts "no panic, and either a clear
//! error or a valid result" plus the invariants the module names. `tests/fuzz.rs` runs each for a
//! few seconds under `bolero::check!`; `make fuzz` runs them for millions of execs
//! (`benches/fuzz.rs`, [`driver`]).

// A target's assertion is a panic by design: the driver and bolero catch and report it.
#![allow(clippy::expect_used, clippy::unwrap_used)]

pub mod archive;
pub mod config;
pub mod content_range;
pub mod driver;
pub mod gitlab;
pub mod guest_frame;
pub mod mutate;
pub mod paths;
pub mod pipeline;
pub mod plugin_process;
pub mod plugin_reply;
