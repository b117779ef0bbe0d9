//! `slipway register` against a small GitLab stand-in: both registration flows, the file it
//! writes (mode 0600, comments kept, loads clean), and tokens kept out of its output.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use common::{Run, World};

const NEW_TOKEN: &str = "glrt-t1_NEWrunnerAUTHtoken0123456";
const UI_TOKEN: &str = "glrt-t1_UIcreatedRUNNERtoken98765";
const REGISTRATION_TOKEN: &str = "GR1348941registrationSECRET";

/// Requests the stand-in received: (path, JSON body).
type Seen = Arc<Mutex<Vec<(String, serde_json::Value)>>>;

/// GitLab's `POST /api/v4/runners` and `POST /api/v4/runners/verify`, on 127.0.0.1.
fn gitlab() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let state = seen.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let app = axum::Router::new()
                .route("/api/v4/runners", post(register))
                .route("/api/v4/runners/verify", post(verify))
                .with_state(state);
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    (url, seen)
}

fn record(seen: &Seen, path: &str, body: &Bytes) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap();
    seen.lock().unwrap().push((path.into(), v.clone()));
    v
}

async fn register(State(seen): State<Seen>, body: Bytes) -> (StatusCode, String) {
    let v = record(&seen, "runners", &body);
    if v["token"] != REGISTRATION_TOKEN {
        return (
            StatusCode::FORBIDDEN,
            r#"{"message":"403 Forbidden"}"#.into(),
        );
    }
    let answer = serde_json::json!({
        "id": 4711,
        "token": NEW_TOKEN,
        "token_expires_at": "2027-01-31T12:00:00.000Z",
    });
    (StatusCode::CREATED, answer.to_string())
}

async fn verify(State(seen): State<Seen>, body: Bytes) -> (StatusCode, String) {
    let v = record(&seen, "runners/verify", &body);
    if v["token"] != UI_TOKEN {
        return (
            StatusCode::FORBIDDEN,
            r#"{"message":"403 Forbidden"}"#.into(),
        );
    }
    let answer = serde_json::json!({ "id": 815, "token": UI_TOKEN, "token_expires_at": null });
    (StatusCode::OK, answer.to_string())
}

fn slipway(w: &World, args: &[&str]) -> Run {
    let out = Command::new(common::slipway())
        .args(args)
        .env("TMPDIR", w.tmp())
        .env("PATH", w.path().join("empty-path"))
        .env_remove("SLIPWAY_PLUGIN_DIR")
        .env_remove("RUST_LOG")
        .env_remove("CI_SERVER_URL")
        .env_remove("CI_SERVER_TOKEN")
        .env_remove("REGISTRATION_TOKEN")
        .output()
        .expect("run slipway");
    Run::from(out)
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn assert_no_token(run: &Run, token: &str) {
    assert!(
        !run.stdout.contains(token) && !run.stderr.contains(token),
        "full token printed:\n{}",
        run.explain()
    );
}

/// `slipway register -c config --url url` with `args`.
fn run_register(w: &World, config: &str, url: &str, args: &[&str]) -> Run {
    let mut all = vec!["register", "-c", config, "--url", url];
    all.extend_from_slice(args);
    slipway(w, &all)
}

fn verify_clean(w: &World, config: &str) -> Run {
    let run = slipway(w, &["verify-config", "-c", config]);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    assert!(!run.stderr.contains("error:"), "{}", run.explain());
    assert!(!run.stderr.contains("warning:"), "{}", run.explain());
    run
}

#[test]
fn legacy_registration_creates_a_private_config() {
    let w = World::new();
    let (url, seen) = gitlab();
    let config = w.path().join("config.toml");
    let cfg = config.display().to_string();
    let run = run_register(
        &w,
        &cfg,
        &url,
        &[
            "--registration-token",
            REGISTRATION_TOKEN,
            "--name",
            "legacy-1",
            "--executor",
            "shell",
            "--tag-list",
            "linux, big",
            "--run-untagged",
            "--description",
            "first runner",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.explain());
    assert!(run.stdout.contains("id 4711"), "{}", run.explain());
    assert!(
        run.stdout.contains("NEWrunner"),
        "short token shown:\n{}",
        run.explain()
    );
    assert_no_token(&run, NEW_TOKEN);
    assert_no_token(&run, REGISTRATION_TOKEN);

    let sent = seen.lock().unwrap().clone();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, "runners");
    assert_eq!(sent[0].1["tag_list"], serde_json::json!(["linux", "big"]));
    assert_eq!(sent[0].1["run_untagged"], true);
    assert_eq!(sent[0].1["description"], "first runner");

    assert_eq!(mode(&config), 0o600);
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(
        text.starts_with("concurrent = 1\ncheck_interval = 0\n"),
        "{text}"
    );
    assert!(text.contains(&format!("token = \"{NEW_TOKEN}\"")), "{text}");
    assert!(text.contains("id = 4711"), "{text}");
    assert!(
        text.contains("token_expires_at = 2027-01-31T12:00:00"),
        "{text}"
    );
    let run = verify_clean(&w, &cfg);
    assert_no_token(&run, NEW_TOKEN);
}

#[test]
fn token_registration_appends_and_keeps_the_file() {
    let w = World::new();
    let (url, seen) = gitlab();
    let original = "# Managed by hand: keep this comment.\nconcurrent = 4   # four at once\ncheck_interval = 0\n";
    let config = w.write("config.toml", original);
    let cfg = config.display().to_string();
    for name in ["ui-1", "ui-2"] {
        let run = run_register(
            &w,
            &cfg,
            &url,
            &[
                "--token",
                UI_TOKEN,
                "--name",
                name,
                "--executor",
                "docker",
                "--docker-image",
                "alpine:3.20",
            ],
        );
        assert_eq!(run.code, Some(0), "{}", run.explain());
        assert!(run.stdout.contains("id 815"), "{}", run.explain());
        assert_no_token(&run, UI_TOKEN);
    }
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.starts_with(original), "{text}");
    assert_eq!(text.matches("[[runners]]").count(), 2, "{text}");
    assert!(text.contains("name = \"ui-2\""), "{text}");
    assert!(text.contains("image = \"alpine:3.20\""), "{text}");
    // No expiry from GitLab: written as GitLab Runner does, the zero time.
    assert!(
        text.contains("token_expires_at = 0001-01-01T00:00:00Z"),
        "{text}"
    );
    assert_eq!(mode(&config), 0o600);

    // Both verifications came from one manager: the system_id `slipway run` uses.
    let sent = seen.lock().unwrap().clone();
    assert_eq!(sent.len(), 2);
    let ids: Vec<&str> = sent
        .iter()
        .map(|(_, b)| b["system_id"].as_str().unwrap())
        .collect();
    assert!(ids[0].starts_with("s_"), "{ids:?}");
    assert_eq!(ids[0], ids[1]);
    let stored = std::fs::read_to_string(w.path().join(".slipway-state/system_id")).unwrap();
    assert_eq!(stored.trim(), ids[0]);

    let run = verify_clean(&w, &cfg);
    assert!(
        run.stdout.contains("valid (2 runners)"),
        "{}",
        run.explain()
    );
}

#[test]
fn refused_tokens_say_so_and_write_nothing() {
    let w = World::new();
    let (url, _) = gitlab();
    let config = w.path().join("config.toml");
    let cfg = config.display().to_string();
    let register = |flag: &str, token: &str, extra: &[&str]| {
        let mut args = vec![flag, token, "--executor", "shell"];
        args.extend_from_slice(extra);
        run_register(&w, &cfg, &url, &args)
    };
    let refused = |run: &Run, says: &str, token: &str| {
        assert_ne!(run.code, Some(0), "{}", run.explain());
        assert!(run.stderr.contains(says), "{}", run.explain());
        assert_no_token(run, token);
    };

    let bad_registration = "GR1348941wrongWRONGwrong";
    let run = register("--registration-token", bad_registration, &[]);
    refused(
        &run,
        "GitLab refused the registration token (HTTP 403)",
        bad_registration,
    );

    let bad = "glrt-t1_notTHEtokenGITLABknows";
    let run = register("--token", bad, &[]);
    refused(
        &run,
        "GitLab refused the runner authentication token (HTTP 403)",
        bad,
    );
    assert!(!config.exists(), "nothing written after a refusal");

    // Options GitLab keeps with a UI-created runner are refused before any request.
    let run = register("--token", UI_TOKEN, &["--tag-list", "a"]);
    refused(&run, "--tag-list cannot be given with --token", UI_TOKEN);
}
