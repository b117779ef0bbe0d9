//! Preemption notices: what `preemption_check_command` printed on an instance, read as the time
//! the instance has left.
//!
//! EC2 answers `GET /latest/meta-data/spot/instance-action` with 404 until a spot instance is to
//! be interrupted, then with `{"action": "terminate", "time": "2026-11-27T17:22:00Z"}`, two
//! minutes ahead. Other clouds say it differently; a command may also print an RFC 3339 time or
//! unix seconds alone.

use std::time::{Duration, SystemTime};

/// The time left when a notice names none, or one that cannot be read: EC2's warning.
pub const DEFAULT_NOTICE: Duration = Duration::from_secs(120);
/// The longest notice taken: a later time is read as this much.
const LONGEST_NOTICE: Duration = Duration::from_secs(24 * 3600);

/// The time the instance has left after `output` (trimmed; empty: no notice) at `now`.
pub fn notice(output: &str, now: SystemTime) -> Option<Duration> {
    let text = output.trim();
    // GCP's `instance/preempted` answers FALSE until it says TRUE.
    if text.is_empty() || text.eq_ignore_ascii_case("false") {
        return None;
    }
    let at = match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(o)) => o
            .get("time")
            .and_then(serde_json::Value::as_str)
            .and_then(|t| humantime::parse_rfc3339_weak(t).ok()),
        Ok(serde_json::Value::Number(n)) => n
            .as_u64()
            .and_then(|s| SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(s))),
        _ => humantime::parse_rfc3339_weak(text).ok(),
    };
    Some(match at {
        Some(at) => at
            .duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(LONGEST_NOTICE),
        None => DEFAULT_NOTICE,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> SystemTime {
        humantime::parse_rfc3339(s).unwrap()
    }

    #[test]
    fn ec2_instance_action_json_gives_the_time_left() {
        let now = at("2026-11-27T17:20:00Z");
        let body = r#"{"action": "terminate", "time": "2026-11-27T17:22:00Z"}"#;
        assert_eq!(notice(body, now), Some(Duration::from_secs(120)));
        // A time already past: nothing left.
        assert_eq!(
            notice(r#"{"action":"stop","time":"2026-11-27T17:19:00Z"}"#, now),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn a_bare_time_or_unix_seconds_or_anything_else_is_read_too() {
        let now = at("2026-11-27T17:20:00Z");
        assert_eq!(
            notice("2026-11-27T17:20:30Z\n", now),
            Some(Duration::from_secs(30))
        );
        let unix = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 45;
        assert_eq!(
            notice(&unix.to_string(), now),
            Some(Duration::from_secs(45))
        );
        assert_eq!(notice("going away", now), Some(DEFAULT_NOTICE));
        assert_eq!(notice("TRUE", now), Some(DEFAULT_NOTICE));
        assert_eq!(notice(" \n", now), None);
        assert_eq!(notice("FALSE\n", now), None);
        // Far future and absurd numbers: capped, never a panic.
        assert_eq!(notice("18446744073709551615", now), Some(DEFAULT_NOTICE));
        assert_eq!(notice("9999-12-31T00:00:00Z", now), Some(LONGEST_NOTICE));
    }
}
