//! The artifact formats Slipway writes.

use std::fmt;

/// An artifact archive format, as GitLab's `artifact_format` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// `zip`: the default for `artifact_type: archive`.
    Zip,
    /// `gzip`: concatenated gzip members, used for reports (`junit`, ...).
    Gzip,
    /// `raw`: one file uploaded as it is (most security and quality reports).
    Raw,
    /// `tarzstd`: a Zstandard-compressed tar stream, for caches
    /// (`CACHE_COMPRESSION_FORMAT: tarzstd`).
    TarZstd,
}

impl Format {
    /// The format named by GitLab's `artifact_format` value (`zip`, `gzip`, `raw`); `None` for
    /// others (`zipzstd`, `tarzstd`, unknown).
    pub fn parse(name: &str) -> Option<Format> {
        match name {
            "zip" => Some(Format::Zip),
            "gzip" => Some(Format::Gzip),
            "raw" => Some(Format::Raw),
            _ => None,
        }
    }

    /// The cache format `CACHE_COMPRESSION_FORMAT` names: `zip` (also when empty) or
    /// `tarzstd`; `None` for others.
    pub fn cache(name: &str) -> Option<Format> {
        match name.trim().to_ascii_lowercase().as_str() {
            "" | "zip" => Some(Format::Zip),
            "tarzstd" => Some(Format::TarZstd),
            _ => None,
        }
    }

    /// [`Format::cache`], and for another name the warning for the job's trace (GitLab Runner
    /// takes any other value for zip).
    pub fn cache_named(value: &str) -> (Format, Option<String>) {
        match Format::cache(value) {
            Some(f) => (f, None),
            None => (
                Format::Zip,
                Some(format!(
                    "WARNING: CACHE_COMPRESSION_FORMAT {:?} is not zip or tarzstd; using zip",
                    shown(value)
                )),
            ),
        }
    }

    /// GitLab's name for the format.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Zip => "zip",
            Format::Gzip => "gzip",
            Format::Raw => "raw",
            Format::TarZstd => "tarzstd",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A job's value as a warning shows it: its first 64 characters (a variable can be long).
pub(crate) fn shown(value: &str) -> String {
    const MOST: usize = 64;
    match value.char_indices().nth(MOST) {
        Some((cut, _)) => format!("{}…", &value[..cut]),
        None => value.to_string(),
    }
}
