//! A simulated fleeting plugin: an [`InstanceGroup`] whose instances live on tokio's clock.
//!
//! Instances take a drawn provisioning delay to become `running` (or `timeout`, for a boot
//! failure), a drawn deletion delay to disappear, and every call may fail like a throttled cloud
//! API. Billing runs from the moment an `Increase` is accepted to the moment deletion completes.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use slipway_fleeting::{
    ConnectInfo, ConnectorConfig, GroupError, InstanceGroup, ProviderInfo, State,
};
use tokio::time::Instant;

use crate::rng::{Dist, Rng};

/// How the simulated cloud behaves and what it charges.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetSpec {
    /// Time from an accepted `Increase` to `running`.
    pub provisioning: Dist,
    /// Probability an instance never boots (the plugin reports it as `timeout`).
    pub boot_failure: f64,
    /// Time from an accepted `Decrease` to gone.
    pub deletion: Dist,
    /// Probability that any one `Update`/`Increase`/`Decrease` call fails (API errors, throttling).
    pub error_rate: f64,
    /// How long each `Update`/`Increase`/`Decrease` call takes (cloud API latency).
    pub api_latency: Dist,
    /// Most instances one `Increase` call creates (a rate-limited cloud API); `None` = all.
    pub max_increase_per_call: Option<u32>,
    /// Largest group size (`ProviderInfo::max_size`); 0 = unlimited.
    pub max_size: u64,
    /// Price of one instance-second under per-second billing.
    pub price_per_second: f64,
    /// Price of one started instance-hour under per-hour billing.
    pub price_per_hour: f64,
}

impl Default for FleetSpec {
    /// A typical cloud VM group: ~60 s boot (30–180 s), 1 % boot failures, 20 s deletion,
    /// 1 % API errors, 200 ms per API call; priced like a 4-vCPU on-demand VM ($0.17/h).
    fn default() -> Self {
        FleetSpec {
            provisioning: Dist::LogNormal {
                median: 60.0,
                sigma: 0.3,
                min: 30.0,
                max: 180.0,
            },
            boot_failure: 0.01,
            deletion: Dist::Uniform {
                min: 10.0,
                max: 30.0,
            },
            error_rate: 0.01,
            api_latency: Dist::Fixed(0.2),
            max_increase_per_call: None,
            max_size: 0,
            price_per_second: 0.17 / 3600.0,
            price_per_hour: 0.17,
        }
    }
}

/// What the fleet cost.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Bill {
    /// Instance-seconds from accepted `Increase` to completed deletion (or the end of the run).
    pub instance_seconds: f64,
    /// `instance_seconds × price_per_second`.
    pub per_second_cost: f64,
    /// Every instance's life rounded up to started hours × `price_per_hour`.
    pub per_hour_cost: f64,
    /// Instances created.
    pub instances: u64,
    /// Instances that never booted.
    pub boot_failures: u64,
    /// Plugin calls that failed.
    pub plugin_errors: u64,
    /// Most instances alive at once.
    pub peak_instances: usize,
    /// `Update` calls made.
    pub update_calls: u64,
    /// `Increase` calls made.
    pub increase_calls: u64,
    /// `Decrease` calls made.
    pub decrease_calls: u64,
}

#[derive(Debug)]
struct SimInstance {
    index: u64,
    requested: Instant,
    ready: Instant,
    boots: bool,
    delete_requested: Option<Instant>,
    deleted: Option<Instant>,
}

impl SimInstance {
    fn state(&self, now: Instant) -> State {
        match (self.delete_requested, self.deleted) {
            (_, Some(d)) if d <= now => State::Deleted,
            (Some(_), _) => State::Deleting,
            _ if now < self.ready => State::Creating,
            _ if self.boots => State::Running,
            _ => State::Timeout,
        }
    }
}

#[derive(Debug)]
struct FleetState {
    instances: BTreeMap<String, SimInstance>,
    next: u64,
    errors: Rng,
    latency: Rng,
    /// Calls made, by kind: update, increase, decrease.
    calls: [u64; 3],
    /// Lives of deleted instances, in seconds.
    lives: Vec<f64>,
    created: u64,
    boot_failures: u64,
    plugin_errors: u64,
    peak: usize,
}

/// The simulated instance group.
#[derive(Debug)]
pub struct SimFleet {
    spec: FleetSpec,
    seed: u64,
    state: Mutex<FleetState>,
}

impl SimFleet {
    /// A fleet with no instances; `seed` fixes every delay and failure.
    pub fn new(spec: FleetSpec, seed: u64) -> Self {
        SimFleet {
            spec,
            seed,
            state: Mutex::new(FleetState {
                instances: BTreeMap::new(),
                next: 0,
                errors: Rng::stream(seed, u64::MAX),
                latency: Rng::stream(seed, u64::MAX - 1),
                calls: [0; 3],
                lives: Vec::new(),
                created: 0,
                boot_failures: 0,
                plugin_errors: 0,
                peak: 0,
            }),
        }
    }

    /// What the group's `Init` returns.
    pub fn provider_info(&self) -> ProviderInfo {
        ProviderInfo {
            id: "sim/default".into(),
            max_size: self.spec.max_size,
            version: env!("CARGO_PKG_VERSION").into(),
            ..ProviderInfo::default()
        }
    }

    fn lock(&self) -> MutexGuard<'_, FleetState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait out one API call's latency (on tokio's clock) and count the call.
    async fn api_call(&self, kind: usize) {
        let secs = {
            let mut st = self.lock();
            st.calls[kind] += 1;
            self.spec.api_latency.sample(&mut st.latency)
        };
        if secs > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        }
    }

    fn fail(&self, st: &mut FleetState, call: &str) -> Result<(), GroupError> {
        if st.errors.chance(self.spec.error_rate) {
            st.plugin_errors += 1;
            return Err(GroupError::Provider(format!(
                "simulated cloud API error in {call} (throttled)"
            )));
        }
        Ok(())
    }

    /// Drop instances whose deletion has completed, recording their lives.
    fn settle(st: &mut FleetState, now: Instant) {
        let done: Vec<String> = st
            .instances
            .iter()
            .filter(|(_, i)| i.deleted.is_some_and(|d| d <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for id in done {
            if let Some(i) = st.instances.remove(&id) {
                let end = i.deleted.unwrap_or(now);
                st.lives
                    .push(end.saturating_duration_since(i.requested).as_secs_f64());
            }
        }
    }

    /// Instances alive now (any state but deleted).
    pub fn alive(&self) -> usize {
        let now = Instant::now();
        self.lock()
            .instances
            .values()
            .filter(|i| i.state(now) != State::Deleted)
            .count()
    }

    /// The bill as of `end`: instances still alive are charged up to `end`.
    pub fn bill(&self, end: Instant) -> Bill {
        let st = self.lock();
        let mut lives = st.lives.clone();
        for i in st.instances.values() {
            let stop = i.deleted.map_or(end, |d| d.min(end));
            lives.push(stop.saturating_duration_since(i.requested).as_secs_f64());
        }
        let instance_seconds: f64 = lives.iter().sum();
        let hours: f64 = lives.iter().map(|l| (l / 3600.0).ceil().max(1.0)).sum();
        Bill {
            instance_seconds,
            per_second_cost: instance_seconds * self.spec.price_per_second,
            per_hour_cost: hours * self.spec.price_per_hour,
            instances: st.created,
            boot_failures: st.boot_failures,
            plugin_errors: st.plugin_errors,
            peak_instances: st.peak,
            update_calls: st.calls[0],
            increase_calls: st.calls[1],
            decrease_calls: st.calls[2],
        }
    }
}

#[async_trait]
impl InstanceGroup for SimFleet {
    async fn init(&self, _: &[u8], _: &ConnectorConfig) -> Result<ProviderInfo, GroupError> {
        Ok(self.provider_info())
    }

    async fn update(&self) -> Result<Vec<(String, State)>, GroupError> {
        self.api_call(0).await;
        let now = Instant::now();
        let mut st = self.lock();
        self.fail(&mut st, "update")?;
        Self::settle(&mut st, now);
        Ok(st
            .instances
            .iter()
            .map(|(id, i)| (id.clone(), i.state(now)))
            .collect())
    }

    async fn increase(&self, delta: u32) -> Result<u32, GroupError> {
        self.api_call(1).await;
        let now = Instant::now();
        let mut st = self.lock();
        self.fail(&mut st, "increase")?;
        Self::settle(&mut st, now);
        let mut n = delta.min(self.spec.max_increase_per_call.unwrap_or(u32::MAX));
        if self.spec.max_size > 0 {
            let room = self.spec.max_size.saturating_sub(st.instances.len() as u64);
            n = n.min(u32::try_from(room).unwrap_or(u32::MAX));
        }
        for _ in 0..n {
            st.next += 1;
            // One random stream per instance: its delays do not depend on API-error draws.
            let mut r = Rng::stream(self.seed, st.next);
            let boot = self.spec.provisioning.sample(&mut r);
            let boots = !r.chance(self.spec.boot_failure);
            if !boots {
                st.boot_failures += 1;
            }
            let index = st.next;
            st.instances.insert(
                format!("sim-{index:08}"),
                SimInstance {
                    index,
                    requested: now,
                    ready: now + Duration::from_secs_f64(boot),
                    boots,
                    delete_requested: None,
                    deleted: None,
                },
            );
        }
        st.created += u64::from(n);
        st.peak = st.peak.max(st.instances.len());
        Ok(n)
    }

    async fn decrease(&self, ids: &[String]) -> Result<Vec<String>, GroupError> {
        self.api_call(2).await;
        let now = Instant::now();
        let mut st = self.lock();
        self.fail(&mut st, "decrease")?;
        let mut accepted = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(i) = st.instances.get_mut(id)
                && i.delete_requested.is_none()
            {
                let mut r = Rng::stream(self.seed ^ 0xDE1E_7E00, i.index);
                i.delete_requested = Some(now);
                i.deleted = Some(now + Duration::from_secs_f64(self.spec.deletion.sample(&mut r)));
                accepted.push(id.clone());
            }
        }
        Ok(accepted)
    }

    async fn connect_info(&self, id: &str) -> Result<ConnectInfo, GroupError> {
        Ok(ConnectInfo {
            id: id.into(),
            internal_addr: format!("{id}.sim:22"),
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
