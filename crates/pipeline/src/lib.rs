//! The `.gitlab-ci.yml` language as GitLab reads it, and the run order of a local pipeline.
//!
//! - [`pipeline`]: [`Pipeline::from_file`] / [`Pipeline::parse`] read a pipeline strictly (every
//!   problem with file, line and key), and [`PipelineJob::to_job_response`] turns a job into the
//!   payload an executor runs ([`slipway_job::JobResponse`]).
//! - [`run`]: [`PipelineRun`] decides which jobs start when, following GitLab's semantics.
//! - `yaml`: the YAML reader under both (anchors, `<<` merge keys, `!reference`, positions).
//!
//! ```
//! use slipway_pipeline::{JobStatus, Pipeline, PipelineOptions, PipelineRun};
//!
//! let yaml = "build: {stage: build, script: make}\ntest: {script: make test}\n";
//! let pipeline = Pipeline::parse(yaml, ".gitlab-ci.yml", PipelineOptions::default())?;
//! let mut run = PipelineRun::new(&pipeline, None)?;
//! while !run.is_done() {
//!     for i in run.ready() {
//!         let job = pipeline.jobs[i].to_job_response(i as u64 + 1, 1, &[]);
//!         run.start(i)?;
//!         // ... hand `job` to an executor ...
//!         # let _ = job;
//!         run.finish(i, JobStatus::Success)?;
//!     }
//! }
//! assert_eq!(run.status().to_string(), "success");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod pipeline;
pub mod run;
mod yaml;

pub use pipeline::{
    CHILD_SEPARATOR, Checkout, DEFAULT_STAGES, DEFAULT_TIMEOUT_SECS, Diagnostic,
    ISOLATION_VARIABLE, MAX_CHILD_DEPTH, MAX_PARALLEL, Need, ParallelInstance, Pipeline,
    PipelineError, PipelineJob, PipelineOptions, RESTORE_VARIABLE, Retry, SNAPSHOT_SAVE_VARIABLE,
    SNAPSHOT_VARIABLE, Snapshot, Trigger, parse_dotenv, parse_duration, project_files,
    read_variables_file, slug,
};
pub use run::{JobStatus, PipelineRun, PipelineStatus, RunError, Selection};
