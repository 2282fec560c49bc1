//! The one place that maps native errors to Python exceptions (like tokenizers' error.rs).

use pyo3::exceptions::{PyKeyError, PyOSError, PyValueError};
use pyo3::PyErr;

use crate::error::Error;

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        match e {
            Error::Value(m) => PyValueError::new_err(m),
            Error::Key(m) => PyKeyError::new_err(m),
            Error::Io(m) => PyOSError::new_err(m),
        }
    }
}
