//! Structured mutation of seed files: random bytes alone never get deep into YAML, TOML or
//! JSON, so each input picks a seed and a few edits (bytes, dictionary tokens, whole lines).

use bolero::generator::TypeGenerator;

/// A seed (by index, modulo the number of seeds) and the edits applied to it.
#[derive(Debug, Clone, TypeGenerator)]
pub struct Mutated {
    /// Which seed.
    pub seed: u16,
    /// Edits, applied in order (at most [`MAX_EDITS`]).
    pub edits: Vec<Edit>,
    /// A flag a target may use (e.g. `allow_unsupported`).
    pub flag: bool,
}

/// At most this many edits are applied.
pub const MAX_EDITS: usize = 8;

/// One edit; positions are taken modulo the text's length (or line count).
#[derive(Debug, Clone, TypeGenerator)]
pub enum Edit {
    /// Overwrite one byte.
    Byte {
        /// Position.
        at: u32,
        /// New value.
        value: u8,
    },
    /// Insert a dictionary token.
    Token {
        /// Position.
        at: u32,
        /// Token index (modulo the dictionary).
        token: u16,
    },
    /// Insert raw bytes.
    Bytes {
        /// Position.
        at: u32,
        /// What.
        bytes: Vec<u8>,
    },
    /// Delete a run of bytes.
    Delete {
        /// Position.
        at: u32,
        /// How many.
        len: u8,
    },
    /// Delete a line.
    DeleteLine {
        /// Line.
        line: u16,
    },
    /// Copy a line elsewhere.
    CopyLine {
        /// Line.
        line: u16,
        /// Before this line.
        to: u16,
    },
    /// Copy a line of another seed in.
    SpliceLine {
        /// Other seed.
        seed: u16,
        /// Its line.
        line: u16,
        /// Before this line.
        to: u16,
    },
    /// Change a line's indentation.
    Indent {
        /// Line.
        line: u16,
        /// Spaces added (positive) or removed.
        delta: i8,
    },
    /// Replace a line's value part (after the first `: `) with a token.
    Value {
        /// Line.
        line: u16,
        /// Token index.
        token: u16,
    },
    /// Cut the text here.
    Truncate {
        /// Position.
        at: u32,
    },
}

fn split_lines(text: &[u8]) -> Vec<Vec<u8>> {
    text.split(|b| *b == b'\n').map(<[u8]>::to_vec).collect()
}

fn join_lines(lines: &[Vec<u8>]) -> Vec<u8> {
    lines.join(&b'\n')
}

fn pos(at: u32, len: usize) -> usize {
    if len == 0 { 0 } else { at as usize % (len + 1) }
}

fn idx(i: u16, len: usize) -> Option<usize> {
    (len > 0).then(|| usize::from(i) % len)
}

/// `seeds[m.seed]` with `m.edits` applied; tokens come from `dict`.
pub fn apply(seeds: &[&[u8]], dict: &[&str], m: &Mutated) -> Vec<u8> {
    let Some(s) = idx(m.seed, seeds.len()) else {
        return Vec::new();
    };
    let mut text = seeds[s].to_vec();
    let token = |t: u16| -> &[u8] {
        match idx(t, dict.len()) {
            Some(i) => dict[i].as_bytes(),
            None => b"",
        }
    };
    for edit in m.edits.iter().take(MAX_EDITS) {
        match edit {
            Edit::Byte { at, value } => {
                if !text.is_empty() {
                    let i = *at as usize % text.len();
                    text[i] = *value;
                }
            }
            Edit::Token { at, token: t } => {
                let i = pos(*at, text.len());
                text.splice(i..i, token(*t).iter().copied());
            }
            Edit::Bytes { at, bytes } => {
                let i = pos(*at, text.len());
                text.splice(i..i, bytes.iter().take(64).copied());
            }
            Edit::Delete { at, len } => {
                let i = pos(*at, text.len());
                let end = (i + usize::from(*len)).min(text.len());
                text.drain(i..end);
            }
            Edit::DeleteLine { line } => {
                let mut lines = split_lines(&text);
                if let Some(l) = idx(*line, lines.len()) {
                    lines.remove(l);
                }
                text = join_lines(&lines);
            }
            Edit::CopyLine { line, to } => {
                let mut lines = split_lines(&text);
                if let (Some(l), Some(t)) = (idx(*line, lines.len()), idx(*to, lines.len())) {
                    let copy = lines[l].clone();
                    lines.insert(t, copy);
                }
                text = join_lines(&lines);
            }
            Edit::SpliceLine { seed, line, to } => {
                let mut lines = split_lines(&text);
                if let Some(o) = idx(*seed, seeds.len()) {
                    let other = split_lines(seeds[o]);
                    if let (Some(l), Some(t)) = (idx(*line, other.len()), idx(*to, lines.len())) {
                        lines.insert(t, other[l].clone());
                    }
                }
                text = join_lines(&lines);
            }
            Edit::Indent { line, delta } => {
                let mut lines = split_lines(&text);
                if let Some(l) = idx(*line, lines.len()) {
                    let d = usize::from(delta.unsigned_abs() % 9);
                    if *delta >= 0 {
                        lines[l].splice(0..0, std::iter::repeat_n(b' ', d));
                    } else {
                        let n = lines[l].iter().take(d).take_while(|b| **b == b' ').count();
                        lines[l].drain(..n);
                    }
                }
                text = join_lines(&lines);
            }
            Edit::Value { line, token: t } => {
                let mut lines = split_lines(&text);
                if let Some(l) = idx(*line, lines.len()) {
                    let cut = lines[l]
                        .windows(2)
                        .position(|w| w == b": ")
                        .map_or(lines[l].len(), |p| p + 2);
                    lines[l].truncate(cut);
                    lines[l].extend_from_slice(token(*t));
                }
                text = join_lines(&lines);
            }
            Edit::Truncate { at } => {
                let i = pos(*at, text.len());
                text.truncate(i);
            }
        }
    }
    text
}

/// Reads every file under `dir` whose name satisfies `pick`, sorted by path.
pub fn read_seeds(
    dir: &std::path::Path,
    pick: &dyn Fn(&str) -> bool,
) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().and_then(|n| n.to_str()).is_some_and(pick)
                && let Ok(bytes) = std::fs::read(&p)
            {
                out.push((p, bytes));
            }
        }
    }
    out.sort();
    out
}

/// The workspace root (seeds are read from the other crates' test files).
pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}
