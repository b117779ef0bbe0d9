//! firecracker backend (in progress).
