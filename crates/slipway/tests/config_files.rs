//! `slipway verify-config` on real-world config.toml files (examples/config/) and on a broken
//! one: every problem in one run, with its line; tokens never printed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Run, World};

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/config")
        .join(name)
}

/// `slipway verify-config -c path`, with no plugin dir and an empty PATH so that no fleeting
/// plugin is found, whatever this machine has installed. The binary runs from a directory of its
/// own: the plugins this workspace builds sit next to it in `target/` and would be found there.
fn verify(w: &World, path: &Path) -> Run {
    verify_with(w, path, None)
}

/// [`verify`], with `plugin_dir` given as `SLIPWAY_PLUGIN_DIR`.
fn verify_with(w: &World, path: &Path, plugin_dir: Option<&Path>) -> Run {
    let bin_dir = w.path().join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let slipway = bin_dir.join("slipway");
    if !slipway.exists() && std::fs::hard_link(common::slipway(), &slipway).is_err() {
        std::fs::copy(common::slipway(), &slipway).unwrap();
    }
    let mut cmd = Command::new(&slipway);
    cmd.args(["verify-config", "-c"])
        .arg(path)
        .env("TMPDIR", w.tmp())
        .env("PATH", w.path().join("empty-path"))
        .env("FLEETING_PLUGIN_PATH", w.path().join("no-fleeting-plugins"))
        .env_remove("SLIPWAY_PLUGIN_DIR")
        .env_remove("RUST_LOG");
    if let Some(dir) = plugin_dir {
        cmd.env("SLIPWAY_PLUGIN_DIR", dir);
    }
    Run::from(cmd.output().expect("run slipway"))
}

fn lines(run: &Run, kind: &str) -> Vec<String> {
    let prefix = format!("{kind}: ");
    run.stderr
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(str::to_string)
        .collect()
}

/// Every warning is one of `expected` (substrings), or an unknown `[runners.docker]` key of
/// GitLab's that Slipway does not read; each expected one appears.
fn assert_warnings(run: &Run, expected: &[&str]) {
    let warnings = lines(run, "warning");
    for e in expected {
        assert!(
            warnings.iter().any(|w| w.contains(e)),
            "missing warning {e:?}\n{}",
            run.explain()
        );
    }
    for w in &warnings {
        let docker_key = w.contains(".docker.") && w.ends_with("unknown key, ignored");
        assert!(
            docker_key || expected.iter().any(|e| w.contains(e)),
            "unexpected warning {w:?}\n{}",
            run.explain()
        );
    }
}

fn assert_clean(run: &Run, file: &Path) {
    assert_eq!(run.code, Some(0), "{}", run.explain());
    assert!(lines(run, "error").is_empty(), "{}", run.explain());
    let summary = format!("{}: valid", file.display());
    assert!(run.stdout.contains(&summary), "{}", run.explain());
    assert!(
        !run.stdout.contains("glrt-") && !run.stderr.contains("glrt-"),
        "{}",
        run.explain()
    );
}

#[test]
fn shell_example_is_clean() {
    let w = World::new();
    let file = example("shell.toml");
    let run = verify(&w, &file);
    assert_clean(&run, &file);
    assert_warnings(&run, &[]);
    assert!(run.stdout.contains("valid (1 runner)"), "{}", run.explain());
}

#[test]
fn docker_example_loads_with_expected_warnings() {
    let w = World::new();
    let file = example("docker.toml");
    let run = verify(&w, &file);
    assert_clean(&run, &file);
    assert_warnings(
        &run,
        &[
            "docker.toml:75: runners[1].autoscaler.plugin: \"aws\" is not installed here (slipway looks where `gitlab-runner fleeting install` puts plugins, then for fleeting-plugin-aws",
        ],
    );
    // GitLab Runner's S3 cache is taken as it is, and its credentials are never echoed.
    assert!(
        !run.stderr.contains("runners[0].cache"),
        "{}",
        run.explain()
    );
    for secret in ["AKIAEXAMPLEACCESSKEY", "EXAMPLEsecretKEY"] {
        assert!(
            !run.stdout.contains(secret) && !run.stderr.contains(secret),
            "{}",
            run.explain()
        );
    }
}

#[test]
fn instance_example_loads_with_expected_warnings() {
    let w = World::new();
    let file = example("instance.toml");
    let run = verify(&w, &file);
    assert_clean(&run, &file);
    assert_warnings(
        &run,
        &[
            "instance.toml:26: runners[0].autoscaler.plugin: \"gitlab-org/fleeting/plugins/aws:1\" is not installed here (slipway looks where `gitlab-runner fleeting install` puts plugins, then for fleeting-plugin-aws",
            "instance.toml:69: runners[1].custom.prepare_exec: file \"/opt/libvirt-driver/prepare.sh\" does not exist on this machine",
            "instance.toml:70: runners[1].custom.run_exec: file",
            "instance.toml:71: runners[1].custom.cleanup_exec: file",
        ],
    );
}

#[test]
fn vm_example_is_clean_and_a_bad_nesting_config_is_an_error() {
    let w = World::new();
    let file = example("vm.toml");
    let run = verify_with(&w, &file, Some(&common::plugin_dir()));
    assert_clean(&run, &file);
    assert_warnings(&run, &[]);
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("hypervisor = \"qemu\"", "hypervisor = \"xen\"")
        .replace(
            "nesting_host = \"unix:///run/slipway/nesting.sock\"",
            "nesting_host = \"tcp://10.0.0.1:9000\"",
        );
    let bad = w.write("vm.toml", &text);
    let run = verify(&w, &bad);
    assert_eq!(run.code, Some(1), "{}", run.explain());
    let errors = lines(&run, "error").join("\n");
    assert!(
        errors.contains("runners[0].autoscaler.vm_isolation.nesting_config: nesting config: hypervisor: unknown variant `xen`"),
        "{}",
        run.explain()
    );
    assert!(
        errors.contains("runners[0].autoscaler.vm_isolation.nesting_host: expected unix:///path/to/nesting.sock on the instance, got \"tcp://10.0.0.1:9000\""),
        "{}",
        run.explain()
    );
}

#[test]
fn an_installed_plugin_is_not_warned_about() {
    let w = World::new();
    let dir = w.path().join("plugins");
    std::fs::create_dir_all(&dir).unwrap();
    let plugin = dir.join("fleeting-plugin-aws");
    std::fs::write(&plugin, "#!/bin/sh\n").unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(common::slipway())
        .args(["verify-config", "--plugin-dir"])
        .arg(&dir)
        .arg("-c")
        .arg(example("docker.toml"))
        .env("PATH", w.path().join("empty-path"))
        .output()
        .expect("run slipway");
    let run = Run::from(out);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    assert!(!run.stderr.contains("not installed"), "{}", run.explain());
}

#[test]
fn a_plugin_gitlab_runner_installed_is_found_where_it_put_it() {
    let w = World::new();
    let root = w.path().join("fleeting-plugins");
    // `gitlab-runner fleeting install` lays plugins out by registry, repository, name, version.
    for version in ["1.0.0", "1.3.1", "2.0.0"] {
        let dir = root
            .join("registry.gitlab.com/gitlab-org/fleeting/plugins/aws")
            .join(version);
        std::fs::create_dir_all(&dir).unwrap();
        let plugin = dir.join("plugin");
        std::fs::write(&plugin, "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for example_file in ["docker.toml", "instance.toml"] {
        let out = Command::new(common::slipway())
            .args(["verify-config", "-c"])
            .arg(example(example_file))
            .env("PATH", w.path().join("empty-path"))
            .env("FLEETING_PLUGIN_PATH", &root)
            .env_remove("SLIPWAY_PLUGIN_DIR")
            .output()
            .expect("run slipway");
        let run = Run::from(out);
        assert_eq!(run.code, Some(0), "{}", run.explain());
        assert!(!run.stderr.contains("not installed"), "{}", run.explain());
    }
}

const BROKEN: &str = r#"# Four problems, and a token that must never be printed.
concurrent = "ten"

[[runners]]
  name = "broken"
  url = "https://gitlab.example.com"
  token = "glrt-t1_SUPERsecretTOKENvalue123"
  executor = "docker-autoscaler"
  limit = "four"
  colour = "blue"
  [runners.docker]
    image = "alpine"
  [runners.autoscaler]
    plugin = "fleeting-plugin-aws"
    capacity_per_instance = 0
    [runners.autoscaler.connector_config]
      password = 1234567890
"#;

#[test]
fn broken_config_reports_every_problem_with_its_line() {
    let w = World::new();
    let file = w.write("config.toml", BROKEN);
    let run = verify(&w, &file);
    assert_eq!(run.code, Some(1), "{}", run.explain());
    let f = file.display().to_string();
    let errors = lines(&run, "error");
    let expect_errors = [
        format!("{f}:2: concurrent: invalid type: string \"ten\", expected u32"),
        format!("{f}:9: runners[0].limit: invalid type: string \"four\", expected u32"),
        format!("{f}:15: runners[0].autoscaler.capacity_per_instance: must be at least 1"),
        format!(
            "{f}:17: runners[0].autoscaler.connector_config.password: invalid type (value not shown), expected a string"
        ),
    ];
    assert_eq!(errors, expect_errors, "{}", run.explain());
    let warnings = lines(&run, "warning");
    assert!(
        warnings.contains(&format!("{f}:10: runners[0].colour: unknown key, ignored")),
        "{}",
        run.explain()
    );
    assert!(
        run.stdout
            .contains(&format!("{f}: 4 errors, {} warning", warnings.len())),
        "{}",
        run.explain()
    );
}

#[test]
fn tokens_never_appear_in_output_of_a_config_full_of_errors() {
    let w = World::new();
    let token = "glrt-t1_TopSecretRunnerToken42";
    let text = format!(
        r#"concurrent = "{token}"
check_interval = [1, 2]
sentry_dsn = "https://{token}@sentry.example.com/1"

[[runners]]
  name = "{token}x"
  token = ["{token}"]
  tokne = "{token}"
  executor = "{token}"
  shell = "{token}"
  environment = ["GITLAB_TOKEN={token}", "{token}"]
  tls-ca-file = "/{token}"
  [runners.cache]
    Type = "{token}"
    [runners.cache.s3]
      SecretKey = 12
      AccessKey = "{token}"
  [runners.autoscaler]
    plugin = 5
    [runners.autoscaler.connector_config]
      password = {{ value = "{token}" }}

[[runners]]
  token = 4242424242
  executor = "shell"
  limit = 4242424242
"#
    );
    let file = w.write("config.toml", &text);
    let run = verify(&w, &file);
    assert_eq!(run.code, Some(1), "{}", run.explain());
    assert!(lines(&run, "error").len() >= 8, "{}", run.explain());
    for secret in [token, "TopSecretRunnerToken", "4242424242"] {
        assert!(
            !run.stdout.contains(secret) && !run.stderr.contains(secret),
            "{secret} printed:\n{}",
            run.explain()
        );
    }
}
