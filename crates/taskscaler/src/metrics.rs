//! Prometheus metrics of one taskscaler: instances, slots, scaling and latencies.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

/// Seconds buckets from 100 ms to about 2 hours.
fn seconds_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(0.1, 2.0, 17)
}

/// The metric families; labels carry the instance group so several runners can share a registry.
#[derive(Debug)]
pub struct Metrics {
    group: String,
    /// Instances by state.
    pub instances: Family<Labels, Gauge>,
    /// Slots by kind: idle, reserved, acquired.
    pub slots: Family<Labels, Gauge>,
    /// Instances asked for, by cause.
    pub scale_ups: Family<Labels, Counter>,
    /// Instances removed, by cause.
    pub scale_downs: Family<Labels, Counter>,
    /// First seen → running.
    pub creation_seconds: Histogram,
    /// Running → ready for jobs (`instance_ready_command`).
    pub readiness_seconds: Histogram,
    /// First seen → gone.
    pub lifetime_seconds: Histogram,
    /// `acquire` called → slot handed out.
    pub acquisition_wait_seconds: Histogram,
}

impl Metrics {
    /// Metrics for the group with id `group`.
    pub fn new(group: &str) -> Metrics {
        Metrics {
            group: group.to_string(),
            instances: Family::default(),
            slots: Family::default(),
            scale_ups: Family::default(),
            scale_downs: Family::default(),
            creation_seconds: Histogram::new(seconds_buckets()),
            readiness_seconds: Histogram::new(seconds_buckets()),
            lifetime_seconds: Histogram::new(seconds_buckets()),
            acquisition_wait_seconds: Histogram::new(seconds_buckets()),
        }
    }

    /// Label set with the group and one more pair.
    pub fn labels(&self, key: &str, value: &str) -> Labels {
        vec![
            ("group".to_string(), self.group.clone()),
            (key.to_string(), value.to_string()),
        ]
    }

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
            self.creation_seconds.clone(),
        );
        r.register(
            "instance_readiness_seconds",
            "Time from running to ready for jobs",
            self.readiness_seconds.clone(),
        );
        r.register(
            "instance_lifetime_seconds",
            "Time from an instance first seen to gone",
            self.lifetime_seconds.clone(),
        );
        r.register(
            "acquisition_wait_seconds",
            "Time a job waited for a slot",
            self.acquisition_wait_seconds.clone(),
        );
    }
}
