//! The generated `nesting.v1` messages, client and server.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("nesting.v1");
