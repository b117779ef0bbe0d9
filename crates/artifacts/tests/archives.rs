//! Building zip and gzip artifacts from tar streams and reading zips back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{Read, Write};

use slipway_artifacts::{
    ArtifactsError, Exceeded, Format, Globs, Limits, archive_from_tar, zip_to_tar,
};

const MTIME: u64 = 1_700_000_123;

/// A tar stream built entry by entry.
struct TarBuilder(tar::Builder<Vec<u8>>);

impl TarBuilder {
    fn new() -> Self {
        Self(tar::Builder::new(Vec::new()))
    }

    fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h.set_mtime(MTIME);
        h
    }

    fn dir(mut self, path: &str) -> Self {
        let mut h = Self::header(tar::EntryType::Directory, 0o755, 0);
        self.0.append_data(&mut h, path, std::io::empty()).unwrap();
        self
    }

    fn file(mut self, path: &str, mode: u32, data: &[u8]) -> Self {
        let mut h = Self::header(tar::EntryType::Regular, mode, data.len() as u64);
        self.0.append_data(&mut h, path, data).unwrap();
        self
    }

    fn link(mut self, kind: tar::EntryType, path: &str, target: &str) -> Self {
        let mut h = Self::header(kind, 0o777, 0);
        self.0.append_link(&mut h, path, target).unwrap();
        self
    }

    /// An entry whose raw name the `tar` crate would refuse to write (`..`, absolute).
    fn raw_file(mut self, name: &str, data: &[u8]) -> Self {
        let mut h = Self::header(tar::EntryType::Regular, 0o644, data.len() as u64);
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_cksum();
        self.0.append(&h, data).unwrap();
        self
    }

    fn finish(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }
}

/// What a tar stream unpacks to: path → (kind, mode, content or link target, mtime).
fn unpack(tar: &[u8]) -> BTreeMap<String, (char, u32, Vec<u8>, u64)> {
    let mut archive = tar::Archive::new(tar);
    let mut out = BTreeMap::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        let header = entry.header().clone();
        let (kind, data) = match header.entry_type() {
            tar::EntryType::Directory => ('d', Vec::new()),
            tar::EntryType::Symlink => {
                ('l', entry.link_name_bytes().unwrap().into_owned().to_vec())
            }
            tar::EntryType::Regular => {
                let mut data = Vec::new();
                entry.read_to_end(&mut data).unwrap();
                ('f', data)
            }
            other => panic!("unexpected {other:?}"),
        };
        let path = path.trim_end_matches('/').to_string();
        out.insert(
            path,
            (kind, header.mode().unwrap(), data, header.mtime().unwrap()),
        );
    }
    out
}

fn globs(patterns: &[&str]) -> Globs {
    Globs::new(&patterns.iter().map(|p| p.to_string()).collect::<Vec<_>>()).unwrap()
}

fn zip_with(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, data) in entries {
        zip.start_file(*name, zip::write::SimpleFileOptions::default())
            .unwrap();
        zip.write_all(data).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

#[test]
fn zip_round_trips_content_modes_symlinks_and_times() {
    let long = format!("out/{}/deep.txt", "d".repeat(120));
    let tar = TarBuilder::new()
        .dir("./")
        .dir("./out/")
        .file("./out/a.txt", 0o644, b"alpha\n")
        .file("out/run.sh", 0o755, b"#!/bin/sh\necho hi\n")
        .link(tar::EntryType::Symlink, "out/link", "a.txt")
        .link(tar::EntryType::Link, "out/hard", "out/a.txt")
        .file(&long, 0o600, b"long name")
        .dir("out/tmp")
        .file("out/tmp/junk", 0o644, b"junk")
        .file("src/main.rs", 0o644, b"fn main() {}")
        .finish();
    let paths = globs(&["out/"]);
    let exclude = globs(&["out/tmp"]);
    let keep = |p: &str| paths.is_match(p) && !exclude.is_match(p);

    let archive = archive_from_tar(&tar, Format::Zip, &keep).unwrap();
    assert_eq!(archive.files, 6, "out/, 4 files and the symlink");

    // The zip itself is what GitLab Runner writes: directory entries, deflated files.
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(&archive.bytes)).unwrap();
    let names: Vec<String> = zip.file_names().map(|n| n.unwrap().into_owned()).collect();
    assert!(names.contains(&"out/".to_string()), "{names:?}");
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("out/tmp") || n.starts_with("src"))
    );
    let run = zip.by_name("out/run.sh").unwrap();
    assert_eq!(run.compression(), zip::CompressionMethod::Deflated);
    assert_eq!(run.unix_mode().unwrap() & 0o777, 0o755);
    drop(run);
    assert!(zip.by_name("out/link").unwrap().is_symlink());

    let unpacked = unpack(&zip_to_tar(&archive.bytes).unwrap());
    let keys: Vec<&str> = unpacked.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "out",
            "out/a.txt",
            long.as_str(),
            "out/hard",
            "out/link",
            "out/run.sh"
        ]
    );
    assert_eq!(unpacked["out"].0, 'd');
    assert_eq!(unpacked["out"].1 & 0o777, 0o755);
    assert_eq!(
        unpacked["out/a.txt"],
        ('f', 0o644, b"alpha\n".to_vec(), MTIME)
    );
    assert_eq!(
        unpacked["out/run.sh"],
        ('f', 0o755, b"#!/bin/sh\necho hi\n".to_vec(), MTIME)
    );
    assert_eq!(
        unpacked["out/hard"].2, b"alpha\n",
        "hard link stored as a copy"
    );
    assert_eq!(unpacked[&long].2, b"long name");
    assert_eq!(unpacked[&long].1, 0o600);
    let link = &unpacked["out/link"];
    assert_eq!((link.0, link.2.as_slice()), ('l', &b"a.txt"[..]));
}

#[test]
fn concatenated_tar_streams_are_read_whole_and_the_last_copy_wins() {
    let mut tar = TarBuilder::new()
        .file("a", 0o644, b"first")
        .file("b", 0o644, b"b")
        .finish();
    tar.extend(TarBuilder::new().file("./a", 0o755, b"second").finish());
    let archive = archive_from_tar(&tar, Format::Zip, &|_| true).unwrap();
    assert_eq!(archive.files, 2);
    let unpacked = unpack(&zip_to_tar(&archive.bytes).unwrap());
    assert_eq!(unpacked["a"], ('f', 0o755, b"second".to_vec(), MTIME));
    assert_eq!(unpacked["b"].2, b"b");
}

#[test]
fn gzip_has_one_member_per_file_named_in_its_header() {
    let tar = TarBuilder::new()
        .dir("reports")
        .file("reports/z.xml", 0o644, b"<z/>")
        .file("reports/sub/a.xml", 0o644, b"<a/>")
        .file("other.txt", 0o644, b"no")
        .finish();
    let keep = |p: &str| globs(&["reports/**/*.xml"]).is_match(p);
    let archive = archive_from_tar(&tar, Format::Gzip, &keep).unwrap();
    assert_eq!(archive.files, 2);

    let mut all = String::new();
    flate2::read::MultiGzDecoder::new(archive.bytes.as_slice())
        .read_to_string(&mut all)
        .unwrap();
    assert_eq!(all, "<a/><z/>", "members in path order");

    let mut rest = archive.bytes.as_slice();
    let mut members = Vec::new();
    while !rest.is_empty() {
        let mut gz = flate2::bufread::GzDecoder::new(rest);
        let mut data = String::new();
        gz.read_to_string(&mut data).unwrap();
        let header = gz.header().unwrap();
        members.push((
            String::from_utf8(header.filename().unwrap().to_vec()).unwrap(),
            String::from_utf8(header.comment().unwrap().to_vec()).unwrap(),
            header.mtime(),
            data,
        ));
        rest = gz.into_inner();
    }
    let mtime = MTIME as u32;
    assert_eq!(
        members,
        [
            (
                "a.xml".into(),
                "reports/sub/a.xml".into(),
                mtime,
                "<a/>".into()
            ),
            ("z.xml".into(), "reports/z.xml".into(), mtime, "<z/>".into()),
        ]
    );
}

#[test]
fn gzip_refuses_symlinks() {
    let tar = TarBuilder::new()
        .link(tar::EntryType::Symlink, "report.xml", "/etc/passwd")
        .finish();
    let err = archive_from_tar(&tar, Format::Gzip, &|_| true).unwrap_err();
    assert!(
        matches!(err, ArtifactsError::NotRegularFile { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("report.xml"), "{err}");
}

#[test]
fn unsafe_names_in_zips_are_refused_with_the_entry_named() {
    for name in ["../x", "/etc/x", "a/../../x", "C:/x"] {
        let zip = zip_with(&[("ok.txt", b"fine"), (name, b"evil")]);
        let err = zip_to_tar(&zip).unwrap_err();
        assert!(
            matches!(err, ArtifactsError::UnsafePath { .. }),
            "{name}: {err}"
        );
        assert!(err.to_string().contains(&format!("{name:?}")), "{err}");
    }
}

#[test]
fn zips_cannot_write_through_their_own_symlinks() {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default();
    zip.add_symlink("etc", "/etc", opts).unwrap();
    zip.start_file("etc/passwd", opts).unwrap();
    zip.write_all(b"root::0:0::/:/bin/sh\n").unwrap();
    let zip = zip.finish().unwrap().into_inner();
    let err = zip_to_tar(&zip).unwrap_err();
    assert!(err.to_string().contains("etc/passwd"), "{err}");
}

#[test]
fn unsafe_names_in_the_tar_stream_are_refused() {
    for name in ["../x", "/abs"] {
        let tar = TarBuilder::new().raw_file(name, b"x").finish();
        let err = archive_from_tar(&tar, Format::Zip, &|_| true).unwrap_err();
        assert!(err.to_string().contains(name), "{err}");
    }
}

#[test]
fn zips_without_unix_modes_get_defaults() {
    let zip = zip_with(&[("plain.txt", b"hello")]);
    let unpacked = unpack(&zip_to_tar(&zip).unwrap());
    assert_eq!(unpacked["plain.txt"].2, b"hello");
}

#[test]
fn garbage_gives_errors_not_panics() {
    let garbage: Vec<u8> = (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect();
    assert!(matches!(
        zip_to_tar(&garbage),
        Err(ArtifactsError::ZipRead(_))
    ));
    assert!(zip_to_tar(b"").is_err());
    assert!(archive_from_tar(&garbage, Format::Zip, &|_| true).is_err());

    // A valid zip cut short, and one whose content no longer matches its CRC.
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let stored =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    zip.start_file("a.txt", stored).unwrap();
    zip.write_all(&[b'a'; 4000]).unwrap();
    let zip = zip.finish().unwrap().into_inner();
    assert!(zip_to_tar(&zip[..zip.len() / 2]).is_err());
    let mut corrupt = zip.clone();
    // Well inside the stored content, past the 30-byte local header and the name.
    corrupt[1000] ^= 0xff;
    match zip_to_tar(&corrupt) {
        Err(err) => assert!(err.to_string().contains("a.txt"), "{err}"),
        Ok(_) => panic!("a CRC mismatch must fail"),
    }

    // A tar stream cut in the middle of a file.
    let tar = TarBuilder::new().file("a", 0o644, &[1; 2000]).finish();
    assert!(archive_from_tar(&tar[..1000], Format::Zip, &|_| true).is_err());
}

#[test]
fn format_names() {
    assert_eq!(Format::parse("zip"), Some(Format::Zip));
    assert_eq!(Format::parse("gzip"), Some(Format::Gzip));
    assert_eq!(Format::parse("raw"), Some(Format::Raw));
    assert_eq!(Format::parse("zipzstd"), None);
    assert_eq!(Format::Gzip.as_str(), "gzip");
    assert_eq!(Format::Zip.to_string(), "zip");
}

#[test]
fn raw_artifacts_are_one_file_as_it_is() {
    let mut b = tar::Builder::new(Vec::new());
    for (path, body) in [
        ("gl-sast-report.json", &b"{}\n"[..]),
        ("other.txt", &b"x"[..]),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, path, body).unwrap();
    }
    let tar = b.into_inner().unwrap();
    let one = |p: &str| p == "gl-sast-report.json";
    let a =
        slipway_artifacts::archive_from_tar(&tar, slipway_artifacts::Format::Raw, &one).unwrap();
    assert_eq!(a.bytes, b"{}\n");
    assert_eq!(a.files, 1);
    assert_eq!(a.raw_path.as_deref(), Some("gl-sast-report.json"));
    let two = slipway_artifacts::archive_from_tar(&tar, slipway_artifacts::Format::Raw, &|_| true);
    assert!(
        two.unwrap_err()
            .to_string()
            .contains("raw artifacts hold one file"),
        "two files are refused"
    );
}

/// The file-to-file conversions (used for archives larger than memory should hold) write what
/// the in-memory ones do, hard links and the raw format included, and name a missing file.
#[test]
fn file_conversions_write_what_the_in_memory_ones_do() {
    let big: Vec<u8> = (0..300_000u32).flat_map(|i| i.to_le_bytes()).collect();
    let tar = TarBuilder::new()
        .dir("./out")
        .file("./out/big.bin", 0o640, &big)
        .file("./out/run.sh", 0o755, b"echo hi\n")
        .link(tar::EntryType::Link, "./out/again.bin", "out/big.bin")
        .link(tar::EntryType::Symlink, "./out/latest", "big.bin")
        .finish();
    let dir = tempfile::tempdir().unwrap();
    let (tar_path, zip_path, back_path) = (
        dir.path().join("in.tar"),
        dir.path().join("out.zip"),
        dir.path().join("back.tar"),
    );
    std::fs::write(&tar_path, &tar).unwrap();
    let keep = |p: &str| p != "out/run.sh";
    let made = slipway_artifacts::archive_file_from_tar_file(
        &tar_path,
        &zip_path,
        Format::Zip,
        &keep,
        slipway_artifacts::Compression::Fast,
    )
    .unwrap();
    let in_memory = slipway_artifacts::archive_from_tar_with(
        &tar,
        Format::Zip,
        &keep,
        slipway_artifacts::Compression::Fast,
    )
    .unwrap();
    assert_eq!(made.files, in_memory.files);
    // Deflate's output depends on how the data was fed: compare what the zips hold.
    slipway_artifacts::zip_file_to_tar_file(&zip_path, &back_path, &Limits::default()).unwrap();
    let back = unpack(&std::fs::read(&back_path).unwrap());
    assert_eq!(back, unpack(&zip_to_tar(&in_memory.bytes).unwrap()));
    assert_eq!(back["out/again.bin"].2, big, "a hard link is a copy");
    assert!(!back.contains_key("out/run.sh"));

    let raw_path = dir.path().join("raw");
    let raw = slipway_artifacts::archive_file_from_tar_file(
        &tar_path,
        &raw_path,
        Format::Raw,
        &|p| p == "out/big.bin",
        slipway_artifacts::Compression::Default,
    )
    .unwrap();
    assert_eq!(raw.raw_path.as_deref(), Some("out/big.bin"));
    assert_eq!(std::fs::read(&raw_path).unwrap(), big);

    let missing = dir.path().join("missing.tar");
    let e = slipway_artifacts::archive_file_from_tar_file(
        &missing,
        &raw_path,
        Format::Zip,
        &|_| true,
        slipway_artifacts::Compression::Default,
    )
    .unwrap_err();
    assert!(e.to_string().contains("missing.tar"), "{e}");
}

/// A zip of `files` files of `size` zero bytes each, written to `path` as a bomb is: small,
/// expanding to `files * size`.
fn bomb(path: &std::path::Path, files: usize, size: usize) {
    let mut tar = TarBuilder::new();
    let zeros = vec![0u8; size];
    for i in 0..files {
        tar = tar.file(&format!("zeros-{i}"), 0o644, &zeros);
    }
    let tar = tar.finish();
    let zip = archive_from_tar(&tar, Format::Zip, &|_| true).unwrap();
    std::fs::write(path, zip.bytes).unwrap();
}

/// Each limit refuses the archive while it streams: the tar written stays within the limit
/// (plus one entry's header), and the error names the key that sets it.
#[test]
fn a_zip_bomb_is_refused_while_it_streams() {
    let dir = tempfile::tempdir().unwrap();
    let (zip, out) = (dir.path().join("bomb.zip"), dir.path().join("out.tar"));
    // 200 MiB of zeros in about 200 KiB: a ratio near 1000.
    bomb(&zip, 2, 100 << 20);
    let archived = std::fs::metadata(&zip).unwrap().len();
    assert!(archived < 1 << 20, "{archived}");
    let err = slipway_artifacts::zip_file_to_tar_file(&zip, &out, &Limits::default()).unwrap_err();
    assert!(
        matches!(err, ArtifactsError::Limit(Exceeded::Ratio { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("max_ratio"), "{err}");
    // Refused on the first entry's recorded size: nothing of it was written.
    assert!(std::fs::metadata(&out).unwrap().len() < 4096);

    let small = Limits {
        max_size: 1 << 20,
        ..Limits::default()
    };
    let err = slipway_artifacts::zip_file_to_tar_file(&zip, &out, &small).unwrap_err();
    assert!(
        matches!(err, ArtifactsError::Limit(Exceeded::Size { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("max_size"), "{err}");
    assert!(std::fs::metadata(&out).unwrap().len() < 1 << 20);

    bomb(&zip, 20, 1);
    let few = Limits {
        max_entries: 10,
        ..Limits::default()
    };
    let err = slipway_artifacts::zip_file_to_tar_file(&zip, &out, &few).unwrap_err();
    assert!(
        matches!(err, ArtifactsError::Limit(Exceeded::Entries { limit: 10 })),
        "{err}"
    );
    assert_eq!(
        std::fs::metadata(&out).unwrap().len(),
        0,
        "refused before a write"
    );
    // Within the limits the same archive expands.
    slipway_artifacts::zip_file_to_tar_file(&zip, &out, &Limits::default()).unwrap();
}

/// Noise deflate cannot shrink is stored as it is; text is deflated; both come back whole.
#[test]
fn incompressible_files_are_stored_and_the_rest_deflated() {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let noise: Vec<u8> = (0..(256 << 10))
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let text = "the quick brown fox jumps over the lazy dog\n".repeat(6000);
    let tar = TarBuilder::new()
        .file("out/noise.bin", 0o644, &noise)
        .file("out/log.txt", 0o644, text.as_bytes())
        .finish();
    let archive = archive_from_tar(&tar, Format::Zip, &|_| true).unwrap();
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(archive.bytes.clone())).unwrap();
    let method =
        |zip: &mut zip::ZipArchive<_>, name: &str| zip.by_name(name).unwrap().compression();
    assert_eq!(
        method(&mut zip, "out/noise.bin"),
        zip::CompressionMethod::Stored
    );
    assert_eq!(
        method(&mut zip, "out/log.txt"),
        zip::CompressionMethod::Deflated
    );
    let back = unpack(&zip_to_tar(&archive.bytes).unwrap());
    assert_eq!(back["out/noise.bin"].2, noise);
    assert_eq!(back["out/log.txt"].2, text.as_bytes());
}
