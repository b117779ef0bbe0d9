//! A runner's jobs as the status page shows them: waiting, running (by reservation key, so a
//! slot's holder can be named) and recently ended.
//!
//! Job sources tell the board as a job moves; the board also keeps the job metrics, so the
//! page and `/metrics` always agree.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

use slipway_job::{FailureReason, JobOutcome, JobStatus};

use crate::metrics::JobMetrics;
use crate::model::{PendingJob, RecentJob, SlotJob};

/// Ended jobs kept per runner.
pub const RECENT: usize = 50;

/// What the board shows of a job.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobInfo {
    /// Job id.
    pub id: u64,
    /// Job name.
    pub name: String,
    /// Stage.
    pub stage: String,
    /// Isolation level.
    pub level: String,
}

/// How a job ended, as the board records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    /// `success`, `failed` or `canceled`.
    pub outcome: JobStatus,
    /// Why it failed (never with `success` or `canceled`).
    pub failure_reason: Option<FailureReason>,
    /// What went wrong.
    pub message: Option<String>,
    /// The script's exit code.
    pub exit_code: Option<i32>,
}

impl Ending {
    /// How `outcome` ends: a `job_canceled` failure is `canceled`, without a reason.
    pub fn of(outcome: &JobOutcome) -> Ending {
        match outcome {
            JobOutcome::Success => Ending::status(JobStatus::Success),
            JobOutcome::Failed {
                reason,
                exit_code,
                message,
            } => Ending {
                message: (!message.is_empty()).then(|| message.clone()),
                exit_code: *exit_code,
                ..Ending::failed(*reason)
            },
        }
    }

    /// An ending with `status` and nothing else to say.
    pub fn status(status: JobStatus) -> Ending {
        Ending {
            outcome: status,
            failure_reason: None,
            message: None,
            exit_code: None,
        }
    }

    /// A failure for `reason` (`job_canceled`: canceled).
    pub fn failed(reason: FailureReason) -> Ending {
        match reason {
            FailureReason::JobCanceled => Ending::status(JobStatus::Canceled),
            r => Ending {
                failure_reason: Some(r),
                ..Ending::status(JobStatus::Failed)
            },
        }
    }

    /// The same ending, told as a source reported it: with `reason` (a failure, or canceled).
    pub fn reported_as(self, reason: FailureReason) -> Ending {
        Ending {
            message: self.message,
            exit_code: self.exit_code,
            ..Ending::failed(reason)
        }
    }

    /// The same ending with `message`.
    pub fn with_message(self, message: impl Into<String>) -> Ending {
        Ending {
            message: Some(message.into()),
            ..self
        }
    }
}

#[derive(Debug)]
struct Tracked {
    info: JobInfo,
    /// Values masked in its output: masked in messages too.
    secrets: Vec<String>,
    since: Instant,
    /// Instance, slot and when it got them.
    at: Option<(String, u32, Instant)>,
    wait_s: f64,
    /// What it cost and in which currency, once its charge ended.
    cost: Option<(f64, String)>,
}

#[derive(Debug, Default)]
struct State {
    jobs: HashMap<String, Tracked>,
    recent: VecDeque<RecentJob>,
    /// Waits of jobs that got a slot since the last [`JobBoard::take_waits`].
    waits: Vec<f64>,
    /// VM starts by image: (warm, cold).
    vm_starts: std::collections::BTreeMap<String, (u64, u64)>,
}

/// One runner's jobs.
#[derive(Debug)]
pub struct JobBoard {
    runner: String,
    metrics: JobMetrics,
    state: Mutex<State>,
}

impl JobBoard {
    /// An empty board for `runner`, writing `metrics`.
    pub fn new(runner: &str, metrics: JobMetrics) -> JobBoard {
        JobBoard {
            runner: runner.to_string(),
            metrics,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Job `key` waits for capacity or a slot; `secrets` are masked in its messages.
    pub fn waiting(&self, key: &str, info: JobInfo, secrets: Vec<String>) {
        let old = self.lock().jobs.insert(
            key.to_string(),
            Tracked {
                info,
                secrets,
                since: Instant::now(),
                at: None,
                wait_s: 0.0,
                cost: None,
            },
        );
        // A key seen again (a requeued job) is not counted twice.
        match old {
            Some(t) if t.at.is_some() => self.metrics.dropped(&self.runner, true),
            Some(_) => return,
            None => {}
        }
        self.metrics.waiting(&self.runner);
    }

    /// A `microvm` or `vm` job got its VM of `image`: `warm` when its slot had it ready.
    pub fn vm_started(&self, image: &str, warm: bool) {
        {
            let mut st = self.lock();
            let e = st.vm_starts.entry(image.to_string()).or_default();
            if warm {
                e.0 += 1;
            } else {
                e.1 += 1;
            }
        }
        self.metrics.vm_started(&self.runner, image, warm);
    }

    /// VM starts per image so far.
    pub fn vm_starts(&self) -> Vec<crate::model::VmStarts> {
        self.lock()
            .vm_starts
            .iter()
            .map(|(image, &(warm, cold))| crate::model::VmStarts {
                image: image.clone(),
                warm,
                cold,
            })
            .collect()
    }

    /// Job `key` got `slot` on `instance` (again, when its first instance failed under it).
    pub fn running(&self, key: &str, instance: &str, slot: u32) {
        let mut st = self.lock();
        let Some(t) = st.jobs.get_mut(key) else {
            return;
        };
        if let Some((at_instance, at_slot, _)) = &mut t.at {
            // Tried again on another instance (its first failed before its script): the job
            // is where it runs now; its wait and its start are counted once.
            *at_instance = instance.to_string();
            *at_slot = slot;
            return;
        }
        let now = Instant::now();
        t.wait_s = now.saturating_duration_since(t.since).as_secs_f64();
        t.at = Some((instance.to_string(), slot, now));
        let wait = t.wait_s;
        st.waits.push(wait);
        drop(st);
        self.metrics.started(&self.runner);
    }

    /// Job `key` was charged `amount` in `currency` (a try's charge ended): added to its cost.
    pub fn cost(&self, key: &str, amount: f64, currency: &str) {
        if let Some(t) = self.lock().jobs.get_mut(key) {
            match &mut t.cost {
                Some((sum, _)) => *sum += amount,
                None => t.cost = Some((amount, currency.to_string())),
            }
        }
    }

    /// Job `key` ended (whether or not it ever ran); unknown keys are ignored.
    pub fn finished(&self, key: &str, ending: Ending) {
        let mut st = self.lock();
        let Some(t) = st.jobs.remove(key) else {
            return;
        };
        let now = Instant::now();
        let (instance, slot, duration_s, wait_s) = match &t.at {
            Some((i, s, at)) => (
                Some(i.clone()),
                Some(*s),
                now.saturating_duration_since(*at).as_secs_f64(),
                t.wait_s,
            ),
            None => (
                None,
                None,
                0.0,
                now.saturating_duration_since(t.since).as_secs_f64(),
            ),
        };
        let message = ending.message.map(|m| mask(&m, &t.secrets));
        let recent = RecentJob {
            id: t.info.id,
            name: t.info.name,
            stage: t.info.stage,
            outcome: ending.outcome.as_str().to_string(),
            failure_reason: ending.failure_reason.map(|r| r.as_str().to_string()),
            message,
            exit_code: ending.exit_code,
            instance,
            slot,
            level: t.info.level,
            wait_s,
            duration_s,
            ended_at_ms: unix_ms(SystemTime::now()),
            cost: t.cost.as_ref().map(|c| c.0),
            currency: t.cost.map(|c| c.1),
        };
        let reason = recent.failure_reason.clone();
        let outcome = recent.outcome.clone();
        st.recent.push_front(recent);
        st.recent.truncate(RECENT);
        drop(st);
        self.metrics.finished(
            &self.runner,
            &outcome,
            reason.as_deref(),
            t.at.is_some(),
            now.saturating_duration_since(t.since).as_secs_f64(),
        );
    }

    /// Drop job `key` without recording an end: it went back to its source (requeued, or
    /// claimed by someone else).
    pub fn forget(&self, key: &str) {
        let Some(t) = self.lock().jobs.remove(key) else {
            return;
        };
        self.metrics.dropped(&self.runner, t.at.is_some());
    }

    /// A guard that, when dropped, ends job `key` as a runner system failure if it is still on
    /// the board: the job's task ended without saying how its job did (it panicked).
    pub fn guard(&self, key: &str) -> BoardGuard<'_> {
        BoardGuard {
            board: self,
            key: key.to_string(),
        }
    }

    /// Keys of the jobs it holds, waiting or running.
    pub fn keys(&self) -> Vec<String> {
        self.lock().jobs.keys().cloned().collect()
    }

    /// How many jobs wait for their slot.
    pub fn pending_count(&self) -> usize {
        self.lock().jobs.values().filter(|t| t.at.is_none()).count()
    }

    /// Jobs waiting, longest first.
    pub fn pending(&self) -> Vec<PendingJob> {
        let now = Instant::now();
        let st = self.lock();
        let mut out: Vec<PendingJob> = st
            .jobs
            .values()
            .filter(|t| t.at.is_none())
            .map(|t| PendingJob {
                id: t.info.id,
                name: t.info.name.clone(),
                stage: t.info.stage.clone(),
                level: t.info.level.clone(),
                wait_s: now.saturating_duration_since(t.since).as_secs_f64(),
            })
            .collect();
        drop(st);
        out.sort_by(|a, b| b.wait_s.total_cmp(&a.wait_s).then(a.id.cmp(&b.id)));
        out
    }

    /// Running jobs by reservation key (what a slot holds).
    pub fn running_jobs(&self) -> HashMap<String, SlotJob> {
        let now = Instant::now();
        let st = self.lock();
        st.jobs
            .iter()
            .filter_map(|(k, t)| {
                let (_, _, at) = t.at.as_ref()?;
                Some((
                    k.clone(),
                    SlotJob {
                        id: t.info.id,
                        name: t.info.name.clone(),
                        stage: t.info.stage.clone(),
                        level: t.info.level.clone(),
                        elapsed_s: now.saturating_duration_since(*at).as_secs_f64(),
                    },
                ))
            })
            .collect()
    }

    /// Ended jobs, newest first.
    pub fn recent(&self) -> Vec<RecentJob> {
        self.lock().recent.iter().cloned().collect()
    }

    /// Waits of jobs that got a slot since the last call, and of those still waiting.
    pub fn take_waits(&self) -> Vec<f64> {
        let now = Instant::now();
        let mut st = self.lock();
        let mut w = std::mem::take(&mut st.waits);
        w.extend(
            st.jobs
                .values()
                .filter(|t| t.at.is_none())
                .map(|t| now.saturating_duration_since(t.since).as_secs_f64()),
        );
        w
    }
}

/// See [`JobBoard::guard`].
#[derive(Debug)]
pub struct BoardGuard<'a> {
    board: &'a JobBoard,
    key: String,
}

impl Drop for BoardGuard<'_> {
    fn drop(&mut self) {
        // A no-op when the job was finished or given back, as it normally is.
        self.board.finished(
            &self.key,
            Ending::failed(FailureReason::RunnerSystemFailure)
                .with_message("the job's task ended without a result"),
        );
    }
}

/// `text` with every secret replaced by `[MASKED]`, longest first so a secret that contains
/// another is masked whole (as traces mask them).
fn mask(text: &str, secrets: &[String]) -> String {
    slipway_job::mask_text(text, secrets)
}

/// Milliseconds since the Unix epoch (as the taskscaler's store and the queue write them; this
/// crate depends on neither).
fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: u64, name: &str) -> JobInfo {
        JobInfo {
            id,
            name: name.into(),
            stage: "test".into(),
            level: "none".into(),
        }
    }

    #[test]
    fn a_job_moves_from_pending_to_a_slot_to_recent() {
        let b = JobBoard::new("r", JobMetrics::default());
        b.waiting("job-1", info(1, "build"), Vec::new());
        b.waiting("job-2", info(2, "lint"), Vec::new());
        assert_eq!(b.pending().len(), 2);
        b.running("job-1", "i-1", 3);
        let pending = b.pending();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].name, "lint");
        let running = b.running_jobs();
        assert_eq!(running["job-1"].name, "build");
        assert_eq!(b.take_waits().len(), 2, "one started, one still waiting");
        b.finished(
            "job-1",
            Ending::of(&JobOutcome::failed(
                FailureReason::ScriptFailure,
                Some(2),
                "exit code 2",
            )),
        );
        let recent = b.recent();
        assert_eq!(recent.len(), 1);
        assert_eq!(recent[0].instance.as_deref(), Some("i-1"));
        assert_eq!(recent[0].slot, Some(3));
        assert_eq!(recent[0].failure_reason.as_deref(), Some("script_failure"));
        assert!(b.running_jobs().is_empty());
    }

    #[test]
    fn messages_are_masked_and_recent_is_bounded() {
        let b = JobBoard::new("r", JobMetrics::default());
        for i in 0..(RECENT as u64 + 5) {
            let key = format!("job-{i}");
            b.waiting(&key, info(i, "x"), vec!["hunter22".into()]);
            b.finished(
                &key,
                Ending::status(JobStatus::Failed).with_message("bad token hunter22 given"),
            );
        }
        let recent = b.recent();
        assert_eq!(recent.len(), RECENT);
        assert_eq!(recent[0].id, RECENT as u64 + 4, "newest first");
        assert_eq!(
            recent[0].message.as_deref(),
            Some("bad token [MASKED] given")
        );
    }

    #[test]
    fn a_job_given_back_moves_the_gauges_but_is_not_counted_as_ended() {
        let m = JobMetrics::default();
        let b = JobBoard::new("r", m.clone());
        b.waiting("job-1", info(1, "x"), Vec::new());
        b.running("job-1", "i", 0);
        b.forget("job-1");
        b.waiting("job-2", info(2, "y"), Vec::new());
        b.finished("job-2", Ending::status(JobStatus::Canceled));
        let text = crate::metrics::tests::encoded(&m);
        for (series, value) in [
            (r#"slipway_jobs{runner="r",state="running"} 0"#, true),
            (r#"slipway_jobs{runner="r",state="waiting"} 0"#, true),
            (
                r#"slipway_jobs_finished_total{runner="r",outcome="canceled"} 1"#,
                true,
            ),
            (r#"outcome="success""#, false),
        ] {
            assert_eq!(text.contains(series), value, "{series} in\n{text}");
        }
    }

    #[test]
    fn a_secret_containing_another_is_masked_whole() {
        let secrets = vec!["abcd1234".to_string(), "abcd1234efgh5678".to_string()];
        assert_eq!(
            mask("token abcd1234efgh5678 bad, abcd1234 too", &secrets),
            "token [MASKED] bad, [MASKED] too"
        );
    }

    #[test]
    fn a_guard_ends_a_job_its_task_did_not() {
        let b = JobBoard::new("r", JobMetrics::default());
        b.waiting("job-1", info(1, "x"), Vec::new());
        b.running("job-1", "i", 0);
        {
            let _g = b.guard("job-1");
        }
        let recent = b.recent();
        assert_eq!(recent.len(), 1);
        assert_eq!(
            recent[0].failure_reason.as_deref(),
            Some("runner_system_failure")
        );
        // A job its task finished is not ended twice.
        b.waiting("job-2", info(2, "y"), Vec::new());
        {
            let _g = b.guard("job-2");
            b.finished("job-2", Ending::status(JobStatus::Success));
        }
        assert_eq!(b.recent().len(), 2);
        assert_eq!(b.recent()[0].outcome, "success");
    }

    #[test]
    fn vm_starts_are_counted_per_image_on_the_board_and_in_the_metrics() {
        let m = JobMetrics::default();
        let b = JobBoard::new("r", m.clone());
        b.vm_started("ci-microvm", true);
        b.vm_started("ci-microvm", true);
        b.vm_started("ci-microvm", false);
        b.vm_started("ci-vm", false);
        let starts = b.vm_starts();
        assert_eq!(starts.len(), 2);
        assert_eq!(
            (starts[0].image.as_str(), starts[0].warm, starts[0].cold),
            ("ci-microvm", 2, 1)
        );
        assert_eq!(
            (starts[1].image.as_str(), starts[1].warm, starts[1].cold),
            ("ci-vm", 0, 1)
        );
        let text = crate::metrics::tests::encoded(&m);
        assert!(
            text.contains(
                r#"slipway_vm_starts_total{runner="r",image="ci-microvm",start="warm"} 2"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"slipway_vm_starts_total{runner="r",image="ci-vm",start="cold"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn a_job_tried_again_elsewhere_is_shown_where_it_ran_last() {
        let b = JobBoard::new("r", JobMetrics::default());
        b.waiting("job-1", info(1, "x"), Vec::new());
        b.running("job-1", "dead", 0);
        b.running("job-1", "alive", 1);
        b.finished("job-1", Ending::status(JobStatus::Success));
        let recent = b.recent();
        assert_eq!(recent[0].instance.as_deref(), Some("alive"));
        assert_eq!(recent[0].slot, Some(1));
    }

    #[test]
    fn unknown_keys_are_ignored() {
        let b = JobBoard::new("r", JobMetrics::default());
        b.running("nope", "i", 0);
        b.finished("nope", Ending::status(JobStatus::Success));
        assert!(b.recent().is_empty());
    }
}
