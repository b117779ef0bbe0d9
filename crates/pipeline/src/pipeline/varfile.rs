//! The user's variables file (`.slipway-variables.yml`): values a local run needs that do not
//! belong in the pipeline file, secrets first among them.
//!
//! A mapping of names to a value, or to `{value, masked, file, expand}`. Every value is masked
//! in job output unless it says `masked: false`; `file: true` hands the job a file holding the
//! value (its path in the variable), as GitLab's file-type variables do.

use super::{Diagnostic, PipelineError};
use crate::yaml::{self, Kind};
use slipway_job::model::Variable;

/// Reads a variables file's text; errors name `file_name` and the line.
pub fn read_variables_file(text: &str, file_name: &str) -> Result<Vec<Variable>, PipelineError> {
    let mut problems: Vec<(usize, String)> = Vec::new();
    let mut out = Vec::new();
    match yaml::parse_documents(text, 0, 1) {
        Err(errs) => problems.extend(errs.into_iter().map(|e| (e.line, e.message))),
        Ok(parsed) => {
            // Our own file: a variable set twice is a mistake to fix, not a value to guess.
            problems.extend(parsed.duplicates.iter().map(|d| {
                (
                    d.line,
                    format!(
                        "\"{}\" is set twice (lines {} and {})",
                        d.key, d.first_line, d.line
                    ),
                )
            }));
            let root = parsed.docs.into_iter().next();
            match root.as_ref().map(|r| (r, r.as_map())) {
                None => {}
                Some((r, _)) if r.is_null() => {}
                Some((r, None)) => problems.push((
                    r.line,
                    format!(
                        "expected a mapping of variable names to values, found {}",
                        r.describe()
                    ),
                )),
                Some((_, Some(entries))) => {
                    for e in entries {
                        let valid_name = !e.key.is_empty()
                            && e.key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                        if !valid_name {
                            problems.push((
                                e.key_line,
                                format!("\"{}\": a variable name is letters, digits and _", e.key),
                            ));
                            continue;
                        }
                        let mut v = Variable::new(e.key.clone(), "");
                        v.masked = true;
                        match &e.value.kind {
                            Kind::Scalar { text, .. } if !e.value.is_null() => v.value = text.clone(),
                            Kind::Map(fields) => {
                                for f in fields {
                                    let flag = || f.value.as_bool();
                                    match (f.key.as_str(), flag()) {
                                        ("value", _) => {
                                            v.value =
                                                f.value.as_scalar().unwrap_or_default().to_string()
                                        }
                                        ("masked", Some(b)) => v.masked = b,
                                        ("file", Some(b)) => v.file = b,
                                        ("expand", Some(b)) => v.raw = !b,
                                        ("description", _) => {}
                                        (k, _) => problems.push((
                                            f.key_line,
                                            format!(
                                                "\"{}\": {k}: expected value (a string), or masked, file or expand (true or false)",
                                                e.key
                                            ),
                                        )),
                                    }
                                }
                            }
                            _ => problems.push((
                                e.key_line,
                                format!(
                                    "\"{}\": expected a string or {{value, masked, file, expand}}, found {}",
                                    e.key,
                                    e.value.describe()
                                ),
                            )),
                        }
                        out.push(v);
                    }
                }
            }
        }
    }
    if problems.is_empty() {
        return Ok(out);
    }
    Err(PipelineError::Invalid {
        diagnostics: problems
            .into_iter()
            .map(|(line, message)| Diagnostic {
                file: file_name.to_string(),
                line,
                message,
                order: line,
            })
            .collect(),
    })
}

/// Variables of an `artifacts:reports:dotenv` file: `KEY=VALUE` lines (blank lines and `#`
/// comments skipped, one pair of surrounding quotes taken off a value); lines that are not
/// assignments are returned as problems, which GitLab would refuse the report for.
pub fn parse_dotenv(text: &str) -> (Vec<Variable>, Vec<String>) {
    let mut vars = Vec::new();
    let mut problems = Vec::new();
    for (n, line) in (1..).zip(text.lines()) {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            problems.push(format!("line {n}: expected KEY=VALUE"));
            continue;
        };
        let key = key.trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            problems.push(format!("line {n}: \"{key}\" is not a variable name"));
            continue;
        }
        let value = value.trim();
        let value = ['"', '\'']
            .iter()
            .find_map(|q| value.strip_prefix(*q).and_then(|v| v.strip_suffix(*q)))
            .unwrap_or(value);
        vars.push(Variable::new(key, value));
    }
    (vars, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_masked_unless_said() {
        let vars = read_variables_file(
            "TOKEN: s3cret\nPLAIN: {value: visible, masked: false}\nKEY: {value: \"-----BEGIN\", file: true}\n",
            "vars.yml",
        )
        .unwrap();
        assert_eq!(vars[0].value, "s3cret");
        assert!(vars[0].masked);
        assert!(!vars[1].masked);
        assert!(vars[2].file);
        let err = read_variables_file("A: [1]\nB-C: x\nD: {colour: red}\n", "vars.yml")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "vars.yml:1: \"A\": expected a string or {value, masked, file, expand}, found a list\n\
             vars.yml:2: \"B-C\": a variable name is letters, digits and _\n\
             vars.yml:3: \"D\": colour: expected value (a string), or masked, file or expand (true or false)"
        );
    }
}
