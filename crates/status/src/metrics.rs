//! Job metrics under the names GitLab Runner exports (`gitlab_runner_jobs` and the like), so
//! dashboards made for GitLab Runner keep working, plus Slipway's own `slipway_jobs*`.
//!
//! `docs/metrics.md` maps each name to GitLab Runner's and says where the meanings differ.

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;
/// A counter of money (fractions of a currency unit).
type Amount = Counter<f64, std::sync::atomic::AtomicU64>;
/// A gauge of money per hour.
type Rate = Gauge<f64, std::sync::atomic::AtomicU64>;
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

/// GitLab Runner's buckets for `gitlab_runner_job_duration_seconds`: 30 s to 10 h.
const JOB_DURATION_BUCKETS: [f64; 10] = [
    30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 10800.0, 18000.0, 36000.0,
];

fn job_duration_histogram() -> Histogram {
    Histogram::new(JOB_DURATION_BUCKETS)
}

/// A counter exported under its full name with type `unknown`.
///
/// OpenMetrics names a counter's family without `_total`: a counter for `gitlab_runner_jobs_total`
/// would share the family name `gitlab_runner_jobs` with GitLab's gauge of that name, which
/// OpenMetrics forbids. As `unknown`, the sample name is exactly GitLab's and the families differ.
#[derive(Debug, Clone, Default)]
struct Total(Counter);

impl TypedMetric for Total {
    const TYPE: MetricType = MetricType::Unknown;
}

impl EncodeMetric for Total {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        // A gauge sample is `name{labels} value`, with no suffix: what `unknown` needs.
        encoder.encode_gauge(&self.0.get())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Unknown
    }
}

/// The job metric families of a manager, written by the job board.
///
/// Clones share the families: the board's copy writes what the registry's copy exports.
#[derive(Debug, Clone)]
pub struct JobMetrics {
    /// `gitlab_runner_jobs{runner, state}`: jobs taken, `pending` (waiting for a slot) or
    /// `running`.
    gitlab_jobs: Family<Labels, Gauge>,
    /// `gitlab_runner_jobs_total{runner}`: jobs taken.
    gitlab_jobs_total: Family<Labels, Total>,
    /// `gitlab_runner_failed_jobs_total{runner, failure_reason}`.
    gitlab_failed: Family<Labels, Counter>,
    /// `gitlab_runner_job_duration_seconds{runner}`.
    gitlab_duration: Histograms,
    /// `slipway_jobs{runner, state}`: `waiting` or `running`.
    jobs: Family<Labels, Gauge>,
    /// `slipway_jobs_finished_total{runner, outcome}`.
    finished: Family<Labels, Counter>,
    /// `slipway_vm_starts_total{runner, image, start}`: `start` is `warm` or `cold`.
    vm_starts: Family<Labels, Counter>,
    /// `slipway_job_cost_total{runner, shape, currency}`: jobs' shares of their instances.
    job_cost: Family<Labels, Amount>,
    /// `slipway_project_cost_total{runner, project, currency}`: the same by project, bounded.
    project_cost: Family<Labels, Amount>,
    /// `slipway_instance_billed_total{runner, shape, currency}`: bills of instances gone.
    billed: Family<Labels, Amount>,
    /// `slipway_instance_overhead_total{runner, shape, currency}`: what of those bills no job
    /// used.
    overhead: Family<Labels, Amount>,
    /// `slipway_cost_per_hour{runner, shape, currency}`: what the live instances cost now.
    per_hour: Family<Labels, Rate>,
}

impl Default for JobMetrics {
    fn default() -> Self {
        JobMetrics {
            gitlab_jobs: Family::default(),
            gitlab_jobs_total: Family::default(),
            gitlab_failed: Family::default(),
            gitlab_duration: Histograms::new_with_constructor(job_duration_histogram),
            jobs: Family::default(),
            finished: Family::default(),
            vm_starts: Family::default(),
            job_cost: Family::default(),
            project_cost: Family::default(),
            billed: Family::default(),
            overhead: Family::default(),
            per_hour: Family::default(),
        }
    }
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl JobMetrics {
    /// Add the families to `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "gitlab_runner_jobs",
            "Jobs taken and not finished, by state (pending: waiting for a slot; running)",
            self.gitlab_jobs.clone(),
        );
        registry.register(
            "gitlab_runner_jobs_total",
            "Jobs taken",
            self.gitlab_jobs_total.clone(),
        );
        // Counters get `_total` on encoding: exported as gitlab_runner_failed_jobs_total.
        registry.register(
            "gitlab_runner_failed_jobs",
            "Failed jobs, by GitLab failure reason",
            self.gitlab_failed.clone(),
        );
        registry.register(
            "gitlab_runner_job_duration_seconds",
            "Time from taking a job to its end (its wait for a slot and its run)",
            self.gitlab_duration.clone(),
        );
        registry.register(
            "slipway_jobs",
            "Jobs waiting for a slot or running",
            self.jobs.clone(),
        );
        registry.register(
            "slipway_jobs_finished",
            "Jobs ended, by outcome (success, failed, canceled)",
            self.finished.clone(),
        );
        registry.register(
            "slipway_vm_starts",
            "VM starts of microvm and vm jobs, by image and start: warm (the slot's VM was started ahead of the job) or cold",
            self.vm_starts.clone(),
        );
        registry.register(
            "slipway_job_cost",
            "Jobs' costs: each job's share of its instance's price over the time it held its slot, by shape and currency",
            self.job_cost.clone(),
        );
        registry.register(
            "slipway_project_cost",
            "Jobs' costs by project, where the source knows it (at most 100 projects per runner, the rest as \"(other)\")",
            self.project_cost.clone(),
        );
        registry.register(
            "slipway_instance_billed",
            "What instances were billed (per second with the billing minimum), counted when they are gone",
            self.billed.clone(),
        );
        registry.register(
            "slipway_instance_overhead",
            "What of the instances' bills no job used (boot, idle, unused capacity, removal, the minimum), counted when they are gone",
            self.overhead.clone(),
        );
        registry.register(
            "slipway_cost_per_hour",
            "What the runner's live instances cost per hour now",
            self.per_hour.clone(),
        );
    }

    /// A job of `runner` on a `shape` instance cost `amount` in `currency`, for `project` (the
    /// ledger's bounded name) when its source knows it.
    pub fn job_cost(
        &self,
        runner: &str,
        shape: &str,
        project: Option<&str>,
        amount: f64,
        currency: &str,
    ) {
        self.job_cost
            .get_or_create(&labels(&[
                ("runner", runner),
                ("shape", shape),
                ("currency", currency),
            ]))
            .inc_by(amount);
        if let Some(project) = project {
            self.project_cost
                .get_or_create(&labels(&[
                    ("runner", runner),
                    ("project", project),
                    ("currency", currency),
                ]))
                .inc_by(amount);
        }
    }

    /// An instance of `runner`'s `shape` is gone: it was billed `billed`, of which
    /// `overhead` no job used.
    pub fn instance_settled(
        &self,
        runner: &str,
        shape: &str,
        billed: f64,
        overhead: f64,
        currency: &str,
    ) {
        let l = labels(&[("runner", runner), ("shape", shape), ("currency", currency)]);
        self.billed.get_or_create(&l).inc_by(billed);
        // Rounding may leave a hair below zero where jobs used the whole instance.
        self.overhead.get_or_create(&l).inc_by(overhead.max(0.0));
    }

    /// `runner`'s live `shape` instances cost `per_hour` in `currency` now.
    pub fn set_cost_per_hour(&self, runner: &str, shape: &str, per_hour: f64, currency: &str) {
        self.per_hour
            .get_or_create(&labels(&[
                ("runner", runner),
                ("shape", shape),
                ("currency", currency),
            ]))
            .set(per_hour);
    }

    /// A `microvm` or `vm` job of `runner` got its VM of `image`, `warm` when started ahead.
    pub fn vm_started(&self, runner: &str, image: &str, warm: bool) {
        let start = if warm { "warm" } else { "cold" };
        self.vm_starts
            .get_or_create(&labels(&[
                ("runner", runner),
                ("image", image),
                ("start", start),
            ]))
            .inc();
    }

    /// A job of `runner` started waiting for a slot.
    pub fn waiting(&self, runner: &str) {
        self.gitlab_jobs_total
            .get_or_create(&labels(&[("runner", runner)]))
            .0
            .inc();
        self.move_job(runner, None, Some(("pending", "waiting")));
    }

    /// A job of `runner` got its slot and runs (no longer waiting).
    pub fn started(&self, runner: &str) {
        self.move_job(
            runner,
            Some(("pending", "waiting")),
            Some(("running", "running")),
        );
    }

    /// A job of `runner` ended: `outcome` is `success`, `failed` or `canceled`,
    /// `failure_reason` GitLab's reason when it failed; `ran` whether it got a slot; `taken_s`
    /// the time since the runner took it (its wait and its run, as GitLab times a job).
    pub fn finished(
        &self,
        runner: &str,
        outcome: &str,
        failure_reason: Option<&str>,
        ran: bool,
        taken_s: f64,
    ) {
        self.move_job(runner, Some(Self::state(ran)), None);
        self.gitlab_duration
            .get_or_create(&labels(&[("runner", runner)]))
            .observe(taken_s);
        if let Some(reason) = failure_reason {
            self.gitlab_failed
                .get_or_create(&labels(&[("runner", runner), ("failure_reason", reason)]))
                .inc();
        }
        self.finished
            .get_or_create(&labels(&[("runner", runner), ("outcome", outcome)]))
            .inc();
    }

    /// A job of `runner` left it without ending (given back to its queue): only the gauges move.
    pub fn dropped(&self, runner: &str, ran: bool) {
        self.move_job(runner, Some(Self::state(ran)), None);
    }

    /// A job's state as (GitLab's, Slipway's) name: running once it got a slot.
    fn state(ran: bool) -> (&'static str, &'static str) {
        if ran {
            ("running", "running")
        } else {
            ("pending", "waiting")
        }
    }

    /// Move one job of `runner` between states, each given as (GitLab's, Slipway's) name.
    fn move_job(&self, runner: &str, from: Option<(&str, &str)>, to: Option<(&str, &str)>) {
        for (state, delta) in [(from, -1), (to, 1)] {
            let Some((gitlab, ours)) = state else {
                continue;
            };
            self.gitlab_jobs
                .get_or_create(&labels(&[("runner", runner), ("state", gitlab)]))
                .inc_by(delta);
            self.jobs
                .get_or_create(&labels(&[("runner", runner), ("state", ours)]))
                .inc_by(delta);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `m`'s families as `/metrics` encodes them.
    pub(crate) fn encoded(m: &JobMetrics) -> String {
        let mut registry = Registry::default();
        m.register(&mut registry);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .unwrap_or_else(|e| panic!("encoding: {e}"));
        out
    }

    /// The value of the sample `series` (name and labels exactly as encoded).
    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn a_job_walks_through_the_gauges_and_counters() {
        let m = JobMetrics::default();
        // The board holds a clone: writes through it are what the registry's copy exports.
        let board = m.clone();
        board.waiting("r1");
        board.waiting("r1");
        board.waiting("r1");
        board.started("r1");
        board.started("r1");
        let t = encoded(&m);
        let cases = [
            (r#"gitlab_runner_jobs{runner="r1",state="pending"}"#, 1.0),
            (r#"gitlab_runner_jobs{runner="r1",state="running"}"#, 2.0),
            (r#"slipway_jobs{runner="r1",state="waiting"}"#, 1.0),
            (r#"slipway_jobs{runner="r1",state="running"}"#, 2.0),
            (r#"gitlab_runner_jobs_total{runner="r1"}"#, 3.0),
        ];
        for (series, want) in cases {
            assert_eq!(value(&t, series), Some(want), "{series} in\n{t}");
        }

        board.finished("r1", "success", None, true, 45.0);
        board.finished("r1", "failed", Some("script_failure"), true, 4000.0);
        board.finished("r1", "failed", Some("runner_system_failure"), false, 5.0);
        let t = encoded(&m);
        let cases = [
            (r#"gitlab_runner_jobs{runner="r1",state="pending"}"#, 0.0),
            (r#"gitlab_runner_jobs{runner="r1",state="running"}"#, 0.0),
            (r#"slipway_jobs{runner="r1",state="waiting"}"#, 0.0),
            (r#"slipway_jobs{runner="r1",state="running"}"#, 0.0),
            (
                r#"gitlab_runner_failed_jobs_total{runner="r1",failure_reason="script_failure"}"#,
                1.0,
            ),
            (
                r#"gitlab_runner_failed_jobs_total{runner="r1",failure_reason="runner_system_failure"}"#,
                1.0,
            ),
            (
                r#"slipway_jobs_finished_total{runner="r1",outcome="success"}"#,
                1.0,
            ),
            (
                r#"slipway_jobs_finished_total{runner="r1",outcome="failed"}"#,
                2.0,
            ),
            // Every job taken is timed, as GitLab does, the one that never ran too.
            (
                r#"gitlab_runner_job_duration_seconds_count{runner="r1"}"#,
                3.0,
            ),
            (
                r#"gitlab_runner_job_duration_seconds_sum{runner="r1"}"#,
                4050.0,
            ),
            (
                r#"gitlab_runner_job_duration_seconds_bucket{le="60.0",runner="r1"}"#,
                2.0,
            ),
            (
                r#"gitlab_runner_job_duration_seconds_bucket{le="7200.0",runner="r1"}"#,
                3.0,
            ),
        ];
        for (series, want) in cases {
            assert_eq!(value(&t, series), Some(want), "{series} in\n{t}");
        }
    }

    #[test]
    fn costs_are_counted_per_runner_shape_and_project() {
        let m = JobMetrics::default();
        m.job_cost("r1", "big", Some("group/app"), 0.25, "USD");
        m.job_cost("r1", "big", None, 0.5, "USD");
        m.instance_settled("r1", "big", 1.0, 0.25, "USD");
        m.set_cost_per_hour("r1", "big", 3.4, "USD");
        let t = encoded(&m);
        let cases = [
            (
                r#"slipway_job_cost_total{runner="r1",shape="big",currency="USD"}"#,
                0.75,
            ),
            (
                r#"slipway_project_cost_total{runner="r1",project="group/app",currency="USD"}"#,
                0.25,
            ),
            (
                r#"slipway_instance_billed_total{runner="r1",shape="big",currency="USD"}"#,
                1.0,
            ),
            (
                r#"slipway_instance_overhead_total{runner="r1",shape="big",currency="USD"}"#,
                0.25,
            ),
            (
                r#"slipway_cost_per_hour{runner="r1",shape="big",currency="USD"}"#,
                3.4,
            ),
        ];
        for (series, want) in cases {
            assert_eq!(value(&t, series), Some(want), "{series} in\n{t}");
        }
    }

    #[test]
    fn job_duration_uses_gitlab_buckets() {
        let m = JobMetrics::default();
        m.waiting("r");
        m.started("r");
        m.finished("r", "success", None, true, 1.0);
        let t = encoded(&m);
        let les: Vec<&str> = t
            .lines()
            .filter(|l| l.starts_with("gitlab_runner_job_duration_seconds_bucket"))
            .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next())
            .collect();
        assert_eq!(
            les,
            [
                "30.0", "60.0", "300.0", "600.0", "1800.0", "3600.0", "7200.0", "10800.0",
                "18000.0", "36000.0", "+Inf"
            ]
        );
    }

    #[test]
    fn jobs_total_is_a_distinct_family_from_the_jobs_gauge() {
        let m = JobMetrics::default();
        m.waiting("r");
        let t = encoded(&m);
        let types: Vec<&str> = t.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        assert!(types.contains(&"# TYPE gitlab_runner_jobs gauge"), "{t}");
        assert!(
            types.contains(&"# TYPE gitlab_runner_jobs_total unknown"),
            "{t}"
        );
        // OpenMetrics: every family name appears once.
        let mut names: Vec<&str> = types.iter().filter_map(|l| l.split(' ').nth(2)).collect();
        let all = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all, "{t}");
        assert!(
            t.contains("gitlab_runner_jobs_total{runner=\"r\"} 1\n"),
            "{t}"
        );
    }
}
