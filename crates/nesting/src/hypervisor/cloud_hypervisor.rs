//! cloud_hypervisor backend (in progress).
