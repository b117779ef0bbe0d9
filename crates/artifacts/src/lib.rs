//! Job artifacts: what an executor collected (a tar stream of files relative to the project
//! directory) turned into what GitLab stores, and a downloaded archive turned back into a tar
//! stream to unpack.
//!
//! - [`Globs`]: `artifacts:paths` / `artifacts:exclude` patterns (doublestar syntax).
//! - [`archive_from_tar`]: builds a [`Format::Zip`] or [`Format::Gzip`] [`Archive`].
//! - [`zip_to_tar`]: a downloaded zip as a tar stream, refusing entries that would escape.
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
mod zip;

pub use compression::Compression;
pub use error::ArtifactsError;
pub use format::Format;
pub use globs::Globs;

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
    let entries = entries::read_tar(tar, keep)?;
    match format {
        Format::Zip => Ok(Archive {
            bytes: zip::write_zip(&entries, compression)?,
            files: entries.len(),
            raw_path: None,
        }),
        Format::Gzip => {
            let (bytes, files) = gzip::write_gzip(&entries)?;
            Ok(Archive {
                bytes,
                files,
                raw_path: None,
            })
        }
        Format::Raw => {
            // GitLab Runner's raw format holds exactly one regular file, sent as it is.
            let mut files = entries.iter().filter_map(|e| match &e.kind {
                entries::Kind::File(data) => Some((e.path.clone(), data.to_vec())),
                _ => None,
            });
            match (files.next(), files.next()) {
                (None, _) => Ok(Archive {
                    bytes: Vec::new(),
                    files: 0,
                    raw_path: None,
                }),
                (Some((path, bytes)), None) => Ok(Archive {
                    bytes,
                    files: 1,
                    raw_path: Some(path),
                }),
                (Some((first, _)), Some((second, _))) => {
                    Err(ArtifactsError::RawNeedsOneFile { first, second })
                }
            }
        }
    }
}

/// Turns a downloaded zip artifacts archive into a tar stream to unpack into a project
/// directory; refuses (error naming the entry) absolute paths, `..` escapes and entries under a
/// symlink of the archive; keeps file modes and symlinks where the zip records them.
pub fn zip_to_tar(zip: &[u8]) -> Result<Vec<u8>, ArtifactsError> {
    zip::zip_to_tar(zip)
}
