//! `cargo bench -p slipway-sim --bench scale`: one taskscaler over 10,000 instances × 10 slots
//! on a simulated plugin. Writes `bench/results/scale.json`.
//!
//! - `reserve_acquire_release_us_*`: wall-clock time of one reserve + acquire + release on the
//!   warm fleet, on a 2-worker runtime where the scaling loop runs beside it (its passes take
//!   the same lock) — what a runner sees. The
//!   `_uncontended` keys measure the same cycle on a current-thread runtime where the loop only
//!   runs between batches of 100 cycles: the cost of the calls themselves.
//! - `bytes_per_slot`: live heap (a counting global allocator) after the taskscaler adopted the
//!   fleet, minus before it started, minus what the simulated plugin itself holds, per slot.
//! - `scale_pass_ms`: one full scaling pass, timed inside the plugin from the return of the
//!   pass's `Update` to its `Increase` (the fleet is kept one instance short of the idle target
//!   and the plugin accepts no more, so every pass ends with an `Increase`): reconcile the
//!   10,000-instance list, prefetch connect info, build the views, decide, throttle.

// A global allocator is an `unsafe impl`; it only forwards to `System` and counts.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::json;
use slipway_fleeting::{
    ConnectInfo, ConnectorConfig, GroupError, InstanceGroup, ProviderInfo, State,
};
use slipway_taskscaler::{Config, Policy, ScaleThrottle, Taskscaler};

struct Counting;
static LIVE: AtomicI64 = AtomicI64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const INSTANCES: usize = 10_000;
const SLOTS: u32 = 10;

/// Instances that are running the moment they are asked for; at most `INSTANCES`.
#[derive(Default)]
struct Fleet {
    list: Mutex<Vec<(String, State)>>,
    /// Heap the plugin's own list holds.
    own_bytes: AtomicI64,
    /// (update returned, increase called) per pass.
    passes: Mutex<Vec<(Option<Instant>, Option<Instant>)>>,
}

#[async_trait]
impl InstanceGroup for Fleet {
    async fn init(&self, _: &[u8], _: &ConnectorConfig) -> Result<ProviderInfo, GroupError> {
        Ok(ProviderInfo::default())
    }
    async fn update(&self) -> Result<Vec<(String, State)>, GroupError> {
        let list = self.list.lock().unwrap_or_else(|p| p.into_inner()).clone();
        self.passes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((Some(Instant::now()), None));
        Ok(list)
    }
    async fn increase(&self, delta: u32) -> Result<u32, GroupError> {
        let called = Instant::now();
        if let Some(last) = self
            .passes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last_mut()
        {
            last.1 = Some(called);
        }
        let before = LIVE.load(Ordering::SeqCst);
        let mut list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        let n = (delta as usize).min(INSTANCES - list.len());
        list.reserve_exact(n);
        for _ in 0..n {
            let id = format!("i-{:08}", list.len());
            list.push((id, State::Running));
        }
        drop(list);
        self.own_bytes
            .fetch_add(LIVE.load(Ordering::SeqCst) - before, Ordering::SeqCst);
        Ok(n as u32)
    }
    async fn decrease(&self, ids: &[String]) -> Result<Vec<String>, GroupError> {
        Ok(ids.to_vec())
    }
    async fn connect_info(&self, id: &str) -> Result<ConnectInfo, GroupError> {
        Ok(ConnectInfo {
            id: id.into(),
            internal_addr: "10.0.0.1:22".into(),
            ..ConnectInfo::default()
        })
    }
    async fn heartbeat(&self, _: &str) -> Result<(), GroupError> {
        Ok(())
    }
    async fn shutdown(&self) -> Result<(), GroupError> {
        Ok(())
    }
}

fn config() -> Config {
    Config {
        capacity_per_instance: SLOTS,
        policies: vec![Policy {
            // One instance more than the plugin will give: every pass ends with an Increase.
            idle_count: INSTANCES as u32 * SLOTS + SLOTS,
            idle_time: Duration::from_secs(3600),
            ..Policy::default()
        }],
        scale_throttle: ScaleThrottle {
            limit: None,
            burst: 0,
        },
        update_interval: Duration::from_millis(20),
        update_interval_when_expecting: Duration::from_millis(20),
        ..Config::default()
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn round(x: f64, digits: i32) -> f64 {
    let p = 10f64.powi(digits);
    (x * p).round() / p
}

struct Measured {
    cycle_us: Vec<f64>,
    bytes_per_slot: f64,
    pass_ms: Vec<f64>,
    setup_s: f64,
}

async fn scenario(contended: bool, cycles: usize) -> Result<Measured, Box<dyn std::error::Error>> {
    let t0 = Instant::now();
    let fleet = Arc::new(Fleet::default());
    let keys: Vec<String> = (0..cycles).map(|i| format!("runner-{i:08}")).collect();
    let live0 = LIVE.load(Ordering::SeqCst);
    let ts = Taskscaler::start(fleet.clone(), ProviderInfo::default(), config())?;
    // Wait for the fleet to be adopted and a few full passes over it.
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let adopted = ts.stats().running == INSTANCES;
        let full_passes = fleet
            .passes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .rev()
            .take(5)
            .filter(|p| p.1.is_some())
            .count();
        if adopted && full_passes == 5 {
            break;
        }
        if t0.elapsed() > Duration::from_secs(300) {
            return Err("the simulated fleet never came up".into());
        }
    }
    let setup_s = t0.elapsed().as_secs_f64();
    // Smallest of several samples: a pass's temporary buffers are not per-slot state.
    let mut live1 = i64::MAX;
    for _ in 0..20 {
        live1 = live1.min(LIVE.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_millis(7)).await;
    }
    let held = live1 - live0 - fleet.own_bytes.load(Ordering::SeqCst);
    let bytes_per_slot = held as f64 / (INSTANCES as f64 * f64::from(SLOTS));

    let mut cycle_us = Vec::with_capacity(cycles);
    for (i, key) in keys.iter().enumerate() {
        let start = Instant::now();
        ts.reserve(key)?;
        let acq = ts.acquire(key).await?;
        ts.release(key);
        cycle_us.push(start.elapsed().as_secs_f64() * 1e6);
        drop(acq);
        if !contended && i % 100 == 99 {
            // Let the scaling loop run between batches, outside the measured cycles.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let pass_ms = fleet
        .passes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(|p| match p {
            (Some(u), Some(i)) => Some(i.saturating_duration_since(*u).as_secs_f64() * 1e3),
            _ => None,
        })
        .skip(3)
        .collect();
    ts.shutdown().await;
    Ok(Measured {
        cycle_us,
        bytes_per_slot,
        pass_ms,
        setup_s,
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let cycles = 20_000;
    let contended = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(scenario(true, cycles))?;
    let quiet = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(scenario(false, cycles))?;
    let sorted = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v
    };
    let c = sorted(&contended.cycle_us);
    let q = sorted(&quiet.cycle_us);
    let p = sorted(&contended.pass_ms);
    let pq = sorted(&quiet.pass_ms);
    let results = json!({
        "instances": INSTANCES,
        "slots_per_instance": SLOTS,
        "cycles": cycles,
        "reserve_acquire_release_us_p50": round(pct(&c, 50.0), 1),
        "reserve_acquire_release_us_p99": round(pct(&c, 99.0), 1),
        "reserve_acquire_release_us_max": round(pct(&c, 100.0), 1),
        "reserve_acquire_release_us_p50_uncontended": round(pct(&q, 50.0), 1),
        "reserve_acquire_release_us_p99_uncontended": round(pct(&q, 99.0), 1),
        "bytes_per_slot": round(contended.bytes_per_slot.min(quiet.bytes_per_slot), 1),
        "scale_pass_ms": round(pct(&p, 50.0), 2),
        "scale_pass_ms_p99": round(pct(&p, 99.0), 2),
        "scale_pass_ms_uncontended": round(pct(&pq, 50.0), 2),
        "scale_passes_timed": p.len(),
        "fleet_setup_s": round(contended.setup_s, 2),
        "wall_s": round(started.elapsed().as_secs_f64(), 1),
        "goals": {"reserve_acquire_release_us_p99": 100, "bytes_per_slot": 1024, "scale_pass_ms": 50},
    });
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let (_, text) = slipway_testkit::bench::write(
        &repo,
        "scale",
        "cargo bench -p slipway-sim --bench scale",
        results,
    )?;
    println!("{text}");
    Ok(())
}
