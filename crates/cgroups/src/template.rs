//! Slot cgroup templates (`slot_cgroup_template`) and the relative paths they expand to.

use std::fmt;

use crate::error::{CgroupError, Result};

/// The placeholder for the slot number in Slipway's syntax; GitLab's `${slot}` is accepted too.
pub const SLOT_PLACEHOLDER: &str = "{slot}";

/// The placeholder for the instance's id: instances that share one kernel (the local plugin's
/// test hosts) keep their slots apart with it.
pub const INSTANCE_PLACEHOLDER: &str = "{instance}";

/// Slipway's default slot cgroup template.
pub const DEFAULT_TEMPLATE: &str = "slipway/slot-{slot}";

/// The default for instances that share this host's cgroupfs (the local plugin's): each
/// instance gets its own subtree, as a real instance has its own hierarchy.
pub const PER_INSTANCE_TEMPLATE: &str = "slipway/{instance}/slot-{slot}";

/// Environment variable carrying the slot cgroup's relative path to the job.
pub const ENV_SLIPWAY_CGROUP: &str = "SLIPWAY_CGROUP";

/// GitLab Runner's variable for the same (`use_slot_cgroups` on the instance executor).
pub const ENV_GITLAB_SLOT_CGROUP: &str = "GITLAB_RUNNER_SLOT_CGROUP";

/// A validated slot cgroup template such as `slipway/slot-{slot}` or GitLab's
/// `gitlab-runner/slot-${slot}`, relative to the cgroup root.
///
/// Components may hold ASCII letters, digits and `._-@:+=`, plus at most one `{slot}` each;
/// `.`/`..` and empty components are rejected, a leading `/` is dropped. This keeps expanded
/// paths safe to embed in shell scripts unquoted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotTemplate {
    /// Normalised: `${slot}` rewritten to `{slot}`, no leading `/`.
    template: String,
}

impl SlotTemplate {
    /// Parse and validate a template.
    pub fn parse(template: &str) -> Result<Self> {
        let err = |reason: &str| CgroupError::Template {
            template: template.to_string(),
            reason: reason.to_string(),
        };
        let normalised = template
            .replace("${slot}", SLOT_PLACEHOLDER)
            .replace("${instance}", INSTANCE_PLACEHOLDER)
            .trim_start_matches('/')
            .trim_end_matches('/')
            .to_string();
        if normalised.is_empty() {
            return Err(err("empty path"));
        }
        for component in normalised.split('/') {
            if component.is_empty() || component == "." || component == ".." {
                return Err(err("empty, `.` or `..` path component"));
            }
            if component.matches(SLOT_PLACEHOLDER).count() > 1 {
                return Err(err("more than one {slot} in one path component"));
            }
            let rest = component
                .replace(SLOT_PLACEHOLDER, "")
                .replace(INSTANCE_PLACEHOLDER, "");
            if let Some(c) = rest.chars().find(|c| !is_safe_char(*c)) {
                return Err(err(&format!(
                    "character {c:?} not allowed (use letters, digits and ._-@:+=)"
                )));
            }
        }
        Ok(Self {
            template: normalised,
        })
    }

    /// The template in Slipway's syntax.
    pub fn as_str(&self) -> &str {
        &self.template
    }

    /// Whether the template lacks `{slot}`, so every job shares one cgroup (worth a warning).
    pub fn is_shared(&self) -> bool {
        !self.template.contains(SLOT_PLACEHOLDER)
    }

    /// The slot cgroup path for `slot`, relative to each hierarchy's mount (`{instance}`, if
    /// any, left for [`SlotTemplate::expand_on`]: use that where the instance is known).
    pub fn expand(&self, slot: u32) -> SlotPath {
        SlotPath(self.template.replace(SLOT_PLACEHOLDER, &slot.to_string()))
    }

    /// The slot cgroup path for `slot` on instance `instance` (characters a path component
    /// may not hold become `_`).
    pub fn expand_on(&self, instance: &str, slot: u32) -> SlotPath {
        let mut id: String = instance
            .chars()
            .map(|c| if is_safe_char(c) { c } else { '_' })
            .collect();
        if id.is_empty() || id.chars().all(|c| c == '.') {
            id = "_".into();
        }
        SlotPath(
            self.template
                .replace(SLOT_PLACEHOLDER, &slot.to_string())
                .replace(INSTANCE_PLACEHOLDER, &id),
        )
    }

    /// The default for instances that share one kernel: [`PER_INSTANCE_TEMPLATE`].
    pub fn per_instance() -> Self {
        Self {
            template: PER_INSTANCE_TEMPLATE.to_string(),
        }
    }

    /// The cgroup that holds every slot of `instance` and nothing of another instance: the
    /// template up to its first `{instance}` component, when no `{slot}` comes before or in
    /// it. `None` when the template does not name the instance that way.
    pub fn instance_subtree(&self, instance: &str) -> Option<SlotPath> {
        let components: Vec<&str> = self.template.split('/').collect();
        let at = components
            .iter()
            .position(|c| c.contains(INSTANCE_PLACEHOLDER))?;
        if components[..=at]
            .iter()
            .any(|c| c.contains(SLOT_PLACEHOLDER))
        {
            return None;
        }
        // Expanded like the slots below it, so the subtree is exactly their parent.
        let parent = Self {
            template: components[..=at].join("/"),
        };
        Some(parent.expand_on(instance, 0))
    }

    /// The part of the template above the first `{slot}` component, and that component split
    /// around `{slot}` (prefix, suffix); `None` for a shared template.
    pub(crate) fn slot_component(&self) -> Option<(String, String, String)> {
        let components: Vec<&str> = self.template.split('/').collect();
        let at = components
            .iter()
            .position(|c| c.contains(SLOT_PLACEHOLDER))?;
        let (prefix, suffix) = components[at].split_once(SLOT_PLACEHOLDER)?;
        // A placeholder in a later component expands to the same slot number: the parent
        // must be slot-free, which it is since `at` is the first such component.
        Some((
            components[..at].join("/"),
            prefix.to_string(),
            suffix.to_string(),
        ))
    }
}

impl Default for SlotTemplate {
    fn default() -> Self {
        Self {
            template: DEFAULT_TEMPLATE.to_string(),
        }
    }
}

impl fmt::Display for SlotTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.template)
    }
}

/// A slot cgroup path relative to each hierarchy's mount, e.g. `slipway/slot-3`.
///
/// Only made from a [`SlotTemplate`], so it is always safe to embed in a shell script.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SlotPath(String);

impl SlotPath {
    /// The relative path.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The variables that tell a job its slot cgroup: `SLIPWAY_CGROUP` and GitLab's
    /// `GITLAB_RUNNER_SLOT_CGROUP`, both set to the relative path (usable with
    /// `cgexec -g cpu,memory:<path>` or under `/sys/fs/cgroup/<path>` on a v2 host).
    pub fn env(&self) -> [(&'static str, String); 2] {
        [
            (ENV_SLIPWAY_CGROUP, self.0.clone()),
            (ENV_GITLAB_SLOT_CGROUP, self.0.clone()),
        ]
    }
}

impl fmt::Display for SlotPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for SlotPath {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Build a slot path from a template-less relative path (sweep found it on disk).
pub(crate) fn slot_path_unchecked(path: String) -> SlotPath {
    SlotPath(path)
}

fn is_safe_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "._-@:+=".contains(c)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn an_instance_placeholder_keeps_instances_apart() {
        let t = SlotTemplate::parse("ci/${instance}/slot-${slot}").unwrap();
        assert_eq!(t.expand_on("sk1-ab", 2).as_str(), "ci/sk1-ab/slot-2");
        assert_eq!(t.expand_on("a b/..", 0).as_str(), "ci/a_b_../slot-0");
        assert_eq!(t.expand_on("..", 0).as_str(), "ci/_/slot-0");
        assert!(SlotTemplate::parse("ci/{instance}$/slot-{slot}").is_err());
    }

    #[test]
    fn an_instance_subtree_holds_all_its_slots_and_only_them() {
        let t = SlotTemplate::per_instance();
        assert_eq!(t.expand_on("x1-ab", 3).as_str(), "slipway/x1-ab/slot-3");
        assert_eq!(
            t.instance_subtree("x1-ab").unwrap().as_str(),
            "slipway/x1-ab"
        );
        assert_eq!(
            t.instance_subtree("a b").unwrap().as_str(),
            "slipway/a_b",
            "sanitised as the slots are"
        );
        let gitlab = SlotTemplate::parse("ci/${instance}/x/slot-${slot}").unwrap();
        assert_eq!(gitlab.instance_subtree("i").unwrap().as_str(), "ci/i");
        // No instance component of its own: nothing to remove beyond the slots.
        for shared in [
            "slipway/slot-{slot}",
            "ci/{instance}-slot-{slot}",
            "s-{slot}/{instance}",
        ] {
            let t = SlotTemplate::parse(shared).unwrap();
            assert_eq!(t.instance_subtree("i"), None, "{shared}");
        }
    }

    #[test]
    fn expands_both_syntaxes() {
        let ours = SlotTemplate::parse("slipway/slot-{slot}").unwrap();
        let gitlab = SlotTemplate::parse("gitlab-runner/slot-${slot}").unwrap();
        assert_eq!(ours.expand(3).as_str(), "slipway/slot-3");
        assert_eq!(gitlab.expand(0).as_str(), "gitlab-runner/slot-0");
        assert_eq!(gitlab.as_str(), "gitlab-runner/slot-{slot}");
        assert_eq!(SlotTemplate::default().expand(7).as_str(), "slipway/slot-7");
    }

    #[test]
    fn leading_slash_dropped_and_shared_detected() {
        let t = SlotTemplate::parse("/ci/all-jobs").unwrap();
        assert_eq!(t.expand(1).as_str(), "ci/all-jobs");
        assert!(t.is_shared());
        assert!(!SlotTemplate::default().is_shared());
    }

    #[test]
    fn rejects_unsafe_templates() {
        for bad in [
            "",
            "/",
            "a//b",
            "a/../b",
            "./x",
            "a b/{slot}",
            "x/$(reboot)-{slot}",
            "x/'{slot}",
            "x/{slot}{slot}",
            "x/${other}",
        ] {
            let err = SlotTemplate::parse(bad).unwrap_err();
            assert!(
                err.to_string().contains("invalid slot cgroup template"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn slot_component_splits_first_placeholder() {
        let t = SlotTemplate::parse("a/b/pre-{slot}.scope/job-{slot}").unwrap();
        assert_eq!(
            t.slot_component(),
            Some(("a/b".into(), "pre-".into(), ".scope".into()))
        );
        let t = SlotTemplate::parse("{slot}").unwrap();
        assert_eq!(
            t.slot_component(),
            Some((String::new(), String::new(), String::new()))
        );
    }

    #[test]
    fn env_carries_relative_path() {
        let p = SlotTemplate::default().expand(2);
        assert_eq!(
            p.env(),
            [
                ("SLIPWAY_CGROUP", "slipway/slot-2".to_string()),
                ("GITLAB_RUNNER_SLOT_CGROUP", "slipway/slot-2".to_string()),
            ]
        );
    }
}
