//! Variable expansion as GitLab does it in configuration values: `$VAR` and `${VAR}` are
//! replaced by the variable's value (nothing when it is undefined), and `$$` stands for a
//! literal `$`.

use crate::model::{JobResponse, Variable};

/// `text` with `$VAR`, `${VAR}` and `$$` replaced, one level (values are not expanded again).
pub fn expand(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    expand_with(text, lookup, false)
}

/// [`expand`]; with `keep_undefined`, a reference to an undefined variable stays as written.
/// The one `$VAR` expander of the house: every other expansion goes through it.
pub fn expand_with(
    text: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
    keep_undefined: bool,
) -> String {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
            continue;
        }
        let (name, consumed) = if let Some(braced) = after.strip_prefix('{') {
            match braced.find('}') {
                Some(end) if end > 0 && braced[..end].chars().all(is_name) => {
                    (&braced[..end], end + 2)
                }
                _ => ("", 0),
            }
        } else {
            let end = after.find(|c: char| !is_name(c)).unwrap_or(after.len());
            (&after[..end], end)
        };
        if name.is_empty() {
            out.push('$');
            rest = after;
            continue;
        }
        match lookup(name) {
            Some(v) => out.push_str(&v),
            None if keep_undefined => out.push_str(&rest[at..at + 1 + consumed]),
            None => {}
        }
        rest = &after[consumed..];
    }
    out.push_str(rest);
    out
}

impl JobResponse {
    /// `text` with `$VAR` and `${VAR}` replaced by the job's variables as they are written
    /// (unknown ones by nothing, `$$` a literal `$`), as GitLab Runner expands cache keys,
    /// image names and the clone path.
    pub fn expand(&self, text: &str) -> String {
        expand(text, &|name| self.variable(name).map(str::to_string))
    }
}

/// Expands every variable's value in place, in order, against the variables before it and
/// itself excluded (as GitLab resolves `variables:` for rules): `raw` ones stay as written.
/// Nested references resolve because earlier values are already expanded.
pub fn expand_all(vars: &mut [Variable]) {
    for i in 0..vars.len() {
        if vars[i].raw || !vars[i].value.contains('$') {
            continue;
        }
        let (before, rest) = vars.split_at_mut(i);
        let me = &mut rest[0];
        let key = me.key.clone();
        me.value = expand(&me.value, &|n| {
            if n == key {
                return None;
            }
            before
                .iter()
                .rev()
                .find(|v| v.key == n)
                .map(|v| v.value.clone())
        });
    }
}

/// Job variables as a job sees them, as GitLab Runner expands them: each value's `$VAR`s are
/// replaced by those variables' own expanded values (the last of a name wins), `$$` is a
/// literal `$`, and raw (`expand: false`) and file-type values stay as written. A reference to
/// a variable the job does not have stays as written (the job's shell may know it), as do
/// references nested deeper than 10 (or circular ones).
pub fn expand_variables(vars: &[Variable]) -> Vec<Variable> {
    fn resolve(vars: &[Variable], name: &str, depth: usize) -> Option<String> {
        let v = vars.iter().rev().find(|v| v.key == name)?;
        if v.raw || v.file || depth > 10 || !v.value.contains('$') {
            return Some(v.value.clone());
        }
        Some(expand_with(
            &v.value,
            &|n| {
                if n == name {
                    None
                } else {
                    resolve(vars, n, depth + 1)
                }
            },
            true,
        ))
    }
    vars.iter()
        .map(|v| {
            if v.raw || v.file || !v.value.contains('$') {
                return v.clone();
            }
            let key = v.key.clone();
            let value = expand_with(
                &v.value,
                &|n| {
                    if n == key { None } else { resolve(vars, n, 1) }
                },
                true,
            );
            Variable { value, ..v.clone() }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_like_gitlab() {
        let look = |n: &str| match n {
            "A" => Some("1".to_string()),
            "LONG_NAME" => Some("x".to_string()),
            _ => None,
        };
        assert_eq!(expand("$A-${A}-$LONG_NAME", &look), "1-1-x");
        assert_eq!(expand("cost $$5 and $$A", &look), "cost $5 and $A");
        assert_eq!(expand("[$UNSET]", &look), "[]");
        assert_eq!(expand("a $ b ${ c", &look), "a $ b ${ c");
    }

    #[test]
    fn job_variables_expand_like_the_runner() {
        let vars = vec![
            Variable::new("BASE", "/opt/app"),
            Variable::new("BIN", "$BASE/bin"),
            Variable::new("FULL", "${BIN}:$BASE"),
            Variable::new("PRICE", "$$5"),
            Variable {
                raw: true,
                ..Variable::new("RAW", "$BASE-raw")
            },
            Variable::new("LOOP_A", "$LOOP_B"),
            Variable::new("LOOP_B", "$LOOP_A"),
            Variable::new("SHELL_ONES", "$HOME/x ${PATH}"),
        ];
        let out = expand_variables(&vars);
        let get = |k: &str| out.iter().find(|v| v.key == k).unwrap().value.as_str();
        assert_eq!(get("FULL"), "/opt/app/bin:/opt/app");
        assert_eq!(get("PRICE"), "$5");
        assert_eq!(get("RAW"), "$BASE-raw");
        assert_eq!(get("SHELL_ONES"), "$HOME/x ${PATH}");
        // A cycle ends, leaving the innermost reference as written.
        assert!(get("LOOP_A").len() < 100);
    }

    #[test]
    fn nested_values_resolve_in_order() {
        let mut vars = vec![
            Variable::new("BASE", "/opt"),
            Variable::new("BIN", "$BASE/bin"),
            Variable {
                raw: true,
                ..Variable::new("RAW", "$BASE")
            },
            Variable::new("PATHS", "${BIN}:$RAW"),
        ];
        expand_all(&mut vars);
        assert_eq!(vars[1].value, "/opt/bin");
        assert_eq!(vars[2].value, "$BASE");
        assert_eq!(vars[3].value, "/opt/bin:$BASE");
    }
}
