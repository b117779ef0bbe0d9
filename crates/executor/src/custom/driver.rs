//! One driver process: spawning it in its own process group, streaming its output, and
//! stopping it (SIGTERM, grace, SIGKILL) on a deadline or cancel.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt as _};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long output is still read after a driver exits (a background process it left may hold
/// its stdout open).
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);
/// Most bytes of `config_exec` stdout, and of each `cleanup_exec` stream, kept.
const CAPTURE_LIMIT: usize = 1 << 20;

pub(super) fn capture(buf: &mut Vec<u8>, bytes: &[u8]) {
    let room = CAPTURE_LIMIT.saturating_sub(buf.len());
    buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
}

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy)]
pub(super) enum Stream {
    Stdout,
    Stderr,
}

/// Why a driver was stopped.
#[derive(Debug, Clone, Copy)]
pub(super) enum Stop {
    Canceled,
    JobTimeout,
    StageTimeout,
}

/// How a driver process ended.
#[derive(Debug)]
pub(super) enum DriverEnd {
    SpawnFailed(String),
    Exited(std::process::ExitStatus),
    /// Stopped by signals (or abandoned when it would not die).
    Stopped(Stop),
}

/// When a driver call must stop.
#[derive(Debug, Clone)]
pub(super) struct Limits {
    pub(super) job_deadline: Option<Instant>,
    pub(super) stage_deadline: Option<Instant>,
    pub(super) cancel: Option<CancellationToken>,
}

/// One driver call.
#[derive(Debug)]
pub(super) struct Driver {
    pub(super) program: String,
    pub(super) args: Vec<String>,
    pub(super) env: Vec<(String, String)>,
    pub(super) dir: PathBuf,
    pub(super) graceful: Duration,
    pub(super) force: Duration,
}

enum Phase {
    Running,
    Terminating(Instant),
    Killing(Instant),
}

impl Driver {
    /// Run the driver in its own process group, streaming its output to `out`, and stop the
    /// group (SIGTERM, grace, SIGKILL) on a deadline or cancel.
    pub(super) async fn run(
        &self,
        limits: Limits,
        out: &mut (dyn FnMut(Stream, &[u8]) + Send),
    ) -> DriverEnd {
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => return DriverEnd::SpawnFailed(format!("cannot start {}: {e}", self.program)),
        };
        let pgid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw);
        let signal = |sig: Signal| {
            if let Some(pg) = pgid {
                // The group may be gone already.
                let _ = killpg(pg, sig);
            }
        };
        let mut stdout = child.stdout.take();
        let mut stderr = child.stderr.take();
        let mut obuf = vec![0u8; 16 * 1024];
        let mut ebuf = vec![0u8; 16 * 1024];
        let mut phase = Phase::Running;
        let mut stop = None;
        let mut status = None;
        let timer = |phase: &Phase| match phase {
            Phase::Running => match (limits.job_deadline, limits.stage_deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            Phase::Terminating(t) | Phase::Killing(t) => Some(*t),
        };
        while status.is_none() {
            let wake = timer(&phase);
            let running = matches!(phase, Phase::Running);
            tokio::select! {
                n = read_some(&mut stdout, &mut obuf) => emit(out, Stream::Stdout, &obuf, n),
                n = read_some(&mut stderr, &mut ebuf) => emit(out, Stream::Stderr, &ebuf, n),
                st = child.wait() => match st {
                    Ok(st) => status = Some(st),
                    Err(e) => {
                        tracing::warn!(program = %self.program, "waiting for the driver: {e}");
                        break;
                    }
                },
                _ = cancelled(limits.cancel.as_ref()), if running => {
                    stop = Some(Stop::Canceled);
                    signal(Signal::SIGTERM);
                    phase = Phase::Terminating(Instant::now() + self.graceful);
                }
                _ = sleep_until(wake) => match phase {
                    Phase::Running => {
                        let job_over = limits.job_deadline.is_some_and(|d| d <= Instant::now());
                        stop = Some(if job_over { Stop::JobTimeout } else { Stop::StageTimeout });
                        signal(Signal::SIGTERM);
                        phase = Phase::Terminating(Instant::now() + self.graceful);
                    }
                    Phase::Terminating(_) => {
                        signal(Signal::SIGKILL);
                        phase = Phase::Killing(Instant::now() + self.force);
                    }
                    Phase::Killing(_) => {
                        tracing::warn!(program = %self.program, "driver did not die; abandoning it");
                        break;
                    }
                },
            }
        }
        if stop.is_some() && status.is_some() {
            // What the driver left behind in its group goes too.
            signal(Signal::SIGKILL);
        }
        // Output still in the pipes; a process the driver left running may hold them open.
        let drain_until = Instant::now() + OUTPUT_DRAIN;
        while stdout.is_some() || stderr.is_some() {
            tokio::select! {
                n = read_some(&mut stdout, &mut obuf) => emit(out, Stream::Stdout, &obuf, n),
                n = read_some(&mut stderr, &mut ebuf) => emit(out, Stream::Stderr, &ebuf, n),
                _ = tokio::time::sleep_until(drain_until) => break,
            }
        }
        match (stop, status) {
            (Some(stop), _) => DriverEnd::Stopped(stop),
            (None, Some(st)) => DriverEnd::Exited(st),
            (None, None) => DriverEnd::SpawnFailed(format!("lost track of {}", self.program)),
        }
    }
}

/// Read a chunk: `Some(n)`, or `None` once at end of stream (or error), when the reader is
/// dropped; afterwards this never completes.
async fn read_some<R: AsyncRead + Unpin>(reader: &mut Option<R>, buf: &mut [u8]) -> Option<usize> {
    match reader.as_mut() {
        Some(r) => match r.read(buf).await {
            Ok(n) if n > 0 => Some(n),
            _ => {
                *reader = None;
                None
            }
        },
        None => std::future::pending().await,
    }
}

/// Send a chunk read by [`read_some`] to `out`.
fn emit(out: &mut (dyn FnMut(Stream, &[u8]) + Send), stream: Stream, buf: &[u8], n: Option<usize>) {
    if let Some(n) = n {
        out(stream, &buf[..n]);
    }
}

async fn cancelled(token: Option<&CancellationToken>) {
    match token {
        Some(t) => t.cancelled().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
