//! Artifact and cache paths as GitLab Runner reads them: the job's variables expanded, then
//! made relative to the project directory. `$CI_PROJECT_DIR/out/`, `${CI_BUILDS_DIR}/...` and
//! an absolute path inside the project directory name project files; anything else outside it
//! is skipped with a warning, never collected.

use slipway_job::model::JobResponse;

use crate::script::JobDirs;

/// Variables whose values only the machine the job runs on knows (`$HOME` may be part of
/// them): [`expand`] leaves them as `${NAME}` for [`in_project`] to resolve.
const DIR_VARIABLES: [&str; 2] = ["CI_PROJECT_DIR", "CI_BUILDS_DIR"];

/// Stands for the root of a builds directory under `$HOME`, which no absolute path written in
/// a pipeline can name (NUL is never part of a path).
const HOME_BUILDS: &str = "\u{0}home-builds";

/// `value` with `$VAR` and `${VAR}` replaced by the job's variables, themselves expanded as the
/// job sees them (unknown ones by nothing), as GitLab Runner expands `artifacts:paths`,
/// `exclude` and `cache:paths`. `CI_PROJECT_DIR` and `CI_BUILDS_DIR`, unless the job sets them,
/// stay as `${CI_PROJECT_DIR}` and `${CI_BUILDS_DIR}`.
pub fn expand(value: &str, job: &JobResponse) -> String {
    if !value.contains('$') {
        return value.to_string();
    }
    let vars = slipway_job::expand_variables(&job.variables);
    slipway_job::variables::expand(
        value,
        &|name| match vars.iter().rev().find(|v| v.key == name) {
            Some(v) => Some(v.value.clone()),
            None if DIR_VARIABLES.contains(&name) => Some(format!("${{{name}}}")),
            None => None,
        },
    )
}

/// `path` (expanded by [`expand`]) relative to the project directory, `.` and `..` resolved
/// (`"."` for the directory itself); `None` when it is outside the project directory.
/// Absolute paths are resolved when the builds directory is absolute; under `$HOME` only the
/// `${CI_PROJECT_DIR}` and `${CI_BUILDS_DIR}` forms can name the project directory.
pub fn in_project(path: &str, dirs: &JobDirs) -> Option<String> {
    let builds = if dirs.builds_dir.starts_with('/') {
        format!("{}/slot-{}", dirs.builds_dir, dirs.slot)
    } else {
        format!("/{HOME_BUILDS}/slot-{}", dirs.slot)
    };
    let project = match &dirs.clone_path {
        Some(rel) => format!("{builds}/{rel}"),
        None => format!("{builds}/job-{}", dirs.job_id),
    };
    let absolute = if let Some(rest) = strip_variable(path, "CI_PROJECT_DIR") {
        format!("{project}/{rest}")
    } else if let Some(rest) = strip_variable(path, "CI_BUILDS_DIR") {
        format!("{builds}/{rest}")
    } else if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{project}/{path}")
    };
    let project = clean(&project)?;
    let target = clean(&absolute)?;
    let rel = target.strip_prefix(project.as_slice())?;
    Some(if rel.is_empty() {
        ".".to_string()
    } else {
        rel.join("/")
    })
}

/// `list` (an entry's `paths` or `exclude`, named `what` in warnings) made relative to the
/// project directory; those outside it are dropped with a warning in `trace`, as GitLab
/// Runner gives, not a failure.
pub fn relative_in_project(
    list: &[String],
    what: &str,
    dirs: &JobDirs,
    trace: &mut slipway_job::Trace,
) -> Vec<String> {
    list.iter()
        .filter_map(|p| {
            let rel = in_project(p, dirs);
            if rel.is_none() {
                let why = if p.starts_with('/') || p.starts_with('$') {
                    "is not inside the project directory"
                } else {
                    "leaves the project directory"
                };
                trace.message(&format!("WARNING: {what} {p:?} {why}; skipped"));
            }
            rel
        })
        .collect()
}

/// What follows `$NAME` or `${NAME}` at the start of `path`, when the reference is whole.
fn strip_variable<'a>(path: &'a str, name: &str) -> Option<&'a str> {
    let rest = path
        .strip_prefix(&format!("${{{name}}}"))
        .or_else(|| path.strip_prefix(&format!("${name}")))?;
    (rest.is_empty() || rest.starts_with('/')).then_some(rest)
}

/// The segments of an absolute path, `.` and `..` resolved; `None` when `..` climbs above `/`.
fn clean(path: &str) -> Option<Vec<&str>> {
    let mut parts = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            s => parts.push(s),
        }
    }
    Some(parts)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use slipway_job::Variable;

    fn job(vars: &[(&str, &str)]) -> JobResponse {
        JobResponse {
            variables: vars.iter().map(|(k, v)| Variable::new(*k, *v)).collect(),
            ..Default::default()
        }
    }

    fn dirs(builds_dir: &str, clone_path: Option<&str>) -> JobDirs {
        JobDirs {
            builds_dir: builds_dir.into(),
            slot: 2,
            job_id: 9,
            clone_path: clone_path.map(String::from),
        }
    }

    #[test]
    fn variables_expand_and_the_directories_stay_symbolic() {
        let j = job(&[("OUT", "$CI_PROJECT_DIR/build"), ("NAME", "app")]);
        // A variable's own reference stays as written, in either form resolved later.
        assert_eq!(
            expand("$OUT/${NAME}.bin", &j),
            "$CI_PROJECT_DIR/build/app.bin"
        );
        assert_eq!(expand("${CI_PROJECT_DIR}/x/", &j), "${CI_PROJECT_DIR}/x/");
        assert_eq!(expand("$CI_BUILDS_DIR/y", &j), "${CI_BUILDS_DIR}/y");
        assert_eq!(expand("$UNKNOWN/z", &j), "/z");
        assert_eq!(expand("plain/*.txt", &j), "plain/*.txt");
        let set = job(&[("CI_PROJECT_DIR", "/builds/p")]);
        assert_eq!(expand("$CI_PROJECT_DIR/x", &set), "/builds/p/x");
    }

    #[test]
    fn paths_inside_the_project_directory_become_relative() {
        for d in [dirs("builds", None), dirs("/srv/builds", None)] {
            let rel = |p: &str| in_project(p, &d);
            assert_eq!(rel("out/").as_deref(), Some("out"));
            assert_eq!(rel("./out/**/*.log").as_deref(), Some("out/**/*.log"));
            assert_eq!(rel("${CI_PROJECT_DIR}/out/").as_deref(), Some("out"));
            assert_eq!(rel("$CI_PROJECT_DIR/a b/c").as_deref(), Some("a b/c"));
            assert_eq!(rel("${CI_PROJECT_DIR}").as_deref(), Some("."));
            assert_eq!(rel("${CI_BUILDS_DIR}/job-9/x").as_deref(), Some("x"));
            assert_eq!(rel("a/../b").as_deref(), Some("b"));
            assert_eq!(rel("../x"), None);
            assert_eq!(rel("a/../../x"), None);
            assert_eq!(rel("${CI_PROJECT_DIR}/../x"), None);
            assert_eq!(rel("${CI_BUILDS_DIR}/job-8/x"), None);
            assert_eq!(rel("/etc/passwd"), None);
            assert_eq!(rel("$CI_PROJECT_DIRX/y"), Some("$CI_PROJECT_DIRX/y".into()));
        }
        let abs = dirs("/srv/builds", None);
        assert_eq!(
            in_project("/srv/builds/slot-2/job-9/out/a.txt", &abs).as_deref(),
            Some("out/a.txt")
        );
        assert_eq!(in_project("/srv/builds/slot-2/job-8/a", &abs), None);
        let cloned = dirs("/srv/builds", Some("group/proj"));
        assert_eq!(
            in_project("${CI_BUILDS_DIR}/group/proj/out", &cloned).as_deref(),
            Some("out")
        );
        assert_eq!(
            in_project("/srv/builds/slot-2/group/proj/out", &cloned).as_deref(),
            Some("out")
        );
    }
}
