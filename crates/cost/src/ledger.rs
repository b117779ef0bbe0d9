//! The ledger of one runner: instances billed per second with a minimum, jobs charged their
//! share of their instance over the time they held their slots, and what no job used — boot,
//! idle time, unused capacity, removal, the billing minimum — kept apart as overhead.
//!
//! Job costs plus overhead add up to what the instances are billed, by construction: overhead
//! is what an instance's bill leaves once its jobs are charged. Times are passed in, so tests
//! run on a fake clock.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use crate::price::{Money, Price};

/// Projects named in the per-project totals; the rest add up under [`OTHER_PROJECTS`].
pub const MAX_PROJECTS: usize = 100;

/// The per-project total of every project beyond [`MAX_PROJECTS`].
pub const OTHER_PROJECTS: &str = "(other)";

/// What one job cost, once it ended.
#[derive(Debug, Clone, PartialEq)]
pub struct JobCost {
    /// Its share of its instance's price over the time it held its slot.
    pub cost: Money,
    /// That share (0..=1).
    pub share: f64,
    /// How long it held its slot.
    pub held: Duration,
    /// Its instance's shape.
    pub shape: String,
    /// The per-project total it went to: its project, or [`OTHER_PROJECTS`] past the bound.
    pub project: Option<String>,
}

/// An instance's final bill, once it is gone (priced shapes only).
#[derive(Debug, Clone, PartialEq)]
pub struct Settled {
    /// Its shape.
    pub shape: String,
    /// What it was billed.
    pub billed: Money,
    /// What of that no job used.
    pub overhead: Money,
}

/// One shape's costs so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShapeCosts {
    /// The currency of its price; empty when it has none.
    pub currency: String,
    /// Whether it has a price: without one its costs are unknown, not zero.
    pub priced: bool,
    /// What its instances are billed, the live ones up to now.
    pub billed: f64,
    /// What its jobs were charged, the running ones up to now.
    pub jobs: f64,
    /// What no job used: `billed - jobs`.
    pub overhead: f64,
    /// Jobs ended.
    pub jobs_ended: u64,
    /// Live instances now.
    pub live: u32,
    /// What its live instances cost per hour now.
    pub per_hour: f64,
}

/// A runner's costs so far, per shape and per project.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Costs {
    /// By shape name.
    pub shapes: BTreeMap<String, ShapeCosts>,
    /// Jobs' costs by project (ended jobs), at most [`MAX_PROJECTS`] plus [`OTHER_PROJECTS`];
    /// each with its currency.
    pub projects: BTreeMap<String, Money>,
}

impl Costs {
    /// Billed, jobs and overhead over every priced shape, when they share one currency.
    pub fn total(&self) -> Option<(f64, f64, f64, String)> {
        let mut priced = self.shapes.values().filter(|s| s.priced);
        let first = priced.next()?;
        let mut t = (
            first.billed,
            first.jobs,
            first.overhead,
            first.currency.clone(),
        );
        for s in priced {
            if s.currency != t.3 {
                return None;
            }
            t.0 += s.billed;
            t.1 += s.jobs;
            t.2 += s.overhead;
        }
        Some(t)
    }
}

#[derive(Debug)]
struct OpenJob {
    instance: String,
    share: f64,
    since: Instant,
    project: Option<String>,
}

#[derive(Debug)]
struct Live {
    shape: String,
    price: Option<Price>,
    since: Instant,
    /// Charged to jobs that ended on it.
    charged: f64,
}

/// The ledger of one runner.
#[derive(Debug)]
pub struct Ledger {
    minimum: Duration,
    prices: HashMap<String, Option<Price>>,
    live: HashMap<String, Live>,
    jobs: HashMap<String, OpenJob>,
    /// Totals of instances gone and jobs ended, by shape.
    closed: BTreeMap<String, ShapeCosts>,
    projects: BTreeMap<String, Money>,
}

impl Ledger {
    /// A ledger for shapes priced as `prices` (shape name → price, `None` when unpriced),
    /// billed per second with `minimum` (60 s on AWS).
    pub fn new(
        prices: impl IntoIterator<Item = (String, Option<Price>)>,
        minimum: Duration,
    ) -> Ledger {
        let prices: HashMap<String, Option<Price>> = prices.into_iter().collect();
        let closed = prices
            .iter()
            .map(|(shape, p)| {
                (
                    shape.clone(),
                    ShapeCosts {
                        currency: p.as_ref().map(|p| p.currency.clone()).unwrap_or_default(),
                        priced: p.is_some(),
                        ..ShapeCosts::default()
                    },
                )
            })
            .collect();
        Ledger {
            minimum,
            prices,
            live: HashMap::new(),
            jobs: HashMap::new(),
            closed,
            projects: BTreeMap::new(),
        }
    }

    /// Instance `id` of `shape` is billed from `at` (first seen: creation and boot included).
    pub fn instance_started(&mut self, id: &str, shape: &str, at: Instant) {
        if self.live.contains_key(id) {
            return;
        }
        let price = self.prices.get(shape).cloned().flatten();
        self.live.insert(
            id.to_owned(),
            Live {
                shape: shape.to_owned(),
                price,
                since: at,
                charged: 0.0,
            },
        );
    }

    /// The jobs open on instance `id`.
    pub fn jobs_on(&self, id: &str) -> Vec<String> {
        self.jobs
            .iter()
            .filter(|(_, j)| j.instance == id)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Instance `id` is gone at `at`: its bill is final (returned when its shape is priced).
    /// Jobs still open on it end then (end them with [`Ledger::job_ended`] first to learn
    /// what they cost).
    pub fn instance_gone(&mut self, id: &str, at: Instant) -> Option<Settled> {
        for key in self.jobs_on(id) {
            self.job_ended(&key, at);
        }
        let inst = self.live.remove(id)?;
        let billed = bill(
            inst.price.as_ref(),
            at.saturating_duration_since(inst.since),
            self.minimum,
        );
        let totals = self.closed.entry(inst.shape.clone()).or_default();
        totals.billed += billed;
        totals.overhead += billed - inst.charged;
        let price = inst.price?;
        Some(Settled {
            shape: inst.shape,
            billed: Money::new(billed, &price.currency),
            overhead: Money::new(billed - inst.charged, &price.currency),
        })
    }

    /// Whether instance `id` is billed here.
    pub fn is_live(&self, id: &str) -> bool {
        self.live.contains_key(id)
    }

    /// What the live instances of `shape` cost per hour now.
    pub fn per_hour(&self, shape: &str) -> f64 {
        self.live
            .values()
            .filter(|l| l.shape == shape)
            .filter_map(|l| l.price.as_ref().map(|p| p.per_hour))
            .sum()
    }

    /// The live instances of `shape`.
    pub fn live_of(&self, shape: &str) -> Vec<String> {
        self.live
            .iter()
            .filter(|(_, l)| l.shape == shape)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Job `key` holds `share` of instance `id` from `at`, for `project` when the source knows it.
    ///
    /// Shares are the larger of CPU and memory fractions, so jobs packed on one instance may
    /// ask for more than all of it (3 CPUs of 4 and 12 GiB of 16 beside each other): a job is
    /// charged at most what the instance has left, and jobs never pay more than its bill.
    pub fn job_started(
        &mut self,
        key: &str,
        id: &str,
        share: f64,
        project: Option<&str>,
        at: Instant,
    ) {
        self.jobs.remove(key);
        let taken: f64 = self
            .jobs
            .values()
            .filter(|j| j.instance == id)
            .map(|j| j.share)
            .sum();
        self.jobs.insert(
            key.to_owned(),
            OpenJob {
                instance: id.to_owned(),
                share: share.min(1.0 - taken).clamp(0.0, 1.0),
                since: at,
                project: project.map(str::to_owned),
            },
        );
    }

    /// Job `key` gave its slot back at `at`: what it cost, `None` when its shape has no price
    /// (or the job or its instance is unknown).
    pub fn job_ended(&mut self, key: &str, at: Instant) -> Option<JobCost> {
        let job = self.jobs.remove(key)?;
        let inst = self.live.get_mut(&job.instance)?;
        let held = at.saturating_duration_since(job.since);
        let price = inst.price.as_ref()?;
        let cost = price.per_second() * job.share * held.as_secs_f64();
        inst.charged += cost;
        let totals = self.closed.entry(inst.shape.clone()).or_default();
        // Its instance's overhead is what the instance's bill leaves once `charged`: counted
        // when the instance goes (or up to now, while it lives).
        totals.jobs += cost;
        totals.jobs_ended += 1;
        let project = job.project.map(|project| {
            let name = if self.projects.contains_key(&project) || self.projects.len() < MAX_PROJECTS
            {
                project
            } else {
                OTHER_PROJECTS.to_owned()
            };
            self.projects
                .entry(name.clone())
                .or_insert_with(|| Money::new(0.0, &price.currency))
                .amount += cost;
            name
        });
        Some(JobCost {
            cost: Money::new(cost, &price.currency),
            share: job.share,
            held,
            shape: inst.shape.clone(),
            project,
        })
    }

    /// Costs up to `at`: what is closed, plus live instances billed so far (the minimum counts
    /// from the start: it is owed once an instance exists) and running jobs charged so far.
    pub fn costs(&self, at: Instant) -> Costs {
        let mut shapes = self.closed.clone();
        for inst in self.live.values() {
            let billed = bill(
                inst.price.as_ref(),
                at.saturating_duration_since(inst.since),
                self.minimum,
            );
            let totals = shapes.entry(inst.shape.clone()).or_default();
            totals.billed += billed;
            totals.overhead += billed - inst.charged;
            totals.live += 1;
            totals.per_hour += inst.price.as_ref().map_or(0.0, |p| p.per_hour);
        }
        for job in self.jobs.values() {
            let Some(inst) = self.live.get(&job.instance) else {
                continue;
            };
            let Some(price) = &inst.price else { continue };
            let cost = price.per_second()
                * job.share
                * at.saturating_duration_since(job.since).as_secs_f64();
            let totals = shapes.entry(inst.shape.clone()).or_default();
            totals.jobs += cost;
            totals.overhead -= cost;
        }
        Costs {
            shapes,
            projects: self.projects.clone(),
        }
    }
}

/// An instance's bill for `life`: per second, at least `minimum`; 0 without a price.
fn bill(price: Option<&Price>, life: Duration, minimum: Duration) -> f64 {
    price.map_or(0.0, |p| p.per_second() * life.max(minimum).as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usd(per_hour: f64) -> Option<Price> {
        Some(Price::from_number(per_hour, None).unwrap())
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn jobs_pay_their_share_and_the_rest_is_overhead() {
        // 3.6 per hour: 0.001 per second.
        let mut l = Ledger::new([("big".to_string(), usd(3.6))], secs(60));
        let t0 = Instant::now();
        l.instance_started("i-1", "big", t0);
        // Booted for 20 s, then a half-instance job for 100 s and a quarter one for 40 s.
        l.job_started("a", "i-1", 0.5, Some("group/app"), t0 + secs(20));
        l.job_started("b", "i-1", 0.25, Some("group/lib"), t0 + secs(20));
        let b = l.job_ended("b", t0 + secs(60)).unwrap();
        assert!(close(b.cost.amount, 0.001 * 0.25 * 40.0), "{b:?}");
        assert_eq!(b.held, secs(40));
        let a = l.job_ended("a", t0 + secs(120)).unwrap();
        assert!(close(a.cost.amount, 0.05), "{a:?}");
        // Idle until removed at 200 s.
        l.instance_gone("i-1", t0 + secs(200));
        let c = l.costs(t0 + secs(300));
        let big = &c.shapes["big"];
        assert!(close(big.billed, 0.2), "{big:?}");
        assert!(close(big.jobs, 0.06), "{big:?}");
        assert!(close(big.overhead, 0.14), "{big:?}");
        assert!(close(big.jobs + big.overhead, big.billed));
        assert_eq!(big.jobs_ended, 2);
        assert!(close(c.projects["group/app"].amount, 0.05));
        assert_eq!(c.total().unwrap().3, "USD");
    }

    #[test]
    fn a_gone_instance_settles_its_bill_and_live_ones_show_their_rate() {
        let mut l = Ledger::new(
            [("s".to_string(), usd(3.6)), ("free".to_string(), None)],
            secs(60),
        );
        let t0 = Instant::now();
        l.instance_started("i", "s", t0);
        l.instance_started("k", "s", t0);
        l.instance_started("u", "free", t0);
        l.job_started("j", "i", 0.5, Some("p"), t0);
        let j = l.job_ended("j", t0 + secs(100)).unwrap();
        assert_eq!((j.shape.as_str(), j.project.as_deref()), ("s", Some("p")));
        let now = l.costs(t0 + secs(100));
        assert_eq!(now.shapes["s"].live, 2);
        assert!(close(now.shapes["s"].per_hour, 7.2));
        let settled = l.instance_gone("i", t0 + secs(200)).unwrap();
        assert!(close(settled.billed.amount, 0.2), "{settled:?}");
        assert!(close(settled.overhead.amount, 0.15), "{settled:?}");
        assert_eq!(settled.billed.currency, "USD");
        assert!(l.instance_gone("u", t0 + secs(200)).is_none());
        assert!(l.instance_gone("i", t0 + secs(300)).is_none());
        assert_eq!(l.live_of("s"), vec!["k".to_string()]);
    }

    #[test]
    fn packed_jobs_never_pay_more_than_the_instance() {
        let mut l = Ledger::new([("s".to_string(), usd(3.6))], secs(0));
        let t0 = Instant::now();
        l.instance_started("i", "s", t0);
        // 3 CPUs of 4 and 2 GiB of 16 (0.75), beside 1 CPU and 12 GiB (0.75): the second gets
        // what is left.
        l.job_started("a", "i", 0.75, None, t0);
        l.job_started("b", "i", 0.75, None, t0);
        let b = l.job_ended("b", t0 + secs(100)).unwrap();
        assert!(close(b.share, 0.25), "{b:?}");
        l.job_ended("a", t0 + secs(100)).unwrap();
        let settled = l.instance_gone("i", t0 + secs(100)).unwrap();
        assert!(close(settled.overhead.amount, 0.0), "{settled:?}");
    }

    #[test]
    fn the_billing_minimum_is_owed_from_the_start_and_is_overhead() {
        let mut l = Ledger::new([("s".to_string(), usd(3.6))], secs(60));
        let t0 = Instant::now();
        l.instance_started("i", "s", t0);
        l.job_started("j", "i", 1.0, None, t0);
        l.job_ended("j", t0 + secs(10)).unwrap();
        let live = l.costs(t0 + secs(10));
        assert!(close(live.shapes["s"].billed, 0.06), "{live:?}");
        l.instance_gone("i", t0 + secs(15));
        let c = l.costs(t0 + secs(15));
        let s = &c.shapes["s"];
        assert!(
            close(s.billed, 0.06) && close(s.jobs, 0.01) && close(s.overhead, 0.05),
            "{s:?}"
        );
    }

    #[test]
    fn running_jobs_and_live_instances_count_up_to_now() {
        let mut l = Ledger::new([("s".to_string(), usd(3.6))], Duration::ZERO);
        let t0 = Instant::now();
        l.instance_started("i", "s", t0);
        l.job_started("j", "i", 0.5, None, t0 + secs(10));
        let c = l.costs(t0 + secs(110));
        let s = &c.shapes["s"];
        assert!(
            close(s.billed, 0.11) && close(s.jobs, 0.05) && close(s.overhead, 0.06),
            "{s:?}"
        );
        // The instance goes under the job: the job ends with it.
        l.instance_gone("i", t0 + secs(110));
        let c = l.costs(t0 + secs(500));
        assert!(close(c.shapes["s"].jobs, 0.05));
        assert_eq!(c.shapes["s"].jobs_ended, 1);
    }

    #[test]
    fn a_shape_without_a_price_has_unknown_costs_not_zero() {
        let mut l = Ledger::new(
            [("free".to_string(), None), ("paid".to_string(), usd(1.0))],
            secs(60),
        );
        let t0 = Instant::now();
        l.instance_started("i", "free", t0);
        l.job_started("j", "i", 1.0, Some("p"), t0);
        assert_eq!(l.job_ended("j", t0 + secs(30)), None);
        let c = l.costs(t0 + secs(60));
        assert!(!c.shapes["free"].priced && c.shapes["paid"].priced);
        assert!(c.projects.is_empty());
        // The total covers priced shapes only.
        assert_eq!(c.total().unwrap().0, 0.0);
    }

    #[test]
    fn projects_beyond_the_bound_add_up_as_other() {
        let mut l = Ledger::new([("s".to_string(), usd(3.6))], Duration::ZERO);
        let t0 = Instant::now();
        l.instance_started("i", "s", t0);
        for n in 0..MAX_PROJECTS + 5 {
            let key = format!("j{n}");
            l.job_started(&key, "i", 1.0, Some(&format!("p{n}")), t0);
            l.job_ended(&key, t0 + secs(1));
        }
        let c = l.costs(t0 + secs(1));
        assert_eq!(c.projects.len(), MAX_PROJECTS + 1);
        assert!(close(c.projects[OTHER_PROJECTS].amount, 5.0 * 0.001));
    }

    #[test]
    fn shapes_in_different_currencies_have_no_total() {
        let l = Ledger::new(
            [
                ("a".to_string(), usd(1.0)),
                ("b".to_string(), Some(Price::parse("1 EUR").unwrap())),
            ],
            Duration::ZERO,
        );
        assert_eq!(l.costs(Instant::now()).total(), None);
    }

    #[test]
    fn jobs_and_overhead_add_up_to_the_bill_at_every_moment() {
        let mut l = Ledger::new(
            [("a".to_string(), usd(0.9)), ("b".to_string(), usd(2.7))],
            secs(60),
        );
        let t0 = Instant::now();
        // A small deterministic churn: instances come and go, jobs of several shares overlap.
        let mut seed: u64 = 7;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for step in 0..400u64 {
            let t = t0 + secs(step * 7);
            let inst = format!("i{}", next(6));
            match next(5) {
                0 => l.instance_started(&inst, if next(2) == 0 { "a" } else { "b" }, t),
                1 => drop(l.instance_gone(&inst, t)),
                2 | 3 => {
                    if l.live.contains_key(&inst) {
                        let share = [0.25, 0.5, 1.0][next(3) as usize];
                        l.job_started(&format!("j{step}"), &inst, share, Some("p"), t);
                    }
                }
                _ => {
                    let open: Vec<String> = l.jobs.keys().cloned().collect();
                    if let Some(k) = open.first() {
                        l.job_ended(k, t);
                    }
                }
            }
            let c = l.costs(t);
            let (billed, jobs, overhead, _) = c.total().unwrap();
            assert!(
                (jobs + overhead - billed).abs() <= 1e-9 * billed.max(1.0),
                "step {step}: {billed} != {jobs} + {overhead}"
            );
        }
    }
}
