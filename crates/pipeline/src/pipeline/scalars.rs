//! Plain values as keys take them: strings, string lists, scripts, `variables:` and durations.

use std::time::Duration;

use super::{Reader, split_ctx};
use crate::yaml::{Kind, Node};
use slipway_job::model::Variable;

/// Deepest nesting of script lists accepted (GitLab's limit).
const MAX_SCRIPT_DEPTH: usize = 10;

impl Reader<'_> {
    /// A duration such as `30 minutes`.
    pub(super) fn duration(&mut self, what: &str, node: &Node) -> Option<Duration> {
        let Some(text) = node.as_scalar() else {
            self.error(
                node.line,
                format!("{what}: expected a duration, found {}", node.describe()),
            );
            return None;
        };
        let d = parse_duration(text);
        if d.is_none() {
            self.error(
                node.line,
                format!(
                    "{what}: invalid duration \"{text}\" (examples: \"1h 30m\", \"10 minutes\", \"3600\")"
                ),
            );
        }
        d
    }

    pub(super) fn string(&mut self, what: &str, node: &Node) -> Option<String> {
        match &node.kind {
            Kind::Scalar { text, .. } if !node.is_null() => Some(text.clone()),
            _ => {
                self.error(
                    node.line,
                    format!("{what}: expected a string, found {}", node.describe()),
                );
                None
            }
        }
    }

    pub(super) fn string_list(&mut self, what: &str, node: &Node) -> Option<Vec<String>> {
        let bad = |n: &Node| format!("{what}: expected a list of strings, found {}", n.describe());
        let Kind::Seq(items) = &node.kind else {
            self.error(node.line, bad(node));
            return None;
        };
        let mut out = Vec::new();
        for item in items {
            match item.as_scalar() {
                Some(s) => out.push(s.to_string()),
                None => {
                    let msg = format!(
                        "{what}: expected a list of strings, found {} in the list",
                        item.describe()
                    );
                    self.error(item.line, msg);
                    return None;
                }
            }
        }
        Some(out)
    }

    /// A script: a string, or a list of strings and (nested) lists of strings, flattened.
    pub(super) fn script(&mut self, what: &str, node: &Node) -> Option<Vec<String>> {
        let mut out = Vec::new();
        match &node.kind {
            Kind::Scalar { text, .. } if !node.is_null() => out.push(text.clone()),
            Kind::Seq(items) => {
                if !self.flatten(what, items, 1, &mut out) {
                    return None;
                }
            }
            _ => {
                self.error(
                    node.line,
                    format!(
                        "{what}: expected a string or a list of strings, found {}",
                        node.describe()
                    ),
                );
                return None;
            }
        }
        Some(out)
    }

    fn flatten(&mut self, what: &str, items: &[Node], depth: usize, out: &mut Vec<String>) -> bool {
        if depth > MAX_SCRIPT_DEPTH {
            let line = items.first().map_or(1, |n| n.line);
            self.error(
                line,
                format!("{what}: lists nested more than {MAX_SCRIPT_DEPTH} levels deep"),
            );
            return false;
        }
        let mut ok = true;
        for item in items {
            match &item.kind {
                Kind::Scalar { text, .. } if !item.is_null() => out.push(text.clone()),
                Kind::Seq(inner) => ok &= self.flatten(what, inner, depth + 1, out),
                Kind::Map(_) => {
                    // The usual cause: an unquoted `: ` inside a line turns it into a mapping.
                    self.error(
                        item.line,
                        format!(
                            "{what}: expected a string or a list of strings, found a mapping \
                             (quote script lines that contain \": \")"
                        ),
                    );
                    ok = false;
                }
                _ => {
                    self.error(
                        item.line,
                        format!(
                            "{what}: expected a string or a list of strings, found {}",
                            item.describe()
                        ),
                    );
                    ok = false;
                }
            }
        }
        ok
    }

    /// `variables:`: `KEY: value` or `KEY: {value:, description:, expand:}`.
    pub(super) fn variables(&mut self, what: &str, node: &Node) -> Vec<Variable> {
        if node.is_null() {
            return Vec::new();
        }
        let Some(entries) = node.as_map() else {
            self.error(
                node.line,
                format!(
                    "{what}: expected a mapping of names to values, found {}",
                    node.describe()
                ),
            );
            return Vec::new();
        };
        let mut out = Vec::new();
        for e in entries {
            let v = &e.value;
            let mut var = Variable::new(e.key.clone(), "");
            let mut options: Option<(Vec<String>, usize)> = None;
            match &v.kind {
                Kind::Scalar { text, .. } => {
                    if !v.is_null() {
                        var.value = text.clone();
                    }
                }
                Kind::Map(fields) => {
                    for f in fields {
                        match f.key.as_str() {
                            "value" => match f.value.as_scalar() {
                                Some(s) => var.value = s.to_string(),
                                None if f.value.is_null() => {}
                                None => self.error(
                                    f.key_line,
                                    format!(
                                        "{what}: \"{}\": value: expected a string or a number, found {}",
                                        e.key,
                                        f.value.describe()
                                    ),
                                ),
                            },
                            "description" => {}
                            "options" => {
                                let what = format!("{what}: \"{}\": options", e.key);
                                options = self.string_list(&what, &f.value).map(|o| (o, f.key_line));
                            }
                            "expand" => match f.value.as_bool() {
                                Some(b) => var.raw = !b,
                                None => self.error(
                                    f.key_line,
                                    format!(
                                        "{what}: \"{}\": expand: expected true or false, found {}",
                                        e.key,
                                        f.value.describe()
                                    ),
                                ),
                            },
                            k => {
                                let (ctx, key) = split_ctx(what);
                                self.unsupported(f.key_line, ctx, &format!("{key}:{}:{k}", e.key))
                            }
                        }
                    }
                }
                Kind::Seq(_) | Kind::Reference(_) => {
                    self.error(
                        e.key_line,
                        format!(
                            "{what}: \"{}\": expected a string or a number, found {}",
                            e.key,
                            v.describe()
                        ),
                    );
                    continue;
                }
            }
            if let Some((options, line)) = options
                && !options.contains(&var.value)
            {
                self.error(
                    line,
                    format!(
                        "{what}: \"{}\": the value {:?} is not one of its options: {}",
                        e.key,
                        var.value,
                        options.join(", ")
                    ),
                );
            }
            out.push(var);
        }
        out
    }
}

/// Parses a GitLab human duration: `3600` (seconds), `30s`, `10 minutes`, `1h 30m`, `1h30m`,
/// `1.5 hours`, `2 days`, `1 hour and 30 minutes`, `01:30:00`. Months count 30 days, years 365.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let s = text.trim().to_ascii_lowercase();
    if s.is_empty() {
        return None;
    }
    let secs = if s.contains(':') {
        // hh:mm:ss or mm:ss
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() > 3 {
            return None;
        }
        let mut total = 0f64;
        for p in parts {
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            total = total * 60.0 + p.parse::<f64>().ok()?;
        }
        total
    } else {
        parse_units(&s)?
    };
    // Bound before converting: Duration::from_secs_f64 panics on overflow.
    if !(secs > 0.0 && secs <= 100.0 * 365.0 * 86400.0) {
        return None;
    }
    Some(Duration::from_secs_f64(secs))
}

fn parse_units(s: &str) -> Option<f64> {
    let bytes = s.as_bytes();
    let mut i = 0;
    let mut total = 0f64;
    let mut parts = 0;
    let mut bare = false;
    while i < bytes.len() {
        while i < bytes.len() && (bytes[i].is_ascii_whitespace() || bytes[i] == b',') {
            i += 1;
        }
        if i >= bytes.len() {
            break;
        }
        if s[i..].starts_with("and ") {
            i += 4;
            continue;
        }
        let start = i;
        while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'.') {
            i += 1;
        }
        if start == i {
            return None;
        }
        let n: f64 = s[start..i].parse().ok()?;
        while i < bytes.len() && bytes[i] == b' ' {
            i += 1;
        }
        let ustart = i;
        while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
            i += 1;
        }
        let unit = &s[ustart..i];
        let factor = match unit {
            "" => {
                bare = true;
                1.0
            }
            "s" | "sec" | "secs" | "second" | "seconds" => 1.0,
            "m" | "min" | "mins" | "minute" | "minutes" => 60.0,
            "h" | "hr" | "hrs" | "hour" | "hours" => 3600.0,
            "d" | "day" | "days" => 86400.0,
            "w" | "wk" | "wks" | "week" | "weeks" => 7.0 * 86400.0,
            "mo" | "mos" | "month" | "months" => 30.0 * 86400.0,
            "y" | "yr" | "yrs" | "year" | "years" => 365.0 * 86400.0,
            _ => return None,
        };
        total += n * factor;
        parts += 1;
    }
    // A number without a unit means seconds only when it stands alone ("3600"); in "1h 30" it is
    // ambiguous, so it is refused.
    if parts == 0 || (bare && parts > 1) {
        return None;
    }
    Some(total)
}
