//! Generated gRPC code for `fleeting.v1`; go-plugin's internal `plugin` package is re-exported.

#![allow(missing_docs, missing_debug_implementations, clippy::all)]

/// `fleeting.v1`: the instance-group service.
pub mod fleeting {
    /// Version 1 of the contract.
    pub mod v1 {
        tonic::include_proto!("fleeting.v1");
    }
}

/// go-plugin's internal services (controller, stdio, broker).
pub use slipway_goplugin::proto as goplugin;
