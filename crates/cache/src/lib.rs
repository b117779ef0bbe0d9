//! GitLab's distributed cache, as GitLab Runner lays it out, so the two share caches:
//!
//! - [`object_name`]: `<Path>/runner/<short token>/project/<id>/<key>` (no `runner/…` part when
//!   the cache is `Shared`), the object holding the cache's archive.
//! - [`Store`]: the bucket on S3, Google Cloud Storage or Azure Blob Storage, and pre-signed
//!   GET and PUT URLs of its objects (signed by Apache Arrow's `object_store`), so a transfer
//!   needs no credential: whoever holds the URL may do that one thing, for a while.
//! - [`transfer`]: the GET and PUT themselves.
//!
//! Private modules behind the first two (their items are re-exported here):
//!
//! - `object`: where a cache lives in the bucket: GitLab Runner's object names.
//! - `store`: [`Store`] and [`StoreConfig`], one bucket whatever its cloud.
//! - `s3`, `gcs`, `azure`: each cloud's settings as its `[runners.cache.*]` section has them.
//! - `connector`: the HTTP client `object_store` uses when signing needs the network.
//! - `error`: [`CacheError`], why a cache operation failed.

mod azure;
mod connector;
mod error;
mod gcs;
mod object;
mod s3;
mod store;
pub mod transfer;

pub use azure::AzureConfig;
pub use error::CacheError;
pub use gcs::{GcsConfig, GcsCredentials};
pub use object::object_name;
pub use s3::{Credentials, S3Config, ServerSideEncryption};
pub use store::{Store, StoreConfig};
