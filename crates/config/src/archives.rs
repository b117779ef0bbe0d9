//! `[runners.archives]`: how much an archive a job sent may expand to on the manager
//! (dependency artifacts, cache archives, collected artifacts). GitLab Runner has no such
//! section: its helper expands archives where the job runs, and Slipway's manager does it
//! for jobs whose host cannot.

use serde::Deserialize;

use slipway_artifacts::Limits;

use crate::problem::Report;

/// `[runners.archives]`; 0 turns a limit off.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct ArchivesConfig {
    /// Bytes one expansion may write (default 4 GiB).
    pub max_size: u64,
    /// Entries one archive may hold (default 1,000,000).
    pub max_entries: u64,
    /// Expanded size over archive size, past 64 MiB expanded (default 200).
    pub max_ratio: u64,
}

impl Default for ArchivesConfig {
    fn default() -> Self {
        let l = Limits::default();
        ArchivesConfig {
            max_size: l.max_size,
            max_entries: l.max_entries,
            max_ratio: l.max_ratio,
        }
    }
}

impl ArchivesConfig {
    /// The limits expansions are held to (0: none for that key).
    pub fn limits(&self) -> Limits {
        let off = |v: u64| if v == 0 { u64::MAX } else { v };
        Limits {
            max_size: off(self.max_size),
            max_entries: off(self.max_entries),
            max_ratio: self.max_ratio,
        }
    }

    /// A limit turned off is a warning: a job's archive can then fill the manager's disk.
    pub(crate) fn validate(&self, report: &mut Report<'_>) {
        for (key, value) in [
            ("max_size", self.max_size),
            ("max_entries", self.max_entries),
            ("max_ratio", self.max_ratio),
        ] {
            if value == 0 {
                report.warning(
                    &[key],
                    "0 turns this limit off: an archive a job sends can fill the manager's disk",
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_artifacts_crate_s_and_zero_is_no_limit() {
        assert_eq!(ArchivesConfig::default().limits(), Limits::default());
        let off = ArchivesConfig {
            max_size: 0,
            max_entries: 0,
            max_ratio: 0,
        };
        assert_eq!(off.limits(), Limits::NONE);
    }
}
