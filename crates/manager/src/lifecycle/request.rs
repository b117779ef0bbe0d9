//! What a job asks for: `SLIPWAY_CPU`, `SLIPWAY_MEMORY` and `SLIPWAY_GPU` job variables.

use slipway_job::JobResponse;
use slipway_taskscaler::Resources;

/// Variable asking for CPUs (`2`, `1.5`, `500m`).
pub const CPU: &str = "SLIPWAY_CPU";
/// Variable asking for memory (`4GiB`, `512Mi`).
pub const MEMORY: &str = "SLIPWAY_MEMORY";
/// Variable asking for GPUs.
pub const GPU: &str = "SLIPWAY_GPU";

/// The job's resource request (empty when it asks for nothing); an error names the variable.
pub fn of_job(job: &JobResponse) -> Result<Resources, String> {
    let get = |name: &str| {
        job.variable(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let mut r = Resources::default();
    if let Some(v) = get(CPU) {
        r.cpu_millis = Resources::parse_cpu(&v).map_err(|e| format!("{CPU}: {e}"))?;
    }
    if let Some(v) = get(MEMORY) {
        r.memory_bytes = Resources::parse_memory(&v).map_err(|e| format!("{MEMORY}: {e}"))?;
    }
    if let Some(v) = get(GPU) {
        r.gpus = Resources::parse_gpus(&v).map_err(|e| format!("{GPU}: {e}"))?;
    }
    Ok(r)
}
