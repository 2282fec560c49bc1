//! `Lexical` binding: texts in, (rows, scores) arrays out; every call takes the index lock
//! inside `py.detach` (the GIL is released), as in `index.rs`. Mask arrays are borrowed read-only from numpy for the call: do not mutate
//! them meanwhile.

use std::path::PathBuf;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::lexical::{self, Bm25, Lexical, Scope};

/// `score`'s answer: (rows ascending, scores, query terms found, the largest possible score).
type Scored<'py> = (Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<f32>>, usize, f32);

#[pyclass(name = "Lexical", module = "clag_fast._clag_fast", frozen)]
pub struct PyLexical {
    inner: RwLock<Lexical>,
}

/// numpy bools are one byte holding 0 or 1; read them as u8.
fn mask<'a>(a: &'a Option<PyReadonlyArray1<'_, bool>>, what: &str) -> PyResult<Option<&'a [u8]>> {
    match a {
        None => Ok(None),
        Some(a) => {
            let s = a.as_slice().map_err(|_| PyValueError::new_err(format!("{what} must be C-contiguous")))?;
            // SAFETY: bool is one byte, 0 or 1.
            Ok(Some(unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, s.len()) }))
        }
    }
}

/// The scope argument: None = every counted document, a str = one namespace, a bool array =
/// the rows set in it.
enum ScopeArg<'py> {
    All,
    Namespace(String),
    Mask(PyReadonlyArray1<'py, bool>),
}

impl<'py> FromPyObject<'_, 'py> for ScopeArg<'py> {
    type Error = PyErr;
    fn extract(ob: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        if ob.is_none() {
            return Ok(ScopeArg::All);
        }
        if let Ok(s) = ob.extract::<String>() {
            return Ok(ScopeArg::Namespace(s));
        }
        ob.extract::<PyReadonlyArray1<'py, bool>>()
            .map(ScopeArg::Mask)
            .map_err(|_| PyValueError::new_err("scope must be None, a namespace name or a bool array"))
    }
}

fn scope<'a>(s: &'a ScopeArg<'_>) -> PyResult<Scope<'a>> {
    Ok(match s {
        ScopeArg::All => Scope::All,
        ScopeArg::Namespace(n) => Scope::Namespace(n),
        ScopeArg::Mask(m) => {
            let sl = m.as_slice().map_err(|_| PyValueError::new_err("scope must be C-contiguous"))?;
            // SAFETY: bool is one byte, 0 or 1.
            Scope::Mask(unsafe { std::slice::from_raw_parts(sl.as_ptr() as *const u8, sl.len()) })
        }
    })
}

impl PyLexical {
    // A panic while holding the lock poisons it; every mutation validates before changing
    // state, so the data is still consistent: recover the guard (as the index binding does).
    fn read(&self) -> RwLockReadGuard<'_, Lexical> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }
    fn write(&self) -> RwLockWriteGuard<'_, Lexical> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }
}

#[pymethods]
impl PyLexical {
    #[new]
    fn new() -> Self {
        PyLexical { inner: RwLock::new(Lexical::new()) }
    }

    /// load(path) -> Lexical; OSError when the file is missing, damaged or foreign.
    #[staticmethod]
    fn load(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let ix = py.detach(|| Lexical::load(&path))?;
        Ok(PyLexical { inner: RwLock::new(ix) })
    }

    /// save(path): atomic replace (temp file, fsync, rename).
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        py.detach(|| self.read().save(&path))?;
        Ok(())
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        py.detach(|| self.read().len())
    }

    /// (terms, postings) held.
    fn sizes(&self, py: Python<'_>) -> (usize, usize) {
        py.detach(|| {
            let g = self.read();
            (g.n_terms(), g.n_postings())
        })
    }

    /// A counter bumped by every change (to know whether a save is due).
    fn changes(&self, py: Python<'_>) -> u64 {
        py.detach(|| self.read().changes())
    }

    /// add(rows, texts, namespaces=["default"]): rows increasing and above every indexed row;
    /// one namespace per text, or one for all.
    #[pyo3(signature = (rows, texts, namespaces=None))]
    fn add(&self, py: Python<'_>, rows: Vec<u32>, texts: Vec<String>, namespaces: Option<Vec<String>>) -> PyResult<()> {
        let ns = namespaces.unwrap_or_else(|| vec!["default".to_owned()]);
        py.detach(|| {
            let t: Vec<&str> = texts.iter().map(String::as_str).collect();
            let n: Vec<&str> = ns.iter().map(String::as_str).collect();
            self.write().add(&rows, &t, &n)
        })?;
        Ok(())
    }

    /// sync(live) -> (died, revived, missing): count exactly the rows set in `live`.
    fn sync(&self, py: Python<'_>, live: PyReadonlyArray1<'_, bool>) -> PyResult<(usize, usize, usize)> {
        let l = Some(live);
        let m = mask(&l, "live")?.unwrap_or(&[]);
        let r = py.detach(|| self.write().sync(m));
        Ok((r.died, r.revived, r.missing))
    }

    /// stats(scope=None) -> (documents, tokens) in scope.
    #[pyo3(signature = (scope=None))]
    fn stats(&self, py: Python<'_>, scope: Option<ScopeArg<'_>>) -> PyResult<(u64, u64)> {
        let sa = scope.unwrap_or(ScopeArg::All);
        let s = self::scope(&sa)?;
        Ok(py.detach(|| self.read().stats(s)))
    }

    /// score(query, scope=None, eligible=None, k1, b) -> (rows ascending, scores, terms,
    /// max_possible): every matching row (the exhaustive reference).
    #[pyo3(signature = (query, scope=None, eligible=None, k1=1.2, b=0.75))]
    fn score<'py>(
        &self,
        py: Python<'py>,
        query: &str,
        scope: Option<ScopeArg<'py>>,
        eligible: Option<PyReadonlyArray1<'py, bool>>,
        k1: f32,
        b: f32,
    ) -> PyResult<Scored<'py>> {
        let sa = scope.unwrap_or(ScopeArg::All);
        let s = self::scope(&sa)?;
        let e = mask(&eligible, "eligible")?;
        let m = py.detach(|| self.read().score(query, s, e, Bm25 { k1, b }));
        let rows: Vec<i64> = m.rows.iter().map(|&r| r as i64).collect();
        Ok((PyArray1::from_vec(py, rows), PyArray1::from_vec(py, m.scores), m.terms, m.max_possible))
    }

    /// score_top(query, scope, eligible, top_n, lookup, k1, b)
    /// -> (top rows best first, their scores, scores of `lookup` rows, terms, max_possible, scored)
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    #[pyo3(signature = (query, scope, eligible, top_n, lookup, k1=1.2, b=0.75))]
    fn score_top<'py>(
        &self,
        py: Python<'py>,
        query: &str,
        scope: Option<ScopeArg<'py>>,
        eligible: Option<PyReadonlyArray1<'py, bool>>,
        top_n: usize,
        lookup: PyReadonlyArray1<'py, i64>,
        k1: f32,
        b: f32,
    ) -> PyResult<(Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<f32>>, Bound<'py, PyArray1<f32>>, usize, f32, usize)> {
        let sa = scope.unwrap_or(ScopeArg::All);
        let s = self::scope(&sa)?;
        let e = mask(&eligible, "eligible")?;
        let look: Vec<u32> = lookup.as_slice().map_err(|_| PyValueError::new_err("lookup must be C-contiguous"))?
            .iter().map(|&r| r.clamp(0, u32::MAX as i64) as u32).collect();
        let t = py.detach(|| {
            self.read().score_top(query, s, e, Bm25 { k1, b }, top_n, &look)
        });
        let rows: Vec<i64> = t.rows.iter().map(|&r| r as i64).collect();
        Ok((PyArray1::from_vec(py, rows), PyArray1::from_vec(py, t.scores), PyArray1::from_vec(py, t.looked), t.terms,
            t.max_possible, t.scored))
    }

    /// compact(live) -> postings dropped (those of rows outside `live`).
    fn compact(&self, py: Python<'_>, live: PyReadonlyArray1<'_, bool>) -> PyResult<usize> {
        let l = Some(live);
        let m = mask(&l, "live")?.unwrap_or(&[]);
        Ok(py.detach(|| self.write().compact(m)))
    }
}

/// tokenize(text) -> the words the lexical index keeps.
#[pyfunction]
pub fn tokenize(text: &str) -> Vec<String> {
    lexical::tokenize(text)
}
