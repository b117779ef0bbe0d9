//! What `/api/v1/status` answers: the fleet per runner and shape, its jobs and its history.
//!
//! Plain data, built by the manager and read by the page, `slipway status` and tests. Nothing
//! here holds a secret: jobs are shown by id, name and stage, failure messages are masked by
//! the board before they get here.

use serde::{Deserialize, Serialize};

/// The whole answer of `/api/v1/status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetStatus {
    /// Slipway's version.
    pub version: String,
    /// When this answer was made (unix ms).
    pub generated_at_ms: i64,
    /// Seconds since the manager started.
    pub uptime_s: f64,
    /// The embedded job queue (`slipway submit`), when the manager consumes one.
    pub queue: Option<QueueStatus>,
    /// Every runner of the config, in file order.
    pub runners: Vec<RunnerStatus>,
    /// The last hours, sampled at a fixed interval.
    pub history: HistorySeries,
}

/// Jobs queued by `slipway submit` that no runner has taken yet.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueStatus {
    /// How many.
    pub pending: u32,
    /// The oldest of them (at most 100), oldest first; `level` is empty: a runner decides it.
    pub jobs: Vec<PendingJob>,
}

/// One `[[runners]]` entry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunnerStatus {
    /// Runner name.
    pub name: String,
    /// Executor (`instance`, `docker-autoscaler`, `shell`, ...).
    pub executor: String,
    /// Counts over every shape.
    pub totals: Totals,
    /// Instance groups, one per shape.
    pub shapes: Vec<ShapeStatus>,
    /// Jobs waiting for capacity or a slot, longest wait first.
    pub pending: Vec<PendingJob>,
    /// Jobs that ended, newest first.
    pub recent: Vec<RecentJob>,
    /// VM starts of `microvm` and `vm` jobs per image: warm (handed a VM started ahead) or
    /// cold.
    #[serde(default)]
    pub vm_starts: Vec<VmStarts>,
    /// What its instances cost and who used them (runners on instances).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub costs: Option<RunnerCosts>,
}

/// A runner's costs since the manager started: instances billed, what jobs were charged, and
/// the overhead no job used.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunnerCosts {
    /// The currency of every amount here (a runner's prices share one).
    pub currency: String,
    /// What the live instances cost per hour now.
    pub per_hour: f64,
    /// Instances billed so far (the live ones up to now).
    pub billed: f64,
    /// Charged to jobs so far (the running ones up to now).
    pub jobs: f64,
    /// What no job used: `billed - jobs`.
    pub overhead: f64,
    /// Shapes without a price: their costs are unknown, and not in the figures above.
    #[serde(default)]
    pub unpriced: Vec<String>,
}

impl RunnerCosts {
    /// The overhead's share of what was billed (0 before anything was).
    pub fn overhead_share(&self) -> f64 {
        if self.billed > 0.0 {
            self.overhead / self.billed
        } else {
            0.0
        }
    }
}

/// One image's VM starts since the manager started.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmStarts {
    /// The VM image.
    pub image: String,
    /// Jobs handed a VM their slot had ready (warm hits).
    pub warm: u64,
    /// Jobs whose VM was started for them (warm misses, or warm slots off).
    pub cold: u64,
}

/// Counts over a runner's shapes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Instances in any state.
    pub instances: u32,
    /// Instances that may take jobs.
    pub ready: u32,
    /// Slots holding a job.
    pub busy_slots: u32,
    /// Slots of ready instances holding none.
    pub idle_slots: u32,
    /// Jobs waiting.
    pub pending: u32,
    /// Jobs running.
    pub running: u32,
}

/// One shape's instance group.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ShapeStatus {
    /// Shape name (`default` without shapes).
    pub name: String,
    /// The plugin's group id.
    pub group: String,
    /// Slots per instance.
    pub capacity_per_instance: u32,
    /// Most instances (0: no limit).
    pub max_instances: u32,
    /// Jobs per instance before it is replaced (0: no limit).
    pub max_use_count: u32,
    /// `spot` (preemptible capacity), `fallback` (takes a spot shape's new capacity when
    /// that has none) or empty.
    #[serde(default)]
    pub role: String,
    /// Its provider refuses new instances for lack of capacity: since when, how often, and
    /// the shape its new capacity goes to meanwhile (if it has a fallback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_capacity: Option<NoCapacity>,
    /// Instances, oldest first.
    pub instances: Vec<InstanceStatus>,
}

/// A shape whose provider refuses new instances for lack of capacity.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NoCapacity {
    /// Seconds since the first refusal of this run of them.
    pub since_s: f64,
    /// Refusals in this run.
    pub refusals: u64,
    /// The fallback shape taking new capacity now, once the refusals lasted long enough.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diverted_to: Option<String>,
}

/// One instance.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InstanceStatus {
    /// The plugin's instance id.
    pub id: String,
    /// `creating`, `booting` (running, not ready yet), `idle`, `busy`, `full`, `removing`,
    /// `deleting` or the plugin's state.
    pub state: String,
    /// Seconds since it was first seen.
    pub age_s: f64,
    /// Jobs it has taken.
    pub uses: u32,
    /// Its slots in order.
    pub slots: Vec<SlotStatus>,
    /// Snapshots its nesting daemon holds (VM isolation), newest first.
    pub snapshots: Vec<SnapshotStatus>,
}

/// One slot of an instance.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SlotStatus {
    /// Slot number.
    pub slot: u32,
    /// The job on it, if any.
    pub job: Option<SlotJob>,
}

/// The job holding a slot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SlotJob {
    /// Job id (`0` when the holder is not a job the board knows).
    pub id: u64,
    /// Job name.
    pub name: String,
    /// Stage.
    pub stage: String,
    /// Isolation level.
    pub level: String,
    /// Seconds since it got the slot.
    pub elapsed_s: f64,
}

/// A job waiting for capacity or a slot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PendingJob {
    /// Job id.
    pub id: u64,
    /// Job name.
    pub name: String,
    /// Stage.
    pub stage: String,
    /// Isolation level it asked for.
    pub level: String,
    /// Seconds it has waited.
    pub wait_s: f64,
}

/// A job that ended.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RecentJob {
    /// Job id.
    pub id: u64,
    /// Job name.
    pub name: String,
    /// Stage.
    pub stage: String,
    /// `success`, `failed` or `canceled`.
    pub outcome: String,
    /// GitLab's failure reason (`script_failure`, `runner_system_failure`, ...).
    pub failure_reason: Option<String>,
    /// What went wrong, masked.
    pub message: Option<String>,
    /// The script's exit code.
    pub exit_code: Option<i32>,
    /// Instance it ran on.
    pub instance: Option<String>,
    /// Slot it ran on.
    pub slot: Option<u32>,
    /// Isolation level.
    pub level: String,
    /// Seconds it waited for its slot.
    pub wait_s: f64,
    /// Seconds it ran (0 when it never got a slot).
    pub duration_s: f64,
    /// When it ended (unix ms).
    pub ended_at_ms: i64,
    /// What it cost (its share of its instance over the time it held its slot), when its
    /// shape has a price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    /// The currency of `cost`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
}

/// A snapshot a nesting daemon holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SnapshotStatus {
    /// Snapshot name.
    pub name: String,
    /// Bytes of its memory image and disk layer.
    pub bytes: u64,
    /// Seconds since it was taken.
    pub age_s: f64,
}

/// Samples of the last hours, one column per series (compact in JSON).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HistorySeries {
    /// Seconds between samples.
    pub interval_s: f64,
    /// Sample times (unix ms).
    pub t_ms: Vec<i64>,
    /// Instances, all runners.
    pub instances: Vec<u32>,
    /// Busy slots, all runners.
    pub busy_slots: Vec<u32>,
    /// Jobs waiting, all runners.
    pub queue_depth: Vec<u32>,
    /// p95 of the waits of jobs that got a slot in the interval and of those still waiting.
    pub p95_wait_s: Vec<f64>,
}

impl FleetStatus {
    /// Counts over every runner.
    pub fn totals(&self) -> Totals {
        let mut t = Totals::default();
        for r in &self.runners {
            t.instances += r.totals.instances;
            t.ready += r.totals.ready;
            t.busy_slots += r.totals.busy_slots;
            t.idle_slots += r.totals.idle_slots;
            t.pending += r.totals.pending;
            t.running += r.totals.running;
        }
        t
    }
}

/// Fleets for the tests of the renderers.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    /// Shape `default` of group `g` with one busy instance `i-1`: slot 0 holds job 7 (`name`,
    /// stage build, level cgroup, `elapsed_s`), slot 1 is free.
    pub(crate) fn shape_with_one_job(name: &str, elapsed_s: f64) -> ShapeStatus {
        ShapeStatus {
            name: "default".into(),
            group: "g".into(),
            capacity_per_instance: 2,
            instances: vec![InstanceStatus {
                id: "i-1".into(),
                state: "busy".into(),
                slots: vec![
                    SlotStatus {
                        slot: 0,
                        job: Some(SlotJob {
                            id: 7,
                            name: name.into(),
                            stage: "build".into(),
                            level: "cgroup".into(),
                            elapsed_s,
                        }),
                    },
                    SlotStatus { slot: 1, job: None },
                ],
                ..InstanceStatus::default()
            }],
            ..ShapeStatus::default()
        }
    }
}
