//! The pipeline's files composed into one configuration tree, as GitLab composes them.
//!
//! `include:` takes a file name, or a list of names and mappings: `local` (relative to the
//! project directory, with `*`/`**` globs), `project` + `file` (read from
//! `<include root>/<project>/<file>`, a local checkout; `ref` is not checked out), `inputs` for
//! files with a `spec: inputs:` header, `remote` (fetched over HTTP(S), see [`super::remote`]),
//! and `rules` (`if`, `exists`, `when`). `template` and `component` would need GitLab's own
//! files and are refused, naming the line. Included files
//! may include others (cycles are refused). Every file's configuration is deep-merged in order
//! (mappings key by key, anything else replaced), and the including file's own keys go last, so
//! they win.
//!
//! Lines of every file live in one number space: file `k`'s line `n` is `k * STRIDE + n`, so a
//! node anywhere in the merged tree still says where it was written ([`Sources::locate`]).

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use super::expr::Expr;
use super::glob;
use super::rules::Facts;
use crate::yaml::{self, Entry, Kind, Node};

/// Lines per file in the shared line space.
pub(crate) const STRIDE: usize = 1 << 24;
/// Most files one pipeline may include, nested ones counted (GitLab's limit).
const MAX_INCLUDES: usize = 150;
/// Largest included file read.
const MAX_FILE_BYTES: u64 = 4 << 20;

/// The files a pipeline was read from, in the order they were first read.
#[derive(Debug, Default, Clone)]
pub(crate) struct Sources {
    names: Vec<String>,
}

impl Sources {
    /// Registers a file; the base to add to its lines.
    pub(crate) fn add(&mut self, name: impl Into<String>) -> usize {
        self.names.push(name.into());
        (self.names.len() - 1) * STRIDE
    }

    /// The file and its own line for a line of the shared space.
    pub(crate) fn locate(&self, line: usize) -> (&str, usize) {
        let name = self.names.get(line / STRIDE).map_or("?", String::as_str);
        (name, (line % STRIDE).max(1))
    }
}

/// What includes are resolved against.
pub(crate) struct IncludeContext<'a> {
    /// The project directory (`include:local` paths are relative to it).
    pub project_dir: &'a Path,
    /// Where `include:project` finds `<group>/<project>` checkouts.
    pub include_root: Option<&'a Path>,
    /// Variables known before the configuration is read (predefined, `--variable`), for
    /// `include:rules:if` and `$VAR`s in include paths.
    pub variables: &'a dyn Fn(&str) -> Option<String>,
    /// No network: `include:remote` is refused instead of fetched.
    pub offline: bool,
}

/// Composes the configuration tree, collecting problems as (line, message).
pub(crate) struct Composer<'a> {
    ctx: IncludeContext<'a>,
    pub sources: Sources,
    pub errors: Vec<(usize, String)>,
    /// What GitLab accepts but a reader should hear about (keys written twice), as (line, text).
    pub warnings: Vec<(usize, String)>,
    /// Files included so far.
    count: usize,
    /// The files being expanded, outermost first (a file in here is a cycle).
    chain: Vec<PathBuf>,
    /// The project's files, for globs and `exists`; handed on to the reader's rules.
    pub facts: Facts<'a>,
}

/// One file an `include:` entry names.
struct Target {
    path: PathBuf,
    /// For `include:remote`: the URL to fetch instead of reading `path`.
    remote: Option<String>,
    /// For `include:remote`: `integrity: sha256-<base64>`, with its line.
    integrity: Option<(String, usize)>,
    shown: String,
    inputs: Option<Node>,
    line: usize,
}

impl<'a> Composer<'a> {
    /// A composer over `ctx`, listing files through `facts`.
    pub(crate) fn new(ctx: IncludeContext<'a>, facts: Facts<'a>) -> Self {
        Composer {
            ctx,
            sources: Sources::default(),
            errors: Vec::new(),
            warnings: Vec::new(),
            count: 0,
            chain: Vec::new(),
            facts,
        }
    }

    fn error(&mut self, line: usize, message: impl Into<String>) {
        self.errors.push((line, message.into()));
    }

    /// The whole configuration of the pipeline file `text` (named `name`, at `path` when it is
    /// on disk); `None` when its YAML cannot be read (the reasons are in `errors`).
    pub(crate) fn root(&mut self, text: &str, name: &str, path: Option<&Path>) -> Option<Node> {
        let base = self.sources.add(name);
        let body = self.document(text, base, None, base + 1)?;
        if let Some(p) = path {
            self.chain
                .push(std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()));
        }
        let out = self.expand(body);
        self.chain.pop();
        Some(out)
    }

    /// Parses a file's text: its body, with `spec:inputs` from a header document applied.
    fn document(
        &mut self,
        text: &str,
        base: usize,
        inputs: Option<&Node>,
        include_line: usize,
    ) -> Option<Node> {
        let docs = match yaml::parse_documents(text, base, 2) {
            Ok(parsed) => {
                self.warnings.extend(
                    parsed
                        .duplicates
                        .iter()
                        .map(|d| d.warning(base))
                        .map(|w| (w.line, w.message)),
                );
                parsed.docs
            }
            Err(errs) => {
                for e in errs {
                    self.error(e.line, e.message);
                }
                return None;
            }
        };
        let mut docs = docs.into_iter();
        let (header, body) = match (docs.next(), docs.next()) {
            (None, _) => (None, None),
            (Some(only), None) => (None, Some(only)),
            (Some(first), Some(second)) => (Some(first), Some(second)),
        };
        let spec = match &header {
            Some(h) => {
                let ok = h
                    .as_map()
                    .is_some_and(|m| m.iter().all(|e| e.key == "spec"));
                if !ok {
                    self.error(
                        h.line,
                        "a file of two YAML documents must start with a header holding only \
                         \"spec\" (then `---`, then the configuration)",
                    );
                    return None;
                }
                h.get("spec").map(|e| e.value.clone())
            }
            None => None,
        };
        let body = body.unwrap_or(Node {
            line: base + 1,
            kind: Kind::Map(Vec::new()),
        });
        let values = match (&spec, inputs) {
            (None, None) => return Some(body),
            (None, Some(given)) => {
                self.error(
                    given.line,
                    "include: inputs: the included file declares no inputs (it has no \
                     `spec: inputs:` header)",
                );
                return None;
            }
            (Some(spec), given) => self.input_values(spec, given, include_line)?,
        };
        let mut body = body;
        self.interpolate(&mut body, &values);
        Some(body)
    }

    /// Applies `include:` of `node` (a file's configuration) recursively.
    fn expand(&mut self, node: Node) -> Node {
        let Kind::Map(entries) = &node.kind else {
            return node;
        };
        let Some(include) = entries.iter().find(|e| e.key == "include").cloned() else {
            return node;
        };
        let own = node.without("include");
        let mut acc: Option<Node> = None;
        for target in self.targets(&include) {
            let Some(conf) = self.load(target) else {
                continue;
            };
            acc = Some(match acc {
                None => conf,
                Some(a) => super::deep_merge(&a, &conf),
            });
        }
        match acc {
            None => own,
            Some(a) => super::deep_merge(&a, &own),
        }
    }

    /// Reads, parses and expands one included file.
    fn load(&mut self, t: Target) -> Option<Node> {
        self.count += 1;
        if self.count > MAX_INCLUDES {
            if self.count == MAX_INCLUDES + 1 {
                self.error(
                    t.line,
                    format!("include: more than {MAX_INCLUDES} files included"),
                );
            }
            return None;
        }
        let canonical = match t.remote {
            Some(_) => t.path.clone(),
            None => std::fs::canonicalize(&t.path).unwrap_or_else(|_| t.path.clone()),
        };
        if self.chain.contains(&canonical) {
            self.error(
                t.line,
                format!("include: {} includes itself (an include cycle)", t.shown),
            );
            return None;
        }
        let text = match &t.remote {
            Some(_) if self.ctx.offline => {
                Err("include:remote is not fetched: reading offline".to_string())
            }
            Some(url) => slipway_gitlab::remote::fetch(url, MAX_FILE_BYTES)
                .map_err(|e| format!("include:remote could not be fetched: {e}"))
                .and_then(|text| match &t.integrity {
                    Some((want, _)) => {
                        slipway_gitlab::remote::check_integrity(&text, want).map(|()| text)
                    }
                    None => Ok(text),
                }),
            None => match std::fs::metadata(&t.path) {
                Ok(m) if m.is_file() && m.len() <= MAX_FILE_BYTES => {
                    std::fs::read_to_string(&t.path).map_err(|e| e.to_string())
                }
                Ok(m) if m.is_file() => Err(format!("larger than {MAX_FILE_BYTES} bytes")),
                Ok(_) => Err("not a file".into()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err("does not exist".into()),
                Err(e) => Err(e.to_string()),
            },
        };
        let text = match text {
            Ok(t) => t,
            Err(why) => {
                self.error(t.line, format!("include: {}: {why}", t.shown));
                return None;
            }
        };
        let base = self.sources.add(t.shown.clone());
        let body = self.document(&text, base, t.inputs.as_ref(), t.line)?;
        if body.as_map().is_none() {
            self.error(
                body.line,
                format!(
                    "expected a mapping of keywords and jobs, found {}",
                    body.describe()
                ),
            );
            return None;
        }
        self.chain.push(canonical);
        let out = self.expand(body);
        self.chain.pop();
        Some(out)
    }

    /// The files an `include:` value names, rules applied.
    fn targets(&mut self, include: &Entry) -> Vec<Target> {
        let items: Vec<Node> = match &include.value.kind {
            Kind::Seq(items) => items.clone(),
            _ if include.value.is_null() => Vec::new(),
            _ => vec![include.value.clone()],
        };
        let mut out = Vec::new();
        for item in items {
            if let Some(text) = item.as_scalar() {
                let kind = if text.starts_with("http://") || text.starts_with("https://") {
                    "remote"
                } else {
                    "local"
                };
                let entry = Node {
                    line: item.line,
                    kind: Kind::Map(vec![Entry {
                        key: kind.into(),
                        key_line: item.line,
                        value: item.clone(),
                    }]),
                };
                out.extend(self.entry(&entry));
            } else if item.as_map().is_some() {
                out.extend(self.entry(&item));
            } else {
                self.error(
                    item.line,
                    format!(
                        "include: expected a file name or a mapping (local, project, ...), found {}",
                        item.describe()
                    ),
                );
            }
        }
        out
    }

    /// The files of one `include:` mapping.
    fn entry(&mut self, item: &Node) -> Vec<Target> {
        let entries = item.as_map().unwrap_or_default();
        let mut kind: Option<&Entry> = None;
        let (mut file, mut inputs, mut rules, mut integrity) = (None, None, None, None);
        for e in entries {
            match e.key.as_str() {
                "local" | "project" | "remote" | "template" | "component" => {
                    if let Some(first) = kind {
                        self.error(
                            e.key_line,
                            format!(
                                "include: \"{}\" and \"{}\" in one entry (one source per entry)",
                                first.key, e.key
                            ),
                        );
                        return Vec::new();
                    }
                    kind = Some(e);
                }
                "file" => file = Some(e),
                "ref" => {}
                "inputs" => inputs = Some(e.value.clone()),
                "rules" => rules = Some(e),
                "integrity" => integrity = Some(e),
                "cache" => {}
                k => self.error(
                    e.key_line,
                    format!(
                        "include: unknown key \"{k}\" (expected local, project, file, ref, \
                         remote, template, component, inputs or rules)"
                    ),
                ),
            }
        }
        let Some(kind) = kind else {
            self.error(
                item.line,
                "include: an entry needs local, project, remote, template or component",
            );
            return Vec::new();
        };
        if let Some(rules) = rules
            && !self.included_by_rules(rules)
        {
            return Vec::new();
        }
        let line = kind.key_line;
        match kind.key.as_str() {
            "local" => {
                let Some(path) = self.path_value("include:local", &kind.value) else {
                    return Vec::new();
                };
                self.local(&path, inputs, line)
            }
            "project" => {
                let Some(project) = self.path_value("include:project", &kind.value) else {
                    return Vec::new();
                };
                let files: Vec<(String, usize)> = match file.map(|f| &f.value) {
                    Some(v) if v.as_scalar().is_some() => {
                        vec![(v.as_scalar().unwrap_or_default().to_string(), v.line)]
                    }
                    Some(Node {
                        kind: Kind::Seq(items),
                        ..
                    }) => items
                        .iter()
                        .filter_map(|i| i.as_scalar().map(|s| (s.to_string(), i.line)))
                        .collect(),
                    _ => {
                        self.error(
                            line,
                            "include:project needs \"file\": a file name or a list of them",
                        );
                        return Vec::new();
                    }
                };
                let Some(root) = self.ctx.include_root else {
                    self.error(
                        line,
                        format!(
                            "include:project \"{project}\": slipway reads other projects from \
                             local checkouts: pass --include-root DIR, with the project at \
                             DIR/{project}"
                        ),
                    );
                    return Vec::new();
                };
                let root = root.join(&project);
                let mut out = Vec::new();
                for (f, l) in files {
                    let f = self.expand_vars(&f);
                    if !inside(&f) {
                        self.error(l, format!("include:file \"{f}\" leaves the project"));
                        continue;
                    }
                    let path = root.join(f.trim_start_matches('/'));
                    out.push(Target {
                        shown: path.display().to_string(),
                        path,
                        remote: None,
                        integrity: None,
                        inputs: inputs.clone(),
                        line: l,
                    });
                }
                out
            }
            "remote" => {
                let Some(url) = self.path_value("include:remote", &kind.value) else {
                    return Vec::new();
                };
                let written = kind.value.as_scalar().unwrap_or_default();
                let integrity = match integrity.map(|e| (e.value.as_scalar(), e)) {
                    None => None,
                    Some((Some(v), e)) => Some((v.to_string(), e.key_line)),
                    Some((None, e)) => {
                        self.error(
                            e.key_line,
                            "include: integrity: expected \"sha256-<base64 of the file's SHA-256>\"",
                        );
                        return Vec::new();
                    }
                };
                vec![Target {
                    path: PathBuf::from(&url),
                    // As written, without credentials or query: `$VAR`s may hold secrets.
                    shown: slipway_gitlab::remote::masked(written),
                    remote: Some(url),
                    integrity,
                    inputs,
                    line,
                }]
            }
            other => {
                let advice = match other {
                    "template" => {
                        "copy the template into the project and include it with include:local"
                    }
                    _ => {
                        "check the component's project out and include its template with \
                          include:project and --include-root"
                    }
                };
                self.error(
                    line,
                    format!("include:{other} needs the network, which slipway exec does not use: {advice}"),
                );
                Vec::new()
            }
        }
    }

    /// `include:local`: one file, or every `.yml`/`.yaml` file a glob matches.
    fn local(&mut self, path: &str, inputs: Option<Node>, line: usize) -> Vec<Target> {
        if !inside(path) {
            self.error(
                line,
                format!("include:local \"{path}\" leaves the project directory"),
            );
            return Vec::new();
        }
        let rel = path.trim_start_matches('/').trim_start_matches("./");
        if glob::is_pattern(rel) {
            let hits: Vec<String> = self
                .facts
                .listing()
                .iter()
                .filter(|f| (f.ends_with(".yml") || f.ends_with(".yaml")) && glob::matches(rel, f))
                .cloned()
                .collect();
            return hits
                .into_iter()
                .map(|f| Target {
                    path: self.ctx.project_dir.join(&f),
                    remote: None,
                    integrity: None,
                    shown: f,
                    inputs: inputs.clone(),
                    line,
                })
                .collect();
        }
        if !(rel.ends_with(".yml") || rel.ends_with(".yaml")) {
            self.error(
                line,
                format!("include:local \"{path}\": included files must end in .yml or .yaml"),
            );
            return Vec::new();
        }
        vec![Target {
            path: self.ctx.project_dir.join(rel),
            remote: None,
            integrity: None,
            shown: rel.to_string(),
            inputs,
            line,
        }]
    }

    /// A path-like string value with `$VAR`s expanded.
    fn path_value(&mut self, what: &str, node: &Node) -> Option<String> {
        match node.as_scalar() {
            Some(s) => Some(self.expand_vars(s)),
            None => {
                self.error(
                    node.line,
                    format!("{what}: expected a path, found {}", node.describe()),
                );
                None
            }
        }
    }

    fn expand_vars(&self, text: &str) -> String {
        slipway_job::variables::expand(text, &|n| (self.ctx.variables)(n))
    }

    /// `include:rules`: the first rule whose `if` and `exists` hold decides (`when: never`
    /// excludes); no rule holding excludes.
    fn included_by_rules(&mut self, rules: &Entry) -> bool {
        let Some(items) = rules.value.as_list() else {
            self.error(
                rules.key_line,
                format!(
                    "include:rules: expected a list of rules, found {}",
                    rules.value.describe()
                ),
            );
            return false;
        };
        for rule in items {
            let Some(entries) = rule.as_map() else {
                self.error(
                    rule.line,
                    format!(
                        "include:rules: expected a rule (if, exists, when), found {}",
                        rule.describe()
                    ),
                );
                return false;
            };
            let mut holds = true;
            let mut when_never = false;
            for e in entries {
                match e.key.as_str() {
                    "if" => match e.value.as_scalar().map(Expr::parse) {
                        Some(Ok(expr)) => holds &= expr.eval(self.ctx.variables),
                        Some(Err(err)) => {
                            self.error(e.value.line, format!("include:rules:if: {err}"));
                            return false;
                        }
                        None => {
                            self.error(e.value.line, "include:rules:if: expected an expression");
                            return false;
                        }
                    },
                    "exists" => {
                        let patterns: Vec<String> = match &e.value.kind {
                            Kind::Seq(items) => items
                                .iter()
                                .filter_map(|i| i.as_scalar().map(String::from))
                                .collect(),
                            _ => e.value.as_scalar().map(String::from).into_iter().collect(),
                        };
                        holds &= self.facts.exists(&patterns, self.ctx.variables);
                    }
                    "when" => match e.value.as_scalar() {
                        Some("never") => when_never = true,
                        Some("always") => {}
                        _ => {
                            self.error(
                                e.value.line,
                                "include:rules:when: expected never or always",
                            );
                            return false;
                        }
                    },
                    k => {
                        self.error(
                            e.key_line,
                            format!(
                                "include:rules: unknown key \"{k}\" (expected if, exists or when)"
                            ),
                        );
                        return false;
                    }
                }
            }
            if holds {
                return !when_never;
            }
        }
        false
    }

    /// The value of every declared input: given, else its default; checked against the spec.
    fn input_values(
        &mut self,
        spec: &Node,
        given: Option<&Node>,
        include_line: usize,
    ) -> Option<HashMap<String, Node>> {
        let declared: Vec<Entry> = match spec.get("inputs") {
            Some(e) if e.value.is_null() => Vec::new(),
            Some(e) => match e.value.as_map() {
                Some(m) => m.to_vec(),
                None => {
                    self.error(
                        e.value.line,
                        format!(
                            "spec:inputs: expected a mapping of input names, found {}",
                            e.value.describe()
                        ),
                    );
                    return None;
                }
            },
            None => Vec::new(),
        };
        let given: Vec<Entry> = match given {
            None => Vec::new(),
            Some(g) if g.is_null() => Vec::new(),
            Some(g) => match g.as_map() {
                Some(m) => m.to_vec(),
                None => {
                    self.error(
                        g.line,
                        format!(
                            "include: inputs: expected a mapping of input names to values, found {}",
                            g.describe()
                        ),
                    );
                    return None;
                }
            },
        };
        let mut ok = true;
        for g in &given {
            if !declared.iter().any(|d| d.key == g.key) {
                let names: Vec<&str> = declared.iter().map(|d| d.key.as_str()).collect();
                self.error(
                    g.key_line,
                    format!(
                        "include: inputs: unknown input \"{}\" (the file declares: {})",
                        g.key,
                        if names.is_empty() {
                            "none".to_string()
                        } else {
                            names.join(", ")
                        }
                    ),
                );
                ok = false;
            }
        }
        let mut values = HashMap::new();
        for d in &declared {
            let field = |k: &str| d.value.get(k).map(|e| e.value.clone());
            let value = given
                .iter()
                .find(|g| g.key == d.key)
                .map(|g| g.value.clone())
                .or_else(|| field("default"));
            let Some(value) = value else {
                self.error(
                    include_line,
                    format!(
                        "include: inputs: \"{}\" is required by the included file (line {} there) and has no default",
                        d.key,
                        d.key_line % STRIDE
                    ),
                );
                ok = false;
                continue;
            };
            let ty = field("type")
                .and_then(|t| t.as_scalar().map(String::from))
                .unwrap_or_else(|| "string".into());
            let type_ok = match ty.as_str() {
                "string" => value.as_scalar().is_some() || value.is_null(),
                "number" => value
                    .as_scalar()
                    .is_some_and(|s| s.parse::<f64>().is_ok() && value.as_bool().is_none()),
                "boolean" => value.as_bool().is_some(),
                "array" => value.as_list().is_some(),
                other => {
                    self.error(
                        d.key_line,
                        format!(
                            "spec:inputs: \"{}\": unknown type \"{other}\" (string, number, boolean or array)",
                            d.key
                        ),
                    );
                    ok = false;
                    continue;
                }
            };
            if !type_ok {
                self.error(
                    value.line,
                    format!(
                        "include: inputs: \"{}\" must be a {ty}, found {}",
                        d.key,
                        value.describe()
                    ),
                );
                ok = false;
                continue;
            }
            let text = value.as_scalar().unwrap_or_default().to_string();
            if let Some(options) = field("options").as_ref().and_then(|o| o.as_list()) {
                let allowed: Vec<&str> = options.iter().filter_map(Node::as_scalar).collect();
                if !allowed.contains(&text.as_str()) {
                    self.error(
                        value.line,
                        format!(
                            "include: inputs: \"{}\" is \"{text}\", not one of its options: {}",
                            d.key,
                            allowed.join(", ")
                        ),
                    );
                    ok = false;
                }
            }
            if let Some(re) = field("regex")
                .as_ref()
                .and_then(|r| r.as_scalar().map(String::from))
            {
                let re = re.trim_start_matches('/').trim_end_matches('/');
                match regex::Regex::new(re) {
                    Ok(r) if r.is_match(&text) => {}
                    Ok(_) => {
                        self.error(
                            value.line,
                            format!(
                                "include: inputs: \"{}\" is \"{text}\", which does not match /{re}/",
                                d.key
                            ),
                        );
                        ok = false;
                    }
                    Err(e) => {
                        self.error(
                            d.key_line,
                            format!("spec:inputs: \"{}\": regex: {e}", d.key),
                        );
                        ok = false;
                    }
                }
            }
            values.insert(d.key.clone(), value);
        }
        ok.then_some(values)
    }

    /// Replaces `$[[ inputs.NAME ]]` in every key and scalar of `node`.
    fn interpolate(&mut self, node: &mut Node, values: &HashMap<String, Node>) {
        match &mut node.kind {
            Kind::Scalar { text, .. } => {
                if !text.contains("$[[") {
                    return;
                }
                let line = node.line;
                match interpolate_text(text, values, self.ctx.variables) {
                    Ok(Interpolated::Whole(v)) => {
                        *node = Node { line, kind: v.kind };
                    }
                    Ok(Interpolated::Text(t)) => *text = t,
                    Err(e) => self.error(line, format!("interpolation: {e}")),
                }
            }
            Kind::Seq(items) => {
                for i in items {
                    self.interpolate(i, values);
                }
            }
            Kind::Map(entries) => {
                for e in entries.iter_mut() {
                    if e.key.contains("$[[") {
                        match interpolate_text(&e.key, values, self.ctx.variables) {
                            Ok(Interpolated::Text(t)) => e.key = t,
                            Ok(Interpolated::Whole(v)) => {
                                e.key = v.as_scalar().unwrap_or_default().to_string()
                            }
                            Err(err) => self.error(e.key_line, format!("interpolation: {err}")),
                        }
                    }
                    self.interpolate(&mut e.value, values);
                }
            }
            Kind::Reference(_) => {}
        }
    }
}

/// Whether a relative path stays inside its directory (no `..`).
fn inside(path: &str) -> bool {
    !Path::new(path.trim_start_matches('/'))
        .components()
        .any(|c| matches!(c, Component::ParentDir))
}

enum Interpolated {
    /// The whole scalar was one interpolation: the input's value, typed.
    Whole(Node),
    Text(String),
}

fn interpolate_text(
    text: &str,
    values: &HashMap<String, Node>,
    vars: &dyn Fn(&str) -> Option<String>,
) -> Result<Interpolated, String> {
    let mut out = String::new();
    let mut rest = text;
    let mut whole = None;
    while let Some(start) = rest.find("$[[") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 3..];
        let end = after
            .find("]]")
            .ok_or_else(|| format!("\"$[[\" without \"]]\" in {text:?}"))?;
        let inner = after[..end].trim();
        let mut parts = inner.split('|').map(str::trim);
        let key = parts.next().unwrap_or_default();
        let name = key
            .strip_prefix("inputs.")
            .ok_or_else(|| format!("unknown interpolation key \"{key}\" (expected inputs.NAME)"))?;
        let value = values
            .get(name)
            .ok_or_else(|| format!("unknown input \"{name}\" in {text:?}"))?;
        let mut s = match &value.kind {
            Kind::Seq(items) => format!(
                "[{}]",
                items
                    .iter()
                    .map(|i| format!("{:?}", i.as_scalar().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            _ => value.as_scalar().unwrap_or_default().to_string(),
        };
        let mut functions = false;
        for f in parts {
            functions = true;
            if f == "expand_vars" {
                s = slipway_job::variables::expand(&s, vars);
            } else if f == "posix_escape" {
                s = s
                    .chars()
                    .flat_map(|c| {
                        if c.is_ascii_alphanumeric() || "_-./:=@%+,".contains(c) {
                            vec![c]
                        } else {
                            vec!['\\', c]
                        }
                    })
                    .collect();
            } else if let Some(args) = f
                .strip_prefix("truncate(")
                .and_then(|a| a.strip_suffix(')'))
            {
                let nums: Vec<usize> = args
                    .split(',')
                    .map(|n| n.trim().parse::<usize>())
                    .collect::<Result<_, _>>()
                    .map_err(|_| format!("truncate: expected two whole numbers in \"{f}\""))?;
                let [offset, len] = nums[..] else {
                    return Err(format!("truncate: expected two whole numbers in \"{f}\""));
                };
                s = s.chars().skip(offset).take(len).collect();
            } else {
                return Err(format!(
                    "unknown function \"{f}\" (expand_vars, truncate(offset, length), posix_escape)"
                ));
            }
        }
        if start == 0 && after[end + 2..].is_empty() && out.is_empty() && !functions {
            whole = Some(value.clone());
        }
        out.push_str(&s);
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(match whole {
        Some(v) => Interpolated::Whole(v),
        None => Interpolated::Text(out),
    })
}

#[cfg(test)]
mod tests {
    use crate::pipeline::{Pipeline, PipelineOptions};
    use slipway_job::model::Variable;
    use std::path::Path;

    fn write(dir: &Path, files: &[(&str, &str)]) {
        for (name, text) in files {
            let p = dir.join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
    }

    fn read(dir: &Path, opts: PipelineOptions) -> Result<Pipeline, String> {
        Pipeline::from_file(dir.join(".gitlab-ci.yml"), opts)
            .map_err(|e| e.to_string().replace(&format!("{}/", dir.display()), ""))
    }

    fn names(p: &Pipeline) -> Vec<&str> {
        p.jobs.iter().map(|j| j.name.as_str()).collect()
    }

    #[test]
    fn local_globs_nested_and_the_including_file_wins() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            &[
                (
                    ".gitlab-ci.yml",
                    "include:\n  - local: /ci/base.yml\n  - ci/jobs/*.yml\n\
                     variables: {WHO: main}\nbuild:\n  script: [make release]\n",
                ),
                (
                    "ci/base.yml",
                    "include: ci/nested.yml\nvariables: {WHO: base, BASE: '1'}\n\
                     build:\n  stage: build\n  script: [make]\n  tags: [x]\n",
                ),
                ("ci/nested.yml", "nested:\n  script: echo nested\n"),
                ("ci/jobs/a.yml", "a:\n  script: echo a\n"),
                ("ci/jobs/b.yaml", "b:\n  script: echo b\n"),
                ("ci/jobs/sub/c.yml", "c:\n  script: echo c\n"),
                ("ci/jobs/notes.txt", "not yaml"),
            ],
        );
        let p = read(dir.path(), PipelineOptions::default()).unwrap();
        assert_eq!(names(&p), ["nested", "build", "a"]);
        let build = p.job("build").unwrap();
        // Deep merge: the main file's script replaces, the included stage and tags stay.
        assert_eq!(build.script, ["make release"]);
        assert_eq!(build.stage, "build");
        assert_eq!(build.tags, ["x"]);
        let var = |k: &str| {
            build
                .variables
                .iter()
                .find(|v| v.key == k)
                .map(|v| v.value.as_str())
        };
        assert_eq!(var("WHO"), Some("main"));
        assert_eq!(var("BASE"), Some("1"));
    }

    #[test]
    fn inputs_are_checked_and_interpolated() {
        let dir = tempfile::tempdir().unwrap();
        let tpl = "spec:\n  inputs:\n    stage:\n      default: test\n    name:\n    \
                   count:\n      type: number\n      default: 2\n    env:\n      options: [dev, prod]\n      default: dev\n\
                   ---\n\"$[[ inputs.name ]]-job\":\n  stage: $[[ inputs.stage ]]\n  parallel: $[[ inputs.count ]]\n  \
                   script: echo $[[ inputs.env ]] $[[ inputs.name | truncate(0,3) ]]\n";
        write(
            dir.path(),
            &[
                (
                    ".gitlab-ci.yml",
                    "include:\n  - local: tpl.yml\n    inputs: {name: lint, stage: build, count: 3}\n",
                ),
                ("tpl.yml", tpl),
            ],
        );
        let p = read(dir.path(), PipelineOptions::default()).unwrap();
        assert_eq!(names(&p), ["lint-job 1/3", "lint-job 2/3", "lint-job 3/3"]);
        assert_eq!(p.jobs[0].stage, "build");
        assert_eq!(p.jobs[0].script, ["echo dev lin"]);

        for (inputs, want) in [
            (
                "{stage: build}",
                ".gitlab-ci.yml:2: include: inputs: \"name\" is required",
            ),
            (
                "{name: x, nope: 1}",
                ".gitlab-ci.yml:3: include: inputs: unknown input \"nope\"",
            ),
            (
                "{name: x, env: qa}",
                "\"env\" is \"qa\", not one of its options: dev, prod",
            ),
            (
                "{name: x, count: many}",
                "\"count\" must be a number, found a string",
            ),
        ] {
            write(
                dir.path(),
                &[(
                    ".gitlab-ci.yml",
                    &format!("include:\n  - local: tpl.yml\n    inputs: {inputs}\n"),
                )],
            );
            let err = read(dir.path(), PipelineOptions::default()).unwrap_err();
            assert!(err.contains(want), "{inputs}: {err}");
        }
    }

    #[test]
    fn rules_project_and_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        write(
            root.path(),
            &[("group/lib/ci/t.yml", "from-lib:\n  script: echo lib\n")],
        );
        write(
            dir.path(),
            &[
                (
                    ".gitlab-ci.yml",
                    "include:\n  - local: dev.yml\n    rules:\n      - if: $CI_COMMIT_BRANCH == \"dev\"\n\
                     \x20 - local: docker.yml\n    rules:\n      - exists: [Dockerfile]\n\
                     \x20 - project: group/lib\n    ref: v1\n    file: [/ci/t.yml]\nmain:\n  script: echo\n",
                ),
                ("dev.yml", "dev:\n  script: echo dev\n"),
                ("docker.yml", "docker:\n  script: echo docker\n"),
            ],
        );
        let opts = |branch: &str| PipelineOptions {
            include_root: Some(root.path().to_path_buf()),
            variables: vec![Variable::new("CI_COMMIT_BRANCH", branch)],
            ..PipelineOptions::default()
        };
        let p = read(dir.path(), opts("main")).unwrap();
        assert_eq!(names(&p), ["from-lib", "main"]);
        std::fs::write(dir.path().join("Dockerfile"), "FROM scratch\n").unwrap();
        let p = read(dir.path(), opts("dev")).unwrap();
        assert_eq!(names(&p), ["dev", "docker", "from-lib", "main"]);

        let err = read(dir.path(), PipelineOptions::default()).unwrap_err();
        assert!(err.contains(".gitlab-ci.yml:8: include:project \"group/lib\": slipway reads other projects from local checkouts: pass --include-root DIR"), "{err}");

        for (text, want) in [
            (
                "include:\n  - template: Auto-DevOps.gitlab-ci.yml\n",
                ".gitlab-ci.yml:2: include:template needs the network",
            ),
            (
                "include: missing.yml\n",
                ".gitlab-ci.yml:1: include: missing.yml: does not exist",
            ),
            ("include: ../outside.yml\n", "leaves the project directory"),
            ("include: self.yml\n", "self.yml includes itself"),
            (
                "include: bad.yml\n",
                "bad.yml:2: job \"j\": unknown key \"scirpt\"",
            ),
        ] {
            write(
                dir.path(),
                &[
                    (".gitlab-ci.yml", &format!("{text}x:\n  script: echo\n")),
                    ("self.yml", "include: self.yml\n"),
                    ("bad.yml", "j:\n  scirpt: x\n  script: y\n"),
                ],
            );
            let err = read(dir.path(), PipelineOptions::default()).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
        }
    }
}
