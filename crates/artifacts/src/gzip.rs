//! GitLab Runner's `gzip` artifact format (used for reports such as `junit`): one gzip member
//! per regular file, concatenated in path order, each carrying the file's base name (FNAME),
//! its path relative to the project directory (FCOMMENT) and its modification time.

use std::io::Write;

use flate2::{Compression, GzBuilder};

use crate::ArtifactsError;
use crate::entries::{Contents, Data, Entry, Kind};

/// Writes the regular files of `entries` as concatenated gzip members; directories are skipped
/// and anything else is refused, as GitLab Runner does. Returns the writer and the member
/// count.
/// `entries`' contents are in `contents`; written to `out`.
pub(crate) fn write_gzip<W: Write>(
    entries: &[Entry],
    contents: &dyn Contents,
    mut out: W,
) -> Result<(W, usize), ArtifactsError> {
    let mut files: Vec<(&Entry, &Data)> = Vec::new();
    for entry in entries {
        match &entry.kind {
            Kind::Dir => {}
            Kind::File(data) => files.push((entry, data)),
            Kind::Symlink(_) => {
                return Err(ArtifactsError::NotRegularFile {
                    path: entry.path.clone(),
                });
            }
        }
    }
    files.sort_by(|a, b| a.0.path.cmp(&b.0.path));

    for (entry, data) in &files {
        let base = entry.path.rsplit('/').next().unwrap_or(&entry.path);
        let write_err = |source| ArtifactsError::Write {
            what: format!("gzip member {:?}", entry.path),
            source,
        };
        // The gzip header's mtime is 32 bits; 0 means "unknown".
        let mtime = u32::try_from(entry.mtime).unwrap_or(0);
        let mut gz = GzBuilder::new()
            .filename(base.as_bytes())
            .comment(entry.path.as_bytes())
            .mtime(mtime)
            .write(&mut out, Compression::default());
        contents.copy(data, &mut gz).map_err(write_err)?;
        gz.finish().map_err(write_err)?;
    }
    Ok((out, files.len()))
}
