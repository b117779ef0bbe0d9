//! The commands of the `slipway` binary, one module each.

pub mod exec;
