//! Job artifacts: what an executor collected (a tar stream of files relative to the project
//! directory) turned into what GitLab stores, and a downloaded archive turned back into a tar
//! stream to unpack.
//!
//! - [`Globs`]: `artifacts:paths` / `artifacts:exclude` patterns (doublestar syntax).
//! - [`archive_from_tar`]: builds a [`Format::Zip`] or [`Format::Gzip`] [`Archive`].
//! - [`zip_to_tar`]: a downloaded zip as a tar stream, refusing entries that would escape.
//! - [`CollectedTar`]: a collected tar file's kept entries, written as a zip stream (to a pipe
//!   into an upload, say).
//! - [`archive_file_from_tar_file`], [`zip_file_to_tar_file`]: the same from file to file,
//!   streamed, for archives larger than memory should hold; [`archive_file_to_tar_file`] reads
//!   a cache in either of its formats (zip or `tarzstd`).
//!
//! Modules, all private (what they define is re-exported here):
//!
//! - `entries`: the executor's tar stream as normalized entries; contents stay in the stream
//!   until an archive is written, so a stream in a file is never held in memory.
//! - `zip`: GitLab Runner's `zip` format, written from tar entries and read back as a tar stream.
//! - `tarzstd`: GitLab Runner's `tarzstd` cache format, compressed on every core.
//! - `gzip`: GitLab Runner's `gzip` format (reports such as `junit`): one gzip member per file.
//! - `globs`: doublestar globs as GitLab uses them for `artifacts:paths` and `artifacts:exclude`.
//! - `format`: the artifact formats Slipway writes ([`Format`]).
//! - `compression`: how hard zip archives are compressed ([`Compression`], from GitLab's
//!   `ARTIFACT_COMPRESSION_LEVEL` and `CACHE_COMPRESSION_LEVEL`).
//! - `limits`: how much an archive may expand to ([`Limits`], checked while streaming).
//! - `selection`: which collected paths an archive keeps ([`keeps`]: `exclude`, `untracked`).
//! - `error`: [`ArtifactsError`]; paths in its messages are entry names, never file contents.
//!
//! ```
//! use slipway_artifacts::{Format, Globs, archive_from_tar, zip_to_tar};
//!
//! let mut tar = tar::Builder::new(Vec::new());
//! let mut header = tar::Header::new_gnu();
//! header.set_size(5);
//! header.set_mode(0o755);
//! tar.append_data(&mut header, "./out/run.sh", &b"echo\n"[..])?;
//! let tar = tar.into_inner()?;
//!
//! let paths = Globs::new(&["out/".to_string()])?;
//! let exclude = Globs::new(&[])?;
//! let keep = |p: &str| paths.is_match(p) && !exclude.is_match(p);
//! let archive = archive_from_tar(&tar, Format::Zip, &keep)?;
//! assert_eq!(archive.files, 1);
//! let back = zip_to_tar(&archive.bytes)?;
//! assert!(!back.is_empty());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod compression;
mod entries;
mod error;
mod format;
mod globs;
mod gzip;
mod limits;
mod selection;
mod tarzstd;
mod zip;

use std::fs::File;
use std::io::{BufReader, BufWriter, Cursor, Seek, Write};
use std::path::Path;

use entries::{Contents, FileContents};

pub use compression::Compression;
pub use error::ArtifactsError;
pub use format::Format;
pub use globs::Globs;
pub use limits::{Exceeded, Limits};
pub use selection::keeps;

/// A built artifacts archive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Archive {
    /// The archive itself, ready to upload.
    pub bytes: Vec<u8>,
    /// Entries stored: files, directories and symlinks for zip; gzip members for gzip; 1 for
    /// raw.
    pub files: usize,
    /// The stored file's path, for [`Format::Raw`] (its upload's file name).
    pub raw_path: Option<String>,
}

/// Builds the archive from a tar stream (several archives may be concatenated), keeping only
/// entries for which `keep(path)` is true (path normalized: no leading `./`, `/` separators, no
/// trailing `/`).
pub fn archive_from_tar(
    tar: &[u8],
    format: Format,
    keep: &dyn Fn(&str) -> bool,
) -> Result<Archive, ArtifactsError> {
    archive_from_tar_with(tar, format, keep, Compression::Default)
}

/// [`archive_from_tar`] with zip files compressed at `compression`.
pub fn archive_from_tar_with(
    tar: &[u8],
    format: Format,
    keep: &dyn Fn(&str) -> bool,
    compression: Compression,
) -> Result<Archive, ArtifactsError> {
    let entries = entries::read_tar(Cursor::new(tar), keep)?;
    let mut out = Cursor::new(Vec::new());
    let (files, raw_path) = write_archive(&entries, &tar, format, compression, &mut out)?;
    Ok(Archive {
        bytes: out.into_inner(),
        files,
        raw_path,
    })
}

/// An artifacts archive written to a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchiveFile {
    /// Entries stored (as [`Archive::files`]).
    pub files: usize,
    /// The stored file's path, for [`Format::Raw`].
    pub raw_path: Option<String>,
}

/// [`archive_from_tar_with`] from the tar stream in the file `tar` to the file `out`
/// (created or truncated), streamed: memory does not grow with the files' sizes.
pub fn archive_file_from_tar_file(
    tar: &Path,
    out: &Path,
    format: Format,
    keep: &dyn Fn(&str) -> bool,
    compression: Compression,
) -> Result<ArchiveFile, ArtifactsError> {
    let open = |path: &Path| {
        File::open(path).map_err(|source| ArtifactsError::File {
            path: path.to_path_buf(),
            source,
        })
    };
    let entries = entries::read_tar(BufReader::new(open(tar)?), keep)?;
    let contents = FileContents(open(tar)?);
    let written = File::create(out).map_err(|source| ArtifactsError::File {
        path: out.to_path_buf(),
        source,
    })?;
    let mut writer = BufWriter::with_capacity(256 * 1024, written);
    let (files, raw_path) = write_archive(&entries, &contents, format, compression, &mut writer)?;
    writer.flush().map_err(|source| ArtifactsError::File {
        path: out.to_path_buf(),
        source,
    })?;
    Ok(ArchiveFile { files, raw_path })
}

/// The entries of a collected tar file an archive keeps, read once (headers only): how many
/// there are is known before an archive is written, and the archive can be streamed.
pub struct CollectedTar {
    entries: Vec<entries::Entry>,
    contents: FileContents,
}

impl std::fmt::Debug for CollectedTar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CollectedTar")
            .field("entries", &self.entries.len())
            .finish_non_exhaustive()
    }
}

impl CollectedTar {
    /// The entries of `tar` for which `keep(path)` is true.
    pub fn open(tar: &Path, keep: &dyn Fn(&str) -> bool) -> Result<CollectedTar, ArtifactsError> {
        let open = || {
            File::open(tar).map_err(|source| ArtifactsError::File {
                path: tar.to_path_buf(),
                source,
            })
        };
        let entries = entries::read_tar(BufReader::new(open()?), keep)?;
        Ok(CollectedTar {
            entries,
            contents: FileContents(open()?),
        })
    }

    /// Entries kept: files, directories and symlinks (as [`Archive::files`] for zip).
    pub fn files(&self) -> usize {
        self.entries.len()
    }

    /// The kept entries as a zip archive written to `out` as it is made, never sought back
    /// (sizes in data descriptors), deflated on every core: an upload can send it while it is
    /// written.
    pub fn write_zip<W: Write>(
        &self,
        compression: Compression,
        out: W,
    ) -> Result<W, ArtifactsError> {
        let buffered = BufWriter::with_capacity(256 * 1024, out);
        let buffered = zip::write_zip_stream(&self.entries, &self.contents, compression, buffered)?;
        buffered
            .into_inner()
            .map_err(|e| ArtifactsError::ZipWrite(e.into_error()))
    }
}

/// Writes `entries` in `format` to `out`: the entry count and, for raw, the file's path.
fn write_archive<W: Write + Seek>(
    entries: &[entries::Entry],
    contents: &dyn Contents,
    format: Format,
    compression: Compression,
    out: &mut W,
) -> Result<(usize, Option<String>), ArtifactsError> {
    match format {
        Format::Zip => {
            zip::write_zip(entries, contents, compression, &mut *out)?;
            Ok((entries.len(), None))
        }
        Format::Gzip => {
            let (_, files) = gzip::write_gzip(entries, contents, &mut *out)?;
            Ok((files, None))
        }
        Format::TarZstd => {
            tarzstd::write_tar_zstd(entries, contents, compression, &mut *out)?;
            Ok((entries.len(), None))
        }
        Format::Raw => {
            // GitLab Runner's raw format holds exactly one regular file, sent as it is.
            let mut files = entries.iter().filter_map(|e| match &e.kind {
                entries::Kind::File(data) => Some((e.path.clone(), data)),
                _ => None,
            });
            match (files.next(), files.next()) {
                (None, _) => Ok((0, None)),
                (Some((path, data)), None) => {
                    contents
                        .copy(data, out)
                        .map_err(|source| ArtifactsError::Write {
                            what: format!("raw artifact {path:?}"),
                            source,
                        })?;
                    Ok((1, Some(path)))
                }
                (Some((first, _)), Some((second, _))) => {
                    Err(ArtifactsError::RawNeedsOneFile { first, second })
                }
            }
        }
    }
}

/// Turns a downloaded zip artifacts archive into a tar stream to unpack into a project
/// directory; refuses (error naming the entry) absolute paths, `..` escapes and entries under a
/// symlink of the archive; keeps file modes and symlinks where the zip records them. The
/// default [`Limits`] apply.
pub fn zip_to_tar(zip: &[u8]) -> Result<Vec<u8>, ArtifactsError> {
    zip_to_tar_limited(zip, &Limits::default())
}

/// [`zip_to_tar`] within `limits`.
pub fn zip_to_tar_limited(zip: &[u8], limits: &Limits) -> Result<Vec<u8>, ArtifactsError> {
    zip::zip_to_tar(Cursor::new(zip), Vec::new(), zip.len() as u64, limits)
}

/// [`zip_to_tar`] from the file `zip` to the file `out` (created or truncated), streamed,
/// within `limits`. On an error `out` may hold part of the stream: the caller removes it.
pub fn zip_file_to_tar_file(zip: &Path, out: &Path, limits: &Limits) -> Result<(), ArtifactsError> {
    file_to_tar_file(zip, out, limits, false)
}

/// [`zip_file_to_tar_file`] for a cache archive in either format GitLab Runner writes: zip,
/// or a `tarzstd` stream (told apart by its first bytes, as GitLab Runner does).
pub fn archive_file_to_tar_file(
    archive: &Path,
    out: &Path,
    limits: &Limits,
) -> Result<(), ArtifactsError> {
    file_to_tar_file(archive, out, limits, true)
}

/// `archive` (zip, or `tarzstd` when `zstd` is accepted) converted into the tar file `out`.
fn file_to_tar_file(
    archive: &Path,
    out: &Path,
    limits: &Limits,
    zstd: bool,
) -> Result<(), ArtifactsError> {
    let file = |path: &Path, source| ArtifactsError::File {
        path: path.to_path_buf(),
        source,
    };
    let mut input = File::open(archive).map_err(|e| file(archive, e))?;
    let archived = input.metadata().map_err(|e| file(archive, e))?.len();
    let mut magic = [0u8; 4];
    let is_zstd = zstd
        && std::io::Read::read_exact(&mut input, &mut magic).is_ok()
        && magic == tarzstd::MAGIC;
    input
        .seek(std::io::SeekFrom::Start(0))
        .map_err(|e| file(archive, e))?;
    let input = BufReader::with_capacity(256 * 1024, input);
    let output = BufWriter::with_capacity(256 * 1024, File::create(out).map_err(|e| file(out, e))?);
    let mut written = if is_zstd {
        tarzstd::tar_zstd_to_tar(input, output, archived, limits)?
    } else {
        zip::zip_to_tar(input, output, archived, limits)?
    };
    written.flush().map_err(|e| file(out, e))
}
