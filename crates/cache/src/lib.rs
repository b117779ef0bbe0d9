//! GitLab's distributed cache, as GitLab Runner lays it out, so the two share caches:
//!
//! - [`object_name`]: `<Path>/runner/<short token>/project/<id>/<key>` (no `runner/…` part when
//!   the cache is `Shared`), the object holding the cache's zip archive.
//! - [`S3`]: pre-signed GET and PUT URLs (AWS Signature Version 4, query parameters), so a
//!   transfer needs no credential: whoever holds the URL may do that one thing, for a while.
//! - [`transfer`]: the GET and PUT themselves.
//!
//! Private modules behind the first two (their items are re-exported here):
//!
//! - `object`: where a cache lives in the bucket: GitLab Runner's object names.
//! - `s3`: an S3 bucket as `[runners.cache.s3]` describes it, and its pre-signed URLs.
//! - `sigv4`: AWS Signature Version 4 with query parameters ([`presign`]), checked against the
//!   example AWS publishes for S3.
//! - `error`: [`CacheError`], why a cache operation failed.

mod error;
mod object;
mod s3;
mod sigv4;
pub mod transfer;

pub use error::CacheError;
pub use object::object_name;
pub use s3::{S3, S3Config, ServerSideEncryption};
pub use sigv4::{Credentials, Presign, presign};
