//! What `slipway exec` reads before it runs a local pipeline, and the files that pass between
//! its jobs: the pipeline with the checkout's predefined variables and the user's variables,
//! the project's files for every job, dotenv reports, and `artifacts:exclude`.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use slipway_artifacts::Globs;
use slipway_job::{JobResponse, Variable};
use slipway_pipeline::{Checkout, Pipeline, PipelineError, PipelineOptions};

use super::ExecOptions;

/// The variables file read from the project directory when none is named.
pub const DEFAULT_VARIABLES_FILE: &str = ".slipway-variables.yml";
/// Largest dotenv report read (GitLab's limit is 5 KiB; a little room for comments).
const MAX_DOTENV_BYTES: u64 = 64 * 1024;

/// Why a local pipeline could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The variables file cannot be read.
    #[error("cannot read the variables file {}", path.display())]
    VariablesFileUnreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        cause: std::io::Error,
    },
    /// The variables file holds something that is not variables.
    #[error(transparent)]
    VariablesFile(PipelineError),
    /// A `--variable` without `=`.
    #[error("--variable {given:?}: expected KEY=VALUE")]
    VariableSyntax {
        /// The argument as given.
        given: String,
    },
    /// A `--variable` whose key is not a variable name.
    #[error("--variable {given:?}: \"{key}\" is not a variable name (letters, digits, _)")]
    VariableName {
        /// The argument as given.
        given: String,
        /// Its key.
        key: String,
    },
    /// The pipeline file cannot be read or used.
    #[error(transparent)]
    Pipeline(PipelineError),
    /// A project file cannot be packed for the jobs.
    #[error("packing {} for the jobs", path.display())]
    Pack {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        cause: std::io::Error,
    },
    /// The project's files cannot be packed for the jobs.
    #[error("packing the project's files for the jobs")]
    PackAll(#[source] std::io::Error),
}

/// A pipeline ready to run.
#[derive(Debug)]
pub struct Read {
    /// The pipeline as GitLab would create it for this checkout.
    pub pipeline: Pipeline,
    /// The project's files as a tar stream, unpacked into every job's directory first.
    pub sources: Vec<u8>,
    /// Names of the user's variables (a dotenv report does not override them).
    pub user_keys: Vec<String>,
}

/// Reads the pipeline of `opts` and everything it needs (blocking: files and git); the
/// project's files only `with_sources` (a run, not a listing).
/// `notify` is told what the user should know as it happens (a variables file found by
/// itself), so it is said even when the reading then fails.
pub fn read(
    opts: &ExecOptions,
    with_sources: bool,
    notify: &mut dyn FnMut(String),
) -> Result<Read, ReadError> {
    let project_dir = match opts.file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let checkout = Checkout::read(&project_dir);
    let (variables_file, named) = match &opts.variables_file {
        Some(p) => (Some(p.clone()), true),
        None => {
            let p = project_dir.join(DEFAULT_VARIABLES_FILE);
            (p.is_file().then_some(p), false)
        }
    };
    let mut user = Vec::new();
    if let Some(path) = &variables_file {
        let text =
            std::fs::read_to_string(path).map_err(|cause| ReadError::VariablesFileUnreadable {
                path: path.clone(),
                cause,
            })?;
        user = slipway_pipeline::read_variables_file(&text, &path.display().to_string())
            .map_err(ReadError::VariablesFile)?;
        if !named {
            notify(format!("Variables from {}", path.display()));
        }
    }
    // `--variable` values are secrets unless said (`--plain-variable`); a plain value that
    // replaces a masked one stays masked, so an override never unmasks a secret.
    let given = (opts.variables.iter().map(|kv| (kv, true)))
        .chain(opts.plain_variables.iter().map(|kv| (kv, false)));
    for (kv, masked) in given {
        let Some((key, value)) = kv.split_once('=') else {
            return Err(ReadError::VariableSyntax { given: kv.clone() });
        };
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(ReadError::VariableName {
                given: kv.clone(),
                key: key.to_string(),
            });
        }
        let was_masked = user.iter().any(|v: &Variable| v.key == key && v.masked);
        user.retain(|v: &Variable| v.key != key);
        let mut v = Variable::new(key, value);
        v.masked = masked || was_masked;
        user.push(v);
    }
    let user_keys = user.iter().map(|v| v.key.clone()).collect();
    let pipeline = Pipeline::from_file(
        &opts.file,
        PipelineOptions {
            allow_unsupported: opts.allow_unsupported,
            project_dir: Some(project_dir.clone()),
            include_root: opts.include_root.clone(),
            predefined: checkout.variables,
            variables: user,
            changes_base: checkout.changes_base,
            offline: false,
        },
    )
    .map_err(ReadError::Pipeline)?;
    let skip: Vec<PathBuf> = variables_file.into_iter().collect();
    let sources = if !with_sources || pipeline.jobs.is_empty() {
        Vec::new()
    } else {
        project_tar(&project_dir, &skip)?
    };
    Ok(Read {
        pipeline,
        sources,
        user_keys,
    })
}

/// The project's files, as GitLab would check them out: what git tracks, and with a working
/// tree the files it does not ignore, as a tar stream. Outside a git checkout there is no
/// project to check out (and the pipeline's directory may hold anything, sockets and VM disks
/// included): jobs start empty, as before a checkout. Files in `skip` (the variables file:
/// secrets stay out of jobs' directories) and anything but regular files and symlinks are left
/// out.
pub fn project_tar(dir: &Path, skip: &[PathBuf]) -> Result<Vec<u8>, ReadError> {
    let listed = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    let files: Vec<String> = match listed {
        Ok(out) if out.status.success() => out
            .stdout
            .split(|b| *b == 0)
            .filter(|p| !p.is_empty())
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect(),
        _ => return Ok(Vec::new()),
    };
    let skip: Vec<PathBuf> = skip
        .iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect();
    let mut builder = tar::Builder::new(Vec::new());
    builder.follow_symlinks(false);
    let mut seen = std::collections::HashSet::new();
    for rel in files {
        let path = dir.join(&rel);
        // Deleted but still tracked, or listed twice (a conflict): nothing more to add.
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let kind = meta.file_type();
        if !(kind.is_file() || kind.is_symlink())
            || !seen.insert(rel.clone())
            || std::fs::canonicalize(&path).is_ok_and(|c| skip.contains(&c))
        {
            continue;
        }
        builder
            .append_path_with_name(&path, &rel)
            .map_err(|cause| ReadError::Pack {
                path: path.clone(),
                cause,
            })?;
    }
    builder.into_inner().map_err(ReadError::PackAll)
}

/// Adds dotenv variables to a job, each replacing one of its name.
pub fn add_dotenv(payload: &mut JobResponse, vars: Vec<Variable>) {
    for v in vars {
        payload.variables.retain(|p| p.key != v.key);
        payload.variables.push(v);
    }
}

/// The variables of the dotenv `files` in a collected artifacts tar.
pub fn dotenv_of(tar: &[u8], files: &[String]) -> Result<Vec<Variable>, String> {
    let mut archive = tar::Archive::new(tar);
    let mut vars = Vec::new();
    let entries = archive.entries().map_err(|e| e.to_string())?;
    for entry in entries {
        let mut entry = entry.map_err(|e| e.to_string())?;
        let path = entry
            .path()
            .map_err(|e| e.to_string())?
            .to_string_lossy()
            .trim_start_matches("./")
            .to_string();
        if !entry.header().entry_type().is_file() || !files.iter().any(|f| f == &path) {
            continue;
        }
        if entry.size() > MAX_DOTENV_BYTES {
            return Err(format!("{path} is larger than {MAX_DOTENV_BYTES} bytes"));
        }
        let mut text = String::new();
        entry
            .read_to_string(&mut text)
            .map_err(|e| format!("{path}: {e}"))?;
        let (found, problems) = slipway_pipeline::parse_dotenv(&text);
        if let Some(p) = problems.first() {
            return Err(format!("{path}: {p}"));
        }
        vars.extend(found);
    }
    Ok(vars)
}

/// A collected artifacts tar without the entries `exclude` matches (each entry's own path).
pub fn without_excluded(tar: &[u8], exclude: &[String]) -> Result<Vec<u8>, String> {
    if exclude.is_empty() {
        return Ok(tar.to_vec());
    }
    let globs = Globs::new(exclude).map_err(|e| e.to_string())?;
    let mut archive = tar::Archive::new(tar);
    let mut out = tar::Builder::new(Vec::new());
    for entry in archive.entries().map_err(|e| e.to_string())? {
        let mut entry = entry.map_err(|e| e.to_string())?;
        let path = entry
            .path()
            .map_err(|e| e.to_string())?
            .to_string_lossy()
            .into_owned();
        // Not recursive, as in GitLab: `dir` drops the directory's entry, `dir/**` its files.
        if globs.matches_exactly(&path) {
            continue;
        }
        let mut header = entry.header().clone();
        let mut data = Vec::new();
        entry.read_to_end(&mut data).map_err(|e| e.to_string())?;
        out.append_data(&mut header, &path, data.as_slice())
            .map_err(|e| e.to_string())?;
    }
    out.into_inner().map_err(|e| e.to_string())
}

/// The coverage `re` finds in one line of output: the first group of its match (else the
/// match), as the first number in it.
pub fn coverage_in(re: &regex::Regex, line: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(line);
    let caps = re.captures(&text)?;
    let hit = caps.get(1).or_else(|| caps.get(0))?.as_str();
    let start = hit.find(|c: char| c.is_ascii_digit())?;
    let number: String = hit[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    Some(number.trim_end_matches('.').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coverage_takes_the_first_number_of_the_match() {
        let re = regex::Regex::new(r"Total: +(\d+\.\d+)%").unwrap();
        assert_eq!(
            coverage_in(&re, b"Total:   87.50% of lines").as_deref(),
            Some("87.50")
        );
        assert_eq!(coverage_in(&re, b"nothing here"), None);
        let re = regex::Regex::new(r"lines\.+: \d+%").unwrap();
        assert_eq!(
            coverage_in(&re, b"lines......: 42% (10 of 24)").as_deref(),
            Some("42")
        );
    }

    #[test]
    fn dotenv_and_exclude_work_on_collected_tars() {
        let mut b = tar::Builder::new(Vec::new());
        for (path, data) in [
            ("build.env", "VERSION=1.2\n# c\nNAME='x y'\n"),
            ("out/a.log", "log"),
            ("out/b.bin", "bin"),
        ] {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, path, data.as_bytes()).unwrap();
        }
        let tar = b.into_inner().unwrap();
        let vars = dotenv_of(&tar, &["build.env".into()]).unwrap();
        assert_eq!(
            vars.iter()
                .map(|v| (v.key.as_str(), v.value.as_str()))
                .collect::<Vec<_>>(),
            [("VERSION", "1.2"), ("NAME", "x y")]
        );
        let kept = without_excluded(&tar, &["out/*.log".into()]).unwrap();
        let mut names = Vec::new();
        for e in tar::Archive::new(kept.as_slice()).entries().unwrap() {
            names.push(e.unwrap().path().unwrap().display().to_string());
        }
        assert_eq!(names, ["build.env", "out/b.bin"]);
    }
}
