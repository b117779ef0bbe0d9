//! Where this binary finds the job helper (`slipway-helper`) it copies to where jobs run.
//!
//! In order: `SLIPWAY_HELPER`; in a cargo build tree, the static build for the explicit host
//! target (`target/x86_64-unknown-linux-gnu/release/`, made by `make helper`, or this binary's
//! own profile there); beside this binary (the Debian package's `/usr/lib/slipway/` holds a static one too); none: jobs
//! that need it fail, naming `job_data`.

use std::path::{Path, PathBuf};

use slipway_executor::Helper;

/// The helper's file name.
const NAME: &str = "slipway-helper";
/// Where the Debian package installs it.
const PACKAGED: &str = "/usr/lib/slipway/slipway-helper";

/// The job helper, its version read from its content; `None` (with a warning) without one.
pub async fn find() -> Option<Helper> {
    let found = tokio::task::spawn_blocking(|| {
        let path = candidates().into_iter().find(|p| p.is_file())?;
        Some(Helper::at(&path).map_err(|e| (path, e)))
    })
    .await
    .ok()
    .flatten();
    match found {
        Some(Ok(helper)) => {
            tracing::debug!(path = %helper.path.display(), version = %helper.version, "job helper");
            Some(helper)
        }
        Some(Err((path, e))) => {
            tracing::warn!(path = %path.display(), "the job helper cannot be read: {e}");
            None
        }
        None => {
            tracing::warn!(
                "no job helper ({NAME}) beside this binary: jobs of runners with \
                 job_data = \"instance\" that have artifacts, dependencies or a distributed \
                 cache fail; build it with `make helper` or set SLIPWAY_HELPER"
            );
            None
        }
    }
}

/// The places looked at, in order.
fn candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("SLIPWAY_HELPER") {
        out.push(PathBuf::from(p));
    }
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        out.extend(static_builds_of(dir));
        out.push(dir.join(NAME));
    }
    out.push(PathBuf::from(PACKAGED));
    out
}

/// In a cargo build tree (`target/<profile>/`, or its `deps/`), the static helpers built for
/// the explicit host target: the release one, then one of this binary's profile.
fn static_builds_of(dir: &Path) -> Vec<PathBuf> {
    let dir = match dir.file_name() {
        Some(d) if d == "deps" => dir.parent(),
        _ => Some(dir),
    };
    let Some((profile, target)) = dir.and_then(|d| Some((d.file_name()?, d.parent()?))) else {
        return Vec::new();
    };
    let static_dir = target.join("x86_64-unknown-linux-gnu");
    let mut out = vec![static_dir.join("release").join(NAME)];
    if profile != "release" {
        out.push(static_dir.join(profile).join(NAME));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cargo_tree_has_its_static_helpers_beside_the_profile() {
        let want = vec![
            PathBuf::from("/r/target/x86_64-unknown-linux-gnu/release/slipway-helper"),
            PathBuf::from("/r/target/x86_64-unknown-linux-gnu/debug/slipway-helper"),
        ];
        assert_eq!(static_builds_of(Path::new("/r/target/debug")), want);
        assert_eq!(static_builds_of(Path::new("/r/target/debug/deps")), want);
        assert_eq!(
            static_builds_of(Path::new("/r/target/release")),
            want[..1].to_vec()
        );
    }
}
