//! `context_scores` binding: candidate rows and fused scores in, final scores out (GIL released).

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;

use crate::context::{self, Rows, Weights};

/// Final scores of hybrid search's candidates (`store/context.py`); arrays are borrowed
/// read-only for the call: do not mutate them meanwhile.
#[pyfunction]
#[pyo3(signature = (cand, fused, prev, next, asks, words, speaker, neighbours, question_boost, question_weight,
                    length_prior, length_cap, speaker_boost, named))]
#[allow(clippy::too_many_arguments)]
pub fn context_scores<'py>(
    py: Python<'py>, cand: PyReadonlyArray1<'py, i64>, fused: PyReadonlyArray1<'py, f32>,
    prev: PyReadonlyArray1<'py, i64>, next: PyReadonlyArray1<'py, i64>, asks: PyReadonlyArray1<'py, bool>,
    words: PyReadonlyArray1<'py, i32>, speaker: PyReadonlyArray1<'py, i32>, neighbours: Vec<f64>,
    question_boost: f64, question_weight: f64, length_prior: f64, length_cap: i32, speaker_boost: f64,
    named: i32,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let contiguous = |what: &str| pyo3::exceptions::PyValueError::new_err(format!("{what} must be C-contiguous"));
    let (c, f) = (cand.as_slice().map_err(|_| contiguous("cand"))?, fused.as_slice().map_err(|_| contiguous("fused"))?);
    let asks_b = asks.as_slice().map_err(|_| contiguous("asks"))?;
    // SAFETY: numpy bools are one byte, 0 or 1.
    let asks_u8 = unsafe { std::slice::from_raw_parts(asks_b.as_ptr() as *const u8, asks_b.len()) };
    let rows = Rows {
        prev: prev.as_slice().map_err(|_| contiguous("prev"))?,
        next: next.as_slice().map_err(|_| contiguous("next"))?,
        asks: asks_u8,
        words: words.as_slice().map_err(|_| contiguous("words"))?,
        speaker: speaker.as_slice().map_err(|_| contiguous("speaker"))?,
    };
    let w = Weights { neighbours, question_boost, question_weight, length_prior, length_cap, speaker_boost };
    let out = py.detach(|| context::scores(c, f, &rows, &w, named))?;
    Ok(PyArray1::from_vec(py, out))
}
