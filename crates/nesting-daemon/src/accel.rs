//! Which accelerator to use: KVM only when a guest really runs under it. On some hosts
//! `/dev/kvm` opens and answers ioctls, and even a few instructions of real-mode firmware run,
//! but a Linux guest spins forever (broken nested virtualisation). So the probe boots the guest
//! kernel itself under KVM and waits a few seconds for its first console line.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt as _;

use slipway_nesting::config::AccelChoice;
use slipway_nesting::spec::Accel;

/// The result of a probe: the accelerator and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// What to use.
    pub accel: Accel,
    /// Why (for the daemon's log).
    pub reason: String,
}

/// A 64 KiB firmware: at the reset vector, write `K` to COM1 and halt.
fn firmware() -> Vec<u8> {
    let mut fw = vec![0xF4u8; 64 * 1024];
    // mov al,'K'; mov dx,0x3f8; out dx,al; cli; hlt
    let code = [0xB0, b'K', 0xBA, 0xF8, 0x03, 0xEE, 0xFA, 0xF4];
    let at = fw.len() - 16;
    fw[at..at + code.len()].copy_from_slice(&code);
    fw
}

/// Resolve `choice` for `qemu` (the binary); `Auto` boots `kernel` under KVM.
pub async fn resolve(choice: AccelChoice, qemu: &str, kernel: Option<&std::path::Path>) -> Probe {
    match choice {
        AccelChoice::Kvm => Probe {
            accel: Accel::Kvm,
            reason: "configured".into(),
        },
        AccelChoice::Tcg => Probe {
            accel: Accel::Tcg,
            reason: "configured".into(),
        },
        AccelChoice::Auto => match probe_kvm(qemu, kernel).await {
            Ok(()) => Probe {
                accel: Accel::Kvm,
                reason: "a probe guest ran under KVM".into(),
            },
            Err(why) => Probe {
                accel: Accel::Tcg,
                reason: why,
            },
        },
    }
}

/// How long a kernel under KVM may take to print its first line (it takes well under a second
/// where KVM works).
const KERNEL_PROBE: Duration = Duration::from_secs(6);

/// Whether a Linux guest runs under KVM here; why not otherwise.
pub async fn probe_kvm(qemu: &str, kernel: Option<&std::path::Path>) -> Result<(), String> {
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        return Err("/dev/kvm cannot be opened".into());
    }
    // A few instructions of firmware first: the cheap check.
    let dir = tempfile_dir().map_err(|e| format!("cannot write the probe firmware: {e}"))?;
    let fw = dir.join("probe.bin");
    std::fs::write(&fw, firmware()).map_err(|e| format!("cannot write the probe firmware: {e}"))?;
    let firmware_ran = first_output(
        qemu,
        &["-M", "pc", "-m", "16", "-bios", &fw.display().to_string()],
        b"K",
        Duration::from_secs(3),
    )
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    match firmware_ran? {
        Some(true) => {}
        Some(false) => return Err("a KVM probe guest exited without running".into()),
        None => return Err("/dev/kvm opens but a probe guest did not run within 3 s".into()),
    }
    let Some(kernel) = kernel else {
        return Err("no guest kernel to probe KVM with".into());
    };
    let args = [
        "-M",
        "microvm,x-option-roms=off,rtc=on",
        "-m",
        "128",
        "-no-reboot",
        "-kernel",
        &kernel.display().to_string(),
        "-append",
        "console=ttyS0 panic=-1 reboot=t",
    ];
    match first_output(qemu, &args, b"Linux version", KERNEL_PROBE).await? {
        Some(true) => Ok(()),
        Some(false) => Err(
            "a guest kernel under KVM exited without printing (the CPU model is refused?)".into(),
        ),
        None => Err(format!(
            "/dev/kvm opens but a guest kernel under KVM printed nothing within {KERNEL_PROBE:?} \
             (broken nested virtualisation?)"
        )),
    }
}

/// Run QEMU under KVM with `args` and its serial console on stdout until `needle` shows:
/// `Some(true)` when it did, `Some(false)` when QEMU ended first, `None` after `limit`.
async fn first_output(
    qemu: &str,
    args: &[&str],
    needle: &[u8],
    limit: Duration,
) -> Result<Option<bool>, String> {
    let mut child = tokio::process::Command::new(qemu)
        .args([
            "-accel",
            "kvm",
            "-cpu",
            "host",
            "-nodefaults",
            "-no-user-config",
        ])
        .args(["-display", "none", "-serial", "stdio"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {qemu}: {e}"))?;
    let mut out = child.stdout.take().ok_or("no stdout")?;
    let mut seen = Vec::new();
    let got = tokio::time::timeout(limit, async {
        let mut buf = [0u8; 256];
        loop {
            match out.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => {
                    seen.extend_from_slice(&buf[..n]);
                    if seen.windows(needle.len()).any(|w| w == needle) {
                        return true;
                    }
                }
            }
        }
    })
    .await;
    let _ = child.kill().await;
    Ok(got.ok())
}

fn tempfile_dir() -> std::io::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("slipway-kvm-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_firmware_prints_at_the_reset_vector() {
        let fw = firmware();
        assert_eq!(fw.len(), 65536);
        assert_eq!(&fw[65536 - 16..65536 - 14], &[0xB0, b'K']);
    }

    #[tokio::test]
    async fn configured_choices_are_not_probed() {
        assert_eq!(
            resolve(AccelChoice::Tcg, "/nonexistent", None).await.accel,
            Accel::Tcg
        );
        assert_eq!(
            resolve(AccelChoice::Kvm, "/nonexistent", None).await.accel,
            Accel::Kvm
        );
    }

    #[tokio::test]
    async fn the_probe_firmware_runs_under_tcg() {
        // The same firmware under TCG proves the probe prints what probe_kvm waits for.
        let dir = tempfile_dir().unwrap();
        let fw = dir.join("tcg.bin");
        std::fs::write(&fw, firmware()).unwrap();
        let out = tokio::time::timeout(
            Duration::from_secs(20),
            tokio::process::Command::new("qemu-system-x86_64")
                .args([
                    "-M",
                    "pc",
                    "-accel",
                    "tcg",
                    "-m",
                    "16",
                    "-nodefaults",
                    "-display",
                    "none",
                ])
                .args(["-serial", "stdio", "-bios"])
                .arg(&fw)
                .stdout(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap()
                .stdout
                .take()
                .unwrap()
                .read_u8(),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(out, b'K');
    }
}
