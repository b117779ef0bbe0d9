//! `docs/grafana/slipway.json` and `docs/metrics.md` name only metrics the manager exports.
//!
//! The exported names come from encoding the manager's registry with one sample in every family,
//! so a renamed or dropped family fails here rather than on an operator's dashboard.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;
use slipway_status::JobMetrics;
use slipway_taskscaler::metrics::{MetricFamilies, Metrics};

fn docs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs")
}

fn read(path: &PathBuf) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The registry's text encoding, with a sample recorded in every family.
fn encoded_registry() -> String {
    let families = MetricFamilies::default();
    let jobs = JobMetrics::default();
    let registry = slipway_manager::server::registry(&families, &jobs);
    // The handle shares the registered families (a clone of a family is the same family).
    let m = Metrics::new(
        Arc::new(families.clone()),
        vec![
            ("runner".into(), "r1".into()),
            ("shape".into(), "default".into()),
            ("group".into(), "g1".into()),
        ],
    );
    m.set_instances("running", 1);
    m.set_slots("idle", 2);
    m.set_limits(10, 2, 0);
    m.scaled_up("demand", 1);
    m.scaled_down("idle");
    m.creation(10.0);
    m.readiness(2.0);
    m.instance_ready(12.0);
    m.lifetime(600.0);
    m.acquisition_wait(1.0);
    m.capacity_refused();
    m.set_diverted(true);
    jobs.waiting("r1");
    jobs.started("r1");
    jobs.finished("r1", "failed", Some("script_failure"), true, 42.0);
    jobs.vm_started("r1", "ci-microvm", true);
    jobs.job_cost("r1", "default", Some("group/app"), 0.01, "USD");
    jobs.instance_settled("r1", "default", 0.05, 0.04, "USD");
    jobs.set_cost_per_hour("r1", "default", 0.34, "USD");
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)
        .unwrap_or_else(|e| panic!("encoding the registry: {e}"));
    out
}

/// Sample names (`x`, `x_total`, `x_bucket`, ...) in a text encoding.
fn sample_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// Family names from the `# TYPE` lines of a text encoding.
fn family_names(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
        .map(str::to_string)
        .collect()
}

const KEYWORDS: [&str; 14] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "le",
    "inf",
    "nan",
];

/// Metric names a PromQL expression (or a Grafana `label_values(...)` query) reads: identifiers
/// that are not functions, keywords, labels (inside `{...}`, `by (...)` and the like, or the
/// label argument of `label_values`), durations or template variables.
fn metric_names(expr: &str) -> Vec<String> {
    let re = |p: &str| regex::Regex::new(p).unwrap_or_else(|e| panic!("{p}: {e}"));
    let mut s = expr.to_string();
    for (pattern, with) in [
        // Strings first: they may hold anything, brackets included.
        (r#""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`"#, "\"\""),
        // Template variables: $x, ${x}, ${x:format}, [[x]].
        (r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*|\[\[[^\]]*\]\]", ""),
        (r"\{[^}]*\}", ""),
        (r"\[[^\]]*\]", ""),
        (
            r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)",
            " ",
        ),
        // label_values(metric, label) reads `metric`; label_values(label) reads none.
        (
            r"\blabel_values\s*\(([^,()]*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)",
            " ($1) ",
        ),
        (r"\blabel_values\s*\(\s*[A-Za-z_][A-Za-z0-9_]*\s*\)", " "),
    ] {
        s = re(pattern).replace_all(&s, with).into_owned();
    }
    let chars: Vec<char> = s.chars().collect();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let starts = (c.is_ascii_alphabetic() || c == '_' || c == ':')
            && (i == 0 || !(ident(chars[i - 1]) || chars[i - 1] == '.'));
        if !starts {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && ident(chars[i]) {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        let next = chars[i..].iter().find(|c| !c.is_whitespace());
        let keyword = KEYWORDS.contains(&word.to_ascii_lowercase().as_str());
        if next != Some(&'(') && !keyword {
            names.push(word);
        }
    }
    names
}

/// The names `exprs` read that are not in `exported`, each with its expression.
fn unexported(exprs: &[String], exported: &BTreeSet<String>) -> Vec<String> {
    exprs
        .iter()
        .flat_map(|e| {
            metric_names(e)
                .into_iter()
                .filter(|n| !exported.contains(n))
                .map(move |n| format!("{n} (in {e})"))
        })
        .collect()
}

/// Every non-row panel, rows' nested panels included.
fn leaf_panels(panels: &[Value], out: &mut Vec<Value>) {
    for p in panels {
        if p["type"] == "row" {
            leaf_panels(p["panels"].as_array().map_or(&[][..], Vec::as_slice), out);
        } else {
            out.push(p.clone());
        }
    }
}

fn dashboard() -> Value {
    let path = docs().join("grafana/slipway.json");
    serde_json::from_str(&read(&path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every PromQL expression of the dashboard: panel targets and query variables.
fn dashboard_queries(dash: &Value) -> Vec<String> {
    let mut panels = Vec::new();
    leaf_panels(
        dash["panels"].as_array().map_or(&[][..], Vec::as_slice),
        &mut panels,
    );
    let mut out: Vec<String> = panels
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .collect();
    for var in dash["templating"]["list"].as_array().into_iter().flatten() {
        if var["type"] != "query" {
            continue;
        }
        // Grafana stores a variable's query as a string or as {"query": "..."}.
        let q = &var["query"];
        let q = q.as_str().or_else(|| q["query"].as_str());
        out.extend(q.map(str::to_string));
        out.extend(var["definition"].as_str().map(str::to_string));
    }
    out
}

#[test]
fn every_family_has_a_sample_in_the_check() {
    let text = encoded_registry();
    let samples = sample_names(&text);
    for family in family_names(&text) {
        assert!(
            samples.iter().any(|s| s.starts_with(&family)),
            "family {family} has no sample: record one in encoded_registry\n{text}"
        );
    }
}

#[test]
fn dashboard_queries_name_only_exported_metrics() {
    let exported = sample_names(&encoded_registry());
    let dash = dashboard();
    assert!(
        dash["schemaVersion"].as_u64().is_some_and(|v| v >= 36),
        "schemaVersion: {}",
        dash["schemaVersion"]
    );
    let vars: Vec<&str> = dash["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert!(
        vars.contains(&"DS_PROMETHEUS") && vars.contains(&"runner"),
        "{vars:?}"
    );

    let mut panels = Vec::new();
    leaf_panels(
        dash["panels"].as_array().map_or(&[][..], Vec::as_slice),
        &mut panels,
    );
    assert!(panels.len() >= 8, "{} panels", panels.len());
    for p in &panels {
        let title = p["title"].as_str().unwrap_or_default();
        assert!(!title.trim().is_empty(), "a panel without a title: {p}");
        let targets = p["targets"].as_array().map_or(0, Vec::len);
        assert!(targets >= 1, "panel {title:?} has no target");
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or_default();
            assert!(
                !expr.trim().is_empty(),
                "panel {title:?}: a target without expr"
            );
            assert!(
                !metric_names(expr).is_empty(),
                "panel {title:?}: {expr} names no metric"
            );
        }
    }

    let queries = dashboard_queries(&dash);
    let missing = unexported(&queries, &exported);
    assert!(
        missing.is_empty(),
        "the dashboard names metrics Slipway does not export:\n{}\nexported: {exported:?}",
        missing.join("\n")
    );
}

/// Backticked metric names in the first two cells of `docs/metrics.md`'s table rows, outside
/// sections about names not exported.
fn documented_names(doc: &str) -> Vec<String> {
    let name = regex::Regex::new(r"^(?:slipway|gitlab_runner|fleeting)_[a-z0-9_]+$")
        .unwrap_or_else(|e| panic!("{e}"));
    let mut heading = String::new();
    let mut out = Vec::new();
    for line in doc.lines() {
        if line.starts_with('#') {
            heading = line.to_ascii_lowercase();
            continue;
        }
        if !line.starts_with('|') || heading.contains("not export") {
            continue;
        }
        for cell in line.split('|').skip(1).take(2) {
            for (i, part) in cell.split('`').enumerate() {
                if i % 2 == 1 && name.is_match(part) {
                    out.push(part.to_string());
                }
            }
        }
    }
    out
}

#[test]
fn metrics_doc_names_only_exported_metrics_and_every_family() {
    let text = encoded_registry();
    let exported = sample_names(&text);
    let doc = read(&docs().join("metrics.md"));
    let documented = documented_names(&doc);
    assert!(documented.len() >= 20, "{documented:?}");
    // A histogram is documented by its family name: it exports `_bucket`, `_sum` and `_count`.
    let drifted: Vec<&String> = documented
        .iter()
        .filter(|n| !exported.contains(*n) && !exported.contains(&format!("{n}_bucket")))
        .collect();
    assert!(
        drifted.is_empty(),
        "docs/metrics.md names metrics Slipway does not export: {drifted:?}"
    );
    // And the other way: every family is documented (a counter by its `_total` name).
    let undocumented: Vec<String> = family_names(&text)
        .into_iter()
        .filter(|f| !documented.contains(f) && !documented.contains(&format!("{f}_total")))
        .collect();
    assert!(
        undocumented.is_empty(),
        "families missing from docs/metrics.md's tables: {undocumented:?}"
    );
}

#[test]
fn the_check_rejects_a_metric_that_is_not_exported() {
    let exported = sample_names(&encoded_registry());
    let bad = vec![
        r#"sum by (state) (rate(slipway_not_a_metric_total{runner=~"$runner"}[5m]))"#.to_string(),
    ];
    let missing = unexported(&bad, &exported);
    assert_eq!(missing.len(), 1, "{missing:?}");
    assert!(
        missing[0].starts_with("slipway_not_a_metric_total "),
        "{missing:?}"
    );
    // A GitLab name Slipway does not export is rejected too.
    let gitlab = vec!["fleeting_provisioner_instance_creation_time_seconds_bucket".to_string()];
    assert_eq!(unexported(&gitlab, &exported).len(), 1);
}

#[test]
fn the_extractor_skips_functions_keywords_labels_and_variables() {
    let cases: [(&str, &[&str]); 5] = [
        (
            r#"histogram_quantile(0.95, sum by (le) (rate(x_bucket{runner=~"$runner", a="b(c) y"}[$__rate_interval])))"#,
            &["x_bucket"],
        ),
        (
            "label_values(fleeting_provisioner_instances, runner)",
            &["fleeting_provisioner_instances"],
        ),
        ("label_values(runner)", &[]),
        (
            "-sum(a) / on (runner) group_left b offset 5m > bool 1e3",
            &["a", "b"],
        ),
        (
            "sum(rate(c_total[${__range}])) without (shape) and ignoring(group) d:rule",
            &["c_total", "d:rule"],
        ),
    ];
    for (expr, want) in cases {
        assert_eq!(metric_names(expr), want, "{expr}");
    }
}
