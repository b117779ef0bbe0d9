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

/// Name of the empty layer kept in a snapshot's directory: a restore copies it (a few hundred
/// KiB) instead of running `qemu-img create`, which costs tens of milliseconds.
pub const LAYER_TEMPLATE: &str = "layer.qcow2";

/// Make `template`, an empty qcow2 layer over `base`, atomically (written aside, then renamed)
/// and read-only: restores may copy it as soon as it exists.
pub async fn create_template(base: &Path, template: &Path) -> Result<(), DaemonError> {
    use std::os::unix::fs::PermissionsExt as _;
    let aside = template.with_extension("new");
    create_layer(base, &aside).await?;
    let _ = std::fs::set_permissions(&aside, std::fs::Permissions::from_mode(0o444));
    std::fs::rename(&aside, template).map_err(|e| {
        let _ = std::fs::remove_file(&aside);
        DaemonError::Disk(format!("publishing {}: {e}", template.display()))
    })
}

/// Create `layer` over `base` by copying `template` when it is an empty layer over that very
/// `base`; otherwise (no template, or one naming another path) with `qemu-img create`.
pub async fn layer_from_template(
    template: &Path,
    base: &Path,
    layer: &Path,
) -> Result<(), DaemonError> {
    use std::os::unix::fs::PermissionsExt as _;
    if backing_file(template).as_deref() == Some(base) {
        let copied = std::fs::copy(template, layer)
            .and_then(|_| std::fs::set_permissions(layer, std::fs::Permissions::from_mode(0o644)));
        if copied.is_ok() {
            return Ok(());
        }
        let _ = std::fs::remove_file(layer);
    }
    create_layer(base, layer).await
}

/// The backing file a qcow2 header names (none: not qcow2, unreadable, or no backing file).
pub fn backing_file(qcow2: &Path) -> Option<std::path::PathBuf> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mut f = std::fs::File::open(qcow2).ok()?;
    let mut header = [0u8; 20];
    f.read_exact(&mut header).ok()?;
    // "QFI\xfb", version, then backing_file_offset (u64) and backing_file_size (u32), big-endian.
    if header[..4] != *b"QFI\xfb" {
        return None;
    }
    let offset = u64::from_be_bytes(header[8..16].try_into().ok()?);
    let len = u32::from_be_bytes(header[16..20].try_into().ok()?);
    if offset == 0 || len == 0 || len > 4096 {
        return None;
    }
    f.seek(SeekFrom::Start(offset)).ok()?;
    let mut name = vec![0u8; len as usize];
    f.read_exact(&mut name).ok()?;
    use std::os::unix::ffi::OsStringExt as _;
    Some(std::path::PathBuf::from(std::ffi::OsString::from_vec(name)))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_layer_is_copied_from_a_template_over_the_same_base_only() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base.qcow2");
        let st = tokio::process::Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2"])
            .arg(&base)
            .arg("64M")
            .status()
            .await
            .unwrap();
        assert!(st.success());
        let template = dir.path().join(LAYER_TEMPLATE);
        create_template(&base, &template).await.unwrap();
        assert_eq!(backing_file(&template).as_deref(), Some(base.as_path()));
        assert_eq!(backing_file(&base), None);

        let layer = dir.path().join("vm.qcow2");
        layer_from_template(&template, &base, &layer).await.unwrap();
        assert_eq!(
            std::fs::read(&layer).unwrap(),
            std::fs::read(&template).unwrap()
        );
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&layer).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o644);

        // A template over another base is not used: the layer is made over the one asked for.
        let other = dir.path().join("other.qcow2");
        std::fs::copy(&base, &other).unwrap();
        let layer2 = dir.path().join("vm2.qcow2");
        layer_from_template(&template, &other, &layer2)
            .await
            .unwrap();
        assert_eq!(backing_file(&layer2).as_deref(), Some(other.as_path()));
    }
}
