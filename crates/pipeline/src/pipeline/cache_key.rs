//! `cache:key:files` as GitLab computes it (`Gitlab::Ci::Pipeline::Seed::Build::Cache`): the
//! SHA-1 of the listed files' git blob ids (sorted, each once, joined by `-`), so the key
//! follows the files' contents, not their names or modification times. The prefix (or the
//! entry's index in the job's `cache:` list when there is none) goes before it with a `-`;
//! when no listed file exists the digest is `default`.
//!
//! GitLab reads the blobs at the pipeline's commit; a local run reads the working tree, so an
//! uncommitted edit changes the key too.

use std::fmt::Write as _;
use std::path::Path;

use sha1::{Digest as _, Sha1};

use super::glob;

/// The key of a `cache:` entry at `index` with `key: {files, prefix}`, from the files under
/// `project_dir` (`listing`: the project's files, for patterns with `*`).
pub(crate) fn files_key(
    project_dir: &Path,
    listing: &[String],
    files: &[String],
    prefix: Option<&str>,
    index: usize,
) -> String {
    let prefix = prefix.map_or_else(|| index.to_string(), str::to_string);
    let digest = digest_of(project_dir, listing, files).unwrap_or_else(|| "default".into());
    [prefix, digest]
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

/// The digest of the blobs of `files`, `None` when none of them is a file of the project.
fn digest_of(project_dir: &Path, listing: &[String], files: &[String]) -> Option<String> {
    let mut patterns: Vec<&str> = Vec::new();
    for f in files.iter().map(|f| f.trim()).filter(|f| !f.is_empty()) {
        if !patterns.contains(&f) {
            patterns.push(f);
        }
    }
    let mut paths: Vec<&str> = Vec::new();
    for p in patterns {
        if p.contains('*') {
            paths.extend(
                listing
                    .iter()
                    .filter(|f| glob::matches(p, f))
                    .map(String::as_str),
            );
        } else {
            paths.push(p);
        }
    }
    let mut ids: Vec<String> = paths
        .into_iter()
        .filter_map(|p| blob_id(project_dir, p))
        .collect();
    ids.sort();
    ids.dedup();
    if ids.is_empty() {
        return None;
    }
    Some(hex(&Sha1::digest(ids.join("-").as_bytes())))
}

/// The git blob id of the regular file at `rel` in the project (`sha1("blob <len>\0" +
/// content)`), `None` when there is none. As in a git tree lookup, the path is taken as
/// written: `./x`, `..`, absolute paths and directories name no blob.
fn blob_id(project_dir: &Path, rel: &str) -> Option<String> {
    if rel.starts_with('/')
        || rel.ends_with('/')
        || rel
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return None;
    }
    let path = project_dir.join(rel);
    // A symlink is a blob of its target's name in git; reading through it could leave the
    // project, so only regular files count.
    let meta = std::fs::symlink_metadata(&path).ok()?;
    if !meta.is_file() {
        return None;
    }
    let content = std::fs::read(&path).ok()?;
    let mut h = Sha1::new();
    h.update(format!("blob {}\0", content.len()).as_bytes());
    h.update(&content);
    Some(hex(&h.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn project(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        for (name, content) in files {
            let path = dir.path().join(name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).expect("mkdir");
            }
            std::fs::write(path, content).expect("write");
        }
        dir
    }

    fn key(dir: &Path, files: &[&str], prefix: Option<&str>) -> String {
        let listing = glob::files(dir);
        let files: Vec<String> = files.iter().map(|s| s.to_string()).collect();
        files_key(dir, &listing, &files, prefix, 0)
    }

    #[test]
    fn blob_ids_are_gits() {
        // `printf 'hello\n' | git hash-object --stdin`
        let dir = project(&[("a.txt", "hello\n")]);
        assert_eq!(
            blob_id(dir.path(), "a.txt").as_deref(),
            Some("ce013625030ba8dba906f756967f9e9ca394464a")
        );
        assert_eq!(blob_id(dir.path(), "./a.txt"), None);
        assert_eq!(blob_id(dir.path(), "missing"), None);
    }

    #[test]
    fn the_key_follows_contents_not_names() {
        let a = project(&[("Gemfile.lock", "rack 1\n")]);
        let b = project(&[("Gemfile.lock", "rack 1\n"), ("other", "x")]);
        let k = key(a.path(), &["Gemfile.lock"], None);
        assert!(k.starts_with("0-") && k.len() == 42, "{k}");
        assert_eq!(k, key(b.path(), &["Gemfile.lock"], None));
        std::fs::write(b.path().join("Gemfile.lock"), "rack 2\n").expect("write");
        assert_ne!(k, key(b.path(), &["Gemfile.lock"], None));
    }

    #[test]
    fn prefix_default_and_patterns() {
        let dir = project(&[("lib/a.rb", "1"), ("lib/b.rb", "2"), ("VERSION", "3")]);
        assert_eq!(key(dir.path(), &["nope"], Some("rspec")), "rspec-default");
        assert_eq!(key(dir.path(), &[], None), "0-default");
        assert_eq!(key(dir.path(), &["./VERSION"], Some("rel")), "rel-default");
        let k = key(dir.path(), &["**/*.rb"], Some("rb"));
        assert!(k.starts_with("rb-") && k != "rb-default", "{k}");
        // The order of the files and missing ones do not change the key.
        assert_eq!(
            key(dir.path(), &["VERSION", "lib/a.rb"], None),
            key(dir.path(), &["lib/a.rb", "missing", "VERSION"], None)
        );
        // An empty prefix leaves the digest alone.
        assert_eq!(key(dir.path(), &["nope"], Some("")), "default");
    }
}
