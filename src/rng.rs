//! splitmix64, the crate's one seedable pseudo-random generator: validation inputs, fixture
//! weights, the crash test's kill times and the soak's picks. Deterministic and
//! dependency-free; not for anything that needs unpredictability.

/// splitmix64 state; `SplitMix64(seed)`.
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// In [0, n) (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// In [lo, hi) (`lo` when the range is empty).
    pub fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo).max(1) as u64) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_and_in_range() {
        let a: Vec<u64> = (0..4).map(|_| SplitMix64(7).next()).collect();
        assert!(a.iter().all(|&v| v == a[0]));
        let mut r = SplitMix64(1);
        for _ in 0..100 {
            assert!((0..2).contains(&r.int(0, 2)));
            assert!(r.below(5) < 5);
            assert!((0.0..1.0).contains(&r.unit()));
        }
    }
}
