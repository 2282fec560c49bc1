//! The on-disk index: one directory with `vectors.f32` and `clusters.bin`, tying the vector
//! file and the cluster state together (rows appended since the last save are PENDING).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::clusters::Clusters;
use crate::coarse::{self, Coarse};
use crate::error::{Error, Result};
use crate::kernels;
use crate::search::{self, Params, Results};
use crate::state;
use crate::vectors::{Map, VectorFile};

pub const VECTORS: &str = "vectors.f32";
pub const CLUSTERS: &str = "clusters.bin";

pub struct Index {
    dir: PathBuf,
    vf: VectorFile,
    cl: Clusters,
    /// Group centroids for routing against many centres (`coarse`), built on first need.
    coarse: Mutex<Option<Arc<Coarse>>>,
}

/// Rows the vector file in `dir` commits, read from its header alone (no cluster state is
/// loaded, nothing is locked or modified): what a store checks against its database before
/// it opens the index for writing.
pub fn committed_rows(dir: &Path) -> Result<usize> {
    Ok(VectorFile::open(&dir.join(VECTORS), None, false)?.len())
}

impl Index {
    /// Create or reopen the index in `dir`. `dim` is required to create it and checked
    /// against an existing one. Read-only opens never modify anything. `member_cache`:
    /// see `Clusters::member_cache`.
    pub fn open(dir: &Path, dim: Option<usize>, read_only: bool, member_cache: bool) -> Result<Self> {
        if dir.exists() && !dir.is_dir() {
            return Err(Error::Io(format!("{}: not a directory", dir.display())));
        }
        if !dir.exists() {
            if read_only {
                return Err(Error::Io(format!("{}: no such index directory", dir.display())));
            }
            std::fs::create_dir_all(dir).map_err(|e| Error::Io(format!("{}: {e}", dir.display())))?;
        }
        let vf = VectorFile::open(&dir.join(VECTORS), dim, !read_only)?;
        let cpath = dir.join(CLUSTERS);
        let mut cl = if cpath.exists() {
            let (mut cl, rows) = state::load(&cpath, vf.dim())?;
            if rows > vf.len() {
                // The vector file lost rows the state knew (e.g. power loss before a sync).
                cl.truncate_rows(vf.len(), vf.rows());
            }
            cl
        } else {
            Clusters::new(vf.dim())
        };
        cl.grow_rows(vf.len());
        cl.member_cache = member_cache;
        Ok(Index { dir: dir.to_path_buf(), vf, cl, coarse: Mutex::new(None) })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn dim(&self) -> usize {
        self.vf.dim()
    }
    pub fn len(&self) -> usize {
        self.vf.len()
    }
    pub fn is_empty(&self) -> bool {
        self.vf.is_empty()
    }

    /// Rows neither assigned nor detached (two-stage search scans them directly).
    pub fn n_pending(&self) -> usize {
        self.cl.n_pending()
    }

    /// The vector file's mapping (rows 0..len are committed and never written again).
    pub fn map(&self) -> Map {
        self.vf.map()
    }

    /// Cluster ids, ascending.
    /// Number of live clusters (cheap: no list is built).
    pub fn n_clusters(&self) -> usize {
        self.cl.len()
    }

    pub fn cluster_ids(&self) -> Vec<i64> {
        self.cl.ordered().into_iter().map(|p| p.0).collect()
    }

    /// Centres (clusters x dim, row-major) in `cluster_ids` order.
    pub fn centres(&self) -> Vec<f32> {
        let (dim, cm) = (self.dim(), self.cl.centre_matrix());
        let order = self.cl.ordered();
        // One copy per centre (a flat_map over the slices copied float by float: ~2% of
        // ingest's main thread at 500k memories, organisation asks for the centres often).
        let mut out = Vec::with_capacity(order.len() * dim);
        for &(_, s) in &order {
            out.extend_from_slice(&cm[s * dim..(s + 1) * dim]);
        }
        out
    }

    /// Primary member counts in `cluster_ids` order.
    pub fn cluster_sizes(&self) -> Vec<i64> {
        self.cl.ordered().into_iter().map(|(_, s)| self.cl.slots()[s].primary.len() as i64).collect()
    }

    /// Primary members of a cluster (sorted row ids).
    pub fn members(&self, id: i64) -> Result<Vec<i64>> {
        Ok(self.cl.members(id)?.iter().map(|&r| r as i64).collect())
    }

    /// Rows listing the cluster as a secondary membership (sorted).
    pub fn secondary_members(&self, id: i64) -> Result<Vec<i64>> {
        Ok(self.cl.cluster(id)?.secondary.iter().map(|&r| r as i64).collect())
    }

    /// Primary cluster per row (-1 when unassigned).
    pub fn cluster_of(&self, rows: &[i64]) -> Result<Vec<i64>> {
        rows.iter().map(|&r| self.cl.cluster_of(r)).collect()
    }

    /// Secondary cluster ids of a row.
    pub fn secondary_of(&self, row: i64) -> Result<Vec<i64>> {
        self.cl.secondary_of(row)
    }

    /// `Clusters::near_assign` over the vector file, the neighbouring centres found through
    /// the routing layer past `coarse::COARSE_MIN` centres (nothing changes).
    pub fn near_assign(&self, ids: &[i64], near: usize, k: usize) -> Result<crate::clusters::NearAssignment> {
        let coarse = self.coarse_for(&self.cl.has_centres());
        self.cl.near_assign(ids, near, k, self.vf.rows(), coarse.as_deref())
    }

    /// Centre pairs with cosine >= threshold, most similar first.
    pub fn merge_candidates(&self, threshold: f32) -> Vec<(i64, i64, f32)> {
        let coarse = self.coarse_for(&self.cl.has_centres());
        self.cl.merge_candidates(threshold, coarse.as_deref())
    }

    /// Append rows; returns the first new row id.
    pub fn append(&mut self, data: &[f32]) -> Result<usize> {
        let first = self.vf.append(data)?;
        self.cl.grow_rows(self.vf.len());
        Ok(first)
    }

    /// Durable point: rows synced first, then the cluster state replaced atomically.
    pub fn flush(&mut self) -> Result<()> {
        self.save(true)
    }

    /// Sync the new rows, then save the cluster state (replaced atomically); `durable` also
    /// fsyncs the state file and its directory (`flush`). Without that a process that dies
    /// keeps everything, and a power loss may cost the state since the last durable save,
    /// which opening rebuilds from the rows and the database. The rows are always synced:
    /// the database may reference them once it checkpoints, and a database pointing past
    /// the vector file is a store that refuses to open.
    pub fn save(&mut self, durable: bool) -> Result<()> {
        if !self.vf.writable() {
            return Ok(());
        }
        self.vf.sync()?;
        state::save(&self.cl, &self.dir.join(CLUSTERS), durable)
    }

    pub fn close(mut self) -> Result<()> {
        self.flush()?;
        self.vf.close()
    }

    fn check_writable(&self) -> Result<()> {
        if self.vf.writable() {
            Ok(())
        } else {
            Err(Error::Io(format!("{}: index opened read-only", self.dir.display())))
        }
    }

    /// Top-k centres per vector (n x dim, any scale) without changing state.
    pub fn soft_assign(&self, vectors: &[f32], k: usize) -> Result<(Vec<i64>, Vec<f32>)> {
        let dim = self.dim();
        let x = kernels::normalized(vectors, dim, "vectors")?;
        let n = x.len() / dim;
        if k == 0 || k > search::MAX_K || n.saturating_mul(k) > search::MAX_RESULTS {
            return Err(Error::Value(format!("k={k} is out of range for {n} vectors (1..={})", search::MAX_K)));
        }
        let mut ids = vec![-1i64; n * k];
        let mut sc = vec![f32::NEG_INFINITY; n * k];
        let valid = self.cl.has_centres();
        match self.coarse_for(&valid) {
            Some(c) => {
                coarse::top_centres(&x, self.cl.centre_matrix(), dim, k, &valid, &c, Some(self.cl.centre_codes()), &mut ids, &mut sc)
            }
            None => kernels::top_centres(&x, self.cl.centre_matrix(), dim, k, Some(&valid), &mut ids, &mut sc),
        }
        for v in ids.iter_mut() {
            if *v >= 0 {
                *v = self.cl.slots()[*v as usize].id;
            }
        }
        Ok((ids, sc))
    }

    /// The coarse layer for routing when there are at least `coarse::COARSE_MIN` centres,
    /// rebuilt once their count drifted by a quarter from the one it was built for.
    fn coarse_for(&self, valid: &[bool]) -> Option<Arc<Coarse>> {
        let c = valid.iter().filter(|&&v| v).count();
        // CLAG_FAST_EXACT_ROUTING=1 keeps routing exact at any size (benchmarks compare both).
        if c < coarse::COARSE_MIN || std::env::var_os("CLAG_FAST_EXACT_ROUTING").is_some() {
            return None;
        }
        let mut cached = self.coarse.lock().unwrap_or_else(|e| e.into_inner());
        if !cached.as_ref().is_some_and(|cc| cc.fits(c)) {
            *cached = Coarse::build(self.cl.centre_matrix(), valid, self.dim()).map(Arc::new);
        }
        cached.clone()
    }

    pub fn assign(&mut self, rows: &[i64], targets: &[i64], width: usize) -> Result<()> {
        self.check_writable()?;
        self.cl.assign(rows, targets, width, self.vf.rows())
    }

    pub fn unassign(&mut self, rows: &[i64]) -> Result<()> {
        self.check_writable()?;
        self.cl.unassign(rows, self.vf.rows())
    }

    pub fn new_cluster(&mut self, centre: Option<&[f32]>, weight: f32) -> Result<i64> {
        self.check_writable()?;
        self.cl.new_cluster(centre, weight)
    }

    pub fn set_centre(&mut self, id: i64, v: &[f32], weight: f32) -> Result<()> {
        self.check_writable()?;
        self.cl.set_centre(id, v, weight)
    }

    pub fn drop_cluster(&mut self, id: i64) -> Result<()> {
        self.check_writable()?;
        self.cl.drop_cluster(id)
    }

    pub fn kmeans(&mut self, k: usize, rows: Option<&[i64]>, seed: u64) -> Result<Vec<i64>> {
        self.check_writable()?;
        self.cl.kmeans(k, rows, seed, self.vf.rows())
    }

    pub fn split(&mut self, id: i64, seed: u64) -> Result<(i64, i64)> {
        self.check_writable()?;
        self.cl.split(id, seed, self.vf.rows())
    }

    pub fn split_many(&mut self, ids: &[i64], seed: u64) -> Result<Vec<(i64, i64)>> {
        self.check_writable()?;
        self.cl.split_many(ids, seed, self.vf.rows())
    }

    pub fn merge(&mut self, keep: i64, absorb: i64) -> Result<()> {
        self.check_writable()?;
        self.cl.merge(keep, absorb, self.vf.rows())
    }

    pub fn merge_many(&mut self, pairs: &[(i64, i64)]) -> Result<()> {
        self.check_writable()?;
        self.cl.merge_many(pairs, self.vf.rows())
    }

    /// `Clusters::nearest_among`, through the routing layer past `coarse::COARSE_MIN`
    /// centres (nothing changes).
    pub fn nearest_among(&self, ids: &[i64], among: &[i64]) -> Result<(Vec<i64>, Vec<f32>)> {
        let coarse = self.coarse_for(&self.cl.has_centres());
        self.cl.nearest_among(ids, among, coarse.as_deref())
    }

    /// Build the int8 member copy stage 2 scans for the cluster in `slot` (otherwise built by
    /// the first search that probes it with enough rows in all: a first-query tail). Returns
    /// whether the slot exists and has members. `Index::len_slots` bounds `slot`; callers
    /// warming every cluster take the lock per slot, so writers are not held up for the
    /// whole pass.
    pub fn warm_slot(&self, slot: usize) -> bool {
        match self.cl.slots().get(slot) {
            Some(c) if self.cl.member_cache && !c.primary.is_empty() => {
                c.member_codes(self.vf.rows(), self.dim());
                true
            }
            _ => false,
        }
    }

    /// Number of cluster slots (see `warm_slot`).
    pub fn len_slots(&self) -> usize {
        self.cl.len()
    }

    /// Search; `queries` (q x dim, any non-zero scale) are normalised first.
    pub fn search(&self, queries: &[f32], p: &Params) -> Result<Results> {
        let q = kernels::normalized(queries, self.dim(), "queries")?;
        search::search(&self.cl, self.vf.rows(), self.dim(), &q, p)
    }

    /// Search one `query` (exactly dim values: a longer slice is not read as several queries),
    /// its hits cut to the number found, each with the memory id `memory_ids` gives its row
    /// (the caller's row -> memory id column, at least as long as the index).
    pub fn search_one(&self, query: &[f32], p: &Params, memory_ids: &[i64]) -> Result<OneSearch> {
        if query.len() != self.dim() {
            return Err(Error::Value(format!("query has {} values but the index has dim {}", query.len(), self.dim())));
        }
        let r = self.search(query, p)?;
        let n = r.counts[0] as usize;
        let mut rows = r.ids;
        rows.truncate(n);
        let mids = rows
            .iter()
            .map(|&row| usize::try_from(row).ok().and_then(|i| memory_ids.get(i).copied()))
            .collect::<Option<Vec<i64>>>()
            .ok_or_else(|| {
                Error::Value(format!("memory_ids has {} entries, fewer than the index's rows", memory_ids.len()))
            })?;
        let mut scores = r.scores;
        scores.truncate(n);
        let mut clusters = r.clusters;
        clusters.truncate(n);
        let probed = r.probed.into_iter().take_while(|&c| c >= 0).collect();
        Ok(OneSearch { rows, scores, clusters, memory_ids: mids, scanned: r.scanned[0], probed })
    }
}

/// One query's hits (`Index::search_one`), best first, as many as were found.
#[derive(Debug)]
pub struct OneSearch {
    pub rows: Vec<i64>,
    pub scores: Vec<f32>,
    /// Each hit's primary cluster (-1: none).
    pub clusters: Vec<i64>,
    pub memory_ids: Vec<i64>,
    /// Rows scanned.
    pub scanned: i64,
    /// Clusters probed, best first (none for a flat search).
    pub probed: Vec<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persistence_round_trip_and_pending_after_reopen() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("idx");
        let mut ix = Index::open(&dir, Some(2), false, true).unwrap();
        ix.append(&[1.0, 0.0, 0.9, 0.1, 0.0, 1.0, 0.1, 0.9]).unwrap();
        let ids = ix.kmeans(2, None, 0).unwrap();
        ix.flush().unwrap();
        ix.append(&[1.0, 1.0]).unwrap();
        drop(ix); // no flush: row 4 is committed in the vector file but not in the state
        let mut ix = Index::open(&dir, Some(2), true, true).unwrap();
        assert_eq!(ix.len(), 5);
        let mut got: Vec<i64> = ix.cl.ordered().iter().map(|p| p.0).collect();
        got.sort();
        assert_eq!(got, ids);
        assert_eq!(ix.cl.cluster_of(4).unwrap(), -1);
        assert_eq!(ix.cl.n_pending(), 1);
        assert_eq!(ix.cl.cluster_of(0).unwrap(), ix.cl.cluster_of(1).unwrap());
        assert!(ix.assign(&[4], &[ids[0]], 1).is_err()); // read-only
        assert!(Index::open(&dir, Some(3), true, true).is_err());
    }

    #[test]
    fn search_one_cuts_to_the_hits_and_maps_memory_ids() {
        let d = tempfile::tempdir().unwrap();
        let mut ix = Index::open(d.path(), Some(2), false, true).unwrap();
        ix.append(&[1.0, 0.0, 0.9, 0.1, 0.0, 1.0, 0.1, 0.9]).unwrap();
        ix.kmeans(2, None, 0).unwrap();
        let mids = [100, 101, 102, 103];
        let p = Params { k: 10, n_probe: 2, ..Default::default() };
        let one = ix.search_one(&[1.0, 0.05], &p, &mids).unwrap();
        let all = ix.search(&[1.0, 0.05], &p).unwrap();
        let n = all.counts[0] as usize;
        assert_eq!(n, 4);
        assert_eq!(one.rows, all.ids[..n]);
        assert_eq!(one.scores, all.scores[..n]);
        assert_eq!(one.clusters, all.clusters[..n]);
        assert_eq!(one.memory_ids, one.rows.iter().map(|&r| 100 + r).collect::<Vec<_>>());
        assert_eq!(one.rows[0], 0);
        assert_eq!(one.scanned, all.scanned[0]);
        assert_eq!(one.probed.len(), 2);
        // Two queries' worth of values, and a memory id column shorter than the hits.
        assert!(matches!(ix.search_one(&[1.0, 0.0, 0.0, 1.0], &p, &mids), Err(Error::Value(_))));
        let e = ix.search_one(&[1.0, 0.05], &p, &mids[..2]).unwrap_err();
        assert!(e.to_string().contains("memory_ids has 2 entries"), "{e}");
    }
}
