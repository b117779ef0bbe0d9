//! What the runner API's answers carry besides their bodies, read once for traces and updates
//! alike (as GitLab Runner's `remote_job_state_response.go`): the `Job-Status` header, the
//! update interval, a 416's range, and the trace's checksum and size.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The job's state as GitLab reports it in the `Job-Status` response header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemoteJobState {
    /// No `Job-Status` header.
    Unknown,
    /// `running`.
    Running,
    /// `canceling`: cancel gracefully (run `after_script`, then stop).
    Canceling,
    /// `canceled`: stop now.
    Canceled,
    /// `failed`: stop now.
    Failed,
    /// Any other value, as sent.
    Other(String),
}

impl RemoteJobState {
    /// Reads a `Job-Status` header value.
    pub fn parse(value: Option<&str>) -> Self {
        match value.map(str::trim) {
            None | Some("") => Self::Unknown,
            Some("running") => Self::Running,
            Some("canceling") => Self::Canceling,
            Some("canceled") => Self::Canceled,
            Some("failed") => Self::Failed,
            Some(other) => Self::Other(other.to_string()),
        }
    }

    /// Whether the job must stop at once (`canceled`, `failed`).
    pub fn is_abort(&self) -> bool {
        matches!(self, Self::Canceled | Self::Failed)
    }
}

/// The end `N` of a 416 reply's `Range: 0-N` header (the bytes the server holds), if readable.
pub fn range_end(value: &str) -> Option<u64> {
    value.trim().rsplit('-').next()?.trim().parse::<u64>().ok()
}

/// An `X-GitLab-Trace-Update-Interval` header: whole seconds above 0.
pub fn update_interval(value: &str) -> Option<Duration> {
    value
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
}

/// The trace's checksum and size, sent with the final update (`output`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputInfo {
    /// `crc32:<8 hex digits>`.
    pub checksum: String,
    /// Trace size in bytes.
    pub bytesize: u64,
}

/// CRC-32 (IEEE, as Go's `hash/crc32.ChecksumIEEE`) of `data`.
pub fn crc32(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    let mut crc = !0u32;
    for b in data {
        crc = TABLE[((crc ^ u32::from(*b)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}
