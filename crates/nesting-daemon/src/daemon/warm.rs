//! Warm slots: a VM started ahead of the job in every free slot, so that a job's `Create`
//! finds its VM ready instead of booting one.
//!
//! Each warm VM is restored from the image's *base snapshot* (`warm-<image>`, taken once from
//! a cold-booted VM whose agent answered), so idle warm VMs of one image map the same memory
//! file copy-on-write and cost little more than one. A VM never runs two jobs: the one handed
//! over is the job's, and when the job's VM is deleted the slot gets its next warm VM. A job
//! that asks for another image stomps the warm VM, as before, and the slot keeps that image
//! warm from then on. A fill that fails (a base snapshot that no longer restores, a rebuilt
//! image) is logged and falls back to a cold boot; it never fails a job.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use slipway_nesting::config::WarmConfig;
use tokio_util::sync::CancellationToken;

use super::Daemon;
use crate::error::DaemonError;
use crate::store::{self, VmRecord};

/// Prefix of the base snapshots warm VMs are restored from.
pub const BASE_PREFIX: &str = "warm-";

/// How often a `Create` looks again while the slot's warm VM is still being started.
const WAIT_STEP: Duration = Duration::from_millis(50);
/// How long a `Create` waits for its slot's warm VM at most: a restore takes a fraction of a
/// second, a first base snapshot seconds; a fill stuck behind others (or on a VM that died
/// under it) must not hold a job, which then starts its own VM.
const FILL_WAIT: Duration = Duration::from_secs(10);

/// Hits and misses of one image's warm slots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WarmCounts {
    /// `Create`s that found their VM ready.
    pub hits: u64,
    /// `Create`s that had to start one (none ready, or another image).
    pub misses: u64,
}

/// The warm slots' state, owned by the [`Daemon`].
#[derive(Debug, Default)]
pub struct WarmPool {
    state: std::sync::Mutex<State>,
    /// One base snapshot made at a time.
    base: tokio::sync::Mutex<()>,
    /// One fill at a time: each sees the warm VMs the earlier ones made (the memory budget),
    /// and two cores are not flooded with boots.
    fills: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default)]
struct State {
    config: Option<WarmConfig>,
    /// MiB all warm VMs may hold.
    budget_mib: u64,
    /// The image each slot keeps warm (what its last job asked for).
    want: HashMap<i32, String>,
    /// Slots with a fill asked for (queued or under way).
    filling: HashSet<i32>,
    /// Slots whose fill is under way (its turn came, it is starting their VM): a `Create`
    /// waits for these, not for fills queued behind others.
    starting: HashSet<i32>,
    counts: BTreeMap<String, WarmCounts>,
    /// Counts configurations: a fill of an earlier one leaves the slot marks of the current
    /// one alone.
    generation: u64,
    /// Fired by `Shutdown`: fills stop, what they started goes.
    stop: CancellationToken,
}

/// The label marking a base snapshot, with its image as value.
const BASE_LABEL: &str = "slipway.warm-base";

/// The base snapshot of `image` (a snapshot name has at most 64 characters: a long image name
/// is shortened with a hash of the whole, so two never share one).
pub fn base_name(image: &str) -> String {
    let name = format!("{BASE_PREFIX}{image}");
    if name.len() <= 64 {
        return name;
    }
    // FNV-1a: stable across builds, unlike the std hasher.
    let hash = image.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let keep: String = image.chars().take(40).collect();
    format!("{BASE_PREFIX}{keep}-{hash:016x}")
}

/// Whether snapshot `name` is a warm slots' base snapshot (a name jobs cannot take).
pub fn is_base(name: &str) -> bool {
    name.starts_with(BASE_PREFIX)
}

impl WarmPool {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Take `config` (from `Init`); `available_mib` is the instance's available memory.
    pub fn configure(&self, config: Option<WarmConfig>, available_mib: u64) {
        let mut s = self.state();
        s.budget_mib = match &config {
            Some(c) if c.memory_budget_mib > 0 => c.memory_budget_mib,
            _ => available_mib / 2,
        };
        s.config = config;
        // What slots' last jobs asked for belongs to the earlier configuration: a new one
        // starts from its own images.
        s.want.clear();
        s.starting.clear();
        s.generation += 1;
        s.stop = CancellationToken::new();
        // Fills of an earlier configuration see their stop token fired and remove what they
        // start: they no longer hold their slots.
        s.filling.clear();
    }

    /// Forget the configuration and stop every fill (`Shutdown`).
    pub fn stop(&self) {
        let mut s = self.state();
        s.config = None;
        s.stop.cancel();
    }

    /// Whether warm slots are on and `slot` is one of them.
    pub fn covers(&self, slot: Option<i32>) -> bool {
        let s = self.state();
        match (&s.config, slot) {
            (Some(c), Some(slot)) => slot >= 0 && (slot as u64) < u64::from(c.slots),
            _ => false,
        }
    }

    /// The warm slots.
    pub fn slots(&self) -> Vec<i32> {
        let s = self.state();
        let n = s.config.as_ref().map_or(0, |c| c.slots);
        (0..n).filter_map(|i| i32::try_from(i).ok()).collect()
    }

    /// Hits and misses per image so far.
    pub fn counts(&self) -> BTreeMap<String, WarmCounts> {
        self.state().counts.clone()
    }

    fn count(&self, image: &str, hit: bool) {
        let mut s = self.state();
        let c = s.counts.entry(image.to_string()).or_default();
        if hit {
            c.hits += 1;
        } else {
            c.misses += 1;
        }
    }

    /// A job asked for `image` in `slot`: the slot keeps it warm from now on.
    fn asked(&self, slot: i32, image: &str) {
        self.state().want.insert(slot, image.to_string());
    }

    fn image_for(&self, slot: i32) -> Option<String> {
        let s = self.state();
        s.want
            .get(&slot)
            .cloned()
            .or_else(|| s.config.as_ref().and_then(|c| c.images.first().cloned()))
    }

    /// Mark `slot`'s fill asked for: its configuration's stop token, generation and budget.
    fn begin(&self, slot: i32) -> Option<(CancellationToken, u64, u64)> {
        let mut s = self.state();
        s.config.as_ref()?;
        s.filling
            .insert(slot)
            .then(|| (s.stop.clone(), s.generation, s.budget_mib))
    }

    /// Mark `slot`'s fill of configuration `generation` under way, unless it was stopped.
    fn under_way(&self, slot: i32, generation: u64, stop: &CancellationToken) -> bool {
        let mut s = self.state();
        if stop.is_cancelled() || s.generation != generation {
            return false;
        }
        s.starting.insert(slot);
        true
    }

    fn end(&self, slot: i32, generation: u64) {
        let mut s = self.state();
        if s.generation == generation {
            s.filling.remove(&slot);
            s.starting.remove(&slot);
        }
    }

    fn starting(&self, slot: i32) -> bool {
        self.state().starting.contains(&slot)
    }
}

impl Daemon {
    /// Start the next warm VM of every free warm slot (`Init` does).
    pub(crate) fn fill_all(self: &Arc<Self>) {
        for slot in self.warm().slots() {
            self.fill(slot);
        }
    }

    /// Start the next warm VM of `slot` in the background, when it is a warm slot.
    pub fn fill(self: &Arc<Self>, slot: i32) {
        if !self.warm().covers(Some(slot)) {
            return;
        }
        let Some(image) = self.warm().image_for(slot) else {
            return;
        };
        // Marked before the task runs: the slot's fill is asked for once, however many
        // `Delete`s call this meanwhile.
        let Some((stop, generation, budget_mib)) = self.warm().begin(slot) else {
            return;
        };
        let daemon = Arc::clone(self);
        // Owned by the pool's stop token: a fill checks it before and after its start, and
        // never drops a start half-way (that would leave a VM without its record).
        tokio::spawn(async move {
            let _filling = Filling(&daemon, slot, generation);
            if let Err(e) = daemon
                .fill_now(slot, &image, &stop, generation, budget_mib)
                .await
            {
                tracing::warn!(slot, "starting the slot's warm VM: {e}");
            }
        });
    }

    async fn fill_now(
        self: &Arc<Self>,
        slot: i32,
        image: &str,
        stop: &CancellationToken,
        generation: u64,
        budget_mib: u64,
    ) -> Result<(), DaemonError> {
        let _one = self.warm().fills.lock().await;
        if stop.is_cancelled() {
            return Ok(());
        }
        let (recs, _) = store::load_all(&self.state_dir());
        if recs.iter().any(|r| r.slot == Some(slot)) {
            return Ok(());
        }
        let warm_mib: u64 = recs
            .iter()
            .filter(|r| r.warm)
            .map(|r| u64::from(r.spec.memory_mib))
            .sum();
        let needs = u64::from(self.image_memory_mib(image).await?);
        if warm_mib + needs > budget_mib {
            tracing::info!(slot, %image, warm_mib, budget_mib,
                "not keeping the slot warm: the warm VMs' memory budget is spent");
            return Ok(());
        }
        // From here a `Create` of the slot waits for this VM rather than starting its own.
        if !self.warm().under_way(slot, generation, stop) {
            return Ok(());
        }
        // Started without a slot, then given it only if the slot is still free: a fill never
        // stomps a job's VM nor holds a slot a job's `Create` wants.
        let rec = match self.start_from_base(image, None).await {
            Ok(Some((rec, _))) => rec,
            Ok(None) => self.create_cold(image, None).await?.0,
            Err(e) => {
                tracing::warn!(slot, %image, "restoring the base snapshot failed, booting instead: {e}");
                self.create_cold(image, None).await?.0
            }
        };
        let id = rec.id.clone();
        if stop.is_cancelled() {
            // Shut down while it started: it goes too.
            let _ = self.delete(&id).await;
        } else if self.adopt_warm(rec, slot).await? {
            tracing::info!(vm = %id, slot, %image, "warm VM ready");
        } else {
            tracing::debug!(vm = %id, slot, "the slot was taken while its warm VM started");
        }
        Ok(())
    }

    /// A VM of `image` in `slot` restored from the image's base snapshot, made first when
    /// missing, with the VM it stomped; `None` where the image's name cannot name a snapshot.
    pub(crate) async fn start_from_base(
        self: &Arc<Self>,
        image: &str,
        slot: Option<i32>,
    ) -> Result<Option<(VmRecord, Option<String>)>, DaemonError> {
        let name = base_name(image);
        if slipway_nesting::check_name("snapshot name", &name).is_err() {
            return Ok(None);
        }
        if let Ok(meta) = crate::snapshot::load(&self.state_dir(), &name)
            && (meta.image != image
                || meta.labels.get(BASE_LABEL).map(String::as_str) != Some(image))
        {
            // Not this image's base (made by hand, or by another image): left alone.
            tracing::warn!(snapshot = %name, %image, "not a base snapshot of the image: booting instead");
            return Ok(None);
        }
        if crate::snapshot::load(&self.state_dir(), &name).is_err() {
            let _one = self.warm().base.lock().await;
            if crate::snapshot::load(&self.state_dir(), &name).is_err() {
                let (vm, _) = self.create_cold(image, None).await?;
                let labels = [(BASE_LABEL.to_string(), image.to_string())].into();
                if let Err(e) = self.snapshot(&vm.id, &name, labels).await {
                    let _ = self.delete(&vm.id).await;
                    return Err(e);
                }
                tracing::info!(%image, snapshot = %name, "base snapshot for warm VMs taken");
            }
        }
        match self.restore(&name, slot).await {
            Ok(started) => Ok(Some(started)),
            Err(e) => {
                // A rebuilt image or another hypervisor: the next fill makes a new base.
                if !matches!(e, DaemonError::Conflict(_)) {
                    let _ = self.delete_snapshot(&name).await;
                }
                Err(e)
            }
        }
    }

    /// `Create` of `image` in a warm `slot`: its ready warm VM when it has one of `image`
    /// (waiting for one being started), else `None` (the caller starts one; the warm VM of
    /// another image is stomped on the way).
    pub(crate) async fn take_warm(
        &self,
        image: &str,
        slot: i32,
        limit: Duration,
    ) -> Result<Option<VmRecord>, DaemonError> {
        self.warm().asked(slot, image);
        // Only a fill under way is waited for: one queued behind others (or behind a start
        // that hangs) would hold the job longer than starting its own VM.
        let deadline = tokio::time::Instant::now() + limit.min(FILL_WAIT);
        while self.warm().starting(slot) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(WAIT_STEP).await;
        }
        let (recs, _) = store::load_all(&self.state_dir());
        let ready = recs.into_iter().find(|r| {
            r.slot == Some(slot)
                && r.warm
                && r.image == image
                && r.process
                    .as_ref()
                    .is_some_and(crate::hypervisor::is_running)
        });
        let Some(mut rec) = ready else {
            self.warm().count(image, false);
            return Ok(None);
        };
        let Some(_held) = self.hold_vm(&rec.id) else {
            self.warm().count(image, false);
            return Ok(None);
        };
        rec.warm = false;
        store::save(&self.state_dir(), &rec)?;
        self.warm().count(image, true);
        Ok(Some(rec))
    }
}

/// Ends a fill of a slot when dropped.
struct Filling<'a>(&'a Daemon, i32, u64);

impl Drop for Filling<'_> {
    fn drop(&mut self) {
        self.0.warm().end(self.1, self.2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(images: &[&str]) -> Option<WarmConfig> {
        Some(WarmConfig {
            slots: 2,
            images: images.iter().map(|i| i.to_string()).collect(),
            ..WarmConfig::default()
        })
    }

    #[test]
    fn a_slot_keeps_what_its_last_job_asked_for_until_a_new_configuration() {
        let pool = WarmPool::default();
        pool.configure(config(&["a"]), 1024);
        assert_eq!(pool.image_for(0).as_deref(), Some("a"));
        pool.asked(0, "b");
        assert_eq!(pool.image_for(0).as_deref(), Some("b"));
        assert_eq!(pool.image_for(1).as_deref(), Some("a"));
        pool.configure(config(&["c"]), 1024);
        assert_eq!(pool.image_for(0).as_deref(), Some("c"));
        assert_eq!(pool.slots(), vec![0, 1]);
    }

    #[test]
    fn a_fill_of_an_earlier_configuration_leaves_the_current_marks_alone() {
        let pool = WarmPool::default();
        pool.configure(config(&["a"]), 1024);
        let (old_stop, old_generation, _) = pool.begin(0).unwrap();
        pool.stop();
        pool.configure(config(&["a"]), 1024);
        let (stop, generation, _) = pool.begin(0).unwrap();
        assert!(pool.under_way(0, generation, &stop));
        // The old fill neither starts nor ends the new one's slot.
        assert!(!pool.under_way(0, old_generation, &old_stop));
        pool.end(0, old_generation);
        assert!(pool.starting(0));
        pool.end(0, generation);
        assert!(!pool.starting(0));
    }
}
