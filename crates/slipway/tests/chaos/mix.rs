//! The soak's jobs: a seeded mix of kinds, each with its script and the outcomes it may end in.

use serde_json::{Value, json};

/// The Docker image docker-level jobs run in (built by `scripts/docker-engine.sh`).
pub const IMAGE: &str = "slipway-busybox:latest";

/// A small seeded generator (splitmix64): the same seed gives the same soak.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// A float in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// What a job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// Three numbered lines.
    Quick,
    /// Three numbered lines with sleeps between them.
    Slow,
    /// One line, then `exit 3`.
    Failing,
    /// One line, then a long sleep the driver cancels.
    Canceled,
    /// Numbered lines and a file kept as an artifact.
    Artifacts,
    /// Quick, in a cgroup slot.
    Cgroup,
    /// Quick, in a Docker container.
    Docker,
}

impl Kind {
    /// Its name in job names and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Quick => "quick",
            Kind::Slow => "slow",
            Kind::Failing => "failing",
            Kind::Canceled => "canceled",
            Kind::Artifacts => "artifacts",
            Kind::Cgroup => "cgroup",
            Kind::Docker => "docker",
        }
    }

    /// The isolation level it asks for.
    pub fn level(self) -> &'static str {
        match self {
            Kind::Cgroup => "cgroup",
            Kind::Docker => "docker",
            _ => "none",
        }
    }
}

/// Kinds by weight (out of 100).
const WEIGHTS: [(Kind, u64); 7] = [
    (Kind::Quick, 38),
    (Kind::Slow, 12),
    (Kind::Failing, 10),
    (Kind::Canceled, 6),
    (Kind::Artifacts, 10),
    (Kind::Cgroup, 14),
    (Kind::Docker, 10),
];

/// One job of the soak.
#[derive(Debug, Clone)]
pub struct SoakJob {
    /// Its place in the mix (0-based).
    pub n: usize,
    /// Its unique name, `jNNNNN-kind`.
    pub name: String,
    /// What it does.
    pub kind: Kind,
    /// Script lines.
    pub script: Vec<String>,
    /// How many numbered lines a complete trace holds.
    pub lines: usize,
    /// Canceled while still pending (for [`Kind::Canceled`]), else once it has started.
    pub cancel_early: bool,
}

/// The seeded mix of `jobs` jobs; `marker` tags their sleeps so a leftover one is found.
pub fn mix(seed: u64, jobs: usize, marker: &str) -> Vec<SoakJob> {
    let mut rng = Rng::new(seed);
    (0..jobs)
        .map(|n| {
            let mut pick = rng.below(100);
            let kind = WEIGHTS
                .iter()
                .find(|(_, w)| {
                    if pick < *w {
                        true
                    } else {
                        pick -= w;
                        false
                    }
                })
                .map_or(Kind::Quick, |(k, _)| *k);
            let name = format!("j{n:05}-{}", kind.as_str());
            let line = |i: usize| format!("echo \"$CI_JOB_NAME {i}\"");
            // The first output: when the job's script began (GNU date on the instance).
            let t0 = "echo \"t0 $(date +%s%3N)\"".to_string();
            let (script, lines) = match kind {
                Kind::Quick | Kind::Cgroup => (vec![t0, line(1), line(2), line(3)], 3),
                Kind::Docker => (vec![line(1), line(2), line(3)], 3),
                Kind::Slow => {
                    let s = 1 + rng.below(4);
                    let sleep = format!("sleep {s}.{marker}");
                    (vec![t0, line(1), sleep.clone(), line(2), sleep, line(3)], 3)
                }
                Kind::Failing => (vec![t0, line(1), "exit 3".into(), line(2)], 1),
                Kind::Canceled => (vec![t0, line(1), format!("sleep 120.{marker}"), line(2)], 1),
                Kind::Artifacts => (
                    vec![
                        t0,
                        line(1),
                        "mkdir -p out && echo \"$CI_JOB_NAME\" > out/name.txt".into(),
                        line(2),
                        line(3),
                    ],
                    3,
                ),
            };
            let cancel_early = kind == Kind::Canceled && rng.below(3) == 0;
            SoakJob {
                n,
                name,
                kind,
                script,
                lines,
                cancel_early,
            }
        })
        .collect()
}

impl SoakJob {
    /// The job as a pipeline YAML entry (for `slipway submit`).
    pub fn yaml(&self) -> String {
        let mut y = format!("{}:\n  script:\n", self.name);
        for l in &self.script {
            y.push_str(&format!("    - '{}'\n", l.replace('\'', "''")));
        }
        match self.kind {
            Kind::Cgroup => y.push_str("  isolation: cgroup\n"),
            Kind::Docker => y.push_str(&format!("  isolation: docker\n  image: {IMAGE}\n")),
            Kind::Artifacts => y.push_str("  artifacts:\n    paths: [out/]\n"),
            _ => {}
        }
        y
    }

    /// The job as GitLab's `jobs/request` payload (for the GitLab fake).
    pub fn payload(&self) -> Value {
        let script: Vec<&str> = self.script.iter().map(String::as_str).collect();
        let mut vars = vec![("GIT_STRATEGY", "none")];
        if self.kind.level() != "none" {
            vars.push(("SLIPWAY_ISOLATION", self.kind.level()));
        }
        let mut p = slipway_testkit::gitlab::job_payload_with_vars(&self.name, &script, &vars);
        match self.kind {
            Kind::Docker => p["image"] = json!({"name": IMAGE}),
            Kind::Artifacts => {
                p["artifacts"] = json!([{
                    "name": "out", "untracked": false, "paths": ["out/"], "when": "on_success",
                    "artifact_type": "archive", "artifact_format": "zip", "expire_in": "1 day",
                }]);
            }
            _ => {}
        }
        p
    }

    /// Whether a final state is one this job may end in: its own outcome, or a runner system
    /// failure (a fault hit it).
    pub fn allows(&self, state: &Final) -> bool {
        // A fault's mark: the runner's system failure, or GitLab timing out a job handed out
        // to a manager killed before it read the answer.
        if state.status == "failed"
            && matches!(
                state.reason.as_deref(),
                Some("runner_system_failure" | "stuck_or_timeout_failure")
            )
        {
            return true;
        }
        match self.kind {
            Kind::Failing => {
                state.status == "failed"
                    && state.reason.as_deref() == Some("script_failure")
                    && state.exit_code == Some(3)
            }
            Kind::Canceled => state.status == "canceled",
            _ => state.status == "success",
        }
    }
}

/// How a job ended, from either source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Final {
    /// `success`, `failed` or `canceled`.
    pub status: String,
    /// GitLab's failure reason, if failed.
    pub reason: Option<String>,
    /// The script's exit code, if it had one.
    pub exit_code: Option<i32>,
}
