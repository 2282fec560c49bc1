//! Cluster state file (`clusters.bin`): written to a temp file, fsynced, renamed over the
//! old one and the directory fsynced, so a crash leaves either the old or the new state.
//!
//! Layout (little endian), followed by a checksum of everything before it (`fnv1a_words`;
//! files of version 1 carry the byte-wise `fnv1a`):
//! ```text
//! magic "CLAGCLU\0" | version u32 | dim u32 | rows covered u64 | next id i64 | clusters u64
//! per cluster: id i64 | weight f32 | has_anchor u8 | has_centre u8 | 2 pad bytes
//!              [anchor dim x f32] | centre dim x f32 | sum dim x f64
//!              n_primary u64 | primary u32... | n_secondary u64 | secondary u32...
//! n_pending u64 | pending u32...
//! ```
//! Rows appended after the save are simply PENDING on reload.

use std::path::Path;

use crate::clusters::{Cluster, Clusters};
use crate::error::{Error, Result};
use crate::files;
use crate::vectors::{fnv1a, fnv1a_words};

pub const MAGIC: [u8; 8] = *b"CLAGCLU\0";
/// 2: the checksum is `fnv1a_words` (version 1, still read: byte-wise `fnv1a`, which at 1M
/// memories took ~20 ms of every organisation's save).
pub const VERSION: u32 = 2;

/// Plain numbers whose in-memory bytes are their little-endian encoding on a little-endian
/// target: a slice of them is written with one copy instead of one push per number (the
/// per-number pushes were most of the time an organisation spent saving this file).
trait Le: Copy {
    const SIZE: usize;
    fn put(self, b: &mut Vec<u8>);
}

macro_rules! le {
    ($($t:ty),*) => {$(
        impl Le for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn put(self, b: &mut Vec<u8>) {
                b.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
le!(u32, f32, f64);

fn put_slice<T: Le>(b: &mut Vec<u8>, v: &[T]) {
    if cfg!(target_endian = "little") {
        // SAFETY: u32/f32/f64 have no padding and every byte pattern is a valid u8; the view
        // covers exactly the slice's memory and lives only for this copy.
        let bytes = unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * T::SIZE) };
        b.extend_from_slice(bytes);
    } else {
        v.iter().for_each(|x| x.put(b));
    }
}

fn put_u32s(b: &mut Vec<u8>, v: &[u32]) {
    b.extend_from_slice(&(v.len() as u64).to_le_bytes());
    put_slice(b, v);
}

pub fn encode(c: &Clusters) -> Vec<u8> {
    let dim = c.dim();
    let mut b = Vec::with_capacity(64 + c.n_rows() * 12);
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&(dim as u32).to_le_bytes());
    b.extend_from_slice(&(c.n_rows() as u64).to_le_bytes());
    b.extend_from_slice(&c.next_id.to_le_bytes());
    b.extend_from_slice(&(c.len() as u64).to_le_bytes());
    for (s, cl) in c.slots().iter().enumerate() {
        b.extend_from_slice(&cl.id.to_le_bytes());
        b.extend_from_slice(&cl.weight.to_le_bytes());
        b.extend_from_slice(&[cl.anchor.is_some() as u8, cl.has_centre as u8, 0, 0]);
        if let Some(a) = &cl.anchor {
            put_slice(&mut b, a);
        }
        put_slice(&mut b, &c.centre_matrix()[s * dim..(s + 1) * dim]);
        put_slice(&mut b, &cl.sum);
        put_u32s(&mut b, &cl.primary);
        put_u32s(&mut b, &cl.secondary);
    }
    let mut pending: Vec<u32> = c.pending_rows().collect();
    pending.sort_unstable();
    pending.dedup();
    put_u32s(&mut b, &pending);
    let sum = fnv1a_words(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    b
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.b.len() - self.at < n {
            return Err(Error::Io("corrupt cluster state: truncated".into()));
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn f32s(&mut self, n: usize) -> Result<Vec<f32>> {
        Ok(self.take(n * 4)?.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect())
    }
    fn f64s(&mut self, n: usize) -> Result<Vec<f64>> {
        Ok(self.take(n * 8)?.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect())
    }
    fn u32s(&mut self) -> Result<Vec<u32>> {
        let n = self.u64()? as usize;
        if n > (self.b.len() - self.at) / 4 {
            return Err(Error::Io("corrupt cluster state: list longer than the file".into()));
        }
        Ok(self.take(n * 4)?.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect())
    }
}

/// Decode a state file; returns the clusters and the number of rows the state covered.
pub fn decode(b: &[u8], dim: usize) -> Result<(Clusters, usize)> {
    if b.len() < 44 || b[..8] != MAGIC {
        return Err(Error::Io("not a clag_fast cluster state file (bad magic or too short)".into()));
    }
    let (body, tail) = b.split_at(b.len() - 8);
    let mut r = Reader { b: body, at: 8 };
    let version = r.u32()?;
    let sum = match version {
        1 => fnv1a(body),
        VERSION => fnv1a_words(body),
        _ => {
            return Err(Error::Io(format!(
                "cluster state version {version} is not supported (this build reads 1 and {VERSION})"
            )))
        }
    };
    if sum != u64::from_le_bytes(tail.try_into().unwrap()) {
        return Err(Error::Io("corrupt cluster state: checksum mismatch".into()));
    }
    let fdim = r.u32()? as usize;
    if fdim != dim {
        return Err(Error::Io(format!("cluster state has dim {fdim} but the vectors have dim {dim}")));
    }
    let rows = r.u64()? as usize;
    let next_id = r.u64()? as i64;
    let n = r.u64()? as usize;
    if n > body.len() / (dim * 12).max(1) {
        return Err(Error::Io("corrupt cluster state: cluster count".into()));
    }
    let mut slots = Vec::with_capacity(n);
    let mut centres = Vec::with_capacity(n * dim);
    for _ in 0..n {
        let id = r.u64()? as i64;
        let weight = f32::from_le_bytes(r.take(4)?.try_into().unwrap());
        let flags = r.take(4)?;
        let (has_anchor, has_centre) = (flags[0] != 0, flags[1] != 0);
        let anchor = if has_anchor { Some(r.f32s(dim)?) } else { None };
        centres.extend(r.f32s(dim)?);
        let sum = r.f64s(dim)?;
        let primary = r.u32s()?;
        let secondary = r.u32s()?;
        slots.push(Cluster::new(id, anchor, weight, sum, primary, secondary, has_centre));
    }
    let pending = r.u32s()?;
    if r.at != body.len() {
        return Err(Error::Io("corrupt cluster state: trailing bytes".into()));
    }
    Ok((Clusters::from_parts(dim, slots, centres, next_id, rows, pending)?, rows))
}

/// Atomically replace `path` with the encoded state.
pub fn save(c: &Clusters, path: &Path, durable: bool) -> Result<()> {
    files::replace(path, &encode(c), durable)
}

/// Load `path`; errors name the file.
pub fn load(path: &Path, dim: usize) -> Result<(Clusters, usize)> {
    files::read_decoded(path, |b| decode(b, dim))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        let dim = 3;
        let data: Vec<f32> = vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.6, 0.8, 0.0];
        let mut c = Clusters::new(dim);
        c.grow_rows(4);
        let a = c.new_cluster(Some(&[1.0, 0.0, 0.0]), 0.5).unwrap();
        let b = c.new_cluster(None, 1.0).unwrap();
        c.assign(&[0, 1], &[a, b, b, -1], 2, &data).unwrap();
        c.unassign(&[2], &data).unwrap();
        let bytes = encode(&c);
        let (d, rows) = decode(&bytes, dim).unwrap();
        assert_eq!(rows, 4);
        assert_eq!(encode(&d), bytes);
        assert_eq!(d.cluster_of(0).unwrap(), a);
        assert_eq!(d.secondary_of(0).unwrap(), vec![b]);
        assert_eq!(d.cluster_of(2).unwrap(), -1);
        assert_eq!(d.n_pending(), 1); // row 3
        assert_eq!(d.centre_matrix(), c.centre_matrix());
        for i in [0, 9, 20, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[i] ^= 1;
            assert!(decode(&bad, dim).is_err());
        }
        assert!(decode(&bytes[..bytes.len() - 3], dim).is_err());
        assert!(decode(&bytes, 4).is_err());
        // A version-1 file (byte-wise checksum) still reads, to the same clusters.
        let mut v1 = bytes[..bytes.len() - 8].to_vec();
        v1[8..12].copy_from_slice(&1u32.to_le_bytes());
        let sum = fnv1a(&v1);
        v1.extend_from_slice(&sum.to_le_bytes());
        let (e, _) = decode(&v1, dim).unwrap();
        assert_eq!(encode(&e), bytes);
        // A version-2 body with the version-1 checksum is corrupt.
        let mut mixed = bytes[..bytes.len() - 8].to_vec();
        let sum = fnv1a(&mixed);
        mixed.extend_from_slice(&sum.to_le_bytes());
        assert!(decode(&mixed, dim).is_err());
    }

    /// The clusters `testdata/clusters_v2.bin` holds, built again through the public calls.
    fn fixture_clusters() -> (Clusters, [i64; 3]) {
        let data: Vec<f32> = vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.6, 0.8, 0.0, 0.0, 0.6, 0.8];
        let mut c = Clusters::new(3);
        c.grow_rows(5);
        let a = c.new_cluster(Some(&[1.0, 0.0, 0.0]), 0.5).unwrap();
        let b = c.new_cluster(None, 1.0).unwrap();
        let e = c.new_cluster(None, 1.0).unwrap();
        c.assign(&[0, 1, 3], &[a, b, b, -1, e, a], 2, &data).unwrap();
        c.unassign(&[1], &data).unwrap();
        (c, [a, b, e])
    }

    #[test]
    fn a_version_2_file_still_loads() {
        // Written by the version-2 encoder (fnv1a_words checksum); never regenerate it.
        let old: &[u8] = include_bytes!("testdata/clusters_v2.bin");
        assert_eq!(u32::from_le_bytes(old[8..12].try_into().unwrap()), 2);
        let (want, [a, _, e]) = fixture_clusters();
        let (got, rows) = decode(old, 3).unwrap();
        assert_eq!(rows, 5);
        assert_eq!(encode(&got), encode(&want));
        assert_eq!([0, 1, 2, 3, 4].map(|r| got.cluster_of(r).unwrap()), [a, -1, -1, e, -1]);
        assert_eq!(got.secondary_of(3).unwrap(), vec![a]);
        assert_eq!(got.n_pending(), 2);
        let mut bad = old.to_vec();
        bad[40] ^= 1;
        assert!(decode(&bad, 3).is_err());
    }
}
