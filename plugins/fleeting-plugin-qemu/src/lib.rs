//! `fleeting-plugin-qemu`: an instance group whose every instance is a QEMU VM booted on this
//! machine from a `vm`-level guest image built with sshd (`slipway image build --level vm
//! --sshd`), reached over SSH through a user-mode networking port forward on 127.0.0.1.
//!
//! State lives on disk under the configured `dir`, so a restarted plugin finds its VMs: QEMU
//! daemonizes (its own session, not the plugin's child) and is found again through its pid
//! file and `-name`. Layout:
//!
//! ```text
//! <dir>/id_ed25519{,.pub}          client key pair: public half on each guest's kernel command
//!                                  line, private half handed out in ConnectInfo
//! <dir>/instances/<id>/            one VM
//!     disk.qcow2                   copy-on-write overlay over the image's base disk
//!     qemu.pid qmp.sock agent.sock console.log qemu.log
//!     port started                 forwarded SSH port, start time (Unix seconds)
//!     ready | deleting | failed    state markers (failed holds the reason)
//! ```
//!
//! - [`config`]: `plugin_config` keys;
//! - [`command`]: the QEMU command line of a VM ([`command::qemu_command`]);
//! - [`vm`]: one VM's directory and process.

pub mod command;
pub mod config;
mod group;
pub mod key;
pub mod vm;

pub use group::QemuGroup;
