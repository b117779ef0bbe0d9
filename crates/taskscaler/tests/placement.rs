//! Resource-aware placement: jobs sized by CPU, memory and GPU across shapes of instances,
//! against in-memory instance groups.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Memory;
use slipway_fleeting::ProviderInfo;
use slipway_taskscaler::{
    Config, Error, Fallback, Placement, Policy, Resources, Shape, Taskscaler,
};

const GIB: u64 = 1 << 30;

fn res(cpu: f64, mem_gib: u64, gpus: u32) -> Resources {
    Resources {
        cpu_millis: (cpu * 1000.0) as u64,
        memory_bytes: mem_gib * GIB,
        gpus,
    }
}

fn cfg(cap: u32, offer: Option<Resources>, cost: f64) -> Config {
    Config {
        capacity_per_instance: cap,
        max_instances: 10,
        policies: vec![Policy {
            idle_time: Duration::from_secs(600),
            ..Policy::default()
        }],
        instance_acquire_timeout: Duration::from_secs(10),
        update_interval: Duration::from_millis(50),
        update_interval_when_expecting: Duration::from_millis(10),
        delete_instances_on_shutdown: true,
        shutdown_deletion_interval: Duration::from_millis(50),
        instance_resources: offer,
        instance_cost: cost,
        ..Config::default()
    }
}

fn provider(id: &str) -> ProviderInfo {
    ProviderInfo {
        id: id.into(),
        ..ProviderInfo::default()
    }
}

fn shape(name: &str, group: &Arc<Memory>, c: Config) -> Shape {
    Shape {
        name: name.into(),
        scaler: Taskscaler::start(group.clone(), provider(name), c).expect("start"),
    }
}

#[tokio::test]
async fn a_large_job_takes_several_slots_of_one_instance() {
    let group = Arc::new(Memory::default());
    // 4 CPU, 16 GiB in 4 slots: one slot is 1 CPU, 4 GiB.
    let ts = Taskscaler::start(
        group.clone(),
        provider("g"),
        cfg(4, Some(res(4.0, 16, 0)), 1.0),
    )
    .expect("start");
    ts.reserve_for("big", &res(3.0, 2, 0)).expect("big");
    let big = ts.acquire("big").await.expect("big");
    assert_eq!(big.slots, 3);
    assert_eq!(big.resources, Some(res(3.0, 12, 0)));
    // One slot left on that instance: a small job packs there, a second big one cannot.
    ts.reserve("small").expect("small");
    let small = ts.acquire("small").await.expect("small");
    assert_eq!(small.instance_id, big.instance_id);
    assert_eq!(small.slots, 1);
    ts.reserve_for("big2", &res(0.5, 8, 0)).expect("big2");
    let big2 = ts
        .acquire("big2")
        .await
        .expect("big2: a new instance is added for it");
    assert_eq!(big2.slots, 2, "8 GiB needs two 4 GiB slots");
    assert_ne!(big2.instance_id, big.instance_id);
    // Releasing the big job frees all three of its slots.
    ts.release("big");
    ts.reserve_for("big3", &res(3.0, 1, 0)).expect("big3");
    let big3 = ts.acquire("big3").await.expect("big3");
    assert_eq!(big3.instance_id, big.instance_id);
    ts.shutdown().await;
}

#[tokio::test]
async fn scattered_free_slots_make_room_for_a_large_job() {
    let group = Arc::new(Memory::default());
    let ts = Taskscaler::start(
        group.clone(),
        provider("g"),
        cfg(3, Some(res(3.0, 12, 0)), 1.0),
    )
    .expect("start");
    // Two two-slot jobs on two three-slot instances: two free slots, one on each.
    ts.reserve_for("a", &res(2.0, 0, 0)).expect("a");
    ts.reserve_for("b", &res(2.0, 0, 0)).expect("b");
    let a = ts.acquire("a").await.expect("a");
    let b = ts.acquire("b").await.expect("b");
    assert_ne!(a.instance_id, b.instance_id);
    assert_eq!(group.instances.lock().unwrap().len(), 2);
    // Counting slots says two are free; a two-slot job still needs an instance of its own.
    ts.reserve_for("d", &res(2.0, 0, 0)).expect("d");
    let d = ts
        .acquire("d")
        .await
        .expect("d gets an instance of its own");
    assert_eq!(d.slots, 2);
    assert_eq!(group.instances.lock().unwrap().len(), 3);
    // The one-slot jobs still pack into the scattered slots.
    ts.reserve("e").expect("e");
    let e = ts.acquire("e").await.expect("e");
    assert!([&a.instance_id, &b.instance_id, &d.instance_id].contains(&&e.instance_id));
    assert_eq!(group.instances.lock().unwrap().len(), 3);
    ts.shutdown().await;
}

#[tokio::test]
async fn a_request_no_instance_can_hold_fails_at_once() {
    let group = Arc::new(Memory::default());
    let ts = Taskscaler::start(
        group.clone(),
        provider("small-group"),
        cfg(2, Some(res(2.0, 4, 0)), 1.0),
    )
    .expect("start");
    let e = ts.reserve_for("huge", &res(8.0, 1, 0)).unwrap_err();
    assert!(matches!(e, Error::Unsatisfiable(_)), "{e}");
    assert_eq!(
        e.to_string(),
        "the job asks for cpu=8 memory=1GiB, more than one instance of small-group offers (cpu=2 memory=4GiB)"
    );
    // Nothing was reserved and nothing scaled up for it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(ts.stats().pending, 0);
    assert!(group.instances.lock().unwrap().is_empty());
    ts.shutdown().await;
}

#[tokio::test]
async fn without_declared_resources_every_job_takes_one_slot() {
    let group = Arc::new(Memory::default());
    let ts = Taskscaler::start(group.clone(), provider("g"), cfg(2, None, 1.0)).expect("start");
    ts.reserve_for("a", &res(64.0, 512, 4))
        .expect("no resources declared: slots only");
    let a = ts.acquire("a").await.expect("a");
    assert_eq!(a.slots, 1);
    assert_eq!(a.resources, None);
    ts.shutdown().await;
}

#[tokio::test]
async fn placement_picks_the_cheapest_shape_that_fits_and_scales_only_it() {
    let small = Arc::new(Memory::default());
    let large = Arc::new(Memory::default());
    let gpu = Arc::new(Memory::default());
    let placement = Placement::new(vec![
        shape("small", &small, cfg(2, Some(res(2.0, 4, 0)), 1.0)),
        shape("large", &large, cfg(4, Some(res(8.0, 32, 0)), 4.5)),
        shape("gpu", &gpu, cfg(1, Some(res(8.0, 32, 1)), 10.0)),
    ]);
    // 1 CPU: half a small instance (0.5) beats a quarter of a large one (1.125).
    placement.reserve("a", &res(1.0, 1, 0)).expect("a");
    assert_eq!(placement.shape_of("a").unwrap().name, "small");
    let a = placement.acquire("a").await.expect("a");
    // 4 CPU only fits large.
    placement.reserve("b", &res(4.0, 8, 0)).expect("b");
    assert_eq!(placement.shape_of("b").unwrap().name, "large");
    let b = placement.acquire("b").await.expect("b");
    assert_eq!(b.slots, 2);
    // A GPU job goes to the GPU shape.
    placement.reserve("c", &res(1.0, 1, 1)).expect("c");
    assert_eq!(placement.shape_of("c").unwrap().name, "gpu");
    let c = placement.acquire("c").await.expect("c");
    // Only the shape each job needed was scaled up.
    assert_eq!(small.instances.lock().unwrap().len(), 1, "{a:?}");
    assert_eq!(large.instances.lock().unwrap().len(), 1);
    assert_eq!(gpu.instances.lock().unwrap().len(), 1, "{c:?}");
    // Packing first: a 1-CPU job now fits the running large instance... but the small one has
    // a free slot too and is cheaper for it; fill small, then the next goes to running large
    // rather than a new small instance.
    placement.reserve("d", &res(1.0, 1, 0)).expect("d");
    let d = placement.acquire("d").await.expect("d");
    assert_eq!(d.instance_id, a.instance_id);
    placement.reserve("e", &res(1.0, 1, 0)).expect("e");
    assert_eq!(
        placement.shape_of("e").unwrap().name,
        "large",
        "packs onto the running large instance before creating a small one"
    );
    let e = placement.acquire("e").await.expect("e");
    assert_eq!(e.instance_id, b.instance_id);
    assert_eq!(small.instances.lock().unwrap().len(), 1);
    // No shape can hold 16 CPUs: refused at once, naming every shape.
    let err = placement.reserve("f", &res(16.0, 1, 0)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the job asks for cpu=16 memory=1GiB, which no instance shape of this runner can hold: \
         small (cpu=2 memory=4GiB), large (cpu=8 memory=32GiB), gpu (cpu=8 memory=32GiB gpu=1)"
    );
    for k in ["a", "b", "c", "d", "e"] {
        placement.release(k);
    }
    placement.shutdown().await;
    assert!(small.instances.lock().unwrap().is_empty());
    assert!(large.instances.lock().unwrap().is_empty());
    assert!(gpu.instances.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn spot_refused_for_capacity_falls_back_and_returns_after_a_quiet_period() {
    let spot = Arc::new(Memory::default());
    let on_demand = Arc::new(Memory::default());
    *spot.no_capacity.lock().unwrap() = true;
    // Shorter than the acquire timeout (10 s here), as it must be for a waiting job to move.
    let after = Duration::from_secs(3);
    let quiet = Duration::from_secs(20);
    let placement = Placement::new(vec![
        shape("spot", &spot, cfg(1, Some(res(2.0, 4, 0)), 0.3)),
        shape("on-demand", &on_demand, cfg(1, Some(res(2.0, 4, 0)), 1.0)),
    ])
    .with_fallback(
        0,
        Fallback {
            to: 1,
            after,
            return_after: quiet,
        },
    );
    let job = res(1.0, 1, 0);

    // The spot shape is cheaper and not diverted: the job waits there while it is refused,
    // then moves to the fallback once the refusals have lasted `after`.
    let t0 = tokio::time::Instant::now();
    placement.reserve("a", &job).expect("a");
    assert_eq!(placement.shape_of("a").unwrap().name, "spot");
    let a = placement.acquire("a").await.expect("a moves and runs");
    let waited = t0.elapsed();
    assert_eq!(placement.shape_of("a").unwrap().name, "on-demand");
    assert!(a.instance_id.starts_with('i'), "{a:?}");
    assert!(waited >= after, "moved after {waited:?}, before {after:?}");
    assert!(
        *spot.refused.lock().unwrap() >= 2,
        "spot was asked until it diverted"
    );
    assert!(spot.instances.lock().unwrap().is_empty());
    assert!(placement.diverted_since(0).is_some());
    let refused = placement.shapes()[0].scaler.capacity_refusals();
    assert!(refused.count >= 2 && refused.first.is_some(), "{refused:?}");

    // While diverted, a new job goes straight to the fallback.
    placement.reserve("b", &job).expect("b");
    assert_eq!(placement.shape_of("b").unwrap().name, "on-demand");
    let b = placement.acquire("b").await.expect("b");
    assert_ne!(b.instance_id, a.instance_id);
    assert_eq!(on_demand.instances.lock().unwrap().len(), 2);

    // Spot capacity is back; after the quiet period new capacity goes to spot again.
    *spot.no_capacity.lock().unwrap() = false;
    tokio::time::sleep(quiet + Duration::from_secs(1)).await;
    assert!(placement.diverted_since(0).is_none(), "returned to spot");
    assert_eq!(placement.shapes()[0].scaler.capacity_refusals().count, 0);
    placement.reserve("c", &job).expect("c");
    assert_eq!(placement.shape_of("c").unwrap().name, "spot");
    let c = placement.acquire("c").await.expect("c");
    assert_eq!(spot.instances.lock().unwrap().len(), 1, "{c:?}");

    for k in ["a", "b", "c"] {
        placement.release(k);
    }
    placement.shutdown().await;
    assert!(spot.instances.lock().unwrap().is_empty());
    assert!(on_demand.instances.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_fallback_shape_takes_no_new_capacity_while_its_spot_shape_has_it() {
    let spot = Arc::new(Memory::default());
    let on_demand = Arc::new(Memory::default());
    // Same price: without the fallback rule the tie would still pick spot (listed first), so
    // list the fallback first to see the rule at work.
    let placement = Placement::new(vec![
        shape("on-demand", &on_demand, cfg(1, Some(res(2.0, 4, 0)), 1.0)),
        shape("spot", &spot, cfg(1, Some(res(2.0, 4, 0)), 1.0)),
    ])
    .with_fallback(
        1,
        Fallback {
            to: 0,
            after: Duration::from_secs(30),
            return_after: Duration::from_secs(120),
        },
    );
    assert!(placement.is_fallback(0) && !placement.is_fallback(1));
    placement.reserve("a", &res(1.0, 1, 0)).expect("a");
    assert_eq!(placement.shape_of("a").unwrap().name, "spot");
    placement.acquire("a").await.expect("a");
    assert!(on_demand.instances.lock().unwrap().is_empty());
    assert_eq!(*spot.refused.lock().unwrap(), 0);
    placement.release("a");
    placement.shutdown().await;
}
