//! A fast, non-cryptographic hasher (the FxHash mix) for the per-tensor maps of large graphs:
//! SipHash dominated graph building and analysis. Keys come from the model file (the
//! operator's own deployment), not from a network peer, so hash flooding is not a concern.

use std::collections::HashMap;

/// A fast, non-cryptographic hasher (the FxHash mix) for the per-tensor maps: SipHash
/// dominated the analysis of large graphs. Keys come from the model being analysed, not from
/// a network peer.
#[derive(Clone, Copy, Default)]
pub struct FxHasher(u64);

impl std::hash::Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(K);
        }
    }
    fn write_u8(&mut self, b: u8) {
        self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, v: usize) {
        self.0 = (self.0.rotate_left(5) ^ v as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// `HashMap` with [`FxHasher`].
pub type FastMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<FxHasher>>;
/// `HashSet` with [`FxHasher`].
pub type FastSet<K> = std::collections::HashSet<K, std::hash::BuildHasherDefault<FxHasher>>;
