//! The Slipway guest agent: runs job steps inside a VM for the host.
//!
//! - [`frame`]: the wire protocol, one JSON object per line in each direction.
//! - [`identity`]: a restored guest made unique (RNG reseed, machine-id, hostname, SSH keys).
//! - [`serve`]: the agent loop over any byte stream (virtio-serial, vsock, stdio).
//!
//! The agent does not reap orphans: the image's `/init` runs it as a child of a busybox shell,
//! which is PID 1 and reaps them. Run as PID 1 itself, orphaned grandchildren would stay
//! zombies.

pub mod frame;
pub mod identity;
pub mod serve;
