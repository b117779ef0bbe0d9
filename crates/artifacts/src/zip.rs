//! GitLab Runner's `zip` artifact format, written from tar entries and read back into a tar
//! stream.
//!
//! As GitLab Runner's zip archiver: directories are entries of their own, files are deflated,
//! symlinks are stored as symlinks (target as content), Unix permissions and the modification
//! time (MS-DOS time in UTC plus the exact extended timestamp) are kept.

use std::collections::HashSet;
use std::io::{self, Read, Seek, Write};

use ::zip::extra_fields::ExtraField;
use ::zip::write::{FullFileOptions, SimpleFileOptions};
use ::zip::{CompressionMethod, DateTime, System, ZipArchive, ZipWriter};

use crate::entries::{Contents, Entry, Kind, ancestors, cores, finish_tar, link_target, normalize};
use crate::{ArtifactsError, Compression, Limits};

/// Mode given to entries of zips that record none (e.g. made on Windows).
const DEFAULT_FILE_MODE: u32 = 0o644;
const DEFAULT_DIR_MODE: u32 = 0o755;
const DEFAULT_SYMLINK_MODE: u32 = 0o777;

/// Files up to this size are deflated in parallel, in runs of entries compressed by worker
/// threads into zips of their own in memory and then copied, still compressed, in order.
/// Larger files are deflated where they are written (memory stays bounded).
const PARALLEL_FILE_MAX: u64 = 16 << 20;

/// Bytes of files per run handed to a worker.
const RUN_BYTES: u64 = 4 << 20;

/// Writes `entries` (their contents in `contents`) as a zip archive to `out`, deflating on
/// every core.
pub(crate) fn write_zip<W: Write + Seek>(
    entries: &[Entry],
    contents: &dyn Contents,
    compression: Compression,
    out: W,
) -> Result<W, ArtifactsError> {
    write_zip_with(entries, contents, compression, out, cores(), RUN_BYTES)
}

/// [`write_zip`] to a writer that cannot seek (a pipe into an upload): each file's sizes and
/// CRC follow its data in a data descriptor, as in the zips GitLab Runner streams.
pub(crate) fn write_zip_stream<W: Write>(
    entries: &[Entry],
    contents: &dyn Contents,
    compression: Compression,
    out: W,
) -> Result<W, ArtifactsError> {
    let zip = ZipWriter::new_stream(out);
    let zip = fill(zip, entries, contents, compression, cores(), RUN_BYTES)?;
    zip.finish()
        .map(::zip::write::StreamWriter::into_inner)
        .map_err(|e| ArtifactsError::ZipWrite(e.into()))
}

/// [`write_zip`] with `workers` threads and runs of `run_bytes`.
pub(crate) fn write_zip_with<W: Write + Seek>(
    entries: &[Entry],
    contents: &dyn Contents,
    compression: Compression,
    out: W,
    workers: usize,
    run_bytes: u64,
) -> Result<W, ArtifactsError> {
    let zip = fill(
        ZipWriter::new(out),
        entries,
        contents,
        compression,
        workers,
        run_bytes,
    )?;
    zip.finish().map_err(|e| ArtifactsError::ZipWrite(e.into()))
}

/// Appends `entries` to `zip`: runs of small files deflated by `workers` threads into zips of
/// their own and copied in, still compressed; large files deflated in place.
fn fill<W: Write + Seek>(
    mut zip: ZipWriter<W>,
    entries: &[Entry],
    contents: &dyn Contents,
    compression: Compression,
    workers: usize,
    run_bytes: u64,
) -> Result<ZipWriter<W>, ArtifactsError> {
    let err = |e: ::zip::result::ZipError| ArtifactsError::ZipWrite(e.into());
    if workers < 2 || compression.level() == Some(0) {
        write_entries(&mut zip, entries, contents, compression)?;
        return Ok(zip);
    }
    let runs = runs(entries, run_bytes);
    for wave in runs.chunks(workers) {
        let parts: Vec<Result<Vec<u8>, ArtifactsError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = wave
                .iter()
                .map(|run| {
                    scope.spawn(move || match run {
                        Run::Parallel(part) => {
                            let mut z = ZipWriter::new(io::Cursor::new(Vec::new()));
                            write_entries(&mut z, part, contents, compression)?;
                            z.finish().map(io::Cursor::into_inner).map_err(err)
                        }
                        Run::Here(_) => Ok(Vec::new()),
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(ArtifactsError::ZipWrite(io::Error::other(
                            "a compressing thread panicked",
                        )))
                    })
                })
                .collect()
        });
        for (run, part) in wave.iter().zip(parts) {
            match run {
                Run::Here(big) => {
                    write_entries(&mut zip, std::slice::from_ref(*big), contents, compression)?
                }
                Run::Parallel(_) => {
                    let part = ZipArchive::new(io::Cursor::new(part?))
                        .map_err(|e| ArtifactsError::ZipWrite(e.into()))?;
                    zip.merge_archive(part).map_err(err)?;
                }
            }
        }
    }
    Ok(zip)
}

/// Consecutive entries compressed by one worker, or one large file written in place.
enum Run<'e> {
    Parallel(&'e [Entry]),
    Here(&'e Entry),
}

/// `entries` cut, in order, into runs of about `run_bytes` of file contents; each file over
/// [`PARALLEL_FILE_MAX`] a run of its own written in place.
fn runs(entries: &[Entry], run_bytes: u64) -> Vec<Run<'_>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (i, e) in entries.iter().enumerate() {
        let len = match &e.kind {
            Kind::File(data) => data.len(),
            _ => 0,
        };
        if len > PARALLEL_FILE_MAX {
            if start < i {
                out.push(Run::Parallel(&entries[start..i]));
            }
            out.push(Run::Here(e));
            (start, bytes) = (i + 1, 0);
            continue;
        }
        bytes += len;
        if bytes >= run_bytes {
            out.push(Run::Parallel(&entries[start..=i]));
            (start, bytes) = (i + 1, 0);
        }
    }
    if start < entries.len() {
        out.push(Run::Parallel(&entries[start..]));
    }
    out
}

/// Appends `entries` to `zip`, each file deflated at `compression` unless it looks
/// incompressible.
fn write_entries<W: Write + Seek>(
    zip: &mut ZipWriter<W>,
    entries: &[Entry],
    contents: &dyn Contents,
    compression: Compression,
) -> Result<(), ArtifactsError> {
    let err = |e: ::zip::result::ZipError| ArtifactsError::ZipWrite(e.into());
    for entry in entries {
        let options = options(entry).map_err(err)?;
        match &entry.kind {
            Kind::Dir => zip.add_directory(format!("{}/", entry.path), options),
            Kind::Symlink(target) => zip.add_symlink(&entry.path, target, options),
            Kind::File(data) => {
                let options = match compression.level() {
                    Some(0) => options.compression_method(CompressionMethod::Stored),
                    // Deflate would spend the CPU and save nothing (media, archives, noise).
                    _ if incompressible(contents, data).map_err(ArtifactsError::ZipWrite)? => {
                        options.compression_method(CompressionMethod::Stored)
                    }
                    level => options
                        .compression_method(CompressionMethod::Deflated)
                        .compression_level(level),
                };
                let options = options
                    // Sizes from 4 GiB on need ZIP64 records, which must be chosen up front.
                    .large_file(data.len() >= u64::from(u32::MAX));
                zip.start_file(&entry.path, options).and_then(|()| {
                    contents
                        .copy(data, &mut *zip)
                        .map_err(::zip::result::ZipError::Io)
                })
            }
        }
        .map_err(err)?;
    }
    Ok(())
}

/// Bytes of a file sampled to tell whether deflating it is worth it.
const SAMPLE: u64 = 64 * 1024;

/// Whether `data` looks incompressible: its first [`SAMPLE`] bytes deflate (at the fastest
/// level) to more than 97% of their size. Smaller files are always deflated.
fn incompressible(contents: &dyn Contents, data: &crate::entries::Data) -> io::Result<bool> {
    if data.len() < SAMPLE {
        return Ok(false);
    }
    let head = contents.head(data, SAMPLE)?;
    let mut encoder = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(&head)?;
    let deflated = encoder.finish()?.len();
    Ok(deflated * 100 > head.len() * 97)
}

/// The entry's mode and times as zip options.
fn options(entry: &Entry) -> ::zip::result::ZipResult<FullFileOptions<'static, 'static>> {
    let base = SimpleFileOptions::default()
        .system(System::Unix)
        .unix_permissions(entry.mode)
        .last_modified_time(dos_time(entry.mtime));
    match u32::try_from(entry.mtime) {
        Ok(mtime) => base.with_extended_timestamp(Some(mtime), None, None),
        Err(_) => Ok(base.into_full_options()),
    }
}

/// Converts a zip artifacts archive of `archived` bytes into a tar stream (see
/// [`crate::zip_to_tar`]), refusing it once what it expands to breaks `limits`.
pub(crate) fn zip_to_tar<R: Read + Seek, W: Write>(
    zip: R,
    out: W,
    archived: u64,
    limits: &Limits,
) -> Result<W, ArtifactsError> {
    let mut archive = ZipArchive::new(zip).map_err(|e| ArtifactsError::ZipRead(e.into()))?;
    // The central directory's own count first: a million-entry bomb fails before any write.
    limits.check(0, archive.len() as u64, archived)?;
    let mut expanded: u64 = 0;
    let mut builder = tar::Builder::new(out);
    // Symlinks of this archive: nothing may be unpacked through them.
    let mut symlinks: HashSet<String> = HashSet::new();

    for i in 0..archive.len() {
        let mut file = archive
            .by_index(i)
            .map_err(|e| ArtifactsError::ZipRead(e.into()))?;
        let raw_name = file.name_raw().to_vec();
        let shown = || String::from_utf8_lossy(&raw_name).into_owned();
        let entry_err = |source: io::Error| ArtifactsError::ZipEntry {
            path: shown(),
            source,
        };
        let path = normalize(&raw_name)?;
        if path.is_empty() {
            continue;
        }
        if ancestors(&path).any(|a| symlinks.contains(a)) {
            return Err(ArtifactsError::UnsafePath {
                path: shown(),
                reason: "a parent directory is a symlink of the archive",
            });
        }
        let mtime = zip_mtime(&file);
        let mode = file.unix_mode().map(|m| m & 0o7777);
        let mut header = tar::Header::new_gnu();
        header.set_mtime(mtime);

        let written = if file.is_symlink() {
            let mut target = Vec::new();
            file.read_to_end(&mut target).map_err(entry_err)?;
            let target = link_target(&shown(), target.into())?;
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_mode(mode.unwrap_or(DEFAULT_SYMLINK_MODE));
            header.set_size(0);
            symlinks.insert(path.clone());
            builder.append_link(&mut header, &path, &target)
        } else if file.is_dir() {
            header.set_entry_type(tar::EntryType::Directory);
            header.set_mode(mode.unwrap_or(DEFAULT_DIR_MODE));
            header.set_size(0);
            builder.append_data(&mut header, &path, io::empty())
        } else {
            header.set_entry_type(tar::EntryType::Regular);
            header.set_mode(mode.unwrap_or(DEFAULT_FILE_MODE));
            header.set_size(file.size());
            // Streamed; reading to the end checks the CRC, so a corrupt entry fails here (an
            // entry shorter or longer than its recorded size too). The recorded size counts
            // against the limits before a byte is written, and the reader stops one byte past
            // it, so an entry that lies about its size cannot write more either.
            let size = file.size();
            expanded = expanded.saturating_add(size);
            limits.check(expanded, i as u64 + 1, archived)?;
            let mut counted = Counted {
                inner: &mut file,
                read: 0,
                most: size.saturating_add(1),
                failed: None,
            };
            let appended = builder.append_data(&mut header, &path, &mut counted);
            if let Some(source) = counted.failed {
                return Err(entry_err(source));
            }
            if counted.read != size {
                return Err(entry_err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("holds {} bytes, not the {size} it records", counted.read),
                )));
            }
            appended
        };
        written.map_err(|source| ArtifactsError::Write {
            what: format!("tar entry {path:?}"),
            source,
        })?;
    }
    finish_tar(builder)
}

/// A reader that counts what it gave and keeps its error (to tell a corrupt zip entry from a
/// failed write).
struct Counted<'r, R> {
    inner: &'r mut R,
    read: u64,
    /// Bytes it gives at most (then end of file).
    most: u64,
    failed: Option<io::Error>,
}

impl<R: Read> Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let room = usize::try_from(self.most - self.read).unwrap_or(usize::MAX);
        let take = buf.len().min(room);
        let buf = &mut buf[..take];
        if buf.is_empty() {
            return Ok(0);
        }
        match self.inner.read(buf) {
            Ok(n) => {
                self.read += n as u64;
                Ok(n)
            }
            Err(e) => {
                let told = io::Error::new(e.kind(), e.to_string());
                self.failed = Some(e);
                Err(told)
            }
        }
    }
}

/// An entry's modification time in Unix seconds: the extended timestamp when present (exact,
/// UTC), else the MS-DOS time read as UTC (as written by [`write_zip`]).
fn zip_mtime<R: Read>(file: &::zip::read::ZipFile<'_, R>) -> u64 {
    let extended = file.extra_data_fields().find_map(|f| match f {
        ExtraField::ExtendedTimestamp(ts) => ts.mod_time(),
        _ => None,
    });
    match extended {
        Some(t) => u64::from(t),
        None => file.last_modified().map(unix_time).unwrap_or(0),
    }
}

/// Unix seconds → MS-DOS date and time (UTC); times outside 1980..2107 become 1980-01-01.
fn dos_time(unix: u64) -> DateTime {
    let days = i64::try_from(unix / 86_400).unwrap_or(i64::MAX / 2);
    let secs = unix % 86_400;
    let (year, month, day) = civil_from_days(days);
    let fits = |v: i64| u8::try_from(v).ok();
    let parts = (
        u16::try_from(year).ok(),
        fits(month),
        fits(day),
        fits((secs / 3600) as i64),
        fits((secs / 60 % 60) as i64),
        fits((secs % 60) as i64),
    );
    match parts {
        (Some(y), Some(mo), Some(d), Some(h), Some(mi), Some(s)) => {
            DateTime::from_date_and_time(y, mo, d, h, mi, s).unwrap_or(DateTime::DEFAULT)
        }
        _ => DateTime::DEFAULT,
    }
}

/// MS-DOS date and time read as UTC → Unix seconds.
fn unix_time(t: DateTime) -> u64 {
    let days = days_from_civil(
        i64::from(t.year()),
        i64::from(t.month()),
        i64::from(t.day()),
    );
    let secs = days * 86_400
        + i64::from(t.hour()) * 3600
        + i64::from(t.minute()) * 60
        + i64::from(t.second());
    u64::try_from(secs).unwrap_or(0)
}

/// Days since 1970-01-01 → (year, month, day) in the proleptic Gregorian calendar.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    // Shift the epoch to 0000-03-01 so leap days fall at the end of each 400-year era.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// (year, month, day) → days since 1970-01-01 (inverse of [`civil_from_days`]).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = year - i64::from(month <= 2);
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = if month > 2 { month - 3 } else { month + 9 };
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// A tar stream of a directory, a symlink, 300 small text files and one file over
    /// [`PARALLEL_FILE_MAX`] in the middle.
    fn tree() -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let mut add = |path: &str, data: &[u8], mode: u32, mtime: u64| {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(mode);
            h.set_mtime(mtime);
            b.append_data(&mut h, path, data).unwrap();
        };
        for i in 0..300u64 {
            let text = format!("module {i}\n").repeat(200 + i as usize);
            add(
                &format!("mods/m{i}.js"),
                text.as_bytes(),
                0o640 + (i % 2) as u32,
                1_600_000_000 + i,
            );
            if i == 150 {
                add(
                    "mods/big.bin",
                    &vec![7u8; (PARALLEL_FILE_MAX + 1) as usize],
                    0o755,
                    1,
                );
            }
        }
        let mut link = tar::Header::new_gnu();
        link.set_entry_type(tar::EntryType::Symlink);
        link.set_mode(0o777);
        link.set_size(0);
        b.append_link(&mut link, "mods/latest.js", "m299.js")
            .unwrap();
        b.into_inner().unwrap()
    }

    #[test]
    fn zips_deflated_on_several_threads_hold_what_one_thread_writes() {
        let tar = tree();
        let entries = crate::entries::read_tar(io::Cursor::new(&tar), &|_| true).unwrap();
        let contents: &[u8] = &tar;
        let write = |workers| {
            write_zip_with(
                &entries,
                &contents,
                Compression::Default,
                io::Cursor::new(Vec::new()),
                workers,
                8 << 10,
            )
            .unwrap()
            .into_inner()
        };
        let (serial, parallel) = (write(1), write(3));
        // Same entries, in the same order, with the same modes, times and contents.
        let unpacked = |zip: &[u8]| crate::zip_to_tar(zip).unwrap();
        assert_eq!(unpacked(&serial), unpacked(&parallel));
        let names = |zip: &[u8]| {
            let a = ZipArchive::new(io::Cursor::new(zip.to_vec())).unwrap();
            a.file_names()
                .map(|n| n.unwrap().into_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&serial), names(&parallel));
        assert_eq!(names(&parallel).len(), 302);
        unzip_reads(&parallel);
        assert!(parallel.len() < tar.len() / 4, "{}", parallel.len());
    }

    /// A writer that can only append, as a pipe.
    struct Pipe(Vec<u8>);

    impl Write for Pipe {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.write(buf)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_zip_streamed_to_a_pipe_holds_what_a_file_holds_and_unzip_reads_it() {
        let tar = tree();
        let entries = crate::entries::read_tar(io::Cursor::new(&tar), &|_| true).unwrap();
        let contents: &[u8] = &tar;
        let file = write_zip(
            &entries,
            &contents,
            Compression::Default,
            io::Cursor::new(Vec::new()),
        )
        .unwrap()
        .into_inner();
        let streamed =
            write_zip_stream(&entries, &contents, Compression::Default, Pipe(Vec::new()))
                .unwrap()
                .0;
        let unpacked = |zip: &[u8]| crate::zip_to_tar(zip).unwrap();
        assert_eq!(unpacked(&file), unpacked(&streamed));
        unzip_reads(&streamed);
    }

    /// Info-ZIP's unzip checks every entry's CRC and the central directory's offsets.
    fn unzip_reads(zip: &[u8]) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.zip");
        std::fs::write(&file, zip).unwrap();
        let out = std::process::Command::new("unzip")
            .arg("-tq")
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }

    #[test]
    fn runs_keep_order_and_put_large_files_in_place() {
        let tar = tree();
        let entries = crate::entries::read_tar(io::Cursor::new(&tar), &|_| true).unwrap();
        let runs = runs(&entries, 64 << 10);
        let flat: Vec<&str> = runs
            .iter()
            .flat_map(|r| match r {
                Run::Parallel(es) => es.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(),
                Run::Here(e) => vec![e.path.as_str()],
            })
            .collect();
        let all: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(flat, all);
        assert!(
            runs.iter()
                .any(|r| matches!(r, Run::Here(e) if e.path == "mods/big.bin"))
        );
        assert!(runs.len() > 10, "{}", runs.len());
    }

    #[test]
    fn calendar_conversions_round_trip() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        for days in [0, 3653, 11_016, 11_017, 19_000, 47_481] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        // 2024-02-29 12:34:56 UTC
        let t = 1_709_210_096;
        let dos = dos_time(t);
        assert_eq!(
            (dos.year(), dos.month(), dos.day(), dos.hour(), dos.minute()),
            (2024, 2, 29, 12, 34)
        );
        assert_eq!(unix_time(dos), t, "even seconds survive MS-DOS time");
        assert_eq!(dos_time(0), DateTime::DEFAULT, "before 1980");
    }
}
