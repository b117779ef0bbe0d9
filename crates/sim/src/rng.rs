//! A tiny deterministic PRNG (splitmix64) and the distributions the simulator draws from.
//!
//! Own code rather than a crate so a seed means the same numbers on every platform and version.

/// splitmix64: fast, small state, good enough statistics for simulation.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// A generator for sub-stream `stream` of `seed` (e.g. one per instance), independent of
    /// how many numbers other streams drew.
    pub fn stream(seed: u64, stream: u64) -> Self {
        let mut r = Rng(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03));
        r.next_u64();
        r
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.f64()
    }

    /// Uniform integer in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.f64() < p
    }

    /// Exponential with mean `1 / rate`.
    pub fn exp(&mut self, rate: f64) -> f64 {
        -(1.0 - self.f64()).ln() / rate
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.f64();
        let u2 = self.f64();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// A delay distribution in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Dist {
    /// Always this many seconds.
    Fixed(f64),
    /// Uniform between `min` and `max`.
    Uniform {
        /// Shortest.
        min: f64,
        /// Longest.
        max: f64,
    },
    /// Log-normal with this median and log-space sigma, clamped to `min..=max`.
    LogNormal {
        /// Median in seconds.
        median: f64,
        /// Standard deviation of the logarithm.
        sigma: f64,
        /// Clamp below.
        min: f64,
        /// Clamp above.
        max: f64,
    },
}

impl Dist {
    /// Draw one value.
    pub fn sample(&self, rng: &mut Rng) -> f64 {
        match *self {
            Dist::Fixed(s) => s,
            Dist::Uniform { min, max } => rng.uniform(min, max),
            Dist::LogNormal {
                median,
                sigma,
                min,
                max,
            } => (median * (sigma * rng.normal()).exp()).clamp(min, max),
        }
    }

    /// The smallest value it can produce.
    pub fn min(&self) -> f64 {
        match *self {
            Dist::Fixed(s) => s,
            Dist::Uniform { min, .. } | Dist::LogNormal { min, .. } => min,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_numbers_and_sane_ranges() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let mut r = Rng::new(1);
        let mean: f64 = (0..20_000).map(|_| r.exp(2.0)).sum::<f64>() / 20_000.0;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
        let d = Dist::LogNormal {
            median: 60.0,
            sigma: 0.3,
            min: 30.0,
            max: 180.0,
        };
        for _ in 0..1000 {
            let x = d.sample(&mut r);
            assert!((30.0..=180.0).contains(&x));
        }
    }
}
