//! How much an archive may expand to: what the manager unpacks comes from jobs, and a small
//! zip can hold gigabytes. Checked while streaming, before the bytes are written.

/// Bounds on one expansion (an archive turned into files, or a job's collected files).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of file contents at most, in all entries together.
    pub max_size: u64,
    /// Entries (files, directories, symlinks) at most.
    pub max_entries: u64,
    /// Expanded bytes per archive byte at most, once past [`Limits::RATIO_FREE`] (0: no
    /// ratio limit).
    pub max_ratio: u64,
}

impl Limits {
    /// Default `max_size`: 4 GiB.
    pub const DEFAULT_MAX_SIZE: u64 = 4 << 30;
    /// Default `max_entries`: a million (a big `node_modules` holds a few hundred thousand).
    pub const DEFAULT_MAX_ENTRIES: u64 = 1_000_000;
    /// Default `max_ratio`: source trees and build outputs deflate 3–20×; a bomb 1000×.
    pub const DEFAULT_MAX_RATIO: u64 = 200;
    /// Expanded bytes below which the ratio is not checked (a tiny archive of zeros is fine).
    pub const RATIO_FREE: u64 = 64 << 20;

    /// No limit at all (for archives Slipway wrote itself).
    pub const NONE: Limits = Limits {
        max_size: u64::MAX,
        max_entries: u64::MAX,
        max_ratio: 0,
    };

    /// The error, if `size` bytes in `entries` entries from an archive of `archived` bytes
    /// break a limit.
    pub fn check(&self, size: u64, entries: u64, archived: u64) -> Result<(), Exceeded> {
        if size > self.max_size {
            return Err(Exceeded::Size {
                limit: self.max_size,
            });
        }
        if entries > self.max_entries {
            return Err(Exceeded::Entries {
                limit: self.max_entries,
            });
        }
        if self.max_ratio > 0 && size > Self::RATIO_FREE && size / archived.max(1) > self.max_ratio
        {
            return Err(Exceeded::Ratio {
                limit: self.max_ratio,
                archived,
                size,
            });
        }
        Ok(())
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_size: Self::DEFAULT_MAX_SIZE,
            max_entries: Self::DEFAULT_MAX_ENTRIES,
            max_ratio: Self::DEFAULT_MAX_RATIO,
        }
    }
}

/// Which limit an expansion broke (the message names the config key that sets it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Exceeded {
    /// More bytes than `max_size`.
    #[error("it expands to more than {limit} bytes ([runners.archives] max_size)")]
    Size {
        /// The limit.
        limit: u64,
    },
    /// More entries than `max_entries`.
    #[error("it holds more than {limit} entries ([runners.archives] max_entries)")]
    Entries {
        /// The limit.
        limit: u64,
    },
    /// Expanded more than `max_ratio` times its archive's size.
    #[error(
        "{archived} bytes expand to more than {size} bytes, over {limit} times their size \
         ([runners.archives] max_ratio): a zip bomb?"
    )]
    Ratio {
        /// The limit.
        limit: u64,
        /// The archive's size.
        archived: u64,
        /// Bytes expanded so far.
        size: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_limit_is_checked_and_named() {
        let l = Limits {
            max_size: 1000 << 20,
            max_entries: 10,
            max_ratio: 100,
        };
        assert_eq!(l.check(10, 10, 1), Ok(()));
        assert_eq!(
            l.check((1000 << 20) + 1, 1, 1 << 30),
            Err(Exceeded::Size { limit: 1000 << 20 })
        );
        assert_eq!(l.check(1, 11, 1), Err(Exceeded::Entries { limit: 10 }));
        // Below RATIO_FREE a high ratio is fine; above it, it is not.
        assert_eq!(l.check(Limits::RATIO_FREE, 1, 1), Ok(()));
        assert!(matches!(
            l.check(Limits::RATIO_FREE + 1, 1, 1 << 10),
            Err(Exceeded::Ratio { .. })
        ));
        assert_eq!(Limits::NONE.check(u64::MAX, u64::MAX, 0), Ok(()));
        assert!(
            Exceeded::Size { limit: 1 }
                .to_string()
                .contains("[runners.archives] max_size")
        );
    }
}
