//! Artifact archives (`slipway_artifacts`): zips built from structured entries (names with
//! `..`, absolute and Windows-style paths, symlinks out, symlinked parents, many entries) and
//! raw-byte mutations of valid zips go through `zip_to_tar`; tar streams built the same way go
//! through `archive_from_tar` (zip and gzip). A counted subset is really extracted, as the
//! executor does (`tar -x -f - -C DIR`), into a fresh directory that nothing outside may change.

use std::io::{Read, Write};
use std::path::Path;

use slipway_artifacts::{Format, archive_from_tar, zip_to_tar};
use zip::write::SimpleFileOptions;

/// One archive entry.
#[derive(Debug, Clone, bolero::generator::TypeGenerator)]
pub struct Entry {
    /// Name segments (each a dictionary index, or free text when `free` is set).
    pub segments: Vec<u8>,
    /// A free-form name used instead when set.
    pub free: Option<String>,
    /// What it is.
    pub kind: Kind,
}

/// What an entry is.
#[derive(Debug, Clone, bolero::generator::TypeGenerator)]
pub enum Kind {
    /// A file with this content.
    File(Vec<u8>),
    /// A directory.
    Dir,
    /// A symlink to a target built from segments.
    Symlink(Vec<u8>),
}

/// The input.
#[derive(Debug, Clone, bolero::generator::TypeGenerator)]
pub enum Input {
    /// A zip of these entries.
    Zip(Vec<Entry>),
    /// A zip of these entries, then bytes overwritten (position, value).
    ZipMutated(Vec<Entry>, Vec<(u32, u8)>),
    /// `n` empty files: up to 63, or about 2,000 for `n` above 65,000.
    Many(u16),
    /// A tar of these entries (names in PAX `path` records when set), archived as zip and gzip.
    Tar(Vec<Entry>, bool),
}

const SEGMENTS: &[&str] = &[
    "a", "b", "out", "..", ".", "", "/", "\\", "..\\..", "C:", "c:\\x", "\u{0}", "é", "a b",
    "/etc", "~", "-", "...", "....", "a/../..", "//", "./", "x\n",
];

fn name(e: &Entry) -> String {
    if let Some(f) = &e.free {
        return f.clone();
    }
    path_of(&e.segments)
}

fn path_of(segments: &[u8]) -> String {
    segments
        .iter()
        .take(6)
        .map(|s| SEGMENTS[usize::from(*s) % SEGMENTS.len()])
        .collect::<Vec<_>>()
        .join("/")
}

/// Builds a zip of `entries` with the `zip` crate (entries the writer refuses are left out).
pub fn build_zip(entries: &[Entry]) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for e in entries.iter().take(64) {
        let n = name(e);
        let _ = match &e.kind {
            Kind::File(data) => w
                .start_file(n, opts)
                .and_then(|()| w.write_all(data).map_err(Into::into)),
            Kind::Dir => w.add_directory(n, opts),
            Kind::Symlink(t) => w.add_symlink(n, path_of(t), opts),
        };
    }
    w.finish()
        .map(std::io::Cursor::into_inner)
        .unwrap_or_default()
}

/// One PAX extended-header record: `LEN key=value\n`, `LEN` counting itself.
fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let body = key.len() + value.len() + 3;
    let mut len = body + 1;
    while len != body + len.to_string().len() {
        len = body + len.to_string().len();
    }
    let mut r = format!("{len} {key}=").into_bytes();
    r.extend_from_slice(value);
    r.push(b'\n');
    r
}

/// Builds a tar stream of `entries` with raw names (nothing normalized or refused); with `pax`
/// each name also goes in a PAX `path` record, which may hold any byte.
pub fn build_tar(entries: &[Entry], pax: bool) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries.iter().take(64) {
        let n = name(e);
        if pax {
            let record = pax_record("path", n.as_bytes());
            let mut x = tar::Header::new_ustar();
            x.set_entry_type(tar::EntryType::XHeader);
            x.set_size(record.len() as u64);
            x.set_mode(0o644);
            x.set_cksum();
            let _ = b.append(&x, record.as_slice());
        }
        let mut h = tar::Header::new_old();
        let raw = n.as_bytes();
        let len = raw.len().min(99);
        h.as_old_mut().name[..len].copy_from_slice(&raw[..len]);
        h.set_mode(0o644);
        let data: &[u8] = match &e.kind {
            Kind::File(d) => {
                h.set_entry_type(tar::EntryType::Regular);
                d
            }
            Kind::Dir => {
                h.set_entry_type(tar::EntryType::Directory);
                &[]
            }
            Kind::Symlink(t) => {
                h.set_entry_type(tar::EntryType::Symlink);
                let t = path_of(t);
                let tl = t.len().min(99);
                h.as_old_mut().linkname[..tl].copy_from_slice(&t.as_bytes()[..tl]);
                &[]
            }
        };
        h.set_size(data.len() as u64);
        h.set_cksum();
        let _ = b.append(&h, data);
    }
    b.into_inner().unwrap_or_default()
}

/// The tar stream `zip_to_tar` produced: every path relative, no `..`, nothing under a symlink
/// of the stream. Returns the number of entries.
pub fn check_tar_listing(tar: &[u8]) -> usize {
    let mut a = tar::Archive::new(tar);
    let mut symlinks: Vec<String> = Vec::new();
    let mut n = 0;
    for e in a.entries().expect("zip_to_tar makes a tar") {
        let e = e.expect("zip_to_tar makes readable entries");
        let path = String::from_utf8(e.path_bytes().into_owned()).expect("UTF-8 paths");
        assert!(!path.starts_with('/'), "absolute {path:?}");
        assert!(!path.split('/').any(|c| c == ".."), "`..` in {path:?}");
        assert!(
            !symlinks.iter().any(|s| path.starts_with(&format!("{s}/"))),
            "{path:?} is under a symlink of the archive"
        );
        if e.header().entry_type() == tar::EntryType::Symlink {
            symlinks.push(path);
        }
        n += 1;
    }
    n
}

/// The in-memory path: no panic; an archive is refused with a message, or becomes a tar that
/// passes [`check_tar_listing`].
pub fn check(input: &Input) {
    match input {
        Input::Zip(entries) => check_zip(&build_zip(entries)),
        Input::ZipMutated(entries, edits) => {
            let mut z = build_zip(entries);
            if !z.is_empty() {
                for (at, v) in edits.iter().take(16) {
                    let i = *at as usize % z.len();
                    z[i] = *v;
                }
            }
            check_zip(&z);
        }
        Input::Many(n) => {
            let count = if *n > 65_000 {
                usize::from(*n) - 63_000
            } else {
                usize::from(*n) % 64
            };
            let entries: Vec<Entry> = (0..count)
                .map(|i| Entry {
                    segments: Vec::new(),
                    free: Some(format!("f{i}")),
                    kind: Kind::File(Vec::new()),
                })
                .collect();
            let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
            for e in &entries {
                let _ = w.start_file(name(e), SimpleFileOptions::default());
            }
            let z = w
                .finish()
                .map(std::io::Cursor::into_inner)
                .unwrap_or_default();
            check_zip(&z);
        }
        Input::Tar(entries, pax) => {
            let tar = build_tar(entries, *pax);
            for format in [Format::Zip, Format::Gzip] {
                match archive_from_tar(&tar, format, &|_| true) {
                    Ok(a) => {
                        if format == Format::Zip {
                            let back = zip_to_tar(&a.bytes).expect("our own zip reads back");
                            assert_eq!(check_tar_listing(&back), a.files, "entries lost");
                        } else if a.files > 0 {
                            let mut out = Vec::new();
                            flate2::read::MultiGzDecoder::new(a.bytes.as_slice())
                                .read_to_end(&mut out)
                                .expect("our own gzip decodes");
                        }
                    }
                    Err(e) => assert!(!e.to_string().is_empty()),
                }
            }
        }
    }
}

fn check_zip(z: &[u8]) {
    match zip_to_tar(z) {
        Ok(tar) => {
            check_tar_listing(&tar);
        }
        Err(e) => assert!(!e.to_string().is_empty(), "an empty error"),
    }
}

/// The real extraction: `zip_to_tar`, then `tar -x -f - -C DIR` as the executor unpacks
/// artifacts, into `ROOT/dest` beside a canary directory; nothing but `dest` may change.
pub fn check_extract(input: &Input) {
    let z = match input {
        Input::Zip(entries) | Input::Tar(entries, _) => build_zip(entries),
        Input::ZipMutated(entries, edits) => {
            let mut z = build_zip(entries);
            if !z.is_empty() {
                for (at, v) in edits.iter().take(16) {
                    let i = *at as usize % z.len();
                    z[i] = *v;
                }
            }
            z
        }
        Input::Many(_) => return,
    };
    let Ok(tar) = zip_to_tar(&z) else {
        return;
    };
    let root = tempfile::tempdir().expect("a temp dir");
    let dest = root.path().join("dest");
    let canary = root.path().join("canary");
    std::fs::create_dir_all(&dest).expect("dest");
    std::fs::create_dir_all(&canary).expect("canary");
    let mut child = std::process::Command::new("tar")
        .args(["-x", "-f", "-", "-C"])
        .arg(&dest)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("tar runs");
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(&tar);
    }
    let _ = child.wait();
    let top: Vec<_> = std::fs::read_dir(root.path())
        .expect("root")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        top.len(),
        2,
        "extraction wrote beside the destination: {top:?}"
    );
    assert_eq!(
        std::fs::read_dir(&canary).expect("canary").count(),
        0,
        "extraction wrote into a sibling directory"
    );
    assert_inside(&dest, &dest);
}

fn assert_inside(dir: &Path, dest: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        assert!(
            p.starts_with(dest),
            "{} outside {}",
            p.display(),
            dest.display()
        );
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            assert_inside(&p, dest);
        }
    }
}
