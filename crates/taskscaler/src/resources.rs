//! What a job asks for and what an instance offers: CPU, memory, GPUs.
//!
//! A slot is `1/capacity_per_instance` of an instance's declared resources. A job that asks
//! for more than one slot's share takes as many whole slots of one instance as its largest
//! request needs, so placement stays one-dimensional (slots) and GitLab's slot semantics
//! (`idle_count` in slots, `capacity_per_instance`) keep their meaning.

use std::fmt;

/// CPU (millicores), memory (bytes) and GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Resources {
    /// Thousandths of a CPU.
    pub cpu_millis: u64,
    /// Bytes of memory.
    pub memory_bytes: u64,
    /// Whole GPUs.
    pub gpus: u32,
}

/// A resource value that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:?}: expected {expected}")]
pub struct ParseError {
    /// Which resource (`cpu`, `memory`, `gpu`).
    pub what: &'static str,
    /// The text given.
    pub value: String,
    /// What would have been accepted.
    pub expected: &'static str,
}

impl Resources {
    /// Nothing asked for.
    pub fn is_empty(&self) -> bool {
        self.cpu_millis == 0 && self.memory_bytes == 0 && self.gpus == 0
    }

    /// Whether every dimension of `self` is at most `other`'s.
    pub fn fits_in(&self, other: &Resources) -> bool {
        self.cpu_millis <= other.cpu_millis
            && self.memory_bytes <= other.memory_bytes
            && self.gpus <= other.gpus
    }

    /// `slots` slots' share of an instance offering `self` split into `capacity` slots.
    pub fn share(&self, slots: u32, capacity: u32) -> Resources {
        let cap = u64::from(capacity.max(1));
        let n = u64::from(slots);
        Resources {
            cpu_millis: self.cpu_millis.saturating_mul(n) / cap,
            memory_bytes: self.memory_bytes.saturating_mul(n) / cap,
            gpus: u32::try_from(u64::from(self.gpus).saturating_mul(n) / cap).unwrap_or(u32::MAX),
        }
    }

    /// Slots of an instance offering `offer` in `capacity` slots that `self` needs: at least
    /// one, and enough that each requested dimension fits in those slots' share. `None` when
    /// one instance cannot hold the request at all.
    pub fn slots_needed(&self, offer: &Resources, capacity: u32) -> Option<u32> {
        if !self.fits_in(offer) {
            return None;
        }
        let cap = u64::from(capacity.max(1));
        // Smallest n with want <= have * n / cap, i.e. want * cap <= have * n.
        let need = |want: u64, have: u64| -> u64 {
            if want == 0 || have == 0 {
                0
            } else {
                (u128::from(want) * u128::from(cap)).div_ceil(u128::from(have)) as u64
            }
        };
        let n = need(self.cpu_millis, offer.cpu_millis)
            .max(need(self.memory_bytes, offer.memory_bytes))
            .max(need(u64::from(self.gpus), u64::from(offer.gpus)))
            .max(1);
        u32::try_from(n.min(cap)).ok()
    }

    /// Parse a CPU amount: `2`, `1.5`, `500m`.
    pub fn parse_cpu(text: &str) -> Result<u64, ParseError> {
        let err = || ParseError {
            what: "cpu",
            value: text.to_string(),
            expected: "a number of CPUs such as 2, 1.5 or 500m",
        };
        let t = text.trim();
        if let Some(m) = t.strip_suffix('m') {
            return m.parse::<u64>().map_err(|_| err());
        }
        let v: f64 = t.parse().map_err(|_| err())?;
        if !v.is_finite() || !(0.0..=1e9).contains(&v) {
            return Err(err());
        }
        Ok((v * 1000.0).round() as u64)
    }

    /// Parse a memory amount: bytes, or with a unit `K`/`M`/`G`/`T` (powers of 1000) or
    /// `Ki`/`Mi`/`Gi`/`Ti` (powers of 1024), an optional trailing `B` (`4GiB`, `512M`, `2g`).
    pub fn parse_memory(text: &str) -> Result<u64, ParseError> {
        let err = || ParseError {
            what: "memory",
            value: text.to_string(),
            expected: "an amount such as 512Mi, 4GiB, 2G or a number of bytes",
        };
        let t = text.trim();
        let t = t
            .strip_suffix('B')
            .or_else(|| t.strip_suffix('b'))
            .unwrap_or(t);
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let v: f64 = num.parse().map_err(|_| err())?;
        let mult: f64 = match unit.to_ascii_lowercase().as_str() {
            "" => 1.0,
            "k" => 1e3,
            "m" => 1e6,
            "g" => 1e9,
            "t" => 1e12,
            "ki" => 1024.0,
            "mi" => 1024.0 * 1024.0,
            "gi" => 1024.0 * 1024.0 * 1024.0,
            "ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
            _ => return Err(err()),
        };
        let bytes = v * mult;
        if !bytes.is_finite() || !(0.0..=1e18).contains(&bytes) {
            return Err(err());
        }
        Ok(bytes.round() as u64)
    }

    /// Parse a GPU count.
    pub fn parse_gpus(text: &str) -> Result<u32, ParseError> {
        text.trim().parse().map_err(|_| ParseError {
            what: "gpu",
            value: text.to_string(),
            expected: "a whole number of GPUs",
        })
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cpu = self.cpu_millis as f64 / 1000.0;
        write!(f, "cpu={cpu} memory=")?;
        let gib = 1024u64 * 1024 * 1024;
        let mib = 1024u64 * 1024;
        if self.memory_bytes >= gib && self.memory_bytes.is_multiple_of(gib / 4) {
            write!(f, "{}GiB", self.memory_bytes as f64 / gib as f64)?;
        } else if self.memory_bytes >= mib {
            write!(f, "{}MiB", self.memory_bytes / mib)?;
        } else {
            write!(f, "{}B", self.memory_bytes)?;
        }
        if self.gpus > 0 {
            write!(f, " gpu={}", self.gpus)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1024 * 1024 * 1024;

    fn res(cpu: f64, mem_gib: u64, gpus: u32) -> Resources {
        Resources {
            cpu_millis: (cpu * 1000.0) as u64,
            memory_bytes: mem_gib * GIB,
            gpus,
        }
    }

    #[test]
    fn parses_kubernetes_style_amounts() {
        assert_eq!(Resources::parse_cpu("2").unwrap(), 2000);
        assert_eq!(Resources::parse_cpu("1.5").unwrap(), 1500);
        assert_eq!(Resources::parse_cpu("500m").unwrap(), 500);
        assert_eq!(Resources::parse_memory("4GiB").unwrap(), 4 * GIB);
        assert_eq!(Resources::parse_memory("512Mi").unwrap(), 512 * 1024 * 1024);
        assert_eq!(Resources::parse_memory("2G").unwrap(), 2_000_000_000);
        assert_eq!(Resources::parse_memory("1024").unwrap(), 1024);
        assert_eq!(Resources::parse_gpus("1").unwrap(), 1);
    }

    #[test]
    fn bad_amounts_say_what_was_expected() {
        let e = Resources::parse_cpu("two").unwrap_err();
        assert_eq!(
            e.to_string(),
            "cpu \"two\": expected a number of CPUs such as 2, 1.5 or 500m"
        );
        assert!(Resources::parse_memory("4 parsecs").is_err());
        assert!(Resources::parse_memory("-1G").is_err());
        assert!(Resources::parse_gpus("0.5").is_err());
    }

    #[test]
    fn a_request_takes_whole_slots_of_its_largest_dimension() {
        // 4 CPU, 16 GiB in 4 slots: one slot is 1 CPU, 4 GiB.
        let offer = res(4.0, 16, 0);
        assert_eq!(Resources::default().slots_needed(&offer, 4), Some(1));
        assert_eq!(res(1.0, 4, 0).slots_needed(&offer, 4), Some(1));
        assert_eq!(res(0.5, 8, 0).slots_needed(&offer, 4), Some(2));
        assert_eq!(res(2.5, 1, 0).slots_needed(&offer, 4), Some(3));
        assert_eq!(res(4.0, 16, 0).slots_needed(&offer, 4), Some(4));
        assert_eq!(res(5.0, 1, 0).slots_needed(&offer, 4), None);
        assert_eq!(res(1.0, 1, 1).slots_needed(&offer, 4), None, "no GPU here");
        // One GPU shared by 4 slots: a GPU job takes the whole instance.
        let gpu = res(8.0, 32, 1);
        assert_eq!(res(1.0, 1, 1).slots_needed(&gpu, 4), Some(4));
    }

    #[test]
    fn shares_and_display() {
        let offer = res(4.0, 16, 0);
        assert_eq!(offer.share(1, 4), res(1.0, 4, 0));
        assert_eq!(offer.share(3, 4).to_string(), "cpu=3 memory=12GiB");
        assert_eq!(res(0.5, 0, 1).to_string(), "cpu=0.5 memory=0B gpu=1");
    }
}
