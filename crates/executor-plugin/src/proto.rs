//! Generated gRPC code for `executor.v1`.

#![allow(missing_docs, missing_debug_implementations, clippy::all)]

/// `executor.v1`: the executor provider service.
pub mod v1 {
    tonic::include_proto!("executor.v1");
}
