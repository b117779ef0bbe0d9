//! Checks of one instance, from `Increase` to `Decrease`: `increase`, `connect-info`, `ssh`,
//! `heartbeat`, `restart`, `unknown-ids`, `decrease`; and the polling they wait with.

use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime};

use slipway_connector::{Client, DialOptions, HostKeyStore};
use slipway_fleeting::{InstanceGroup as _, State};

use super::checks::{Checker, Verdict, progress};
use super::report::{go_duration, one_line};

/// Longest pause between two `Update` polls.
const POLL_MAX: Duration = Duration::from_secs(2);
/// How often a long wait reports that it is still alive.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);
/// What `echo` prints in the `ssh` check.
const ECHO_TOKEN: &str = "slipway-plugin-check";

impl Checker<'_> {
    pub(super) async fn increase(&mut self) -> Verdict {
        let host = match self.ready() {
            Ok(h) => h,
            Err(v) => return v,
        };
        let before: HashSet<String> = match self.call("Update", host.update()).await {
            Ok(list) => list.into_iter().map(|(id, _)| id).collect(),
            Err(e) => return Verdict::Fail(format!("before Increase: {e}")),
        };
        self.before = Some(before.clone());
        let n = match self.call("Increase(1)", host.increase(1)).await {
            Ok(n) => n,
            Err(e) => return Verdict::Fail(e),
        };
        if n == 0 {
            return Verdict::Fail("Increase(1) requested no instance (returned 0)".into());
        }
        let timeout = self.opts.timeout;
        progress(format_args!(
            "waiting up to {} for the new instance to be running",
            go_duration(timeout)
        ));
        let start = Instant::now();
        let mut poll = Poll::new(timeout);
        let mut last = String::from("not listed yet");
        loop {
            let list = match self.call("Update", host.update()).await {
                Ok(l) => l,
                Err(e) => return Verdict::Fail(e),
            };
            let new: Vec<(String, State)> = list
                .into_iter()
                .filter(|(id, _)| !before.contains(id))
                .collect();
            self.created.extend(new.iter().map(|(id, _)| id.clone()));
            if let Some((id, _)) = new.iter().find(|(_, s)| *s == State::Running) {
                self.instance = Some(id.clone());
                let mut d = format!(
                    "instance {id} running after {} (timeout {})",
                    go_duration(start.elapsed()),
                    go_duration(timeout)
                );
                if n != 1 || new.len() != 1 {
                    d.push_str(&format!(
                        "; but Increase(1) returned {n} and {} new instances are listed",
                        new.len()
                    ));
                    return Verdict::Fail(d);
                }
                return Verdict::Pass(d);
            }
            if let Some((id, s)) = new
                .iter()
                .find(|(_, s)| matches!(s, State::Timeout | State::Deleted | State::Deleting))
            {
                return Verdict::Fail(format!(
                    "instance {id} went to {s} instead of running (after {})",
                    go_duration(start.elapsed())
                ));
            }
            if let Some((id, s)) = new.first() {
                last = format!("{id} {s}");
            }
            if !poll.wait(&format!("new instance: {last}")).await {
                return Verdict::Fail(format!(
                    "no new instance running within {} (last seen: {last})",
                    go_duration(timeout)
                ));
            }
        }
    }

    pub(super) async fn connect_info(&mut self) -> Verdict {
        let (host, id) = match self.instance() {
            Ok(v) => v,
            Err(v) => return v,
        };
        let ci = match self.call("ConnectInfo", host.connect_info(&id)).await {
            Ok(ci) => ci,
            Err(e) => return Verdict::Fail(e),
        };
        let c = &ci.connector;
        let mut problems = Vec::new();
        if ci.id != id {
            problems.push(format!("id {:?} does not match {id:?}", ci.id));
        }
        let addr = if self.opts.use_external_addr && !ci.external_addr.is_empty() {
            &ci.external_addr
        } else if !ci.internal_addr.is_empty() {
            &ci.internal_addr
        } else {
            &ci.external_addr
        };
        if addr.is_empty() {
            problems.push("no address (internal_addr and external_addr are empty)".to_owned());
        }
        if self.opts.use_external_addr && ci.external_addr.is_empty() {
            problems.push("use_external_addr is set but external_addr is empty".to_owned());
        }
        if !matches!(c.protocol.as_str(), "" | "ssh" | "winrm") {
            problems.push(format!(
                "protocol {:?} is not ssh or winrm",
                c.protocol.as_str()
            ));
        }
        if c.username.is_empty() {
            problems.push("no username".to_owned());
        }
        let auth = match (c.key.is_empty(), c.password.is_empty()) {
            (false, false) => "key+password",
            (false, true) => "key",
            (true, false) => "password",
            (true, true) if c.use_static_credentials => "static credentials",
            (true, true) => {
                problems.push(
                    "no credentials: key and password are empty and use_static_credentials is false"
                        .to_owned(),
                );
                "none"
            }
        };
        let expiry = match ci.expires {
            None => "no expiry".to_owned(),
            Some(t) => match t.duration_since(SystemTime::now()) {
                Ok(left) => format!("expires in {}", go_duration(left)),
                Err(_) => {
                    problems.push("expires is in the past".to_owned());
                    "expired".to_owned()
                }
            },
        };
        let protocol = if c.protocol.is_empty() {
            "ssh(default)"
        } else {
            c.protocol.as_str()
        };
        let port = if c.protocol_port == 0 || addr.contains(':') {
            String::new()
        } else {
            format!(" port {}", c.protocol_port)
        };
        let os = match (c.os.is_empty(), c.arch.is_empty()) {
            (true, true) => String::new(),
            (false, true) => format!(" {}", c.os),
            (true, false) => format!(" {}", c.arch),
            (false, false) => format!(" {}/{}", c.os, c.arch),
        };
        let d = format!(
            "{protocol} {}@{addr}{port}{os}, {auth} auth, {expiry}",
            c.username
        );
        if problems.is_empty() {
            self.info = Some(ci);
            Verdict::Pass(d)
        } else {
            Verdict::Fail(format!("{}; got {d}", problems.join("; ")))
        }
    }

    pub(super) async fn ssh(&mut self) -> Verdict {
        if !self.opts.connect {
            return Verdict::Skip("pass --connect to log in over SSH and run echo".into());
        }
        let Some(info) = self.info.clone() else {
            return Verdict::Skip("needs a valid ConnectInfo".into());
        };
        let dial = DialOptions {
            use_external_addr: self.opts.use_external_addr,
        };
        let pins = HostKeyStore::new();
        let timeout = self.opts.timeout;
        let mut poll = Poll::new(timeout);
        // "running" may come before sshd accepts (a VM still booting): retry until the timeout.
        let client = loop {
            match tokio::time::timeout(timeout, Client::connect(&info, &dial, &pins)).await {
                Ok(Ok(c)) => break c,
                Ok(Err(e)) => {
                    let e = one_line(&e.to_string());
                    if !poll
                        .wait(&format!("ssh to {} not ready: {e}", info.id))
                        .await
                    {
                        return Verdict::Fail(format!(
                            "no SSH login within {}: {e}",
                            go_duration(timeout)
                        ));
                    }
                }
                Err(_) => {
                    return Verdict::Fail(format!(
                        "SSH connect did not finish within {}",
                        go_duration(timeout)
                    ));
                }
            }
        };
        let addr = client.addr().to_owned();
        let ran = tokio::time::timeout(
            timeout,
            client.run_capture(format!("echo {ECHO_TOKEN}"), Vec::new()),
        )
        .await;
        client.close().await;
        match ran {
            Ok(Ok((status, out, _))) if status.success() => {
                let out = String::from_utf8_lossy(&out);
                if out.trim() == ECHO_TOKEN {
                    Verdict::Pass(format!(
                        "logged in as {}@{addr}, `echo {ECHO_TOKEN}` printed it back",
                        info.connector.username
                    ))
                } else {
                    Verdict::Fail(format!("`echo {ECHO_TOKEN}` printed {:?}", one_line(&out)))
                }
            }
            Ok(Ok((status, _, err))) => Verdict::Fail(format!(
                "`echo` on {addr} ended with {status}: {}",
                one_line(&String::from_utf8_lossy(&err))
            )),
            Ok(Err(e)) => Verdict::Fail(format!("running echo on {addr}: {e}")),
            Err(_) => Verdict::Fail(format!(
                "`echo` on {addr} did not finish within {}",
                go_duration(timeout)
            )),
        }
    }

    pub(super) async fn heartbeat(&mut self) -> Verdict {
        let (host, id) = match self.instance() {
            Ok(v) => v,
            Err(v) => return v,
        };
        match self.call("Heartbeat", host.heartbeat(&id)).await {
            Ok(()) => Verdict::Pass(format!("instance {id} healthy")),
            Err(e) => Verdict::Fail(e),
        }
    }

    /// SIGKILL the plugin; the host restarts it and re-sends the good Init; the instance must
    /// still be listed (state survives a restart, without booting anything again).
    pub(super) async fn restart(&mut self) -> Verdict {
        let (host, id) = match self.instance() {
            Ok(v) => v,
            Err(v) => return v,
        };
        let Some(old) = host.pid() else {
            return Verdict::Fail("the plugin process is not running".into());
        };
        let restarts = host.restarts();
        let Ok(raw) = i32::try_from(old) else {
            return Verdict::Fail(format!("pid {old} out of range"));
        };
        if let Err(e) = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(raw),
            nix::sys::signal::Signal::SIGKILL,
        ) {
            return Verdict::Fail(format!("SIGKILL of pid {old}: {e}"));
        }
        progress(format_args!(
            "killed plugin pid {old}; waiting for the host to restart it and re-send Init"
        ));
        // Update waits for the restart (host call_wait = timeout) and retries on the new process.
        let timeout = self.opts.timeout;
        let mut poll = Poll::new(timeout);
        loop {
            let list = match self.call("Update after the restart", host.update()).await {
                Ok(l) => l,
                Err(e) => return Verdict::Fail(e),
            };
            let new_pid = host.pid();
            if host.restarts() == restarts || new_pid == Some(old) {
                // Answered by the old connection before the death was noticed: ask again.
                if !poll.wait("plugin restart").await {
                    return Verdict::Fail(format!(
                        "the host did not restart the plugin within {}",
                        go_duration(timeout)
                    ));
                }
                continue;
            }
            let new_pid = new_pid.map_or_else(|| "?".to_owned(), |p| p.to_string());
            match list.iter().find(|(i, _)| *i == id).map(|(_, s)| *s) {
                Some(State::Running) => {
                    return Verdict::Pass(format!(
                        "killed pid {old}; restarted as pid {new_pid}, Init re-sent; Update \
                         lists {id} running"
                    ));
                }
                None => {
                    // Nothing left to delete through the plugin; a cloud machine may be leaked.
                    self.instance = None;
                    self.created.remove(&id);
                    progress(format_args!(
                        "the plugin forgot instance {id}: if it is a real machine, delete it by hand"
                    ));
                    return Verdict::Fail(format!(
                        "{id} not listed after the restart (pid {old} killed, now {new_pid}): \
                         the plugin lost its instances; keep state on disk or ask the provider"
                    ));
                }
                Some(s @ (State::Creating | State::Timeout | State::Deleting | State::Deleted)) => {
                    if matches!(s, State::Timeout | State::Deleting | State::Deleted)
                        || !poll.wait(&format!("{id} {s} after the restart")).await
                    {
                        return Verdict::Fail(format!(
                            "after the restart Update lists {id} as {s}, not running"
                        ));
                    }
                }
            }
        }
    }

    pub(super) async fn unknown_ids(&mut self) -> Verdict {
        let host = match self.ready() {
            Ok(h) => h,
            Err(v) => return v,
        };
        let fake = format!("slipway-check-no-such-instance-{}", std::process::id());
        let restarts = host.restarts();
        let mut problems = Vec::new();
        let mut seen = Vec::new();
        let ci = self
            .call("ConnectInfo", async {
                host.connect_info(&fake).await.map(|_| ())
            })
            .await;
        let hb = self.call("Heartbeat", host.heartbeat(&fake)).await;
        for (what, r) in [("ConnectInfo", ci), ("Heartbeat", hb)] {
            match r {
                Ok(()) => problems.push(format!("{what} of unknown id {fake} succeeded")),
                Err(e) if e.contains("Unavailable") || e.contains("no answer") => problems.push(e),
                Err(e) if e.contains("NotFound") => seen.push(format!("{what}: NotFound")),
                Err(e) => seen.push(format!("{what}: {} (NotFound preferred)", error_kind(&e))),
            }
        }
        match self
            .call("Decrease", host.decrease(std::slice::from_ref(&fake)))
            .await
        {
            Ok(ids) if ids.contains(&fake) => {
                problems.push(format!("Decrease reported unknown id {fake} as deleted"));
            }
            Ok(_) => seen.push("Decrease: not reported deleted".to_owned()),
            Err(e) if e.contains("Unavailable") || e.contains("no answer") => problems.push(e),
            Err(e) => seen.push(format!("Decrease: {}", error_kind(&e))),
        }
        if host.restarts() != restarts {
            problems.push("the plugin process died during these calls".to_owned());
        }
        if problems.is_empty() {
            Verdict::Pass(seen.join(", "))
        } else {
            Verdict::Fail(problems.join("; "))
        }
    }

    pub(super) async fn decrease(&mut self) -> Verdict {
        let (host, id) = match self.instance() {
            Ok(v) => v,
            Err(v) => return v,
        };
        match self
            .call("Decrease", host.decrease(std::slice::from_ref(&id)))
            .await
        {
            Ok(ids) if ids.contains(&id) => {}
            Ok(ids) => {
                return Verdict::Fail(format!(
                    "Decrease([{id}]) did not accept it (returned {ids:?})"
                ));
            }
            Err(e) => return Verdict::Fail(e),
        }
        let timeout = self.opts.timeout;
        progress(format_args!(
            "waiting up to {} for instance {id} to be gone",
            go_duration(timeout)
        ));
        match self.wait_gone(std::slice::from_ref(&id)).await {
            Ok(took) => {
                self.created.remove(&id);
                self.instance = None;
                Verdict::Pass(format!(
                    "instance {id} gone after {} (timeout {})",
                    go_duration(took),
                    go_duration(timeout)
                ))
            }
            Err(e) => Verdict::Fail(e),
        }
    }

    /// Poll `Update` until none of `ids` is listed (or each is `deleted`).
    pub(super) async fn wait_gone(&self, ids: &[String]) -> Result<Duration, String> {
        let host = self
            .host
            .clone()
            .ok_or_else(|| "the plugin is not running".to_owned())?;
        let start = Instant::now();
        let mut poll = Poll::new(self.opts.timeout);
        loop {
            let list = self.call("Update", host.update()).await?;
            let left: Vec<String> = list
                .iter()
                .filter(|(i, s)| ids.contains(i) && *s != State::Deleted)
                .map(|(i, s)| format!("{i} {s}"))
                .collect();
            if left.is_empty() {
                return Ok(start.elapsed());
            }
            let left = left.join(", ");
            if !poll.wait(&format!("still listed: {left}")).await {
                return Err(format!(
                    "still listed after {}: {left}",
                    go_duration(self.opts.timeout)
                ));
            }
        }
    }
}

/// Growing pauses between polls under one deadline, with a progress line now and then.
struct Poll {
    deadline: Instant,
    delay: Duration,
    started: Instant,
    last_report: Instant,
}

impl Poll {
    fn new(timeout: Duration) -> Poll {
        let now = Instant::now();
        Poll {
            deadline: now + timeout,
            delay: Duration::from_millis(100),
            started: now,
            last_report: now,
        }
    }

    /// Sleep before the next poll; false once the deadline has passed.
    async fn wait(&mut self, status: &str) -> bool {
        let now = Instant::now();
        if now >= self.deadline {
            return false;
        }
        if now.duration_since(self.last_report) >= PROGRESS_EVERY {
            self.last_report = now;
            progress(format_args!(
                "still waiting ({} of {}): {status}",
                go_duration(now.duration_since(self.started)),
                go_duration(self.deadline.duration_since(self.started))
            ));
        }
        tokio::time::sleep(self.delay.min(self.deadline - now)).await;
        self.delay = (self.delay * 2).min(POLL_MAX);
        true
    }
}

/// `InvalidArgument` out of `Call: InvalidArgument: ...`
/// (see [`describe`](super::checks::describe)).
fn error_kind(e: &str) -> &str {
    e.split(": ").nth(1).unwrap_or(e)
}
