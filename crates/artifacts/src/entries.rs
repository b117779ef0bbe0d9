//! Reading the executor's tar stream into normalized entries. File contents stay where they
//! are (a span of the stream); [`Contents`] copies them out when an archive is written, so a
//! stream in a file is never held in memory.

use std::collections::{HashMap, HashSet};
use std::io::{self, Read, Seek, Write};

use tar::EntryType;

use crate::ArtifactsError;

/// Where a regular file's content is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Data {
    /// `len` bytes at `offset` of the stream.
    Span {
        /// Offset in the stream.
        offset: u64,
        /// Length.
        len: u64,
    },
    /// Read out of the stream (a sparse file, stored in pieces).
    Owned(Vec<u8>),
}

impl Data {
    /// The content's length.
    pub(crate) fn len(&self) -> u64 {
        match self {
            Data::Span { len, .. } => *len,
            Data::Owned(v) => v.len() as u64,
        }
    }
}

/// What an entry is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A regular file and where its content is.
    File(Data),
    /// A directory.
    Dir,
    /// A symbolic link and its target.
    Symlink(String),
}

/// One entry of the stream, its path normalized.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    /// Relative, `/`-separated, without `./`, empty or `.` segments, or a trailing `/`.
    pub path: String,
    /// Permission bits (`0o7777`).
    pub mode: u32,
    /// Modification time, Unix seconds.
    pub mtime: u64,
    /// File, directory or symlink.
    pub kind: Kind,
}

/// The stream the entries' spans point into.
pub(crate) trait Contents: Sync {
    /// Copy `data` to `out`.
    fn copy(&self, data: &Data, out: &mut dyn Write) -> io::Result<()> {
        let copied = io::copy(&mut self.reader(data)?, out)?;
        if copied == data.len() {
            Ok(())
        } else {
            Err(io::Error::from(io::ErrorKind::UnexpectedEof))
        }
    }

    /// A reader of `data`'s bytes (exactly its length: a short stream is an error).
    fn reader<'c>(&'c self, data: &'c Data) -> io::Result<Box<dyn Read + 'c>>;

    /// The first `n` bytes of `data` (all of it when shorter).
    fn head(&self, data: &Data, n: u64) -> io::Result<Vec<u8>> {
        let short = match data {
            Data::Owned(v) => {
                Data::Owned(v[..v.len().min(usize::try_from(n).unwrap_or(usize::MAX))].to_vec())
            }
            Data::Span { offset, len } => Data::Span {
                offset: *offset,
                len: (*len).min(n),
            },
        };
        let mut out = Vec::new();
        self.copy(&short, &mut out)?;
        Ok(out)
    }
}

impl Contents for &[u8] {
    fn reader<'c>(&'c self, data: &'c Data) -> io::Result<Box<dyn Read + 'c>> {
        match data {
            Data::Owned(v) => Ok(Box::new(&v[..])),
            Data::Span { offset, len } => {
                let slice = usize::try_from(*offset)
                    .ok()
                    .zip(usize::try_from(*len).ok())
                    .and_then(|(s, l)| self.get(s..s.checked_add(l)?))
                    .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
                Ok(Box::new(slice))
            }
        }
    }
}

/// A stream in a file, read at offsets (`pread`), so that threads can share it.
pub(crate) struct FileContents(pub std::fs::File);

impl Contents for FileContents {
    fn reader<'c>(&'c self, data: &'c Data) -> io::Result<Box<dyn Read + 'c>> {
        match data {
            Data::Owned(v) => Ok(Box::new(&v[..])),
            Data::Span { offset, len } => Ok(Box::new(SpanReader {
                file: &self.0,
                offset: *offset,
                left: *len,
            })),
        }
    }
}

/// `left` bytes of a file from `offset`; ending early is an error.
struct SpanReader<'c> {
    file: &'c std::fs::File,
    offset: u64,
    left: u64,
}

impl Read for SpanReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::unix::fs::FileExt as _;
        let take = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        if take == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..take], self.offset)?;
        if n == 0 {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        self.offset += n as u64;
        self.left -= n as u64;
        Ok(n)
    }
}

/// Reads every entry of the tar stream `tar` (several archives may be concatenated) for which
/// `keep(path)` is true, in stream order; a path seen twice keeps its first position and its
/// last content, as unpacking the stream would leave it. Hard links become copies of their
/// target; devices, FIFOs and the project directory itself (`./`) are skipped, as GitLab
/// Runner skips them.
pub(crate) fn read_tar<R: Read + Seek>(
    tar: R,
    keep: &dyn Fn(&str) -> bool,
) -> Result<Vec<Entry>, ArtifactsError> {
    let mut archive = tar::Archive::new(tar);
    // Without this the reader stops at the first archive's end-of-archive blocks.
    archive.set_ignore_zeros(true);
    let mut entries: Vec<Entry> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    // Every regular file's content, kept or not, for hard links to it.
    let mut contents: HashMap<String, Data> = HashMap::new();

    for entry in archive.entries_with_seek().map_err(ArtifactsError::Tar)? {
        let mut entry = entry.map_err(ArtifactsError::Tar)?;
        let header = entry.header();
        let entry_type = header.entry_type();
        let mode = header.mode().map_err(ArtifactsError::Tar)? & 0o7777;
        let mtime = header.mtime().map_err(ArtifactsError::Tar)?;
        let path = normalize(&entry.path_bytes())?;

        let kind = match entry_type {
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                let data = if entry_type == EntryType::GNUSparse {
                    let mut data = Vec::new();
                    entry.read_to_end(&mut data).map_err(ArtifactsError::Tar)?;
                    Data::Owned(data)
                } else {
                    Data::Span {
                        offset: entry.raw_file_position(),
                        len: entry.size(),
                    }
                };
                contents.insert(path.clone(), data.clone());
                Kind::File(data)
            }
            EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| normalize(&t))
                    .transpose()?
                    .unwrap_or_default();
                match contents.get(&target) {
                    Some(data) => {
                        let data = data.clone();
                        contents.insert(path.clone(), data.clone());
                        Kind::File(data)
                    }
                    None => return Err(ArtifactsError::DanglingHardLink { path, target }),
                }
            }
            EntryType::Directory => Kind::Dir,
            EntryType::Symlink => {
                let target = link_target(&path, entry.link_name_bytes().unwrap_or_default())?;
                if target.split('/').all(|c| c.is_empty() || c == ".") {
                    // A tar stream cannot carry it back (no path component): refused here
                    // rather than when the archive is downloaded.
                    return Err(ArtifactsError::UnsafePath {
                        path,
                        reason: "symlink target names no file",
                    });
                }
                Kind::Symlink(target)
            }
            // Devices, FIFOs, global PAX headers and unknown types carry no artifact content.
            _ => continue,
        };
        if path.is_empty() || !keep(&path) {
            continue;
        }
        let item = Entry {
            path,
            mode,
            mtime,
            kind,
        };
        match index.get(&item.path) {
            Some(&i) => entries[i] = item,
            None => {
                index.insert(item.path.clone(), entries.len());
                entries.push(item);
            }
        }
    }
    // Unpacking refuses anything under a symlink of the archive (see `zip_to_tar`): refuse it
    // here too (concatenated streams can turn a directory into a symlink).
    let symlinks: HashSet<&str> = entries
        .iter()
        .filter(|e| matches!(e.kind, Kind::Symlink(_)))
        .map(|e| e.path.as_str())
        .collect();
    if !symlinks.is_empty()
        && let Some(e) = entries
            .iter()
            .find(|e| ancestors(&e.path).any(|a| symlinks.contains(a)))
    {
        return Err(ArtifactsError::UnsafePath {
            path: e.path.clone(),
            reason: "a parent directory is a symlink of the archive",
        });
    }
    Ok(entries)
}

/// `a/b/c` → `a`, `a/b` (not the path itself): where a symlink of an archive would lead an
/// entry out of the project directory.
pub(crate) fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/').map(move |(i, _)| &path[..i])
}

/// Threads to compress with: one per core.
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A symlink's target as text; `path` names the link in the error.
pub(crate) fn link_target(
    path: &str,
    raw: std::borrow::Cow<'_, [u8]>,
) -> Result<String, ArtifactsError> {
    String::from_utf8(raw.into_owned()).map_err(|_| ArtifactsError::UnsafePath {
        path: path.to_string(),
        reason: "symlink target is not UTF-8",
    })
}

/// The tar stream `builder` wrote, ended.
pub(crate) fn finish_tar<W: Write>(builder: tar::Builder<W>) -> Result<W, ArtifactsError> {
    builder
        .into_inner()
        .map_err(|source| ArtifactsError::Write {
            what: "the tar stream".into(),
            source,
        })
}

/// Normalizes an entry name: UTF-8, relative, no `..`; `./`, empty and `.` segments and a
/// trailing `/` dropped. The project directory itself comes out empty.
pub(crate) fn normalize(raw: &[u8]) -> Result<String, ArtifactsError> {
    let unsafe_path = |reason| ArtifactsError::UnsafePath {
        path: String::from_utf8_lossy(raw).into_owned(),
        reason,
    };
    let text = std::str::from_utf8(raw).map_err(|_| unsafe_path("name is not UTF-8"))?;
    if text.starts_with('/') {
        return Err(unsafe_path("absolute path"));
    }
    if text.contains('\0') {
        // A PAX `path` record can hold one; no file system or gzip header can.
        return Err(unsafe_path("name contains a NUL byte"));
    }
    if looks_like_windows_escape(text) {
        // The archive may be unpacked on Windows, where these are roots or parent references.
        return Err(unsafe_path("Windows-style absolute or parent path"));
    }
    let mut segments = Vec::new();
    for segment in text.split('/') {
        match segment {
            "" | "." => {}
            ".." => return Err(unsafe_path("`..` leaves the project directory")),
            s => segments.push(s),
        }
    }
    let joined = segments.join("/");
    if looks_like_windows_escape(&joined) {
        // `./c:x` is only refused once `./` is gone: refuse it the same either way.
        return Err(unsafe_path("Windows-style absolute or parent path"));
    }
    Ok(joined)
}

/// Whether a name would be absolute or climb out on Windows (`C:...`, `\x`, `..\x`).
fn looks_like_windows_escape(text: &str) -> bool {
    let bytes = text.as_bytes();
    let drive = bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':';
    drive || text.starts_with('\\') || text.split(['/', '\\']).any(|s| s == "..")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn normalizes_names() {
        assert_eq!(normalize(b"./out/a.txt").unwrap(), "out/a.txt");
        assert_eq!(normalize(b"out//b/./c/").unwrap(), "out/b/c");
        assert_eq!(normalize(b"./").unwrap(), "");
        assert_eq!(
            normalize(b"a\\b").unwrap(),
            "a\\b",
            "a backslash is a name character"
        );
        for bad in [
            &b"/etc/x"[..],
            b"../x",
            b"a/../../x",
            b"C:/x",
            b"..\\x",
            b"\xff",
            // Found by fuzzing: accepted when archiving, refused when unpacking the same zip.
            b"./c:\\x/",
            b".//C:x",
        ] {
            assert!(normalize(bad).is_err(), "{bad:?}");
        }
    }

    /// Found by `make fuzz` (target `archive`): a symlink `a` and an entry `a/b` in one stream
    /// were archived, then refused when the downloaded zip was unpacked.
    #[test]
    fn an_entry_under_a_symlink_of_the_stream_is_refused_when_archiving() {
        let mut b = tar::Builder::new(Vec::new());
        let mut d = tar::Header::new_gnu();
        d.set_path("a/b").unwrap();
        d.set_size(1);
        d.set_mode(0o644);
        d.set_cksum();
        b.append(&d, &b"x"[..]).unwrap();
        let mut l = tar::Header::new_gnu();
        l.set_entry_type(tar::EntryType::Symlink);
        l.set_path("a").unwrap();
        l.set_link_name("/etc").unwrap();
        l.set_size(0);
        l.set_mode(0o777);
        l.set_cksum();
        b.append(&l, &[][..]).unwrap();
        let tar = b.into_inner().unwrap();
        let e = crate::archive_from_tar(&tar, crate::Format::Zip, &|_| true).unwrap_err();
        assert!(e.to_string().contains("symlink of the archive"), "{e}");
    }

    /// Found by fuzzing (`slipway-fuzz`, target `archive`): a symlink to `""`, `/` or `.` was
    /// archived, then the downloaded zip could not be turned back into a tar stream.
    #[test]
    fn a_symlink_naming_no_file_is_refused_when_archiving() {
        for target in ["", "/", ".", "//./"] {
            let mut b = tar::Builder::new(Vec::new());
            let mut h = tar::Header::new_old();
            h.as_old_mut().name[..5].copy_from_slice(b"out/l");
            h.as_old_mut().linkname[..target.len()].copy_from_slice(target.as_bytes());
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            h.set_mode(0o777);
            h.set_cksum();
            b.append(&h, &[][..]).unwrap();
            let tar = b.into_inner().unwrap();
            let e = crate::archive_from_tar(&tar, crate::Format::Zip, &|_| true).unwrap_err();
            assert!(e.to_string().contains("symlink target"), "{target:?}: {e}");
        }
    }

    /// Found by fuzzing (`slipway-fuzz`, target `archive`): a PAX `path` record may hold a NUL
    /// byte, which panicked the gzip writer (a gzip header's FNAME cannot hold one).
    #[test]
    fn a_nul_in_a_pax_path_is_refused_not_a_panic() {
        let name = b"out/a\0b.txt";
        let record = {
            let body = format!(" path={}\n", String::from_utf8_lossy(name));
            let len = body.len() + 2;
            assert_eq!(len.to_string().len(), 2);
            format!("{len}{body}").into_bytes()
        };
        let mut b = tar::Builder::new(Vec::new());
        let mut x = tar::Header::new_ustar();
        x.set_entry_type(tar::EntryType::XHeader);
        x.set_size(record.len() as u64);
        x.set_cksum();
        b.append(&x, record.as_slice()).unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_path("out/a.txt").unwrap();
        h.set_size(2);
        h.set_mode(0o644);
        h.set_cksum();
        b.append(&h, &b"hi"[..]).unwrap();
        let tar = b.into_inner().unwrap();
        for format in [crate::Format::Gzip, crate::Format::Zip] {
            let e = crate::archive_from_tar(&tar, format, &|_| true).unwrap_err();
            assert!(e.to_string().contains("NUL"), "{e}");
        }
    }
}
