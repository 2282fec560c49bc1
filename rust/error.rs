//! The one error type of the native core; `py/` maps it to Python exceptions in one place.

use std::fmt;

#[derive(Debug)]
pub enum Error {
    /// Bad shapes, dimensions, NaN/inf values, bad parameters -> ValueError.
    Value(String),
    /// Unknown row or cluster id -> KeyError.
    Key(String),
    /// File system failures, corrupt or foreign files -> OSError.
    Io(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Value(m) | Error::Key(m) | Error::Io(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e.to_string())
    }
}
