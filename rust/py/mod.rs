//! Thin binding layer: converts arrays and errors, releases the GIL around kernels.

use pyo3::prelude::*;

mod context;
mod errors;
mod index;
mod lexical;
mod records;

#[pymodule]
fn _clag_fast(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<index::PyVectorIndex>()?;
    m.add_class::<index::PyMapGuard>()?;
    m.add_class::<lexical::PyLexical>()?;
    m.add_function(wrap_pyfunction!(lexical::tokenize, m)?)?;
    m.add_function(wrap_pyfunction!(index::committed_rows, m)?)?;
    m.add_function(wrap_pyfunction!(context::context_scores, m)?)?;
    m.add_function(wrap_pyfunction!(records::parse_export_lines, m)?)?;
    m.add_function(wrap_pyfunction!(records::format_export_lines, m)?)?;
    m.add_function(wrap_pyfunction!(records::unconfirmed_objects, m)?)?;
    Ok(())
}
