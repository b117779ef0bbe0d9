//! Prometheus metrics of the taskscalers: instances, slots, scaling and latencies.
//!
//! One [`MetricFamilies`] per process is registered once; each taskscaler writes to it through
//! a [`Metrics`] handle carrying its own labels (runner, shape, group), so several runners and
//! shapes share one family per metric as Prometheus expects.

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
        }
    }
}

impl MetricFamilies {
    /// Add the families to `registry`, under the `slipway_taskscaler` prefix.
    pub fn register(&self, registry: &mut Registry) {
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
    }
}

/// One taskscaler's view of the families: every sample carries its labels.
#[derive(Debug, Clone)]
pub struct Metrics {
    families: Arc<MetricFamilies>,
    labels: Labels,
}

impl Metrics {
    /// Write to `families` with `labels` (e.g. runner, shape and group) on every sample.
    pub fn new(families: Arc<MetricFamilies>, labels: Labels) -> Metrics {
        Metrics { families, labels }
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

    /// Set the count of instances in `state`.
    pub fn set_instances(&self, state: &str, n: i64) {
        self.families
            .instances
            .get_or_create(&self.with("state", state))
            .set(n);
    }

    /// Set the count of slots of `kind` (idle, reserved, acquired).
    pub fn set_slots(&self, kind: &str, n: i64) {
        self.families
            .slots
            .get_or_create(&self.with("kind", kind))
            .set(n);
    }

    /// Count `n` instances asked for, for `cause`.
    pub fn scaled_up(&self, cause: &str, n: u64) {
        self.families
            .scale_ups
            .get_or_create(&self.with("cause", cause))
            .inc_by(n);
    }

    /// Count an instance removed, for `cause`.
    pub fn scaled_down(&self, cause: &str) {
        self.families
            .scale_downs
            .get_or_create(&self.with("cause", cause))
            .inc();
    }

    /// First seen → running.
    pub fn creation(&self, secs: f64) {
        self.families
            .creation
            .get_or_create(&self.labels)
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
    }

    /// `acquire` called → slot handed out.
    pub fn acquisition_wait(&self, secs: f64) {
        self.families
            .acquisition_wait
            .get_or_create(&self.labels)
            .observe(secs);
    }
}
