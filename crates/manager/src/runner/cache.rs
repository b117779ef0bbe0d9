//! The distributed cache (`[runners.cache] Type = "s3"`, `"gcs"` or `"azure"`), two named stages of every job's
//! life whatever its source (restore with the inputs, archive after the steps, as in GitLab
//! Runner's `build.go`): a job's `cache:` entries restored from and saved to a bucket, under GitLab Runner's object names and in its format
//! (a zip archive), so a fleet moving from GitLab Runner keeps its caches.
//!
//! Every transfer uses a pre-signed URL, valid for the job's timeout: the bucket's keys stay on
//! the manager. The archives travel through the manager's disk, streamed, like artifacts do
//! (memory does not grow with their size): restored ones are
//! unpacked into the job's directory after its sources and before its dependencies'
//! artifacts; saved ones are collected where the job ran as extra artifact entries
//! ([`ArtifactSpec::CACHE_TYPE`]) and archived here. Nothing here fails a job: an unreachable
//! or refusing bucket, a corrupt archive or one over `MaxUploadedArchiveSize` is a warning.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use slipway_artifacts::{Format, Globs};
use slipway_cache::{Store, object_name, transfer};
use slipway_config::CacheConfig;
use slipway_executor::cache::{key_to_save, keys_to_restore};
use slipway_executor::{Collect, CollectedArtifacts, Tarball};
use slipway_job::JobResponse;
use slipway_job::Trace;
use slipway_job::data::DataStep;
use slipway_job::model::ArtifactSpec;
use tokio_util::sync::CancellationToken;

use crate::archive::{attempts_of, compression_of, unzipped};
use slipway_artifacts::keeps;

/// Largest cache archive read back (GitLab Runner has no limit; this keeps a runaway object
/// from filling the manager's memory).
const MAX_RESTORE: usize = 4 * 1024 * 1024 * 1024;

/// A runner's distributed cache (S3, GCS or Azure).
#[derive(Debug)]
pub struct DistributedCache {
    store: Store,
    client: transfer::Client,
    path: String,
    shared: bool,
    short_token: String,
    max_upload: u64,
    /// Where archives wait on their way (the system's temporary directory when `None`).
    scratch: Option<std::path::PathBuf>,
    /// How far a cache archive may expand (`[runners.archives]`).
    limits: slipway_artifacts::Limits,
}

impl DistributedCache {
    /// The cache of `cfg` for the runner whose token's short form is `short_token`; `None`
    /// when jobs use the local cache.
    pub fn new(
        cfg: Option<&CacheConfig>,
        short_token: &str,
        scratch: Option<std::path::PathBuf>,
        limits: slipway_artifacts::Limits,
    ) -> Option<DistributedCache> {
        let cfg = cfg?;
        let store = cfg.store_config()?;
        let made = Store::new(&store)
            .and_then(|store| Ok((store, transfer::Client::new(Duration::from_secs(3600))?)));
        let (store, client) = match made {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(
                    "the distributed cache cannot be used: {e}; jobs use the local cache"
                );
                return None;
            }
        };
        Some(DistributedCache {
            store,
            client,
            path: cfg.path.clone(),
            shared: cfg.shared,
            short_token: short_token.to_string(),
            max_upload: u64::try_from(cfg.max_uploaded_archive_size).unwrap_or(0),
            scratch,
            limits,
        })
    }

    /// `job` as the executor gets it: no `cache:` (no local cache), and one extra artifact
    /// entry per cache to save, collecting its paths where the job runs.
    pub fn for_executor(job: &JobResponse) -> JobResponse {
        let mut out = job.clone();
        for spec in std::mem::take(&mut out.cache) {
            let Some(Ok(key)) = key_to_save(&spec, job) else {
                continue;
            };
            out.artifacts.push(ArtifactSpec {
                name: key,
                untracked: spec.untracked,
                paths: spec.paths.clone(),
                when: spec.when,
                artifact_type: ArtifactSpec::CACHE_TYPE.into(),
                ..ArtifactSpec::default()
            });
        }
        out
    }

    /// `job` as the executor gets it when the job helper moves its caches: no `cache:` (no
    /// local cache either).
    pub fn without_cache(job: &JobResponse) -> JobResponse {
        let mut out = job.clone();
        out.cache.clear();
        out
    }

    /// The job helper's restore steps for the caches of `job` that pull: each with its keys'
    /// pre-signed GET URLs, in the order GitLab tries them. Skipped keys are warnings.
    pub async fn restore_steps(&self, job: &JobResponse, trace: &mut Trace) -> Vec<DataStep> {
        let mut steps = Vec::new();
        for spec in &job.cache {
            let (keys, skipped) = keys_to_restore(spec, job);
            for s in skipped {
                trace.message(&format!(
                    "WARNING: cache key {:?} skipped: {}",
                    s.key, s.reason
                ));
            }
            let mut sources = Vec::new();
            for key in keys {
                let url = match self.object(job, &key) {
                    Ok(object) => self
                        .store
                        .get_url(&object, Self::valid_for(job))
                        .await
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e),
                };
                match url {
                    Ok(url) => sources.push((key, url)),
                    Err(e) => trace.message(&format!("WARNING: {e}")),
                }
            }
            if !sources.is_empty() {
                steps.push(DataStep::RestoreCache {
                    sources,
                    attempts: attempts_of(job, "RESTORE_CACHE_ATTEMPTS"),
                    timeout_secs: request_timeout(job).as_secs(),
                });
            }
        }
        steps
    }

    /// What the job helper collects and saves for the caches of `job` that push, each with
    /// its pre-signed PUT URL.
    pub async fn save_collects(&self, job: &JobResponse, trace: &mut Trace) -> Vec<Collect> {
        let mut out = Vec::new();
        for spec in &job.cache {
            let Some(Ok(key)) = key_to_save(spec, job) else {
                continue;
            };
            let object = match self.object(job, &key) {
                Ok(o) => o,
                Err(e) => {
                    trace.message(&format!("WARNING: {e}"));
                    continue;
                }
            };
            let (url, headers) = match self.store.put_url(&object, Self::valid_for(job)).await {
                Ok(signed) => signed,
                Err(e) => {
                    trace.message(&format!("WARNING: {e}"));
                    continue;
                }
            };
            out.push(Collect {
                when: spec.when,
                paths: spec.paths.clone(),
                exclude: Vec::new(),
                untracked: spec.untracked,
                step: DataStep::SaveCache {
                    key,
                    url,
                    headers,
                    max_upload: self.max_upload,
                    paths: Vec::new(),
                    untracked: spec.untracked,
                    compression: job
                        .variable("CACHE_COMPRESSION_LEVEL")
                        .unwrap_or_default()
                        .to_string(),
                    format: job
                        .variable("CACHE_COMPRESSION_FORMAT")
                        .unwrap_or_default()
                        .to_string(),
                    timeout_secs: request_timeout(job).as_secs(),
                    tar: String::new(),
                },
            });
        }
        out
    }

    fn object(&self, job: &JobResponse, key: &str) -> Result<String, String> {
        object_name(
            &self.path,
            self.shared,
            &self.short_token,
            job.job_info.project_id,
            key,
        )
        .map_err(|e| e.to_string())
    }

    /// How long a URL of `job` stays valid: its timeout (an hour when it has none).
    fn valid_for(job: &JobResponse) -> Duration {
        job.timeout()
    }

    /// The tar streams of the caches of `job` that pull, the first key of each that has an
    /// archive. A cache that cannot be had is a warning, as in GitLab Runner; one that breaks
    /// the `[runners.archives]` limits is the error: a job must not make the manager expand a
    /// bomb, and the job fails rather than run without a cache it was handed.
    pub async fn restore(
        &self,
        job: &JobResponse,
        trace: &mut Trace,
        cancel: &CancellationToken,
    ) -> Result<Vec<Tarball>, String> {
        let mut tars = Vec::new();
        for spec in &job.cache {
            let (keys, skipped) = keys_to_restore(spec, job);
            for s in skipped {
                trace.message(&format!(
                    "WARNING: cache key {:?} skipped: {}",
                    s.key, s.reason
                ));
            }
            if keys.is_empty() {
                continue;
            }
            let mut found = false;
            for key in &keys {
                trace.message(&format!("Checking cache for {key}..."));
                let object = match self.object(job, key) {
                    Ok(o) => o,
                    Err(e) => {
                        trace.message(&format!("WARNING: {e}"));
                        continue;
                    }
                };
                let url = match self.store.get_url(&object, Self::valid_for(job)).await {
                    Ok(url) => url,
                    Err(e) => {
                        trace.message(&format!("WARNING: {e}"));
                        continue;
                    }
                };
                let limit = request_timeout(job);
                // Through files, streamed: memory does not grow with the cache.
                let zip =
                    match slipway_executor::scratch_file(self.scratch.as_deref(), "cache-", ".zip")
                    {
                        Ok(f) => f,
                        Err(e) => {
                            trace.message(&format!(
                                "WARNING: Failed to download the cache: creating a file: {e}"
                            ));
                            found = true;
                            break;
                        }
                    };
                let attempts = attempts_of(job, "RESTORE_CACHE_ATTEMPTS");
                let mut got = Ok(false);
                for attempt in 1..=attempts {
                    if attempt > 1 {
                        trace.message(&format!(
                            "Retrying to download the cache (attempt {attempt} of {attempts})"
                        ));
                    }
                    let get = self.client.get_to_file(&url, &zip, MAX_RESTORE);
                    got = tokio::select! {
                        r = tokio::time::timeout(limit, get) => match r {
                            Ok(r) => r.map_err(|e| e.to_string()),
                            Err(_) => Err(format!("no answer within {limit:?} (CACHE_REQUEST_TIMEOUT)")),
                        },
                        _ = cancel.cancelled() => return Ok(tars),
                    };
                    if got.is_ok() {
                        break;
                    }
                }
                match got {
                    Ok(false) => continue,
                    Ok(true) => {
                        trace.message(&format!(
                            "Downloading cache from {}",
                            url.split('?').next().unwrap_or_default()
                        ));
                        match unzipped(zip, self.scratch.as_deref(), "cache-", self.limits).await {
                            Ok(tar) => {
                                trace.message("Successfully extracted cache");
                                tars.push(tar);
                            }
                            Err(e) if e.is_refused() => {
                                let msg = format!("extracting the cache {key}: {e}");
                                trace.message(&format!("ERROR: {msg}"));
                                return Err(msg);
                            }
                            Err(e) => {
                                trace.message(&format!("WARNING: Failed to extract cache: {e}"))
                            }
                        }
                        found = true;
                        break;
                    }
                    Err(e) => {
                        trace.message(&format!("WARNING: Failed to download the cache: {e}"));
                        found = true;
                        break;
                    }
                }
            }
            if !found {
                trace.message(&format!("WARNING: no cache found for {}", keys.join(", ")));
            }
        }
        Ok(tars)
    }

    /// Archive and upload what was collected for the caches of `job` (as it ran: the entries
    /// [`Self::for_executor`] added are among its artifacts).
    pub async fn save(
        &self,
        job: &JobResponse,
        collected: Vec<CollectedArtifacts>,
        tracked: &Arc<BTreeSet<String>>,
        trace: &mut Trace,
    ) {
        let compression = compression_of(job, "CACHE_COMPRESSION_LEVEL", trace);
        let (format, warning) =
            Format::cache_named(job.variable("CACHE_COMPRESSION_FORMAT").unwrap_or_default());
        if let Some(w) = warning {
            trace.message(&w);
        }
        for c in collected {
            let Some(spec) = job.artifacts.get(c.spec).filter(|s| s.is_cache()) else {
                continue;
            };
            let key = spec.name.clone();
            let object = match self.object(job, &key) {
                Ok(o) => o,
                Err(e) => {
                    trace.message(&format!("WARNING: {e}"));
                    continue;
                }
            };
            let (paths, untracked) = (spec.paths.clone(), spec.untracked);
            let tracked = Arc::clone(tracked);
            let archive = match (
                c.tar.path(),
                slipway_executor::scratch_file(self.scratch.as_deref(), "cache-", ".zip"),
            ) {
                (Some(tar), Ok(out)) => (tar.to_path_buf(), out),
                (None, _) => {
                    trace.message("WARNING: archiving the cache failed: the collected files are not in a file");
                    continue;
                }
                (_, Err(e)) => {
                    trace.message(&format!(
                        "WARNING: archiving the cache failed: creating a file: {e}"
                    ));
                    continue;
                }
            };
            let (tar, zip) = archive;
            // File to file, streamed, off the runtime's threads (compressing is CPU work); the
            // archive's file goes with the task and comes back (nothing left behind).
            let made = tokio::task::spawn_blocking(move || {
                let includes = Globs::new(&paths).map_err(|e| e.to_string())?;
                let excludes = Globs::new(&[]).map_err(|e| e.to_string())?;
                let keep = |p: &str| keeps(p, &includes, &excludes, untracked, &tracked);
                slipway_artifacts::archive_file_from_tar_file(
                    &tar,
                    &zip,
                    format,
                    &keep,
                    compression,
                )
                .map(|made| (made, zip))
                .map_err(|e| e.to_string())
            })
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r);
            let (made, zip) = match made {
                Ok(a) => a,
                Err(e) => {
                    trace.message(&format!("WARNING: archiving the cache failed: {e}"));
                    continue;
                }
            };
            if made.files == 0 {
                trace.message(&format!(
                    "WARNING: cache {key}: no files matched its paths; not saved"
                ));
                continue;
            }
            let size = tokio::fs::metadata(&zip)
                .await
                .map(|m| m.len())
                .unwrap_or(0);
            if self.max_upload > 0 && size > self.max_upload {
                trace.message(&format!(
                    "WARNING: cache {key} is {size} bytes, over MaxUploadedArchiveSize \
                     ({}); not uploaded",
                    self.max_upload
                ));
                continue;
            }
            let (url, headers) = match self.store.put_url(&object, Self::valid_for(job)).await {
                Ok(signed) => signed,
                Err(e) => {
                    trace.message(&format!("WARNING: uploading the cache failed: {e}"));
                    continue;
                }
            };
            trace.message(&format!(
                "Uploading cache.zip to {}",
                url.split('?').next().unwrap_or_default()
            ));
            let limit = request_timeout(job);
            let put = self.client.put_file(&url, &headers, &zip);
            match tokio::time::timeout(limit, put).await {
                Ok(Ok(())) => trace.message(&format!("Created cache {key}")),
                Ok(Err(e)) => trace.message(&format!("WARNING: uploading the cache failed: {e}")),
                Err(_) => trace.message(&format!(
                    "WARNING: uploading the cache failed: no answer within {limit:?} \
                     (CACHE_REQUEST_TIMEOUT)"
                )),
            }
        }
    }
}

/// How long one cache transfer may take: `CACHE_REQUEST_TIMEOUT` minutes, GitLab Runner's 10
/// by default.
fn request_timeout(job: &JobResponse) -> Duration {
    let minutes = job
        .variable("CACHE_REQUEST_TIMEOUT")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|m| *m > 0)
        .unwrap_or(10);
    Duration::from_secs(minutes * 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use slipway_job::model::CacheSpec;

    #[test]
    fn caches_to_save_become_artifact_entries_and_leave_the_local_cache() {
        let mut job = JobResponse {
            cache: vec![
                CacheSpec {
                    key: "deps-$CI_JOB_NAME".into(),
                    paths: vec!["deps/".into()],
                    ..CacheSpec::default()
                },
                CacheSpec {
                    key: "only-read".into(),
                    policy: "pull".into(),
                    paths: vec!["x/".into()],
                    ..CacheSpec::default()
                },
            ],
            ..JobResponse::default()
        };
        job.variables.push(slipway_job::Variable {
            key: "CI_JOB_NAME".into(),
            value: "build".into(),
            ..Default::default()
        });
        let exec = DistributedCache::for_executor(&job);
        assert!(exec.cache.is_empty());
        assert_eq!(exec.artifacts.len(), 1);
        assert_eq!(exec.artifacts[0].name, "deps-build");
        assert!(exec.artifacts[0].is_cache());
    }
}
