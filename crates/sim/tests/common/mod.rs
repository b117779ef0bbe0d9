//! Fixtures shared by the simulator's integration tests.

use std::time::Duration;

use slipway_sim::trace::{Job, Trace};

/// Two busy hours of a generated day (11:00–13:00), shifted to start at 0, named `name`.
pub fn busy_hours(day: Trace, name: &str) -> Trace {
    let jobs: Vec<Job> = day
        .jobs
        .iter()
        .filter(|j| (11.0 * 3600.0..13.0 * 3600.0).contains(&j.arrival_s))
        .map(|j| Job {
            arrival_s: j.arrival_s - 11.0 * 3600.0,
            ..*j
        })
        .collect();
    Trace {
        name: name.into(),
        jobs,
        horizon_s: 2.0 * 3600.0,
        start: day.start + Duration::from_secs(11 * 3600),
    }
}
