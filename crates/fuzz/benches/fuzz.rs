//! `make fuzz`: every target for `SLIPWAY_FUZZ_EXECS` execs (default 10 million; the real
//! extraction and the plugin process get a fixed fraction, see below) on 2 threads, then
//! `bench/results/fuzz.json`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use serde_json::{Value, json};
use slipway_fuzz::driver::{Outcome, run};
use slipway_fuzz::{
    archive, config, content_range, extremes, gitlab, guest_frame, masking, paths, pipeline,
    plugin_process, plugin_reply,
};

/// Crashes found and fixed before this run (while the targets were built, and by short
/// `make fuzz` runs): (target, input, fix).
const FIXED: &[(&str, &str, &str)] = &[
    (
        "archive",
        "a tar stream with a symlink a and an entry a/b (e.g. concatenated streams): archived, \
         then refused when the zip was unpacked (the round-trip invariant; not a panic)",
        "commit 616c096: archive_from_tar refuses an entry under a symlink of the stream; \
         regression test entries::tests::an_entry_under_a_symlink_of_the_stream_is_refused_when_archiving",
    ),
    (
        "archive",
        "a tar stream with a symlink whose target names no file (\"\", /, .): archived as a zip \
         that zip_to_tar then refused (the round-trip invariant; not a panic)",
        "commit 901a587: archive_from_tar refuses such a symlink; regression test \
         entries::tests::a_symlink_naming_no_file_is_refused_when_archiving",
    ),
    (
        "archive",
        "a tar entry named ./c:\\x/: archived (the Windows check ran before ./ was stripped), \
         then refused when the zip was unpacked (the round-trip invariant; not a panic)",
        "commit 901a587: normalize checks the normalized name too; regression case in \
         entries::tests::normalizes_names",
    ),
    (
        "archive",
        "a tar stream whose PAX `path` record holds a NUL byte, archived as gzip: flate2's \
         GzBuilder::filename panicked (FNAME cannot hold NUL)",
        "commit 218efd8: slipway_artifacts refuses a NUL in an entry name as an unsafe path; \
         regression test entries::tests::a_nul_in_a_pax_path_is_refused_not_a_panic",
    ),
];

type Target = (&'static str, u64, fn(u64, u64) -> Outcome);

fn targets(execs: u64) -> Vec<Target> {
    // Extraction runs GNU tar once per exec: a thousandth of the execs (at least 1,000).
    let extract = (execs / 1000).max(1000.min(execs));
    // A plugin process per exec (spawn, handshake with AutoMTLS, calls, stop): a ten-thousandth.
    let process = (execs / 10_000).max(100.min(execs));
    // Archives build a tar, a zip and a gzip, and read the zip back, per exec (~8k execs/s):
    // a quarter of the execs.
    let archive = (execs / 4).max(1000.min(execs));
    // Popped from the end: the slowest first, so the two threads finish together.
    vec![
        ("content_range", execs, |n, s| {
            run(n, s, 4096, content_range::check)
        }),
        ("masking", execs, |n, s| run(n, s, 4096, masking::check)),
        ("extremes", execs, |n, s| run(n, s, 256, extremes::check)),
        ("guest_frame", execs, |n, s| {
            run(n, s, 4096, guest_frame::check)
        }),
        ("plugin_reply", execs, |n, s| {
            run(n, s, 4096, plugin_reply::check)
        }),
        ("plugin_config", execs, |n, s| {
            run(n, s, 4096, config::check_plugin)
        }),
        ("archive_extract", extract, |n, s| {
            run(n, s, 4096, archive::check_extract)
        }),
        ("paths", execs, |n, s| run(n, s, 512, paths::check)),
        ("gitlab", execs, |n, s| run(n, s, 4096, gitlab::check)),
        ("plugin_process", process, |n, s| {
            let bin = std::path::Path::new(env!("CARGO_BIN_EXE_slipway-fuzz-plugin"));
            run(n, s, 4096, |i| plugin_process::check(bin, i))
        }),
        ("pipeline", execs, |n, s| run(n, s, 4096, pipeline::check)),
        ("archive", archive, |n, s| run(n, s, 1024, archive::check)),
        ("config", execs, |n, s| run(n, s, 4096, config::check)),
    ]
}

fn main() {
    let execs: u64 = std::env::var("SLIPWAY_FUZZ_EXECS")
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(10_000_000);
    let only = std::env::var("SLIPWAY_FUZZ_TARGETS").ok();
    let seed: u64 = std::env::var("SLIPWAY_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15);
    // Panics are findings, reported below; keep the terminal readable.
    std::panic::set_hook(Box::new(|_| {}));
    let queue = Mutex::new(
        targets(execs)
            .into_iter()
            .filter(|(name, _, _)| {
                only.as_deref()
                    .is_none_or(|o| o.split(',').any(|x| x == *name))
            })
            .collect::<Vec<_>>(),
    );
    let results: Mutex<BTreeMap<&'static str, Outcome>> = Mutex::new(BTreeMap::new());
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (queue, results) = (&queue, &results);
            s.spawn(move || {
                loop {
                    let Some((name, n, f)) = queue.lock().unwrap().pop() else {
                        break;
                    };
                    eprintln!("fuzz: {name}: {n} execs (thread {t})");
                    let out = f(n, seed);
                    eprintln!(
                        "fuzz: {name}: {} execs in {:.1} s, {} crashes",
                        out.execs,
                        out.seconds,
                        out.crashes.len()
                    );
                    for (input, message) in &out.crashes {
                        eprintln!("fuzz: {name}: CRASH {message}\n  input: {input}");
                    }
                    results.lock().unwrap().insert(name, out);
                }
            });
        }
    });
    let results = results.into_inner().unwrap();
    let mut targets = serde_json::Map::new();
    let mut findings: Vec<Value> = FIXED
        .iter()
        .map(|(t, input, fix)| json!({"target": t, "input summary": input, "fix commit or description": fix}))
        .collect();
    for (name, out) in &results {
        let fixed = FIXED.iter().filter(|(t, _, _)| t == name).count();
        targets.insert(
            (*name).to_string(),
            json!({
                "execs": out.execs,
                "seconds": (out.seconds * 10.0).round() / 10.0,
                "execs_per_second": (out.execs as f64 / out.seconds.max(1e-9)).round(),
                "crashes_found": out.crashes.len() + fixed,
                "crashes_fixed": fixed,
            }),
        );
        for (input, message) in &out.crashes {
            findings.push(json!({"target": name, "input summary": input.chars().take(300).collect::<String>(), "message": message, "fix commit or description": "open"}));
        }
    }
    let doc: Value = json!({
        "targets": targets,
        "findings": findings,
        "goal_execs_per_target": 10_000_000u64,
        "not_parser_targets": {
            "archive_extract": "the real extraction (zip_to_tar, then GNU tar into a fresh temp dir): one tar process per exec, a thousandth of the execs",
            "archive": "builds a tar, a zip and a gzip and reads the zip back per exec (about 8k execs/s on this machine): a quarter of the execs, to finish within the session",
            "plugin_process": "the real plugin host against a fake plugin process: one process, handshake (AutoMTLS) and up to 12 gRPC calls per exec, a ten-thousandth of the execs",
        },
        "seed": seed,
    });
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let (path, _) = slipway_testkit::bench::write(&repo, "fuzz", "make fuzz", doc).unwrap();
    eprintln!("fuzz: wrote {}", path.display());
    if results.values().any(|o| !o.crashes.is_empty()) {
        std::process::exit(1);
    }
}
