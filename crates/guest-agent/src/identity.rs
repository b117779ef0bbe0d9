//! A guest made unique after a snapshot restore. A restore clones a running kernel: every VM
//! restored from one snapshot starts with the same RNG state (the same "random" bytes come out
//! of `/dev/urandom` in each), the same `/etc/machine-id`, hostname and any SSH host keys made
//! before the snapshot. The host hands over fresh entropy and new names; this module puts them
//! in place before the job's first line runs.

use std::fs::OpenOptions;
use std::io::Write as _;
use std::os::fd::AsRawFd as _;
use std::path::Path;
use std::process::Command;

/// `RNDADDENTROPY`: `_IOW('R', 0x03, int[2])` (the same number on every Linux architecture
/// that uses the generic ioctl encoding: x86, arm, riscv).
const RNDADDENTROPY: u32 = 0x4008_5203;
/// `RNDRESEEDCRNG`: `_IO('R', 0x07)`.
const RNDRESEEDCRNG: u32 = 0x0000_5207;

/// What [`renew`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Renewed {
    /// The RNG was credited with the entropy and reseeded.
    pub reseeded: bool,
    /// One line per thing not renewed, and why.
    pub notes: Vec<String>,
}

/// Mix `entropy` into the kernel's RNG and reseed it, write `machine_id` to `/etc/machine-id`,
/// set `hostname`, and make new SSH host keys where the guest has some. Each step is tried
/// whatever the others did; what fails is in [`Renewed::notes`].
pub fn renew(entropy: &[u8], machine_id: &str, hostname: &str) -> Renewed {
    let mut out = Renewed::default();
    match reseed(entropy) {
        Ok(()) => out.reseeded = true,
        Err(e) => out.notes.push(e),
    }
    if let Err(e) = write_machine_id(Path::new("/etc"), machine_id) {
        out.notes.push(e);
    }
    if let Err(e) = set_hostname(hostname) {
        out.notes.push(e);
    }
    if let Err(e) = new_ssh_host_keys(Path::new("/etc/ssh")) {
        out.notes.push(e);
    }
    out
}

/// Credit `entropy` to the input pool and reseed the CRNG from it at once; where the kernel
/// refuses (no `CAP_SYS_ADMIN`), at least mix it in with a write.
fn reseed(entropy: &[u8]) -> Result<(), String> {
    let urandom = OpenOptions::new()
        .write(true)
        .open("/dev/urandom")
        .map_err(|e| format!("opening /dev/urandom: {e}"))?;
    if let Err(e) = add_entropy(&urandom, entropy) {
        let mut w = &urandom;
        let mixed = w.write_all(entropy).is_ok();
        return Err(format!(
            "the RNG was not reseeded ({e}); the entropy was {} by a write",
            if mixed {
                "mixed in"
            } else {
                "not even mixed in"
            }
        ));
    }
    // On guest kernels before 5.18 this reseeds from the CRNG itself (and RDRAND), not from
    // the pool the entropy went into: docs/security.md asks for 5.18 or later.
    reseed_crng(&urandom).map_err(|e| {
        format!("the entropy was credited but the CRNG was not reseeded at once ({e})")
    })
}

/// `RNDADDENTROPY` with `entropy`, credited in full (it comes from the host's RNG).
#[allow(unsafe_code)]
fn add_entropy(urandom: &std::fs::File, entropy: &[u8]) -> Result<(), String> {
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }, built in u32
    // words so the kernel reads aligned ints.
    let len = u32::try_from(entropy.len()).map_err(|_| "too much entropy".to_string())?;
    let mut words = vec![0u32; 2 + entropy.len().div_ceil(4)];
    words[0] = len.saturating_mul(8);
    words[1] = len;
    for (word, chunk) in words[2..].iter_mut().zip(entropy.chunks(4)) {
        let mut bytes = [0u8; 4];
        bytes[..chunk.len()].copy_from_slice(chunk);
        *word = u32::from_ne_bytes(bytes);
    }
    // SAFETY: `words` is a valid rand_pool_info whose buf_size matches the bytes that follow
    // it, and lives across the call; the fd is open.
    let rc = unsafe { nix::libc::ioctl(urandom.as_raw_fd(), RNDADDENTROPY as _, words.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!(
            "RNDADDENTROPY: {}",
            std::io::Error::last_os_error()
        ))
    }
}

/// `RNDRESEEDCRNG`: the CRNG takes its next key from the pool now, not at its next timed
/// reseed (up to a minute away).
#[allow(unsafe_code)]
fn reseed_crng(urandom: &std::fs::File) -> Result<(), String> {
    // SAFETY: an ioctl without an argument on an open fd.
    let rc = unsafe { nix::libc::ioctl(urandom.as_raw_fd(), RNDRESEEDCRNG as _) };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!(
            "RNDRESEEDCRNG: {}",
            std::io::Error::last_os_error()
        ))
    }
}

/// `<etc>/machine-id` replaced by `id` (written beside it, then renamed over it).
fn write_machine_id(etc: &Path, id: &str) -> Result<(), String> {
    if id.len() != 32
        || !id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    {
        return Err(format!("machine-id {id:?} is not 32 lowercase hex digits"));
    }
    let path = etc.join("machine-id");
    let tmp = etc.join(".machine-id.new");
    std::fs::write(&tmp, format!("{id}\n"))
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| format!("writing {}: {e}", path.display()))
}

/// The kernel's hostname, and `/etc/hostname` where the guest has one.
fn set_hostname(name: &str) -> Result<(), String> {
    nix::unistd::sethostname(name).map_err(|e| format!("setting the hostname: {e}"))?;
    let file = Path::new("/etc/hostname");
    if file.exists() {
        std::fs::write(file, format!("{name}\n"))
            .map_err(|e| format!("writing {}: {e}", file.display()))?;
    }
    Ok(())
}

/// New SSH host keys where `<dir>` has some: the old ones removed, `ssh-keygen -A` makes
/// new ones of the same default types. A guest without host keys is left alone.
fn new_ssh_host_keys(dir: &Path) -> Result<(), String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    let keys: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("ssh_host_") && n.contains("_key"))
        })
        .collect();
    if keys.is_empty() {
        return Ok(());
    }
    for key in &keys {
        std::fs::remove_file(key).map_err(|e| format!("removing {}: {e}", key.display()))?;
    }
    match Command::new("ssh-keygen").arg("-A").output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "ssh-keygen -A: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!(
            "the old SSH host keys are removed but no new ones made: ssh-keygen: {e}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_id_is_replaced_and_a_bad_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("machine-id"), "0123\n").unwrap();
        let id = "5f0c9a2b7d1e4c3f8a6b9e0d1c2b3a49";
        write_machine_id(dir.path(), id).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("machine-id")).unwrap(),
            format!("{id}\n")
        );
        let err = write_machine_id(dir.path(), "not-hex").unwrap_err();
        assert!(err.contains("32 lowercase hex digits"), "{err}");
    }

    #[test]
    fn a_guest_without_host_keys_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("sshd_config"), "x").unwrap();
        new_ssh_host_keys(dir.path()).unwrap();
        assert!(dir.path().join("sshd_config").exists());
        assert!(new_ssh_host_keys(&dir.path().join("missing")).is_ok());
    }
}
