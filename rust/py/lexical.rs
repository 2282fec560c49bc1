//! `Lexical` binding: texts in, (rows, scores) arrays out; the GIL is released around adds
//! and scoring, and the index lock is taken inside the detached closure (as in `index.rs`).
//! Mask arrays are borrowed read-only from numpy for the call: do not mutate them meanwhile.

use std::sync::RwLock;

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::lexical::{self, Bm25, Lexical};

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

#[pymethods]
impl PyLexical {
    #[new]
    fn new() -> Self {
        PyLexical { inner: RwLock::new(Lexical::new()) }
    }

    fn __len__(&self) -> usize {
        self.inner.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// (terms, postings) held.
    fn sizes(&self) -> (usize, usize) {
        let g = self.inner.read().unwrap_or_else(|p| p.into_inner());
        (g.n_terms(), g.n_postings())
    }

    /// add(rows, texts): rows increasing and above every indexed row.
    fn add(&self, py: Python<'_>, rows: Vec<u32>, texts: Vec<String>) -> PyResult<()> {
        py.detach(|| {
            let t: Vec<&str> = texts.iter().map(String::as_str).collect();
            self.inner.write().unwrap_or_else(|p| p.into_inner()).add(&rows, &t)
        })?;
        Ok(())
    }

    /// stats(scope=None) -> (documents, tokens) over the rows in scope.
    #[pyo3(signature = (scope=None))]
    fn stats(&self, py: Python<'_>, scope: Option<PyReadonlyArray1<'_, bool>>) -> PyResult<(u64, u64)> {
        let s = mask(&scope, "scope")?;
        Ok(py.detach(|| self.inner.read().unwrap_or_else(|p| p.into_inner()).stats(s)))
    }

    /// score(query, scope, eligible, docs, tokens, k1, b) -> (rows, scores, terms, max_possible)
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (query, scope, eligible, docs, tokens, k1=1.2, b=0.75))]
    fn score<'py>(
        &self,
        py: Python<'py>,
        query: &str,
        scope: Option<PyReadonlyArray1<'py, bool>>,
        eligible: Option<PyReadonlyArray1<'py, bool>>,
        docs: u64,
        tokens: u64,
        k1: f32,
        b: f32,
    ) -> PyResult<(Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<f32>>, usize, f32)> {
        let s = mask(&scope, "scope")?;
        let e = mask(&eligible, "eligible")?;
        let m = py.detach(|| {
            self.inner.read().unwrap_or_else(|p| p.into_inner()).score(query, s, e, docs, tokens, Bm25 { k1, b })
        });
        let rows: Vec<i64> = m.rows.iter().map(|&r| r as i64).collect();
        Ok((PyArray1::from_vec(py, rows), PyArray1::from_vec(py, m.scores), m.terms, m.max_possible))
    }

    /// score_top(query, scope, eligible, docs, tokens, top_n, lookup, k1, b)
    /// -> (top rows best first, their scores, scores of `lookup` rows, terms, max_possible)
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    #[pyo3(signature = (query, scope, eligible, docs, tokens, top_n, lookup, k1=1.2, b=0.75))]
    fn score_top<'py>(
        &self,
        py: Python<'py>,
        query: &str,
        scope: Option<PyReadonlyArray1<'py, bool>>,
        eligible: Option<PyReadonlyArray1<'py, bool>>,
        docs: u64,
        tokens: u64,
        top_n: usize,
        lookup: PyReadonlyArray1<'py, i64>,
        k1: f32,
        b: f32,
    ) -> PyResult<(Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<f32>>, Bound<'py, PyArray1<f32>>, usize, f32)> {
        let s = mask(&scope, "scope")?;
        let e = mask(&eligible, "eligible")?;
        let look: Vec<u32> = lookup.as_slice().map_err(|_| PyValueError::new_err("lookup must be C-contiguous"))?
            .iter().map(|&r| r.clamp(0, u32::MAX as i64) as u32).collect();
        let (rows, scores, looked, terms, maxp) = py.detach(|| {
            self.inner.read().unwrap_or_else(|p| p.into_inner())
                .score_top(query, s, e, docs, tokens, Bm25 { k1, b }, top_n, &look)
        });
        let rows: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
        Ok((PyArray1::from_vec(py, rows), PyArray1::from_vec(py, scores), PyArray1::from_vec(py, looked), terms, maxp))
    }

    /// compact(live) -> postings dropped (those of rows outside `live`).
    fn compact(&self, py: Python<'_>, live: PyReadonlyArray1<'_, bool>) -> PyResult<usize> {
        let l = Some(live);
        let m = mask(&l, "live")?.unwrap_or(&[]);
        Ok(py.detach(|| self.inner.write().unwrap_or_else(|p| p.into_inner()).compact(m)))
    }
}

/// tokenize(text) -> the words the lexical index keeps.
#[pyfunction]
pub fn tokenize(text: &str) -> Vec<String> {
    lexical::tokenize(text)
}
