//! qemu backend (in progress).
