//! The hasher of the index's maps (terms, namespaces, (namespace, term) statistics).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A small multiplicative hasher for term strings and (namespace, term) keys: SipHash's DoS
/// resistance buys nothing here and costs a third of an add. `finish` folds the high bits
/// down: a product's low bits depend only on its input's low bits, so without the fold
/// words differing past their first bytes ("m100001", "m100002") shared their low hash bits,
/// hence their buckets, and a million of them took 6 s to load (probe chains of memcmps).
#[derive(Default, Clone, Copy)]
pub(super) struct FxHasher(u64);

impl FxHasher {
    #[inline]
    fn mix(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.mix(u64::from_le_bytes(c.try_into().unwrap()));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(b));
        }
    }
    fn write_u8(&mut self, v: u8) {
        self.mix(v as u64);
    }
    fn write_u32(&mut self, v: u32) {
        self.mix(v as u64);
    }
    fn write_u64(&mut self, v: u64) {
        self.mix(v);
    }
    fn write_usize(&mut self, v: usize) {
        self.mix(v as u64);
    }
    fn finish(&self) -> u64 {
        // An xor-shift, multiply, xor-shift finaliser (after MurmurHash3's fmix64, one round).
        let x = self.0 ^ (self.0 >> 32);
        let x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^ (x >> 29)
    }
}

pub(super) type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hasher_spreads_words_that_differ_late() {
        // Words alike in their first bytes must not share low hash bits (hashbrown's bucket
        // index): 4,096 such words over 4,096 buckets fill most of them when the hash is
        // uniform (~2,590 expected); the hasher without its final fold filled 32.
        use std::hash::{BuildHasher, BuildHasherDefault};
        let build = BuildHasherDefault::<FxHasher>::default();
        let buckets: std::collections::HashSet<u64> =
            (100_000..104_096).map(|i| build.hash_one(format!("m{i}")) & 4095).collect();
        assert!(buckets.len() > 2_000, "{} buckets of 4096", buckets.len());
        let top: std::collections::HashSet<u64> =
            (100_000..104_096).map(|i| build.hash_one(format!("m{i}")) >> 57).collect();
        assert_eq!(top.len(), 128, "hashbrown's 7-bit tags are the top bits");
    }
}
