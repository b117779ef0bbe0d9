//! The real `executor-plugin-shell` binary driven by the host as the runner drives it: Init (and a
//! refused config), Prepare, Run streaming stdout and stderr with stdin passed through, exit
//! codes, a canceled stage's processes killed, a plugin killed mid-stage reported as gone and
//! restarted, Cleanup removing the job's directory, and no process left after stop.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use slipway_executor_plugin::{
    Chunk, CleanupJob, ExecutorHost, JobStatus, Placement, PrepareJob, ProviderError, Resources,
    Stage, StartError,
};
use slipway_goplugin::ProcessOptions;
use tokio::sync::mpsc;

const BIN: &str = env!("CARGO_BIN_EXE_executor-plugin-shell");

async fn start(root: &Path) -> ExecutorHost {
    let config = serde_json::json!({ "root": root }).to_string().into_bytes();
    ExecutorHost::start(ProcessOptions::new("shell", BIN), config, false)
        .await
        .expect("start the plugin")
}

fn job(id: u64) -> PrepareJob {
    PrepareJob {
        job: format!(r#"{{"id": {id}, "token": "job-token-secret"}}"#).into_bytes(),
        isolation: "none".into(),
        resources: Resources::default(),
        instance: None,
        timeout: Duration::from_secs(60),
    }
}

fn stage(state: &[u8], name: &str, script: &str, stdin: &[u8]) -> Stage {
    Stage {
        state: state.to_vec(),
        name: name.into(),
        script: script.as_bytes().to_vec(),
        stdin: stdin.to_vec(),
        instance: None,
    }
}

fn cleanup(state: &[u8]) -> CleanupJob {
    CleanupJob {
        state: state.to_vec(),
        instance: None,
        status: JobStatus::Success,
    }
}

/// Run a stage to its end; its exit code, stdout and stderr.
async fn run(host: &ExecutorHost, s: Stage) -> (i32, String, String) {
    let (tx, mut rx) = mpsc::channel(64);
    let collect = async move {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        while let Some(c) = rx.recv().await {
            match c {
                Chunk::Stdout(b) => out.extend(b),
                Chunk::Stderr(b) => err.extend(b),
            }
        }
        (out, err)
    };
    let (exit, (out, err)) = tokio::join!(host.run(s, tx), collect);
    let exit = exit.expect("run");
    (
        exit.code,
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    )
}

fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !s.split(") ").nth(1).unwrap_or("").starts_with('Z'))
}

/// Pids of processes whose command line holds `needle`.
fn pids_matching(needle: &str) -> Vec<String> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmd)
            .replace('\0', " ")
            .contains(needle)
            && alive(&pid)
        {
            pids.push(pid);
        }
    }
    pids
}

async fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cond()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stages_stream_output_pass_stdin_and_report_exit_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("jobs");
    let host = start(&root).await;
    let caps = host.capabilities();
    assert_eq!(caps.name, "shell");
    assert_eq!(caps.isolation_levels, vec!["none".to_string()]);
    assert_eq!(caps.placement, Placement::Local);

    let prepared = host.prepare(job(7)).await.unwrap();
    let dir = String::from_utf8(prepared.state.clone()).unwrap();
    assert!(dir.starts_with(&root.display().to_string()), "{dir}");
    assert!(Path::new(&dir).is_dir());
    assert_eq!(prepared.builds_dir, Some(format!("{dir}/builds")));

    let (code, out, err) = run(
        &host,
        stage(
            &prepared.state,
            "step_script",
            "echo to-out; echo to-err >&2; exit 3",
            b"",
        ),
    )
    .await;
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (3, "to-out\n", "to-err\n")
    );

    // stdin reaches the script byte for byte (artifact tar streams go this way), 1 MiB of it.
    let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    let (code, out, _) = run(
        &host,
        stage(
            &prepared.state,
            "download_artifacts",
            "cat > in.bin; wc -c < in.bin; md5sum < in.bin | cut -d' ' -f1",
            &data,
        ),
    )
    .await;
    assert_eq!(code, 0);
    let md5 = std::process::Command::new("md5sum")
        .arg(format!("{dir}/in.bin"))
        .output()
        .unwrap();
    let md5 = String::from_utf8_lossy(&md5.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    assert_eq!(out, format!("1048576\n{md5}\n"));

    // A state naming a directory outside root is refused, not acted on.
    let (tx, _rx) = mpsc::channel(4);
    let err = host
        .run(stage(b"/etc", "step_script", "true", b""), tx)
        .await
        .unwrap_err();
    assert!(matches!(err, ProviderError::NotFound(_)), "{err:?}");

    host.cleanup(cleanup(&prepared.state)).await.unwrap();
    assert!(!Path::new(&dir).exists());
    // Cleanup again (a retried call): fine.
    host.cleanup(cleanup(&prepared.state)).await.unwrap();
    let pid = host.pid().unwrap();
    host.stop().await;
    assert!(!alive(&pid.to_string()), "plugin still running after stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canceled_stage_takes_its_processes_along() {
    let tmp = tempfile::tempdir().unwrap();
    let host = start(&tmp.path().join("jobs")).await;
    let prepared = host.prepare(job(8)).await.unwrap();
    let marker = format!("sleep 3{}", std::process::id() % 1000);
    let (tx, mut rx) = mpsc::channel(64);
    let script = format!("{marker} & {marker} & echo started; wait");
    // Boxed, so that dropping it below really drops the call.
    let mut call = Box::pin(host.run(stage(&prepared.state, "step_script", &script, b""), tx));
    let started = tokio::select! {
        c = rx.recv() => c,
        r = &mut call => panic!("stage ended early: {r:?}"),
    };
    assert_eq!(started, Some(Chunk::Stdout(b"started\n".to_vec())));
    // Forked before `echo`, but maybe not exec'd yet.
    assert!(
        wait_for(Duration::from_secs(10), || pids_matching(&marker).len()
            == 2)
        .await,
        "{:?}",
        pids_matching(&marker)
    );
    // The host cancels the stage by dropping the call (a job cancel or timeout).
    drop(call);
    assert!(
        wait_for(Duration::from_secs(10), || pids_matching(&marker)
            .is_empty())
        .await,
        "left running: {:?}",
        pids_matching(&marker)
    );
    host.cleanup(cleanup(&prepared.state)).await.unwrap();
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_killed_mid_stage_is_reported_gone_and_restarted() {
    let tmp = tempfile::tempdir().unwrap();
    let host = start(&tmp.path().join("jobs")).await;
    let prepared = host.prepare(job(9)).await.unwrap();
    let (tx, mut rx) = mpsc::channel(64);
    let call = host.run(
        stage(
            &prepared.state,
            "step_script",
            "echo started; exec sleep 300",
            b"",
        ),
        tx,
    );
    tokio::pin!(call);
    tokio::select! {
        c = rx.recv() => assert!(c.is_some()),
        r = &mut call => panic!("stage ended early: {r:?}"),
    }
    let first = host.pid().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(first).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let err = call.await.unwrap_err();
    assert!(matches!(err, ProviderError::Unavailable { .. }), "{err:?}");
    assert!(err.to_string().contains("went away"), "{err}");
    // Restarted and re-initialized: the next job works, and it cleans the old job's directory.
    let next = host.prepare(job(10)).await.unwrap();
    assert_eq!(host.restarts(), 1);
    assert_ne!(host.pid(), Some(first));
    let (code, out, _) = run(&host, stage(&next.state, "step_script", "echo again", b"")).await;
    assert_eq!((code, out.as_str()), (0, "again\n"));
    host.cleanup(cleanup(&prepared.state)).await.unwrap();
    host.cleanup(cleanup(&next.state)).await.unwrap();
    assert_eq!(
        std::fs::read_dir(tmp.path().join("jobs")).unwrap().count(),
        0
    );
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_config_is_refused_at_init_naming_the_key_and_nothing_keeps_running() {
    // A copy of its own, so its command line tells it from the other tests' plugins.
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("executor-plugin-shell");
    std::fs::copy(BIN, &bin).unwrap();
    let config = br#"{"rooot": "/tmp/x"}"#.to_vec();
    let err = ExecutorHost::start(ProcessOptions::new("shell", &bin), config, true)
        .await
        .unwrap_err();
    let StartError::Init { answer, .. } = &err else {
        panic!("{err:?}");
    };
    assert!(
        matches!(answer, ProviderError::InvalidConfig(m) if m.contains("config.rooot: unknown key")),
        "{err}"
    );
    let bin = bin.display().to_string();
    assert!(
        wait_for(Duration::from_secs(5), || pids_matching(&bin).is_empty()).await,
        "{:?}",
        pids_matching(&bin)
    );
}
