//! Copy-on-write disks: every VM writes to its own qcow2 layer over a read-only base (the
//! image's disk, or a snapshot's frozen layer), so branches share everything they did not
//! change.

use std::path::Path;

use crate::error::DaemonError;

/// Create `layer` as a qcow2 file backed by `base` (absolute path, qcow2).
pub async fn create_layer(base: &Path, layer: &Path) -> Result<(), DaemonError> {
    qemu_img(
        &["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"],
        base,
        layer,
        || {
            format!(
                "qemu-img create {} over {}",
                layer.display(),
                base.display()
            )
        },
    )
    .await
}

/// A raw copy of `base` at `dest` (Firecracker and Cloud Hypervisor read raw images only).
pub async fn raw_copy(base: &Path, dest: &Path) -> Result<(), DaemonError> {
    qemu_img(&["convert", "-q", "-O", "raw"], base, dest, || {
        format!("qemu-img convert {} to raw", base.display())
    })
    .await
}

async fn qemu_img(
    args: &[&str],
    from: &Path,
    to: &Path,
    what: impl FnOnce() -> String,
) -> Result<(), DaemonError> {
    let out = tokio::process::Command::new("qemu-img")
        .args(args)
        .arg(from)
        .arg(to)
        .output()
        .await
        .map_err(|e| DaemonError::Disk(format!("cannot run qemu-img (install qemu-utils): {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(DaemonError::Disk(format!(
            "{} failed: {}",
            what(),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Bytes a file really occupies on disk (sparse files count their allocated blocks).
pub fn allocated_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path)
        .map(|m| m.blocks() * 512)
        .unwrap_or(0)
}
