//! GitLab Runner's `tarzstd` cache format (`CACHE_COMPRESSION_FORMAT: tarzstd`): a tar stream
//! compressed as one Zstandard stream, written with every core, and read back into a checked
//! tar stream.
//!
//! As GitLab Runner's tar archiver: directories, regular files and symlinks with their Unix
//! permissions and modification times; nothing else.

use std::collections::HashSet;
use std::io::{self, Read, Write};

use tar::EntryType;

use crate::entries::{Contents, Entry, Kind, ancestors, cores, finish_tar, link_target, normalize};
use crate::{ArtifactsError, Compression, Limits};

/// The first bytes of every Zstandard frame (RFC 8878).
pub(crate) const MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// Writes `entries` (their contents in `contents`) as a zstd-compressed tar stream to `out`,
/// compressing on every core of the machine while this thread reads and feeds the files.
pub(crate) fn write_tar_zstd<W: Write>(
    entries: &[Entry],
    contents: &dyn Contents,
    compression: Compression,
    out: W,
) -> Result<W, ArtifactsError> {
    let err = |source: io::Error| ArtifactsError::Write {
        what: "the tar.zst archive".into(),
        source,
    };
    let mut encoder =
        zstd::stream::write::Encoder::new(out, compression.zstd_level()).map_err(err)?;
    let workers = cores();
    // zstd's workers compress while the caller's thread reads the next files; one worker is
    // the plain single-threaded stream.
    if workers > 1 {
        encoder
            .multithread(u32::try_from(workers).unwrap_or(1))
            .map_err(err)?;
    }
    let mut builder = tar::Builder::new(encoder);
    for entry in entries {
        let mut header = tar::Header::new_gnu();
        header.set_mode(entry.mode);
        header.set_mtime(entry.mtime);
        let written = match &entry.kind {
            Kind::Dir => {
                header.set_entry_type(EntryType::Directory);
                header.set_size(0);
                builder.append_data(&mut header, format!("{}/", entry.path), io::empty())
            }
            Kind::Symlink(target) => {
                header.set_entry_type(EntryType::Symlink);
                header.set_size(0);
                builder.append_link(&mut header, &entry.path, target)
            }
            Kind::File(data) => {
                header.set_entry_type(EntryType::Regular);
                header.set_size(data.len());
                contents.reader(data).and_then(|mut content| {
                    builder.append_data(&mut header, &entry.path, &mut content)
                })
            }
        };
        written.map_err(|source| ArtifactsError::Write {
            what: format!("tar entry {:?}", entry.path),
            source,
        })?;
    }
    builder
        .into_inner()
        .and_then(|encoder| encoder.finish())
        .map_err(err)
}

/// Turns a zstd-compressed tar stream of `archived` bytes into a plain tar stream on `out`,
/// refusing what [`crate::zip_to_tar`] refuses (absolute paths, `..`, entries under a symlink
/// of the archive) and holding it to `limits` before each entry's bytes are written. Hard
/// links, devices and FIFOs are skipped.
pub(crate) fn tar_zstd_to_tar<R: Read, W: Write>(
    input: R,
    out: W,
    archived: u64,
    limits: &Limits,
) -> Result<W, ArtifactsError> {
    let decoder = zstd::stream::read::Decoder::new(input).map_err(ArtifactsError::Tar)?;
    let mut archive = tar::Archive::new(decoder);
    let mut builder = tar::Builder::new(out);
    let mut symlinks: HashSet<String> = HashSet::new();
    let (mut expanded, mut count) = (0u64, 0u64);
    for entry in archive.entries().map_err(ArtifactsError::Tar)? {
        let mut entry = entry.map_err(ArtifactsError::Tar)?;
        let path = normalize(&entry.path_bytes())?;
        let header = entry.header();
        let entry_type = header.entry_type();
        let mode = header.mode().map_err(ArtifactsError::Tar)? & 0o7777;
        let mtime = header.mtime().map_err(ArtifactsError::Tar)?;
        if path.is_empty()
            || !matches!(
                entry_type,
                EntryType::Regular
                    | EntryType::Continuous
                    | EntryType::Directory
                    | EntryType::Symlink
            )
        {
            continue;
        }
        if ancestors(&path).any(|a| symlinks.contains(a)) {
            return Err(ArtifactsError::UnsafePath {
                path,
                reason: "a parent directory is a symlink of the archive",
            });
        }
        count += 1;
        let size = if entry_type == EntryType::Directory || entry_type == EntryType::Symlink {
            0
        } else {
            entry.size()
        };
        expanded = expanded.saturating_add(size);
        limits.check(expanded, count, archived)?;
        let mut h = tar::Header::new_gnu();
        h.set_mode(mode);
        h.set_mtime(mtime);
        let written = match entry_type {
            EntryType::Directory => {
                h.set_entry_type(EntryType::Directory);
                h.set_size(0);
                builder.append_data(&mut h, &path, io::empty())
            }
            EntryType::Symlink => {
                let target = link_target(&path, entry.link_name_bytes().unwrap_or_default())?;
                h.set_entry_type(EntryType::Symlink);
                h.set_size(0);
                symlinks.insert(path.clone());
                builder.append_link(&mut h, &path, &target)
            }
            _ => {
                h.set_entry_type(EntryType::Regular);
                h.set_size(size);
                // The tar reader gives exactly the header's size (or fails on a short stream).
                builder.append_data(&mut h, &path, &mut entry)
            }
        };
        written.map_err(|source| ArtifactsError::Write {
            what: format!("tar entry {path:?}"),
            source,
        })?;
    }
    finish_tar(builder)
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::process::Command;

    use crate::{Format, Limits, archive_file_from_tar_file, archive_file_to_tar_file};

    /// A tar stream of `files` (path, content) and `out/` with a symlink `out/link`.
    fn collected(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let mut dir = tar::Header::new_gnu();
        dir.set_entry_type(tar::EntryType::Directory);
        dir.set_mode(0o755);
        dir.set_size(0);
        b.append_data(&mut dir, "out/", std::io::empty()).unwrap();
        for (path, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o750);
            h.set_mtime(1_700_000_000);
            b.append_data(&mut h, path, *data).unwrap();
        }
        let mut link = tar::Header::new_gnu();
        link.set_entry_type(tar::EntryType::Symlink);
        link.set_mode(0o777);
        link.set_size(0);
        b.append_link(&mut link, "out/link", "a.txt").unwrap();
        b.into_inner().unwrap()
    }

    fn tar_zst(dir: &Path, tar: &[u8], name: &str) -> std::path::PathBuf {
        let input = dir.join(format!("{name}.tar"));
        std::fs::write(&input, tar).unwrap();
        let out = dir.join(format!("{name}.tar.zst"));
        let made = archive_file_from_tar_file(
            &input,
            &out,
            Format::TarZstd,
            &|_| true,
            crate::Compression::Default,
        )
        .unwrap();
        assert_eq!(made.files, 4);
        out
    }

    #[test]
    fn zstd_and_tar_read_what_we_write_and_we_read_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let long = format!("out/{}/deep.txt", "d".repeat(120));
        let text = b"hello zstd\n".repeat(10_000);
        let made = tar_zst(
            dir.path(),
            &collected(&[("out/a.txt", &text), (&long, b"deep")]),
            "c",
        );
        // zstd -d | tar x: what GitLab Runner's extractor (and any user) does with the file.
        let unpacked = dir.path().join("x");
        std::fs::create_dir(&unpacked).unwrap();
        let st = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "zstd -dc {} | tar -x -C {}",
                made.display(),
                unpacked.display()
            ))
            .status()
            .unwrap();
        assert!(st.success());
        assert_eq!(std::fs::read(unpacked.join("out/a.txt")).unwrap(), text);
        assert_eq!(std::fs::read(unpacked.join(&long)).unwrap(), b"deep");
        assert_eq!(
            std::fs::read_link(unpacked.join("out/link")).unwrap(),
            Path::new("a.txt")
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(unpacked.join("out/a.txt"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o750);
        assert!(std::fs::metadata(&made).unwrap().len() < text.len() as u64 / 20);

        // Read back through the sniffing reader: a plain tar with the same entries.
        let back = dir.path().join("back.tar");
        archive_file_to_tar_file(&made, &back, &Limits::default()).unwrap();
        let listed = Command::new("tar").arg("-tvf").arg(&back).output().unwrap();
        let listed = String::from_utf8_lossy(&listed.stdout);
        for want in ["out/a.txt", "out/link -> a.txt", "deep.txt"] {
            assert!(listed.contains(want), "{want} in {listed}");
        }
    }

    #[test]
    fn an_archive_made_by_gnu_tar_and_zstd_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir_all(src.join("vendor/pkg")).unwrap();
        std::fs::write(src.join("vendor/pkg/lib.rs"), b"pub fn f() {}\n").unwrap();
        let made = dir.path().join("cache.zst");
        let st = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "tar -c -C {} vendor | zstd -q -T0 -o {}",
                src.display(),
                made.display()
            ))
            .status()
            .unwrap();
        assert!(st.success());
        let back = dir.path().join("back.tar");
        archive_file_to_tar_file(&made, &back, &Limits::default()).unwrap();
        let mut a = tar::Archive::new(std::fs::File::open(&back).unwrap());
        let paths: Vec<String> = a
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(paths, ["vendor", "vendor/pkg", "vendor/pkg/lib.rs"]);
    }

    #[test]
    fn a_zstd_bomb_or_an_escape_is_refused_before_it_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let zeros = vec![0u8; 80 << 20];
        let bomb = tar_zst(
            dir.path(),
            &collected(&[("out/a.txt", &zeros), ("out/b", b"b")]),
            "bomb",
        );
        let out = dir.path().join("bomb.tar");
        let limits = Limits {
            max_size: 1 << 20,
            ..Limits::default()
        };
        let e = archive_file_to_tar_file(&bomb, &out, &limits).unwrap_err();
        assert!(e.to_string().contains("max_size"), "{e}");
        // The entry's declared size fails the check before its bytes are copied.
        assert!(std::fs::metadata(&out).unwrap().len() < 64 << 10);
        let e = archive_file_to_tar_file(&bomb, &out, &Limits::default()).unwrap_err();
        assert!(e.to_string().contains("max_ratio"), "{e}");

        // `../` made by hand: tar::Builder refuses to write it.
        let mut raw = tar::Header::new_gnu();
        raw.as_gnu_mut().unwrap().name[..12].copy_from_slice(b"../escape.sh");
        raw.set_size(2);
        raw.set_mode(0o644);
        raw.set_cksum();
        let mut stream = raw.as_bytes().to_vec();
        stream.extend_from_slice(&[b'x'; 2]);
        stream.resize(512 * 4, 0);
        let evil = dir.path().join("evil.zst");
        std::fs::write(&evil, zstd::encode_all(&stream[..], 3).unwrap()).unwrap();
        let e = archive_file_to_tar_file(&evil, &out, &Limits::default()).unwrap_err();
        assert!(e.to_string().contains("escape.sh"), "{e}");
    }
}
