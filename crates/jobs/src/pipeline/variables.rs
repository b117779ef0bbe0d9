//! Variable expansion as GitLab does it in configuration values: `$VAR` and `${VAR}` are
//! replaced by the variable's value (nothing when it is undefined), and `$$` stands for a
//! literal `$`.

/// `text` with `$VAR`, `${VAR}` and `$$` replaced, one level (values are not expanded again).
pub(crate) fn expand(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
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
        out.push_str(&lookup(name).unwrap_or_default());
        rest = &after[consumed..];
    }
    out.push_str(rest);
    out
}

/// Expands every variable's value in place, in order, against the variables before it and
/// itself excluded (as GitLab resolves `variables:` for rules): `raw` ones stay as written.
/// Nested references resolve because earlier values are already expanded.
pub(crate) fn expand_all(vars: &mut [crate::model::Variable]) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Variable;

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
