//! `config.toml` (`slipway_config::parse`) and the plugins' `plugin_config` JSON (the four
//! fleeting plugins' `Config::parse`, the nesting daemon's `Config::parse`), seeds mutated.

use std::sync::OnceLock;

use crate::mutate::{self, Mutated};

/// The input: a seed and edits.
pub type Input = Mutated;

fn toml_seeds() -> &'static Vec<Vec<u8>> {
    static SEEDS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let root = mutate::workspace_root();
        let mut out: Vec<Vec<u8>> =
            mutate::read_seeds(&root.join("examples"), &|n| n.ends_with(".toml"))
                .into_iter()
                .map(|(_, t)| t)
                .collect();
        if let Ok(t) = std::fs::read(root.join("crates/config/src/embedded.toml")) {
            out.push(t);
        }
        out.push(Vec::new());
        out
    })
}

/// `br#"{...}"#` literals of the plugins' and the nesting daemon's config tests, and `{}`.
fn json_seeds() -> &'static Vec<Vec<u8>> {
    static SEEDS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let root = mutate::workspace_root();
        let mut out = vec![b"{}".to_vec(), Vec::new()];
        for file in [
            "plugins/fleeting-plugin-aws/src/config.rs",
            "plugins/fleeting-plugin-local/src/config.rs",
            "plugins/fleeting-plugin-qemu/src/config.rs",
            "plugins/fleeting-plugin-static/src/config.rs",
            "crates/nesting/src/config.rs",
        ] {
            let Ok(text) = std::fs::read_to_string(root.join(file)) else {
                continue;
            };
            for part in text.split("r#\"").skip(1) {
                if let Some((lit, _)) = part.split_once("\"#")
                    && lit.trim_start().starts_with('{')
                {
                    out.push(lit.as_bytes().to_vec());
                }
            }
        }
        out
    })
}

/// TOML words and values the edits insert.
pub const TOML_DICT: &[&str] = &[
    "[[runners]]\n",
    "[runners.autoscaler]\n",
    "[runners.autoscaler.plugin_config]\n",
    "[[runners.autoscaler.policy]]\n",
    "[runners.docker]\n",
    "[runners.nesting]\n",
    "executor = \"shell\"",
    "executor = \"docker-autoscaler\"",
    "executor = \"nesting\"",
    "concurrent = 0",
    "concurrent = -1",
    "capacity_per_instance = 0",
    "max_use_count = -5",
    "max_instances = 18446744073709551615",
    "idle_count = 9999999999",
    "idle_time = \"x\"",
    "idle_time = \"20m\"",
    "periods = [\"* * * * *\"]",
    "periods = [\"bad cron\"]",
    "timezone = \"Mars/Olympus\"",
    "url = \"\"",
    "url = \"http://[::1\"",
    "token = \"\"",
    "plugin = \"../../bin/sh\"",
    "isolation = [\"vm\", \"none\"]",
    "builds_dir = \"../..\"",
    "= ",
    "\"",
    "'''",
    "\"\"\"",
    "[",
    "]",
    "{",
    "}",
    ",",
    "=",
    "\n",
    "#",
    "\\u0000",
    "\\",
    "1979-05-27T07:32:00Z",
    "inf",
    "nan",
    "0x7f",
    "1_000",
    "true",
    "[[",
    "]]",
    ".",
    "a.b.c = 1",
    "x = { y = { z = [ [ [] ] ] } }",
];

/// JSON words the edits insert.
pub const JSON_DICT: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    "\"",
    "null",
    "true",
    "-1",
    "1e400",
    "18446744073709551616",
    "\"name\":",
    "\"max_size\":",
    "\"dir\":",
    "\"hosts\":",
    "\"region\":",
    "\"endpoint_url\":",
    "\"provisioning_delay\":",
    "\"500ms\"",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "{\"a\":{\"b\":[]}}",
];

/// `slipway_config::parse`: a config, or errors each naming the file (and a key or line).
pub fn check(input: &Input) {
    let seeds: Vec<&[u8]> = toml_seeds().iter().map(Vec::as_slice).collect();
    let bytes = mutate::apply(&seeds, TOML_DICT, input);
    check_toml(&String::from_utf8_lossy(&bytes));
}

/// One `config.toml` text.
pub fn check_toml(text: &str) {
    const FILE: &str = "fuzz/config.toml";
    match slipway_config::parse(text, FILE) {
        Ok(loaded) => {
            for w in &loaded.warnings {
                assert_eq!(w.file, FILE, "a warning names another file: {w}");
            }
        }
        Err(slipway_config::ConfigError::Invalid(problems)) => {
            assert!(
                !problems.is_empty(),
                "an invalid config with no problem listed"
            );
            for p in &problems {
                assert_eq!(p.file, FILE, "an error names another file: {p}");
                assert!(!p.message.trim().is_empty(), "an empty error: {p}");
                assert!(
                    p.to_string().starts_with(FILE),
                    "an error not naming its file: {p}"
                );
            }
        }
        Err(e @ slipway_config::ConfigError::Read { .. }) => {
            panic!("parse cannot fail reading: {e}")
        }
    }
}

/// The plugins' and the nesting daemon's `plugin_config`: a config, or an error saying which.
pub fn check_plugin(input: &Input) {
    let seeds: Vec<&[u8]> = json_seeds().iter().map(Vec::as_slice).collect();
    let bytes = mutate::apply(&seeds, JSON_DICT, input);
    check_plugin_bytes(&bytes);
}

/// One `plugin_config` document through every plugin's parser.
pub fn check_plugin_bytes(bytes: &[u8]) {
    let named = |e: String| assert!(e.starts_with("plugin_config"), "unclear error: {e}");
    if let Err(e) = fleeting_plugin_aws::config::Config::parse(bytes) {
        named(e.to_string());
    }
    if let Err(e) = fleeting_plugin_local::config::Config::parse(bytes) {
        named(e.to_string());
    }
    if let Err(e) = fleeting_plugin_qemu::config::Config::parse(bytes) {
        named(e.to_string());
    }
    if let Err(e) = fleeting_plugin_static::config::Config::parse(bytes) {
        named(e.to_string());
    }
    if let Err(e) = slipway_nesting::config::Config::parse(bytes) {
        assert!(e.starts_with("nesting config"), "unclear error: {e}");
    }
}
