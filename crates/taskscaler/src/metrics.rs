//! Prometheus metrics of the taskscalers: instances, slots, scaling and latencies.
//!
//! One [`MetricFamilies`] per process is registered once; each taskscaler writes to it through
//! a [`Metrics`] handle carrying its own labels (runner, shape, group), so several runners and
//! shapes share one family per metric as Prometheus expects.
//!
//! Each call also writes the family GitLab Runner's autoscaler (fleeting and taskscaler) exports
//! under its own name where the meaning is the same, so dashboards made for GitLab Runner work;
//! `docs/metrics.md` maps the names and says where the meanings differ.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

/// Seconds buckets from 100 ms to about 2 hours.
fn seconds_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.1, 2.0, 17,
    ))
}

/// The metric families, shared by every taskscaler of a process.
#[derive(Debug, Clone)]
pub struct MetricFamilies {
    instances: Family<Labels, Gauge>,
    slots: Family<Labels, Gauge>,
    scale_ups: Family<Labels, Counter>,
    scale_downs: Family<Labels, Counter>,
    creation: Histograms,
    readiness: Histograms,
    lifetime: Histograms,
    acquisition_wait: Histograms,
    capacity_refusals: Family<Labels, Counter>,
    diverted: Family<Labels, Gauge>,
    gitlab: GitLabFamilies,
}

/// The families under GitLab Runner's autoscaler names (`fleeting_*`).
#[derive(Debug, Clone)]
struct GitLabFamilies {
    instances: Family<Labels, Gauge>,
    max_instances: Family<Labels, Gauge>,
    is_running_time: Histograms,
    life_duration: Histograms,
    tasks: Family<Labels, Gauge>,
    max_tasks_per_instance: Family<Labels, Gauge>,
    max_use_count_per_instance: Family<Labels, Gauge>,
    readiness_time: Histograms,
    scale_operations: Family<Labels, Counter>,
}

impl Default for MetricFamilies {
    fn default() -> Self {
        let h = || Histograms::new_with_constructor(seconds_histogram);
        MetricFamilies {
            instances: Family::default(),
            slots: Family::default(),
            scale_ups: Family::default(),
            scale_downs: Family::default(),
            creation: h(),
            readiness: h(),
            lifetime: h(),
            acquisition_wait: h(),
            capacity_refusals: Family::default(),
            diverted: Family::default(),
            gitlab: GitLabFamilies {
                instances: Family::default(),
                max_instances: Family::default(),
                is_running_time: h(),
                life_duration: h(),
                tasks: Family::default(),
                max_tasks_per_instance: Family::default(),
                max_use_count_per_instance: Family::default(),
                readiness_time: h(),
                scale_operations: Family::default(),
            },
        }
    }
}

impl MetricFamilies {
    /// Add the families to `registry`: Slipway's under the `slipway_taskscaler` prefix, GitLab's
    /// under their own names.
    pub fn register(&self, registry: &mut Registry) {
        self.gitlab.register(registry);
        let r = registry.sub_registry_with_prefix("slipway_taskscaler");
        r.register("instances", "Instances by state", self.instances.clone());
        r.register(
            "slots",
            "Job slots by kind (idle, reserved, acquired)",
            self.slots.clone(),
        );
        r.register(
            "scale_ups",
            "Instances requested, by cause",
            self.scale_ups.clone(),
        );
        r.register(
            "scale_downs",
            "Instances removed, by cause",
            self.scale_downs.clone(),
        );
        r.register(
            "instance_creation_seconds",
            "Time from an instance first seen to running",
            self.creation.clone(),
        );
        r.register(
            "instance_readiness_seconds",
            "Time from running to ready for jobs",
            self.readiness.clone(),
        );
        r.register(
            "instance_lifetime_seconds",
            "Time from an instance first seen to gone",
            self.lifetime.clone(),
        );
        r.register(
            "acquisition_wait_seconds",
            "Time a job waited for a slot",
            self.acquisition_wait.clone(),
        );
        r.register(
            "capacity_refusals",
            "Instance requests the provider refused for lack of capacity",
            self.capacity_refusals.clone(),
        );
        r.register(
            "diverted",
            "1 while this shape's new capacity goes to its fallback shape",
            self.diverted.clone(),
        );
    }
}

impl GitLabFamilies {
    fn register(&self, r: &mut Registry) {
        r.register(
            "fleeting_provisioner_instances",
            "Instances by state",
            self.instances.clone(),
        );
        r.register(
            "fleeting_provisioner_max_instances",
            "Configured max_instances (0: unlimited)",
            self.max_instances.clone(),
        );
        r.register(
            "fleeting_provisioner_instance_is_running_time_seconds",
            "Time from an instance first seen to running",
            self.is_running_time.clone(),
        );
        r.register(
            "fleeting_provisioner_instance_life_duration_seconds",
            "Time from an instance first seen to gone",
            self.life_duration.clone(),
        );
        r.register(
            "fleeting_taskscaler_tasks",
            "Job slots by state (idle, reserved, acquired)",
            self.tasks.clone(),
        );
        r.register(
            "fleeting_taskscaler_max_tasks_per_instance",
            "Configured capacity_per_instance",
            self.max_tasks_per_instance.clone(),
        );
        r.register(
            "fleeting_taskscaler_max_use_count_per_instance",
            "Configured max_use_count (0: unlimited)",
            self.max_use_count_per_instance.clone(),
        );
        r.register(
            "fleeting_taskscaler_task_instance_readiness_time_seconds",
            "Time from an instance first seen to ready for jobs",
            self.readiness_time.clone(),
        );
        // Counters get `_total` on encoding: exported as fleeting_taskscaler_scale_operations_total.
        r.register(
            "fleeting_taskscaler_scale_operations",
            "Instances asked for (up) and removed (down)",
            self.scale_operations.clone(),
        );
    }
}

/// One taskscaler's view of the families: every sample carries its labels.
#[derive(Debug, Clone)]
pub struct Metrics {
    families: Arc<MetricFamilies>,
    labels: Labels,
    /// `labels` plus `runner_name`, GitLab's label for the runner's name, on GitLab's families.
    gitlab_labels: Labels,
}

impl Metrics {
    /// Write to `families` with `labels` (e.g. runner, shape and group) on every sample.
    pub fn new(families: Arc<MetricFamilies>, labels: Labels) -> Metrics {
        let mut gitlab_labels = labels.clone();
        // Our `runner` holds the runner's name, which GitLab puts in `runner_name`.
        if let Some((_, name)) = labels.iter().find(|(k, _)| k == "runner")
            && !labels.iter().any(|(k, _)| k == "runner_name")
        {
            gitlab_labels.push(("runner_name".into(), name.clone()));
        }
        Metrics {
            families,
            labels,
            gitlab_labels,
        }
    }

    /// Metrics of their own, labelled with the group only (tests, simulations).
    pub fn standalone(group: &str) -> Metrics {
        Metrics::new(
            Arc::new(MetricFamilies::default()),
            vec![("group".into(), group.into())],
        )
    }

    /// The families written to, to register with a registry.
    pub fn families(&self) -> Arc<MetricFamilies> {
        self.families.clone()
    }

    fn with(&self, key: &str, value: &str) -> Labels {
        let mut l = self.labels.clone();
        l.push((key.to_string(), value.to_string()));
        l
    }

    fn gitlab_with(&self, key: &str, value: &str) -> Labels {
        let mut l = self.gitlab_labels.clone();
        l.push((key.to_string(), value.to_string()));
        l
    }

    fn gitlab(&self) -> &GitLabFamilies {
        &self.families.gitlab
    }

    /// Set the count of instances in `state`.
    pub fn set_instances(&self, state: &str, n: i64) {
        self.families
            .instances
            .get_or_create(&self.with("state", state))
            .set(n);
        self.gitlab()
            .instances
            .get_or_create(&self.gitlab_with("state", state))
            .set(n);
    }

    /// Set the count of slots of `kind` (idle, reserved, acquired).
    pub fn set_slots(&self, kind: &str, n: i64) {
        self.families
            .slots
            .get_or_create(&self.with("kind", kind))
            .set(n);
        self.gitlab()
            .tasks
            .get_or_create(&self.gitlab_with("state", kind))
            .set(n);
    }

    /// Set the configured limits: `max_instances` and `max_use_count` (0: unlimited) and
    /// `capacity_per_instance`.
    pub fn set_limits(&self, max_instances: u32, capacity_per_instance: u32, max_use_count: u32) {
        let g = self.gitlab();
        let l = &self.gitlab_labels;
        g.max_instances
            .get_or_create(l)
            .set(i64::from(max_instances));
        g.max_tasks_per_instance
            .get_or_create(l)
            .set(i64::from(capacity_per_instance));
        g.max_use_count_per_instance
            .get_or_create(l)
            .set(i64::from(max_use_count));
    }

    /// Count `n` instances asked for, for `cause`.
    pub fn scaled_up(&self, cause: &str, n: u64) {
        self.families
            .scale_ups
            .get_or_create(&self.with("cause", cause))
            .inc_by(n);
        self.gitlab()
            .scale_operations
            .get_or_create(&self.gitlab_with("operation", "up"))
            .inc_by(n);
    }

    /// Count an `Increase` refused for lack of capacity.
    pub fn capacity_refused(&self) {
        self.families
            .capacity_refusals
            .get_or_create(&self.labels)
            .inc();
    }

    /// Whether this shape's new capacity goes to its fallback.
    pub fn set_diverted(&self, diverted: bool) {
        self.families
            .diverted
            .get_or_create(&self.labels)
            .set(i64::from(diverted));
    }

    /// Count an instance removed, for `cause`.
    pub fn scaled_down(&self, cause: &str) {
        self.families
            .scale_downs
            .get_or_create(&self.with("cause", cause))
            .inc();
        self.gitlab()
            .scale_operations
            .get_or_create(&self.gitlab_with("operation", "down"))
            .inc();
    }

    /// First seen → running.
    pub fn creation(&self, secs: f64) {
        self.families
            .creation
            .get_or_create(&self.labels)
            .observe(secs);
        self.gitlab()
            .is_running_time
            .get_or_create(&self.gitlab_labels)
            .observe(secs);
    }

    /// First seen → ready for jobs (after the ready check, if any).
    pub fn instance_ready(&self, secs: f64) {
        self.gitlab()
            .readiness_time
            .get_or_create(&self.gitlab_labels)
            .observe(secs);
    }

    /// Running → ready for jobs.
    pub fn readiness(&self, secs: f64) {
        self.families
            .readiness
            .get_or_create(&self.labels)
            .observe(secs);
    }

    /// First seen → gone.
    pub fn lifetime(&self, secs: f64) {
        self.families
            .lifetime
            .get_or_create(&self.labels)
            .observe(secs);
        self.gitlab()
            .life_duration
            .get_or_create(&self.gitlab_labels)
            .observe(secs);
    }

    /// `acquire` called → slot handed out.
    pub fn acquisition_wait(&self, secs: f64) {
        self.families
            .acquisition_wait
            .get_or_create(&self.labels)
            .observe(secs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(families: &MetricFamilies) -> String {
        let mut registry = Registry::default();
        families.register(&mut registry);
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

    fn sample() -> (Arc<MetricFamilies>, String) {
        let families = Arc::new(MetricFamilies::default());
        let m = Metrics::new(
            families.clone(),
            vec![
                ("runner".into(), "r1".into()),
                ("shape".into(), "small".into()),
                ("group".into(), "g1".into()),
            ],
        );
        m.set_instances("running", 3);
        m.set_instances("creating", 1);
        m.set_slots("idle", 5);
        m.set_slots("reserved", 2);
        m.set_slots("acquired", 4);
        m.set_limits(10, 2, 0);
        m.scaled_up("demand", 3);
        m.scaled_down("idle");
        m.scaled_down("max_use");
        m.creation(12.0);
        m.readiness(3.0);
        m.instance_ready(15.0);
        m.lifetime(600.0);
        m.acquisition_wait(0.5);
        let text = encoded(&families);
        (families, text)
    }

    const G: &str = r#"runner="r1",shape="small",group="g1",runner_name="r1""#;
    const S: &str = r#"runner="r1",shape="small",group="g1""#;

    #[test]
    fn gitlab_autoscaler_names_carry_the_same_values() {
        let (_, t) = sample();
        let cases = [
            (
                format!("fleeting_provisioner_instances{{{G},state=\"running\"}}"),
                3.0,
            ),
            (
                format!("fleeting_provisioner_instances{{{G},state=\"creating\"}}"),
                1.0,
            ),
            (format!("fleeting_provisioner_max_instances{{{G}}}"), 10.0),
            (
                format!("fleeting_taskscaler_tasks{{{G},state=\"idle\"}}"),
                5.0,
            ),
            (
                format!("fleeting_taskscaler_tasks{{{G},state=\"reserved\"}}"),
                2.0,
            ),
            (
                format!("fleeting_taskscaler_tasks{{{G},state=\"acquired\"}}"),
                4.0,
            ),
            (
                format!("fleeting_taskscaler_max_tasks_per_instance{{{G}}}"),
                2.0,
            ),
            (
                format!("fleeting_taskscaler_max_use_count_per_instance{{{G}}}"),
                0.0,
            ),
            (
                format!("fleeting_taskscaler_scale_operations_total{{{G},operation=\"up\"}}"),
                3.0,
            ),
            (
                format!("fleeting_taskscaler_scale_operations_total{{{G},operation=\"down\"}}"),
                2.0,
            ),
            (
                format!("fleeting_provisioner_instance_is_running_time_seconds_sum{{{G}}}"),
                12.0,
            ),
            (
                format!("fleeting_provisioner_instance_is_running_time_seconds_count{{{G}}}"),
                1.0,
            ),
            (
                format!("fleeting_taskscaler_task_instance_readiness_time_seconds_sum{{{G}}}"),
                15.0,
            ),
            (
                format!("fleeting_provisioner_instance_life_duration_seconds_sum{{{G}}}"),
                600.0,
            ),
        ];
        for (series, want) in cases {
            assert_eq!(value(&t, &series), Some(want), "{series} in\n{t}");
        }
        assert!(
            t.contains(&format!(
                "fleeting_provisioner_instance_life_duration_seconds_bucket{{le=\"+Inf\",{G}}} 1"
            )),
            "{t}"
        );
        assert!(t.contains("# TYPE fleeting_taskscaler_scale_operations counter"));
        assert!(t.contains("# TYPE fleeting_taskscaler_tasks gauge"));
        assert!(
            t.contains("# TYPE fleeting_provisioner_instance_is_running_time_seconds histogram")
        );
    }

    #[test]
    fn slipway_families_are_unchanged() {
        let (_, t) = sample();
        let cases = [
            (
                format!("slipway_taskscaler_instances{{{S},state=\"running\"}}"),
                3.0,
            ),
            (
                format!("slipway_taskscaler_slots{{{S},kind=\"acquired\"}}"),
                4.0,
            ),
            (
                format!("slipway_taskscaler_scale_ups_total{{{S},cause=\"demand\"}}"),
                3.0,
            ),
            (
                format!("slipway_taskscaler_scale_downs_total{{{S},cause=\"idle\"}}"),
                1.0,
            ),
            (
                format!("slipway_taskscaler_instance_creation_seconds_sum{{{S}}}"),
                12.0,
            ),
            (
                format!("slipway_taskscaler_instance_readiness_seconds_sum{{{S}}}"),
                3.0,
            ),
            (
                format!("slipway_taskscaler_instance_lifetime_seconds_sum{{{S}}}"),
                600.0,
            ),
            (
                format!("slipway_taskscaler_acquisition_wait_seconds_sum{{{S}}}"),
                0.5,
            ),
        ];
        for (series, want) in cases {
            assert_eq!(value(&t, &series), Some(want), "{series} in\n{t}");
        }
        // GitLab's runner_name stays off Slipway's own families.
        assert!(
            !t.lines()
                .any(|l| l.starts_with("slipway_") && l.contains("runner_name")),
            "{t}"
        );
    }

    #[test]
    fn runner_name_only_when_a_runner_label_exists() {
        let m = Metrics::standalone("g");
        m.set_instances("running", 1);
        let t = encoded(&m.families());
        assert_eq!(
            value(
                &t,
                r#"fleeting_provisioner_instances{group="g",state="running"}"#
            ),
            Some(1.0),
            "{t}"
        );
    }
}
