//! Reading across entries: `extends` (every entry with its parents merged in, before any
//! `!reference` is resolved, in GitLab's order) and, once every job is read, stage indices and
//! `needs` (names, parallel jobs, cycles).

use std::collections::{HashMap, HashSet};

use super::{Need, Pipeline, PipelineJob, RawJob, RawNeed, Reader, ctx_for, deep_merge};
use crate::yaml::{Kind, Node};

/// Deepest `extends` chain accepted (GitLab's limit).
const MAX_EXTENDS_DEPTH: usize = 11;

impl Reader<'_> {
    /// The configuration with `extends` applied to every top-level entry that has it, jobs and
    /// templates alike, as GitLab does before resolving `!reference`s (so a reference sees what a
    /// template inherits). Problems are recorded; an entry that cannot be extended stays as is.
    pub(super) fn extend_all(&mut self, root: &Node) -> Node {
        let Some(entries) = root.as_map() else {
            return root.clone();
        };
        let defs: HashMap<&str, &Node> = entries
            .iter()
            .filter(|e| !super::TOP_KEYWORDS.contains(&e.key.as_str()))
            .map(|e| (e.key.as_str(), &e.value))
            .collect();
        let mut memo: HashMap<String, Option<Node>> = HashMap::new();
        let mut out = entries.to_vec();
        for e in &mut out {
            let extends = defs.contains_key(e.key.as_str()) && e.value.get("extends").is_some();
            if !extends {
                continue;
            }
            let mut stack = Vec::new();
            if let Some(node) = self.resolve(&e.key, &defs, &mut memo, &mut stack) {
                e.value = node;
            }
        }
        Node {
            line: root.line,
            kind: Kind::Map(out),
        }
    }

    /// Stage indices and `needs` checks: these need every job.
    pub(super) fn link(&mut self, stages: Vec<String>, raw_jobs: Vec<RawJob>) -> Pipeline {
        let stage_list = stages.join(", ");
        let mut jobs: Vec<PipelineJob> = Vec::new();
        let mut needs_raw: Vec<Option<Vec<RawNeed>>> = Vec::new();
        let mut taken: HashMap<String, Option<String>> = HashMap::new();
        for mut raw in raw_jobs {
            // YAML keeps one job per key, but a `parallel:` expansion can make a name
            // that is taken (by a job, by another expansion, or twice by a matrix).
            let origin = raw.job.parallel.as_ref().map(|p| p.job.clone());
            if let Some(first) = taken.get(&raw.job.name) {
                let name = &raw.job.name;
                let msg = match (&origin, first) {
                    (Some(me), Some(other)) if me == other => format!(
                        "{}: parallel:matrix: makes the job \"{name}\" twice",
                        ctx_for(me)
                    ),
                    (Some(me), _) => format!(
                        "{}: parallel: makes a job named \"{name}\", a name already taken",
                        ctx_for(me)
                    ),
                    (None, Some(other)) => format!(
                        "{}: the name is already taken by a job of parallel job \"{other}\"",
                        ctx_for(name)
                    ),
                    // Unreachable (YAML keeps one job per key); said plainly all the same.
                    (None, None) => format!("{}: duplicate job name", ctx_for(name)),
                };
                self.error(raw.job.line, msg);
                continue;
            }
            taken.insert(raw.job.name.clone(), origin);
            match stages.iter().position(|s| *s == raw.job.stage) {
                Some(i) => raw.job.stage_index = i,
                None => self.error(
                    raw.stage_line,
                    format!(
                        "{}: unknown stage \"{}\" (stages: {stage_list})",
                        ctx_for(&raw.job.name),
                        raw.job.stage
                    ),
                ),
            }
            jobs.push(raw.job);
            needs_raw.push(raw.needs);
        }
        // A need names a job, or else a parallel job as written: then all the jobs it made.
        let mut by_name: HashMap<&str, Vec<usize>> = HashMap::new();
        let mut by_parallel: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, j) in jobs.iter().enumerate() {
            by_name.insert(j.name.as_str(), vec![i]);
            if let Some(p) = &j.parallel {
                by_parallel.entry(p.job.as_str()).or_default().push(i);
            }
        }
        let mut edges: Vec<Vec<(usize, usize)>> = vec![Vec::new(); jobs.len()];
        let mut resolved: Vec<Option<Vec<Need>>> = vec![None; jobs.len()];
        // Jobs of the parent pipeline (a child pipeline's `needs:pipeline`): checked there.
        let mut from_parent: Vec<Vec<String>> = vec![Vec::new(); jobs.len()];
        for (i, raw) in needs_raw.into_iter().enumerate() {
            let Some(raw) = raw else { continue };
            let ctx = ctx_for(&jobs[i].name);
            let mut needs: Vec<Need> = Vec::new();
            let mut written: HashSet<String> = HashSet::new();
            for n in raw {
                if n.parent {
                    from_parent[i].push(n.job);
                    continue;
                }
                let targets = by_name
                    .get(n.job.as_str())
                    .or_else(|| by_parallel.get(n.job.as_str()))
                    .map_or(&[][..], Vec::as_slice);
                // `needs: parallel: matrix:` picks the jobs whose values match an entry.
                let picked: Vec<usize>;
                let targets = match &n.matrix {
                    None => targets,
                    Some(combos) => {
                        picked = targets
                            .iter()
                            .copied()
                            .filter(|&t| {
                                combos.iter().any(|combo| {
                                    combo.iter().all(|(k, v)| {
                                        jobs[t]
                                            .variables
                                            .iter()
                                            .any(|x| &x.key == k && &x.value == v)
                                    })
                                })
                            })
                            .collect();
                        // An optional need that matches nothing is dropped, as GitLab does.
                        if picked.is_empty() && !targets.is_empty() && !n.optional {
                            self.error(
                                n.line,
                                format!(
                                    "{ctx}: needs: no job of \"{}\" has the matrix values asked for",
                                    n.job
                                ),
                            );
                            continue;
                        }
                        &picked
                    }
                };
                match targets.first() {
                    None if n.optional => {}
                    None => self.error(n.line, format!("{ctx}: needs: unknown job \"{}\"", n.job)),
                    Some(&t) if jobs[t].stage_index > jobs[i].stage_index => self.error(
                        n.line,
                        format!(
                            "{ctx}: needs: \"{}\" is in a later stage ({}) than this job ({})",
                            n.job, jobs[t].stage, jobs[i].stage
                        ),
                    ),
                    Some(_) => {
                        if !written.insert(n.job.clone()) {
                            self.error(
                                n.line,
                                format!("{ctx}: needs: \"{}\" is listed twice", n.job),
                            );
                            continue;
                        }
                        for &t in targets {
                            // A job named both alone and through its parallel job counts once.
                            if needs.iter().any(|x| x.job == jobs[t].name) {
                                continue;
                            }
                            edges[i].push((t, n.line));
                            needs.push(Need {
                                job: jobs[t].name.clone(),
                                artifacts: n.artifacts,
                            });
                        }
                    }
                }
            }
            resolved[i] = Some(needs);
        }
        for ((job, needs), parent) in jobs.iter_mut().zip(resolved).zip(from_parent) {
            if needs.is_some() {
                job.needs = needs;
            }
            job.parent_artifacts = parent;
        }
        self.check_need_cycles(&jobs, &edges);
        Pipeline {
            stages,
            jobs,
            warnings: Vec::new(),
            excluded: None,
        }
    }

    /// `needs` may name jobs of the same stage, so cycles are possible; each is reported once.
    fn check_need_cycles(&mut self, jobs: &[PipelineJob], edges: &[Vec<(usize, usize)>]) {
        // 0 = unvisited, 1 = on the stack, 2 = done. Iterative DFS: no recursion on user input.
        let mut state = vec![0u8; jobs.len()];
        for start in 0..jobs.len() {
            if state[start] != 0 {
                continue;
            }
            let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
            state[start] = 1;
            while let Some(&mut (node, ref mut next)) = stack.last_mut() {
                if let Some(&(t, line)) = edges[node].get(*next) {
                    *next += 1;
                    match state[t] {
                        0 => {
                            state[t] = 1;
                            stack.push((t, 0));
                        }
                        1 => {
                            let from = stack.iter().position(|&(n, _)| n == t).unwrap_or(0);
                            let mut path: Vec<&str> = stack[from..]
                                .iter()
                                .map(|&(n, _)| jobs[n].name.as_str())
                                .collect();
                            path.push(&jobs[t].name);
                            self.error(
                                line,
                                format!(
                                    "{}: needs: circular dependency: {}",
                                    ctx_for(&jobs[node].name),
                                    path.join(" -> ")
                                ),
                            );
                        }
                        _ => {}
                    }
                } else {
                    state[node] = 2;
                    stack.pop();
                }
            }
        }
    }

    /// The entry `name` with its `extends` applied (deep merge of mappings, GitLab's order:
    /// each parent in list order, then the entry itself; lists and scalars are replaced).
    fn resolve(
        &mut self,
        name: &str,
        defs: &HashMap<&str, &Node>,
        memo: &mut HashMap<String, Option<Node>>,
        stack: &mut Vec<String>,
    ) -> Option<Node> {
        if let Some(done) = memo.get(name) {
            return done.clone();
        }
        let node = *defs.get(name)?;
        let ctx = ctx_for(name);
        let Some(entries) = node.as_map() else {
            // Only reachable for a parent; the caller names it.
            return None;
        };
        let Some(ext) = entries.iter().find(|e| e.key == "extends") else {
            memo.insert(name.to_string(), Some(node.clone()));
            return Some(node.clone());
        };
        let parents: Vec<(String, usize)> = match &ext.value.kind {
            Kind::Scalar { text, .. } if !ext.value.is_null() => {
                vec![(text.clone(), ext.value.line)]
            }
            Kind::Seq(items) if items.iter().all(|i| i.as_scalar().is_some()) => items
                .iter()
                .map(|i| (i.as_scalar().unwrap_or_default().to_string(), i.line))
                .collect(),
            _ => {
                self.error(
                    ext.key_line,
                    format!(
                        "{ctx}: extends: expected a job name or a list of job names, found {}",
                        ext.value.describe()
                    ),
                );
                memo.insert(name.to_string(), None);
                return None;
            }
        };
        stack.push(name.to_string());
        let mut acc: Option<Node> = None;
        let mut ok = true;
        for (parent, line) in parents {
            if stack.contains(&parent) {
                let mut path = stack.clone();
                path.push(parent.clone());
                self.error(
                    line,
                    format!("{ctx}: extends: circular extends: {}", path.join(" -> ")),
                );
                ok = false;
                continue;
            }
            if stack.len() >= MAX_EXTENDS_DEPTH {
                self.error(
                    line,
                    format!("{ctx}: extends: nested more than {MAX_EXTENDS_DEPTH} levels deep"),
                );
                ok = false;
                continue;
            }
            match defs.get(parent.as_str()) {
                None => {
                    self.error(
                        line,
                        format!("{ctx}: extends: unknown job or template \"{parent}\""),
                    );
                    ok = false;
                }
                Some(p) if p.as_map().is_none() => {
                    self.error(
                        line,
                        format!(
                            "{ctx}: extends: \"{parent}\" is {}, not a mapping of job keys",
                            p.describe()
                        ),
                    );
                    ok = false;
                }
                Some(_) => match self.resolve(&parent, defs, memo, stack) {
                    Some(p) => {
                        acc = Some(match acc {
                            None => p,
                            Some(a) => deep_merge(&a, &p),
                        })
                    }
                    None => ok = false,
                },
            }
        }
        stack.pop();
        let own = node.without("extends");
        let result = if ok {
            Some(match acc {
                None => own,
                Some(a) => deep_merge(&a, &own),
            })
        } else {
            None
        };
        memo.insert(name.to_string(), result.clone());
        result
    }
}
