//! `!reference [name, key, ...]`: a node stands for another part of the merged configuration.
//!
//! Resolved after every included file is merged and every `extends` applied, as GitLab does. A
//! referenced part may hold references itself (up to 10 levels). In a list, a reference to a
//! list is spliced in, so `script:` and `rules:` can mix references with their own items.

use crate::yaml::{Kind, Node};

/// Deepest chain of references through references (GitLab's limit).
const MAX_DEPTH: usize = 10;

/// Replaces every reference in `root`, collecting problems as (line, message).
pub(crate) fn resolve(root: &mut Node, errors: &mut Vec<(usize, String)>) {
    if !contains_reference(root) {
        return;
    }
    let original = root.clone();
    replace(root, &original, 0, errors);
}

fn contains_reference(node: &Node) -> bool {
    match &node.kind {
        Kind::Reference(_) => true,
        Kind::Scalar { .. } => false,
        Kind::Seq(items) => items.iter().any(contains_reference),
        Kind::Map(entries) => entries.iter().any(|e| contains_reference(&e.value)),
    }
}

fn replace(node: &mut Node, root: &Node, depth: usize, errors: &mut Vec<(usize, String)>) {
    match &mut node.kind {
        Kind::Reference(path) => {
            let path = path.clone();
            *node = target(&path, node.line, root, depth, errors);
        }
        Kind::Scalar { .. } => {}
        Kind::Map(entries) => {
            for e in entries.iter_mut() {
                replace(&mut e.value, root, depth, errors);
            }
        }
        Kind::Seq(items) => {
            let mut out = Vec::with_capacity(items.len());
            for mut item in std::mem::take(items) {
                let was_reference = matches!(item.kind, Kind::Reference(_));
                replace(&mut item, root, depth, errors);
                match item.kind {
                    Kind::Seq(inner) if was_reference => out.extend(inner),
                    _ => out.push(item),
                }
            }
            *items = out;
        }
    }
}

/// The node `path` names, its own references resolved; an empty list after an error.
fn target(
    path: &[String],
    line: usize,
    root: &Node,
    depth: usize,
    errors: &mut Vec<(usize, String)>,
) -> Node {
    let shown = format!("!reference [{}]", path.join(", "));
    let empty = Node {
        line,
        kind: Kind::Seq(Vec::new()),
    };
    if depth >= MAX_DEPTH {
        errors.push((
            line,
            format!("{shown}: references nested more than {MAX_DEPTH} deep (or a cycle)"),
        ));
        return empty;
    }
    let mut at = root;
    for (i, key) in path.iter().enumerate() {
        match at.get(key) {
            Some(e) => at = &e.value,
            None => {
                let whom = if i == 0 {
                    "the configuration".to_string()
                } else {
                    format!("\"{}\"", path[..i].join("."))
                };
                errors.push((line, format!("{shown}: {whom} has no key \"{key}\"")));
                return empty;
            }
        }
    }
    let mut found = at.clone();
    replace(&mut found, root, depth + 1, errors);
    found.line = line;
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml::parse;

    fn resolved(text: &str) -> (Node, Vec<(usize, String)>) {
        let mut root = parse(text).unwrap().unwrap();
        let mut errors = Vec::new();
        resolve(&mut root, &mut errors);
        (root, errors)
    }

    fn script(root: &Node, job: &str) -> Vec<String> {
        root.get(job)
            .unwrap()
            .value
            .get("script")
            .unwrap()
            .value
            .as_list()
            .unwrap()
            .iter()
            .map(|n| n.as_scalar().unwrap_or("<list>").to_string())
            .collect()
    }

    #[test]
    fn splices_lists_and_follows_chains() {
        let (root, errors) = resolved(
            ".a:\n  script: [one, two]\n.b:\n  script:\n    - !reference [.a, script]\n    - three\n\
             job:\n  script:\n    - zero\n    - !reference [.b, script]\n  variables: !reference [.v, variables]\n\
             .v:\n  variables: {X: '1'}\n",
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(script(&root, "job"), ["zero", "one", "two", "three"]);
        let vars = &root
            .get("job")
            .unwrap()
            .value
            .get("variables")
            .unwrap()
            .value;
        assert_eq!(vars.get("X").unwrap().value.as_scalar(), Some("1"));
    }

    #[test]
    fn missing_keys_and_cycles_are_errors() {
        let (_, errors) = resolved("job:\n  script: !reference [.nope, script]\n");
        assert_eq!(errors[0].0, 2);
        assert!(
            errors[0]
                .1
                .contains("the configuration has no key \".nope\"")
        );
        let (_, errors) = resolved(".a:\n  x: 1\njob:\n  script: !reference [.a, script]\n");
        assert!(
            errors[0].1.contains("\".a\" has no key \"script\""),
            "{errors:?}"
        );
        let (_, errors) =
            resolved(".a:\n  s: !reference [.a, s]\njob:\n  script: !reference [.a, s]\n");
        assert!(
            errors.iter().any(|e| e.1.contains("nested more than")),
            "{errors:?}"
        );
    }
}
