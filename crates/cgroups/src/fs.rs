//! Small cgroupfs file helpers that turn I/O errors into [`CgroupError`]s naming the path.

use std::fs::{self, OpenOptions};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use crate::error::{CgroupError, Result};

/// Write `value` to an interface file in one `write(2)`, as the kernel expects.
///
/// The file is created if missing, which matters only for tempdir fixtures: cgroupfs refuses
/// to create files, so a missing interface file still fails on a real hierarchy.
pub(crate) fn write(path: &Path, value: &str) -> Result<()> {
    let err = |source| CgroupError::Write {
        path: path.to_path_buf(),
        value: value.to_string(),
        source,
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(err)?;
    file.write_all(value.as_bytes()).map_err(err)
}

/// Read an interface file.
pub(crate) fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(|source| CgroupError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Read an interface file, `None` if it does not exist.
pub(crate) fn read_opt(path: &Path) -> Result<Option<String>> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CgroupError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Read one unsigned number from an interface file, `None` if it does not exist.
pub(crate) fn read_u64_opt(path: &Path, what: &'static str) -> Result<Option<u64>> {
    let Some(s) = read_opt(path)? else {
        return Ok(None);
    };
    s.trim().parse().map(Some).map_err(|_| CgroupError::Parse {
        path: path.to_path_buf(),
        what,
        content: s,
    })
}

/// The value of `key` in a flat-keyed file (`key value` per line), `None` if file or key is
/// missing.
pub(crate) fn read_key_opt(path: &Path, key: &str, what: &'static str) -> Result<Option<u64>> {
    let Some(s) = read_opt(path)? else {
        return Ok(None);
    };
    let Some(value) = s.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some(key)).then(|| words.next())
    }) else {
        return Ok(None);
    };
    value
        .and_then(|v| v.parse().ok())
        .map(Some)
        .ok_or_else(|| CgroupError::Parse {
            path: path.to_path_buf(),
            what,
            content: s.clone(),
        })
}

/// Make one cgroup directory; an existing one is fine.
pub(crate) fn mkdir(path: &Path) -> Result<()> {
    match fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(CgroupError::CreateDir {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Subdirectories (child cgroups) of a cgroup directory; none if it does not exist.
pub(crate) fn child_dirs(path: &Path) -> Result<Vec<PathBuf>> {
    let list_err = |source| CgroupError::ListDir {
        path: path.to_path_buf(),
        source,
    };
    let entries = match fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(list_err(e)),
    };
    let mut dirs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(list_err)?;
        let file_type = entry.file_type().map_err(list_err)?;
        if file_type.is_dir() {
            dirs.push(entry.path());
        }
    }
    dirs.sort();
    Ok(dirs)
}

/// Every cgroup directory in the subtree at `path`, children before their parents.
pub(crate) fn subtree_post_order(path: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    if path.is_dir() {
        collect_post_order(path, &mut out)?;
    }
    Ok(out)
}

fn collect_post_order(path: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for child in child_dirs(path)? {
        collect_post_order(&child, out)?;
    }
    out.push(path.to_path_buf());
    Ok(())
}
