//! The status page of a running `slipway run`, in a real browser (headless Chromium), against
//! its own JSON (`/api/v1/status`), and `slipway status` reading the same.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{World, stop_manager, wait_until};
use slipway_status::FleetStatus;

/// Four slots on two instances, eight jobs: one fails at once, four hold the slots, three stay
/// in the queue (a runner takes a job once it has capacity for it).
const PIPELINE: &str = r#"
broken:
  stage: test
  script: ["echo about to fail", "exit 3"]
build:
  stage: build
  script: ["echo building", "sleep 600"]
test-a:
  stage: test
  script: ["sleep 600"]
test-b:
  stage: test
  script: ["sleep 600"]
deploy:
  stage: deploy
  script: ["sleep 600"]
late:
  stage: deploy
  script: ["sleep 600"]
queued-1:
  stage: deploy
  script: ["sleep 600"]
queued-2:
  stage: deploy
  script: ["sleep 600"]
"#;

fn config(w: &World, port: u16, name: &str, extra: &str) -> PathBuf {
    w.write(
        "config.toml",
        &format!(
            r#"
concurrent = 6
listen_address = "127.0.0.1:{port}"
[status_page]
  history_interval = "1s"
{extra}
[[runners]]
  name = "fleet"
  executor = "instance"
{}"#,
            common::local_autoscaler_of(w, name, 2),
        ),
    )
}

/// `GET path` with extra header lines: the status code and body.
fn http(port: u16, path: &str, headers: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{headers}\r\n"
    )
    .expect("send");
    let mut out = String::new();
    conn.read_to_string(&mut out).expect("read");
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

fn api(port: u16, headers: &str) -> FleetStatus {
    let (code, body) = http(port, "/api/v1/status", headers);
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// Start the manager and queue [`PIPELINE`]; returns once the API shows four jobs on slots,
/// one waiting and the failed one ended.
fn fleet_in_flight(w: &World, cfg: &Path, port: u16, headers: &str) -> Child {
    let child = w
        .slipway(&["run", "-c", cfg.to_str().expect("cfg")])
        .spawn()
        .expect("spawn");
    let pipeline = w.write("pipeline.yml", PIPELINE);
    let submitted = w.run(&[
        "submit",
        "-c",
        cfg.to_str().expect("cfg"),
        pipeline.to_str().expect("pipeline"),
    ]);
    assert_eq!(submitted.code, Some(0), "{}", submitted.stderr);
    let settled = wait_until(Duration::from_secs(120), || {
        let up = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
        if !up {
            return false;
        }
        let s = api(port, headers);
        let r = &s.runners[0];
        r.totals.running == 4
            && r.pending.is_empty()
            && r.recent.len() == 1
            && s.queue.as_ref().is_some_and(|q| q.pending == 3)
    });
    assert!(
        settled,
        "the fleet never settled: {:?}",
        std::net::TcpStream::connect(("127.0.0.1", port))
            .is_ok()
            .then(|| api(port, headers))
    );
    child
}

/// What a page or an API answer shows: (instance, slot, job) triples, pending and ended jobs.
#[derive(Debug, Default, PartialEq, Eq)]
struct Shown {
    instances: BTreeSet<String>,
    slots: BTreeSet<(String, u32, Option<u64>)>,
    pending: BTreeSet<u64>,
    queued: BTreeSet<u64>,
    recent: BTreeSet<(u64, String)>,
}

fn shown_by_api(s: &FleetStatus) -> Shown {
    let mut out = Shown::default();
    for r in &s.runners {
        for sh in &r.shapes {
            for i in &sh.instances {
                out.instances.insert(i.id.clone());
                for sl in &i.slots {
                    out.slots
                        .insert((i.id.clone(), sl.slot, sl.job.as_ref().map(|j| j.id)));
                }
            }
        }
        out.pending.extend(r.pending.iter().map(|p| p.id));
        if let Some(q) = &s.queue {
            out.queued.extend(q.jobs.iter().map(|p| p.id));
        }
        out.recent
            .extend(r.recent.iter().map(|j| (j.id, j.outcome.clone())));
    }
    out
}

fn shown_by_dom(dom: &str) -> Shown {
    let re = |p: &str| regex::Regex::new(p).unwrap();
    // The page's own script holds the same markup as string pieces.
    let dom = re(r"(?s)<script>.*?</script>").replace_all(dom, "");
    let dom = dom.as_ref();
    let mut out = Shown::default();
    let row = re(r#"(?s)<tr class="instance" data-instance="([^"]+)".*?</tr>"#);
    let slot = re(r#"data-slot="(\d+)"(?: data-job="(\d+)")?"#);
    for m in row.captures_iter(dom) {
        let id = m[1].to_string();
        out.instances.insert(id.clone());
        for s in slot.captures_iter(&m[0]) {
            out.slots.insert((
                id.clone(),
                s[1].parse().unwrap(),
                s.get(2).map(|j| j.as_str().parse().unwrap()),
            ));
        }
    }
    let table = |class: &str| -> String {
        re(&format!(r#"(?s)<table class="{class}">.*?</table>"#))
            .find_iter(dom)
            .map(|m| m.as_str().to_string())
            .collect()
    };
    let job = re(r#"<tr data-job="(\d+)""#);
    for c in job.captures_iter(&table("pending")) {
        out.pending.insert(c[1].parse().unwrap());
    }
    for c in job.captures_iter(&table("queued")) {
        out.queued.insert(c[1].parse().unwrap());
    }
    let ended = re(r#"<tr data-job="(\d+)" data-outcome="(\w+)""#);
    for c in ended.captures_iter(&table("recent")) {
        out.recent.insert((c[1].parse().unwrap(), c[2].to_string()));
    }
    out
}

/// Headless Chromium with a profile of its own under the world's directory.
fn chromium(w: &World, args: &[&str], url: &str) -> String {
    let profile = w.path().join("chromium-profile");
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .expect("chromium (Debian's chromium package; `make test` installs it)");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn attr(dom: &str, name: &str) -> String {
    regex::Regex::new(&format!(r#"<body[^>]* {name}="([^"]*)""#))
        .unwrap()
        .captures(dom)
        .map(|c| c[1].to_string())
        .unwrap_or_else(|| panic!("no {name} on <body> in:\n{dom}"))
}

/// Where screenshots go for a person to look at: the workspace's `target/`.
fn screenshot_path() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    std::fs::create_dir_all(&target).expect("target dir");
    target.join("status-page.png")
}

#[test]
fn the_page_in_a_browser_shows_what_the_api_reports_and_refreshes() {
    let w = World::new();
    let port = common::free_port();
    let cfg = config(&w, port, "page", "");
    let child = fleet_in_flight(&w, &cfg, port, "");
    let url = format!("http://127.0.0.1:{port}/");

    // The jobs sleep for minutes: what the API says holds while the browser looks.
    let before = api(port, "");
    let expected = shown_by_api(&before);
    assert_eq!(expected.instances.len(), 2, "{before:?}");
    assert_eq!(
        expected.slots.iter().filter(|s| s.2.is_some()).count(),
        4,
        "{before:?}"
    );
    assert_eq!(expected.recent.len(), 1);
    assert_eq!(expected.queued, BTreeSet::from([6, 7, 8]), "{before:?}");
    let waited = &before.queue.as_ref().unwrap().jobs[0];
    assert_eq!((waited.id, waited.name.as_str()), (6, "late"));
    assert!(waited.wait_s > 0.0, "{waited:?}");
    assert!(expected.recent.contains(&(1, "failed".to_string())));
    let broken = &before.runners[0].recent[0];
    assert_eq!(broken.failure_reason.as_deref(), Some("script_failure"));
    assert_eq!(broken.exit_code, Some(3));

    // As the server rendered it: the HTML itself, and the DOM the browser made of it at
    // load, before the script's first refresh.
    let (code, html) = http(port, "/", "");
    assert_eq!(code, 200);
    assert_eq!(shown_by_dom(&html), expected, "server-rendered HTML");
    let plain = chromium(&w, &["--dump-dom"], &url);
    assert_eq!(shown_by_dom(&plain), expected, "server-rendered page");
    assert_eq!(attr(&plain, "data-refreshes"), "0");
    assert!(plain.contains("0 pending · 3 queued"), "{plain}");

    // With its script: refreshed from /api/v1/status at least twice (every 2 s of the page's
    // own clock), showing the same fleet.
    let live = chromium(&w, &["--virtual-time-budget=7000", "--dump-dom"], &url);
    let refreshes: u32 = attr(&live, "data-refreshes").parse().unwrap();
    assert!(refreshes >= 2, "refreshed {refreshes} times:\n{live}");
    assert_eq!(shown_by_dom(&live), expected, "page after its refreshes");
    let after = api(port, "");
    let generated: i64 = attr(&live, "data-generated").parse().unwrap();
    assert!(
        generated > before.generated_at_ms && generated <= after.generated_at_ms,
        "the page shows an answer made while it ran ({} < {generated} <= {})",
        before.generated_at_ms,
        after.generated_at_ms
    );
    // The charts come from the history ring (sampled every second here).
    assert!(after.history.t_ms.len() >= 2, "{:?}", after.history);
    assert!(after.history.busy_slots.contains(&4), "{:?}", after.history);
    for series in ["instances", "busy_slots", "queue_depth", "p95_wait_s"] {
        assert!(
            live.contains(&format!("data-series=\"{series}\"")),
            "no {series} chart"
        );
    }

    // A picture for a person.
    let shot = screenshot_path();
    let _ = std::fs::remove_file(&shot);
    chromium(
        &w,
        &[
            "--window-size=1280,1100",
            "--virtual-time-budget=3000",
            &format!("--screenshot={}", shot.display()),
        ],
        &url,
    );
    let png = std::fs::read(&shot).expect("screenshot written");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{}",
        png.len()
    );

    // The terminal's view of the same fleet.
    let status = w.run(&["status", "-c", cfg.to_str().expect("cfg")]);
    assert_eq!(status.code, Some(0), "{}", status.stderr);
    for i in &expected.instances {
        assert!(status.stdout.contains(i.as_str()), "{}", status.stdout);
    }
    for needle in [
        "4/4 slots busy",
        "0 pending · 3 queued",
        "#1 broken (test) failed",
        "script_failure",
        "build (none,",
        "queue: 3 jobs waiting for a runner",
        "#6 late (deploy) queued",
        "#8 queued-2 (deploy) queued",
    ] {
        assert!(
            status.stdout.contains(needle),
            "no {needle:?} in:\n{}",
            status.stdout
        );
    }

    stop_manager(&w, child);
}

#[test]
fn a_token_guards_the_page_and_its_json_but_not_metrics() {
    let w = World::new();
    let port = common::free_port();
    let token = format!("st-{}-secret", std::process::id());
    let cfg = config(&w, port, "token", &format!("  token = \"{token}\""));
    let child = w
        .slipway(&["run", "-c", cfg.to_str().expect("cfg")])
        .spawn()
        .expect("spawn");
    assert!(wait_until(Duration::from_secs(60), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    }));

    for path in ["/", "/api/v1/status"] {
        let (code, body) = http(port, path, "");
        assert_eq!(code, 401, "{path}: {body}");
        let (code, _) = http(port, path, "Authorization: Bearer wrong\r\n");
        assert_eq!(code, 401, "{path} with a wrong token");
        let (code, body) = http(port, path, &format!("Authorization: Bearer {token}\r\n"));
        assert_eq!(code, 200, "{path}");
        assert!(!body.contains(&token), "{path} shows the token");
        let (code, _) = http(port, &format!("{path}?token={token}"), "");
        assert_eq!(code, 200, "{path}?token=");
    }
    // A browser's Basic auth: any user, the token as password.
    let basic = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(format!("ops:{token}"))
    };
    let (code, _) = http(port, "/", &format!("Authorization: Basic {basic}\r\n"));
    assert_eq!(code, 200);
    // Prometheus scrapes without one, as it does GitLab Runner.
    let (code, metrics) = http(port, "/metrics", "");
    assert_eq!(code, 200);
    assert!(
        metrics.contains("slipway_taskscaler_instances"),
        "{metrics}"
    );

    // `slipway status` presents the config's token; a config with another is told so.
    let ok = w.run(&["status", "-c", cfg.to_str().expect("cfg")]);
    assert_eq!(ok.code, Some(0), "{}", ok.stderr);
    assert!(ok.stdout.contains("runner \"fleet\""), "{}", ok.stdout);
    let text = std::fs::read_to_string(&cfg).unwrap();
    let other = w.write("other.toml", &text.replace(&token, "not-the-token"));
    let refused = w.run(&["status", "-c", other.to_str().expect("cfg")]);
    assert_ne!(refused.code, Some(0));
    assert!(
        refused.stderr.contains("wants a token") && !refused.stderr.contains(&token),
        "{}",
        refused.stderr
    );
    let json = w.run(&["status", "--json", "-c", cfg.to_str().expect("cfg")]);
    let parsed: FleetStatus = serde_json::from_str(json.stdout.trim()).expect("--json");
    assert_eq!(parsed.runners[0].name, "fleet");

    stop_manager(&w, child);
}

#[test]
fn status_without_a_listen_address_says_what_to_set() {
    let w = World::new();
    let cfg = w.write(
        "config.toml",
        "[[runners]]\n  name = \"x\"\n  executor = \"shell\"\n",
    );
    let r = w.run(&["status", "-c", cfg.to_str().expect("cfg")]);
    assert_ne!(r.code, Some(0));
    assert!(
        r.stderr.contains("listen_address is not set"),
        "{}",
        r.stderr
    );
}
