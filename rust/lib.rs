//! Native core of clag_fast. Pure Rust modules, one per concern; the PyO3 layer lives in
//! `py/` behind the `python` feature so `cargo test` never links libpython.

pub mod error;

/// Dot products, normalisation, top-k, blocked matrix products, batched assignment.
pub mod kernels;
/// The memory-mapped, append-only, crash-safe vector file.
pub mod vectors;
/// Spherical k-means (k-means++ seeding) used for cold start and splits.
pub mod kmeans;
/// Routing against many centres through a coarse layer of centre groups.
pub mod coarse;
/// Centres, running sums, member lists and the operations on them.
pub mod clusters;
/// Little-endian writer, bounds-checked reader and the checksum of every file format.
pub mod bytes;
/// Atomic whole-file writes and named reads for the derived state files.
pub mod files;
/// The cluster state file (atomic save, checksummed load).
pub mod state;
/// int8 member copies for stage 2 (approximate scan, exact re-score).
pub mod quant;
/// Two-stage and flat search.
pub mod search;
/// One index directory: vectors + cluster state.
pub mod index;
/// Unicode word postings and BM25 scoring (the lexical half of hybrid search).
pub mod lexical;
/// Hybrid search's final scores from thread neighbours, questions, length and speakers.
pub mod context;
/// Export records (JSON Lines) read into columns and written from them.
pub mod records;

#[cfg(feature = "python")]
mod py;
