//! Why a cache operation failed.

/// Why a cache operation failed. None of these fails a job: GitLab's rule is a warning.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A file of a transfer (the archive sent, or where the answer goes) cannot be used.
    #[error("{}: {source}", path.display())]
    File {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The key would leave the project's part of the bucket (`../`).
    #[error(
        "cache key {key:?}: computed cache path outside of the project's; remove \"../\" from the key"
    )]
    KeyOutsideProject {
        /// The key as given.
        key: String,
    },
    /// The settings cannot make a URL.
    #[error("[runners.cache.{section}] {key}: {reason}")]
    Config {
        /// The section: `s3`, `gcs` or `azure`.
        section: &'static str,
        /// The setting.
        key: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// No URL could be signed for the object.
    #[error("signing a URL for {object}: {message}")]
    Sign {
        /// The object's name.
        object: String,
        /// Why.
        message: String,
    },
    /// The request could not be sent or its answer not read.
    #[error("{method} {url}: {message}")]
    Network {
        /// GET or PUT.
        method: &'static str,
        /// The URL without its query (the signature).
        url: String,
        /// The transport's words.
        message: String,
    },
    /// The server answered with an unexpected status.
    #[error("{method} {url}: HTTP {status}: {body}")]
    Status {
        /// GET or PUT.
        method: &'static str,
        /// The URL without its query (the signature).
        url: String,
        /// The status.
        status: u16,
        /// The start of the answer.
        body: String,
    },
    /// The object is larger than what is read.
    #[error("GET {url}: the archive is larger than {limit} bytes")]
    TooLarge {
        /// The URL without its query.
        url: String,
        /// The limit.
        limit: usize,
    },
    /// No answer in time.
    #[error("{method} {url}: no answer within {seconds} s")]
    Timeout {
        /// GET or PUT.
        method: &'static str,
        /// The URL without its query.
        url: String,
        /// The timeout.
        seconds: u64,
    },
}
