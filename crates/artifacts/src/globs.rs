//! Doublestar globs as GitLab uses them for `artifacts:paths` and `artifacts:exclude`.
//!
//! Patterns are relative to the project directory. `*` matches within one path segment, `**`
//! (a whole segment) matches any number of segments including none, `?` one character, `[abc]`,
//! `[a-z]` and `[!abc]`/`[^abc]` one character of (or not of) a set, `{a,b}` either alternative,
//! and `\` escapes the next character. For `artifacts:paths` ([`Globs::is_match`]) a pattern
//! that matches a directory matches everything under it, so `out/` (or `out`) selects the
//! whole directory. `artifacts:exclude` ([`Globs::matches_exactly`]) is not recursive, as in
//! GitLab: `out/tmp` removes only that entry, `out/tmp/**` everything below it too.

use crate::ArtifactsError;

/// Most patterns one `{a,b}` expansion may produce (guards against `{a,b}{c,d}...` blow-ups).
const MAX_EXPANSIONS: usize = 1024;

/// A set of doublestar globs relative to the project directory.
#[derive(Clone, Debug, Default)]
pub struct Globs {
    patterns: Vec<Pattern>,
}

/// One parsed pattern: its segments, `**` runs collapsed.
#[derive(Clone, Debug)]
struct Pattern {
    segments: Vec<Segment>,
}

#[derive(Clone, Debug, PartialEq)]
enum Segment {
    /// `**`: any number of segments.
    AnyDepth,
    /// A segment without wildcards.
    Literal(String),
    /// A segment with `*`, `?` or classes.
    Wild(Vec<Token>),
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Char(char),
    /// `*`
    Star,
    /// `?`
    One,
    /// `[...]`
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

impl Globs {
    /// Parses `patterns`; fails on an absolute pattern, one leaving the project with `..`, an
    /// unclosed `[` or `{`, or a trailing `\`.
    pub fn new(patterns: &[String]) -> Result<Globs, ArtifactsError> {
        let mut parsed = Vec::new();
        for source in patterns {
            let err = |reason: &str| ArtifactsError::Pattern {
                pattern: source.clone(),
                reason: reason.into(),
            };
            let mut expanded = Vec::new();
            expand_braces(source, &mut expanded).map_err(err)?;
            for alternative in expanded {
                parsed.push(Pattern::parse(&alternative).map_err(err)?);
            }
        }
        Ok(Globs { patterns: parsed })
    }

    /// Whether `path` (relative, `/`-separated, a leading `./` allowed) or one of its parent
    /// directories matches a pattern.
    pub fn is_match(&self, path: &str) -> bool {
        let segments: Vec<&str> = split(path).collect();
        self.patterns.iter().any(|p| {
            // Empty pattern (`.`): the project directory itself, hence everything.
            p.segments.is_empty()
                || (1..=segments.len()).any(|k| match_segments(&p.segments, &segments[..k]))
        })
    }

    /// Whether `path` itself matches a pattern, its parent directories not considered: how
    /// GitLab Runner applies `artifacts:exclude` to every file and directory it walks, so
    /// excluding `out` (or `out/`) removes the directory's own entry but not its files, and
    /// `out/**` removes both.
    pub fn matches_exactly(&self, path: &str) -> bool {
        let segments: Vec<&str> = split(path).collect();
        self.patterns
            .iter()
            .any(|p| match_segments(&p.segments, &segments))
    }

    /// Whether there are no patterns (nothing matches).
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }
}

/// The non-empty segments of a path, `.` segments dropped.
fn split(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter(|s| !s.is_empty() && *s != ".")
}

impl Pattern {
    fn parse(pattern: &str) -> Result<Pattern, &'static str> {
        if pattern.starts_with('/') {
            return Err("must be relative to the project directory");
        }
        let mut segments = Vec::new();
        for raw in split(pattern) {
            let segment = if raw == "**" {
                Segment::AnyDepth
            } else if raw == ".." {
                return Err("must not leave the project directory with `..`");
            } else {
                parse_segment(raw)?
            };
            // `**/**` means the same as `**`; collapsing keeps matching linear.
            if segment == Segment::AnyDepth && segments.last() == Some(&Segment::AnyDepth) {
                continue;
            }
            segments.push(segment);
        }
        Ok(Pattern { segments })
    }
}

/// Expands the first top-level `{a,b}` group of `pattern` recursively into `out`.
fn expand_braces(pattern: &str, out: &mut Vec<String>) -> Result<(), &'static str> {
    let chars: Vec<char> = pattern.chars().collect();
    let Some(open) = find_unescaped(&chars, 0, |c| c == '{') else {
        if find_unescaped(&chars, 0, |c| c == '}').is_some() {
            return Err("unmatched `}`");
        }
        if out.len() >= MAX_EXPANSIONS {
            return Err("too many `{...}` alternatives");
        }
        out.push(pattern.to_string());
        return Ok(());
    };
    // Find the matching close brace and the top-level commas in between.
    let mut depth = 0usize;
    let mut commas = Vec::new();
    let mut close = None;
    let mut i = open;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 1,
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    close = Some(i);
                    break;
                }
            }
            ',' if depth == 1 => commas.push(i),
            _ => {}
        }
        i += 1;
    }
    let close = close.ok_or("unclosed `{`")?;
    let prefix: String = chars[..open].iter().collect();
    let suffix: String = chars[close + 1..].iter().collect();
    let mut start = open + 1;
    for end in commas.into_iter().chain(std::iter::once(close)) {
        let alternative: String = chars[start..end].iter().collect();
        expand_braces(&format!("{prefix}{alternative}{suffix}"), out)?;
        start = end + 1;
    }
    Ok(())
}

/// Index of the first character from `from` matching `pred` that is not escaped by `\`.
fn find_unescaped(chars: &[char], from: usize, pred: impl Fn(char) -> bool) -> Option<usize> {
    let mut i = from;
    while i < chars.len() {
        if chars[i] == '\\' {
            i += 2;
            continue;
        }
        if pred(chars[i]) {
            return Some(i);
        }
        i += 1;
    }
    None
}

fn parse_segment(raw: &str) -> Result<Segment, &'static str> {
    let mut tokens = Vec::new();
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        let token = match c {
            '\\' => Token::Char(chars.next().ok_or("ends with a lone `\\`")?),
            '*' => {
                // `a**b` inside a segment is just `*` (as doublestar treats it).
                if tokens.last() == Some(&Token::Star) {
                    continue;
                }
                Token::Star
            }
            '?' => Token::One,
            '[' => {
                let negated = matches!(chars.peek(), Some('!' | '^'));
                if negated {
                    chars.next();
                }
                let mut ranges = Vec::new();
                loop {
                    let lo = match chars.next().ok_or("unclosed `[`")? {
                        ']' if !ranges.is_empty() => break,
                        ']' => return Err("empty `[]`"),
                        '\\' => chars.next().ok_or("unclosed `[`")?,
                        c => c,
                    };
                    let hi = if chars.peek() == Some(&'-') {
                        chars.next();
                        match chars.next().ok_or("unclosed `[`")? {
                            '\\' => chars.next().ok_or("unclosed `[`")?,
                            ']' => return Err("range in `[...]` without an end"),
                            c => c,
                        }
                    } else {
                        lo
                    };
                    if hi < lo {
                        return Err("reversed range in `[...]`");
                    }
                    ranges.push((lo, hi));
                }
                Token::Class { negated, ranges }
            }
            c => Token::Char(c),
        };
        tokens.push(token);
    }
    if tokens.iter().all(|t| matches!(t, Token::Char(_))) {
        let literal = tokens
            .iter()
            .filter_map(|t| match t {
                Token::Char(c) => Some(*c),
                _ => None,
            })
            .collect();
        Ok(Segment::Literal(literal))
    } else {
        Ok(Segment::Wild(tokens))
    }
}

/// Whether the pattern segments match exactly these path segments.
fn match_segments(pattern: &[Segment], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((Segment::AnyDepth, rest)) => {
            (0..=path.len()).any(|skip| match_segments(rest, &path[skip..]))
        }
        Some((segment, rest)) => match path.split_first() {
            Some((first, others)) => match_segment(segment, first) && match_segments(rest, others),
            None => false,
        },
    }
}

fn match_segment(segment: &Segment, name: &str) -> bool {
    match segment {
        Segment::AnyDepth => true,
        Segment::Literal(literal) => literal == name,
        Segment::Wild(tokens) => {
            let name: Vec<char> = name.chars().collect();
            match_tokens(tokens, &name)
        }
    }
}

/// Wildcard matching with single-star backtracking (linear in practice).
fn match_tokens(tokens: &[Token], name: &[char]) -> bool {
    let (mut t, mut n) = (0, 0);
    // Where to resume after the last `*`: (token after it, name position it now covers up to).
    let mut resume: Option<(usize, usize)> = None;
    while n < name.len() {
        let step = match tokens.get(t) {
            Some(Token::Star) => {
                resume = Some((t + 1, n));
                t += 1;
                continue;
            }
            Some(Token::One) => true,
            Some(Token::Char(c)) => *c == name[n],
            Some(Token::Class { negated, ranges }) => {
                ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&name[n])) != *negated
            }
            None => false,
        };
        if step {
            t += 1;
            n += 1;
        } else if let Some((after_star, covered)) = resume {
            // Let the last `*` swallow one more character and retry from there.
            resume = Some((after_star, covered + 1));
            t = after_star;
            n = covered + 1;
        } else {
            return false;
        }
    }
    tokens[t..].iter().all(|tok| *tok == Token::Star)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn globs(patterns: &[&str]) -> Globs {
        Globs::new(&patterns.iter().map(|p| p.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn star_stays_in_one_segment() {
        let g = globs(&["*.txt"]);
        assert!(g.is_match("a.txt"));
        assert!(g.is_match("./a.txt"));
        assert!(g.is_match(".hidden.txt"));
        assert!(!g.is_match("dir/a.txt"));
        assert!(!g.is_match("a.txt.bak"));
        assert!(
            globs(&["out/*"]).is_match("out/x/y"),
            "a matched dir covers its content"
        );
    }

    #[test]
    fn double_star_spans_any_depth_including_none() {
        let g = globs(&["**/*.xml"]);
        assert!(g.is_match("report.xml"));
        assert!(g.is_match("a/b/c/report.xml"));
        assert!(!g.is_match("a/b/report.json"));
        let g = globs(&["out/**/lib/*.so"]);
        assert!(g.is_match("out/lib/a.so"));
        assert!(g.is_match("out/x/y/lib/a.so"));
        assert!(!g.is_match("lib/a.so"));
        assert!(globs(&["**"]).is_match("any/thing"));
    }

    #[test]
    fn question_mark_classes_and_braces() {
        let g = globs(&["file?.[ch]", "log[!0-9]", "{bin,lib}/*.{a,so}"]);
        assert!(g.is_match("file1.c"));
        assert!(g.is_match("fileX.h"));
        assert!(!g.is_match("file10.c"));
        assert!(!g.is_match("file1.o"));
        assert!(g.is_match("logs"));
        assert!(!g.is_match("log5"));
        assert!(g.is_match("bin/x.a"));
        assert!(g.is_match("lib/x.so"));
        assert!(!g.is_match("src/x.a"));
        assert!(globs(&["a\\*b"]).is_match("a*b"));
        assert!(!globs(&["a\\*b"]).is_match("axb"));
    }

    #[test]
    fn a_directory_pattern_matches_everything_under_it() {
        for p in ["out/", "out", "./out/", "out//"] {
            let g = globs(&[p]);
            assert!(g.is_match("out"), "{p}");
            assert!(g.is_match("out/a.txt"), "{p}");
            assert!(g.is_match("out/deep/er/b"), "{p}");
            assert!(!g.is_match("outer/a.txt"), "{p}");
            assert!(!g.is_match("src/out/a"), "{p}");
        }
        assert!(globs(&["."]).is_match("anything/at/all"));
    }

    #[test]
    fn star_backtracks() {
        let g = globs(&["a*b*c"]);
        assert!(g.is_match("abbbc"));
        assert!(g.is_match("aXbYbZc"));
        assert!(g.is_match("abc"));
        assert!(!g.is_match("abcb"));
        assert!(globs(&["*"]).is_match("x"));
    }

    /// Which of `tree` an exclude of `patterns` removes, as GitLab Runner's walk does.
    fn excluded(patterns: &[&str], tree: &[&str]) -> Vec<String> {
        let g = globs(patterns);
        tree.iter()
            .filter(|p| g.matches_exactly(p))
            .map(|p| p.to_string())
            .collect()
    }

    const TREE: &[&str] = &[
        "out",
        "out/a.txt",
        "out/tmp",
        "out/tmp/x.o",
        "out/tmp/deep",
        "out/tmp/deep/y.o",
        "out/my dir",
        "out/my dir/notes.txt",
        "out/keep.log",
        "out/sub/b.log",
    ];

    #[test]
    fn exclude_of_a_directory_name_removes_only_its_own_entry() {
        for p in ["out/tmp", "out/tmp/", "./out/tmp"] {
            assert_eq!(excluded(&[p], TREE), ["out/tmp"], "{p}");
        }
    }

    #[test]
    fn exclude_of_dir_double_star_removes_the_directory_and_everything_under_it() {
        assert_eq!(
            excluded(&["out/tmp/**"], TREE),
            ["out/tmp", "out/tmp/x.o", "out/tmp/deep", "out/tmp/deep/y.o"]
        );
        assert_eq!(
            excluded(&["out/tmp/**/*"], TREE),
            ["out/tmp/x.o", "out/tmp/deep", "out/tmp/deep/y.o"],
            "`/*` after `**` needs one more segment, so the directory itself stays"
        );
    }

    #[test]
    fn exclude_globs_stay_in_their_segment_unless_double_starred() {
        assert_eq!(excluded(&["out/*.log"], TREE), ["out/keep.log"]);
        assert_eq!(
            excluded(&["out/**/*.log"], TREE),
            ["out/keep.log", "out/sub/b.log"]
        );
        assert_eq!(excluded(&["*.log"], TREE), Vec::<String>::new());
        assert_eq!(
            excluded(&["**/*.o"], TREE),
            ["out/tmp/x.o", "out/tmp/deep/y.o"]
        );
    }

    #[test]
    fn exclude_names_with_spaces_match_literally() {
        assert_eq!(
            excluded(&["out/my dir/**"], TREE),
            ["out/my dir", "out/my dir/notes.txt"]
        );
        assert_eq!(excluded(&["out/my dir"], TREE), ["out/my dir"]);
        assert_eq!(excluded(&["out/my*/*.txt"], TREE), ["out/my dir/notes.txt"]);
        assert_eq!(excluded(&["out/my"], TREE), Vec::<String>::new());
    }

    #[test]
    fn empty_set_matches_nothing() {
        let g = globs(&[]);
        assert!(g.is_empty());
        assert!(!g.is_match("a"));
    }

    #[test]
    fn bad_patterns_are_rejected_with_the_pattern_named() {
        for p in [
            "/etc/passwd",
            "../x",
            "a/../../x",
            "[abc",
            "x[]",
            "a{b,c",
            "a}",
            "a\\",
        ] {
            let err = Globs::new(&[p.to_string()]).unwrap_err();
            assert!(err.to_string().contains(&format!("{p:?}")), "{p}: {err}");
        }
    }
}
