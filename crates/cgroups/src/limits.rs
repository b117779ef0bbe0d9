//! Resource limits of a slot and the values they become in cgroupfs.

use crate::error::{CgroupError, Result};

/// CFS period Slipway uses, in µs (the kernel default).
pub const CPU_PERIOD_US: u64 = 100_000;

/// Smallest quota the kernel accepts, in µs.
pub const CPU_MIN_QUOTA_US: u64 = 1_000;

/// Page size limits are rounded down to when splitting.
const PAGE: u64 = 4096;

/// What a slot may use; `None` means unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Limits {
    /// CPUs, fractional (`0.5` = half a CPU, `2.0` = two CPUs).
    pub cpu: Option<f64>,
    /// Memory in bytes (swap included: the slot gets no swap beyond this).
    pub memory_bytes: Option<u64>,
    /// Most processes and threads at once.
    pub pids: Option<u64>,
}

impl Limits {
    /// No limits at all.
    pub const NONE: Limits = Limits {
        cpu: None,
        memory_bytes: None,
        pids: None,
    };

    /// Whether no limit is set.
    pub fn is_empty(&self) -> bool {
        self.cpu.is_none() && self.memory_bytes.is_none() && self.pids.is_none()
    }

    /// Check the values are ones the kernel can take.
    pub fn validate(&self) -> Result<()> {
        if let Some(cpu) = self.cpu
            && !(cpu.is_finite() && cpu > 0.0)
        {
            return Err(CgroupError::InvalidLimit {
                what: "cpu",
                value: cpu.to_string(),
                reason: "must be a positive number of CPUs",
            });
        }
        if let Some(cpu) = self.cpu
            && cpu * CPU_PERIOD_US as f64 > i64::MAX as f64 / 2.0
        {
            return Err(CgroupError::InvalidLimit {
                what: "cpu",
                value: cpu.to_string(),
                reason: "too large",
            });
        }
        if self.memory_bytes == Some(0) {
            return Err(CgroupError::InvalidLimit {
                what: "memory",
                value: "0".into(),
                reason: "must be at least one byte",
            });
        }
        if self.pids == Some(0) {
            return Err(CgroupError::InvalidLimit {
                what: "pids",
                value: "0".into(),
                reason: "must be at least 1",
            });
        }
        Ok(())
    }

    /// One slot's share of an instance with `self` resources and `capacity` slots: each limit
    /// divided evenly (memory rounded down to a page, at least one page; pids and CPU at least
    /// the kernel minimum). A capacity of 0 is treated as 1.
    pub fn per_slot(&self, capacity: u32) -> Limits {
        let n = u64::from(capacity.max(1));
        Limits {
            cpu: self
                .cpu
                .map(|c| (c / n as f64).max(CPU_MIN_QUOTA_US as f64 / CPU_PERIOD_US as f64)),
            memory_bytes: self.memory_bytes.map(|m| (m / n / PAGE * PAGE).max(PAGE)),
            pids: self.pids.map(|p| (p / n).max(1)),
        }
    }

    /// What is left of `self` after setting `reserved` aside (for the host's own daemons);
    /// a limit unset in `reserved` is kept whole.
    pub fn minus(&self, reserved: &Limits) -> Limits {
        Limits {
            cpu: self.cpu.map(|c| (c - reserved.cpu.unwrap_or(0.0)).max(0.0)),
            memory_bytes: self
                .memory_bytes
                .map(|m| m.saturating_sub(reserved.memory_bytes.unwrap_or(0))),
            pids: self
                .pids
                .map(|p| p.saturating_sub(reserved.pids.unwrap_or(0))),
        }
    }
}

/// A CPU limit as CFS bandwidth: `quota_us` of CPU time per `period_us` of wall time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuQuota {
    /// CPU time allowed per period, µs.
    pub quota_us: u64,
    /// Period, µs.
    pub period_us: u64,
}

impl CpuQuota {
    /// The quota for `cpus` CPUs over [`CPU_PERIOD_US`], at least [`CPU_MIN_QUOTA_US`].
    pub fn from_cpus(cpus: f64) -> Self {
        let quota = (cpus * CPU_PERIOD_US as f64).round();
        // Validated callers pass finite positive values; clamp anyway so nothing panics.
        let quota_us = if quota.is_finite() && quota > 0.0 {
            (quota as u64).max(CPU_MIN_QUOTA_US)
        } else {
            CPU_MIN_QUOTA_US
        };
        Self {
            quota_us,
            period_us: CPU_PERIOD_US,
        }
    }

    /// The cgroup v2 `cpu.max` value, e.g. `50000 100000`.
    pub fn cpu_max(&self) -> String {
        format!("{} {}", self.quota_us, self.period_us)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn cpu_quota_values() {
        assert_eq!(CpuQuota::from_cpus(0.5).cpu_max(), "50000 100000");
        assert_eq!(CpuQuota::from_cpus(2.0).cpu_max(), "200000 100000");
        assert_eq!(CpuQuota::from_cpus(0.25).quota_us, 25_000);
        assert_eq!(CpuQuota::from_cpus(0.001).quota_us, CPU_MIN_QUOTA_US);
        assert_eq!(CpuQuota::from_cpus(f64::NAN).quota_us, CPU_MIN_QUOTA_US);
    }

    #[test]
    fn validate_rejects_nonsense() {
        for bad in [
            Limits {
                cpu: Some(0.0),
                ..Limits::NONE
            },
            Limits {
                cpu: Some(-1.0),
                ..Limits::NONE
            },
            Limits {
                cpu: Some(f64::INFINITY),
                ..Limits::NONE
            },
            Limits {
                memory_bytes: Some(0),
                ..Limits::NONE
            },
            Limits {
                pids: Some(0),
                ..Limits::NONE
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        assert!(Limits::NONE.validate().is_ok());
        assert!(Limits::NONE.is_empty());
    }

    #[test]
    fn per_slot_divides_instance() {
        let instance = Limits {
            cpu: Some(8.0),
            memory_bytes: Some(31 * 1024 * 1024 * 1024 + 123),
            pids: Some(10_000),
        };
        let slot = instance.per_slot(4);
        assert_eq!(slot.cpu, Some(2.0));
        assert_eq!(slot.memory_bytes, Some(7_936 * 1024 * 1024));
        assert_eq!(slot.memory_bytes.unwrap() % 4096, 0);
        assert_eq!(slot.pids, Some(2_500));
        assert_eq!(instance.per_slot(0), instance.per_slot(1));
        assert_eq!(Limits::NONE.per_slot(3), Limits::NONE);
    }

    #[test]
    fn minus_reserves_for_host() {
        let instance = Limits {
            cpu: Some(2.0),
            memory_bytes: Some(4 << 30),
            pids: None,
        };
        let reserved = Limits {
            cpu: Some(0.5),
            memory_bytes: Some(1 << 30),
            pids: Some(100),
        };
        let left = instance.minus(&reserved);
        assert_eq!(left.cpu, Some(1.5));
        assert_eq!(left.memory_bytes, Some(3 << 30));
        assert_eq!(left.pids, None);
        assert_eq!(left.per_slot(3).cpu, Some(0.5));
    }
}
