//! `slipway exec`: read a local pipeline, list it or run it through the manager's local
//! source, and show the run — job output prefixed with the job's name, a live line per running
//! job on a terminal, the summary table, the JSON report.

use std::collections::HashMap;
use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use slipway_config::RunnerConfig;
use slipway_manager::limits::effective_concurrency;
use slipway_manager::source::local::{self, Event, ExecOptions, JobRow};
use slipway_pipeline::{Pipeline, PipelineStatus};
use slipway_status::format::money;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::progress::{self, LiveLines, Screen};

use super::{pick_runner, print_warnings, signals};

/// What `slipway exec` takes.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Pipeline file.
    #[arg(default_value = ".gitlab-ci.yml")]
    pub file: PathBuf,
    /// Run only this job (repeat for more; a parallel job's name runs all of its jobs).
    #[arg(long)]
    pub job: Vec<String>,
    /// With --job: also run the jobs it needs, transitively.
    #[arg(long)]
    pub needs: bool,
    /// Play this manual job in the run (repeat for more).
    #[arg(long)]
    pub manual: Vec<String>,
    /// Print the jobs the pipeline has (stage, when, needs) and run nothing.
    #[arg(long)]
    pub list: bool,
    /// A variable for every job, over the pipeline's own: KEY=VALUE (repeat for more). Its
    /// value is masked in job output, as the variables file's are.
    #[arg(long = "variable", short = 'v', value_name = "KEY=VALUE")]
    pub variables: Vec<String>,
    /// Like --variable, but the value shows in job output (a masked variable it replaces
    /// stays masked).
    #[arg(long = "plain-variable", value_name = "KEY=VALUE")]
    pub plain_variables: Vec<String>,
    /// Variables file (values masked in output unless `masked: false`); default:
    /// .slipway-variables.yml beside the pipeline, when it exists.
    #[arg(long)]
    pub variables_file: Option<PathBuf>,
    /// Directory holding other projects' checkouts, for include:project (DIR/group/project).
    #[arg(long)]
    pub include_root: Option<PathBuf>,
    /// Write a JSON report of the run (each job's status, duration, coverage, tries).
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// config.toml to use instead of the embedded default.
    #[arg(short, long)]
    pub config: Option<PathBuf>,
    /// Which [[runners]] entry of the config to use (default: the first).
    #[arg(long)]
    pub runner: Option<String>,
    /// Ignore the cache kept between runs: jobs neither restore nor save their `cache:`.
    /// Without it, a runner with no `cache_dir` whose jobs run on this machine (the embedded
    /// default) keeps the cache in $XDG_CACHE_HOME/slipway/exec/<project> (else
    /// ~/.cache/slipway/exec/<project>), shared by its local instances and docker-level jobs.
    #[arg(long)]
    pub no_cache: bool,
    /// Warn about pipeline keys this version does not support instead of failing.
    #[arg(long)]
    pub allow_unsupported: bool,
    /// Directory searched first for plugins (fleeting-plugin-*, executor-plugin-*).
    #[arg(long, env = "SLIPWAY_PLUGIN_DIR")]
    pub plugin_dir: Option<PathBuf>,
    /// How long a plugin may take to print its handshake (e.g. 10s).
    #[arg(long, env = "SLIPWAY_PLUGIN_START_TIMEOUT", value_parser = humantime::parse_duration)]
    pub plugin_start_timeout: Option<std::time::Duration>,
}

/// `slipway exec`: the config (or the embedded default), its runner, the pipeline run.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let loaded = match &args.config {
        Some(path) => slipway_config::load(path).await?,
        None => slipway_config::parse(slipway_config::EMBEDDED, "embedded config")?,
    };
    print_warnings(&loaded);
    let runner_cfg = pick_runner(&loaded, args.runner.as_deref())?;
    let opts = ExecOptions {
        file: args.file,
        jobs: args.job,
        needs: args.needs,
        manual: args.manual,
        variables: args.variables,
        plain_variables: args.plain_variables,
        variables_file: args.variables_file,
        include_root: args.include_root,
        allow_unsupported: args.allow_unsupported,
        concurrent: effective_concurrency(&loaded, &runner_cfg),
        plugin_dir: args.plugin_dir,
        plugin_start_timeout: args.plugin_start_timeout,
        no_cache: args.no_cache,
        helper: crate::helper::find().await,
    };
    let stop = signals::shutdown_signal()?;
    let ok = exec(&runner_cfg, &opts, args.list, args.report.as_ref(), stop).await?;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Read the pipeline of `opts`; with `list`, print its jobs, else run it on `runner_cfg` and
/// print the summary (and write `report`). Whether the pipeline passed.
async fn exec(
    runner_cfg: &RunnerConfig,
    opts: &ExecOptions,
    list: bool,
    report: Option<&PathBuf>,
    stop: CancellationToken,
) -> anyhow::Result<bool> {
    let read = {
        let opts = opts.clone();
        tokio::task::spawn_blocking(move || local::read(&opts, !list, &mut |n| eprintln!("{n}")))
            .await
            .context("reading the pipeline")??
    };
    let pipeline = &read.pipeline;
    for w in &pipeline.warnings {
        eprintln!("warning: {w}");
    }
    if let Some(why) = &pipeline.excluded {
        println!("{why}");
        return Ok(true);
    }
    if list {
        print_list(pipeline);
        return Ok(true);
    }
    // Live lines only for a person watching: piped output stays as plain as before.
    let printer = Printer::start(std::io::stdout().is_terminal());
    let outcome = local::run(runner_cfg, &read, opts, printer.events(), stop).await;
    printer.stop().await;
    let outcome = outcome?;
    print_summary(&outcome.rows, outcome.costs.as_ref());
    if let Some(path) = report {
        let report = report_json(&outcome.rows, outcome.status, outcome.costs.as_ref());
        tokio::fs::write(path, format!("{report:#}\n"))
            .await
            .with_context(|| format!("writing the report {}", path.display()))?;
    }
    let ok = outcome.passed();
    match outcome.status {
        PipelineStatus::Blocked => {
            println!("Pipeline blocked: a manual job waits (run it with --manual NAME)")
        }
        _ if ok => println!("Pipeline succeeded"),
        _ => println!("Pipeline failed"),
    }
    Ok(ok)
}

/// The run as JSON, for tools: the pipeline's status and each job's row.
fn report_json(
    rows: &[JobRow],
    status: PipelineStatus,
    costs: Option<&slipway_status::model::RunnerCosts>,
) -> serde_json::Value {
    // Costs only where prices are set: without, they are unknown, not zero.
    let total = costs.filter(|c| !c.currency.is_empty()).map(|c| {
        serde_json::json!({
            "currency": c.currency,
            "billed": c.billed,
            "jobs": c.jobs,
            "overhead": c.overhead,
            "unpriced_shapes": c.unpriced,
        })
    });
    serde_json::json!({
        "status": status.to_string(),
        "cost": total,
        "jobs": rows.iter().map(|r| serde_json::json!({
            "name": r.name,
            "stage": r.stage,
            "status": r.status.as_str(),
            "duration_s": r.duration.map(|d| d.as_secs_f64()),
            "coverage": r.coverage,
            "attempts": r.attempts,
            "exit_code": r.exit_code,
            "message": r.message,
            "cost": r.cost.as_ref().map(|c| serde_json::json!({
                "amount": c.amount,
                "currency": c.currency,
            })),
        })).collect::<Vec<_>>(),
    })
}

/// `--list`: the jobs GitLab would create, with stage, when and needs.
fn print_list(pipeline: &Pipeline) {
    let header = ["JOB", "STAGE", "WHEN", "ALLOW_FAILURE", "NEEDS"];
    let rows: Vec<[String; 5]> = pipeline
        .jobs
        .iter()
        .map(|j| {
            let when = if j.manual {
                "manual".to_string()
            } else if let Some(d) = j.start_in {
                format!("delayed {}", humantime::format_duration(d))
            } else {
                j.when.as_str().to_string()
            };
            let needs = match &j.needs {
                None => "-".to_string(),
                Some(n) if n.is_empty() => "[]".to_string(),
                Some(n) => n
                    .iter()
                    .map(|n| n.job.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            };
            [
                j.name.clone(),
                j.stage.clone(),
                when,
                j.allow_failure.to_string(),
                needs,
            ]
        })
        .collect();
    print_table(&header, &rows);
}

/// Prints job output line by line, each line prefixed with its job's name; on a terminal, also
/// one live line per running job below the output ([`LiveLines`]), redrawn in place. The one
/// task that writes both keeps them from interleaving.
struct Printer {
    tx: mpsc::UnboundedSender<Event>,
    task: tokio::task::JoinHandle<()>,
}

impl Printer {
    /// `live`: draw the live lines (stdout is a terminal).
    fn start(live: bool) -> Printer {
        let (tx, mut rx) = mpsc::unbounded_channel::<Event>();
        if live {
            // Log lines pass through here while live lines are drawn; a weak sender does not
            // keep the printer alive.
            let weak = tx.downgrade();
            progress::route_logs(Some(Box::new(move |bytes: &[u8]| {
                let text = String::from_utf8_lossy(bytes);
                weak.upgrade().is_some_and(|tx| {
                    tx.send(Event::Notice(text.trim_end_matches('\n').to_string()))
                        .is_ok()
                })
            })));
        }
        let task = tokio::spawn(async move {
            let mut partial: HashMap<Arc<str>, Vec<u8>> = HashMap::new();
            let mut jobs = LiveLines::new();
            let mut screen = Screen::new(live);
            // Elapsed times tick even while no job prints.
            let mut redraw = tokio::time::interval(progress::REDRAW_EVERY);
            redraw.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                let event = tokio::select! {
                    e = rx.recv() => match e {
                        Some(e) => e,
                        None => break,
                    },
                    _ = redraw.tick(), if live => {
                        write_stdout(&screen.redraw(&live_lines(&jobs)));
                        continue;
                    }
                };
                let mut out = Vec::new();
                match event {
                    Event::Start { name, stage } => {
                        if live {
                            jobs.add(&name, &stage, Instant::now());
                        }
                    }
                    Event::Output(name, bytes) => {
                        if live {
                            jobs.output(&name, &bytes);
                        }
                        let buf = partial.entry(name.clone()).or_default();
                        buf.extend_from_slice(&bytes);
                        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                            let line: Vec<u8> = buf.drain(..=pos).collect();
                            out.extend_from_slice(format!("[{name}] ").as_bytes());
                            out.extend_from_slice(&line);
                        }
                    }
                    Event::End(name) => {
                        if let Some(mut buf) = partial.remove(&name)
                            && !buf.is_empty()
                        {
                            out.extend_from_slice(format!("[{name}] ").as_bytes());
                            out.append(&mut buf);
                            out.push(b'\n');
                        }
                        jobs.remove(&name);
                    }
                    Event::Notice(text) => {
                        write_stdout(&screen.clear());
                        let _ = writeln!(std::io::stderr(), "{text}");
                    }
                }
                let lines = if live { live_lines(&jobs) } else { Vec::new() };
                write_stdout(&screen.print(&out, &lines));
            }
            // The summary that follows prints on a clean screen.
            write_stdout(&screen.clear());
        });
        Printer { tx, task }
    }

    /// Where the run sends what it has to show.
    fn events(&self) -> mpsc::UnboundedSender<Event> {
        self.tx.clone()
    }

    async fn stop(self) {
        progress::route_logs(None);
        drop(self.tx);
        let _ = self.task.await;
    }
}

/// The live lines for stdout's terminal as it is now (it may have been resized).
fn live_lines(jobs: &LiveLines) -> Vec<String> {
    let size = progress::terminal_size(&std::io::stdout());
    let width = progress::width_of(size, std::env::var("COLUMNS").ok().as_deref());
    jobs.render(Instant::now(), width, progress::max_lines_of(size))
}

/// Write to stdout (a closed stdout must not stop the run).
fn write_stdout(bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(bytes);
    let _ = stdout.flush();
}

fn print_summary(rows: &[JobRow], costs: Option<&slipway_status::model::RunnerCosts>) {
    let with_coverage = rows.iter().any(|r| r.coverage.is_some());
    let priced = costs.is_some_and(|c| !c.currency.is_empty());
    let mut header = vec!["JOB", "STAGE", "STATUS", "DURATION", "INSTANCE", "SLOT"];
    if with_coverage {
        header.push("COVERAGE");
    }
    if priced {
        header.push("COST");
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut status = r.status.to_string();
            if r.attempts > 1 {
                status.push_str(&format!(" ({} tries)", r.attempts));
            }
            let mut row = vec![
                r.name.clone(),
                r.stage.clone(),
                status,
                r.duration
                    .map(|d| format!("{:.1}s", d.as_secs_f64()))
                    .unwrap_or_else(|| "-".into()),
                if r.instance.is_empty() {
                    "-".into()
                } else {
                    r.instance.clone()
                },
                r.slot.map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
            ];
            if with_coverage {
                row.push(
                    r.coverage
                        .as_ref()
                        .map(|c| format!("{c}%"))
                        .unwrap_or_else(|| "-".into()),
                );
            }
            if priced {
                row.push(
                    r.cost
                        .as_ref()
                        .map(|c| money(c.amount, &c.currency))
                        .unwrap_or_else(|| "unknown".into()),
                );
            }
            row
        })
        .collect();
    println!();
    print_table(&header, &cells);
    if let Some(c) = costs.filter(|_| priced) {
        println!(
            "Cost: {} billed for instances · {} to jobs · {} overhead ({:.0}%)",
            money(c.billed, &c.currency),
            money(c.jobs, &c.currency),
            money(c.overhead, &c.currency),
            c.overhead_share() * 100.0
        );
    }
    if let Some(c) = costs.filter(|c| !c.unpriced.is_empty() && !c.currency.is_empty()) {
        println!(
            "Cost unknown for shapes without price_per_hour: {}",
            c.unpriced.join(", ")
        );
    }
}

/// A left-aligned table with a header row.
pub(crate) fn print_table<R: AsRef<[String]>>(header: &[&str], rows: &[R]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row.as_ref()) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cols: Vec<&str>| {
        cols.iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}", w = *w))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    println!("{}", line(header.to_vec()));
    for row in rows {
        println!(
            "{}",
            line(row.as_ref().iter().map(String::as_str).collect())
        );
    }
}
