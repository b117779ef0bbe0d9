//! The job trace: output chunks with masked variables replaced before anything leaves the executor.

use tokio::sync::mpsc;

/// Text that stands in for a masked value, everywhere Slipway hides one.
pub const MASK: &str = "[MASKED]";

/// Replaces secrets in a byte stream, also when one is split across chunks.
#[derive(Default)]
pub struct Masker {
    secrets: Vec<Vec<u8>>,
    pending: Vec<u8>,
}

impl std::fmt::Debug for Masker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Masker")
            .field("secrets", &self.secrets.len())
            .finish_non_exhaustive()
    }
}

impl Masker {
    /// A masker for these values; empty values are ignored.
    pub fn new<I, S>(secrets: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<[u8]>,
    {
        let mut secrets: Vec<Vec<u8>> = secrets
            .into_iter()
            .map(|s| s.as_ref().to_vec())
            .filter(|s| !s.is_empty())
            .collect();
        // Longest first, so a secret containing another is masked whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Masker {
            secrets,
            pending: Vec::new(),
        }
    }

    /// Feed a chunk; returns what is safe to emit now.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        if self.secrets.is_empty() {
            return chunk.to_vec();
        }
        self.pending.extend_from_slice(chunk);
        self.drain(false)
    }

    /// End of stream: emit whatever is held back.
    pub fn finish(&mut self) -> Vec<u8> {
        self.drain(true)
    }

    fn drain(&mut self, last: bool) -> Vec<u8> {
        let buf = std::mem::take(&mut self.pending);
        let mut out = Vec::with_capacity(buf.len());
        let mut i = 0;
        'scan: while i < buf.len() {
            let rest = &buf[i..];
            for s in &self.secrets {
                if rest.starts_with(s) {
                    out.extend_from_slice(MASK.as_bytes());
                    i += s.len();
                    continue 'scan;
                }
            }
            // The tail might be the start of a secret whose end has not arrived yet: hold it.
            if !last && self.secrets.iter().any(|s| s.starts_with(rest)) {
                self.pending = rest.to_vec();
                return out;
            }
            out.push(buf[i]);
            i += 1;
        }
        out
    }
}

/// Where a job's output goes: masked chunks on a channel the job source reads.
#[derive(Debug)]
pub struct Trace {
    masker: Masker,
    tx: mpsc::UnboundedSender<Vec<u8>>,
    /// The job's script (`step_script`: `before_script` and `script`) has been started.
    script_started: bool,
}

impl Trace {
    /// A trace that masks `secrets` and sends chunks on `tx`.
    pub fn new<I, S>(secrets: I, tx: mpsc::UnboundedSender<Vec<u8>>) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<[u8]>,
    {
        Trace {
            masker: Masker::new(secrets),
            tx,
            script_started: false,
        }
    }

    /// Note that the job's script is being started: from here on a failure of its instance
    /// may have left the script's effects half done, and the job is not run again elsewhere.
    pub fn mark_script_started(&mut self) {
        self.script_started = true;
    }

    /// Whether the job's script was started (see [`Trace::mark_script_started`]).
    pub fn script_started(&self) -> bool {
        self.script_started
    }

    /// Append output.
    pub fn write(&mut self, bytes: &[u8]) {
        let out = self.masker.push(bytes);
        if !out.is_empty() {
            // A closed receiver means nobody reads the trace any more; the job still runs.
            let _ = self.tx.send(out);
        }
    }

    /// Append a runner message line (not job output).
    pub fn message(&mut self, line: &str) {
        self.write(format!("{line}\n").as_bytes());
    }

    /// Flush held-back bytes at the end of the job.
    pub fn finish(&mut self) {
        let out = self.masker.finish();
        if !out.is_empty() {
            let _ = self.tx.send(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(secrets: &[&str], chunks: &[&str]) -> String {
        let mut m = Masker::new(secrets.iter().map(|s| s.as_bytes()));
        let mut out = Vec::new();
        for c in chunks {
            out.extend(m.push(c.as_bytes()));
        }
        out.extend(m.finish());
        String::from_utf8(out).unwrap_or_default()
    }

    #[test]
    fn masks_whole_secret() {
        assert_eq!(run(&["hunter22"], &["pw=hunter22!\n"]), "pw=[MASKED]!\n");
    }

    #[test]
    fn masks_secret_split_across_chunks() {
        assert_eq!(
            run(&["hunter22"], &["pw=hun", "ter", "22 ok"]),
            "pw=[MASKED] ok"
        );
        // Split one byte at a time.
        let text = "a hunter22 b";
        let chunks: Vec<String> = text.chars().map(|c| c.to_string()).collect();
        let refs: Vec<&str> = chunks.iter().map(String::as_str).collect();
        assert_eq!(run(&["hunter22"], &refs), "a [MASKED] b");
    }

    #[test]
    fn releases_a_false_prefix_at_the_end() {
        assert_eq!(run(&["hunter22"], &["x hunt"]), "x hunt");
        assert_eq!(run(&["hunter22"], &["x hunt", "ing"]), "x hunting");
    }

    #[test]
    fn prefers_the_longest_overlapping_secret() {
        assert_eq!(
            run(&["abc", "abcdef"], &["-abcdef-abc-"]),
            "-[MASKED]-[MASKED]-"
        );
    }

    #[test]
    fn passes_through_without_secrets() {
        assert_eq!(run(&[], &["a", "b"]), "ab");
    }
}
