//! Bash scripts for a job's steps, fed to the instance's shell on stdin.

use std::fmt::Write as _;

use slipway_job::model::JobResponse;

/// Quote a string for bash as one single-quoted word.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Where a job lives on its instance.
#[derive(Debug, Clone)]
pub struct JobDirs {
    /// Builds root, relative to the login directory (`$HOME`) unless absolute.
    pub builds_dir: String,
    /// Slot number on the instance.
    pub slot: u32,
    /// Job id.
    pub job_id: u64,
    /// `GIT_CLONE_PATH` under the slot's directory (see [`clone_path_of`]); `None`: `job-<id>`.
    pub clone_path: Option<String>,
}

/// The job's `GIT_CLONE_PATH` as a path under `$CI_BUILDS_DIR` (the slot's directory),
/// variables expanded; `None` when unset. GitLab's rule: it has to be within `$CI_BUILDS_DIR`.
pub fn clone_path_of(job: &JobResponse) -> Result<Option<String>, String> {
    let Some(value) = job
        .variable("GIT_CLONE_PATH")
        .map(str::trim)
        .filter(|v| !v.is_empty())
    else {
        return Ok(None);
    };
    let outside = || format!("the GIT_CLONE_PATH={value:?} has to be within \"$CI_BUILDS_DIR\"");
    let rest = value
        .strip_prefix("${CI_BUILDS_DIR}")
        .or_else(|| value.strip_prefix("$CI_BUILDS_DIR"))
        .filter(|r| r.starts_with('/'))
        .ok_or_else(outside)?;
    let expanded = job.expand(rest);
    let mut parts = Vec::new();
    for seg in expanded.split('/') {
        match seg {
            "" | "." => {}
            ".." => return Err(outside()),
            s => parts.push(s),
        }
    }
    if parts.is_empty() {
        return Err(outside());
    }
    Ok(Some(parts.join("/")))
}

impl JobDirs {
    /// The slot's directory, as a bash expression.
    pub fn slot_dir(&self) -> String {
        let root = if self.builds_dir.starts_with('/') {
            quote(&self.builds_dir)
        } else {
            format!("\"$HOME\"/{}", quote(&self.builds_dir))
        };
        format!("{root}/slot-{}", self.slot)
    }

    /// The job's project directory, as a bash expression.
    pub fn project_dir(&self) -> String {
        match &self.clone_path {
            Some(rel) => format!("{}/{}", self.slot_dir(), quote(rel)),
            None => format!("{}/job-{}", self.slot_dir(), self.job_id),
        }
    }

    /// File holding the process-group id of a running step, as a bash expression.
    pub fn pid_file(&self, step: &str) -> String {
        format!("{}/.job-{}-{step}.pid", self.slot_dir(), self.job_id)
    }
}

/// `script` as fed to a shell reading it on stdin (`bash -s`): bash reads a script from a
/// pipe one byte at a time (a command of the script might read the rest), which for the few kB
/// of a job's exported variables costs milliseconds before its first line runs. When stdin is
/// a pipe (sshd's on Linux, ours locally), the first line has bash source the rest in one go;
/// elsewhere it reads on as before. No script of ours reads the shell's own stdin.
pub fn fed_on_stdin(script: &str) -> String {
    format!("if [ -p /dev/stdin ]; then . /dev/stdin; fi\n{script}")
}

/// A script that runs `lines` in the job directory with the job's variables, stopping at the
/// first failing line (`set -eo pipefail`, as GitLab's bash scripts do).
///
/// With `create_dir`, it first makes a fresh job directory. The body is one compound command
/// read whole before it runs, so a command that reads stdin cannot swallow the rest of the
/// script; stdin is `/dev/null` instead.
pub fn step_script(
    job: &JobResponse,
    dirs: &JobDirs,
    step: &str,
    lines: &[String],
    create_dir: bool,
) -> String {
    step_script_with(job, dirs, step, lines, create_dir, "")
}

/// [`step_script`] with `prologue` (bash lines) run first in the step's shell, before the
/// job's variables: an isolation level moving the step into the slot's cgroup, say.
pub fn step_script_with(
    job: &JobResponse,
    dirs: &JobDirs,
    step: &str,
    lines: &[String],
    create_dir: bool,
    prologue: &str,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "__slipway_step() {{");
    if create_dir {
        let dir = dirs.project_dir();
        let _ = writeln!(
            s,
            // A leftover directory exists only after a crash: skip the `rm` spawn otherwise.
            "{{ {{ [ ! -e {dir} ] || rm -rf {dir}; }} && mkdir -p {dir}; }} || {{ echo 'ERROR: cannot create the build directory' >&2; exit 1; }}"
        );
    }
    // The step's process group, for a kill on timeout or cancel; gone when the step ends so a
    // later kill cannot hit a reused pid.
    let pid = dirs.pid_file(step);
    let _ = writeln!(s, "echo $$ > {pid}");
    let _ = writeln!(s, "trap 'rm -f {}' EXIT", pid.replace('\'', r"'\''"));
    if !prologue.is_empty() {
        let _ = writeln!(s, "{}", prologue.trim_end());
    }
    let _ = writeln!(s, "set -eo pipefail");
    let _ = writeln!(s, "export CI_BUILDS_DIR={}", dirs.slot_dir());
    let _ = writeln!(s, "export CI_PROJECT_DIR={}", dirs.project_dir());
    let files_dir = format!("{}/.job-{}.vars", dirs.slot_dir(), job.id);
    // References between variables are resolved here, as GitLab Runner does; raw ones stay.
    for v in &slipway_job::expand_variables(&job.variables) {
        if !valid_name(&v.key) {
            continue;
        }
        if v.file {
            // Owner-only whatever the job's umask: the file holds a secret (its directory too).
            let _ = writeln!(
                s,
                "(umask 077 && mkdir -p {files_dir} && printf '%s' {} > {files_dir}/{})",
                quote(&v.value),
                v.key
            );
            let _ = writeln!(s, "export {}={files_dir}/{}", v.key, v.key);
        } else {
            let _ = writeln!(s, "export {}={}", v.key, quote(&v.value));
        }
    }
    let _ = writeln!(s, "cd \"$CI_PROJECT_DIR\"");
    for line in lines {
        let _ = writeln!(s, "printf '%s\\n' {}", quote(&format!("$ {line}")));
        let _ = writeln!(s, "{line}");
    }
    let _ = writeln!(s, "}}");
    let _ = writeln!(s, "__slipway_step < /dev/null");
    s
}

/// Create the job directory (and unpack `has_input` artifacts from stdin).
pub fn prepare_script(dirs: &JobDirs, has_input: bool) -> String {
    let dir = dirs.project_dir();
    let mut s = format!("set -e\nrm -rf {dir}\nmkdir -p {dir}\n");
    if has_input {
        let _ = writeln!(s, "tar -x -f - -C {dir}");
    }
    s
}

/// Unpack one more archive from stdin into the existing job directory.
pub fn unpack_script(dirs: &JobDirs) -> String {
    format!("set -e\ntar -x -f - -C {}\n", dirs.project_dir())
}

/// Write a tar of the matching paths (relative to the project directory; globs, `**`
/// included) to stdout. A path that matches nothing is a warning on stderr in GitLab Runner's
/// words, not a failure.
pub fn collect_script(dirs: &JobDirs, paths: &[String]) -> String {
    let mut s = format!(
        "set -e\nshopt -s globstar nullglob dotglob 2>/dev/null || :\ncd {}\n{}set --\n",
        dirs.project_dir(),
        inside_function("artifact", true),
    );
    for p in paths {
        // Without nullglob (busybox) an unmatched glob stays literal: keep only what exists.
        let _ = writeln!(
            s,
            "__n=0; for f in {}; do if {{ [ -e \"$f\" ] || [ -L \"$f\" ]; }} && __slipway_inside \"$f\"; then set -- \"$@\" \"$__p\"; __n=1; fi; done",
            glob_word(p)
        );
        let _ = writeln!(
            s,
            "if [ $__n -eq 0 ]; then echo {}\"$(pwd))\" >&2; fi",
            quote(&format!(
                "WARNING: {p}: no matching files. Ensure that the artifact path is relative to \
                 the working directory ("
            ))
        );
    }
    // 128 KiB records where tar takes `-b` (GNU tar, bsdtar): GNU tar's 10 KiB ones make writing
    // a large artifact about twice as slow. Busybox's tar has no `-b`.
    s.push_str(
        "__tb=; if tar -b 256 -c -f - -T /dev/null >/dev/null 2>&1; then __tb='-b 256'; fi\n\
         if [ $# -eq 0 ]; then tar -c -f - -T /dev/null; else tar $__tb -c -f - -- \"$@\"; fi\n",
    );
    s
}

/// A shell function (bash and busybox `sh` alike) for scripts run in the project directory:
/// `__slipway_inside PATH` sets `__p` to PATH without trailing slashes and succeeds when the
/// directory holding it is inside the project directory once symlinks are resolved; otherwise
/// it prints a warning naming the `what` path (on stderr with `to_stderr`) and fails. A path
/// that is itself a symlink stays a symlink in the archive (tar does not follow it), so only
/// the way to it is checked.
pub(crate) fn inside_function(what: &str, to_stderr: bool) -> String {
    let redirect = if to_stderr { " >&2" } else { "" };
    format!(
        "__slipway_root=$(pwd -P)\n\
         __slipway_inside() {{\n\
         \x20 __p=$1\n\
         \x20 while :; do case $__p in ?*/) __p=${{__p%/}};; *) break;; esac; done\n\
         \x20 __d=$(cd -- \"$(dirname -- \"$__p\")\" 2>/dev/null && pwd -P) || __d=\n\
         \x20 case \"$__d/\" in \"$__slipway_root\"/*) return 0;; esac\n\
         \x20 echo \"WARNING: {what} path \\\"$1\\\" leaves the project directory through a symlink; skipped\"{redirect}\n\
         \x20 return 1\n\
         }}\n"
    )
}

/// A path pattern as an unquoted bash word: glob characters expand, everything else is
/// escaped (a plain path with spaces still works through the glob).
pub(crate) fn glob_word(pattern: &str) -> String {
    pattern
        .chars()
        .map(|c| match c {
            '*' | '?' | '[' | ']' => c.to_string(),
            c if c.is_ascii_alphanumeric() || "/._-".contains(c) => c.to_string(),
            c => format!("\\{c}"),
        })
        .collect()
}

/// Kill a step's process group: TERM, wait up to `grace_secs`, then KILL.
///
/// Portable: `kill -s SIG -PGID` means the same to bash and to busybox/dash `sh` (which reject
/// `kill -SIG -- -PGID`), so a step in a busybox container is stopped too.
///
/// A step canceled right as it starts may not have written its pid yet: wait briefly for it.
pub fn kill_script(dirs: &JobDirs, step: &str, grace_secs: u32) -> String {
    let pid = dirs.pid_file(step);
    format!(
        "for _ in $(seq 1 20); do [ -s {pid} ] && break; sleep 0.1; done\n\
         p=$(cat {pid} 2>/dev/null) || exit 0\n[ -n \"$p\" ] || exit 0\n\
         kill -s TERM -\"$p\" 2>/dev/null || exit 0\n\
         for _ in $(seq 1 {}); do kill -s 0 -\"$p\" 2>/dev/null || exit 0; sleep 0.1; done\n\
         kill -s KILL -\"$p\" 2>/dev/null\nexit 0\n",
        grace_secs * 10
    )
}

/// Remove everything the job left in its slot.
pub fn cleanup_script(dirs: &JobDirs) -> String {
    let slot = dirs.slot_dir();
    let id = dirs.job_id;
    format!(
        "rm -rf {} {slot}/.job-{id}-*.pid {slot}/.job-{id}.vars {slot}/.job-{id}.tls\n",
        dirs.project_dir()
    )
}

/// Say which machine the job runs on (GitLab's `prepare_script` stage).
pub fn announce_host_script() -> String {
    "echo \"Running on $(hostname 2>/dev/null || uname -n)...\"\n".to_string()
}

/// Remove the job's file-type variables and pid files, keeping the project directory (GitLab's
/// `cleanup_file_variables` stage).
pub fn file_variables_cleanup_script(dirs: &JobDirs) -> String {
    let slot = dirs.slot_dir();
    let id = dirs.job_id;
    // `.tls`: what a killed `get_sources` stage could not remove itself.
    format!("rm -rf {slot}/.job-{id}.vars {slot}/.job-{id}-*.pid {slot}/.job-{id}.tls\n")
}

/// Run `script` in a subshell, then write its exit status to `status_file` when that file's
/// directory exists where the script runs, and exit with the same status.
///
/// A custom executor driver maps any failure to its own exit code; the file tells the runner
/// the script's real one when the driver runs the script on the runner's machine.
pub fn record_exit_status(script: &str, status_file: &str) -> String {
    let file = quote(status_file);
    let dir = quote(
        std::path::Path::new(status_file)
            .parent()
            .map(|p| p.to_string_lossy())
            .unwrap_or_default()
            .as_ref(),
    );
    format!(
        "(\n{}\n)\n__slipway_rc=$?\n\
         if [ -d {dir} ]; then printf '%s\\n' \"$__slipway_rc\" > {file} 2>/dev/null || :; fi\n\
         exit \"$__slipway_rc\"\n",
        script.trim_end()
    )
}

/// Variables whose names bash cannot export (they are not passed to the job).
pub fn unexportable_variables(job: &JobResponse) -> Vec<&str> {
    job.variables
        .iter()
        .filter(|v| !valid_name(&v.key))
        .map(|v| v.key.as_str())
        .collect()
}

fn valid_name(key: &str) -> bool {
    let mut chars = key.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {

    #[test]
    fn clone_paths_stay_within_the_builds_dir() {
        let with = |v: &str| {
            let mut job = JobResponse::default();
            for (k, val) in [("GIT_CLONE_PATH", v), ("CI_PROJECT_NAME", "proj")] {
                job.variables.push(slipway_job::Variable {
                    key: k.into(),
                    value: val.into(),
                    ..Default::default()
                });
            }
            clone_path_of(&job)
        };
        assert_eq!(
            with("$CI_BUILDS_DIR/group/$CI_PROJECT_NAME")
                .unwrap()
                .as_deref(),
            Some("group/proj")
        );
        assert_eq!(with("${CI_BUILDS_DIR}/./x/").unwrap().as_deref(), Some("x"));
        for bad in [
            "/tmp/x",
            "$CI_BUILDS_DIR/../x",
            "$CI_BUILDS_DIR",
            "$CI_BUILDS_DIRx/y",
        ] {
            let e = with(bad).unwrap_err();
            assert!(e.contains("has to be within"), "{bad}: {e}");
        }
        assert_eq!(clone_path_of(&JobResponse::default()).unwrap(), None);
    }
    use super::*;

    /// Runs `fed` with `bash -s`, stdin a pipe or (`file`) a regular file: (stdout, exit code).
    fn bash_s(fed: &str, file: bool) -> (String, i32) {
        use std::io::Write as _;
        use std::process::{Command, Stdio};
        let mut cmd = Command::new("bash");
        cmd.args(["--noprofile", "--norc", "-s"])
            .stdout(Stdio::piped());
        let out = if file {
            let mut f = tempfile::tempfile().unwrap();
            f.write_all(fed.as_bytes()).unwrap();
            std::io::Seek::rewind(&mut f).unwrap();
            cmd.stdin(f).output().unwrap()
        } else {
            let mut child = cmd.stdin(Stdio::piped()).spawn().unwrap();
            child
                .stdin
                .take()
                .unwrap()
                .write_all(fed.as_bytes())
                .unwrap();
            child.wait_with_output().unwrap()
        };
        (
            String::from_utf8(out.stdout).unwrap(),
            out.status.code().unwrap(),
        )
    }

    #[test]
    fn a_script_fed_on_stdin_runs_once_whether_stdin_is_a_pipe_or_not() {
        let fed = fed_on_stdin("f() {\n  echo one\n  exit 3\n}\nf < /dev/null\necho never\n");
        for file in [false, true] {
            assert_eq!(bash_s(&fed, file), ("one\n".to_string(), 3), "file: {file}");
        }
        // A command of the script reading the shell's stdin finds its end, not the script's
        // rest (which bash would otherwise hand it).
        let fed = fed_on_stdin("cat\necho after\n");
        assert_eq!(bash_s(&fed, false), ("after\n".to_string(), 0));
    }

    #[test]
    fn quotes_single_quotes() {
        assert_eq!(quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn relative_builds_dir_is_under_home() {
        let d = JobDirs {
            builds_dir: "builds".into(),
            slot: 1,
            job_id: 7,
            clone_path: None,
        };
        assert_eq!(d.project_dir(), "\"$HOME\"/'builds'/slot-1/job-7");
    }

    #[test]
    fn collecting_warns_of_paths_that_match_nothing_and_keeps_the_rest() {
        let root = tempfile::tempdir().unwrap();
        let dirs = JobDirs {
            builds_dir: root.path().display().to_string(),
            slot: 0,
            job_id: 1,
            clone_path: None,
        };
        let project = root.path().join("slot-0/job-1");
        std::fs::create_dir_all(project.join("out/my dir")).unwrap();
        std::fs::write(project.join("out/my dir/a.txt"), "a").unwrap();
        let paths = ["out/my dir/", "missing/", "reports/*.xml"].map(String::from);
        // The tar on stdout, listed, and read to its end as the executors read it (`tar -t`
        // stops at the end-of-archive blocks, before the record's padding).
        let listed = format!(
            "set -o pipefail\n(\n{}) | {{ tar -t -f -; cat > /dev/null; }}",
            collect_script(&dirs, &paths)
        );
        let out = std::process::Command::new("bash")
            .args(["-c", &listed])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let mut names: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
        names.sort();
        assert_eq!(names, ["out/my dir/", "out/my dir/a.txt"]);
        let err = String::from_utf8(out.stderr).unwrap();
        let wd = project.display();
        for p in ["missing/", "reports/*.xml"] {
            let want = format!(
                "WARNING: {p}: no matching files. Ensure that the artifact path is relative to the working directory ({wd})"
            );
            assert!(err.lines().any(|l| l == want), "{want:?} not in {err}");
        }
        assert!(!err.contains("out/my dir/:"), "{err}");
    }

    #[test]
    fn rejects_unsafe_variable_names() {
        assert!(valid_name("CI_JOB_ID"));
        assert!(!valid_name("A;rm -rf /"));
        assert!(!valid_name("1X"));
    }
}
