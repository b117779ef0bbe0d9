//! Values at their type's extremes where a job payload and `config.toml` hold numbers and
//! durations: whatever is accepted turns into timeouts, deadlines, intervals and limits that the
//! manager can use without a panic (no `Instant` overflow, no zero interval), and whatever is
//! refused is refused with an error naming the key.

use std::time::{Duration, Instant};

use slipway_job::JobResponse;

/// A generated case: which extreme goes into which place.
#[derive(Debug, Clone, bolero::generator::TypeGenerator)]
pub struct Input {
    /// Picks of [`NUMBERS`], one per numeric key (cycled).
    pub numbers: Vec<u8>,
    /// Picks of [`DURATIONS`], one per duration key (cycled).
    pub durations: Vec<u8>,
}

/// Numbers at the edges of u32, u64, i64 and f64, as TOML and JSON can write them.
const NUMBERS: &[&str] = &[
    "0",
    "1",
    "-1",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551615",
    "1e308",
    "0.5",
];

/// Go durations at the edges of what `time.Duration` and Rust's `Duration` hold.
const DURATIONS: &[&str] = &[
    "15s",
    "6h",
    "0s",
    "1ns",
    "-1s",
    "2562047h",
    "2562048h",
    "9223372036854775807ns",
    "18446744073709551615s",
    "106751991167d",
    "584942417355y",
    "1e9h",
];

fn pick<'a>(from: &[&'a str], picks: &[u8], i: usize) -> &'a str {
    let p = picks.get(i % picks.len().max(1)).copied().unwrap_or(0);
    from[usize::from(p) % from.len()]
}

/// Whether a duration can be added to now and used as a deadline.
fn usable(d: Duration) -> bool {
    Instant::now().checked_add(d).is_some()
}

/// The job payload: `runner_info.timeout` and the numbers GitLab sends in it.
fn check_payload(input: &Input) {
    let n = |i| pick(NUMBERS, &input.numbers, i);
    let text = format!(
        r#"{{"id": {id}, "token": "t", "runner_info": {{"timeout": {timeout}}},
            "dependencies": [{{"id": 2, "token": "d", "name": "b",
              "artifacts_file": {{"filename": "a.zip", "size": {size}}}}}],
            "git_info": {{"depth": {depth}}},
            "variables": [{{"key": "GET_SOURCES_ATTEMPTS", "value": "{attempts}"}}]}}"#,
        id = n(0),
        timeout = n(1),
        size = n(2),
        depth = n(3),
        attempts = n(4),
    );
    if let Ok(job) = JobResponse::from_json(&text) {
        let timeout = job.timeout();
        assert!(usable(timeout), "job timeout {timeout:?} from {text}");
        assert!(!timeout.is_zero(), "a zero job timeout from {text}");
        let _ = job.expand("$GET_SOURCES_ATTEMPTS");
    }
}

/// `config.toml`: every numeric and duration key of the manager, the runner, the autoscaler,
/// its policy, the status page and `[runners.archives]`. Whether it loaded.
fn check_config(input: &Input) -> bool {
    let n = |i| pick(NUMBERS, &input.numbers, i);
    let d = |i| pick(DURATIONS, &input.durations, i);
    let text = format!(
        r#"concurrent = {concurrent}
check_interval = {check_interval}
shutdown_timeout = {shutdown_timeout}
[status_page]
  history_interval = "{history_interval}"
  history = "{history}"
[[runners]]
  name = "x"
  executor = "instance"
  limit = {limit}
  request_concurrency = {request_concurrency}
  output_limit = {output_limit}
  [runners.archives]
    max_size = {max_size}
    max_entries = {max_entries}
    max_ratio = {max_ratio}
  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = {capacity}
    max_use_count = {max_use_count}
    max_instances = {max_instances}
    instance_acquire_timeout = "{acquire}"
    update_interval = "{update}"
    update_interval_when_expecting = "{expecting}"
    deletion_retry_interval = "{deletion}"
    shutdown_deletion_interval = "{shutdown_deletion}"
    [[runners.autoscaler.policy]]
      idle_count = {idle_count}
      idle_time = "{idle_time}"
      scale_factor = {scale_factor}
      scale_factor_limit = {scale_factor_limit}
"#,
        concurrent = n(0),
        check_interval = n(1),
        shutdown_timeout = n(2),
        history_interval = d(0),
        history = d(1),
        limit = n(3),
        request_concurrency = n(4),
        output_limit = n(5),
        max_size = n(6),
        max_entries = n(7),
        max_ratio = n(8),
        capacity = n(9),
        max_use_count = n(10),
        max_instances = n(11),
        acquire = d(2),
        update = d(3),
        expecting = d(4),
        deletion = d(5),
        shutdown_deletion = d(6),
        idle_count = n(12),
        idle_time = d(7),
        scale_factor = n(13),
        scale_factor_limit = n(14),
    );
    let loaded = match slipway_config::parse(&text, "config.toml") {
        Ok(l) => l,
        Err(e) => {
            // Refused with the file named, and a key or a line.
            let msg = e.to_string();
            assert!(msg.contains("config.toml"), "{msg}");
            return false;
        }
    };
    let (interval, history) = loaded.config.status_page.history_durations();
    assert!(
        usable(interval) && usable(history) && !interval.is_zero(),
        "{text}"
    );
    for r in &loaded.config.runners {
        let _ = r.archives.limits();
        if let Some(a) = &r.autoscaler {
            let c = a.to_scaler_config(false);
            for (what, d) in [
                ("instance_acquire_timeout", c.instance_acquire_timeout),
                ("update_interval", c.update_interval),
                (
                    "update_interval_when_expecting",
                    c.update_interval_when_expecting,
                ),
                ("deletion_retry_interval", c.deletion_retry_interval),
                ("shutdown_deletion_interval", c.shutdown_deletion_interval),
            ] {
                assert!(usable(d), "{what} {d:?} overflows a deadline:\n{text}");
            }
            for (what, d) in [
                ("update_interval", c.update_interval),
                (
                    "update_interval_when_expecting",
                    c.update_interval_when_expecting,
                ),
            ] {
                assert!(
                    !d.is_zero(),
                    "{what} is zero: an interval of nothing:\n{text}"
                );
            }
        }
    }
    true
}

/// One case: the payload and the config with these extremes.
pub fn check(input: &Input) {
    check_payload(input);
    check_config(input);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The target reaches the conversions: with modest numbers some durations load, the
    /// largest among them, so the deadline and interval checks run on accepted values.
    #[test]
    fn the_generated_configs_load_and_their_durations_are_checked() {
        // The status page's two picks are modest; the autoscaler's are the extremes.
        let loaded: Vec<&str> = (0..DURATIONS.len() as u8)
            .filter(|&d| {
                check_config(&Input {
                    numbers: vec![1],
                    durations: vec![0, 1, d, d, d, d, d, d],
                })
            })
            .map(|d| DURATIONS[usize::from(d)])
            .collect();
        assert!(loaded.contains(&"2562047h"), "{loaded:?}");
        assert!(!loaded.contains(&"18446744073709551615s"), "{loaded:?}");
    }
}
