//! Spot capacity with a fallback: when a shape's `Increase` has been refused for lack of
//! capacity for longer than `after`, new capacity goes to its fallback shape; once no refusal
//! came for `return_after`, it goes back.
//!
//! The taskscaler of each shape keeps its own [`Refusals`]; [`crate::Placement`] reads them and
//! keeps one [`Diversion`] per shape with a fallback.

use std::time::Duration;

use tokio::time::Instant;

/// `Increase` calls of one instance group refused for lack of capacity, since capacity last
/// came (an `Increase` that was granted) or since they were forgotten.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Refusals {
    /// The first refusal of the current run of them.
    pub first: Option<Instant>,
    /// The latest refusal.
    pub last: Option<Instant>,
    /// Refusals in the current run.
    pub count: u64,
}

impl Refusals {
    /// Record a refusal at `now`; one more than `gap` after the last starts a new run.
    pub(crate) fn refused(&mut self, now: Instant, gap: Duration) {
        if self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) > gap)
        {
            self.clear();
        }
        self.first.get_or_insert(now);
        self.last = Some(now);
        self.count += 1;
    }

    /// Capacity came (or the run of refusals is over): start afresh.
    pub(crate) fn clear(&mut self) {
        *self = Refusals::default();
    }
}

/// Where a shape's new capacity goes when its own is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fallback {
    /// The fallback shape's index in the placement.
    pub to: usize,
    /// Refusals for this long divert new capacity to the fallback.
    pub after: Duration,
    /// No refusal for this long after the diversion brings new capacity back.
    pub return_after: Duration,
}

/// One shape's diversion to its fallback, as decided from its refusals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Diversion {
    /// Since when new capacity goes to the fallback (`None`: it goes to the shape itself).
    pub since: Option<Instant>,
}

/// What [`Diversion::update`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// New capacity now goes to the fallback.
    Diverted,
    /// New capacity goes to the shape itself again; its refusals are to be forgotten, so the
    /// next run of them is timed from its own start.
    Returned,
}

impl Diversion {
    /// Bring the diversion up to date with `refusals` at `now`.
    pub fn update(&mut self, rule: &Fallback, refusals: &Refusals, now: Instant) -> Option<Turn> {
        match self.since {
            None => {
                let first = refusals.first?;
                if now.saturating_duration_since(first) >= rule.after {
                    self.since = Some(now);
                    return Some(Turn::Diverted);
                }
                None
            }
            Some(since) => {
                // While diverted the shape asks for little or nothing, so the quiet period is
                // timed from the later of the diversion and the last refusal.
                let quiet_from = refusals.last.map_or(since, |l| l.max(since));
                if now.saturating_duration_since(quiet_from) >= rule.return_after {
                    self.since = None;
                    return Some(Turn::Returned);
                }
                None
            }
        }
    }

    /// Whether new capacity goes to the fallback.
    pub fn diverted(&self) -> bool {
        self.since.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GAP: Duration = Duration::from_secs(120);

    const RULE: Fallback = Fallback {
        to: 1,
        after: Duration::from_secs(30),
        return_after: Duration::from_secs(600),
    };

    #[tokio::test(start_paused = true)]
    async fn refusals_for_longer_than_after_divert_and_a_quiet_period_returns() {
        let t0 = Instant::now();
        let mut r = Refusals::default();
        let mut d = Diversion::default();
        assert_eq!(d.update(&RULE, &r, t0), None, "no refusal, no diversion");

        r.refused(t0, GAP);
        assert_eq!(d.update(&RULE, &r, t0 + Duration::from_secs(10)), None);
        r.refused(t0 + Duration::from_secs(20), GAP);
        assert_eq!(d.update(&RULE, &r, t0 + Duration::from_secs(29)), None);
        assert_eq!(
            d.update(&RULE, &r, t0 + Duration::from_secs(30)),
            Some(Turn::Diverted),
            "30 s of refusals reach `after`"
        );
        assert!(d.diverted());
        assert_eq!(r.count, 2);

        // A refusal while diverted (the shape still asked for pending jobs) restarts the quiet
        // period.
        r.refused(t0 + Duration::from_secs(100), GAP);
        assert_eq!(d.update(&RULE, &r, t0 + Duration::from_secs(630)), None);
        assert_eq!(
            d.update(&RULE, &r, t0 + Duration::from_secs(700)),
            Some(Turn::Returned)
        );
        assert!(!d.diverted());
    }

    #[tokio::test(start_paused = true)]
    async fn granted_capacity_ends_a_run_of_refusals_before_it_diverts() {
        let t0 = Instant::now();
        let mut r = Refusals::default();
        let mut d = Diversion::default();
        r.refused(t0, GAP);
        r.clear();
        r.refused(t0 + Duration::from_secs(25), GAP);
        assert_eq!(d.update(&RULE, &r, t0 + Duration::from_secs(40)), None);
        assert_eq!(
            d.update(&RULE, &r, t0 + Duration::from_secs(55)),
            Some(Turn::Diverted),
            "timed from the run's own first refusal"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_far_apart_are_separate_runs() {
        let t0 = Instant::now();
        let mut r = Refusals::default();
        let mut d = Diversion::default();
        r.refused(t0, GAP);
        // Demand went away; a new job an hour later is refused once.
        r.refused(t0 + Duration::from_secs(3600), GAP);
        assert_eq!(r.count, 1, "a new run");
        assert_eq!(d.update(&RULE, &r, t0 + Duration::from_secs(3601)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_diversion_without_later_refusals_returns_after_the_quiet_period_from_its_start() {
        let t0 = Instant::now();
        let mut r = Refusals::default();
        let mut d = Diversion::default();
        r.refused(t0, GAP);
        assert_eq!(
            d.update(&RULE, &r, t0 + Duration::from_secs(31)),
            Some(Turn::Diverted)
        );
        assert_eq!(d.update(&RULE, &r, t0 + Duration::from_secs(600)), None);
        assert_eq!(
            d.update(&RULE, &r, t0 + Duration::from_secs(631)),
            Some(Turn::Returned)
        );
    }
}
