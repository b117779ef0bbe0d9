//! The job at the bottom of the house: what every other crate needs to know about one CI job,
//! and nothing about where it came from or how it runs.
//!
//! - [`data`]: the plan of a data stage the job helper runs where the job runs.
//! - [`model`]: GitLab's job payload ([`JobResponse`] and friends) with GitLab's JSON names.
//! - [`variables`]: the one `$VAR` / `${VAR}` / `$$` expander, with GitLab's rules.
//! - [`outcome`]: how a job ended: [`FailureReason`] (GitLab's vocabulary), [`JobOutcome`] and
//!   the final [`JobStatus`].
//! - [`trace`]: the job's log, [`Trace`], and its one [`Masker`] of masked variables and token
//!   prefixes.

pub mod data;
pub mod model;
pub mod outcome;
pub mod trace;
pub mod variables;

pub use model::{
    ArtifactSpec, ArtifactsFile, CacheSpec, Credential, Dependency, Features, GitInfo, GitStrategy,
    Image, JobInfo, JobResponse, Port, RunnerInfo, Step, StepName, Variable, When,
};
pub use outcome::{FailureReason, JobOutcome, JobStatus};
pub use trace::{MASK, Masker, Trace, mask_text};
pub use variables::expand_variables;
