//! What jobs cost, end to end: a `slipway run` on the local plugin with a price per hour,
//! queue jobs through it, and the costs on the status API, `/metrics` and `slipway status`
//! adding up to what the instance was billed.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{World, stop_manager, wait_until};
use slipway_status::FleetStatus;

/// Three jobs of at least two seconds each on one instance of two slots.
const PIPELINE: &str = r#"
a:
  script: ["sleep 2"]
b:
  script: ["sleep 2"]
c:
  script: ["sleep 2"]
"#;

/// 3.6 per hour: 0.001 per second.
const PER_SECOND: f64 = 0.001;

fn status(port: u16) -> FleetStatus {
    let body = common::http_body(port, "/api/v1/status");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// The value of the sample `series` (name and labels exactly as encoded).
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 + 1e-6 * b.abs()
}

#[test]
fn jobs_and_overhead_add_up_to_the_bill_on_every_surface() {
    let w = World::new();
    let port = common::free_port();
    // One instance, removed 2 s after its last job: its bill settles during the test.
    let auto = common::local_autoscaler_of(&w, "cost", 1)
        .replace(
            "    plugin = \"local\"\n",
            "    plugin = \"local\"\n    price_per_hour = 3.6\n    billing_minimum = \"10s\"\n",
        )
        .replace("idle_time = \"10m\"", "idle_time = \"2s\"");
    let cfg = w.write(
        "config.toml",
        &format!(
            "concurrent = 4\nlisten_address = \"127.0.0.1:{port}\"\n[[runners]]\n  name = \"fleet\"\n  executor = \"instance\"\n{auto}"
        ),
    );
    let child = common::start_manager(&w, &cfg);
    assert!(wait_until(Duration::from_secs(60), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    }));
    w.submit(&cfg, "pipeline.yml", PIPELINE);

    let mut s = FleetStatus::default();
    assert!(
        wait_until(Duration::from_secs(180), || {
            s = status(port);
            s.runners[0].recent.len() == 3
        }),
        "the three jobs did not end: {s:?}"
    );
    let r = &s.runners[0];
    for j in &r.recent {
        assert_eq!(j.outcome, "success", "{j:?}");
        assert_eq!(j.currency.as_deref(), Some("USD"), "{j:?}");
        // Half the instance (one slot of two) for at least its 2 s of sleep, and no longer
        // than it held the slot.
        let cost = j.cost.expect("a priced job has a cost");
        assert!(cost >= PER_SECOND * 0.5 * 2.0, "{j:?}");
        assert!(cost <= PER_SECOND * 0.5 * (j.duration_s + 0.01), "{j:?}");
    }
    let jobs: f64 = r.recent.iter().filter_map(|j| j.cost).sum();

    // /metrics counts the same jobs.
    let labels = r#"{runner="fleet",shape="default",currency="USD"}"#;
    let metrics = common::http_body(port, "/metrics");
    let counted = sample(&metrics, &format!("slipway_job_cost_total{labels}"))
        .unwrap_or_else(|| panic!("no job cost in\n{metrics}"));
    assert!(close(counted, jobs), "{counted} vs {jobs}");

    // Once the idle instance is gone its bill settles: at least the minimum, and its jobs plus
    // its overhead exactly.
    let mut metrics = String::new();
    assert!(
        wait_until(Duration::from_secs(60), || {
            metrics = common::http_body(port, "/metrics");
            sample(&metrics, &format!("slipway_instance_billed_total{labels}")).is_some()
        }),
        "the instance's bill never settled:\n{metrics}"
    );
    let billed = sample(&metrics, &format!("slipway_instance_billed_total{labels}")).unwrap();
    let overhead = sample(
        &metrics,
        &format!("slipway_instance_overhead_total{labels}"),
    )
    .unwrap();
    assert!(billed >= PER_SECOND * 10.0, "billed {billed}");
    assert!(
        overhead > 0.0,
        "boot and idle time are overhead: {overhead}"
    );
    assert!(
        close(jobs + overhead, billed),
        "{jobs} + {overhead} vs {billed}"
    );
    assert_eq!(
        sample(&metrics, &format!("slipway_cost_per_hour{labels}")),
        Some(0.0),
        "no instance lives: {metrics}"
    );

    // The status API and `slipway status` say the same.
    let c = status(port).runners[0].costs.clone().expect("costs");
    assert_eq!(c.currency, "USD");
    assert!(close(c.billed, billed), "{c:?} vs {billed}");
    assert!(close(c.jobs, jobs) && close(c.overhead, overhead), "{c:?}");
    assert!(c.unpriced.is_empty(), "{c:?}");
    let text = w.run(&["status", "-c", cfg.to_str().unwrap()]);
    assert_eq!(text.code, Some(0), "{}", text.explain());
    assert!(
        text.stdout.contains("cost: 0.0000 USD per hour now · "),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains(" · cost 0.00"), "{}", text.stdout);

    stop_manager(&w, child);
}
