//! A runner's costs: its [`Ledger`] fed with the instances its taskscalers list and the slots
//! its jobs hold, written to the job metrics as bills settle and jobs end.
//!
//! Tracking runs only for a runner with at least one priced shape; the others report their
//! shapes as unpriced (costs unknown, not zero).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use slipway_cost::{JobCost, Ledger, Price, share_of};
use slipway_status::JobMetrics;
use slipway_status::model::RunnerCosts;
use slipway_taskscaler::{Acquisition, InstanceStatus, Resources};

/// How often the instances are compared with the ledger's: the error on an instance's end.
pub const SYNC_INTERVAL: Duration = Duration::from_millis(500);

/// What a shape's instances cost and hold.
#[derive(Debug, Clone)]
pub struct ShapeTerms {
    /// Shape name.
    pub shape: String,
    /// Its price, when it has one.
    pub price: Option<Price>,
    /// Slots per instance.
    pub capacity: u32,
    /// What one instance offers, when the shape declares it.
    pub offer: Option<Resources>,
}

/// What a job holds of its instance.
#[derive(Debug, Clone, Copy)]
pub struct Held<'a> {
    /// The instance.
    pub instance: &'a str,
    /// Its share of the instance's resources, when the shape declares them.
    pub resources: Option<&'a Resources>,
    /// Slots it holds.
    pub slots: u32,
    /// It took the instance whole (the `instance` level).
    pub whole: bool,
}

impl<'a> Held<'a> {
    /// What acquisition `acq` holds (`whole` at the `instance` level).
    pub fn of(acq: &'a Acquisition, whole: bool) -> Held<'a> {
        Held {
            instance: &acq.instance_id,
            resources: acq.resources.as_ref(),
            slots: acq.slots,
            whole,
        }
    }
}

/// A runner's costs.
#[derive(Debug)]
pub struct CostBook {
    runner: String,
    terms: HashMap<String, ShapeTerms>,
    ledger: Mutex<Ledger>,
    /// What each job's charges came to so far (a job tried again on another instance is
    /// charged per try), until its source takes it.
    totals: Mutex<HashMap<String, JobCost>>,
    metrics: JobMetrics,
    /// Whether any shape has a price (else nothing is tracked).
    tracking: bool,
}

impl CostBook {
    /// The book of `runner`'s `shapes`, billed per second with `minimum`, writing `metrics`.
    pub fn new(
        runner: &str,
        shapes: Vec<ShapeTerms>,
        minimum: Duration,
        metrics: JobMetrics,
    ) -> CostBook {
        let tracking = shapes.iter().any(|s| s.price.is_some());
        let ledger = Ledger::new(
            shapes.iter().map(|s| (s.shape.clone(), s.price.clone())),
            minimum,
        );
        CostBook {
            runner: runner.to_string(),
            terms: shapes.into_iter().map(|s| (s.shape.clone(), s)).collect(),
            ledger: Mutex::new(ledger),
            totals: Mutex::new(HashMap::new()),
            metrics,
            tracking,
        }
    }

    /// Whether any shape has a price.
    pub fn is_tracking(&self) -> bool {
        self.tracking
    }

    fn lock(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `listed` is what `shape`'s taskscaler holds at `now`: new instances are billed from
    /// when they were first seen, those no longer listed are settled.
    pub fn instances_seen(&self, shape: &str, listed: &[InstanceStatus], now: Instant) {
        if !self.tracking {
            return;
        }
        let mut settled = Vec::new();
        let mut cut = Vec::new();
        let per_hour = {
            let mut l = self.lock();
            for i in listed {
                if !l.is_live(&i.id) {
                    l.instance_started(&i.id, shape, now.checked_sub(i.age).unwrap_or(now));
                }
            }
            for id in l.live_of(shape) {
                if !listed.iter().any(|i| i.id == id) {
                    // Jobs still on it (its instance vanished under them) end with it.
                    for key in l.jobs_on(&id) {
                        cut.extend(l.job_ended(&key, now).map(|c| (key, c)));
                    }
                    settled.extend(l.instance_gone(&id, now));
                }
            }
            l.per_hour(shape)
        };
        for (key, cost) in cut {
            self.record(&key, cost);
        }
        for s in settled {
            self.metrics.instance_settled(
                &self.runner,
                &s.shape,
                s.billed.amount,
                s.overhead.amount,
                &s.billed.currency,
            );
        }
        if let Some(Some(price)) = self.terms.get(shape).map(|t| &t.price) {
            self.metrics
                .set_cost_per_hour(&self.runner, shape, per_hour, &price.currency);
        }
    }

    /// Job `key` holds `held` on a `shape` instance from `now`, for `project` when its
    /// source knows it.
    pub fn job_started(
        &self,
        key: &str,
        shape: &str,
        held: Held<'_>,
        project: Option<&str>,
        now: Instant,
    ) {
        if !self.tracking {
            return;
        }
        let Some(terms) = self.terms.get(shape) else {
            return;
        };
        let sizes = |r: &Resources| (r.cpu_millis, r.memory_bytes);
        let share = share_of(
            held.resources.map(sizes),
            terms.offer.as_ref().map(sizes),
            held.slots.max(1),
            terms.capacity,
            held.whole,
        );
        self.lock()
            .job_started(key, held.instance, share, project, now);
    }

    /// Job `key`'s charge ends at `now`: what it cost, once (`None` unpriced or ended already).
    pub fn job_ended(&self, key: &str, now: Instant) -> Option<JobCost> {
        if !self.tracking {
            return None;
        }
        let cost = self.lock().job_ended(key, now)?;
        self.record(key, cost.clone());
        Some(cost)
    }

    /// Count a charge that ended: in the metrics and in its job's total.
    fn record(&self, key: &str, cost: JobCost) {
        self.metrics.job_cost(
            &self.runner,
            &cost.shape,
            cost.project.as_deref(),
            cost.cost.amount,
            &cost.cost.currency,
        );
        let mut totals = self.totals.lock().unwrap_or_else(|p| p.into_inner());
        match totals.get_mut(key) {
            Some(t) => {
                t.cost.amount += cost.cost.amount;
                t.held += cost.held;
                t.share = cost.share;
                t.shape = cost.shape;
            }
            None => {
                totals.insert(key.to_string(), cost);
            }
        }
    }

    /// What job `key`'s charges came to (every try), once: its charge ends now if it runs.
    pub fn take_total(&self, key: &str, now: Instant) -> Option<JobCost> {
        self.job_ended(key, now);
        self.totals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key)
    }

    /// The runner's costs up to `now`, as the status page shows them; `None` without a
    /// price (nothing is tracked).
    pub fn status(&self, now: Instant) -> Option<RunnerCosts> {
        let mut unpriced: Vec<String> = self
            .terms
            .values()
            .filter(|t| t.price.is_none())
            .map(|t| t.shape.clone())
            .collect();
        unpriced.sort();
        let mut out = RunnerCosts {
            unpriced,
            ..RunnerCosts::default()
        };
        if !self.tracking {
            return None;
        }
        let costs = self.lock().costs(now);
        if let Some((billed, jobs, overhead, currency)) = costs.total() {
            out.billed = billed;
            out.jobs = jobs;
            out.overhead = overhead;
            out.currency = currency;
            out.per_hour = costs
                .shapes
                .values()
                .filter(|s| s.priced)
                .map(|s| s.per_hour)
                .sum();
        }
        Some(out)
    }

    /// Jobs' costs by project so far (ended jobs), at most [`slipway_cost::ledger::MAX_PROJECTS`]
    /// plus "(other)".
    pub fn projects(&self, now: Instant) -> BTreeMap<String, f64> {
        self.lock()
            .costs(now)
            .projects
            .into_iter()
            .map(|(p, m)| (p, m.amount))
            .collect()
    }
}

/// The trace line a job's cost gets: amount, share and time held.
pub fn trace_line(cost: &JobCost) -> String {
    format!(
        "Job cost: {} ({:.0}% of a {} instance for {})",
        slipway_status::format::money(cost.cost.amount, &cost.cost.currency),
        cost.share * 100.0,
        cost.shape,
        slipway_status::format::duration(cost.held.as_secs_f64()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use slipway_fleeting::State;

    fn terms(shape: &str, price: Option<f64>) -> ShapeTerms {
        ShapeTerms {
            shape: shape.into(),
            price: price.map(|p| Price::from_number(p, None).unwrap_or_else(|e| panic!("{e}"))),
            capacity: 4,
            offer: Some(Resources {
                cpu_millis: 4000,
                memory_bytes: 8 << 30,
                gpus: 0,
            }),
        }
    }

    fn listed(id: &str, age: Duration) -> InstanceStatus {
        InstanceStatus {
            id: id.into(),
            state: State::Running,
            age,
            uses: 0,
            slots: vec![None; 4],
            ready: true,
            removing: false,
            exclusive: false,
            preempted: false,
            connect_info: None,
        }
    }

    #[test]
    fn instances_and_jobs_add_up_and_reach_the_metrics() {
        let metrics = JobMetrics::default();
        let book = CostBook::new(
            "r",
            vec![terms("big", Some(3.6)), terms("gpu", None)],
            Duration::from_secs(60),
            metrics.clone(),
        );
        assert!(book.is_tracking());
        let t0 = Instant::now();
        // First seen 10 s after it was created: billed from its creation.
        book.instances_seen("big", &[listed("i-1", Duration::from_secs(10))], t0);
        let request = Resources {
            cpu_millis: 2000,
            memory_bytes: 1 << 30,
            gpus: 0,
        };
        let held = Held {
            instance: "i-1",
            resources: Some(&request),
            slots: 1,
            whole: false,
        };
        book.job_started("job-1", "big", held, Some("group/app"), t0);
        let cost = book
            .job_ended("job-1", t0 + Duration::from_secs(100))
            .unwrap_or_else(|| panic!("a priced job has a cost"));
        // Half the CPUs for 100 s at 0.001 per second.
        assert!((cost.cost.amount - 0.05).abs() < 1e-9, "{cost:?}");
        assert!(book.job_ended("job-1", t0).is_none(), "charged once");
        let total = book
            .take_total("job-1", t0)
            .unwrap_or_else(|| panic!("a total"));
        assert_eq!(total, cost);
        assert!(book.take_total("job-1", t0).is_none(), "taken once");
        assert_eq!(
            trace_line(&cost),
            "Job cost: 0.0500 USD (50% of a big instance for 1m40s)"
        );
        // A job the instance vanished under is charged to its end and counted.
        book.job_started("job-2", "big", held, None, t0 + Duration::from_secs(150));
        book.instances_seen("big", &[], t0 + Duration::from_secs(190));
        let cut = book
            .take_total("job-2", t0 + Duration::from_secs(300))
            .unwrap_or_else(|| panic!("the cut job's cost"));
        assert!((cut.cost.amount - 0.02).abs() < 1e-9, "{cut:?}");
        let s = book
            .status(t0 + Duration::from_secs(200))
            .unwrap_or_else(|| panic!("a priced runner has costs"));
        assert!((s.billed - 0.2).abs() < 1e-9, "{s:?}");
        assert!((s.jobs - 0.07).abs() < 1e-9, "{s:?}");
        assert!((s.jobs + s.overhead - s.billed).abs() < 1e-9, "{s:?}");
        assert_eq!(s.unpriced, vec!["gpu".to_string()]);
        assert!((book.projects(t0)["group/app"] - 0.05).abs() < 1e-9);
        let mut registry = prometheus_client::registry::Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            text.contains(
                "slipway_instance_billed_total{runner=\"r\",shape=\"big\",currency=\"USD\"} 0.2"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_runner_without_prices_tracks_nothing_and_says_so() {
        let book = CostBook::new(
            "r",
            vec![terms("default", None)],
            Duration::from_secs(60),
            JobMetrics::default(),
        );
        assert!(!book.is_tracking());
        let t0 = Instant::now();
        book.instances_seen("default", &[listed("i-1", Duration::ZERO)], t0);
        assert_eq!(book.status(t0), None, "nothing shown: costs are opt-in");
    }
}
