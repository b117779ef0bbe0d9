//! A plan's steps, run in the project directory: what GitLab Runner's helper does in the
//! `restore_cache`, `download_artifacts`, `archive_cache` and `upload_artifacts_*` stages,
//! with its messages for the job's trace.
//!
//! Archives wait in the stage's scratch directory (private, removed by the stage's script
//! after it); a downloaded one becomes a tar stream there within the runner's limits before a
//! byte of it reaches the project directory, so a bomb leaves the directory as it was.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use slipway_artifacts::{CollectedTar, Compression, Format, Globs, Limits, keeps};
use slipway_job::data::{ArchiveLimits, DataPlan, DataStep};

use crate::error::HelperError;
use crate::http::{Client, Got, without_query};

/// How a plan ended, as the helper's exit status tells the executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Everything needed was done (a missing cache is fine).
    Done,
    /// Something the job needs failed (a dependency, an upload): the job fails.
    Failed,
    /// An archive broke the runner's limits: the job fails.
    Refused,
}

/// Where a plan runs: the project directory, the scratch directory, the trace.
#[derive(Debug)]
pub struct Stage<'a, W: Write> {
    /// The project directory (archives are unpacked into it and collected from it).
    pub project: &'a Path,
    /// Private scratch space for archives on their way.
    pub scratch: &'a Path,
    /// The job's trace (the helper's stdout).
    pub out: W,
}

impl<W: Write> Stage<'_, W> {
    /// Run every step of `plan`, in order.
    pub fn run(&mut self, plan: &DataPlan) -> Ending {
        let limits = limits_of(plan.limits);
        let tracked: BTreeSet<String> = plan.tracked.iter().cloned().collect();
        let mut ending = Ending::Done;
        for step in &plan.steps {
            let ended = match step {
                DataStep::Download { .. } => self.download(step, plan, &limits),
                DataStep::RestoreCache { .. } => self.restore_cache(step, &limits),
                DataStep::SaveCache { .. } => self.save_cache(step, plan, &tracked),
                DataStep::Upload { .. } => self.upload(step, plan, &tracked),
            };
            match ended {
                Ending::Done => {}
                // A refused archive or a missing dependency ends the stage; a failed upload
                // does not keep the others from going.
                Ending::Refused => return Ending::Refused,
                Ending::Failed if matches!(step, DataStep::Download { .. }) => {
                    return Ending::Failed;
                }
                Ending::Failed => ending = Ending::Failed,
            }
        }
        ending
    }

    fn say(&mut self, line: &str) {
        let _ = writeln!(self.out, "{line}");
        let _ = self.out.flush();
    }

    fn download(&mut self, step: &DataStep, plan: &DataPlan, limits: &Limits) -> Ending {
        let DataStep::Download {
            name,
            id,
            url,
            token,
            attempts,
        } = step
        else {
            return Ending::Done;
        };
        self.say(&format!("Downloading artifacts for {name} ({id})..."));
        let client = match Client::new(plan.ca_pem.as_deref(), Duration::from_secs(3600)) {
            Ok(c) => c,
            Err(e) => {
                self.say(&format!(
                    "ERROR: downloading the artifacts of {name} ({id}): {e}"
                ));
                return Ending::Failed;
            }
        };
        let zip = self.scratch.join(format!("dependency-{id}.zip"));
        let attempts = (*attempts).clamp(1, 10);
        let mut attempt = 1;
        let ended = loop {
            if attempt > 1 {
                self.say(&format!(
                    "Retrying to download the artifacts of {name} (attempt {attempt} of {attempts})"
                ));
            }
            let failed = match retried(1, |_| client.get_to_file(url, Some(token), &zip)) {
                Ok(Got::Saved) => {
                    self.say(&format!(
                        "Downloading artifacts from coordinator... ok  id={id} responseStatus=200 OK"
                    ));
                    match self.unpack(&zip, limits) {
                        Ok(()) => break Ending::Done,
                        // A refused archive is refused again: no retry.
                        Err(e) if e.is_refused() => {
                            self.say(&format!(
                                "ERROR: downloading the artifacts of {name} ({id}): {e}; refused"
                            ));
                            break Ending::Refused;
                        }
                        Err(e) => e.to_string(),
                    }
                }
                Ok(Got::NotFound) => {
                    self.say(&format!(
                        "ERROR: downloading the artifacts of {name} ({id}): {}: 404 Not Found \
                         (expired or erased?)",
                        without_query(url)
                    ));
                    break Ending::Failed;
                }
                Err(e) => format!("{e}{}", e.hint()),
            };
            let _ = std::fs::remove_file(&zip);
            if attempt >= attempts {
                self.say(&format!(
                    "ERROR: downloading the artifacts of {name} ({id}): {failed}"
                ));
                break Ending::Failed;
            }
            self.say(&format!(
                "WARNING: downloading the artifacts of {name}: {failed}"
            ));
            std::thread::sleep(Duration::from_secs(u64::from(attempt)));
            attempt += 1;
        };
        let _ = std::fs::remove_file(&zip);
        ended
    }

    fn restore_cache(&mut self, step: &DataStep, limits: &Limits) -> Ending {
        let DataStep::RestoreCache {
            sources,
            attempts,
            timeout_secs,
        } = step
        else {
            return Ending::Done;
        };
        let client = match Client::new(None, Duration::from_secs((*timeout_secs).max(1))) {
            Ok(c) => c,
            Err(e) => {
                self.say(&format!("WARNING: Failed to download the cache: {e}"));
                return Ending::Done;
            }
        };
        let zip = self.scratch.join("cache.zip");
        for (key, url) in sources {
            self.say(&format!("Checking cache for {key}..."));
            let got = retried(*attempts, |attempt| {
                if attempt > 1 {
                    self.say(&format!(
                        "Retrying to download the cache (attempt {attempt} of {attempts})"
                    ));
                }
                client.get_to_file(url, None, &zip)
            });
            match got {
                Ok(Got::NotFound) => continue,
                Ok(Got::Saved) => {
                    self.say(&format!("Downloading cache from {}", without_query(url)));
                    let unpacked = self.unpack(&zip, limits);
                    let _ = std::fs::remove_file(&zip);
                    match unpacked {
                        Ok(()) => self.say("Successfully extracted cache"),
                        Err(e) if e.is_refused() => {
                            self.say(&format!("ERROR: extracting the cache {key}: {e}; refused"));
                            return Ending::Refused;
                        }
                        Err(e) => self.say(&format!("WARNING: Failed to extract cache: {e}")),
                    }
                    return Ending::Done;
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&zip);
                    self.say(&format!("WARNING: Failed to download the cache: {e}"));
                    return Ending::Done;
                }
            }
        }
        let keys: Vec<&str> = sources.iter().map(|(k, _)| k.as_str()).collect();
        self.say(&format!("WARNING: no cache found for {}", keys.join(", ")));
        Ending::Done
    }

    fn save_cache(
        &mut self,
        step: &DataStep,
        plan: &DataPlan,
        tracked: &BTreeSet<String>,
    ) -> Ending {
        let DataStep::SaveCache {
            key,
            url,
            headers,
            max_upload,
            paths,
            untracked,
            compression,
            format,
            timeout_secs,
            tar,
        } = step
        else {
            return Ending::Done;
        };
        let compression = self.compression(compression, "CACHE_COMPRESSION_LEVEL");
        let (format, warning) = Format::cache_named(format);
        if let Some(w) = warning {
            self.say(&w);
        }
        let file_name = match format {
            Format::TarZstd => "cache.tar.zst",
            _ => "cache.zip",
        };
        if let Some(msg) = self.past_max_size(tar, plan) {
            self.say(&format!("WARNING: collecting the cache failed: {msg}"));
            return Ending::Done;
        }
        let zip = self.scratch.join(format!("{tar}.{}", format.as_str()));
        let collected = self.scratch.join(tar);
        let made = selecting((paths, &[], *untracked, tracked), |keep| {
            slipway_artifacts::archive_file_from_tar_file(
                &collected,
                &zip,
                format,
                keep,
                compression,
            )
        });
        let ended = match made {
            Err(e) => {
                self.say(&format!("WARNING: archiving the cache failed: {e}"));
                Ending::Done
            }
            Ok(made) if made.files == 0 => {
                self.say(&format!(
                    "WARNING: cache {key}: no files matched its paths; not saved"
                ));
                Ending::Done
            }
            Ok(_) => {
                let size = std::fs::metadata(&zip).map(|m| m.len()).unwrap_or(0);
                if *max_upload > 0 && size > *max_upload {
                    self.say(&format!(
                        "WARNING: cache {key} is {size} bytes, over MaxUploadedArchiveSize \
                         ({max_upload}); not uploaded"
                    ));
                } else {
                    self.say(&format!("Uploading {file_name} to {}", without_query(url)));
                    let put = Client::new(None, Duration::from_secs((*timeout_secs).max(1)))
                        .and_then(|c| c.put_file(url, headers, &zip));
                    match put {
                        Ok(()) => self.say(&format!("Created cache {key}")),
                        Err(e) => self.say(&format!("WARNING: uploading the cache failed: {e}")),
                    }
                }
                Ending::Done
            }
        };
        let _ = std::fs::remove_file(&zip);
        ended
    }

    fn upload(&mut self, step: &DataStep, plan: &DataPlan, tracked: &BTreeSet<String>) -> Ending {
        let DataStep::Upload {
            job_id,
            succeeded,
            url,
            token,
            artifact_type,
            artifact_format,
            name,
            expire_in: _,
            compression,
            paths,
            exclude,
            untracked,
            tar,
        } = step
        else {
            return Ending::Done;
        };
        let format = match artifact_format.as_str() {
            "" => Format::Zip,
            f => match Format::parse(f) {
                Some(format) => format,
                None => {
                    self.say(&format!(
                        "WARNING: artifacts {artifact_type:?} in format {f:?} are not supported \
                         yet (zip, gzip and raw are); not uploaded"
                    ));
                    return Ending::Done;
                }
            },
        };
        let compression = self.compression(compression, "ARTIFACT_COMPRESSION_LEVEL");
        if let Some(msg) = self.past_max_size(tar, plan) {
            self.say(&format!("ERROR: collecting artifacts failed: {msg}"));
            return Ending::Refused;
        }
        self.say(&format!(
            "Uploading artifacts for {} job",
            if *succeeded { "successful" } else { "failed" }
        ));
        let selection = (paths.as_slice(), exclude.as_slice(), *untracked, tracked);
        let collected = self.scratch.join(tar);
        let archived = self.scratch.join(format!("{tar}.archive"));
        // A zip is made while it is sent, never written to this host's disk; gzip and raw
        // archives go through a file.
        let prepared = if format == Format::Zip {
            selecting(selection, |keep| CollectedTar::open(&collected, keep))
                .map(|c| (c.files(), Prepared::Stream(c)))
        } else {
            selecting(selection, |keep| {
                slipway_artifacts::archive_file_from_tar_file(
                    &collected,
                    &archived,
                    format,
                    keep,
                    compression,
                )
            })
            .map(|made| (made.files, Prepared::File(made.raw_path)))
        };
        let ended: Ending = match prepared {
            Err(e) => {
                self.say(&format!("ERROR: archiving artifacts: {e}"));
                Ending::Failed
            }
            Ok((0, _)) => {
                self.say(&format!(
                    "WARNING: no files to upload for artifacts {artifact_type:?} (paths {paths:?})"
                ));
                Ending::Done
            }
            Ok((files, prepared)) => {
                self.say(&format!(
                    "{files} files and directories; uploading artifacts as {artifact_type:?} to \
                     coordinator..."
                ));
                let raw_path = match &prepared {
                    Prepared::File(raw_path) => raw_path.as_deref(),
                    Prepared::Stream(_) => None,
                };
                let file_name = file_name(raw_path.or(name.as_deref()), format.as_str());
                let names = (artifact_type.as_str(), format.as_str(), file_name.as_str());
                let sent = Client::new(plan.ca_pem.as_deref(), Duration::from_secs(3600)).and_then(
                    |client| {
                        retried(3, |_| match &prepared {
                            Prepared::Stream(c) => {
                                upload_streamed(&client, url, token, names, (c, compression))
                            }
                            Prepared::File(_) => {
                                upload_framed(&client, url, token, names, Upload::File(&archived))
                            }
                        })
                    },
                );
                match sent {
                    Ok(status) => {
                        self.say(&format!(
                            "Uploading artifacts as {artifact_type:?} to coordinator... {status} \
                             Created  id={job_id}"
                        ));
                        Ending::Done
                    }
                    Err(HelperError::Status { status: 413, .. }) => {
                        self.say(
                            "ERROR: uploading artifacts: artifacts archive too large: GitLab's \
                             maximum artifacts size (project, group or instance setting) is \
                             smaller",
                        );
                        Ending::Failed
                    }
                    Err(e) => {
                        self.say(&format!("ERROR: uploading artifacts: {e}{}", e.hint()));
                        Ending::Failed
                    }
                }
            }
        };
        let _ = std::fs::remove_file(&archived);
        ended
    }

    /// Why the collected files `tar` are refused: more than `[runners.archives] max_size`.
    fn past_max_size(&self, tar: &str, plan: &DataPlan) -> Option<String> {
        let size = std::fs::metadata(self.scratch.join(tar)).map_or(0, |m| m.len());
        let most = plan.limits.max_size;
        (most > 0 && size > most).then(|| {
            format!("the collected files pass {most} bytes ([runners.archives] max_size); refused")
        })
    }

    /// The compression level named `name` (from `variable`); an unknown one is a warning.
    fn compression(&mut self, name: &str, variable: &str) -> Compression {
        let (compression, warning) = Compression::named(name, variable);
        if let Some(w) = warning {
            self.say(&w);
        }
        compression
    }

    /// The zip `zip` unpacked into the project directory: first as a tar stream in the scratch
    /// directory within `limits`, then into place; a refused archive writes nothing there.
    fn unpack(&mut self, zip: &Path, limits: &Limits) -> Result<(), HelperError> {
        let tar = zip.with_extension("tar");
        let converted = slipway_artifacts::archive_file_to_tar_file(zip, &tar, limits);
        let unpacked = converted.map_err(HelperError::from).and_then(|()| {
            let file = std::fs::File::open(&tar).map_err(HelperError::file(&tar))?;
            let mut archive = tar::Archive::new(std::io::BufReader::with_capacity(256 << 10, file));
            archive.set_preserve_permissions(true);
            archive.set_preserve_mtime(true);
            archive.set_overwrite(true);
            archive.unpack(self.project).map_err(HelperError::Unpack)
        });
        let _ = std::fs::remove_file(&tar);
        unpacked
    }
}

/// The runner's limits as the artifacts crate checks them.
fn limits_of(l: ArchiveLimits) -> Limits {
    // The plan's 0 is "no limit", as `[runners.archives]` says.
    let or_none = |v: u64| if v == 0 { u64::MAX } else { v };
    Limits {
        max_size: or_none(l.max_size),
        max_entries: or_none(l.max_entries),
        max_ratio: l.max_ratio,
    }
}

/// `tar` (the collected files) archived into `out` in `format`, keeping what `paths`,
/// `f` given the keep rule of an artifact's paths, `exclude` and `untracked` (the collected
/// tar's paths it keeps).
fn selecting<T>(
    (paths, exclude, untracked, tracked): (&[String], &[String], bool, &BTreeSet<String>),
    f: impl FnOnce(&dyn Fn(&str) -> bool) -> Result<T, slipway_artifacts::ArtifactsError>,
) -> Result<T, HelperError> {
    let includes = Globs::new(paths)?;
    let excludes = Globs::new(exclude)?;
    Ok(f(&|p: &str| {
        keeps(p, &includes, &excludes, untracked, tracked)
    })?)
}

/// What an upload sends as its archive.
enum Prepared {
    /// A zip made from the collected tar while it is sent.
    Stream(CollectedTar),
    /// An archive in the scratch directory, and for raw the stored file's path.
    File(Option<String>),
}

/// One multipart upload of `collected` as a zip made while it is sent: a thread writes it
/// into a pipe that the request reads. A zip that cannot be finished breaks the request off.
fn upload_streamed(
    client: &Client,
    url: &str,
    token: &str,
    names: (&str, &str, &str),
    (collected, compression): (&CollectedTar, Compression),
) -> Result<u16, HelperError> {
    let (reader, writer) = std::io::pipe().map_err(|e| HelperError::Transfer {
        url: without_query(url),
        source: e,
    })?;
    // A roomier pipe than Linux's 64 KiB: fewer switches between the two threads (best
    // effort; the default still works).
    let _ = nix::fcntl::fcntl(&writer, nix::fcntl::FcntlArg::F_SETPIPE_SZ(1 << 20));
    let finished = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let writing = scope.spawn(|| {
            let made = collected.write_zip(compression, writer).map(drop);
            finished.store(made.is_ok(), Ordering::SeqCst);
            made
        });
        let mut body = Finished {
            reader,
            finished: &finished,
        };
        let sent = upload_framed(client, url, token, names, Upload::Stream(&mut body));
        // The read end closed: a writer the server stopped reading stops too (EPIPE).
        drop(body);
        let written = writing.join().unwrap_or_else(|_| {
            Err(slipway_artifacts::ArtifactsError::ZipWrite(
                std::io::Error::other("the archiving thread panicked"),
            ))
        });
        match written {
            // The archive's own failure, not the pipe the request closed.
            Err(e) if !broken_pipe(&e) => Err(e.into()),
            _ => sent,
        }
    })
}

/// Whether `e` is only the pipe's read end gone.
fn broken_pipe(e: &slipway_artifacts::ArtifactsError) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::BrokenPipe
        {
            return true;
        }
        source = s.source();
    }
    false
}

/// A pipe's read end whose end counts only once its writer finished: the end of a zip that
/// failed halfway is an error, so the request is broken off rather than ended.
struct Finished<'a> {
    reader: std::io::PipeReader,
    finished: &'a AtomicBool,
}

impl std::io::Read for Finished<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.reader.read(buf)?;
        if n == 0 && !buf.is_empty() && !self.finished.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("the archive was not finished"));
        }
        Ok(n)
    }
}

/// `f` tried up to `attempts` times while its error is transient; `f` gets the attempt number.
fn retried<T>(
    attempts: u32,
    mut f: impl FnMut(u32) -> Result<T, HelperError>,
) -> Result<T, HelperError> {
    let attempts = attempts.clamp(1, 10);
    let mut attempt = 1;
    loop {
        match f(attempt) {
            Err(e) if e.is_transient() && attempt < attempts => {
                std::thread::sleep(Duration::from_secs(u64::from(attempt)));
                attempt += 1;
            }
            done => return done,
        }
    }
}

/// The multipart file name as GitLab Runner chooses it: the name's base name (`artifacts` by
/// default, `default` if it has none) plus `.zip` or `.gz`.
fn file_name(name: Option<&str>, format: &str) -> String {
    let base = name
        .unwrap_or("artifacts")
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|b| !b.is_empty() && *b != ".")
        .unwrap_or("default");
    match format {
        "zip" | "zipzstd" => format!("{base}.zip"),
        "gzip" => format!("{base}.gz"),
        "tarzstd" => format!("{base}.tar.zst"),
        _ => base.to_string(),
    }
}

/// What a multipart upload sends as its file.
enum Upload<'a> {
    /// An archive in a file.
    File(&'a Path),
    /// An archive read as it is made.
    Stream(&'a mut dyn std::io::Read),
}

/// One multipart upload of `file` (fields `artifact_type`, `artifact_format`, `file`).
fn upload_framed(
    client: &Client,
    url: &str,
    token: &str,
    (kind, format, file_name): (&str, &str, &str),
    file: Upload<'_>,
) -> Result<u16, HelperError> {
    // Values from the job payload must not break the multipart framing.
    let clean = |v: &str| v.replace(['"', '\r', '\n'], "_");
    let boundary = boundary();
    let head = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"artifact_type\"\r\n\r\n{}\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"artifact_format\"\r\n\r\n{}\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{}\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n",
        clean(kind),
        clean(format),
        clean(file_name),
    );
    let tail = format!("\r\n--{boundary}--\r\n");
    let content_type = format!("multipart/form-data; boundary={boundary}");
    match file {
        Upload::File(path) => client.post_framed_file(
            url,
            token,
            &content_type,
            (head.as_bytes(), path, tail.as_bytes()),
        ),
        Upload::Stream(body) => client.post_framed_stream(
            url,
            token,
            &content_type,
            (head.as_bytes(), body, tail.as_bytes()),
        ),
    }
}

/// A boundary for content not read beforehand: 128 bits from the process's random hash keys.
fn boundary() -> String {
    use std::hash::{BuildHasher as _, Hasher as _};
    let word = |salt: u64| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(salt);
        h.finish()
    };
    format!("slipway-{:016x}{:016x}", word(1), word(2))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_stream_whose_archive_was_not_finished_ends_in_an_error_not_an_end() {
        use std::io::{Read as _, Write as _};
        for finished in [false, true] {
            let (reader, mut writer) = std::io::pipe().unwrap();
            writer.write_all(b"PK part").unwrap();
            drop(writer);
            let flag = AtomicBool::new(finished);
            let mut body = Finished {
                reader,
                finished: &flag,
            };
            let mut got = Vec::new();
            let read = body.read_to_end(&mut got);
            assert_eq!(read.is_ok(), finished, "{read:?}");
            assert_eq!(got, b"PK part");
        }
    }

    #[test]
    fn file_names_follow_gitlab_runner() {
        assert_eq!(file_name(None, "zip"), "artifacts.zip");
        assert_eq!(file_name(Some("out/report"), "gzip"), "report.gz");
        assert_eq!(file_name(Some(""), "zip"), "default.zip");
        assert_eq!(file_name(Some("out/app.bin"), "raw"), "app.bin");
    }
}
