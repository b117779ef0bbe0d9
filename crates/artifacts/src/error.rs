//! The crate's error type. Paths in messages are the archive entry names (never file contents).

use std::io;

/// An error building or reading an artifacts archive.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactsError {
    /// A glob pattern cannot be used.
    #[error("invalid artifacts pattern {pattern:?}: {reason}")]
    Pattern {
        /// The pattern as given.
        pattern: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The executor's tar stream cannot be read.
    #[error("reading the tar stream: {0}")]
    Tar(#[source] io::Error),
    /// An entry name is absolute, escapes with `..`, or is not UTF-8.
    #[error("unsafe entry {path:?}: {reason}")]
    UnsafePath {
        /// The entry name as stored (lossily decoded).
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A tar hard link names a file that is not earlier in the stream.
    #[error("hard link {path:?} points to {target:?}, which is not an earlier file of the stream")]
    DanglingHardLink {
        /// The link.
        path: String,
        /// Its target.
        target: String,
    },
    /// A gzip artifact may only hold regular files (as GitLab Runner's gzip format).
    #[error("{path:?} is not a regular file: gzip artifacts hold only regular files")]
    NotRegularFile {
        /// The entry.
        path: String,
    },
    /// A raw artifact holds one file, and the paths matched more.
    #[error("raw artifacts hold one file, but the paths match {first:?} and {second:?} (at least)")]
    RawNeedsOneFile {
        /// The first file matched.
        first: String,
        /// Another file matched.
        second: String,
    },
    /// The zip archive cannot be written.
    #[error("writing the zip archive: {0}")]
    ZipWrite(#[source] io::Error),
    /// The downloaded zip archive is not a readable zip.
    #[error("invalid zip archive: {0}")]
    ZipRead(#[source] io::Error),
    /// One entry of the zip archive cannot be read.
    #[error("zip entry {path:?}: {source}")]
    ZipEntry {
        /// The entry name (lossily decoded).
        path: String,
        /// What went wrong.
        #[source]
        source: io::Error,
    },
    /// A file of the conversion cannot be opened, created or written.
    #[error("{}: {source}", path.display())]
    File {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Writing a gzip member or a tar entry failed.
    #[error("writing {what}: {source}")]
    Write {
        /// What was being written.
        what: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// What the archive expands to breaks a limit: nothing more of it is written.
    #[error("the archive is refused: {0}")]
    Limit(#[from] crate::limits::Exceeded),
}
