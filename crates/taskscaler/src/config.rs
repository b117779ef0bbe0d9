//! Taskscaler settings: the `[runners.autoscaler]` keys this version honours.

use std::time::Duration;

pub use crate::forecast::Forecast;
use crate::policy::Policy;
use crate::resources::Resources;

/// What the taskscaler is allowed to do (GitLab's meaning and defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Concurrent jobs (slots) per instance.
    pub capacity_per_instance: u32,
    /// Cap on instances in any state; 0 = unlimited.
    pub max_instances: u32,
    /// Jobs per instance before it is removed; 0 = unlimited.
    pub max_use_count: u32,
    /// `[[runners.autoscaler.policy]]`; the last whose periods match is in force.
    pub policies: Vec<Policy>,
    /// Token bucket on instance creation.
    pub scale_throttle: ScaleThrottle,
    /// Outstanding reservations may not exceed idle capacity minus one instance's worth
    /// (GitLab's taskscaler!60): keeps long-polls from blocking scale-down.
    pub reservation_throttling: bool,
    /// Consecutive failed health checks before an instance is replaced.
    pub failure_threshold: u32,
    /// Slipway's demand forecast (off = GitLab's algorithm).
    pub forecast: Option<Forecast>,
    /// How long `acquire` waits for capacity.
    pub instance_acquire_timeout: Duration,
    /// Poll period for plugin `Update`.
    pub update_interval: Duration,
    /// Poll period while a state change is expected (instances creating or deleting).
    pub update_interval_when_expecting: Duration,
    /// Ask again for a deletion that had no effect after this long.
    pub deletion_retry_interval: Duration,
    /// Delete every instance when the taskscaler shuts down.
    pub delete_instances_on_shutdown: bool,
    /// Wait between deletion checks at shutdown.
    pub shutdown_deletion_interval: Duration,
    /// Deletion checks at shutdown before giving up.
    pub shutdown_deletion_retries: u32,
    /// What one instance offers (`None`: jobs are placed by slot count alone).
    pub instance_resources: Option<Resources>,
    /// Relative cost of one instance per hour, to pick the cheapest shape that fits a job.
    pub instance_cost: f64,
    /// How often each ready instance is asked whether it is about to be preempted
    /// ([`crate::InstanceHooks::preemption`]); `None`: never.
    pub preemption_check_interval: Option<Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            capacity_per_instance: 1,
            max_instances: 0,
            max_use_count: 0,
            policies: Vec::new(),
            scale_throttle: ScaleThrottle::default(),
            reservation_throttling: true,
            failure_threshold: 3,
            forecast: None,
            instance_acquire_timeout: Duration::from_secs(15 * 60),
            update_interval: Duration::from_secs(60),
            update_interval_when_expecting: Duration::from_secs(2),
            deletion_retry_interval: Duration::from_secs(60),
            delete_instances_on_shutdown: false,
            shutdown_deletion_interval: Duration::from_secs(10),
            shutdown_deletion_retries: 3,
            instance_resources: None,
            instance_cost: 1.0,
            preemption_check_interval: None,
        }
    }
}

impl Config {
    /// Slots a fresh instance can ever hand out at once: its capacity, bounded by its use count.
    pub fn usable_slots_per_instance(&self) -> u32 {
        let cap = self.capacity_per_instance.max(1);
        if self.max_use_count > 0 {
            cap.min(self.max_use_count)
        } else {
            cap
        }
    }

    /// Most jobs that can hold a slot at once (`None` = unlimited).
    pub fn max_capacity(&self) -> Option<u64> {
        (self.max_instances > 0)
            .then(|| u64::from(self.max_instances) * u64::from(self.usable_slots_per_instance()))
    }
}

/// `[runners.autoscaler.scale_throttle]`: a token bucket on instance creation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScaleThrottle {
    /// Creations per second; `None` = unlimited (GitLab's `-1`).
    pub limit: Option<f64>,
    /// Bucket size (GitLab default: `max_instances`, or `limit` when that is unset).
    pub burst: u32,
}

impl Default for ScaleThrottle {
    fn default() -> Self {
        // GitLab: limit 0 means 100/s.
        ScaleThrottle {
            limit: Some(100.0),
            burst: 100,
        }
    }
}
