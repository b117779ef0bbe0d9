//! Generated gRPC code for go-plugin's internal `plugin` package (controller, stdio, broker).

#![allow(missing_docs, missing_debug_implementations, clippy::all)]

tonic::include_proto!("plugin");
