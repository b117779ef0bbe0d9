//! Plugins GitLab Runner installed from OCI references (`gitlab-runner fleeting install`), so a
//! `config.toml` naming `plugin = "aws"` or `"gitlab-org/fleeting/plugins/aws:1"` finds what is
//! already on the machine.
//!
//! GitLab's layout: `<root>/<registry>/<repository>/<name>/<version>/plugin`, the root being
//! `FLEETING_PLUGIN_PATH` or `~/.config/fleeting/plugins`; the registry defaults to
//! `registry.gitlab.com` and the repository to `gitlab-org/fleeting/plugins`. A constraint
//! (`latest`, `1`, `1.2`, `1.2.3`) picks the newest installed version it matches.

use std::path::{Path, PathBuf};

/// File name prefix of fleeting plugin executables.
pub const PLUGIN_PREFIX: &str = "fleeting-plugin-";
/// GitLab's default registry for plugin references.
pub const DEFAULT_REGISTRY: &str = "registry.gitlab.com";
/// GitLab's default repository for plugin references.
pub const DEFAULT_REPOSITORY: &str = "gitlab-org/fleeting/plugins";

/// A parsed plugin reference: `[[registry/]repository/]name[:constraint]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// Registry host.
    pub registry: String,
    /// Repository path.
    pub repository: String,
    /// Plugin name (`aws`).
    pub name: String,
    /// Version numbers the constraint fixes (empty: `latest`).
    pub constraint: Vec<u64>,
}

impl Reference {
    /// Parses a reference; `None` when it is not one (empty, a path, a bad constraint).
    pub fn parse(reference: &str) -> Option<Self> {
        let r = reference.trim();
        if r.is_empty() || r.starts_with('/') || r.starts_with('.') {
            return None;
        }
        let (path, constraint) = match r.rsplit_once(':') {
            // A colon before the last slash is a registry port, not a constraint.
            Some((p, c)) if !c.contains('/') => (p, Some(c)),
            _ => (r, None),
        };
        let constraint = match constraint {
            None | Some("latest") => Vec::new(),
            Some(c) => c
                .trim_start_matches('v')
                .split('.')
                .map(|n| n.parse::<u64>().ok())
                .collect::<Option<Vec<_>>>()
                .filter(|v| v.len() <= 3)?,
        };
        let parts: Vec<&str> = path.split('/').collect();
        if parts.iter().any(|p| p.is_empty() || *p == "..") {
            return None;
        }
        let (registry, repository, name) = match parts.as_slice() {
            [name] => (
                DEFAULT_REGISTRY.to_string(),
                DEFAULT_REPOSITORY.to_string(),
                *name,
            ),
            [repo @ .., name] if !repo[0].contains('.') && !repo[0].contains(':') => {
                (DEFAULT_REGISTRY.to_string(), repo.join("/"), *name)
            }
            [registry, repo @ .., name] if !repo.is_empty() => {
                ((*registry).to_string(), repo.join("/"), *name)
            }
            _ => return None,
        };
        let name = name.strip_prefix(PLUGIN_PREFIX).unwrap_or(name);
        Some(Self {
            registry,
            repository,
            name: name.to_string(),
            constraint,
        })
    }

    /// The plugin's directory under `root` (one subdirectory per installed version).
    pub fn dir(&self, root: &Path) -> PathBuf {
        root.join(&self.registry)
            .join(&self.repository)
            .join(&self.name)
    }
}

/// GitLab Runner's plugin root: `FLEETING_PLUGIN_PATH`, else `~/.config/fleeting/plugins`.
pub fn plugin_root() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FLEETING_PLUGIN_PATH").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".config/fleeting/plugins"))
}

/// A version directory name as numbers (`1.2.3`, `v1.2.3`).
fn version_of(name: &str) -> Option<Vec<u64>> {
    name.trim_start_matches('v')
        .split('.')
        .map(|n| n.parse().ok())
        .collect()
}

/// The newest installed version of `reference` under `root` its constraint allows: the path of
/// its `plugin` executable.
pub fn find_installed(reference: &Reference, root: &Path) -> Option<PathBuf> {
    let dir = reference.dir(root);
    let entries = std::fs::read_dir(&dir).ok()?;
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let version = version_of(&name)?;
            let fits = version.starts_with(&reference.constraint);
            let plugin = e.path().join("plugin");
            (fits && plugin.is_file()).then_some((version, plugin))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, p)| p)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn references_take_gitlabs_defaults() {
        let r = Reference::parse("aws").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.name.as_str()),
            (DEFAULT_REGISTRY, DEFAULT_REPOSITORY, "aws")
        );
        assert!(r.constraint.is_empty());
        let r = Reference::parse("gitlab-org/fleeting/plugins/aws:1").unwrap();
        assert_eq!(r.repository, DEFAULT_REPOSITORY);
        assert_eq!(r.constraint, vec![1]);
        let r = Reference::parse("registry.example.com:5000/team/hetzner:1.2").unwrap();
        assert_eq!(r.registry, "registry.example.com:5000");
        assert_eq!(r.repository, "team");
        assert_eq!(r.name, "hetzner");
        assert_eq!(r.constraint, vec![1, 2]);
        assert_eq!(Reference::parse("/usr/bin/plugin"), None);
        assert_eq!(Reference::parse("aws:one"), None);
    }

    #[test]
    fn the_newest_fitting_version_wins() {
        let root = tempfile::tempdir().unwrap();
        let r = Reference::parse("aws:1").unwrap();
        for v in ["0.9.0", "1.0.0", "1.4.2", "1.10.0", "2.0.0"] {
            let d = r.dir(root.path()).join(v);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("plugin"), b"").unwrap();
        }
        let found = find_installed(&r, root.path()).unwrap();
        assert!(found.ends_with("1.10.0/plugin"), "{}", found.display());
        let latest = Reference::parse("aws").unwrap();
        assert!(
            find_installed(&latest, root.path())
                .unwrap()
                .ends_with("2.0.0/plugin")
        );
        let none = Reference::parse("aws:3").unwrap();
        assert_eq!(find_installed(&none, root.path()), None);
    }
}
