//! `Content-Range` / `Range` headers: the client's reading of a 416 reply's `Range: 0-N`
//! (`slipway_gitlab::range_end`).

use slipway_gitlab::range_end;

/// The input: a header value, or numbers formatted the way GitLab sends them.
#[derive(Debug, Clone, bolero::generator::TypeGenerator)]
pub enum Input {
    /// Any text.
    Raw(String),
    /// `start-end` with optional spaces and a prefix (`bytes `).
    Formed {
        /// Start.
        start: u64,
        /// End.
        end: u64,
        /// Add spaces around the numbers.
        spaced: bool,
        /// A prefix such as `bytes `.
        prefix: String,
    },
}

/// No panic; a well-formed `0-N` reads as `N`; whatever is read is the header's last number.
pub fn check(input: &Input) {
    match input {
        Input::Raw(value) => {
            if let Some(n) = range_end(value) {
                let last = value.trim().rsplit('-').next().unwrap_or_default().trim();
                assert_eq!(last.parse::<u64>().ok(), Some(n), "{value:?} read as {n}");
            }
        }
        Input::Formed {
            start,
            end,
            spaced,
            prefix,
        } => {
            let value = if *spaced {
                format!(" {prefix}{start} - {end} ")
            } else {
                format!("{prefix}{start}-{end}")
            };
            assert_eq!(range_end(&value), Some(*end), "{value:?}");
        }
    }
}
