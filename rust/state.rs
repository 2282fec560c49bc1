//! Cluster state file (`clusters.bin`): written to a temp file, fsynced, renamed over the
//! old one and the directory fsynced, so a crash leaves either the old or the new state.
//!
//! Layout (little endian), framed as every checksummed file of the crate (`bytes::Format`):
//! ```text
//! magic "CLAGCLU\0" | version u32 | dim u32 | rows covered u64 | next id i64 | clusters u64
//! per cluster: id i64 | weight f32 | has_anchor u8 | has_centre u8 | 2 pad bytes
//!              [anchor dim x f32] | centre dim x f32 | sum dim x f64
//!              n_primary u64 | primary u32... | n_secondary u64 | secondary u32...
//! n_pending u64 | pending u32...
//! checksum u64 of everything before it
//! ```
//! Versions differ only in the checksum: 1 byte-wise FNV-1a, 2 FNV-1a over words (both still
//! read), 3 the crate's `bytes::checksum`.
//! Rows appended after the save are simply PENDING on reload.

use std::path::Path;

use crate::bytes::{self, Format, Reader};
use crate::clusters::{Cluster, Clusters};
use crate::error::{Error, Result};
use crate::files;

/// The file format; 3 is written. Version 1's byte-wise checksum took ~20 ms of every
/// organisation's save at 1M memories.
pub const FORMAT: Format = Format {
    magic: *b"CLAGCLU\0",
    what: "cluster state",
    versions: &[(1, bytes::fnv1a), (2, bytes::fnv1a_words), (3, bytes::checksum)],
};

pub fn encode(c: &Clusters) -> Vec<u8> {
    let dim = c.dim();
    let mut w = FORMAT.writer(48 + c.n_rows() * 12 + c.len() * dim * 16);
    w.put(dim as u32);
    w.put(c.n_rows() as u64);
    w.put(c.next_id);
    w.put(c.len() as u64);
    for (s, cl) in c.slots().iter().enumerate() {
        w.put(cl.id);
        w.put(cl.weight);
        w.put_bytes(&[cl.anchor.is_some() as u8, cl.has_centre as u8, 0, 0]);
        if let Some(a) = &cl.anchor {
            w.put_slice(a);
        }
        w.put_slice(&c.centre_matrix()[s * dim..(s + 1) * dim]);
        w.put_slice(&cl.sum);
        w.put_list(&cl.primary);
        w.put_list(&cl.secondary);
    }
    let mut pending: Vec<u32> = c.pending_rows().collect();
    pending.sort_unstable();
    pending.dedup();
    w.put_list(&pending);
    w.finish()
}

/// One cluster's record; its centre row goes to `centres`.
fn read_cluster(r: &mut Reader, dim: usize, centres: &mut Vec<f32>) -> Result<Cluster> {
    let id = r.get::<i64>()?;
    let weight = r.get::<f32>()?;
    let flags = r.take(4)?;
    let (has_anchor, has_centre) = (flags[0] != 0, flags[1] != 0);
    let anchor = if has_anchor { Some(r.vec::<f32>(dim as u64)?) } else { None };
    centres.extend(r.vec::<f32>(dim as u64)?);
    let sum = r.vec::<f64>(dim as u64)?;
    let primary = r.list::<u32>()?;
    let secondary = r.list::<u32>()?;
    Ok(Cluster::new(id, anchor, weight, sum, primary, secondary, has_centre))
}

/// Decode a state file; returns the clusters and the number of rows the state covered.
pub fn decode(b: &[u8], dim: usize) -> Result<(Clusters, usize)> {
    let (_, mut r) = FORMAT.open(b)?;
    let fdim = r.get::<u32>()? as usize;
    if fdim != dim {
        return Err(Error::Io(format!("cluster state has dim {fdim} but the vectors have dim {dim}")));
    }
    let rows = r.get::<u64>()? as usize;
    let next_id = r.get::<i64>()?;
    let n = r.get::<u64>()? as usize;
    if n > r.left() / (dim * 12).max(1) {
        return Err(r.corrupt("cluster count"));
    }
    let mut slots = Vec::with_capacity(n);
    let mut centres = Vec::with_capacity(n * dim);
    for _ in 0..n {
        slots.push(read_cluster(&mut r, dim, &mut centres)?);
    }
    let pending = r.list::<u32>()?;
    r.end()?;
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
        let image = encode(&c);
        assert_eq!(image[8..12], FORMAT.version().to_le_bytes());
        let (d, rows) = decode(&image, dim).unwrap();
        assert_eq!(rows, 4);
        assert_eq!(encode(&d), image);
        assert_eq!(d.cluster_of(0).unwrap(), a);
        assert_eq!(d.secondary_of(0).unwrap(), vec![b]);
        assert_eq!(d.cluster_of(2).unwrap(), -1);
        assert_eq!(d.n_pending(), 1); // row 3
        assert_eq!(d.centre_matrix(), c.centre_matrix());
        for i in [0, 9, 20, image.len() - 1] {
            let mut bad = image.clone();
            bad[i] ^= 1;
            assert!(decode(&bad, dim).is_err());
        }
        assert!(decode(&image[..image.len() - 3], dim).is_err());
        assert!(decode(&image, 4).is_err());
        // Files of versions 1 and 2 (their own checksums) still read, to the same clusters.
        for (version, sum) in [(1u32, bytes::fnv1a as bytes::Checksum), (2, bytes::fnv1a_words)] {
            let mut old = image[..image.len() - 8].to_vec();
            old[8..12].copy_from_slice(&version.to_le_bytes());
            let s = sum(&old);
            old.extend_from_slice(&s.to_le_bytes());
            let (e, _) = decode(&old, dim).unwrap();
            assert_eq!(encode(&e), image);
        }
        // A version-3 body with an older checksum is corrupt.
        let mut mixed = image[..image.len() - 8].to_vec();
        let sum = bytes::fnv1a_words(&mixed);
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
