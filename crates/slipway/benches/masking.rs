//! The job log's masker at job-output speed: 64 MiB of build-log text, in the chunk sizes a
//! job's pipe delivers (1–16 KiB), through the one streaming `Masker` with 100 masked values
//! and GitLab's default token prefixes and URL parameters, against an unmasked copy of the
//! same chunks (what a runner without masking does with them: copy each into the trace).
//!
//! Writes `bench/results/masking.json`. Run with `cargo bench -p slipway --bench masking`.

use std::time::Instant;

use slipway_job::trace::{DEFAULT_TOKEN_PREFIXES, MASK, Masker};
use slipway_testkit::bench::round3 as round;

const COMMAND: &str = "cargo bench -p slipway --bench masking";
/// Bytes of job output per run.
const INPUT: usize = 64 << 20;
/// Masked values (the figure).
const SECRETS: usize = 100;
/// Runs of each, interleaved; the median counts.
const RUNS: usize = 9;
/// The goal: masked throughput at least this share of the unmasked copy's.
const GOAL: f64 = 0.9;

/// xorshift64*: the same input on every machine, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

fn token(rng: &mut Rng, len: usize) -> String {
    (0..len)
        .map(|_| char::from(ALNUM[rng.below(ALNUM.len())]))
        .collect()
}

/// Build-log text: cargo, npm, test and git lines with paths, versions, hashes and URLs,
/// and now and then a secret, a token after a GitLab prefix or a signed URL.
fn job_output(rng: &mut Rng, secrets: &[String]) -> Vec<u8> {
    let crates = [
        "serde", "tokio", "hyper", "rustls", "clap", "regex", "zip", "tar",
    ];
    let words = [
        "warning: unused variable",
        "error[E0308]: mismatched types",
        "note: required by",
        "test result: ok.",
        "passed",
        "failed",
        "Downloading",
        "Fetching",
        "Resolving deltas",
        "npm WARN deprecated",
        "added 1312 packages in",
        "Step 4/12 : RUN make",
    ];
    let mut out = Vec::with_capacity(INPUT + 4096);
    let mut line = 0u64;
    while out.len() < INPUT {
        line += 1;
        let text = match rng.below(100) {
            0 => format!("export API_KEY={}\n", secrets[rng.below(secrets.len())]),
            1 => format!("remote: using token glpat-{}\n", token(rng, 20)),
            2 => format!(
                "GET https://bucket.s3.amazonaws.com/cache.zip?X-Amz-Credential={}&X-Amz-Signature={} 200\n",
                token(rng, 32),
                token(rng, 64)
            ),
            3..=40 => format!(
                "   Compiling {} v1.{}.{} (/builds/group/project/crates/{})\n",
                crates[rng.below(crates.len())],
                rng.below(40),
                rng.below(20),
                crates[rng.below(crates.len())]
            ),
            41..=60 => format!(
                "{} {:016x}{:016x} src/module_{}/file_{}.rs:{}:{}\n",
                words[rng.below(words.len())],
                rng.next(),
                rng.next(),
                rng.below(50),
                rng.below(500),
                rng.below(900),
                rng.below(80)
            ),
            _ => format!(
                "test tests::case_{line} ... ok ({}.{:03}s) {}\n",
                rng.below(10),
                rng.below(1000),
                words[rng.below(words.len())]
            ),
        };
        out.extend_from_slice(text.as_bytes());
    }
    out
}

/// The input cut where a pipe would cut it: 1–16 KiB chunks.
fn chunks<'a>(rng: &mut Rng, input: &'a [u8]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut rest = input;
    while !rest.is_empty() {
        let n = (1024 + rng.below(15 * 1024)).min(rest.len());
        let (head, tail) = rest.split_at(n);
        out.push(head);
        rest = tail;
    }
    out
}

/// MiB/s of `f` over the input, and its output's length.
fn throughput(input: usize, f: impl FnOnce() -> usize) -> (f64, usize) {
    let start = Instant::now();
    let len = f();
    let secs = start.elapsed().as_secs_f64();
    (input as f64 / secs / f64::from(1 << 20), len)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let mut rng = Rng(0x5eed_1234_abcd_0042);
    let secrets: Vec<String> = (0..SECRETS).map(|_| token(&mut rng, 24)).collect();
    let input = job_output(&mut rng, &secrets);
    let pieces = chunks(&mut rng, &input);
    let masker = Masker::with_prefixes(&secrets, DEFAULT_TOKEN_PREFIXES);

    // Check once that the masked stream is the masking, not a copy.
    let mut m = masker.clone();
    let mut masked = Vec::new();
    for p in &pieces {
        masked.extend(m.push(p));
    }
    masked.extend(m.finish());
    let text = String::from_utf8_lossy(&masked);
    anyhow::ensure!(text.contains(MASK), "nothing was masked");
    anyhow::ensure!(
        secrets.iter().all(|s| !text.contains(s.as_str())),
        "a secret is in the masked output"
    );
    anyhow::ensure!(!text.contains("X-Amz-Signature=A") && !text.contains("glpat-A"));

    let (mut copies, mut masks) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let (copy, _) = throughput(input.len(), || {
            // An unmasked trace: each chunk copied into the trace as it comes.
            let mut total = 0;
            for p in &pieces {
                let out = p.to_vec();
                total += std::hint::black_box(out).len();
            }
            total
        });
        let (mask, _) = throughput(input.len(), || {
            let mut m = masker.clone();
            let mut total = 0;
            for p in &pieces {
                total += std::hint::black_box(m.push(p)).len();
            }
            total + m.finish().len()
        });
        copies.push(copy);
        masks.push(mask);
    }
    let (copy, mask) = (median(copies), median(masks));
    let ratio = mask / copy;
    println!(
        "masking: {mask:.0} MiB/s masked ({SECRETS} secrets + {} prefixes), {copy:.0} MiB/s \
         unmasked copy: {ratio:.3}x (goal {GOAL}x)",
        DEFAULT_TOKEN_PREFIXES.len()
    );
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let (path, _) = slipway_testkit::bench::write(
        &repo,
        "masking",
        COMMAND,
        serde_json::json!({
            "input_mib": INPUT >> 20,
            "chunk_bytes": "1024-16383",
            "secrets": SECRETS,
            "token_prefixes": DEFAULT_TOKEN_PREFIXES.len(),
            "url_parameters": slipway_job::trace::URL_PARAMETERS.len(),
            "runs": RUNS,
            "masked_mib_per_s": round(mask),
            "unmasked_copy_mib_per_s": round(copy),
            "ratio": round(ratio),
            "goal_ratio": GOAL,
            "meets_goal": ratio >= GOAL,
        }),
    )?;
    println!("wrote {}", path.display());
    Ok(())
}
