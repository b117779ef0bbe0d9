//! A tar stream handed to a job's directory or collected from it: small ones in memory, large
//! ones in a file on this machine, streamed to and from where the job runs so that memory does
//! not grow with their size.

use std::path::Path;

use tempfile::TempPath;

/// A tar stream, in memory or in a file (removed when dropped).
#[derive(Debug)]
pub enum Tarball {
    /// The stream's bytes.
    Bytes(Vec<u8>),
    /// A file holding the stream, deleted with this value.
    File(TempPath),
}

impl Tarball {
    /// The file, if the stream is in one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Tarball::Bytes(_) => None,
            Tarball::File(p) => Some(p),
        }
    }

    /// Whether the stream holds nothing. A file that cannot be read is not empty: using it
    /// then fails, naming it, rather than dropping it unseen.
    pub fn is_empty(&self) -> bool {
        match self {
            Tarball::Bytes(b) => b.is_empty(),
            Tarball::File(p) => std::fs::metadata(p).is_ok_and(|m| m.len() == 0),
        }
    }

    /// A second handle on the same stream, for a job that may run again elsewhere: bytes are
    /// copied, a file is hard-linked beside itself (both names removed with their values).
    pub fn duplicate(&self) -> std::io::Result<Tarball> {
        match self {
            Tarball::Bytes(b) => Ok(Tarball::Bytes(b.clone())),
            Tarball::File(p) => {
                let dir = p.parent().unwrap_or_else(|| Path::new("."));
                let name = p
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let copy = scratch_file(Some(dir), &format!("{name}."), ".again")?;
                std::fs::remove_file(&copy)?;
                std::fs::hard_link(p, &copy)?;
                Ok(Tarball::File(copy))
            }
        }
    }

    /// The stream's bytes, read from its file if need be (for consumers of small streams).
    pub fn to_bytes(&self) -> std::io::Result<std::borrow::Cow<'_, [u8]>> {
        match self {
            Tarball::Bytes(b) => Ok(std::borrow::Cow::Borrowed(b)),
            Tarball::File(p) => std::fs::read(p).map(std::borrow::Cow::Owned),
        }
    }
}

/// A new empty private file named `<prefix>…<suffix>` in `dir` (created, private, when
/// missing; the system's temporary directory when `None`), removed when the returned path is
/// dropped.
pub fn scratch_file(dir: Option<&Path>, prefix: &str, suffix: &str) -> std::io::Result<TempPath> {
    let mut builder = tempfile::Builder::new();
    builder.prefix(prefix).suffix(suffix);
    let Some(dir) = dir else {
        return builder.tempfile().map(|f| f.into_temp_path());
    };
    match builder.tempfile_in(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            use std::os::unix::fs::DirBuilderExt as _;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
            builder.tempfile_in(dir)
        }
        made => made,
    }
    .map(|f| f.into_temp_path())
}

impl Default for Tarball {
    fn default() -> Self {
        Tarball::Bytes(Vec::new())
    }
}

impl From<Vec<u8>> for Tarball {
    fn from(bytes: Vec<u8>) -> Self {
        Tarball::Bytes(bytes)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_file_tarball_is_private_and_removed_with_its_value() {
        let top = tempfile::tempdir().unwrap();
        // Made when missing (a run without a manager's start, `slipway exec`).
        let dir = top.path().join("state/tmp");
        let t = Tarball::File(scratch_file(Some(&dir), "job-1-", ".tar").unwrap());
        let path = t.path().unwrap().to_path_buf();
        assert!(t.is_empty());
        std::fs::write(&path, b"data").unwrap();
        assert!(!t.is_empty());
        assert_eq!(&*t.to_bytes().unwrap(), b"data");
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
        drop(t);
        assert!(!path.exists());
    }

    #[test]
    fn a_duplicate_outlives_its_original_and_goes_with_its_own_value() {
        let dir = tempfile::tempdir().unwrap();
        let t = Tarball::File(scratch_file(Some(dir.path()), "job-1-", ".tar").unwrap());
        std::fs::write(t.path().unwrap(), b"data").unwrap();
        let again = t.duplicate().unwrap();
        let (a, b) = (
            t.path().unwrap().to_path_buf(),
            again.path().unwrap().to_path_buf(),
        );
        assert_ne!(a, b);
        drop(t);
        assert!(!a.exists());
        assert_eq!(&*again.to_bytes().unwrap(), b"data");
        drop(again);
        assert!(!b.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let bytes = Tarball::Bytes(b"x".to_vec()).duplicate().unwrap();
        assert_eq!(&*bytes.to_bytes().unwrap(), b"x");
    }
}
