//! `VectorIndex` binding: arrays in, arrays out, errors through `errors.rs`.
//!
//! Every call takes the index lock inside `py.detach` (the GIL is released), so a thread
//! waiting for the lock, or holding it through a long write, never holds the GIL. Input arrays are borrowed read-only from numpy for the duration of the
//! call: callers must not mutate them from another thread meanwhile.
//! The Python facade (`clag_fast.index`) coerces dtypes / layout before calling in here.

use std::path::PathBuf;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use numpy::ndarray::{Array2, ArrayView2};
use numpy::{IntoPyArray, PyArray1, PyArray2, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::error::Error;
use crate::index::Index;
use crate::search::{Adaptive, Params};
use crate::vectors::{Map, HEADER_LEN};

/// (cluster ids, scores) arrays of a soft assignment.
type IdsScores<'py> = (Bound<'py, PyArray2<i64>>, Bound<'py, PyArray2<f32>>);

/// A row-major `rows` x `cols` result as a numpy matrix (the native side sized `v` so).
fn matrix<'py, T: numpy::Element>(py: Python<'py>, rows: usize, cols: usize, v: Vec<T>) -> Bound<'py, PyArray2<T>> {
    Array2::from_shape_vec((rows, cols), v).expect("shape").into_pyarray(py)
}

/// `search_one`'s answer: (rows, scores, clusters, memory ids) lists, rows scanned, probed list.
type SearchOne<'py> = (
    Bound<'py, pyo3::types::PyList>,
    Bound<'py, pyo3::types::PyList>,
    Bound<'py, pyo3::types::PyList>,
    Bound<'py, pyo3::types::PyList>,
    i64,
    Bound<'py, pyo3::types::PyList>,
);

/// committed_rows(path) -> rows the vector file in index directory `path` commits (header only).
#[pyfunction]
pub fn committed_rows(py: Python<'_>, path: PathBuf) -> PyResult<usize> {
    Ok(py.detach(move || crate::index::committed_rows(&path))?)
}

/// Keeps a memory mapping alive for as long as a numpy view of it exists.
#[pyclass(name = "_MapGuard", module = "clag_fast._clag_fast", frozen)]
pub struct PyMapGuard {
    _map: Map,
}

#[pyclass(name = "VectorIndex", module = "clag_fast._clag_fast", frozen)]
pub struct PyVectorIndex {
    inner: RwLock<Option<Index>>,
    path: PathBuf,
}

fn closed() -> Error {
    Error::Io("the index is closed".into())
}

fn slice<'a, T: numpy::Element>(a: &'a PyReadonlyArray1<'_, T>, what: &str) -> PyResult<&'a [T]> {
    a.as_slice().map_err(|_| PyValueError::new_err(format!("{what} must be C-contiguous")))
}

fn slice2<'a, T: numpy::Element>(a: &'a PyReadonlyArray2<'_, T>, what: &str) -> PyResult<&'a [T]> {
    a.as_slice().map_err(|_| PyValueError::new_err(format!("{what} must be C-contiguous")))
}

/// A search's optional row filters as the core takes them: the mask as bytes, the weights.
type Filters<'a> = (Option<&'a [u8]>, Option<&'a [f32]>);

/// `Filters` from the optional numpy arrays (checked C-contiguous).
fn filters<'a>(
    mask: &'a Option<PyReadonlyArray1<'_, bool>>,
    weights: &'a Option<PyReadonlyArray1<'_, f32>>,
) -> PyResult<Filters<'a>> {
    let m = match mask {
        Some(a) => {
            let b = slice(a, "mask")?;
            // SAFETY: numpy bools are one byte holding 0 or 1; reading them as u8 is exact.
            Some(unsafe { std::slice::from_raw_parts(b.as_ptr() as *const u8, b.len()) })
        }
        None => None,
    };
    let w = match weights {
        Some(a) => Some(slice(a, "weights")?),
        None => None,
    };
    Ok((m, w))
}

impl PyVectorIndex {
    fn read(&self) -> Result<RwLockReadGuard<'_, Option<Index>>, Error> {
        // A panic while holding the lock poisons it; the data is still consistent enough to
        // read (every mutation validates before changing state), so recover the guard.
        Ok(self.inner.read().unwrap_or_else(|p| p.into_inner()))
    }
    fn write(&self) -> Result<RwLockWriteGuard<'_, Option<Index>>, Error> {
        Ok(self.inner.write().unwrap_or_else(|p| p.into_inner()))
    }
    fn with<T>(&self, f: impl FnOnce(&Index) -> Result<T, Error>) -> Result<T, Error> {
        let g = self.read()?;
        f(g.as_ref().ok_or_else(closed)?)
    }
    fn with_mut<T>(&self, f: impl FnOnce(&mut Index) -> Result<T, Error>) -> Result<T, Error> {
        let mut g = self.write()?;
        f(g.as_mut().ok_or_else(closed)?)
    }
    /// `with` with the GIL released: a call waiting for the lock (held by a long write) then
    /// never stalls the interpreter's other threads.
    fn read_detached<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&Index) -> Result<T, Error> + Send) -> PyResult<T> {
        Ok(py.detach(|| self.with(f))?)
    }
    /// `with_mut` with the GIL released.
    fn write_detached<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut Index) -> Result<T, Error> + Send) -> PyResult<T> {
        Ok(py.detach(|| self.with_mut(f))?)
    }
}

impl Drop for PyVectorIndex {
    /// An index dropped without `close()` is still flushed (best effort: errors cannot be
    /// raised from here), so forgetting `close()` does not leave cluster state behind.
    fn drop(&mut self) {
        let ix = self.inner.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(ix) = ix {
            let _ = ix.close();
        }
    }
}

#[pymethods]
impl PyVectorIndex {
    /// open(path, dim=None, read_only=False, member_cache=True)
    #[staticmethod]
    #[pyo3(signature = (path, dim=None, read_only=false, member_cache=true))]
    fn open(py: Python<'_>, path: PathBuf, dim: Option<usize>, read_only: bool, member_cache: bool) -> PyResult<Self> {
        let p = path.clone();
        let ix = py.detach(move || Index::open(&p, dim, read_only, member_cache))?;
        Ok(PyVectorIndex { inner: RwLock::new(Some(ix)), path })
    }

    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    #[getter]
    fn dim(&self, py: Python<'_>) -> PyResult<usize> {
        self.read_detached(py, |ix| Ok(ix.dim()))
    }

    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        py.detach(|| self.read().map(|g| g.is_none()).unwrap_or(true))
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.read_detached(py, |ix| Ok(ix.len()))
    }

    /// Number of live clusters.
    fn n_clusters(&self, py: Python<'_>) -> PyResult<usize> {
        self.read_detached(py, |ix| Ok(ix.n_clusters()))
    }

    /// Number of rows neither assigned nor detached (scanned directly by two-stage search).
    fn n_pending(&self, py: Python<'_>) -> PyResult<usize> {
        self.read_detached(py, |ix| Ok(ix.n_pending()))
    }

    fn append<'py>(&self, py: Python<'py>, vectors: PyReadonlyArray2<'py, f32>) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let x = slice2(&vectors, "vectors")?;
        let n = vectors.shape()[0];
        let first = self.write_detached(py, |ix| ix.append(x))?;
        Ok(PyArray1::from_vec(py, (first as i64..(first + n) as i64).collect()))
    }

    /// Zero-copy view of the committed rows (the caller marks it read-only).
    fn vectors<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let py = slf.py();
        let (map, n, dim) = slf.get().read_detached(py, |ix| Ok((ix.map(), ix.len(), ix.dim())))?;
        let guard = Bound::new(py, PyMapGuard { _map: Arc::clone(&map) })?;
        // SAFETY: rows 0..n lie inside `map` (the committed prefix), are never written again,
        // and `guard` (the array's base object) keeps the mapping alive. An empty store
        // still points inside the header page, which is mapped.
        let view = unsafe { ArrayView2::from_shape_ptr((n, dim), map.as_ptr().add(HEADER_LEN) as *const f32) };
        Ok(unsafe { PyArray2::borrow_from_array(&view, guard.into_any()) })
    }

    /// Build every cluster's int8 member copy, taking the lock once per cluster so that a
    /// write waits for one cluster at most, not for the whole pass.
    fn warm(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(py.detach(|| -> Result<usize, Error> {
            let mut built = 0;
            let mut slot = 0;
            while slot < self.with(|ix| Ok(ix.len_slots()))? {
                if self.with(|ix| Ok(ix.warm_slot(slot)))? {
                    built += 1;
                }
                slot += 1;
            }
            Ok(built)
        })?)
    }

    #[pyo3(signature = (durable=true))]
    fn flush(&self, py: Python<'_>, durable: bool) -> PyResult<()> {
        self.write_detached(py, |ix| ix.save(durable))
    }

    /// Flush and release the files; later calls raise OSError. Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        Ok(py.detach(|| {
            let ix = self.write()?.take();
            match ix {
                Some(ix) => ix.close(),
                None => Ok(()),
            }
        })?)
    }

    fn cluster_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let v = self.read_detached(py, |ix| Ok(ix.cluster_ids()))?;
        Ok(PyArray1::from_vec(py, v))
    }

    fn centres<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let (v, dim) = self.read_detached(py, |ix| Ok((ix.centres(), ix.dim())))?;
        Ok(matrix(py, v.len() / dim.max(1), dim, v))
    }

    fn cluster_sizes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let v = self.read_detached(py, |ix| Ok(ix.cluster_sizes()))?;
        Ok(PyArray1::from_vec(py, v))
    }

    fn members<'py>(&self, py: Python<'py>, cid: i64) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let v = self.read_detached(py, |ix| ix.members(cid))?;
        Ok(PyArray1::from_vec(py, v))
    }

    fn secondary_members<'py>(&self, py: Python<'py>, cid: i64) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let v = self.read_detached(py, |ix| ix.secondary_members(cid))?;
        Ok(PyArray1::from_vec(py, v))
    }

    fn cluster_of<'py>(&self, py: Python<'py>, rows: PyReadonlyArray1<'py, i64>) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let r = slice(&rows, "rows")?;
        let v = self.read_detached(py, |ix| ix.cluster_of(r))?;
        Ok(PyArray1::from_vec(py, v))
    }

    fn secondary_of<'py>(&self, py: Python<'py>, row: i64) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let v = self.read_detached(py, |ix| ix.secondary_of(row))?;
        Ok(PyArray1::from_vec(py, v))
    }

    fn soft_assign<'py>(
        &self,
        py: Python<'py>,
        vectors: PyReadonlyArray2<'py, f32>,
        k: usize,
    ) -> PyResult<IdsScores<'py>> {
        let x = slice2(&vectors, "vectors")?;
        let n = vectors.shape()[0];
        let (ids, sc) = self.read_detached(py, |ix| ix.soft_assign(x, k))?;
        Ok((
            matrix(py, n, k, ids),
            matrix(py, n, k, sc),
        ))
    }

    fn assign(&self, py: Python<'_>, rows: PyReadonlyArray1<'_, i64>, cluster_ids: PyReadonlyArray2<'_, i64>) -> PyResult<()> {
        let r = slice(&rows, "rows")?;
        let width = cluster_ids.shape()[1];
        let t = slice2(&cluster_ids, "cluster_ids")?;
        self.write_detached(py, |ix| ix.assign(r, t, width))
    }

    fn unassign(&self, py: Python<'_>, rows: PyReadonlyArray1<'_, i64>) -> PyResult<()> {
        let r = slice(&rows, "rows")?;
        self.write_detached(py, |ix| ix.unassign(r))
    }

    #[pyo3(signature = (centre=None, weight=1.0))]
    fn new_cluster(&self, py: Python<'_>, centre: Option<PyReadonlyArray1<'_, f32>>, weight: f32) -> PyResult<i64> {
        let c = match &centre {
            Some(a) => Some(slice(a, "centre")?),
            None => None,
        };
        self.write_detached(py, |ix| ix.new_cluster(c, weight))
    }

    #[pyo3(signature = (cid, vector, weight=1.0))]
    fn set_centre(&self, py: Python<'_>, cid: i64, vector: PyReadonlyArray1<'_, f32>, weight: f32) -> PyResult<()> {
        let v = slice(&vector, "vector")?;
        self.write_detached(py, |ix| ix.set_centre(cid, v, weight))
    }

    fn drop_cluster(&self, py: Python<'_>, cid: i64) -> PyResult<()> {
        self.write_detached(py, |ix| ix.drop_cluster(cid))
    }

    #[pyo3(signature = (k, rows=None, seed=0))]
    fn kmeans<'py>(
        &self,
        py: Python<'py>,
        k: usize,
        rows: Option<PyReadonlyArray1<'py, i64>>,
        seed: u64,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let r = match &rows {
            Some(a) => Some(slice(a, "rows")?),
            None => None,
        };
        let v = self.write_detached(py, |ix| ix.kmeans(k, r, seed))?;
        Ok(PyArray1::from_vec(py, v))
    }

    #[pyo3(signature = (cid, seed=0))]
    fn split(&self, py: Python<'_>, cid: i64, seed: u64) -> PyResult<(i64, i64)> {
        self.write_detached(py, |ix| ix.split(cid, seed))
    }

    fn split_many(&self, py: Python<'_>, cids: Vec<i64>, seed: u64) -> PyResult<Vec<(i64, i64)>> {
        self.write_detached(py, |ix| ix.split_many(&cids, seed))
    }

    fn merge(&self, py: Python<'_>, keep: i64, absorb: i64) -> PyResult<()> {
        self.write_detached(py, |ix| ix.merge(keep, absorb))
    }

    fn merge_many(&self, py: Python<'_>, pairs: Vec<(i64, i64)>) -> PyResult<()> {
        self.write_detached(py, |ix| ix.merge_many(&pairs))
    }

    /// Returns (cluster ids int64[n], cosines float32[n]).
    fn nearest_among<'py>(
        &self,
        py: Python<'py>,
        cluster_ids: PyReadonlyArray1<'py, i64>,
        among: PyReadonlyArray1<'py, i64>,
    ) -> PyResult<(Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<f32>>)> {
        let (c, a) = (slice(&cluster_ids, "cluster_ids")?, slice(&among, "among")?);
        let (ids, sc) = self.read_detached(py, |ix| ix.nearest_among(c, a))?;
        Ok((PyArray1::from_vec(py, ids), PyArray1::from_vec(py, sc)))
    }

    /// Returns (rows int64[n], cluster ids int64[n, k], scores float32[n, k]).
    #[allow(clippy::type_complexity)]
    fn near_assign<'py>(
        &self,
        py: Python<'py>,
        cluster_ids: PyReadonlyArray1<'py, i64>,
        near: usize,
        k: usize,
    ) -> PyResult<(Bound<'py, PyArray1<i64>>, Bound<'py, PyArray2<i64>>, Bound<'py, PyArray2<f32>>)> {
        let c = slice(&cluster_ids, "cluster_ids")?;
        let (rows, ids, sc) = self.read_detached(py, |ix| ix.near_assign(c, near, k))?;
        let n = rows.len();
        Ok((
            PyArray1::from_vec(py, rows),
            matrix(py, n, k, ids),
            matrix(py, n, k, sc),
        ))
    }

    #[pyo3(signature = (threshold=0.9))]
    fn merge_candidates(&self, py: Python<'_>, threshold: f32) -> PyResult<Vec<(i64, i64, f32)>> {
        self.read_detached(py, |ix| Ok(ix.merge_candidates(threshold)))
    }

    /// Returns (ids, scores, clusters, counts, scanned, probed). `probe_gap` given: adaptive
    /// probing (at least `min_probe`, at most `n_probe` clusters; see `search::Adaptive`).
    #[pyo3(signature = (queries, k=10, n_probe=4, flat=false, mask=None, weights=None, probe_gap=None, min_probe=1, min_rows=0, rows=None, rows_vectors=None))]
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn search<'py>(
        &self,
        py: Python<'py>,
        queries: PyReadonlyArray2<'py, f32>,
        k: usize,
        n_probe: usize,
        flat: bool,
        mask: Option<PyReadonlyArray1<'py, bool>>,
        weights: Option<PyReadonlyArray1<'py, f32>>,
        probe_gap: Option<f32>,
        min_probe: usize,
        min_rows: usize,
        rows: Option<PyReadonlyArray1<'py, u32>>,
        rows_vectors: Option<PyReadonlyArray2<'py, f32>>,
    ) -> PyResult<(
        Bound<'py, PyArray2<i64>>,
        Bound<'py, PyArray2<f32>>,
        Bound<'py, PyArray2<i64>>,
        Bound<'py, PyArray1<i64>>,
        Bound<'py, PyArray1<i64>>,
        Bound<'py, PyArray2<i64>>,
    )> {
        let q = slice2(&queries, "queries")?;
        let nq = queries.shape()[0];
        let (m, w) = filters(&mask, &weights)?;
        let adaptive = probe_gap.map(|gap| Adaptive { min_probe, gap, min_rows });
        let r = match &rows {
            Some(a) => Some(slice(a, "rows")?),
            None => None,
        };
        let rv = match &rows_vectors {
            Some(a) => Some(slice2(a, "rows_vectors")?),
            None => None,
        };
        let p = Params { k, n_probe, adaptive, flat, mask: m, weights: w, rows: r, rows_vectors: rv, ..Default::default() };
        let r = self.read_detached(py, |ix| ix.search(q, &p))?;
        Ok((
            matrix(py, nq, k, r.ids),
            matrix(py, nq, k, r.scores),
            matrix(py, nq, k, r.clusters),
            PyArray1::from_vec(py, r.counts),
            PyArray1::from_vec(py, r.scanned),
            matrix(py, nq, r.probe_width, r.probed),
        ))
    }

    /// One query, answered as Python lists: the store's single-query path. Six result arrays
    /// and their `tolist()` calls cost more than the Python work they fed (a tenth of a
    /// search at 200k rows), so the hits come back as lists cut to their count:
    /// (rows, scores, primary clusters, memory ids, rows scanned, clusters probed).
    /// `memory_ids` is the caller's row -> memory id column (at least as long as the index).
    #[allow(clippy::too_many_arguments)]
    fn search_one<'py>(
        &self,
        py: Python<'py>,
        query: PyReadonlyArray1<'py, f32>,
        memory_ids: PyReadonlyArray1<'py, i64>,
        k: usize,
        n_probe: usize,
        flat: bool,
        mask: Option<PyReadonlyArray1<'py, bool>>,
        weights: Option<PyReadonlyArray1<'py, f32>>,
        probe_gap: Option<f32>,
        min_probe: usize,
        min_rows: usize,
    ) -> PyResult<SearchOne<'py>> {
        let q = slice(&query, "query")?;
        let mids = slice(&memory_ids, "memory_ids")?;
        let (m, w) = filters(&mask, &weights)?;
        let adaptive = probe_gap.map(|gap| Adaptive { min_probe, gap, min_rows });
        let p = Params { k, n_probe, adaptive, flat, mask: m, weights: w, rows: None, rows_vectors: None, ..Default::default() };
        let r = self.read_detached(py, |ix| ix.search_one(q, &p, mids))?;
        Ok((
            pyo3::types::PyList::new(py, r.rows)?,
            pyo3::types::PyList::new(py, r.scores)?,
            pyo3::types::PyList::new(py, r.clusters)?,
            pyo3::types::PyList::new(py, r.memory_ids)?,
            r.scanned,
            pyo3::types::PyList::new(py, r.probed)?,
        ))
    }
}
