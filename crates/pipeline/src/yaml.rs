//! A tiny YAML tree with line numbers, built from the events of libyaml (its safe Rust port).
//!
//! GitLab reads `.gitlab-ci.yml` with Ruby's Psych, which is libyaml: the same parser here
//! accepts exactly what GitLab accepts (a flow sequence closed below its items' indentation, for
//! one). The tree keeps a line for every node, so every error can name one. A key written twice
//! in a mapping keeps its last value, as Psych does, with a warning naming both lines. Anchors
//! and aliases are resolved here, as are `<<` merge keys. GitLab's
//! `!reference [name, key, ...]` tag becomes a [`Kind::Reference`] node, resolved by the pipeline
//! loader once every included file is merged.
//!
//! Lines are offset by a base given to the parser, so nodes of several files can live in one tree
//! and still say which file they came from (see the pipeline's source map).

use std::collections::HashMap;

use libyaml_safer::{Event, EventData, Parser, ScalarStyle};

/// Deepest nesting accepted; deeper input is an error rather than a stack overflow.
const MAX_DEPTH: usize = 128;
/// Most nodes a document may expand to; guards against alias bombs ("billion laughs").
const MAX_NODES: usize = 500_000;

/// A problem found while reading YAML: a 1-based line and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct YamlError {
    pub line: usize,
    pub message: String,
}

/// A node with the line it starts on (1-based).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub line: usize,
    pub kind: Kind,
}

/// The shape of a node.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Kind {
    /// A scalar as written; `plain` is false when it was quoted or a block scalar, so `"true"` is
    /// a string, not a boolean, and `""` is not null.
    Scalar {
        text: String,
        plain: bool,
    },
    Seq(Vec<Node>),
    Map(Vec<Entry>),
    /// `!reference [name, key, ...]`: the path of the node it stands for.
    Reference(Vec<String>),
}

/// One key of a mapping, with the key's own line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    pub key: String,
    pub key_line: usize,
    pub value: Node,
}

impl Node {
    /// True for `~`, `null`, and an empty value.
    pub fn is_null(&self) -> bool {
        matches!(&self.kind, Kind::Scalar { text, plain: true }
            if matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL"))
    }

    /// The scalar text, if this is a non-null scalar.
    pub fn as_scalar(&self) -> Option<&str> {
        match &self.kind {
            Kind::Scalar { text, .. } if !self.is_null() => Some(text),
            _ => None,
        }
    }

    /// The value of a YAML boolean, if this is one: YAML 1.1's, as GitLab's Psych reads them
    /// (`true`, `yes`, `on` and `false`, `no`, `off`, in any casing).
    pub fn as_bool(&self) -> Option<bool> {
        match &self.kind {
            Kind::Scalar { text, plain: true } => {
                let is = |words: [&str; 3]| words.iter().any(|w| text.eq_ignore_ascii_case(w));
                if is(["true", "yes", "on"]) {
                    Some(true)
                } else if is(["false", "no", "off"]) {
                    Some(false)
                } else {
                    None
                }
            }
            _ => None,
        }
    }

    /// The items, if this is a list.
    pub fn as_list(&self) -> Option<&[Node]> {
        match &self.kind {
            Kind::Seq(items) => Some(items),
            _ => None,
        }
    }

    /// The entries, if this is a mapping.
    pub fn as_map(&self) -> Option<&[Entry]> {
        match &self.kind {
            Kind::Map(entries) => Some(entries),
            _ => None,
        }
    }

    /// The value under `key`, if this is a mapping that has it.
    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.as_map()?.iter().find(|e| e.key == key)
    }

    /// This mapping without the entry `key` (a node that is no mapping, as it is).
    pub fn without(&self, key: &str) -> Node {
        match &self.kind {
            Kind::Map(entries) => Node {
                line: self.line,
                kind: Kind::Map(entries.iter().filter(|e| e.key != key).cloned().collect()),
            },
            _ => self.clone(),
        }
    }

    /// How a user would name this node's type in an error message.
    pub fn describe(&self) -> &'static str {
        match &self.kind {
            _ if self.is_null() => "nothing (null)",
            Kind::Scalar { .. } if self.as_bool().is_some() => "a boolean",
            Kind::Scalar { text, plain: true } if text.parse::<f64>().is_ok() => "a number",
            Kind::Scalar { .. } => "a string",
            Kind::Seq(_) => "a list",
            Kind::Map(_) => "a mapping",
            Kind::Reference(_) => "a !reference",
        }
    }

    fn height(&self) -> usize {
        1 + match &self.kind {
            Kind::Scalar { .. } | Kind::Reference(_) => 0,
            Kind::Seq(items) => items.iter().map(Node::height).max().unwrap_or(0),
            Kind::Map(entries) => entries.iter().map(|e| e.value.height()).max().unwrap_or(0),
        }
    }

    fn size(&self) -> usize {
        1 + match &self.kind {
            Kind::Scalar { .. } => 0,
            Kind::Reference(path) => path.len(),
            Kind::Seq(items) => items.iter().map(Node::size).sum(),
            Kind::Map(entries) => entries.iter().map(|e| e.value.size()).sum(),
        }
    }
}

/// Parses one YAML document. `Ok(None)` for an empty stream. Errors are reported all at once
/// where parsing can go on; a syntax error stops it.
#[cfg(test)]
pub(crate) fn parse(text: &str) -> Result<Option<Node>, Vec<YamlError>> {
    let parsed = parse_documents(text, 0, 1)?;
    Ok(parsed.docs.into_iter().next())
}

/// The documents of a YAML stream, and the keys written twice in one mapping.
#[derive(Debug, Default)]
pub(crate) struct Parsed {
    /// The documents, in order.
    pub docs: Vec<Node>,
    /// Keys written twice; the tree holds the last value (Psych's rule).
    pub duplicates: Vec<Duplicate>,
}

/// A key written twice in one mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Duplicate {
    /// The key.
    pub key: String,
    /// Where it was written first, and again (with the base added).
    pub first_line: usize,
    pub line: usize,
}

impl Duplicate {
    /// The warning a pipeline reader prints: GitLab accepts the file.
    pub fn warning(&self, base: usize) -> YamlError {
        YamlError {
            line: self.line,
            message: format!(
                "duplicate key \"{}\" (lines {} and {}): the last value is used, as GitLab does",
                self.key,
                self.first_line - base,
                self.line - base
            ),
        }
    }
}

/// Parses up to `max_docs` YAML documents (separated by `---`), every line offset by `base`.
/// Anchors do not cross documents.
pub(crate) fn parse_documents(
    text: &str,
    base: usize,
    max_docs: usize,
) -> Result<Parsed, Vec<YamlError>> {
    // The libyaml port panics on a block scalar cut by the end of the input; a final line
    // break (which GitLab's editor and git add anyway) keeps it on its tested path.
    let owned;
    let (text, added_break) = if text.is_empty() || text.ends_with('\n') {
        (text, None)
    } else {
        owned = format!("{text}\n");
        (owned.as_str(), Some(text.len() as u64))
    };
    let last_line = std::cell::Cell::new(base + 1);
    // Defence in depth: the port still has a `todo!` (a tag directly followed by `,` in a
    // flow collection); a panic there is an error about the file, not a crash.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        build(text, base, max_docs, added_break, &last_line)
    }))
    .unwrap_or_else(|_| {
        Err(vec![YamlError {
            line: last_line.get(),
            message: "invalid YAML: the parser cannot read what follows this line (a tag \
                      directly followed by \",\" in a flow collection is one known cause)"
                .into(),
        }])
    })
}

fn build(
    text: &str,
    base: usize,
    max_docs: usize,
    added_break: Option<u64>,
    last_line: &std::cell::Cell<usize>,
) -> Result<Parsed, Vec<YamlError>> {
    let mut input = text.as_bytes();
    let mut parser = Parser::new();
    parser.set_input_string(&mut input);
    let mut b = Builder {
        parser,
        anchors: HashMap::new(),
        errors: Vec::new(),
        duplicates: Vec::new(),
        nodes: 0,
        base,
        added_break,
        last_line,
    };
    match b.documents(max_docs) {
        Ok(docs) if b.errors.is_empty() => Ok(Parsed {
            docs,
            duplicates: b.duplicates,
        }),
        Ok(_) => Err(b.errors),
        Err(e) => {
            b.errors.push(e);
            Err(b.errors)
        }
    }
}

struct Builder<'r, 'b, 'l> {
    parser: Parser<&'b mut &'r [u8]>,
    /// Where the line break added to a file without a final one starts: a block scalar
    /// running into it gives it back, so the value is what Psych reads.
    added_break: Option<u64>,
    /// The line of the last event read, for an error after a panic of the parser.
    last_line: &'l std::cell::Cell<usize>,
    anchors: HashMap<String, Node>,
    /// Non-fatal problems (bad merge values, non-string keys); parsing goes on to find them all.
    errors: Vec<YamlError>,
    /// Keys written twice.
    duplicates: Vec<Duplicate>,
    nodes: usize,
    /// Added to every line (the file's place in the source map).
    base: usize,
}

impl Builder<'_, '_, '_> {
    fn next(&mut self) -> Result<(EventData, usize), YamlError> {
        match self.parser.parse() {
            Ok(Event {
                mut data,
                start_mark,
                end_mark,
                ..
            }) => {
                let line = self.base + start_mark.line as usize + 1;
                self.last_line.set(line);
                if let (
                    Some(at),
                    EventData::Scalar {
                        value,
                        style: ScalarStyle::Literal | ScalarStyle::Folded,
                        ..
                    },
                ) = (self.added_break, &mut data)
                    && end_mark.index >= at
                    && value.ends_with('\n')
                {
                    value.pop();
                }
                Ok((data, line))
            }
            Err(e) => {
                let line = e.problem_mark().map_or(1, |m| m.line as usize + 1);
                // Psych's wording: "did not find expected ',' or ']' while parsing a flow
                // sequence", with where that sequence started.
                let message = match (e.context(), e.context_mark()) {
                    (Some(ctx), Some(m)) => format!(
                        "invalid YAML: {} {ctx} started on line {}",
                        e.problem(),
                        m.line as usize + 1
                    ),
                    (Some(ctx), None) => format!("invalid YAML: {} {ctx}", e.problem()),
                    (None, _) => format!("invalid YAML: {}", e.problem()),
                };
                Err(YamlError {
                    line: self.base + line,
                    message,
                })
            }
        }
    }

    fn documents(&mut self, max_docs: usize) -> Result<Vec<Node>, YamlError> {
        let mut docs = Vec::new();
        loop {
            let (ev, line) = self.next()?;
            match ev {
                EventData::StreamStart { .. } | EventData::DocumentEnd { .. } => {}
                EventData::StreamEnd => return Ok(docs),
                EventData::DocumentStart { .. } => {
                    if docs.len() >= max_docs {
                        return Err(YamlError {
                            line,
                            message: if max_docs == 1 {
                                "more than one YAML document (`---`) is not supported".into()
                            } else {
                                format!("more than {max_docs} YAML documents (`---`)")
                            },
                        });
                    }
                    self.anchors.clear();
                    let (ev, line) = self.next()?;
                    docs.push(self.node(ev, line, 0)?);
                }
                other => {
                    // The parser always wraps nodes in a document; be defensive anyway.
                    docs.push(self.node(other, line, 0)?);
                }
            }
        }
    }

    fn count(&mut self, n: usize, line: usize) -> Result<(), YamlError> {
        self.nodes += n;
        if self.nodes > MAX_NODES {
            return Err(YamlError {
                line,
                message: format!(
                    "document too large: more than {MAX_NODES} nodes after expanding aliases"
                ),
            });
        }
        Ok(())
    }

    fn anchor(&mut self, name: Option<String>, node: &Node) {
        if let Some(name) = name {
            self.anchors.insert(name, node.clone());
        }
    }

    fn node(&mut self, ev: EventData, line: usize, depth: usize) -> Result<Node, YamlError> {
        if depth > MAX_DEPTH {
            return Err(YamlError {
                line,
                message: format!("nesting deeper than {MAX_DEPTH} levels"),
            });
        }
        match ev {
            EventData::Scalar {
                anchor,
                tag,
                value,
                style,
                ..
            } => {
                reject_tag(tag.as_deref(), line)?;
                self.count(1, line)?;
                let node = Node {
                    line,
                    kind: Kind::Scalar {
                        text: value,
                        plain: style == ScalarStyle::Plain,
                    },
                };
                self.anchor(anchor, &node);
                Ok(node)
            }
            EventData::Alias { anchor } => {
                let Some(node) = self.anchors.get(&anchor) else {
                    return Err(YamlError {
                        line,
                        message: "alias to an unknown anchor".into(),
                    });
                };
                // Aliases nest trees without nesting events: bound the height here too, so
                // that later recursion over the tree cannot overflow the stack.
                if depth + node.height() > MAX_DEPTH + 1 {
                    return Err(YamlError {
                        line,
                        message: format!(
                            "nesting deeper than {MAX_DEPTH} levels (through aliases)"
                        ),
                    });
                }
                let node = node.clone();
                self.count(node.size(), line)?;
                Ok(node)
            }
            EventData::SequenceStart { anchor, tag, .. } => {
                let reference = tag.as_deref() == Some(REFERENCE_TAG);
                if !reference {
                    reject_tag(tag.as_deref(), line)?;
                }
                self.count(1, line)?;
                let mut items = Vec::new();
                loop {
                    let (ev, l) = self.next()?;
                    if ev == EventData::SequenceEnd {
                        break;
                    }
                    items.push(self.node(ev, l, depth + 1)?);
                }
                let kind = if reference {
                    let path: Option<Vec<String>> = items
                        .iter()
                        .map(|i| i.as_scalar().map(String::from))
                        .collect();
                    match path {
                        Some(path) if !path.is_empty() => Kind::Reference(path),
                        _ => {
                            return Err(YamlError {
                                line,
                                message: "!reference expects a list of names, such as \
                                          !reference [.setup, script]"
                                    .into(),
                            });
                        }
                    }
                } else {
                    Kind::Seq(items)
                };
                let node = Node { line, kind };
                self.anchor(anchor, &node);
                Ok(node)
            }
            EventData::MappingStart { anchor, tag, .. } => {
                reject_tag(tag.as_deref(), line)?;
                self.count(1, line)?;
                let node = self.mapping(line, depth)?;
                self.anchor(anchor, &node);
                Ok(node)
            }
            other => Err(YamlError {
                line,
                message: format!("invalid YAML: unexpected {other:?}"),
            }),
        }
    }

    fn mapping(&mut self, line: usize, depth: usize) -> Result<Node, YamlError> {
        // Psych's order, which GitLab's is: entries in turn, each overwriting a key already
        // there in its place; a `<<` merges its mapping the same way, so keys written before a
        // `<<` are overwritten by it and keys written after it win.
        let mut entries: Vec<Entry> = Vec::new();
        // Keys written in this mapping itself (a second one is a duplicate; a merged one is not).
        let mut written: std::collections::HashSet<String> = std::collections::HashSet::new();
        loop {
            let (ev, key_line) = self.next()?;
            if ev == EventData::MappingEnd {
                break;
            }
            let key_node = self.node(ev, key_line, depth + 1)?;
            let (ev, l) = self.next()?;
            let mut value = self.node(ev, l, depth + 1)?;
            if matches!(&value.kind, Kind::Scalar { text, plain: true } if text.is_empty()) {
                // An empty value is reported where its key is, not on the next line.
                value.line = key_line;
            }
            let key = match &key_node.kind {
                Kind::Scalar { text, .. } => text.clone(),
                _ => {
                    self.errors.push(YamlError {
                        line: key_line,
                        message: format!(
                            "mapping keys must be strings, found {}",
                            key_node.describe()
                        ),
                    });
                    continue;
                }
            };
            if key == "<<" && matches!(key_node.kind, Kind::Scalar { plain: true, .. }) {
                for merged in self.merge_value(&value) {
                    match entries.iter_mut().find(|e| e.key == merged.key) {
                        Some(there) => *there = merged,
                        None => entries.push(merged),
                    }
                }
                continue;
            }
            let entry = Entry {
                key,
                key_line,
                value,
            };
            match entries.iter_mut().find(|e| e.key == entry.key) {
                Some(there) => {
                    if written.contains(&entry.key) {
                        self.duplicates.push(Duplicate {
                            key: entry.key.clone(),
                            first_line: there.key_line,
                            line: key_line,
                        });
                    }
                    *there = entry;
                }
                None => {
                    written.insert(entry.key.clone());
                    entries.push(entry);
                }
            }
        }
        Ok(Node {
            line,
            kind: Kind::Map(entries),
        })
    }

    /// The entries a `<<` value contributes: a mapping, or a list of mappings (earlier wins).
    fn merge_value(&mut self, value: &Node) -> Vec<Entry> {
        match &value.kind {
            Kind::Map(entries) => entries.clone(),
            Kind::Seq(items) => {
                let mut out: Vec<Entry> = Vec::new();
                for item in items {
                    match &item.kind {
                        Kind::Map(entries) => {
                            for e in entries {
                                if !out.iter().any(|o| o.key == e.key) {
                                    out.push(e.clone());
                                }
                            }
                        }
                        _ => self.errors.push(YamlError {
                            line: item.line,
                            message: format!(
                                "merge key \"<<\" expects a mapping or a list of mappings, found {}",
                                item.describe()
                            ),
                        }),
                    }
                }
                out
            }
            Kind::Scalar { .. } | Kind::Reference(_) => {
                self.errors.push(YamlError {
                    line: value.line,
                    message: format!(
                        "merge key \"<<\" expects a mapping or a list of mappings, found {}",
                        value.describe()
                    ),
                });
                Vec::new()
            }
        }
    }
}

/// GitLab's `!reference` tag (any handle spelling of it).
/// GitLab's `!reference` tag, as libyaml resolves it.
const REFERENCE_TAG: &str = "!reference";

/// Tags other than `!reference` change meaning; refusing them beats misreading them.
fn reject_tag(tag: Option<&str>, line: usize) -> Result<(), YamlError> {
    match tag {
        None => Ok(()),
        // Standard-schema tags (`!!str`, `!!int`, ...) only restate the type; accept them.
        Some(t) if t.starts_with("tag:yaml.org,2002:") => Ok(()),
        Some(t) => Err(YamlError {
            line,
            message: format!("YAML tag \"{t}\" is not supported"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: &Node) -> Vec<&str> {
        n.as_map().unwrap().iter().map(|e| e.key.as_str()).collect()
    }

    #[test]
    fn lines_anchors_and_merge_keys() {
        let text = "a: &x\n  k1: 1\n  k2: 2\nb:\n  <<: *x\n  k2: over\n  k3: 3\n";
        let root = parse(text).unwrap().unwrap();
        let b = root.get("b").unwrap();
        assert_eq!(b.key_line, 4);
        assert_eq!(keys(&b.value), vec!["k1", "k2", "k3"]);
        assert_eq!(b.value.get("k2").unwrap().value.as_scalar(), Some("over"));
        assert_eq!(
            b.value.get("k1").unwrap().key_line,
            2,
            "merged keys keep their line"
        );
        // Psych (GitLab): a `<<` after a key overwrites it; a key after the `<<` wins.
        let text =
            "t: &t {script: [from-t], stage: s}\njob:\n  script: [own]\n  <<: *t\n  stage: own\n";
        let root = parse(text).unwrap().unwrap();
        let job = &root.get("job").unwrap().value;
        let first = |k: &str| job.get(k).unwrap().value.as_list().map(|l| l[0].clone());
        assert_eq!(first("script").unwrap().as_scalar(), Some("from-t"));
        assert_eq!(job.get("stage").unwrap().value.as_scalar(), Some("own"));
    }

    #[test]
    fn references_and_documents() {
        let root = parse("a: !reference [.x, script]\n").unwrap().unwrap();
        assert_eq!(
            root.get("a").unwrap().value.kind,
            Kind::Reference(vec![".x".into(), "script".into()])
        );
        let docs = parse_documents("spec:\n  inputs: {}\n---\nb: 2\n", 100, 2)
            .unwrap()
            .docs;
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[1].get("b").unwrap().key_line, 104);
        let errs = parse_documents("a: 1\n---\nb: 2\n---\nc: 3\n", 0, 2).unwrap_err();
        assert_eq!(errs[0].line, 4);
    }

    #[test]
    fn duplicate_keys_keep_the_last_value_in_the_first_place() {
        let parsed = parse_documents("a: 1\nb: 2\na: 3\n", 10, 1).unwrap();
        let root = &parsed.docs[0];
        assert_eq!(keys(root), vec!["a", "b"]);
        assert_eq!(root.get("a").unwrap().value.as_scalar(), Some("3"));
        assert_eq!(root.get("a").unwrap().key_line, 13);
        let d = &parsed.duplicates[0];
        assert_eq!((d.first_line, d.line), (11, 13));
        assert_eq!(
            d.warning(10).message,
            "duplicate key \"a\" (lines 1 and 3): the last value is used, as GitLab does"
        );
    }

    #[test]
    fn what_libyaml_accepts_reads_the_same() {
        // A flow sequence closed below its items' indentation: libyaml (GitLab's Psych) takes it.
        let text = "job:\n  script: [\n    \"echo a\",\n    \"echo b\"\n]\n  stage: test\n";
        let root = parse(text).unwrap().unwrap();
        let job = &root.get("job").unwrap().value;
        let items: Vec<_> = job.get("script").unwrap().value.as_list().unwrap().to_vec();
        assert_eq!(items.len(), 2);
        assert_eq!(items[1].as_scalar(), Some("echo b"));
        assert_eq!(items[1].line, 4);
        assert_eq!(job.get("stage").unwrap().key_line, 6);
        // Standard tags restate the type; GitLab's !reference is kept; others are refused.
        let root = parse("a: !!str 1\nb: !reference [.x, y]\n")
            .unwrap()
            .unwrap();
        assert_eq!(root.get("a").unwrap().value.as_scalar(), Some("1"));
        assert!(matches!(
            root.get("b").unwrap().value.kind,
            Kind::Reference(_)
        ));
        // Inputs the libyaml port panics on are errors: a block scalar cut by the end of the
        // input, a tag followed by "," in a flow sequence.
        let root = parse("job:\n  script:\n    - |\n      echo hi")
            .unwrap()
            .unwrap();
        let script = &root.get("job").unwrap().value.get("script").unwrap().value;
        assert_eq!(script.as_list().unwrap()[0].as_scalar(), Some("echo hi"));
        // As Psych: a final line break kept when the file has one, and `|-` strips it anyway.
        let kept = parse("a: |\n  x\nb: |-\n  y").unwrap().unwrap();
        assert_eq!(kept.get("a").unwrap().value.as_scalar(), Some("x\n"));
        assert_eq!(kept.get("b").unwrap().value.as_scalar(), Some("y"));
        let with_break = parse("a: |\n  x\n").unwrap().unwrap();
        assert_eq!(with_break.get("a").unwrap().value.as_scalar(), Some("x\n"));
        let errs = parse("a: 1\nb: [!web, api]\n").unwrap_err();
        assert_eq!(errs[0].line, 2, "{errs:?}");
        let errs = parse("a: [1,\n").unwrap_err();
        assert_eq!(errs.len(), 1);
        assert!(errs[0].message.starts_with("invalid YAML: "), "{errs:?}");
    }

    #[test]
    fn scalars_keep_their_text_and_style() {
        let root = parse("a: 1.10\nb: \"true\"\nc: true\nd:\ne: ~\n")
            .unwrap()
            .unwrap();
        assert_eq!(root.get("a").unwrap().value.as_scalar(), Some("1.10"));
        assert_eq!(root.get("b").unwrap().value.as_bool(), None);
        assert_eq!(root.get("c").unwrap().value.as_bool(), Some(true));
        assert!(root.get("d").unwrap().value.is_null());
        assert!(root.get("e").unwrap().value.is_null());
        // YAML 1.1 booleans, as Psych reads them; quoted, they are strings.
        let root = parse("a: yes\nb: Off\nc: ON\nd: 'yes'\ne: y\n")
            .unwrap()
            .unwrap();
        let b = |k: &str| root.get(k).unwrap().value.as_bool();
        assert_eq!(
            (b("a"), b("b"), b("c")),
            (Some(true), Some(false), Some(true))
        );
        assert_eq!((b("d"), b("e")), (None, None));
    }

    #[test]
    fn hostile_input_is_an_error_not_a_crash() {
        assert_eq!(parse("").unwrap(), None);
        assert!(parse(&"[".repeat(10_000)).is_err());
        let bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n\
                    b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n\
                    c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n\
                    d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n\
                    e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n\
                    f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n";
        let errs = parse(bomb).unwrap_err();
        assert!(errs[0].message.contains("too large"), "{errs:?}");
        // Deep through aliases: each anchor nests the previous one 100 levels deeper.
        let mut deep = String::new();
        for i in 0..5 {
            deep.push_str(&format!("a{i}: &a{i} "));
            deep.push_str(&"[".repeat(100));
            if i > 0 {
                deep.push_str(&format!("*a{}", i - 1));
            }
            deep.push_str(&"]".repeat(100));
            deep.push('\n');
        }
        let errs = parse(&deep).unwrap_err();
        assert!(errs[0].message.contains("through aliases"), "{errs:?}");
        assert!(parse("a: !reference {x: 1}\n").is_err());
        assert!(parse("a: !reference []\n").is_err());
        assert!(parse("a: !other [x]\n").is_err());
        assert!(parse("a: *nope\n").is_err());
        assert!(parse("a: 1\n---\nb: 2\n").is_err());
    }
}
