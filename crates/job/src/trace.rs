//! The job trace: output chunks with masked variables replaced before anything leaves the executor.

use tokio::sync::mpsc;

/// Text that stands in for a masked value, everywhere Slipway hides one.
pub const MASK: &str = "[MASKED]";

/// GitLab's token prefixes, masked in every trace whatever the job payload lists: what follows
/// one of them (letters, digits, `-`, `_`, `.`, `=`) is a token.
pub const DEFAULT_TOKEN_PREFIXES: [&str; 17] = [
    "glpat-",
    "gloas-",
    "gldt-",
    "glrt-",
    "glrtr-",
    "glcbt-",
    "glptt-",
    "glft-",
    "glimt-",
    "glagent-",
    "glsoat-",
    "glffct-",
    "gltok-",
    "glwt-",
    "glsa-",
    "glcc-",
    "GR1348941",
];

/// URL query parameters whose values are credentials, as GitLab Runner's URL sanitizer masks
/// them (matched after `?` or `&`, names without regard to case).
pub const URL_PARAMETERS: [&str; 11] = [
    "private_token",
    "authenticity_token",
    "rss_token",
    "feed_token",
    "job_token",
    "X-Amz-Signature",
    "X-Amz-Credential",
    "X-Amz-Security-Token",
    "X-Goog-Signature",
    "X-Goog-Credential",
    "sig",
];

/// A byte of a token after its prefix (GitLab Runner's token sanitizer).
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'=')
}

/// A byte of a URL parameter's value: up to `&`, a quote, a bracket or white space.
fn is_param_byte(b: u8) -> bool {
    b.is_ascii_graphic()
        && !matches!(
            b,
            b'&' | b'"' | b'\'' | b'<' | b'>' | b'#' | b'`' | b'\\' | b')' | b']' | b'}'
        )
}

/// A masked value the masker is inside of (a token after its prefix, a URL parameter's
/// value), also when a write ends there.
#[derive(Debug, Clone, Copy)]
struct Skip {
    /// Whether a byte still belongs to the value.
    inside: fn(u8) -> bool,
    /// `[MASKED]` stands for it already.
    masked: bool,
}

/// The one masker of the house: replaces masked values, tokens after GitLab's prefixes and
/// credential URL parameters in a byte stream, whatever the chunks it arrives in.
///
/// State is kept across [`Masker::push`]es: a chunk that ends inside what may become a secret
/// is held back (at most the longest pattern's length), and a chunk that ends inside a token
/// or a parameter's value goes on masking it in the next one. So no split point reveals a
/// secret, and clear output comes out unchanged.
#[derive(Clone)]
pub struct Masker {
    /// Masked values, longest first.
    secrets: Vec<Vec<u8>>,
    /// Token prefixes, longest first.
    prefixes: Vec<Vec<u8>>,
    /// `name=` of the URL parameters, lower case.
    params: Vec<Vec<u8>>,
    /// `secrets` and `prefixes` by their first two bytes (see [`Index`]).
    secret_index: Index,
    prefix_index: Index,
    /// Whether a pattern may start with this pair of bytes (65,536 bits).
    pairs: Vec<u64>,
    /// Whether a pattern may start with this byte.
    first: [bool; 256],
    /// How far the scan may jump when a window of [`Masker::window`] bytes ends in this pair
    /// (Wu–Manber): no pattern can start before `shift` more bytes.
    shift: Vec<u8>,
    /// The shortest pattern's length (the scan's window); under 3 the scan goes byte by byte.
    window: usize,
    /// The longest pattern, in bytes (a parameter counts its `?` or `&`).
    longest: usize,
    pending: Vec<u8>,
    skip: Option<Skip>,
}

/// Patterns by their first two bytes, so a position where one may start is checked against
/// the few that start so, not all of them: `(pair, index)` sorted, indexes in the patterns'
/// own order (longest first); one-byte patterns apart.
#[derive(Clone, Debug, Default)]
struct Index {
    by_pair: Vec<(u16, u32)>,
    single: Vec<u32>,
}

impl Index {
    fn of(patterns: &[Vec<u8>]) -> Index {
        let mut index = Index::default();
        for (i, p) in patterns.iter().enumerate() {
            let i = u32::try_from(i).unwrap_or(u32::MAX);
            match p.as_slice() {
                [a, b, ..] => index.by_pair.push((pair(*a, *b), i)),
                _ => index.single.push(i),
            }
        }
        index.by_pair.sort_unstable();
        index
    }

    /// The first of `patterns` (longest first) that `rest` starts with.
    fn find<'p>(&self, patterns: &'p [Vec<u8>], rest: &[u8]) -> Option<&'p [u8]> {
        let hit = |&i: &u32| {
            let p = &patterns[i as usize];
            rest.starts_with(p).then_some(p.as_slice())
        };
        if let [a, b, ..] = rest {
            let key = pair(*a, *b);
            let from = self.by_pair.partition_point(|(k, _)| *k < key);
            let bucket = self.by_pair[from..].iter().take_while(|(k, _)| *k == key);
            if let Some(p) = bucket.map(|(_, i)| i).find_map(hit) {
                return Some(p);
            }
        }
        self.single.iter().find_map(hit)
    }
}

/// Two bytes as one table index.
fn pair(a: u8, b: u8) -> u16 {
    u16::from(a) << 8 | u16::from(b)
}

impl std::fmt::Debug for Masker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Masker")
            .field("secrets", &self.secrets.len())
            .field("prefixes", &self.prefixes.len())
            .finish_non_exhaustive()
    }
}

impl Default for Masker {
    fn default() -> Self {
        Masker::new(Vec::<Vec<u8>>::new())
    }
}

impl Masker {
    /// A masker for these values (empty ones are ignored), GitLab's default token prefixes and
    /// the credential URL parameters.
    pub fn new<I, S>(secrets: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<[u8]>,
    {
        Masker::with_prefixes(secrets, DEFAULT_TOKEN_PREFIXES)
    }

    /// The masker for `job`'s trace: its masked variables and token, GitLab's default token
    /// prefixes and those the job's payload lists (`features.token_mask_prefixes`).
    pub fn for_job(job: &crate::JobResponse) -> Self {
        let prefixes = DEFAULT_TOKEN_PREFIXES
            .iter()
            .map(|p| p.as_bytes().to_vec())
            .chain(
                job.features
                    .token_mask_prefixes
                    .iter()
                    .map(|p| p.as_bytes().to_vec()),
            );
        Masker::with_prefixes(job.masked_values(), prefixes)
    }

    /// A masker for `secrets` and these token `prefixes` (no default ones added).
    pub fn with_prefixes<I, S, P, Q>(secrets: I, prefixes: P) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<[u8]>,
        P: IntoIterator<Item = Q>,
        Q: AsRef<[u8]>,
    {
        fn sorted(mut v: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
            v.retain(|s| !s.is_empty());
            // Longest first, so a secret containing another is masked whole.
            v.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
            v.dedup();
            v
        }
        let secrets = sorted(secrets.into_iter().map(|s| s.as_ref().to_vec()).collect());
        let prefixes = sorted(prefixes.into_iter().map(|s| s.as_ref().to_vec()).collect());
        let params: Vec<Vec<u8>> = URL_PARAMETERS
            .iter()
            .map(|p| format!("{}=", p.to_ascii_lowercase()).into_bytes())
            .collect();
        let mut m = Masker {
            secret_index: Index::of(&secrets),
            prefix_index: Index::of(&prefixes),
            secrets,
            prefixes,
            params,
            pairs: vec![0; 1024],
            first: [false; 256],
            shift: Vec::new(),
            window: 0,
            longest: 0,
            pending: Vec::new(),
            skip: None,
        };
        // Every pattern a match may start with; in a parameter's, letters match either case.
        let mut starts: Vec<(Vec<u8>, bool)> = m
            .secrets
            .iter()
            .chain(&m.prefixes)
            .map(|p| (p.clone(), false))
            .collect();
        for p in &m.params {
            for sep in [b'?', b'&'] {
                let mut pat = vec![sep];
                pat.extend_from_slice(p);
                starts.push((pat, true));
            }
        }
        let cases = |b: u8, any_case: bool| {
            if any_case && b.is_ascii_alphabetic() {
                vec![b.to_ascii_lowercase(), b.to_ascii_uppercase()]
            } else {
                vec![b]
            }
        };
        m.window = (starts.iter().map(|(p, _)| p.len()).min().unwrap_or(0)).min(255);
        let window = m.window;
        m.shift = vec![u8::try_from(window.saturating_sub(1)).unwrap_or(0); 1 << 16];
        for (pat, any_case) in &starts {
            m.longest = m.longest.max(pat.len());
            for b in cases(pat[0], *any_case) {
                m.first[usize::from(b)] = true;
            }
            let seconds = match pat.get(1) {
                Some(&second) => cases(second, *any_case),
                // A one-byte pattern may start before any byte.
                None => (0..=u8::MAX).collect(),
            };
            for a in cases(pat[0], *any_case) {
                for &b in &seconds {
                    let bit = usize::from(pair(a, b));
                    m.pairs[bit / 64] |= 1 << (bit % 64);
                }
            }
            // Wu–Manber: a window ending in the pair at `j`, `j + 1` of a pattern may hold
            // that pattern starting `window - 2 - j` bytes later at the earliest.
            for j in 0..window.saturating_sub(1) {
                for a in cases(pat[j], *any_case) {
                    for b in cases(pat[j + 1], *any_case) {
                        let s = &mut m.shift[usize::from(pair(a, b))];
                        *s = (*s).min(u8::try_from(window - 2 - j).unwrap_or(u8::MAX));
                    }
                }
            }
        }
        m
    }

    /// Feed a chunk; returns what is safe to emit now.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        if self.pending.is_empty() {
            self.scan(chunk, false)
        } else {
            let mut buf = std::mem::take(&mut self.pending);
            buf.extend_from_slice(chunk);
            self.scan(&buf, false)
        }
    }

    /// End of stream: emit whatever is held back, masked.
    pub fn finish(&mut self) -> Vec<u8> {
        let buf = std::mem::take(&mut self.pending);
        let out = self.scan(&buf, true);
        self.skip = None;
        out
    }

    /// Bytes held back until the next chunk shows whether they start a secret.
    pub fn held(&self) -> usize {
        self.pending.len()
    }

    /// Whether a pattern may start at `i` (a cheap test before the exact ones).
    fn may_start(&self, buf: &[u8], i: usize) -> bool {
        match buf.get(i + 1) {
            Some(&second) => {
                let bit = usize::from(pair(buf[i], second));
                self.pairs[bit / 64] & (1 << (bit % 64)) != 0
            }
            None => self.first[usize::from(buf[i])],
        }
    }

    /// The first position from `i` where a pattern may start (`buf.len()` when none): plain
    /// text is skipped a window at a time, then the last bytes one by one.
    fn next_start(&self, buf: &[u8], mut i: usize) -> usize {
        let m = self.window;
        if m >= 3 {
            while i + m <= buf.len() {
                let e = i + m - 1;
                match self.shift[usize::from(pair(buf[e - 1], buf[e]))] {
                    0 if self.may_start(buf, i) => return i,
                    0 => i += 1,
                    s => i += usize::from(s),
                }
            }
        }
        (i..buf.len())
            .find(|&j| self.may_start(buf, j))
            .unwrap_or(buf.len())
    }

    /// Whether `rest` is the unfinished start of a pattern: more bytes could make it one.
    fn could_grow(&self, rest: &[u8]) -> bool {
        let grows = |p: &[u8]| p.len() > rest.len() && p.starts_with(rest);
        if self.secrets.iter().any(|s| grows(s)) || self.prefixes.iter().any(|p| grows(p)) {
            return true;
        }
        match rest.split_first() {
            Some((b'?' | b'&', name)) => self
                .params
                .iter()
                .any(|p| p.len() > name.len() && p[..name.len()].eq_ignore_ascii_case(name)),
            _ => false,
        }
    }

    /// The credential parameter `?name=` or `&name=` at the start of `rest`: its length.
    fn param_at(&self, rest: &[u8]) -> Option<usize> {
        let (sep, name) = rest.split_first()?;
        if !matches!(sep, b'?' | b'&') {
            return None;
        }
        self.params
            .iter()
            .find(|p| name.len() >= p.len() && name[..p.len()].eq_ignore_ascii_case(p))
            .map(|p| p.len() + 1)
    }

    fn scan(&mut self, buf: &[u8], last: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(buf.len());
        let mut i = 0;
        while i < buf.len() {
            // Inside a token or a parameter's value: drop it, `[MASKED]` once in its place.
            if let Some(skip) = &mut self.skip {
                let end = buf[i..]
                    .iter()
                    .position(|b| !(skip.inside)(*b))
                    .map_or(buf.len(), |n| i + n);
                if end > i && !skip.masked {
                    out.extend_from_slice(MASK.as_bytes());
                    skip.masked = true;
                }
                i = end;
                if i < buf.len() {
                    self.skip = None;
                }
                continue;
            }
            // Plain bytes up to where a pattern may start, copied at once.
            let next = self.next_start(buf, i);
            out.extend_from_slice(&buf[i..next]);
            i = next;
            if i == buf.len() {
                break;
            }
            let rest = &buf[i..];
            if !last && rest.len() < self.longest && self.could_grow(rest) {
                self.pending = rest.to_vec();
                return out;
            }
            if let Some(s) = self.secret_index.find(&self.secrets, rest) {
                out.extend_from_slice(MASK.as_bytes());
                i += s.len();
            } else if let Some(p) = self.prefix_index.find(&self.prefixes, rest) {
                out.extend_from_slice(p);
                i += p.len();
                self.skip = Some(Skip {
                    inside: is_token_byte,
                    masked: false,
                });
            } else if let Some(n) = self.param_at(rest) {
                out.extend_from_slice(&rest[..n]);
                i += n;
                self.skip = Some(Skip {
                    inside: is_param_byte,
                    masked: false,
                });
            } else {
                out.push(buf[i]);
                i += 1;
            }
        }
        out
    }
}

/// `text` with every one of `secrets` replaced by [`MASK`], longest first, as a trace masks
/// them: for messages and pages that show a whole string at once.
pub fn mask_text<S: AsRef<[u8]>>(text: &str, secrets: &[S]) -> String {
    let mut m = Masker::new(secrets.iter().map(AsRef::as_ref));
    let mut out = m.push(text.as_bytes());
    out.extend(m.finish());
    String::from_utf8_lossy(&out).into_owned()
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
    /// A trace that masks `secrets` (and GitLab's default token prefixes) and sends chunks on
    /// `tx`.
    pub fn new<I, S>(secrets: I, tx: mpsc::UnboundedSender<Vec<u8>>) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<[u8]>,
    {
        Trace::with_masker(Masker::new(secrets), tx)
    }

    /// `job`'s trace: masked with [`Masker::for_job`], sent on `tx`.
    pub fn for_job(job: &crate::JobResponse, tx: mpsc::UnboundedSender<Vec<u8>>) -> Self {
        Trace::with_masker(Masker::for_job(job), tx)
    }

    /// A trace that masks with `masker` and sends chunks on `tx`.
    pub fn with_masker(masker: Masker, tx: mpsc::UnboundedSender<Vec<u8>>) -> Self {
        Trace {
            masker,
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

    /// The window skip and the pair index find what a byte-by-byte scan over every pattern
    /// finds: text full of near misses (secrets' first bytes, prefixes without their dash,
    /// parameters in mixed case) masks the same either way, whole and cut in pieces.
    #[test]
    fn the_skipping_scan_masks_what_a_byte_by_byte_scan_masks() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        let secrets: Vec<String> = (0..40)
            .map(|i| format!("s{i}cr{}t-{}", i * 7, "x".repeat(i % 5)))
            .collect();
        let bits = [
            "s1",
            "s1cr7t",
            "glpat",
            "glpat-",
            "GR134",
            "GR1348941",
            "?private",
            "&X-AMZ-SIGNATURE=",
            "?x-amz-credential=",
            "&Sig=",
            " ",
            "\n",
            "=",
            "abc",
            "zz",
            "z",
            "a",
            "-",
            "https://h/p",
        ];
        for _ in 0..300 {
            let mut text = String::new();
            for _ in 0..next(60) {
                match next(3) {
                    0 => text.push_str(&secrets[next(secrets.len())]),
                    1 => text.push_str(bits[next(bits.len())]),
                    _ => text.push_str(&"qwertyuiop".repeat(next(3))),
                }
            }
            let masker = Masker::new(&secrets);
            assert_eq!(masker.window, 5, "the skip is on");
            let mut plain = masker.clone();
            plain.window = 0;
            let one = |m: &mut Masker| {
                let mut out = m.push(text.as_bytes());
                out.extend(m.finish());
                out
            };
            let (skipping, reference) = (one(&mut masker.clone()), one(&mut plain));
            assert_eq!(
                String::from_utf8_lossy(&skipping),
                String::from_utf8_lossy(&reference),
                "{text:?}"
            );
            let mut cut = masker.clone();
            let mut out = Vec::new();
            let mut at = 0;
            while at < text.len() {
                let end = (at + 1 + next(7)).min(text.len());
                out.extend(cut.push(&text.as_bytes()[at..end]));
                at = end;
            }
            out.extend(cut.finish());
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&reference),
                "{text:?}"
            );
        }
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

    /// Every way of cutting `text` in two and in three gives `want`.
    fn every_split(secrets: &[&str], prefixes: &[&str], text: &str, want: &str) {
        let bytes = text.as_bytes();
        for a in 0..=bytes.len() {
            for b in a..=bytes.len() {
                let mut m = Masker::with_prefixes(secrets.iter(), prefixes.iter());
                let mut out = m.push(&bytes[..a]);
                out.extend(m.push(&bytes[a..b]));
                out.extend(m.push(&bytes[b..]));
                out.extend(m.finish());
                assert_eq!(String::from_utf8_lossy(&out), want, "split at {a} and {b}");
            }
        }
    }

    #[test]
    fn a_token_split_by_a_write_is_masked_whole() {
        every_split(
            &[],
            &["glpat-"],
            "t=glpat-SECRETTOKENVALUE done",
            "t=glpat-[MASKED] done",
        );
        // The case: `glpat-SECRET`, a pause, then `TOKENVALUE`.
        let mut m = Masker::new(Vec::<&str>::new());
        let mut out = m.push(b"glpat-SECRET");
        out.extend(m.push(b"TOKENVALUE\n"));
        out.extend(m.finish());
        assert_eq!(String::from_utf8_lossy(&out), "glpat-[MASKED]\n");
    }

    #[test]
    fn a_short_secret_that_starts_a_long_one_does_not_reveal_its_tail() {
        every_split(
            &["XYZsecret", "XYZsecretTail"],
            &[],
            "split=XYZsecretTail and XYZsecret.",
            "split=[MASKED] and [MASKED].",
        );
    }

    #[test]
    fn default_prefixes_are_masked_without_a_payload() {
        assert_eq!(
            run(&[], &["a glrt-t2_abc b gldt-x"]),
            "a glrt-[MASKED] b gldt-[MASKED]"
        );
    }

    #[test]
    fn credential_url_parameters_are_masked() {
        every_split(
            &[],
            &[],
            "GET https://s3/b/k?X-Amz-Credential=AKIA%2F1&x-amz-signature=abc123&ok=1 done",
            "GET https://s3/b/k?X-Amz-Credential=[MASKED]&x-amz-signature=[MASKED]&ok=1 done",
        );
        assert_eq!(
            run(&[], &["/api/v4/projects?private_token=tok&page=2"]),
            "/api/v4/projects?private_token=[MASKED]&page=2"
        );
    }

    #[test]
    fn clear_text_near_patterns_is_unchanged() {
        every_split(
            &["hunter22"],
            &["glpat-"],
            "hunt glpat hunter2 ?sig &x=1 gl",
            "hunt glpat hunter2 ?sig &x=1 gl",
        );
    }

    #[test]
    fn held_bytes_are_bounded_by_the_longest_pattern() {
        let mut m = Masker::new(["0123456789"]);
        for _ in 0..1000 {
            let _ = m.push(b"012345678");
            assert!(m.held() < 32, "held {}", m.held());
        }
    }

    #[test]
    fn a_job_masks_its_payload_prefixes_and_variables() {
        let job: crate::JobResponse = serde_json::from_value(serde_json::json!({
            "id": 1, "token": "job-token-123",
            "variables": [{"key": "PW", "value": "pa55word", "masked": true}],
            "features": {"token_mask_prefixes": ["mytok_"]}
        }))
        .unwrap_or_default();
        let mut m = Masker::for_job(&job);
        let mut out = m.push(b"pa55word mytok_abc job-token-123 glpat-q");
        out.extend(m.finish());
        assert_eq!(
            String::from_utf8_lossy(&out),
            "[MASKED] mytok_[MASKED] [MASKED] glpat-[MASKED]"
        );
    }
}
