//! The scale decision: a pure function from what exists and what is wanted to what to change.
//!
//! Kept free of I/O and of reading the clock (time comes in as `now`, on tokio's clock, which
//! tests and the simulator can pause and advance), so they drive exactly this code.

use std::time::Duration;

use tokio::time::Instant;

use slipway_fleeting::State;

use crate::config::Config;

/// What the decision needs to know about one instance.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceView {
    /// Instance id.
    pub id: String,
    /// Last state the plugin reported.
    pub state: State,
    /// Slots currently acquired.
    pub acquired: u32,
    /// Jobs ever assigned (counted at acquisition).
    pub uses: u32,
    /// Already asked to be removed.
    pub removing: bool,
    /// Since when it has had no acquisition.
    pub idle_since: Instant,
}

/// Why an instance is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemovalCause {
    /// `max_use_count` reached.
    UsedUp,
    /// Idle past `idle_time` and not needed for `idle_count`.
    Idle,
    /// The plugin reported `timeout`.
    Failed,
    /// Found at startup with no saved record of its use.
    Preexisting,
    /// `instance_ready_command` failed.
    NotReady,
    /// Failed `failure_threshold` health checks in a row.
    Unhealthy,
    /// An accepted deletion that had no effect, asked for again.
    Retry,
    /// Its job at the `instance` isolation level is done.
    Exclusive,
    /// Its cloud is taking it away (a preemption notice): empty, or its notice ran out.
    Preempted,
}

impl RemovalCause {
    /// Short name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            RemovalCause::UsedUp => "max_use_count",
            RemovalCause::Idle => "idle_time",
            RemovalCause::Failed => "plugin_timeout",
            RemovalCause::Preexisting => "preexisting",
            RemovalCause::NotReady => "instance_ready_command",
            RemovalCause::Unhealthy => "failure_threshold",
            RemovalCause::Retry => "deletion_retry",
            RemovalCause::Exclusive => "isolation_instance",
            RemovalCause::Preempted => "preempted",
        }
    }
}

/// What to change this pass.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    /// Instances to ask the plugin for.
    pub increase: u32,
    /// Instances to delete, with why.
    pub remove: Vec<(String, RemovalCause)>,
}

/// Slots this instance can still hand out now.
pub fn free_slots(cfg: &Config, inst: &InstanceView) -> u32 {
    free_slots_of(cfg, inst.state, inst.removing, inst.acquired, inst.uses)
}

/// [`free_slots`] from the fields themselves (the hot path builds no view).
pub fn free_slots_of(cfg: &Config, state: State, removing: bool, acquired: u32, uses: u32) -> u32 {
    if removing || !matches!(state, State::Creating | State::Running) {
        return 0;
    }
    let cap = cfg.capacity_per_instance.max(1);
    let free = cap.saturating_sub(acquired);
    if cfg.max_use_count > 0 {
        free.min(cfg.max_use_count.saturating_sub(uses))
    } else {
        free
    }
}

/// What is wanted this pass, beyond the instances themselves.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Demand {
    /// Reservations not yet acquired (jobs waiting or about to arrive).
    pub pending: u32,
    /// Idle slots to keep (from the active policy, scale factor and forecast).
    pub idle_target: u32,
    /// How long an instance may stay idle.
    pub idle_time: Duration,
    /// Instances asked for that the plugin has not listed yet.
    pub requested: u32,
}

/// Decide increases and removals.
pub fn decide(
    cfg: &Config,
    instances: &[InstanceView],
    demand: &Demand,
    plugin_max: u64,
    now: Instant,
) -> Decision {
    let Demand {
        pending,
        idle_target,
        idle_time,
        requested,
    } = *demand;
    let per_instance = cfg.usable_slots_per_instance();
    let mut decision = Decision::default();

    // Removals that do not depend on demand.
    for inst in instances.iter().filter(|i| !i.removing) {
        if inst.state == State::Timeout {
            decision
                .remove
                .push((inst.id.clone(), RemovalCause::Failed));
        } else if inst.state == State::Running
            && inst.acquired == 0
            && cfg.max_use_count > 0
            && inst.uses >= cfg.max_use_count
        {
            decision
                .remove
                .push((inst.id.clone(), RemovalCause::UsedUp));
        }
    }
    let removed = |id: &str, d: &Decision| d.remove.iter().any(|(r, _)| r == id);

    let wanted = u64::from(pending) + u64::from(idle_target);
    let mut available: u64 = instances
        .iter()
        .filter(|i| !removed(&i.id, &decision))
        .map(|i| u64::from(free_slots(cfg, i)))
        .sum::<u64>()
        + u64::from(requested) * u64::from(per_instance);

    // Idle removals, longest idle first, while what remains still covers what is wanted.
    let mut idle: Vec<&InstanceView> = instances
        .iter()
        .filter(|i| {
            i.state == State::Running
                && !i.removing
                && i.acquired == 0
                && !removed(&i.id, &decision)
                && now.saturating_duration_since(i.idle_since) >= idle_time
        })
        .collect();
    idle.sort_by_key(|i| i.idle_since);
    for inst in idle {
        let free = u64::from(free_slots(cfg, inst));
        if available.saturating_sub(free) >= wanted && free > 0 {
            available -= free;
            decision.remove.push((inst.id.clone(), RemovalCause::Idle));
        }
    }

    if wanted > available {
        let missing = wanted - available;
        let mut n = missing.div_ceil(u64::from(per_instance));
        // Every instance the plugin still knows counts against the cap, deleting ones too.
        let existing = instances
            .iter()
            .filter(|i| i.state != State::Deleted)
            .count() as u64
            + u64::from(requested);
        if cfg.max_instances > 0 {
            n = n.min(u64::from(cfg.max_instances).saturating_sub(existing));
        }
        if plugin_max > 0 {
            n = n.min(plugin_max.saturating_sub(existing));
        }
        decision.increase = u32::try_from(n).unwrap_or(u32::MAX);
    }
    decision
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(id: &str, state: State, acquired: u32, uses: u32, idle_for: Duration) -> InstanceView {
        InstanceView {
            id: id.into(),
            state,
            acquired,
            uses,
            removing: false,
            idle_since: now() - idle_for,
        }
    }

    fn now() -> Instant {
        // A fixed point far enough from boot that subtracting minutes is safe.
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *START.get_or_init(|| Instant::now() + Duration::from_secs(3600))
    }

    fn cfg(cap: u32, max_instances: u32, max_use: u32, idle_count: u32) -> (Config, u32) {
        let c = Config {
            capacity_per_instance: cap,
            max_instances,
            max_use_count: max_use,
            ..Config::default()
        };
        (c, idle_count)
    }

    fn decide(
        (cfg, idle): &(Config, u32),
        instances: &[InstanceView],
        pending: u32,
        requested: u32,
        plugin_max: u64,
        now: Instant,
    ) -> Decision {
        let demand = Demand {
            pending,
            idle_target: *idle,
            idle_time: Duration::from_secs(60),
            requested,
        };
        super::decide(cfg, instances, &demand, plugin_max, now)
    }

    #[test]
    fn scales_up_for_pending_jobs_in_whole_instances() {
        let d = decide(&cfg(2, 0, 0, 0), &[], 3, 0, 0, now());
        assert_eq!(d.increase, 2);
        assert!(d.remove.is_empty());
    }

    #[test]
    fn keeps_idle_count_in_slots_not_instances() {
        let c = cfg(4, 0, 0, 6);
        let d = decide(
            &c,
            &[view("a", State::Running, 0, 0, Duration::ZERO)],
            0,
            0,
            0,
            now(),
        );
        // 4 free slots, 6 wanted: one more instance.
        assert_eq!(d.increase, 1);
    }

    #[test]
    fn counts_requested_but_unlisted_instances() {
        let d = decide(&cfg(1, 0, 0, 0), &[], 2, 2, 0, now());
        assert_eq!(d.increase, 0);
    }

    #[test]
    fn respects_max_instances_including_deleting_ones() {
        let c = cfg(1, 2, 0, 0);
        let mut deleting = view("d", State::Deleting, 0, 0, Duration::ZERO);
        deleting.removing = true;
        let d = decide(&c, &[deleting], 5, 0, 0, now());
        assert_eq!(d.increase, 1);
    }

    #[test]
    fn respects_plugin_max_size() {
        let d = decide(&cfg(1, 0, 0, 0), &[], 10, 0, 3, now());
        assert_eq!(d.increase, 3);
    }

    #[test]
    fn removes_used_up_instances_once_free_and_not_before() {
        let c = cfg(2, 0, 1, 0);
        let busy = view("busy", State::Running, 1, 1, Duration::ZERO);
        let done = view("done", State::Running, 0, 1, Duration::ZERO);
        let d = decide(&c, &[busy, done], 0, 0, 0, now());
        assert_eq!(d.remove, vec![("done".to_string(), RemovalCause::UsedUp)]);
    }

    #[test]
    fn used_up_instance_offers_no_capacity() {
        let c = cfg(2, 0, 1, 0);
        let busy = view("busy", State::Running, 1, 1, Duration::ZERO);
        let d = decide(&c, &[busy], 1, 0, 0, now());
        assert_eq!(
            d.increase, 1,
            "a max_use_count=1 instance must not take a second job"
        );
    }

    #[test]
    fn removes_idle_instances_beyond_idle_count() {
        let c = cfg(1, 0, 0, 1);
        let a = view("a", State::Running, 0, 3, Duration::from_secs(120));
        let b = view("b", State::Running, 0, 3, Duration::from_secs(90));
        let fresh = view("c", State::Running, 0, 0, Duration::from_secs(5));
        let d = decide(&c, &[a, b, fresh], 0, 0, 0, now());
        // idle_count 1 is covered by the others; the two long-idle ones go, oldest first.
        assert_eq!(
            d.remove,
            vec![
                ("a".to_string(), RemovalCause::Idle),
                ("b".to_string(), RemovalCause::Idle)
            ]
        );
        assert_eq!(d.increase, 0);
    }

    #[test]
    fn keeps_idle_instance_needed_for_pending_jobs() {
        let c = cfg(1, 0, 0, 0);
        let a = view("a", State::Running, 0, 3, Duration::from_secs(600));
        let d = decide(&c, &[a], 1, 0, 0, now());
        assert!(d.remove.is_empty());
    }

    #[test]
    fn replaces_instances_the_plugin_reports_as_timed_out() {
        let c = cfg(1, 0, 0, 1);
        let broken = view("x", State::Timeout, 0, 0, Duration::ZERO);
        let d = decide(&c, &[broken], 0, 0, 0, now());
        assert_eq!(d.remove, vec![("x".to_string(), RemovalCause::Failed)]);
        assert_eq!(d.increase, 1);
    }
}
