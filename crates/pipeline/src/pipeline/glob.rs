//! File patterns as GitLab matches them for `include:local`, `rules:exists` and `rules:changes`
//! (Ruby's `File.fnmatch` with `FNM_PATHNAME | FNM_DOTMATCH | FNM_EXTGLOB`): `*` and `?` stay
//! within one path segment, `**` crosses segments (`**/` also matches no directory at all),
//! `[abc]`/`[!a-z]` is one character of a set, `{a,b}` either alternative.

use std::path::Path;

/// Most files a project walk lists; a larger tree is cut there (patterns see the first ones).
const MAX_FILES: usize = 200_000;

/// Whether `path` (relative, `/`-separated) matches `pattern`; a leading `/` or `./` on either
/// is ignored, as both are relative to the project directory.
pub(crate) fn matches(pattern: &str, path: &str) -> bool {
    let pattern = trim(pattern);
    let path = trim(path);
    let mut alternatives = Vec::new();
    expand_braces(pattern, &mut alternatives, 0);
    alternatives.iter().any(|p| {
        let p: Vec<char> = p.chars().collect();
        let s: Vec<char> = path.chars().collect();
        glob(&p, &s)
    })
}

fn trim(s: &str) -> &str {
    let s = s.strip_prefix("./").unwrap_or(s);
    s.trim_start_matches('/')
}

/// Whether `pattern` has wildcards (else it names one file).
pub(crate) fn is_pattern(pattern: &str) -> bool {
    pattern.contains(['*', '?', '[', '{'])
}

/// `{a,b}c` → `ac`, `bc` (nested groups too), bounded against blow-ups.
fn expand_braces(pattern: &str, out: &mut Vec<String>, depth: usize) {
    if depth > 8 || out.len() > 256 {
        out.push(pattern.to_string());
        return;
    }
    let Some(open) = pattern.find('{') else {
        out.push(pattern.to_string());
        return;
    };
    let mut level = 0;
    let mut close = None;
    let mut commas = Vec::new();
    for (i, c) in pattern[open..].char_indices() {
        match c {
            '{' => level += 1,
            '}' => {
                level -= 1;
                if level == 0 {
                    close = Some(open + i);
                    break;
                }
            }
            ',' if level == 1 => commas.push(open + i),
            _ => {}
        }
    }
    let Some(close) = close else {
        out.push(pattern.to_string());
        return;
    };
    let (head, tail) = (&pattern[..open], &pattern[close + 1..]);
    let mut start = open + 1;
    for end in commas.into_iter().chain([close]) {
        let alt = format!("{head}{}{tail}", &pattern[start..end]);
        expand_braces(&alt, out, depth + 1);
        start = end + 1;
    }
}

fn glob(p: &[char], s: &[char]) -> bool {
    match p.first() {
        None => s.is_empty(),
        Some('*') if p.get(1) == Some(&'*') => {
            // `**/` may match no directory at all.
            let rest = &p[2..];
            if rest.first() == Some(&'/') && glob(&rest[1..], s) {
                return true;
            }
            (0..=s.len()).any(|k| glob(rest, &s[k..]))
        }
        Some('*') => {
            let rest = &p[1..];
            for k in 0..=s.len() {
                if glob(rest, &s[k..]) {
                    return true;
                }
                if s.get(k) == Some(&'/') {
                    break;
                }
            }
            false
        }
        Some('?') => s.first().is_some_and(|&c| c != '/') && glob(&p[1..], &s[1..]),
        Some('[') => {
            let Some(end) = p.iter().skip(1).position(|&c| c == ']').map(|e| e + 1) else {
                return s.first() == Some(&'[') && glob(&p[1..], &s[1..]);
            };
            let Some(&c) = s.first() else { return false };
            let mut set = &p[1..end];
            let negated = matches!(set.first(), Some('!' | '^'));
            if negated {
                set = &set[1..];
            }
            let mut hit = false;
            let mut i = 0;
            while i < set.len() {
                if i + 2 < set.len() && set[i + 1] == '-' {
                    hit |= set[i] <= c && c <= set[i + 2];
                    i += 3;
                } else {
                    hit |= set[i] == c;
                    i += 1;
                }
            }
            hit != negated && c != '/' && glob(&p[end + 1..], &s[1..])
        }
        Some('\\') if p.len() > 1 => s.first() == Some(&p[1]) && glob(&p[2..], &s[1..]),
        Some(&c) => s.first() == Some(&c) && glob(&p[1..], &s[1..]),
    }
}

/// Every file (and symlink) under `dir` as a relative `/`-separated path, sorted; `.git` is
/// skipped and symlinks are listed, not followed (a pattern must not lead out of the project).
pub fn files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), String::new())];
    while let Some((abs, rel)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&abs) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if rel.is_empty() && name == ".git" {
                continue;
            }
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push((entry.path(), path)),
                Ok(_) => out.push(path),
                Err(_) => {}
            }
            if out.len() >= MAX_FILES {
                out.sort();
                return out;
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnmatch_like_gitlab() {
        assert!(matches("ci/*.yml", "ci/a.yml"));
        assert!(!matches("ci/*.yml", "ci/sub/a.yml"));
        assert!(matches("/ci/**.yml", "ci/sub/a.yml"));
        assert!(matches("ci/**/*.yml", "ci/a.yml"));
        assert!(matches("ci/**/*.yml", "ci/x/y/a.yml"));
        assert!(matches("**/*.md", "README.md"));
        assert!(matches("{src,lib}/*.rs", "lib/x.rs"));
        assert!(!matches("{src,lib}/*.rs", "bin/x.rs"));
        assert!(matches("file?.txt", "file1.txt"));
        assert!(matches("[a-c]*.txt", "b.txt"));
        assert!(!matches("[!a-c]*.txt", "b.txt"));
        assert!(matches("./Dockerfile", "Dockerfile"));
        assert!(matches("*", ".hidden"));
        assert!(!matches("*.yml", "a.yaml"));
    }

    #[test]
    fn walks_files_without_git() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::create_dir_all(dir.path().join(".git")).unwrap();
        std::fs::write(dir.path().join("a/b/c.yml"), "").unwrap();
        std::fs::write(dir.path().join("x.yml"), "").unwrap();
        std::fs::write(dir.path().join(".git/config"), "").unwrap();
        assert_eq!(files(dir.path()), vec!["a/b/c.yml", "x.yml"]);
    }
}
