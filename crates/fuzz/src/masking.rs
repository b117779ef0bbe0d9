//! The job log's masker (`slipway_job::Masker`): random secrets, random clear output around
//! them and random split points. No split reveals a secret, every split gives what one write
//! gives, and output without a secret comes out unchanged.

use slipway_job::Masker;

/// The bytes secrets are made of; clear output never uses them, nor `[`, `]` or the first
/// letters of token prefixes and URL parameters, so a secret in the output can only be one the
/// masker let through.
const SECRET_BYTES: &[u8] = b"abcd";
/// The bytes of clear output.
const CLEAR_BYTES: &[u8] = b"xyz \n-=.0123";

/// A generated case.
#[derive(Debug, Clone, bolero::generator::TypeGenerator)]
pub struct Input {
    /// Secrets, as indexes into [`SECRET_BYTES`] (3 to 12 of them each).
    pub secrets: Vec<Vec<u8>>,
    /// The output: clear text (indexes into [`CLEAR_BYTES`]) or one of the secrets.
    pub pieces: Vec<Piece>,
    /// Where the output is cut into writes (positions modulo its length).
    pub cuts: Vec<u16>,
}

/// One piece of output.
#[derive(Debug, Clone, bolero::generator::TypeGenerator)]
pub enum Piece {
    /// Clear text.
    Clear(Vec<u8>),
    /// The secret of this index (modulo their count).
    Secret(u8),
}

fn secrets_of(input: &Input) -> Vec<Vec<u8>> {
    input
        .secrets
        .iter()
        .map(|s| {
            s.iter()
                .take(12)
                .map(|b| SECRET_BYTES[usize::from(*b) % SECRET_BYTES.len()])
                .collect::<Vec<u8>>()
        })
        .filter(|s| s.len() >= 3)
        .take(16)
        .collect()
}

fn output_of(input: &Input, secrets: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in input.pieces.iter().take(64) {
        match p {
            Piece::Clear(b) => out.extend(
                b.iter()
                    .take(64)
                    .map(|b| CLEAR_BYTES[usize::from(*b) % CLEAR_BYTES.len()]),
            ),
            Piece::Secret(i) if !secrets.is_empty() => {
                out.extend_from_slice(&secrets[usize::from(*i) % secrets.len()]);
            }
            Piece::Secret(_) => {}
        }
    }
    out
}

/// `text` through a masker for `secrets`, in writes cut at `cuts`.
fn masked(secrets: &[Vec<u8>], text: &[u8], cuts: &[usize]) -> Vec<u8> {
    let mut m = Masker::new(secrets);
    let mut out = Vec::new();
    let mut at = 0;
    for &cut in cuts {
        out.extend(m.push(&text[at..cut]));
        at = cut;
    }
    out.extend(m.push(&text[at..]));
    out.extend(m.finish());
    out
}

/// The invariants above, for one case.
pub fn check(input: &Input) {
    let secrets = secrets_of(input);
    let text = output_of(input, &secrets);
    let whole = masked(&secrets, &text, &[]);
    let mut cuts: Vec<usize> = input
        .cuts
        .iter()
        .take(32)
        .map(|c| usize::from(*c) % (text.len() + 1))
        .collect();
    cuts.sort_unstable();
    let split = masked(&secrets, &text, &cuts);
    assert_eq!(
        String::from_utf8_lossy(&split),
        String::from_utf8_lossy(&whole),
        "cut at {cuts:?}"
    );
    for s in &secrets {
        assert!(
            !whole.windows(s.len()).any(|w| w == s.as_slice()),
            "{:?} revealed in {:?}",
            String::from_utf8_lossy(s),
            String::from_utf8_lossy(&whole)
        );
    }
    if !input.pieces.iter().any(|p| matches!(p, Piece::Secret(_))) || secrets.is_empty() {
        assert_eq!(whole, text, "clear output changed");
    }
}
