//! The benchmark result file every Slipway bench writes: `bench/results/NAME.json` as
//! `{"bench", "command", "machine", "date", "results"}`.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// The `p`th percentile (0–100, nearest rank over `sorted.len() - 1`) of sorted samples; NaN
/// when there are none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p / 100.0 * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Milliseconds of `d`.
pub fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `x` to three decimals, as results files keep times.
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// `N cores, CPU model` of this machine.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cores} cores, {model}")
}

/// Write `results` as `<repo>/bench/results/<name>.json` and return the file's path and text.
///
/// `repo` is the workspace root; `command` must regenerate the file.
pub fn write(
    repo: &Path,
    name: &str,
    command: &str,
    results: Value,
) -> std::io::Result<(PathBuf, String)> {
    let doc = json!({
        "bench": name,
        "command": command,
        "machine": machine(),
        "date": chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        "results": results,
    });
    let dir = repo.join("bench/results");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(&doc).map_err(std::io::Error::other)? + "\n";
    std::fs::write(&path, &text)?;
    Ok((path, text))
}

/// Replace the `results` entries named in `entries` of an existing
/// `<repo>/bench/results/<name>.json`, keeping every other byte of it (the other results,
/// and the top-level `command`, `machine` and `date` that describe them); return the path and
/// text written.
pub fn merge(
    repo: &Path,
    name: &str,
    entries: serde_json::Map<String, Value>,
) -> std::io::Result<(PathBuf, String)> {
    let path = repo.join("bench/results").join(format!("{name}.json"));
    let old = std::fs::read_to_string(&path)?;
    let mut doc: Value = serde_json::from_str(&old).map_err(std::io::Error::other)?;
    let Some(results) = doc.get_mut("results").and_then(Value::as_object_mut) else {
        return Err(std::io::Error::other(format!(
            "{} has no \"results\" object to merge into",
            path.display()
        )));
    };
    for (k, v) in entries {
        results.insert(k, v);
    }
    let text = serde_json::to_string_pretty(&doc).map_err(std::io::Error::other)? + "\n";
    std::fs::write(&path, &text)?;
    Ok((path, text))
}
