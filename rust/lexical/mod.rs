//! The lexical index: Unicode word postings with Okapi BM25 scoring, kept beside the vectors.
//!
//! Documents are vector rows (rows are append-only and never reused, so a row id is a stable
//! document id). Postings are append-only; a document leaves the statistics when its row dies
//! (`sync` with the store's live rows: deletes, archives, replaced texts) and its postings go
//! at the next `compact`.
//!
//! Term statistics are exact per scope and kept incrementally, so a query never scans postings
//! to count them: per namespace the live documents, their tokens and each term's document
//! frequency (`ns_df`, keyed by (namespace, term)), and the same over all namespaces. A forward
//! list (row -> its terms) lets a dying row be taken out of them. One namespace's writes never
//! move another namespace's scores. An arbitrary row mask as the scope (`Scope::Mask`) is still
//! served, by counting, for callers with other needs.
//!
//! Top-N by MaxScore (Turtle & Flood 1995), document at a time: query terms sorted by their
//! score upper bound; once N rows are held, the terms whose bounds together cannot beat the
//! N-th score are "non-essential": rows are only generated from the other terms' postings, and
//! the non-essential terms are looked up (galloping seeks) for those rows alone, stopping as
//! soon as the row's bound falls below the N-th score. Frequent words (low idf, low bound) thus
//! cost a few seeks instead of a walk over most of the postings. Scores are summed in one
//! canonical term order, so the pruned top-N is exactly the exhaustive one (`score`), ties
//! broken by row.
//!
//! Persistence (`save`/`load`, `index/lexical.bin`): the whole index with the rows it covers
//! (the watermark) and a checksum, written atomically; rows after the watermark and rows that
//! died since are the caller's to replay (`store/recovery.open_lexical`).
//!
//! Why postings here rather than SQLite FTS5: see BENCHMARKS.md ("Lexical index"): adds cost
//! a fraction of FTS5's, and the per-row scores come back as arrays that the cluster-aware
//! stage 1 aggregates per cluster.
//!
//! One file per job: `tokenize` (text to terms), `hash` (the maps' hasher), `postings`
//! (adding documents, per-scope statistics, deaths, compaction), `score` (BM25, the
//! exhaustive scorer), `maxscore` (pruned top-N), `format` (`lexical.bin`).

mod format;
mod hash;
mod maxscore;
mod postings;
mod score;
mod tokenize;

pub use format::FORMAT;
pub use maxscore::Top;
pub use score::{Bm25, Matches};
pub use tokenize::tokenize;

use hash::FxMap;

/// `doc_ns` of a row that holds no document.
const NO_DOC: u32 = u32::MAX;

/// One term's postings: rows ascending (rows are appended in increasing order), with the
/// term's count in that row (saturating at u16::MAX).
#[derive(Default, Clone)]
struct Postings {
    rows: Vec<u32>,
    tf: Vec<u16>,
}

/// The postings index with its per-scope statistics. See the module comment.
#[derive(Default)]
pub struct Lexical {
    terms: FxMap<String, u32>,
    /// Term id -> word (for saving).
    words: Vec<String>,
    postings: Vec<Postings>,
    /// Per term, over every posting ever added (still bounds after deaths): the largest tf
    /// and the shortest document, for the term's score upper bound.
    max_tf: Vec<u16>,
    min_len: Vec<u32>,
    /// Per term: counted documents holding it (all namespaces).
    df_all: Vec<u32>,
    ns_codes: FxMap<String, u32>,
    ns_names: Vec<String>,
    ns_docs: Vec<u64>,
    ns_tokens: Vec<u64>,
    /// (namespace << 32 | term) -> counted documents of the namespace holding the term.
    ns_df: FxMap<u64, u32>,
    docs: u64,
    tokens: u64,
    /// Per row: tokens, namespace code (NO_DOC: no document), counted in the statistics.
    doc_len: Vec<u32>,
    doc_ns: Vec<u32>,
    counted: Vec<bool>,
    /// Forward lists, CSR: the distinct terms of row r are fwd[fwd_off[r]..fwd_off[r + 1]].
    fwd_off: Vec<u64>,
    fwd: Vec<u32>,
    n_postings: usize,
    /// Bumped by every change (adds, deaths, compaction): the caller saves when it moved.
    changes: u64,
}

/// Whose statistics a query uses.
#[derive(Clone, Copy, Debug)]
pub enum Scope<'a> {
    /// Every counted document.
    All,
    /// The counted documents of one namespace (an unknown one has none).
    Namespace(&'a str),
    /// The documents of the rows set in the mask (counted by scanning: slow, exact).
    Mask(&'a [u8]),
}

/// (rows set in `live` that died, rows that came back, live rows with no document) from `sync`.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncReport {
    pub died: usize,
    pub revived: usize,
    pub missing: usize,
}

fn in_mask(mask: &[u8], row: usize) -> bool {
    mask.get(row).is_some_and(|&v| v != 0)
}

impl Lexical {
    pub fn new() -> Self {
        Lexical { fwd_off: vec![0], ..Default::default() }
    }

    /// Rows covered (one past the highest row indexed): the watermark of a save.
    pub fn len(&self) -> usize {
        self.doc_len.len()
    }
    pub fn is_empty(&self) -> bool {
        self.doc_len.is_empty()
    }
    pub fn n_terms(&self) -> usize {
        self.terms.len()
    }
    pub fn n_postings(&self) -> usize {
        self.n_postings
    }
    pub fn changes(&self) -> u64 {
        self.changes
    }
}
