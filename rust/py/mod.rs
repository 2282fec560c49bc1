//! Thin binding layer: converts arrays and errors, releases the GIL around kernels.

use pyo3::prelude::*;

mod errors;

#[pymodule]
fn _clag_fast(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
