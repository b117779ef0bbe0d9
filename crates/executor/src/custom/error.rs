//! Why the custom executor cannot run a job.

/// Why the custom executor cannot run.
#[derive(Debug, thiserror::Error)]
pub enum CustomError {
    /// `[runners.custom] run_exec` is empty.
    #[error("custom executor is missing run_exec")]
    MissingRunExec,
    /// Neither `[[runners]] builds_dir` nor `config_exec` names a builds directory.
    #[error("custom executor needs builds_dir (in [[runners]] or from config_exec)")]
    MissingBuildsDir,
    /// The job's temporary directory or files could not be written.
    #[error("cannot write the job's temporary files: {0}")]
    TempFiles(#[from] std::io::Error),
    /// `config_exec` printed something that is not its JSON object.
    #[error("error while parsing JSON output of config_exec: {0}")]
    ConfigJson(#[from] serde_json::Error),
}
