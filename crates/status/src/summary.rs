//! The fleet as text: what `slipway status` prints (the page's content, for a terminal).

use std::fmt::Write as _;

use crate::format::{bytes, duration, money};
use crate::model::FleetStatus;
use crate::page::summary_line;

/// Recent jobs shown per runner.
const RECENT_SHOWN: usize = 10;

/// The whole fleet: a summary line, then each runner's instances with their slots, its
/// pending jobs and its recent jobs. Control characters in names and messages are escaped:
/// the text goes to a terminal.
pub fn render(s: &FleetStatus) -> String {
    printable(&render_raw(s))
}

/// `text` with every control character but newlines escaped (`\u{1b}`).
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() && c != '\n' {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn render_raw(s: &FleetStatus) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "Slipway {} · up {} · {}",
        s.version,
        duration(s.uptime_s),
        summary_line(s)
    );
    if let Some(q) = &s.queue {
        let _ = writeln!(o, "\nqueue: {} jobs waiting for a runner", q.pending);
        for p in &q.jobs {
            let _ = writeln!(
                o,
                "    #{} {} ({}) queued {} ago",
                p.id,
                p.name,
                p.stage,
                duration(p.wait_s)
            );
        }
    }
    for r in &s.runners {
        let t = &r.totals;
        let _ = writeln!(
            o,
            "\nrunner {:?} ({}): {} instances, {} ready, {}/{} slots busy, {} running, {} pending",
            r.name,
            r.executor,
            t.instances,
            t.ready,
            t.busy_slots,
            t.busy_slots + t.idle_slots,
            t.running,
            t.pending
        );
        if let Some(c) = &r.costs {
            let _ = writeln!(
                o,
                "  cost: {} per hour now · {} billed · {} to jobs · {} overhead ({:.0}%)",
                money(c.per_hour, &c.currency),
                money(c.billed, &c.currency),
                money(c.jobs, &c.currency),
                money(c.overhead, &c.currency),
                c.overhead_share() * 100.0
            );
            if !c.unpriced.is_empty() {
                let _ = writeln!(
                    o,
                    "  cost unknown for shapes without price_per_hour: {}",
                    c.unpriced.join(", ")
                );
            }
        }
        for v in &r.vm_starts {
            let _ = writeln!(
                o,
                "  VM starts of {}: {} warm, {} cold",
                v.image, v.warm, v.cold
            );
        }
        for sh in &r.shapes {
            let role = if sh.role.is_empty() {
                String::new()
            } else {
                format!("{}, ", sh.role)
            };
            let _ = writeln!(
                o,
                "  shape {} ({role}group {}, {} slots per instance)",
                sh.name, sh.group, sh.capacity_per_instance
            );
            if let Some(n) = &sh.no_capacity {
                let _ = writeln!(
                    o,
                    "    no capacity for new instances for {} ({} refusals){}",
                    duration(n.since_s),
                    n.refusals,
                    n.diverted_to
                        .as_ref()
                        .map(|to| format!(": new capacity goes to {to}"))
                        .unwrap_or_default()
                );
            }
            if sh.instances.is_empty() {
                let _ = writeln!(o, "    no instances");
                continue;
            }
            let id_w = sh
                .instances
                .iter()
                .map(|i| i.id.len())
                .max()
                .unwrap_or(8)
                .max(8);
            let _ = writeln!(
                o,
                "    {:id_w$}  {:9} {:>6} {:>5}  SLOTS",
                "INSTANCE", "STATE", "AGE", "USES"
            );
            for i in &sh.instances {
                let slots: Vec<String> = i
                    .slots
                    .iter()
                    .map(|sl| match &sl.job {
                        Some(j) => format!(
                            "{}:#{} {} ({}, {})",
                            sl.slot,
                            j.id,
                            j.name,
                            j.level,
                            duration(j.elapsed_s)
                        ),
                        None => format!("{}:free", sl.slot),
                    })
                    .collect();
                let _ = writeln!(
                    o,
                    "    {:id_w$}  {:9} {:>6} {:>5}  {}",
                    i.id,
                    i.state,
                    duration(i.age_s),
                    i.uses,
                    slots.join("  ")
                );
                for sn in &i.snapshots {
                    let _ = writeln!(
                        o,
                        "    {:id_w$}  snapshot {} ({}, {} old)",
                        "",
                        sn.name,
                        bytes(sn.bytes),
                        duration(sn.age_s)
                    );
                }
            }
        }
        if !r.pending.is_empty() {
            let _ = writeln!(o, "  pending:");
            for p in &r.pending {
                let _ = writeln!(
                    o,
                    "    #{} {} ({}, {}) waiting {}",
                    p.id,
                    p.name,
                    p.stage,
                    p.level,
                    duration(p.wait_s)
                );
            }
        }
        if !r.recent.is_empty() {
            let _ = writeln!(o, "  recent:");
            for j in r.recent.iter().take(RECENT_SHOWN) {
                let mut line = format!(
                    "    #{} {} ({}) {} after {}",
                    j.id,
                    j.name,
                    j.stage,
                    j.outcome,
                    duration(j.duration_s)
                );
                if let Some(reason) = &j.failure_reason {
                    let _ = write!(line, ": {reason}");
                }
                if let Some(m) = j.message.as_deref().filter(|m| !m.is_empty()) {
                    let _ = write!(line, " ({m})");
                }
                if let (Some(cost), Some(cur)) = (j.cost, &j.currency) {
                    let _ = write!(line, " · cost {}", money(cost, cur));
                }
                let _ = writeln!(o, "{line}");
            }
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fixtures::shape_with_one_job;
    use crate::model::{PendingJob, RecentJob, RunnerStatus, Totals};

    #[test]
    fn control_characters_never_reach_the_terminal() {
        let s = FleetStatus {
            runners: vec![RunnerStatus {
                name: "r".into(),
                recent: vec![RecentJob {
                    name: "evil\u{1b}]0;owned\u{7}".into(),
                    message: Some("bad\r\u{1b}[2J".into()),
                    ..RecentJob::default()
                }],
                ..RunnerStatus::default()
            }],
            ..FleetStatus::default()
        };
        let text = render(&s);
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{text:?}"
        );
        assert!(text.contains("evil\\u{1b}]0;owned\\u{7}"), "{text}");
    }

    #[test]
    fn the_summary_names_instances_slots_and_jobs() {
        let s = FleetStatus {
            version: "0.1.0".into(),
            runners: vec![RunnerStatus {
                name: "local".into(),
                executor: "instance".into(),
                totals: Totals {
                    instances: 1,
                    ready: 1,
                    busy_slots: 1,
                    idle_slots: 1,
                    pending: 1,
                    running: 1,
                },
                shapes: vec![{
                    let mut shape = shape_with_one_job("build", 5.0);
                    shape.instances[0].uses = 3;
                    shape
                }],
                pending: vec![PendingJob {
                    id: 8,
                    name: "test".into(),
                    stage: "test".into(),
                    level: "none".into(),
                    wait_s: 12.0,
                }],
                recent: vec![RecentJob {
                    id: 6,
                    name: "lint".into(),
                    stage: "test".into(),
                    outcome: "failed".into(),
                    failure_reason: Some("script_failure".into()),
                    cost: Some(0.0123),
                    currency: Some("USD".into()),
                    ..RecentJob::default()
                }],
                vm_starts: vec![crate::model::VmStarts {
                    image: "ci-microvm".into(),
                    warm: 5,
                    cold: 2,
                }],
                costs: Some(crate::model::RunnerCosts {
                    currency: "USD".into(),
                    per_hour: 0.68,
                    billed: 2.0,
                    jobs: 1.5,
                    overhead: 0.5,
                    unpriced: vec!["gpu".into()],
                }),
            }],
            ..FleetStatus::default()
        };
        let text = render(&s);
        assert!(
            text.contains("VM starts of ci-microvm: 5 warm, 2 cold"),
            "{text}"
        );
        assert!(
            text.contains("1 instances · 1 ready · 1/2 slots busy · 1 pending"),
            "{text}"
        );
        assert!(text.contains("0:#7 build (cgroup, 5s)  1:free"), "{text}");
        assert!(text.contains("#8 test (test, none) waiting 12s"), "{text}");
        assert!(
            text.contains("#6 lint (test) failed after 0s: script_failure · cost 0.0123 USD"),
            "{text}"
        );
        assert!(
            text.contains("cost: 0.6800 USD per hour now · 2.00 USD billed · 1.50 USD to jobs · 0.5000 USD overhead (25%)"),
            "{text}"
        );
        assert!(
            text.contains("cost unknown for shapes without price_per_hour: gpu"),
            "{text}"
        );
    }
}
