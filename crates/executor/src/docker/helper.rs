//! The job helper for build containers: one read-only volume per engine and helper version,
//! filled once, mounted in every build container of that engine at [`SHARED_HELPER_DIR`].
//!
//! Nothing of a job takes part in filling it: the volume gets the helper from an image Slipway
//! imports from the helper's own bytes (`slipway-helper:<version>`, the one file), through a
//! short container of that image (a job's image, run to fill it, could put its own program in
//! every later job's data stages). Build containers mount it read-only. When the volume cannot
//! be had, the stage scripts fall back to a copy in the container's own `/tmp`, as before.

use slipway_docker::{ContainerSpec, ImportOptions, VolumeSpec, WaitCondition};

use super::DockerExecutor;
use crate::data::{Helper, SHARED_HELPER_DIR};

/// Label naming the helper version a volume holds.
const LABEL_HELPER: &str = "com.slipway.helper";

/// How long the filling container may take.
const FILL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

impl DockerExecutor {
    /// The volume holding `helper` on this engine, filled when it is new; `None` (and the
    /// per-container copy) when that cannot be done.
    pub(super) async fn helper_volume(&self, helper: &Helper) -> Option<String> {
        let name = format!("slipway-helper-{}", helper.version);
        match self.docker.inspect_volume(&name).await {
            // Filled by an earlier job (of this manager or another): a fill still under way
            // only sends this job to the fallback copy.
            Ok(_) => return Some(name),
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                tracing::warn!(volume = %name, error = %e, "inspecting the job helper volume");
                return None;
            }
        }
        match self.fill_helper_volume(&name, helper).await {
            Ok(()) => Some(name),
            Err(why) => {
                tracing::warn!(volume = %name, error = %why, "filling the job helper volume");
                // Removed, so that a later job tries again instead of trusting an empty one.
                let _ = self.docker.remove_volume(&name, true).await;
                None
            }
        }
    }

    /// Import the helper as an image, create `name` and have the engine copy the image's
    /// file into it (a new named volume takes what the image has at its mount point).
    async fn fill_helper_volume(&self, name: &str, helper: &Helper) -> Result<(), String> {
        let bytes = tokio::fs::read(&helper.path)
            .await
            .map_err(|e| format!("reading {}: {e}", helper.path.display()))?;
        let file = format!("slipway-helper-{}", helper.version);
        let tar = helper_tar(&file, &bytes).map_err(|e| format!("packing the helper: {e}"))?;
        let image = format!("slipway-helper:{}", helper.version);
        let opts = ImportOptions {
            repo: "slipway-helper".into(),
            tag: helper.version.clone(),
            changes: vec![format!("LABEL {LABEL_HELPER}={}", helper.version)],
            message: Some("the Slipway job helper".into()),
        };
        self.docker
            .import_image(tar.into(), &opts)
            .await
            .map_err(|e| format!("importing {image}: {e}"))?;
        let mut vol = VolumeSpec::new(name);
        vol.labels = [(LABEL_HELPER.to_string(), helper.version.clone())].into();
        self.docker
            .create_volume(&vol)
            .await
            .map_err(|e| e.to_string())?;
        let mut spec = ContainerSpec::new(&image);
        // The static helper itself, asked for its usage: the container only has to exist
        // and run once for the engine to fill the volume.
        spec.entrypoint = Some(vec![format!("{SHARED_HELPER_DIR}/{file}")]);
        spec.cmd = Some(vec!["--help".into()]);
        spec.network = Some("none".into());
        spec.binds = vec![format!("{name}:{SHARED_HELPER_DIR}")];
        spec.labels = [(LABEL_HELPER.to_string(), helper.version.clone())].into();
        let id = self
            .docker
            .create_container(&spec)
            .await
            .map_err(|e| format!("creating the filling container: {e}"))?
            .id;
        // Bounded here, so that the container is removed whatever happened.
        let ran = tokio::time::timeout(FILL_TIMEOUT, async {
            self.docker
                .start_container(&id)
                .await
                .map_err(|e| format!("starting the filling container: {e}"))?;
            self.docker
                .wait_container(&id, WaitCondition::NotRunning)
                .await
                .map_err(|e| format!("waiting for the filling container: {e}"))
        })
        .await
        .unwrap_or_else(|_| Err(format!("not done in {} s", FILL_TIMEOUT.as_secs())));
        let _ = self.docker.remove_container(&id, true, false).await;
        ran.map(drop)
    }
}

/// A tar holding `opt/slipway-helper/<file>`, executable, for `docker import`.
fn helper_tar(file: &str, bytes: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    let mut dir = tar::Header::new_gnu();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_mode(0o755);
    dir.set_size(0);
    b.append_data(&mut dir, "opt/slipway-helper/", std::io::empty())?;
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o755);
    h.set_size(bytes.len() as u64);
    b.append_data(&mut h, format!("opt/slipway-helper/{file}"), bytes)?;
    b.into_inner()
}

/// The bind of the helper volume `name` in a build container: read-only.
pub(super) fn helper_bind(name: &str) -> String {
    format!("{name}:{SHARED_HELPER_DIR}:ro")
}
