//! `parallel:` (`N` or `matrix:`) and the jobs one job expands to, each with its variables
//! (`CI_NODE_INDEX`, `CI_NODE_TOTAL`, matrix values) and its snapshot names.

use super::{
    MAX_PARALLEL, ParallelInstance, RawJob, Reader, Snapshot, SnapshotSpec, ctx_for, lookup_in,
};
use crate::yaml::{Kind, Node};
use slipway_job::model::Variable;

/// Longest snapshot name accepted.
const MAX_SNAPSHOT_NAME: usize = 64;

/// The variables one `parallel: matrix:` job gets, in the order they are written.
pub(super) type MatrixVars = Vec<(String, String)>;

/// `parallel:` as read.
pub(super) enum ParallelSpec {
    /// `parallel: N`.
    Count(u32),
    /// `parallel: matrix:`: each job's variables, in job order.
    Matrix(Vec<MatrixVars>),
}

impl Reader<'_> {
    /// The jobs `base` stands for: one per `parallel:` combination (or just itself), each with
    /// its variables and its snapshot names resolved.
    pub(super) fn instances(
        &mut self,
        base: RawJob,
        parallel: Option<ParallelSpec>,
        snapshot: Option<SnapshotSpec>,
        restore: Option<(String, usize)>,
    ) -> Vec<RawJob> {
        let name = base.job.name.clone();
        // (job name, CI_NODE_INDEX, matrix variables)
        let plan: Vec<(String, u32, MatrixVars)> = match parallel {
            None => vec![(name.clone(), 0, Vec::new())],
            Some(ParallelSpec::Count(n)) => (1..=n)
                .map(|i| (format!("{name} {i}/{n}"), i, Vec::new()))
                .collect(),
            Some(ParallelSpec::Matrix(sets)) => (1u32..)
                .zip(sets)
                .map(|(i, vars)| {
                    let values: Vec<&str> = vars.iter().map(|(_, v)| v.as_str()).collect();
                    (format!("{name}: [{}]", values.join(", ")), i, vars)
                })
                .collect(),
        };
        let total = u32::try_from(plan.len()).unwrap_or(u32::MAX);
        let mut out = Vec::with_capacity(plan.len());
        // One report per key of the job as written, not one per job it expands to.
        let (mut bad_snapshot, mut bad_restore) = (false, false);
        for (instance_name, index, matrix_vars) in plan {
            let mut raw = RawJob {
                job: base.job.clone(),
                stage_line: base.stage_line,
                needs: base.needs.as_ref().map(|n| n.to_vec()),
                trigger: base.trigger.clone(),
                forward: Vec::new(),
            };
            let job = &mut raw.job;
            if index > 0 {
                job.name = instance_name;
                job.parallel = Some(ParallelInstance {
                    job: name.clone(),
                    index,
                    total,
                });
                // Matrix values replace the job's variables of the same name, as in GitLab.
                for (key, value) in matrix_vars {
                    job.variables.retain(|v| v.key != key);
                    job.variables.push(Variable::new(key, value));
                }
                // Predefined, so a variable of the job's own of the same name wins.
                let mut node_vars = Vec::new();
                for (key, value) in [("CI_NODE_INDEX", index), ("CI_NODE_TOTAL", total)] {
                    if !job.variables.iter().any(|v| v.key == key) {
                        node_vars.push(Variable::new(key, value.to_string()));
                    }
                }
                job.variables.splice(0..0, node_vars);
            }
            let ctx = ctx_for(&job.name);
            job.snapshot = match &snapshot {
                None => None,
                Some(SnapshotSpec::OnFailure) => Some(Snapshot::OnFailure),
                Some(SnapshotSpec::Save { name, line }) => {
                    match snapshot_name(name, &job.variables) {
                        Ok(n) => Some(Snapshot::Save(n)),
                        Err(why) => {
                            if !bad_snapshot {
                                self.error(*line, format!("{ctx}: snapshot:save: {why}"));
                            }
                            bad_snapshot = true;
                            None
                        }
                    }
                }
            };
            job.restore = match &restore {
                None => None,
                Some((name, line)) => match snapshot_name(name, &job.variables) {
                    Ok(n) => Some(n),
                    Err(why) => {
                        if !bad_restore {
                            self.error(*line, format!("{ctx}: restore: {why}"));
                        }
                        bad_restore = true;
                        None
                    }
                },
            };
            out.push(raw);
        }
        out
    }

    /// `parallel: N` or `parallel: matrix: [...]`.
    pub(super) fn parallel(&mut self, ctx: &str, node: &Node) -> Option<ParallelSpec> {
        let expected =
            format!("a whole number from 1 to {MAX_PARALLEL} or a mapping with \"matrix\"");
        if let Some(text) = node.as_scalar() {
            if node.as_bool().is_none()
                && let Ok(n) = text.parse::<u64>()
            {
                // GitLab accepts 1 (one job, `name 1/1`).
                if (1..=u64::from(MAX_PARALLEL)).contains(&n) {
                    return u32::try_from(n).ok().map(ParallelSpec::Count);
                }
                self.error(
                    node.line,
                    format!("{ctx}: parallel: {n} is out of range (1 to {MAX_PARALLEL})"),
                );
                return None;
            }
            self.error(
                node.line,
                format!("{ctx}: parallel: expected {expected}, found {text:?}"),
            );
            return None;
        }
        let Some(entries) = node.as_map() else {
            self.error(
                node.line,
                format!(
                    "{ctx}: parallel: expected {expected}, found {}",
                    node.describe()
                ),
            );
            return None;
        };
        let mut matrix = None;
        for e in entries {
            match e.key.as_str() {
                "matrix" => matrix = self.matrix(ctx, e.key_line, &e.value),
                k => self.error(
                    e.key_line,
                    format!("{ctx}: parallel: unknown key \"{k}\" (expected matrix)"),
                ),
            }
        }
        if node.get("matrix").is_none() {
            self.error(node.line, format!("{ctx}: parallel: missing \"matrix\""));
        }
        matrix.map(ParallelSpec::Matrix)
    }

    /// `parallel: matrix:`: the variables of each job it makes, GitLab's order (entries in turn;
    /// within one, the cartesian product with the first variable varying slowest). `key_line`:
    /// where `matrix:` is, for problems of the whole list.
    pub(super) fn matrix(
        &mut self,
        ctx: &str,
        key_line: usize,
        node: &Node,
    ) -> Option<Vec<MatrixVars>> {
        let what = format!("{ctx}: parallel:matrix");
        let Some(items) = node.as_list() else {
            self.error(
                node.line,
                format!(
                    "{what}: expected a list of mappings of variables to values, found {}",
                    node.describe()
                ),
            );
            return None;
        };
        if items.is_empty() {
            self.error(node.line, format!("{what}: expected at least one entry"));
            return None;
        }
        let mut ok = true;
        let mut axes_per_entry = Vec::new();
        for (i, item) in (1usize..).zip(items) {
            let Some(vars) = item.as_map() else {
                self.error(
                    item.line,
                    format!(
                        "{what}: entry {i}: expected a mapping of variables to values, found {}",
                        item.describe()
                    ),
                );
                ok = false;
                continue;
            };
            if vars.is_empty() {
                self.error(
                    item.line,
                    format!("{what}: entry {i}: expected at least one variable"),
                );
                ok = false;
                continue;
            }
            let mut axes: Vec<(String, Vec<String>)> = Vec::new();
            for v in vars {
                let values: Option<Vec<String>> = match &v.value.kind {
                    Kind::Seq(list) => list
                        .iter()
                        .map(|x| x.as_scalar().map(str::to_string))
                        .collect(),
                    _ => v.value.as_scalar().map(|x| vec![x.to_string()]),
                };
                match values {
                    Some(values) if values.is_empty() => {
                        self.error(
                            v.key_line,
                            format!("{what}: entry {i}: {} must not be an empty list", v.key),
                        );
                        ok = false;
                    }
                    Some(values) => axes.push((v.key.clone(), values)),
                    None => {
                        self.error(
                            v.key_line,
                            format!(
                                "{what}: entry {i}: {} must be a string or a list of strings",
                                v.key
                            ),
                        );
                        ok = false;
                    }
                }
            }
            axes_per_entry.push(axes);
        }
        if !ok {
            return None;
        }
        // Count before building: a few long lists multiply into a huge number of jobs.
        let count = axes_per_entry.iter().fold(0usize, |sum, axes| {
            let product = axes
                .iter()
                .fold(1usize, |p, (_, values)| p.saturating_mul(values.len()));
            sum.saturating_add(product)
        });
        if count > MAX_PARALLEL as usize {
            let shown = if count == usize::MAX {
                "too many".to_string()
            } else {
                count.to_string()
            };
            self.error(
                key_line,
                format!("{what}: makes {shown} jobs, more than the limit of {MAX_PARALLEL}"),
            );
            return None;
        }
        let mut jobs = Vec::with_capacity(count);
        for axes in axes_per_entry {
            let mut combos: Vec<MatrixVars> = vec![Vec::new()];
            for (key, values) in axes {
                let mut next = Vec::with_capacity(combos.len() * values.len());
                for combo in &combos {
                    for v in &values {
                        let mut c = combo.clone();
                        c.push((key.clone(), v.clone()));
                        next.push(c);
                    }
                }
                combos = next;
            }
            jobs.extend(combos);
        }
        Some(jobs)
    }
}

/// A snapshot name from `template`, with `$VAR` and `${VAR}` replaced by `vars` (the last of a
/// name wins), checked: 1 to 64 of `A-Z a-z 0-9 . _ -`, and not `.` or `..` (it may become a
/// file name). The error says what is wrong, naming the template.
pub(super) fn snapshot_name(template: &str, vars: &[Variable]) -> Result<String, String> {
    let name = expand_vars(template, vars)
        .map_err(|var| format!("variable \"{var}\" in {template:?} is not defined for this job"))?;
    let valid = (1..=MAX_SNAPSHOT_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && name != "."
        && name != "..";
    if valid {
        return Ok(name);
    }
    let from = if name == template {
        String::new()
    } else {
        format!(" (from {template:?})")
    };
    Err(format!(
        "invalid snapshot name {name:?}{from}: expected 1 to {MAX_SNAPSHOT_NAME} letters, \
         digits, \".\", \"_\" or \"-\" (not \".\" or \"..\")"
    ))
}

/// Replaces `$VAR` and `${VAR}` in `text` with the value of the last variable of that name in
/// `vars` (one level: values are not expanded again). `Err` carries the first name that is not
/// defined.
pub(super) fn expand_vars(text: &str, vars: &[Variable]) -> Result<String, String> {
    let missing = std::cell::RefCell::new(None::<String>);
    let out = slipway_job::variables::expand(text, &|name| {
        let found = lookup_in(vars, name);
        if found.is_none() {
            missing.borrow_mut().get_or_insert_with(|| name.to_string());
        }
        found
    });
    match missing.into_inner() {
        Some(name) => Err(name),
        None => Ok(out),
    }
}
