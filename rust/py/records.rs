//! `parse_export_lines` binding: export lines in, columns of Python values and numpy arrays
//! out (the parse runs with the GIL released; only the values' objects are made with it).

use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyFloat, PyInt, PyList, PyString};

use crate::records::{self, Kind, Parsed, Value};

/// (lines taken, bytes read, whether a line not taken stopped the parse, one list per field
/// (None for the vector and pairs fields; an object field's values are str when the text is
/// in `json.dumps` form, else the JSON text as bytes), the vectors (lines x width float32), the pairs as
/// (ids, affinities) lines x k arrays padded with -1 / 0, or None when no line has any).
type Columns<'py> = (usize, usize, bool, Bound<'py, PyList>, Bound<'py, PyArray2<f32>>, Option<PairArrays<'py>>);
type PairArrays<'py> = (Bound<'py, PyArray2<i64>>, Bound<'py, PyArray2<f32>>);

/// Parse up to `max_lines` export lines of `data` from byte `start` (see `records`).
/// `kinds`: per field one of "str", "count", "float", "bool", "object", "vector", "pairs".
#[pyfunction]
#[pyo3(signature = (data, start, names, kinds, dim, max_lines))]
pub fn parse_export_lines<'py>(
    py: Python<'py>, data: &Bound<'py, PyBytes>, start: usize, names: Vec<String>, kinds: Vec<String>,
    dim: Option<usize>, max_lines: usize,
) -> PyResult<Columns<'py>> {
    let kinds = kinds
        .iter()
        .map(|k| match k.as_str() {
            "str" => Ok(Kind::Str),
            "count" => Ok(Kind::Count),
            "float" => Ok(Kind::Float),
            "bool" => Ok(Kind::Bool),
            "object" => Ok(Kind::Object),
            "vector" => Ok(Kind::Vector),
            "pairs" => Ok(Kind::Pairs),
            other => Err(PyValueError::new_err(format!("unknown field kind {other:?}"))),
        })
        .collect::<PyResult<Vec<_>>>()?;
    if names.len() != kinds.len() {
        return Err(PyValueError::new_err("names and kinds differ in length"));
    }
    let input = data.as_bytes();
    let input = input.get(start..).ok_or_else(|| PyValueError::new_err("start is past the end of data"))?;
    let name_bytes: Vec<&[u8]> = names.iter().map(|n| n.as_bytes()).collect();
    let p = py.detach(|| records::parse_lines(input, &name_bytes, &kinds, dim, max_lines));
    let columns = PyList::empty(py);
    for (col, kind) in p.values.iter().zip(&kinds) {
        if matches!(kind, Kind::Vector | Kind::Pairs) {
            columns.append(py.None())?;
        } else {
            columns.append(column(py, col, input, &p.text)?)?;
        }
    }
    let pairs = pairs(py, &p);
    let (lines, consumed, stopped) = (p.lines, p.consumed, p.stopped);
    let vectors = Array2::from_shape_vec((lines, p.dim), p.vectors).expect("shape").into_pyarray(py);
    Ok((lines, consumed, stopped, columns, vectors, pairs))
}

/// One field's values as Python objects (a run of equal strings shares one object).
fn column<'py>(py: Python<'py>, col: &[Value], input: &[u8], text: &[u8]) -> PyResult<Bound<'py, PyList>> {
    let mut items: Vec<Bound<'py, PyAny>> = Vec::with_capacity(col.len());
    let mut last: Option<(&[u8], Bound<'py, PyAny>)> = None;
    for v in col {
        let item = match *v {
            Value::Null => py.None().into_bound(py),
            Value::Int(i) => PyInt::new(py, i).into_any(),
            Value::Float(x) => PyFloat::new(py, x).into_any(),
            Value::Bool(b) => PyBool::new(py, b).to_owned().into_any(),
            // Text in the stored form as a str, other text as bytes (the caller rewrites it).
            Value::Object { start, end, canonical: true } => {
                // SAFETY: `records` took only objects that are valid UTF-8.
                PyString::new(py, unsafe { std::str::from_utf8_unchecked(&input[start..end]) }).into_any()
            }
            Value::Object { start, end, canonical: false } => PyBytes::new(py, &input[start..end]).into_any(),
            Value::Str { start, end, copied } => {
                let bytes = if copied { &text[start..end] } else { &input[start..end] };
                match &last {
                    Some((b, obj)) if *b == bytes => obj.clone(),
                    _ => {
                        // SAFETY: `records` took only strings that are valid UTF-8.
                        let s = unsafe { std::str::from_utf8_unchecked(bytes) };
                        let obj = PyString::new(py, s).into_any();
                        last = Some((bytes, obj.clone()));
                        obj
                    }
                }
            }
        };
        items.push(item);
    }
    PyList::new(py, items)
}

/// The pairs as (ids, affinities) arrays, `lines` x the most pairs of a line (at least 1),
/// padded with -1 ids and 0 affinities; None when no line has pairs.
fn pairs<'py>(py: Python<'py>, p: &Parsed) -> Option<PairArrays<'py>> {
    if p.pair_counts.iter().all(|&c| c < 0) {
        return None;
    }
    let k = p.pair_counts.iter().copied().max().unwrap_or(0).max(1) as usize;
    let mut ids = vec![-1i64; p.lines * k];
    let mut aff = vec![0f32; p.lines * k];
    let mut at = 0;
    for (row, &c) in p.pair_counts.iter().enumerate() {
        for j in 0..c.max(0) as usize {
            ids[row * k + j] = p.pair_ids[at];
            aff[row * k + j] = p.pair_aff[at];
            at += 1;
        }
    }
    let ids = Array2::from_shape_vec((p.lines, k), ids).expect("shape").into_pyarray(py);
    let aff = Array2::from_shape_vec((p.lines, k), aff).expect("shape").into_pyarray(py);
    Some((ids, aff))
}

/// Export lines as bytes (`records::export_lines`): `names` the fields, `texts[field]` their
/// JSON texts per line (str), `vectors` the lines' vectors, `pair_ids` / `pair_aff` their
/// pairs (lines x k, ids < 0 left out). The lines are made without the GIL.
#[pyfunction]
pub fn format_export_lines<'py>(
    py: Python<'py>, names: Vec<String>, texts: Vec<Bound<'py, PyList>>, vectors: numpy::PyReadonlyArray2<'py, f32>,
    pair_ids: numpy::PyReadonlyArray2<'py, i64>, pair_aff: numpy::PyReadonlyArray2<'py, f32>,
) -> PyResult<Bound<'py, PyBytes>> {
    let lines = vectors.shape()[0];
    if names.len() != texts.len() || texts.iter().any(|t| t.len() != lines) || pair_ids.shape()[0] != lines
        || pair_ids.shape() != pair_aff.shape()
    {
        return Err(PyValueError::new_err("every field, the vectors and the pairs need one entry per line"));
    }
    let (dim, k) = (vectors.shape()[1], pair_ids.shape()[1]);
    let contiguous = |what: &str| PyValueError::new_err(format!("{what} must be C-contiguous"));
    let flat = vectors.as_slice().map_err(|_| contiguous("vectors"))?;
    let ids = pair_ids.as_slice().map_err(|_| contiguous("pair_ids"))?;
    let aff = pair_aff.as_slice().map_err(|_| contiguous("pair_aff"))?;
    let strs: Vec<Vec<Bound<'py, PyString>>> = texts
        .iter()
        .map(|t| t.iter().map(|v| v.cast_into::<PyString>().map_err(PyErr::from)).collect::<PyResult<Vec<_>>>())
        .collect::<PyResult<_>>()?;
    let texts: Vec<Vec<&[u8]>> = strs
        .iter()
        .map(|col| col.iter().map(|s| s.to_str().map(str::as_bytes)).collect::<PyResult<Vec<_>>>())
        .collect::<PyResult<_>>()?;
    let name_bytes: Vec<&[u8]> = names.iter().map(|n| n.as_bytes()).collect();
    let out = py.detach(|| {
        let mut out = Vec::new();
        records::export_lines(&name_bytes, &texts, flat, dim, ids, aff, k, &mut out);
        out
    });
    Ok(PyBytes::new(py, &out))
}

/// Positions of the `values` that are neither None nor a str holding one JSON object
/// (`records::is_object`): the ones Python must look at. Checked without the GIL.
#[pyfunction]
pub fn unconfirmed_objects<'py>(py: Python<'py>, values: &Bound<'py, PyList>) -> PyResult<Vec<usize>> {
    let mut texts: Vec<Option<&[u8]>> = Vec::with_capacity(values.len());
    let mut strs: Vec<Bound<'py, PyString>> = Vec::with_capacity(values.len());
    let mut kinds = Vec::with_capacity(values.len()); // 0 none, 1 str (index into strs), 2 other
    for v in values.iter() {
        if v.is_none() {
            kinds.push(0u8);
        } else if let Ok(s) = v.cast_into::<PyString>() {
            strs.push(s);
            kinds.push(1);
        } else {
            kinds.push(2);
        }
    }
    let mut at = strs.iter();
    for &k in &kinds {
        texts.push(match k {
            1 => at.next().and_then(|s| s.to_str().ok()).map(str::as_bytes),
            _ => None,
        });
    }
    Ok(py.detach(|| {
        let mut scratch = Vec::new();
        kinds
            .iter()
            .zip(&texts)
            .enumerate()
            .filter(|(_, (&k, t))| match k {
                0 => false,
                1 => !t.is_some_and(|t| records::is_object(t, &mut scratch)),
                _ => true,
            })
            .map(|(i, _)| i)
            .collect()
    }))
}
