//! Native core of clag_fast. Pure Rust modules, one per concern; the PyO3 layer lives in
//! `py/` behind the `python` feature so `cargo test` never links libpython.

pub mod error;

#[cfg(feature = "python")]
mod py;
