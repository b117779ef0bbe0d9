//! The agent loop: reads [`Request`]s from one half of a stream, runs processes, writes
//! [`Reply`]s to the other half.
//!
//! Threads, not an async runtime: per exec one thread owns the child (pumping stdout, then
//! reaping it), one pumps stderr and, when the exec has stdin, one feeds it. All replies go
//! through one writer lock so frames never interleave.
//!
//! When the stream ends (the host disconnected), every process still running is killed with
//! its process group: its replies would have nowhere to go, and the host that reconnects does
//! not know its id.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, mpsc};
use std::thread;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::frame::{MAX_CHUNK, Reply, Request, VERSION};

/// `PATH` given to processes when the agent itself has none (a bare `/init` environment).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// `HOME` given to processes when the agent itself has none.
pub const DEFAULT_HOME: &str = "/root";

/// Longest request line kept; a longer one is dropped whole (it cannot be a sane frame).
const MAX_LINE: usize = 64 << 20;

/// Clock difference to the host's hello beyond which the agent sets its clock.
const CLOCK_SLACK_SECS: u64 = 2;

/// How [`serve_with`] behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Set the guest clock from a hello whose `unix_time` differs by more than 2 s (off in
    /// tests, which must not touch the host's clock).
    pub set_clock: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config { set_clock: true }
    }
}

/// What one [`serve`] session saw.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Lines that were requests (valid or answered with an error).
    pub frames: u64,
    /// Lines skipped because they were not frames.
    pub skipped: u64,
    /// Processes started.
    pub execs: u64,
}

/// Serve one connection with the default [`Config`] until `reader` reaches EOF.
pub fn serve<R, W>(reader: R, writer: W) -> io::Result<Summary>
where
    R: Read,
    W: Write + Send + 'static,
{
    serve_with(reader, writer, &Config::default())
}

/// Serve one connection until `reader` reaches EOF (`Ok`) or fails (`Err`); either way the
/// processes still running are killed and `writer` is dropped before returning.
pub fn serve_with<R, W>(reader: R, writer: W, config: &Config) -> io::Result<Summary>
where
    R: Read,
    W: Write + Send + 'static,
{
    let session = Session {
        out: Arc::new(Out {
            writer: Mutex::new(Some(writer)),
        }),
        table: Arc::new(Mutex::new(HashMap::new())),
        config: config.clone(),
        started: Instant::now(),
    };
    let mut reader = BufReader::with_capacity(64 << 10, reader);
    let mut line = Vec::new();
    let mut summary = Summary::default();
    let result = loop {
        match read_line(&mut reader, &mut line) {
            Ok(Line::Eof) => break Ok(summary),
            Ok(Line::TooLong) => {
                summary.skipped += 1;
                log(&format!(
                    "skipped a request line longer than {MAX_LINE} bytes"
                ));
            }
            Ok(Line::Complete) => session.handle(&line, &mut summary),
            Err(e) => break Err(e),
        }
    };
    session.shutdown();
    result
}

/// One connection's state.
struct Session<W> {
    out: Arc<Out<W>>,
    table: Arc<Mutex<HashMap<u64, Running>>>,
    config: Config,
    started: Instant,
}

/// An exec whose process has not been reaped yet.
struct Running {
    /// Its process group (the child's pid: it was started with `process_group(0)`).
    pgid: Pid,
    /// Feeds its stdin writer thread; `None` once stdin is closed.
    stdin: Option<mpsc::Sender<Vec<u8>>>,
}

impl<W: Write + Send + 'static> Session<W> {
    fn handle(&self, line: &[u8], summary: &mut Summary) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        match Request::decode(line) {
            Ok(request) => {
                summary.frames += 1;
                self.dispatch(request, summary);
            }
            Err(error) => match error.reply_id() {
                Some(id) => {
                    summary.frames += 1;
                    log(&format!("request {id}: {error}"));
                    self.out.send(&Reply::Error {
                        id,
                        message: error.to_string(),
                    });
                }
                None => {
                    summary.skipped += 1;
                    log(&format!("skipped a {}-byte line: {error}", line.len()));
                }
            },
        }
    }

    fn dispatch(&self, request: Request, summary: &mut Summary) {
        match request {
            Request::Hello { id, unix_time } => self.hello(id, unix_time),
            Request::Exec {
                id,
                argv,
                env,
                cwd,
                stdin,
                keep_stdin,
            } => {
                if self.exec(id, &argv, env, cwd, stdin, keep_stdin) {
                    summary.execs += 1;
                }
            }
            Request::Stdin { id, data, eof } => self.stdin(id, data, eof),
            Request::Signal { id, signal } => self.signal(id, signal),
            Request::Renew {
                id,
                entropy,
                machine_id,
                hostname,
            } => {
                let renewed = crate::identity::renew(&entropy, &machine_id, &hostname);
                for note in &renewed.notes {
                    log(&format!("renew: {note}"));
                }
                self.out.send(&Reply::Renewed {
                    id,
                    reseeded: renewed.reseeded,
                    notes: renewed.notes,
                });
            }
        }
    }

    fn hello(&self, id: u64, unix_time: u64) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        if self.config.set_clock && now.abs_diff(unix_time) > CLOCK_SLACK_SECS {
            set_clock(now, unix_time);
        }
        self.out.send(&Reply::Hello {
            id,
            version: VERSION,
            uptime_ms: uptime_ms(self.started),
        });
    }

    /// Start one process; whether it started.
    fn exec(
        &self,
        id: u64,
        argv: &[String],
        env: Vec<(String, String)>,
        cwd: Option<String>,
        stdin: Option<Vec<u8>>,
        keep_stdin: bool,
    ) -> bool {
        let fail = |message: String| {
            log(&format!("exec {id}: {message}"));
            self.out.send(&Reply::Error { id, message });
            false
        };
        if lock(&self.table).contains_key(&id) {
            return fail(format!("exec id {id} is already running"));
        }
        let Some((program, args)) = argv.split_first() else {
            return fail("empty argv".into());
        };
        let mut command = Command::new(program);
        command.args(args);
        // The agent may run with the bare environment of /init.
        if std::env::var_os("PATH").is_none() {
            command.env("PATH", DEFAULT_PATH);
        }
        if std::env::var_os("HOME").is_none() {
            command.env("HOME", DEFAULT_HOME);
        }
        command.envs(env);
        if let Some(cwd) = cwd {
            command.current_dir(cwd);
        }
        let wants_stdin = stdin.is_some() || keep_stdin;
        command
            .stdin(if wants_stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group, so a signal reaches everything it starts and nothing of ours.
            .process_group(0);
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => return fail(format!("cannot start {program:?}: {e}")),
        };
        let pid = child.id();
        let Ok(raw_pid) = i32::try_from(pid) else {
            // Cannot happen on Linux (pid_max ≤ 2^22); never signal a bogus group.
            let _ = child.kill();
            let _ = child.wait();
            return fail(format!("pid {pid} out of range"));
        };
        let pgid = Pid::from_raw(raw_pid);
        let mut stdin_tx = None;
        if let Some(pipe) = child.stdin.take() {
            let (tx, rx) = mpsc::channel();
            if let Some(data) = stdin.filter(|data| !data.is_empty()) {
                // Queued before the writer starts: the channel is unbounded.
                let _ = tx.send(data);
            }
            match spawn_thread(format!("stdin-{id}"), move || feed_stdin(id, pipe, rx)) {
                Ok(()) => stdin_tx = keep_stdin.then_some(tx),
                Err(e) => {
                    log(&format!("exec {id}: cannot start its stdin thread: {e}"));
                    kill_group(id, pgid, Signal::SIGKILL);
                }
            }
        }
        lock(&self.table).insert(
            id,
            Running {
                pgid,
                stdin: stdin_tx,
            },
        );
        log(&format!("exec {id}: started {program:?}, pid {pid}"));
        // Sent before the output threads exist, so it precedes every output frame.
        self.out.send(&Reply::Started { id, pid });
        let out = Arc::clone(&self.out);
        let table = Arc::clone(&self.table);
        let child = Arc::new(Mutex::new(Some(child)));
        let owned = Arc::clone(&child);
        if let Err(e) = spawn_thread(format!("exec-{id}"), move || {
            if let Some(child) = lock(&owned).take() {
                run_exec(&out, &table, id, pgid, child);
            }
        }) {
            log(&format!("exec {id}: cannot start its thread: {e}"));
            kill_group(id, pgid, Signal::SIGKILL);
            // The closure is gone with the failed spawn; the child is still ours to reap.
            let status = lock(&child).take().map(|mut child| child.wait());
            lock(&self.table).remove(&id);
            let (code, signal) = match status {
                Some(Ok(status)) => (status.code(), status.signal()),
                _ => (None, None),
            };
            self.out.send(&Reply::Exit { id, code, signal });
        }
        true
    }

    fn stdin(&self, id: u64, data: Option<Vec<u8>>, eof: bool) {
        let mut table = lock(&self.table);
        let Some(running) = table.get_mut(&id) else {
            log(&format!(
                "stdin for exec {id}, which is not running: ignored"
            ));
            return;
        };
        let Some(tx) = &running.stdin else {
            log(&format!(
                "stdin for exec {id}, whose stdin is closed: ignored"
            ));
            return;
        };
        if let Some(data) = data.filter(|data| !data.is_empty()) {
            // A send fails only when the writer thread gave up (the process closed stdin).
            let _ = tx.send(data);
        }
        if eof {
            // Dropping the sender ends the writer thread after what is queued; it closes the pipe.
            running.stdin = None;
        }
    }

    fn signal(&self, id: u64, signal: i32) {
        let Some(pgid) = lock(&self.table).get(&id).map(|running| running.pgid) else {
            log(&format!(
                "signal {signal} for exec {id}, which is not running: ignored"
            ));
            return;
        };
        match Signal::try_from(signal) {
            Ok(signal) => kill_group(id, pgid, signal),
            Err(e) => log(&format!("exec {id}: bad signal {signal}: {e}")),
        }
    }

    /// The connection is gone: kill what still runs and stop writing.
    fn shutdown(&self) {
        let mut table = lock(&self.table);
        for (id, running) in table.iter_mut() {
            running.stdin = None;
            kill_group(*id, running.pgid, Signal::SIGKILL);
        }
        drop(table);
        self.out.close();
    }
}

/// Pump the child's output, reap it, report its exit.
fn run_exec<W: Write + Send>(
    out: &Out<W>,
    table: &Mutex<HashMap<u64, Running>>,
    id: u64,
    pgid: Pid,
    mut child: Child,
) {
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    thread::scope(|scope| {
        let stderr_pump = stderr.map(|pipe| {
            thread::Builder::new()
                .name(format!("stderr-{id}"))
                .spawn_scoped(scope, move || pump(out, id, pipe, Stream::Stderr))
        });
        if let Some(Err(e)) = &stderr_pump {
            // Nobody drains stderr: a chatty process would block forever.
            log(&format!("exec {id}: cannot start its stderr thread: {e}"));
            kill_group(id, pgid, Signal::SIGKILL);
        }
        if let Some(pipe) = stdout {
            pump(out, id, pipe, Stream::Stdout);
        }
    });
    // Reaped only after both pipes are drained: until then the zombie keeps the group id taken,
    // so a signal cannot reach a stranger's group.
    let (code, signal) = match child.wait() {
        Ok(status) => (status.code(), status.signal()),
        Err(e) => {
            log(&format!("exec {id}: cannot wait for it: {e}"));
            (None, None)
        }
    };
    lock(table).remove(&id);
    log(&format!(
        "exec {id}: exited, code {code:?}, signal {signal:?}"
    ));
    out.send(&Reply::Exit { id, code, signal });
}

#[derive(Clone, Copy)]
enum Stream {
    Stdout,
    Stderr,
}

/// Forward one pipe as frames until EOF.
fn pump<W: Write>(out: &Out<W>, id: u64, mut pipe: impl Read, stream: Stream) {
    let mut buf = vec![0; MAX_CHUNK];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                let data = buf[..n].to_vec();
                out.send(&match stream {
                    Stream::Stdout => Reply::Stdout { id, data },
                    Stream::Stderr => Reply::Stderr { id, data },
                });
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                log(&format!("exec {id}: cannot read its output: {e}"));
                return;
            }
        }
    }
}

/// Write queued stdin until the sender is dropped or the process stops reading.
fn feed_stdin(id: u64, mut pipe: ChildStdin, rx: mpsc::Receiver<Vec<u8>>) {
    for data in rx {
        if let Err(e) = pipe.write_all(&data) {
            log(&format!("exec {id}: stdin closed by the process: {e}"));
            return;
        }
    }
}

fn kill_group(id: u64, pgid: Pid, signal: Signal) {
    match killpg(pgid, signal) {
        Ok(()) => log(&format!("exec {id}: sent {signal} to group {pgid}")),
        Err(e) => log(&format!(
            "exec {id}: cannot send {signal} to group {pgid}: {e}"
        )),
    }
}

/// The writing half, shared by every thread of the session.
struct Out<W> {
    /// `None` once the connection is gone: late frames are dropped.
    writer: Mutex<Option<W>>,
}

impl<W: Write> Out<W> {
    fn send(&self, reply: &Reply) {
        let line = match reply.encode() {
            Ok(line) => line,
            Err(e) => {
                log(&format!("request {}: {e}", reply.id()));
                return;
            }
        };
        let mut writer = lock(&self.writer);
        let Some(w) = writer.as_mut() else {
            return;
        };
        if let Err(e) = w.write_all(&line).and_then(|()| w.flush()) {
            log(&format!(
                "cannot write to the host, dropping further replies: {e}"
            ));
            *writer = None;
        }
    }

    fn close(&self) {
        lock(&self.writer).take();
    }
}

enum Line {
    Complete,
    TooLong,
    Eof,
}

/// Read one line into `line`, without its `\n`. A partial line at EOF counts as a line (it is
/// skipped if it does not parse); a line over [`MAX_LINE`] is discarded up to its newline.
fn read_line(reader: &mut impl BufRead, line: &mut Vec<u8>) -> io::Result<Line> {
    line.clear();
    let mut too_long = false;
    let mut any = false;
    loop {
        let buf = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok(match (any, too_long) {
                (false, _) => Line::Eof,
                (true, false) => Line::Complete,
                (true, true) => Line::TooLong,
            });
        }
        any = true;
        let newline = buf.iter().position(|&b| b == b'\n');
        let chunk = &buf[..newline.unwrap_or(buf.len())];
        if !too_long {
            if line.len() + chunk.len() > MAX_LINE {
                too_long = true;
                line.clear();
            } else {
                line.extend_from_slice(chunk);
            }
        }
        let used = newline.map_or(buf.len(), |i| i + 1);
        reader.consume(used);
        if newline.is_some() {
            return Ok(if too_long {
                Line::TooLong
            } else {
                Line::Complete
            });
        }
    }
}

/// Set the clock to the host's (a restored snapshot wakes up with the time it was taken);
/// failure is only logged. A system call, not `date -s`: spawning a process in a guest that
/// just woke up cold costs ~100 ms under emulation, and the host waits for this answer.
fn set_clock(now: u64, unix_time: u64) {
    let secs = i64::try_from(unix_time).unwrap_or(i64::MAX);
    let when = nix::sys::time::TimeSpec::new(secs, 0);
    match nix::time::clock_settime(nix::time::ClockId::CLOCK_REALTIME, when) {
        Ok(()) => log(&format!("clock set from {now} to {unix_time}")),
        Err(e) => log(&format!("cannot set the clock to {unix_time}: {e}")),
    }
}

/// Guest uptime from `/proc/uptime`, else the agent's own.
fn uptime_ms(started: Instant) -> u64 {
    std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|text| {
            let secs: f64 = text.split_whitespace().next()?.parse().ok()?;
            // Saturating float-to-int cast; uptime is never negative or huge.
            Some((secs * 1000.0) as u64)
        })
        .unwrap_or_else(|| u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX))
}

fn spawn_thread(name: String, f: impl FnOnce() + Send + 'static) -> io::Result<()> {
    thread::Builder::new().name(name).spawn(f).map(drop)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicked holder leaves plain data behind; keep serving.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One event line on stderr (the guest console).
pub(crate) fn log(message: &str) {
    eprintln!("slipway-guest-agent: {message}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8]) -> Vec<Result<Vec<u8>, &'static str>> {
        let mut reader = BufReader::with_capacity(4, input);
        let mut line = Vec::new();
        let mut seen = Vec::new();
        loop {
            match read_line(&mut reader, &mut line).unwrap() {
                Line::Eof => return seen,
                Line::TooLong => seen.push(Err("too long")),
                Line::Complete => seen.push(Ok(line.clone())),
            }
        }
    }

    #[test]
    fn read_line_splits_across_buffer_refills() {
        assert_eq!(
            lines(b"abcdefgh\n\nxy\npartial"),
            vec![
                Ok(b"abcdefgh".to_vec()),
                Ok(vec![]),
                Ok(b"xy".to_vec()),
                Ok(b"partial".to_vec())
            ]
        );
        assert!(lines(b"").is_empty());
    }
}
