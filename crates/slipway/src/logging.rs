//! The manager's log format: `tracing`'s, with every field value quoted, so a job name, a
//! branch or an error text that a job chose cannot forge a log line or drive the terminal.

use std::fmt::{self, Write as _};

use tracing_subscriber::field::MakeExt as _;
use tracing_subscriber::fmt::format::{FormatFields, Writer};

/// Format fields as `tracing`'s default does (`message`, then `key=value`), with control
/// characters and bidirectional overrides written as escapes (`\n`, `\u{1b}`).
pub fn fields() -> impl for<'w> FormatFields<'w> + Send + Sync + 'static {
    tracing_subscriber::fmt::format::debug_fn(|w: &mut Writer<'_>, field, value| {
        if field.name() != "message" {
            write!(w, "{}=", field.name())?;
        }
        // Escaped as it is written: no copy of the value per field.
        write!(Quoting(w), "{value:?}")
    })
    .delimited(" ")
}

/// Set up logging at `level` (an `EnvFilter` directive; `RUST_LOG` first).
pub fn init(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // Colours only for a person watching: logs piped to a file or journal stay plain text.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .fmt_fields(fields())
        // stderr, or through `slipway exec`'s live lines while they are drawn.
        .with_writer(|| crate::progress::LogWriter)
        .init();
}

/// Whether `c` may not reach a log as itself: it would end the line, move the cursor, change
/// colours or reorder what a reader sees.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A writer that passes text on with [`needs_escape`] characters as escapes.
struct Quoting<W>(W);

impl<W: fmt::Write> fmt::Write for Quoting<W> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        for c in text.chars() {
            if needs_escape(c) {
                write!(self.0, "{}", c.escape_default())?;
            } else {
                self.0.write_char(c)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What one warning with a job-chosen `name` logs, as the binary's format writes it.
    fn logged(name: &str) -> String {
        let buf = Buffer::default();
        let out = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .fmt_fields(fields())
            .with_writer(move || out.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(job = %name, "job {name} failed");
        });
        let text = buf.0.lock().unwrap().clone();
        String::from_utf8(text).unwrap()
    }

    #[test]
    fn a_job_name_cannot_forge_a_log_line_or_send_escape_codes() {
        let text = logged("x\n2026-11-29T00:00:00Z ERROR forged\r\u{1b}[2J\u{202e}");
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(!text.contains('\u{1b}') && !text.contains('\r'), "{text:?}");
        assert!(!text.contains('\u{202e}'), "{text:?}");
        assert!(
            text.contains(r"job x\n2026-11-29T00:00:00Z ERROR forged\r\u{1b}[2J\u{202e} failed"),
            "{text}"
        );
        assert!(text.contains(r"job=x\n2026"), "{text}");
    }

    #[test]
    fn plain_fields_read_as_before() {
        let text = logged("build-job: ünïcode ok");
        assert!(
            text.trim_end()
                .ends_with("job build-job: ünïcode ok failed job=build-job: ünïcode ok"),
            "{text}"
        );
    }
}
