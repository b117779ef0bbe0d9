//! Slipway's jobs: the job model (GitLab's job payload), local pipeline files, and the pipeline
//! run state machine.
//!
//! - [`model`]: [`JobResponse`] and friends, with GitLab's JSON field names.
//! - [`pipeline`]: [`Pipeline::from_file`] / [`Pipeline::parse`] read a `.gitlab-ci.yml` subset
//!   strictly (every problem with file, line and key), and [`PipelineJob::to_job_response`] turns
//!   a job into the payload an executor runs.
//! - [`run`]: [`PipelineRun`] decides which jobs start when, following GitLab's semantics.
//! - [`queue`]: the embedded queue, a durable spool directory of jobs for `slipway run`.
//!
//! ```
//! use slipway_jobs::{JobStatus, Pipeline, PipelineOptions, PipelineRun};
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

pub mod gitlab;
pub mod model;
pub mod pipeline;
pub mod queue;
pub mod run;
mod yaml;

pub use model::{
    ArtifactSpec, ArtifactsFile, CacheSpec, Credential, Dependency, Features, GitInfo, GitStrategy,
    Image, JobInfo, JobResponse, Port, RunnerInfo, Step, StepName, Variable, When,
};
pub use pipeline::{
    Checkout, Diagnostic, Need, Pipeline, PipelineError, PipelineJob, PipelineOptions, Retry,
    expand_variables, parse_dotenv, parse_duration, project_files, read_variables_file,
};
pub use run::{JobStatus, PipelineRun, PipelineStatus, RunError, Selection};
