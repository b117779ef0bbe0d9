//! `slipway list`, `verify [--delete]` and `unregister` against the GitLab test server: the
//! runners config.toml names, checked with GitLab, removed from GitLab and from the file (the
//! rest of the file kept as written), and tokens never printed whole.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Run, World};
use slipway_testkit::gitlab::{FakeGitlab, REGISTRATION_TOKEN};

const DEAD_TOKEN: &str = "glrt-t1_NoLongerKnownToGitLab0";

fn slipway(w: &World, args: &[&str]) -> Run {
    let out = w.slipway(args).output().expect("run slipway");
    Run::from(out)
}

fn assert_no_token(run: &Run, tokens: &[&str]) {
    for t in tokens {
        assert!(
            !run.stdout.contains(t) && !run.stderr.contains(t),
            "full token printed:\n{}",
            run.explain()
        );
    }
}

/// The `name`s of the file's `[[runners]]`.
fn names(w: &World) -> Vec<String> {
    let text = w.read("config.toml");
    let doc: toml::Table = text.parse().unwrap();
    doc.get("runners")
        .and_then(toml::Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|r| r.get("name")?.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runners_are_listed_verified_and_unregistered() {
    let w = World::new();
    let gl = FakeGitlab::start().await;
    let cfg = w.path().join("config.toml");
    let c = cfg.to_str().unwrap();
    let url = gl.url();
    // One registered the legacy way, one created in GitLab's UI, one GitLab forgot.
    let legacy = slipway(
        &w,
        &[
            "register",
            "-c",
            c,
            "--url",
            &url,
            "--registration-token",
            REGISTRATION_TOKEN,
            "--name",
            "legacy",
            "--executor",
            "shell",
        ],
    );
    assert_eq!(legacy.code, Some(0), "{}", legacy.explain());
    let ui_token = gl.runner_token();
    let ui = slipway(
        &w,
        &[
            "register",
            "-c",
            c,
            "--url",
            &url,
            "--token",
            &ui_token,
            "--name",
            "ui",
            "--executor",
            "shell",
        ],
    );
    assert_eq!(ui.code, Some(0), "{}", ui.explain());
    let text = format!(
        "# kept: an operator's note\n{}\n[[runners]]\n  name = \"dead\"\n  url = \"{url}\"\n  token = \"{DEAD_TOKEN}\"\n  executor = \"shell\"\n",
        w.read("config.toml")
    );
    std::fs::write(&cfg, text).unwrap();
    let legacy_token = {
        let doc: toml::Table = w.read("config.toml").parse().unwrap();
        doc["runners"][0]["token"].as_str().unwrap().to_string()
    };
    let tokens = [legacy_token.as_str(), ui_token.as_str(), DEAD_TOKEN];

    let list = slipway(&w, &["list", "-c", c]);
    assert_eq!(list.code, Some(0), "{}", list.explain());
    for name in ["legacy", "ui", "dead"] {
        assert!(
            list.stdout
                .lines()
                .any(|l| l.starts_with(name) && l.contains("shell") && l.contains(&url)),
            "{name} not listed:\n{}",
            list.stdout
        );
    }
    assert_no_token(&list, &tokens);

    // verify: the forgotten runner is named and kept until --delete.
    let check = slipway(&w, &["verify", "-c", c]);
    assert_eq!(check.code, Some(1), "{}", check.explain());
    assert!(
        check.stdout.contains("is removed runner=dead"),
        "{}",
        check.stdout
    );
    assert!(
        check.stdout.contains("is valid runner=legacy"),
        "{}",
        check.stdout
    );
    assert!(
        check.stdout.contains("is valid runner=ui"),
        "{}",
        check.stdout
    );
    assert_eq!(names(&w), ["legacy", "ui", "dead"]);
    let deleted = slipway(&w, &["verify", "--delete", "-c", c]);
    assert_eq!(deleted.code, Some(0), "{}", deleted.explain());
    assert_eq!(names(&w), ["legacy", "ui"]);
    assert!(
        w.read("config.toml")
            .starts_with("# kept: an operator's note\n")
    );
    assert_no_token(&deleted, &tokens);

    // unregister --name: a legacy runner is deleted in GitLab; its token is refused after.
    let none = slipway(&w, &["unregister", "-c", c, "--name", "nope"]);
    assert_ne!(none.code, Some(0));
    assert!(
        none.stderr.contains("no runner named \"nope\"")
            && none.stderr.contains("\"legacy\", \"ui\""),
        "{}",
        none.explain()
    );
    let one = slipway(&w, &["unregister", "-c", c, "--name", "legacy"]);
    assert_eq!(one.code, Some(0), "{}", one.explain());
    let deletes: Vec<_> = gl
        .requests_to("/api/v4/runners")
        .into_iter()
        .filter(|r| r.method == "DELETE")
        .collect();
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    assert_eq!(deletes[0].status, 204);
    assert_eq!(names(&w), ["ui"]);
    let gone = slipway(&w, &["verify", "-c", c]);
    assert!(
        gone.stdout.contains("is valid runner=ui"),
        "{}",
        gone.stdout
    );

    // unregister --all: a runner made in the UI loses this manager.
    let all = slipway(&w, &["unregister", "-c", c, "--all"]);
    assert_eq!(all.code, Some(0), "{}", all.explain());
    let managers = gl.requests_to("/api/v4/runners/managers");
    assert_eq!(managers.len(), 1, "{managers:?}");
    let body: serde_json::Value = serde_json::from_slice(&managers[0].body).unwrap();
    assert!(
        body["system_id"]
            .as_str()
            .is_some_and(|s| s.starts_with("s_")),
        "{body}"
    );
    assert!(names(&w).is_empty());
    assert!(
        w.read("config.toml")
            .starts_with("# kept: an operator's note\n")
    );
    assert_no_token(&all, &tokens);
}
