//! Where `slipway exec` keeps jobs' `cache:` between runs of the same project.
//!
//! Jobs of a local run land on instances made for that run (their homes die with it), so the
//! runner's default cache directory would die with the run too. When the config leaves
//! `cache_dir` unset and jobs run on this machine, the cache goes to one directory per project
//! in the user's cache directory (`$XDG_CACHE_HOME/slipway/exec/<name>-<hash>`, else
//! `~/.cache/...`), shared by every local instance and bind-mounted at the same path into
//! docker-level job containers. It is kept out of the project itself: the project's files are
//! copied into every job, and a cache inside them would travel with each job and be picked up
//! by `cache:untracked` and artifact globs.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use sha1::{Digest as _, Sha1};
use slipway_config::{Executor, RunnerConfig};

/// The persisted cache directory of the project in `project_dir` (absolute, canonical), from
/// `env` (`XDG_CACHE_HOME`, `HOME`); `None` when neither names an absolute directory.
pub fn project_cache_dir(
    project_dir: &Path,
    env: &dyn Fn(&str) -> Option<OsString>,
) -> Option<PathBuf> {
    let abs = |v: OsString| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
    let base = env("XDG_CACHE_HOME")
        .and_then(abs)
        .or_else(|| env("HOME").and_then(abs).map(|h| h.join(".cache")))?;
    let name: String = project_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    // The path names the project; its hash keeps two projects of the same name apart.
    let digest = Sha1::digest(project_dir.as_os_str().as_encoded_bytes());
    let hash: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    let leaf = if name.is_empty() || name.starts_with('.') {
        hash
    } else {
        format!("{name}-{hash}")
    };
    Some(base.join("slipway").join("exec").join(leaf))
}

/// Whether `cfg` runs its jobs on this machine (local plugin instances, shell or docker) with no
/// `cache_dir` of its own: then the run's cache should be persisted for it.
pub fn wants_persisted_cache(cfg: &RunnerConfig) -> bool {
    let unset = cfg.cache_dir.as_deref().is_none_or(|d| d.trim().is_empty());
    let on_this_machine = match &cfg.executor {
        Executor::Shell | Executor::Docker => true,
        Executor::Instance | Executor::DockerAutoscaler => cfg
            .autoscaler
            .as_ref()
            .is_some_and(|a| crate::runner::plugin_name(&a.plugin) == "local"),
        _ => false,
    };
    unset && on_this_machine
}

/// `cfg` with its cache in `dir`: `cache_dir` set, and `dir` bind-mounted at the same path into
/// docker job containers, so docker-level jobs read and write the same archives. `None` when
/// the path cannot be a bind (Docker splits binds on `:`).
pub fn with_cache_dir(cfg: &RunnerConfig, dir: &Path) -> Option<RunnerConfig> {
    let dir = dir
        .to_str()
        .filter(|d| !d.contains(':') && !d.contains(','))?;
    let mut cfg = cfg.clone();
    cfg.cache_dir = Some(dir.to_string());
    let bind = format!("{dir}:{dir}");
    let docker = cfg.docker.get_or_insert_with(Default::default);
    if !docker.volumes.contains(&bind) {
        docker.volumes.push(bind);
    }
    Some(cfg)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<OsString> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn one_directory_per_project_under_the_user_cache() {
        let xdg = env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")]);
        let a = project_cache_dir(Path::new("/src/app"), &xdg).unwrap();
        assert!(a.starts_with("/x/slipway/exec"), "{a:?}");
        assert!(a.file_name().unwrap().to_string_lossy().starts_with("app-"));
        let b = project_cache_dir(Path::new("/other/app"), &xdg).unwrap();
        assert_ne!(a, b);
        let home = project_cache_dir(Path::new("/src/app"), &env(&[("HOME", "/h")])).unwrap();
        assert!(home.starts_with("/h/.cache/slipway/exec"), "{home:?}");
        // A relative XDG_CACHE_HOME is ignored, as the XDG spec says.
        let rel = env(&[("XDG_CACHE_HOME", "rel"), ("HOME", "/h")]);
        assert!(
            project_cache_dir(Path::new("/a"), &rel)
                .unwrap()
                .starts_with("/h")
        );
        assert_eq!(project_cache_dir(Path::new("/a"), &env(&[])), None);
    }

    #[test]
    fn the_embedded_default_persists_and_mounts_its_cache() {
        let loaded = slipway_config::parse(slipway_config::EMBEDDED, "embedded config").unwrap();
        let cfg = &loaded.config.runners[0];
        assert!(wants_persisted_cache(cfg));
        let out = with_cache_dir(cfg, Path::new("/c/slipway/p")).unwrap();
        assert_eq!(out.cache_dir.as_deref(), Some("/c/slipway/p"));
        let volumes = &out.docker.as_ref().unwrap().volumes;
        assert!(volumes.contains(&"/c/slipway/p:/c/slipway/p".to_string()));
        assert!(with_cache_dir(cfg, Path::new("/a:b")).is_none());
        let mut own = cfg.clone();
        own.cache_dir = Some("/mine".into());
        assert!(!wants_persisted_cache(&own));
    }
}
