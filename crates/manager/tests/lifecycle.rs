//! The one lifecycle, tested on its own: a real runner (this machine's slots, or instances of
//! `fleeting-plugin-local` over real SSH) with a source and an executor provider of the test's
//! own, so each stage can be made to fail, wait or be canceled on purpose.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use slipway_executor::{Executor, JobSlot, RunResult};
use slipway_job::{FailureReason, JobOutcome, JobResponse, JobStatus, Trace};
use slipway_manager::lifecycle::{
    Admission, DataAt, Inputs, JobSource, Life, NoSlot, PlacedError, SourcesAt, Start, Stops,
};
use slipway_manager::runner::{ExecutorProvider, Place, Runner, StartOptions};
use slipway_taskscaler::Acquisition;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// What the test's executor does with its job.
#[derive(Debug, Clone, Copy)]
enum Act {
    /// Start the script and succeed.
    Succeed,
    /// Start the script, then wait for the cancel.
    WaitForCancel,
    /// Fail as a broken instance would, before the script started.
    FailBeforeScript,
}

/// An executor provider that records each ask and hands out [`Act`]s in order.
#[derive(Debug, Default)]
struct Provider {
    acts: Mutex<VecDeque<Act>>,
    asked: AtomicUsize,
    /// Instances the probe calls dead.
    dead: Mutex<Vec<String>>,
    /// The instance each executor was handed out for.
    places: Mutex<Vec<String>>,
}

impl Provider {
    fn with(acts: &[Act]) -> Arc<Provider> {
        Arc::new(Provider {
            acts: Mutex::new(acts.iter().copied().collect()),
            ..Provider::default()
        })
    }
}

#[derive(Debug)]
struct FakeExecutor(Act);

#[async_trait::async_trait]
impl Executor for FakeExecutor {
    fn name(&self) -> &'static str {
        "fake"
    }

    async fn run(&self, job: &JobResponse, slot: JobSlot<'_>) -> RunResult {
        let outcome = match self.0 {
            Act::Succeed => {
                slot.trace.mark_script_started();
                slot.trace
                    .message(&format!("job {} ran on slot {}", job.id, slot.slot));
                JobOutcome::Success
            }
            Act::WaitForCancel => {
                slot.trace.mark_script_started();
                slot.trace.message("waiting for the cancel");
                slot.cancel.cancelled().await;
                JobOutcome::failed(FailureReason::JobCanceled, None, "canceled")
            }
            Act::FailBeforeScript => JobOutcome::failed(
                FailureReason::RunnerSystemFailure,
                None,
                "the instance broke before the script",
            ),
        };
        RunResult {
            outcome,
            artifacts: Vec::new(),
        }
    }
}

#[async_trait::async_trait]
impl ExecutorProvider for Provider {
    async fn executor<'a>(
        &'a self,
        _runner: &'a Runner,
        acq: &'a Acquisition,
        _admission: &'a Admission,
        _place: &'a Place,
        _trace: &mut Trace,
    ) -> Result<Box<dyn Executor + 'a>, JobOutcome> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        self.places.lock().unwrap().push(acq.instance_id.clone());
        let act = self
            .acts
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Act::Succeed);
        if matches!(act, Act::FailBeforeScript) {
            self.dead.lock().unwrap().push(acq.instance_id.clone());
        }
        Ok(Box::new(FakeExecutor(act)))
    }

    async fn probe(&self, _runner: &Runner, acq: &Acquisition) -> Result<(), String> {
        if self.dead.lock().unwrap().contains(&acq.instance_id) {
            Err("the test says it is dead".into())
        } else {
            Ok(())
        }
    }
}

/// A source whose inputs and placement the test controls.
#[derive(Debug, Default)]
struct Source {
    /// Inputs wait for the cancel, then fail as canceled.
    inputs_wait: bool,
    /// Recording the placement fails with this message.
    placed_fails: Option<String>,
    placed: AtomicUsize,
}

#[async_trait::async_trait]
impl JobSource for Source {
    async fn inputs(
        &self,
        _job: &JobResponse,
        _at: SourcesAt,
        _data: &DataAt,
        trace: &mut Trace,
        cancel: &CancellationToken,
    ) -> Result<Inputs, JobOutcome> {
        if self.inputs_wait {
            trace.message("fetching inputs");
            cancel.cancelled().await;
            return Err(JobOutcome::failed(
                FailureReason::JobCanceled,
                None,
                "canceled while its inputs arrived",
            ));
        }
        Ok(Inputs::default())
    }

    async fn placed(&self, _job: &JobResponse, _acq: &Acquisition) -> Result<(), PlacedError> {
        self.placed.fetch_add(1, Ordering::SeqCst);
        match &self.placed_fails {
            Some(m) => Err(PlacedError::Record(m.clone().into())),
            None => Ok(()),
        }
    }
}

/// A runner started from `toml` (one `[[runners]]` entry), its provider replaced by `provider`.
async fn runner(dir: &Path, toml: &str, provider: Arc<Provider>) -> Runner {
    let loaded = slipway_config::parse(toml, "config.toml").expect("config");
    let cfg = &loaded.config.runners[0];
    let opts = StartOptions {
        concurrent: 1,
        state_dir: Some(dir.join("state")),
        work_dir: Some(dir.join("work")),
        plugin_dir: Some(bin_dir()),
        delete_instances_on_shutdown: true,
        ..StartOptions::default()
    };
    let mut runner = Runner::start(cfg, &opts).await.expect("runner starts");
    runner.executors = provider;
    runner
}

/// A shell runner on this machine with one slot.
fn shell_config() -> String {
    "concurrent = 1\n[[runners]]\n  name = \"life\"\n  executor = \"shell\"\n".to_string()
}

/// Where cargo puts this workspace's binaries, with `fleeting-plugin-local` built there.
fn bin_dir() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("test binary");
            // target/debug/deps/lifecycle-HASH → target/debug
            let dir = exe
                .parent()
                .and_then(Path::parent)
                .expect("target dir")
                .to_path_buf();
            if !dir.join("fleeting-plugin-local").exists() {
                let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
                let built = std::process::Command::new(cargo)
                    .args(["build", "-p", "fleeting-plugin-local"])
                    .status()
                    .expect("cargo build fleeting-plugin-local");
                assert!(built.success(), "building fleeting-plugin-local failed");
            }
            dir
        })
        .clone()
}

fn job(id: u64, variables: &[(&str, &str)]) -> JobResponse {
    let vars: Vec<serde_json::Value> = variables
        .iter()
        .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "id": id,
        "token": format!("job-token-{id}"),
        "job_info": {"name": format!("job {id}"), "stage": "test"},
        "variables": vars,
        "steps": [{"name": "script", "script": ["true"], "when": "on_success"}],
    }))
    .expect("job payload")
}

/// A trace whose text the test reads back.
fn trace() -> (Trace, mpsc::UnboundedReceiver<Vec<u8>>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (Trace::new(Vec::<String>::new(), tx), rx)
}

fn text(rx: &mut mpsc::UnboundedReceiver<Vec<u8>>) -> String {
    let mut out = Vec::new();
    while let Ok(c) = rx.try_recv() {
        out.extend(c);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Slots held or asked for on `runner`.
fn in_use(runner: &Runner) -> usize {
    let s = runner.stats();
    s.acquired + s.pending
}

/// Runs `job` on `runner` from `source`, canceling it after `cancel_after` when given: what
/// the lifecycle returned, and the trace's text.
async fn live(
    runner: &Runner,
    source: &Source,
    job: &JobResponse,
    cancel_after: Option<Duration>,
) -> (Result<(JobOutcome, Option<(String, u32)>), NoSlot>, String) {
    let (mut trace, mut rx) = trace();
    let stops = Stops::default();
    let cancel = stops.cancel.clone();
    let key = format!("job-{}", job.id);
    let life = Life {
        runner,
        key: &key,
        source,
        stops,
        since: None,
    };
    let canceling = async {
        if let Some(after) = cancel_after {
            tokio::time::sleep(after).await;
            cancel.cancel();
        }
    };
    let (r, ()) = tokio::join!(
        life.run(job, Start::Admit { held: None }, &mut trace),
        canceling
    );
    // The slot goes back when the source lets go of it: here, at once.
    let r = r.map(|ran| (ran.outcome.clone(), ran.placement.clone()));
    (r, text(&mut rx))
}

#[tokio::test]
async fn a_job_runs_once_on_the_provider_s_executor_and_gives_its_slot_back() {
    let dir = tempfile::tempdir().unwrap();
    let provider = Provider::with(&[Act::Succeed]);
    let runner = runner(dir.path(), &shell_config(), provider.clone()).await;
    let source = Source::default();
    let (mut trace, mut rx) = trace();
    let life = Life {
        runner: &runner,
        key: "job-1",
        source: &source,
        stops: Stops::default(),
        since: None,
    };
    let ran = life
        .run(&job(1, &[]), Start::Admit { held: None }, &mut trace)
        .await
        .expect("a slot");
    assert_eq!(ran.outcome, JobOutcome::Success);
    assert_eq!(ran.outcome.status(), JobStatus::Success);
    assert_eq!(
        provider.asked.load(Ordering::SeqCst),
        1,
        "one executor, once"
    );
    assert_eq!(source.placed.load(Ordering::SeqCst), 1, "placed once");
    let placement = ran.placement.clone().expect("placed");
    let log = text(&mut rx);
    assert!(
        log.contains(&format!(
            "Running on instance {} slot {}",
            placement.0, placement.1
        )),
        "{log}"
    );
    assert!(log.contains("job 1 ran on slot"), "{log}");
    assert_eq!(
        in_use(&runner),
        1,
        "the source holds the slot until it reports"
    );
    drop(ran);
    assert_eq!(in_use(&runner), 0, "the slot is given back");
    runner.shutdown().await;
}

#[tokio::test]
async fn a_level_the_runner_does_not_offer_is_refused_before_any_slot() {
    let dir = tempfile::tempdir().unwrap();
    let provider = Provider::with(&[]);
    let runner = runner(dir.path(), &shell_config(), provider.clone()).await;
    let source = Source::default();
    let (r, log) = live(
        &runner,
        &source,
        &job(2, &[("SLIPWAY_ISOLATION", "vm")]),
        None,
    )
    .await;
    let no = r.expect_err("refused");
    assert_eq!(no.status, JobStatus::Failed);
    assert!(
        matches!(
            no.failure_reason,
            FailureReason::RunnerUnsupported | FailureReason::RunnerConfigurationError
        ),
        "{no:?}"
    );
    assert!(no.message.contains("vm"), "{no:?}");
    assert!(log.contains("ERROR"), "the trace says why: {log}");
    assert_eq!(provider.asked.load(Ordering::SeqCst), 0);
    assert_eq!(source.placed.load(Ordering::SeqCst), 0);
    assert_eq!(in_use(&runner), 0, "nothing reserved");
    runner.shutdown().await;
}

#[tokio::test]
async fn a_cancel_while_waiting_for_capacity_ends_the_job_canceled_without_a_slot() {
    let dir = tempfile::tempdir().unwrap();
    let provider = Provider::with(&[]);
    let runner = runner(dir.path(), &shell_config(), provider.clone()).await;
    // Another job holds the runner's only slot.
    let request = slipway_taskscaler::Resources::default();
    runner.reserve("other", &request).unwrap();
    let _other = runner.acquire("other").await.unwrap();
    let source = Source::default();
    let (r, _) = live(
        &runner,
        &source,
        &job(3, &[]),
        Some(Duration::from_millis(300)),
    )
    .await;
    let no = r.expect_err("never got a slot");
    assert_eq!(no.status, JobStatus::Canceled, "{no:?}");
    assert_eq!(no.failure_reason, FailureReason::JobCanceled);
    assert_eq!(provider.asked.load(Ordering::SeqCst), 0);
    assert_eq!(source.placed.load(Ordering::SeqCst), 0);
    runner.release("other");
    assert_eq!(in_use(&runner), 0, "its reservation went with it");
    runner.shutdown().await;
}

#[tokio::test]
async fn a_cancel_while_inputs_arrive_ends_the_job_before_its_steps() {
    let dir = tempfile::tempdir().unwrap();
    let provider = Provider::with(&[]);
    let runner = runner(dir.path(), &shell_config(), provider.clone()).await;
    let source = Source {
        inputs_wait: true,
        ..Source::default()
    };
    let (r, log) = live(
        &runner,
        &source,
        &job(4, &[]),
        Some(Duration::from_millis(300)),
    )
    .await;
    let (outcome, _) = r.expect("the slot came while the inputs were on their way");
    assert_eq!(outcome.reason(), Some(FailureReason::JobCanceled));
    assert_eq!(outcome.status(), JobStatus::Canceled);
    assert_eq!(provider.asked.load(Ordering::SeqCst), 0, "no steps");
    assert!(log.contains("fetching inputs"), "{log}");
    assert_eq!(in_use(&runner), 0);
    runner.shutdown().await;
}

#[tokio::test]
async fn a_cancel_during_the_steps_reaches_the_executor() {
    let dir = tempfile::tempdir().unwrap();
    let provider = Provider::with(&[Act::WaitForCancel]);
    let runner = runner(dir.path(), &shell_config(), provider.clone()).await;
    let source = Source::default();
    let (r, log) = live(
        &runner,
        &source,
        &job(5, &[]),
        Some(Duration::from_millis(500)),
    )
    .await;
    let (outcome, _) = r.expect("ran");
    assert_eq!(outcome.status(), JobStatus::Canceled, "{outcome:?}");
    assert_eq!(provider.asked.load(Ordering::SeqCst), 1);
    assert!(log.contains("waiting for the cancel"), "{log}");
    assert_eq!(in_use(&runner), 0);
    runner.shutdown().await;
}

#[tokio::test]
async fn a_placement_the_source_cannot_record_fails_the_job_before_its_steps() {
    let dir = tempfile::tempdir().unwrap();
    let provider = Provider::with(&[]);
    let runner = runner(dir.path(), &shell_config(), provider.clone()).await;
    let source = Source {
        placed_fails: Some("the queue's disk is full".into()),
        ..Source::default()
    };
    let (r, log) = live(&runner, &source, &job(6, &[]), None).await;
    let (outcome, _) = r.expect("it had a slot");
    assert_eq!(outcome.reason(), Some(FailureReason::RunnerSystemFailure));
    assert!(
        log.contains("ERROR: recording the job's start: the queue's disk is full"),
        "{log}"
    );
    assert_eq!(provider.asked.load(Ordering::SeqCst), 0, "no steps");
    assert_eq!(in_use(&runner), 0);
    runner.shutdown().await;
}

/// A runner on `fleeting-plugin-local` instances (real sshd hosts), one slot each.
fn instance_config(dir: &Path) -> String {
    format!(
        r#"concurrent = 1
[[runners]]
  name = "life-instances"
  executor = "instance"
  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = 1
    max_instances = 2
    start_attempts = 2
    update_interval = "200ms"
    update_interval_when_expecting = "100ms"
    delete_instances_on_shutdown = true
    [runners.autoscaler.plugin_config]
      dir = "{}"
      name = "life{}"
    [[runners.autoscaler.policy]]
      idle_count = 0
      idle_time = "10m"
"#,
        dir.join("plugin-state").display(),
        std::process::id()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_fails_before_the_script_is_replaced_and_the_job_runs_again() {
    // The local plugin's instances are sshd hosts: installed here when missing.
    slipway_testkit::ensure_sshd().expect("sshd");
    let dir = tempfile::tempdir().unwrap();
    let provider = Provider::with(&[Act::FailBeforeScript, Act::Succeed]);
    let runner = runner(dir.path(), &instance_config(dir.path()), provider.clone()).await;
    let source = Source::default();
    let (r, log) = tokio::time::timeout(
        Duration::from_secs(180),
        live(&runner, &source, &job(7, &[]), None),
    )
    .await
    .expect("in time");
    let (outcome, placement) = r.expect("ran");
    assert_eq!(outcome, JobOutcome::Success, "{log}");
    assert!(
        log.contains("trying it again on another instance (attempt 2 of 2)"),
        "{log}"
    );
    let places = provider.places.lock().unwrap().clone();
    assert_eq!(places.len(), 2, "two tries: {places:?}");
    assert_ne!(places[0], places[1], "the second on another instance");
    assert_eq!(
        source.placed.load(Ordering::SeqCst),
        2,
        "each placement recorded"
    );
    assert_eq!(placement.map(|p| p.0), Some(places[1].clone()));
    runner.shutdown().await;
}
