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

use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::path::Path;

use crate::bytes::{self, Format};
use crate::error::{Error, Result};
use crate::files;

/// Longest token kept, in characters; longer runs (hashes, base64) are cut to this.
const MAX_TOKEN_CHARS: usize = 40;

/// A small English stopword list (function words and contraction debris). Content words
/// such as "like" or "time" stay: they carry meaning in conversation.
const STOPWORDS: &[&str] = &[
    "a", "about", "above", "after", "again", "all", "am", "an", "and", "any", "are", "as", "at",
    "be", "because", "been", "before", "being", "below", "between", "both", "but", "by", "can",
    "could", "d", "did", "do", "does", "doing", "don", "down", "during", "each", "few", "for",
    "from", "further", "had", "has", "have", "having", "he", "her", "here", "hers", "herself",
    "him", "himself", "his", "how", "i", "if", "in", "into", "is", "it", "its", "itself", "just",
    "ll", "m", "me", "more", "most", "my", "myself", "no", "nor", "not", "now", "o", "of", "off",
    "on", "once", "only", "or", "other", "our", "ours", "ourselves", "out", "over", "own", "re",
    "s", "same", "she", "should", "so", "some", "such", "t", "than", "that", "the", "their",
    "theirs", "them", "themselves", "then", "there", "these", "they", "this", "those", "through",
    "to", "too", "under", "until", "up", "ve", "very", "was", "we", "were", "what", "when",
    "where", "which", "while", "who", "whom", "why", "will", "with", "would", "you", "your",
    "yours", "yourself", "yourselves",
];

/// Okapi BM25 parameters.
#[derive(Clone, Copy, Debug)]
pub struct Bm25 {
    pub k1: f32,
    pub b: f32,
}

impl Default for Bm25 {
    fn default() -> Self {
        Bm25 { k1: 1.2, b: 0.75 }
    }
}

/// Scripts written without spaces between words: each character is its own token (unigrams;
/// a query in these scripts matches by shared characters).
fn is_unspaced(c: char) -> bool {
    matches!(c as u32,
        0x3040..=0x30FF      // Hiragana, Katakana
        | 0x3400..=0x4DBF    // CJK extension A
        | 0x4E00..=0x9FFF    // CJK unified ideographs
        | 0xF900..=0xFAFF    // CJK compatibility ideographs
        | 0x20000..=0x2FA1F  // CJK extensions B-F, compatibility supplement
        | 0x0E00..=0x0E7F    // Thai
        | 0x0E80..=0x0EFF    // Lao
        | 0x1000..=0x109F    // Myanmar
        | 0x1780..=0x17FF)   // Khmer
}

fn is_stopword(w: &str) -> bool {
    STOPWORDS.binary_search(&w).is_ok()
}

/// A light English suffix stripper for ASCII words (plural `-s`/`-es`/`-ies`, then `-ing` or
/// `-ed` with a doubled final consonant undone, then a final `e`), so "hikes", "hiking",
/// "hiked" and "hike" are one term.
/// Applied to documents and queries alike. Measured on LoCoMo (benches/eval_hybrid.py, flat,
/// Recall@10, prototyped by stemming the texts in Python): BM25 0.582 -> 0.612, the 0.5 blend
/// 0.645 -> 0.660, better on both halves of the conversations and by 3 points on the
/// stdlib-docs set.
/// Words outside ASCII are left as written.
fn stem_ascii(w: &mut String) {
    let n = w.len();
    let b = w.as_bytes();
    if n > 4 && w.ends_with("ies") {
        w.truncate(n - 3);
        w.push('y');
    } else if n > 3 && w.ends_with("es") && matches!(b[n - 3], b's' | b'x' | b'z') {
        w.truncate(n - 2);
    } else if n > 3 && w.ends_with('s') && !(w.ends_with("ss") || w.ends_with("us") || w.ends_with("is")) {
        w.truncate(n - 1);
    }
    for suf in ["ing", "ed"] {
        let n = w.len();
        // The stem keeps at least three letters ("hiking" -> "hik", "sing" stays), and "-eed"
        // is not a past tense ("speed", "need").
        if n >= suf.len() + 3 && w.ends_with(suf) && !w.ends_with("eed") {
            w.truncate(n - suf.len());
            let b = w.as_bytes();
            let m = b.len();
            if m > 3 && b[m - 1] == b[m - 2] && !matches!(b[m - 1], b'l' | b's' | b'z') {
                w.truncate(m - 1);
            }
            break;
        }
    }
    // A final silent `e` goes too, so "hike" meets "hiking" and "hiked" (both "hik").
    let n = w.len();
    if n > 3 && w.ends_with('e') && !w.ends_with("ee") {
        w.truncate(n - 1);
    }
}

/// Split `text` into lower-cased Unicode words (letters, digits and combining marks; anything
/// else separates), one token per character in unspaced scripts, stopwords dropped, tokens cut
/// to `MAX_TOKEN_CHARS`. Nothing in the text is ever an operator: quotes, `*`, `-`, `AND`,
/// `NEAR` are separators or plain words.
pub fn tokenize(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for_each_token(text, &mut String::new(), |t| out.push(t.to_owned()));
    out
}

/// `tokenize` without an allocation per token: `f` sees each token in `buf` (reused).
fn for_each_token(text: &str, buf: &mut String, mut f: impl FnMut(&str)) {
    buf.clear();
    let mut chars = 0usize;
    let emit = |buf: &mut String, chars: &mut usize, f: &mut dyn FnMut(&str)| {
        if !buf.is_empty() && !is_stopword(buf) {
            if buf.is_ascii() {
                stem_ascii(buf);
            }
            f(buf);
        }
        buf.clear();
        *chars = 0;
    };
    for c in text.chars() {
        if c.is_ascii() {
            // The common case, without the Unicode tables.
            if c.is_ascii_alphanumeric() {
                if chars < MAX_TOKEN_CHARS {
                    buf.push(c.to_ascii_lowercase());
                    chars += 1;
                }
            } else {
                emit(buf, &mut chars, &mut f);
            }
        } else if is_unspaced(c) {
            emit(buf, &mut chars, &mut f);
            let mut b = [0u8; 4];
            f(c.encode_utf8(&mut b));
        } else if c.is_alphanumeric() || is_mark(c) {
            if chars < MAX_TOKEN_CHARS {
                for l in c.to_lowercase() {
                    buf.push(l);
                }
                chars += 1;
            }
        } else {
            emit(buf, &mut chars, &mut f);
        }
    }
    emit(buf, &mut chars, &mut f);
}

/// Combining marks (Devanagari vowel signs, Arabic harakat, ...) belong to the word they
/// follow; `char::is_alphanumeric` says no to them, so they are matched by block here.
fn is_mark(c: char) -> bool {
    matches!(c as u32,
        0x0300..=0x036F | 0x0483..=0x0489 | 0x0591..=0x05C7 | 0x0610..=0x061A | 0x064B..=0x065F
        | 0x0670 | 0x06D6..=0x06ED | 0x0900..=0x0903 | 0x093A..=0x094F | 0x0951..=0x0957
        | 0x0962..=0x0963 | 0x0981..=0x0983 | 0x09BC..=0x09D7 | 0x0A01..=0x0A51 | 0x0A81..=0x0ACD
        | 0x0B01..=0x0B57 | 0x0B82..=0x0BD7 | 0x0C00..=0x0C56 | 0x0C81..=0x0CD6 | 0x0D00..=0x0D57
        | 0x0DCA..=0x0DDF | 0x1AB0..=0x1AFF | 0x1DC0..=0x1DFF | 0x20D0..=0x20FF | 0xFE20..=0xFE2F)
}

/// A small multiplicative hasher for term strings and (namespace, term) keys: SipHash's DoS
/// resistance buys nothing here and costs a third of an add. `finish` folds the high bits
/// down: a product's low bits depend only on its input's low bits, so without the fold
/// words differing past their first bytes ("m100001", "m100002") shared their low hash bits,
/// hence their buckets, and a million of them took 6 s to load (probe chains of memcmps).
#[derive(Default, Clone, Copy)]
struct FxHasher(u64);

impl FxHasher {
    #[inline]
    fn mix(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.mix(u64::from_le_bytes(c.try_into().unwrap()));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(b));
        }
    }
    fn write_u8(&mut self, v: u8) {
        self.mix(v as u64);
    }
    fn write_u32(&mut self, v: u32) {
        self.mix(v as u64);
    }
    fn write_u64(&mut self, v: u64) {
        self.mix(v);
    }
    fn write_usize(&mut self, v: usize) {
        self.mix(v as u64);
    }
    fn finish(&self) -> u64 {
        // An xor-shift, multiply, xor-shift finaliser (after MurmurHash3's fmix64, one round).
        let x = self.0 ^ (self.0 >> 32);
        let x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^ (x >> 29)
    }
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

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

/// Scores of the rows that match a query, rows ascending.
#[derive(Default, Debug, Clone)]
pub struct Matches {
    pub rows: Vec<u32>,
    pub scores: Vec<f32>,
    /// Query terms found in scope (0: no indexable word matched; fall back to vectors).
    pub terms: usize,
    /// The largest score any row could reach: sum over matched terms of idf * (k1 + 1).
    pub max_possible: f32,
}

/// What `score_top` returns: the best rows (best first), their scores, the scores of the
/// looked-up rows (0 where a row does not match or is not eligible), and as in `Matches`.
#[derive(Default, Debug, Clone)]
pub struct Top {
    pub rows: Vec<u32>,
    pub scores: Vec<f32>,
    pub looked: Vec<f32>,
    pub terms: usize,
    pub max_possible: f32,
    /// Rows whose score was computed (the work MaxScore saved is the rest of the matches).
    pub scored: usize,
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

/// Which rows a query may return.
#[derive(Clone, Copy)]
enum Eligible<'a> {
    Counted,
    CountedIn(u32),
    Mask(&'a [u8]),
}

/// A query's terms with their statistics in scope, in canonical (term id) order.
struct Query {
    terms: Vec<u32>,
    idf: Vec<f32>,
    avgdl: f32,
    max_possible: f32,
}

#[inline]
fn bm25(idf: f32, tf: u16, dl: u32, avgdl: f32, p: Bm25) -> f32 {
    let tf = tf as f32;
    idf * tf * (p.k1 + 1.0) / (tf + p.k1 * (1.0 - p.b + p.b * dl as f32 / avgdl))
}

/// First index >= `from` whose row is >= `target` (galloping: cheap for short hops, log for long).
#[inline]
fn seek(rows: &[u32], from: usize, target: u32) -> usize {
    if from >= rows.len() || rows[from] >= target {
        return from;
    }
    let mut lo = from;
    let mut step = 1;
    let mut hi = from + 1;
    while hi < rows.len() && rows[hi] < target {
        lo = hi;
        step *= 2;
        hi = from + step;
    }
    let hi = hi.min(rows.len());
    lo + 1 + rows[lo + 1..hi].partition_point(|&r| r < target)
}

/// Relative slack on score bounds: contributions are summed in a different order than their
/// bounds, so a bound is only trusted to prune when it is below the threshold by more than
/// rounding could explain.
const SLACK: f32 = 1e-5;

/// Max-heap entry whose greatest element is the worst held hit (lowest score, then highest row).
#[derive(Clone, Copy)]
struct Held(f32, u32);

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == std::cmp::Ordering::Equal
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        o.0.total_cmp(&self.0).then(self.1.cmp(&o.1))
    }
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

    fn ns_code(&mut self, name: &str) -> u32 {
        if let Some(&c) = self.ns_codes.get(name) {
            return c;
        }
        let c = self.ns_names.len() as u32;
        self.ns_codes.insert(name.to_owned(), c);
        self.ns_names.push(name.to_owned());
        self.ns_docs.push(0);
        self.ns_tokens.push(0);
        c
    }

    /// Index `texts` at `rows`, each in its namespace (`namespaces`: one name per text, or one
    /// for all). Rows must be new and increasing (above every indexed row), as vector rows
    /// are; otherwise a `Value` error and nothing is added. New documents are counted.
    pub fn add(&mut self, rows: &[u32], texts: &[&str], namespaces: &[&str]) -> Result<()> {
        if rows.len() != texts.len() {
            return Err(Error::Value(format!("{} rows for {} texts", rows.len(), texts.len())));
        }
        if namespaces.len() != texts.len() && !(namespaces.len() == 1 || texts.is_empty()) {
            return Err(Error::Value(format!("{} namespaces for {} texts", namespaces.len(), texts.len())));
        }
        let mut prev = self.doc_len.len() as i64 - 1;
        for &r in rows {
            if (r as i64) <= prev || r == u32::MAX {
                return Err(Error::Value(format!(
                    "row {r} is not above the highest indexed row ({prev}): rows are append-only"
                )));
            }
            prev = r as i64;
        }
        let mut buf = String::new();
        let mut ids: Vec<u32> = Vec::new();
        for (i, (&row, text)) in rows.iter().zip(texts).enumerate() {
            let ns = self.ns_code(namespaces[if namespaces.len() == 1 { 0 } else { i }]);
            ids.clear();
            let (terms, words, postings) = (&mut self.terms, &mut self.words, &mut self.postings);
            for_each_token(text, &mut buf, |t| {
                let id = match terms.get(t) {
                    Some(&id) => id,
                    None => {
                        let id = postings.len() as u32;
                        terms.insert(t.to_owned(), id);
                        words.push(t.to_owned());
                        postings.push(Postings::default());
                        id
                    }
                };
                ids.push(id);
            });
            let dl = ids.len() as u32;
            ids.sort_unstable();
            let ru = row as usize;
            // Rows skipped (no document) get empty forward lists.
            let off = *self.fwd_off.last().unwrap();
            self.fwd_off.resize(ru + 1, off);
            self.doc_len.resize(ru + 1, 0);
            self.doc_ns.resize(ru + 1, NO_DOC);
            self.counted.resize(ru + 1, false);
            self.max_tf.resize(self.postings.len(), 0);
            self.min_len.resize(self.postings.len(), u32::MAX);
            self.df_all.resize(self.postings.len(), 0);
            let mut j = 0;
            while j < ids.len() {
                let id = ids[j];
                let mut k = j + 1;
                while k < ids.len() && ids[k] == id {
                    k += 1;
                }
                let tf = (k - j).min(u16::MAX as usize) as u16;
                let p = &mut self.postings[id as usize];
                p.rows.push(row);
                p.tf.push(tf);
                let t = id as usize;
                self.max_tf[t] = self.max_tf[t].max(tf);
                self.min_len[t] = self.min_len[t].min(dl);
                self.fwd.push(id);
                self.n_postings += 1;
                j = k;
            }
            self.fwd_off.push(self.fwd.len() as u64);
            self.doc_len[ru] = dl;
            self.doc_ns[ru] = ns;
            self.count(ru, true);
        }
        self.changes += 1;
        Ok(())
    }

    /// Add (`on`) or take out a document's contribution to the statistics.
    fn count(&mut self, row: usize, on: bool) {
        let ns = self.doc_ns[row];
        if ns == NO_DOC || self.counted[row] == on {
            return;
        }
        self.counted[row] = on;
        let dl = self.doc_len[row] as u64;
        let (a, b) = (self.fwd_off[row] as usize, self.fwd_off[row + 1] as usize);
        let n = ns as usize;
        if on {
            self.docs += 1;
            self.tokens += dl;
            self.ns_docs[n] += 1;
            self.ns_tokens[n] += dl;
            for &t in &self.fwd[a..b] {
                self.df_all[t as usize] += 1;
                *self.ns_df.entry((ns as u64) << 32 | t as u64).or_insert(0) += 1;
            }
        } else {
            self.docs -= 1;
            self.tokens -= dl;
            self.ns_docs[n] -= 1;
            self.ns_tokens[n] -= dl;
            for &t in &self.fwd[a..b] {
                self.df_all[t as usize] -= 1;
                let key = (ns as u64) << 32 | t as u64;
                if let Some(v) = self.ns_df.get_mut(&key) {
                    *v -= 1;
                    if *v == 0 {
                        self.ns_df.remove(&key);
                    }
                }
            }
        }
    }

    /// Make the counted documents the rows set in `live` (the store's live rows): rows that
    /// died leave the statistics, rows that came back (a document still held) rejoin. Rows past
    /// `live` count as dead. `missing`: live rows below `len()` holding no document (their text
    /// was never indexed or was compacted away: the caller rebuilds).
    pub fn sync(&mut self, live: &[u8]) -> SyncReport {
        let mut rep = SyncReport::default();
        for r in 0..self.doc_len.len() {
            let want = in_mask(live, r);
            if self.doc_ns[r] == NO_DOC {
                rep.missing += want as usize;
            } else if self.counted[r] != want {
                self.count(r, want);
                if want {
                    rep.revived += 1;
                } else {
                    rep.died += 1;
                }
            }
        }
        if rep.died + rep.revived > 0 {
            self.changes += 1;
        }
        rep
    }

    /// (documents, tokens) in `scope`.
    pub fn stats(&self, scope: Scope) -> (u64, u64) {
        match scope {
            Scope::All => (self.docs, self.tokens),
            Scope::Namespace(ns) => match self.ns_codes.get(ns) {
                Some(&c) => (self.ns_docs[c as usize], self.ns_tokens[c as usize]),
                None => (0, 0),
            },
            Scope::Mask(m) => {
                let mut docs = 0u64;
                let mut tokens = 0u64;
                for (r, &l) in self.doc_len.iter().enumerate() {
                    if self.doc_ns[r] != NO_DOC && in_mask(m, r) {
                        docs += 1;
                        tokens += l as u64;
                    }
                }
                (docs, tokens)
            }
        }
    }

    fn df(&self, t: u32, scope: Scope) -> u32 {
        match scope {
            Scope::All => self.df_all[t as usize],
            Scope::Namespace(ns) => match self.ns_codes.get(ns) {
                Some(&c) => self.ns_df.get(&((c as u64) << 32 | t as u64)).copied().unwrap_or(0),
                None => 0,
            },
            Scope::Mask(m) => {
                let p = &self.postings[t as usize];
                p.rows.iter().filter(|&&r| self.doc_ns[r as usize] != NO_DOC && in_mask(m, r as usize)).count() as u32
            }
        }
    }

    /// The query's distinct known words with df > 0 in scope, canonical (term id) order.
    fn query(&self, text: &str, scope: Scope, p: Bm25) -> Option<Query> {
        let mut ids: Vec<u32> = Vec::new();
        for_each_token(text, &mut String::new(), |t| {
            if let Some(&id) = self.terms.get(t) {
                ids.push(id);
            }
        });
        ids.sort_unstable();
        ids.dedup();
        let (docs, tokens) = self.stats(scope);
        if ids.is_empty() || docs == 0 {
            return None;
        }
        let n = docs as f32;
        let mut q = Query { terms: Vec::new(), idf: Vec::new(), avgdl: (tokens as f32 / n).max(1e-6), max_possible: 0.0 };
        for t in ids {
            let df = self.df(t, scope);
            if df == 0 {
                continue;
            }
            let df = df as f32;
            // Lucene's idf: never negative, so a word in most documents still counts a little.
            let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
            q.max_possible += idf * (p.k1 + 1.0);
            q.terms.push(t);
            q.idf.push(idf);
        }
        Some(q)
    }

    fn eligible<'a>(&self, scope: Scope, eligible: Option<&'a [u8]>) -> Eligible<'a>
    where
        Self: 'a,
    {
        match (eligible, scope) {
            (Some(m), _) => Eligible::Mask(m),
            (None, Scope::All) => Eligible::Counted,
            (None, Scope::Namespace(ns)) => Eligible::CountedIn(self.ns_codes.get(ns).copied().unwrap_or(NO_DOC - 1)),
            (None, Scope::Mask(_)) => Eligible::Counted, // replaced by the caller (see score)
        }
    }

    #[inline]
    fn ok(&self, e: Eligible, row: u32) -> bool {
        let r = row as usize;
        match e {
            Eligible::Counted => self.counted[r],
            Eligible::CountedIn(ns) => self.counted[r] && self.doc_ns[r] == ns,
            Eligible::Mask(m) => in_mask(m, r),
        }
    }

    /// BM25 of every eligible row that shares a word with `query` (the exhaustive reference;
    /// `score_top` returns the same top rows and scores without scoring most of them). Term
    /// statistics come from `scope`; `eligible` (the caller's filters, inside the scope)
    /// restricts the rows returned, None = the scope's rows. Each distinct word counts once.
    pub fn score(&self, query: &str, scope: Scope, eligible: Option<&[u8]>, p: Bm25) -> Matches {
        let mut out = Matches::default();
        let Some(q) = self.query(query, scope, p) else { return out };
        out.terms = q.terms.len();
        out.max_possible = q.max_possible;
        let e = match (eligible, scope) {
            (None, Scope::Mask(m)) => Eligible::Mask(m),
            _ => self.eligible(scope, eligible),
        };
        let mut pairs: Vec<(u32, f32)> = Vec::new();
        for (i, &t) in q.terms.iter().enumerate() {
            let post = &self.postings[t as usize];
            for (&r, &tf) in post.rows.iter().zip(&post.tf) {
                if self.ok(e, r) {
                    pairs.push((r, bm25(q.idf[i], tf, self.doc_len[r as usize], q.avgdl, p)));
                }
            }
        }
        // Stable: a row's contributions stay in canonical term order, the order score_top sums.
        pairs.sort_by_key(|p| p.0);
        for (r, s) in pairs {
            if out.rows.last() == Some(&r) {
                *out.scores.last_mut().unwrap() += s;
            } else {
                out.rows.push(r);
                out.scores.push(s);
            }
        }
        out
    }

    /// The `top_n` best eligible rows for `query` (best first, ties by row) and the scores of
    /// the `lookup` rows, by MaxScore (module comment). Same statistics and eligibility as
    /// `score`, and the same scores bit for bit.
    pub fn score_top(&self, query: &str, scope: Scope, eligible: Option<&[u8]>, p: Bm25, top_n: usize,
                     lookup: &[u32]) -> Top {
        let mut out = Top::default();
        let Some(q) = self.query(query, scope, p) else {
            out.looked = vec![0.0; lookup.len()];
            return out;
        };
        out.terms = q.terms.len();
        out.max_possible = q.max_possible;
        let e = match (eligible, scope) {
            (None, Scope::Mask(m)) => Eligible::Mask(m),
            _ => self.eligible(scope, eligible),
        };
        let m = q.terms.len();
        let contrib_of = |i: usize, row: u32| -> f32 {
            let post = &self.postings[q.terms[i] as usize];
            match post.rows.binary_search(&row) {
                Ok(j) => bm25(q.idf[i], post.tf[j], self.doc_len[row as usize], q.avgdl, p),
                Err(_) => 0.0,
            }
        };
        out.looked = lookup
            .iter()
            .map(|&r| {
                if (r as usize) >= self.doc_len.len() || !self.ok(e, r) {
                    return 0.0;
                }
                let mut s = 0.0f32;
                for i in 0..m {
                    s += contrib_of(i, r);
                }
                s
            })
            .collect();
        if top_n == 0 || m == 0 {
            return out;
        }
        // Upper bound per term: its contribution at the largest tf in the shortest document.
        let ub: Vec<f32> = (0..m)
            .map(|i| {
                let t = q.terms[i] as usize;
                bm25(q.idf[i], self.max_tf[t], self.min_len[t], q.avgdl, p)
            })
            .collect();
        let mut order: Vec<usize> = (0..m).collect();
        order.sort_by(|&a, &b| ub[a].total_cmp(&ub[b]));
        // prefix[i]: the bound of a row matched only by order[..i].
        let mut prefix = vec![0.0f32; m + 1];
        for i in 0..m {
            prefix[i + 1] = prefix[i] + ub[order[i]];
        }
        let lists: Vec<&Postings> = order.iter().map(|&i| &self.postings[q.terms[i] as usize]).collect();
        let mut pos = vec![0usize; m];
        let mut contrib = vec![0.0f32; m];
        let mut heap: BinaryHeap<Held> = BinaryHeap::with_capacity(top_n + 1);
        let offer = |heap: &mut BinaryHeap<Held>, h: Held| {
            if heap.len() < top_n {
                heap.push(h);
            } else if h < *heap.peek().unwrap() {
                heap.pop();
                heap.push(h);
            }
        };
        // Seeds: the rows of the highest-bound (rarest) terms, scored in full first, so the
        // threshold starts near its final value instead of rising only as the walk below
        // meets good rows (with N = 50 that would score every frequent posting up to the 50th
        // good row). Any real rows give a valid threshold; the walk skips them.
        let budget = (4 * top_n).max(256);
        // (Whole lists, rarest first, until N rows are seeded; a prefix when one list is huge.)
        let mut seeds: Vec<u32> = Vec::new();
        for k in (0..m).rev() {
            if seeds.len() >= top_n.min(budget) {
                break;
            }
            let rows = &lists[k].rows;
            seeds.extend_from_slice(&rows[..rows.len().min(budget - seeds.len())]);
        }
        seeds.sort_unstable();
        seeds.dedup();
        for &r in &seeds {
            if self.ok(e, r) {
                out.scored += 1;
                let mut total = 0.0f32;
                for i in 0..m {
                    total += contrib_of(i, r);
                }
                offer(&mut heap, Held(total, r));
            }
        }
        let below = |bound: f32, theta: f32| bound * (1.0 + SLACK) < theta;
        let mut theta = f32::NEG_INFINITY; // the N-th held score once N are held
        let mut first_ess = 0; // order[first_ess..] are essential
        let raise = |heap: &BinaryHeap<Held>, theta: &mut f32, first_ess: &mut usize| {
            if heap.len() == top_n {
                *theta = heap.peek().unwrap().0;
                while *first_ess < m && below(prefix[*first_ess + 1], *theta) {
                    *first_ess += 1;
                }
            }
        };
        raise(&heap, &mut theta, &mut first_ess);
        let mut next_seed = 0;
        loop {
            let mut cand = u32::MAX;
            for k in first_ess..m {
                if let Some(&r) = lists[k].rows.get(pos[k]) {
                    cand = cand.min(r);
                }
            }
            if cand == u32::MAX {
                break;
            }
            while next_seed < seeds.len() && seeds[next_seed] < cand {
                next_seed += 1;
            }
            let seeded = seeds.get(next_seed) == Some(&cand);
            let eligible_row = !seeded && self.ok(e, cand);
            let mut s = 0.0f32;
            for k in first_ess..m {
                let l = lists[k];
                if l.rows.get(pos[k]) == Some(&cand) {
                    if eligible_row {
                        let c = bm25(q.idf[order[k]], l.tf[pos[k]], self.doc_len[cand as usize], q.avgdl, p);
                        contrib[order[k]] = c;
                        s += c;
                    }
                    pos[k] += 1;
                }
            }
            if !eligible_row {
                continue;
            }
            let mut pruned = false;
            for k in (0..first_ess).rev() {
                if below(s + prefix[k + 1], theta) {
                    pruned = true;
                    break;
                }
                let l = lists[k];
                pos[k] = seek(&l.rows, pos[k], cand);
                if l.rows.get(pos[k]) == Some(&cand) {
                    let c = bm25(q.idf[order[k]], l.tf[pos[k]], self.doc_len[cand as usize], q.avgdl, p);
                    contrib[order[k]] = c;
                    s += c;
                }
            }
            if !pruned {
                out.scored += 1;
                // Canonical order: the exhaustive path's sum, bit for bit.
                let mut total = 0.0f32;
                for c in &contrib {
                    total += c;
                }
                offer(&mut heap, Held(total, cand));
                raise(&heap, &mut theta, &mut first_ess);
            }
            contrib.iter_mut().for_each(|c| *c = 0.0);
        }
        let mut held = heap.into_vec();
        held.sort_unstable();
        out.rows = held.iter().map(|h| h.1).collect();
        out.scores = held.iter().map(|h| h.0).collect();
        out
    }

    /// Take dead rows out (as `sync(live)`), then drop the postings and forward lists of every
    /// row not counted; returns the postings removed.
    pub fn compact(&mut self, live: &[u8]) -> usize {
        self.sync(live);
        let before = self.n_postings;
        let mut total = 0;
        for p in &mut self.postings {
            let mut w = 0;
            for i in 0..p.rows.len() {
                if self.counted[p.rows[i] as usize] {
                    p.rows[w] = p.rows[i];
                    p.tf[w] = p.tf[i];
                    w += 1;
                }
            }
            p.rows.truncate(w);
            p.tf.truncate(w);
            p.rows.shrink_to_fit();
            p.tf.shrink_to_fit();
            total += w;
        }
        let mut fwd = Vec::with_capacity(total);
        let mut off = Vec::with_capacity(self.fwd_off.len());
        off.push(0u64);
        for r in 0..self.doc_len.len() {
            if self.counted[r] {
                fwd.extend_from_slice(&self.fwd[self.fwd_off[r] as usize..self.fwd_off[r + 1] as usize]);
            } else {
                self.doc_len[r] = 0;
                self.doc_ns[r] = NO_DOC;
            }
            off.push(fwd.len() as u64);
        }
        self.fwd = fwd;
        self.fwd_off = off;
        for (t, p) in self.postings.iter().enumerate() {
            self.max_tf[t] = p.tf.iter().copied().max().unwrap_or(0);
            self.min_len[t] = p.rows.iter().map(|&r| self.doc_len[r as usize]).min().unwrap_or(u32::MAX);
        }
        self.n_postings = total;
        if before != total {
            self.changes += 1;
        }
        before - total
    }
}

// -- the file: index/lexical.bin ------------------------------------------------------------
//
// Layout (little endian), followed by a checksum of everything before it:
// magic "CLAGLEX\0" | version u32 | rows u64 | namespaces u64 | terms u64 | postings u64
// | forward u64 | docs u64 | tokens u64 | ns_df entries u64
// | per namespace: len u32, utf-8 | ns_docs u64 x ns | ns_tokens u64 x ns
// | per term: len u32, utf-8 | max_tf u16 x terms | min_len u32 x terms | df_all u32 x terms
// | postings per term u64 x terms | posting rows u32 x postings | tf u16 x postings
// | doc_len u32 x rows | doc_ns u32 x rows | counted u8 x rows
// | fwd_off u64 x (rows + 1) | fwd u32 x forward | ns_df (key u64, count u32) x entries
// The statistics are stored rather than recounted so a load is a parse, not a pass over the
// postings with hash updates (a 1M-memory index loads in a fraction of a second).

/// The file format. Version 2: tokens are stemmed (`stem_ascii`); a version-1 file is
/// refused and the store rebuilds the index from the database.
pub const FORMAT: Format = Format { magic: *b"CLAGLEX\0", what: "lexical index", versions: &[(2, bytes::checksum)] };

fn corrupt(what: &str) -> Error {
    Error::Io(format!("corrupt lexical index: {what}"))
}

impl Lexical {
    /// The file image (layout above).
    pub fn encode(&self) -> Vec<u8> {
        let rows = self.doc_len.len();
        let words: usize = self.words.iter().map(|w| w.len() + 4).sum();
        let mut w = FORMAT.writer(128 + words + self.n_postings * 6 + rows * 17 + self.fwd.len() * 4
            + self.postings.len() * 18 + self.ns_df.len() * 12);
        let mut ns_df: Vec<(u64, u32)> = self.ns_df.iter().map(|(&k, &v)| (k, v)).collect();
        ns_df.sort_unstable();
        w.put_slice(&[rows as u64, self.ns_names.len() as u64, self.words.len() as u64, self.n_postings as u64,
                      self.fwd.len() as u64, self.docs, self.tokens, ns_df.len() as u64]);
        w.put_strings(&self.ns_names);
        w.put_slice(&self.ns_docs);
        w.put_slice(&self.ns_tokens);
        w.put_strings(&self.words);
        w.put_slice(&self.max_tf);
        w.put_slice(&self.min_len);
        w.put_slice(&self.df_all);
        for p in &self.postings {
            w.put(p.rows.len() as u64);
        }
        for p in &self.postings {
            w.put_slice(&p.rows);
        }
        for p in &self.postings {
            w.put_slice(&p.tf);
        }
        w.put_slice(&self.doc_len);
        w.put_slice(&self.doc_ns);
        for &c in &self.counted {
            w.put(c as u8);
        }
        w.put_slice(&self.fwd_off);
        w.put_slice(&self.fwd);
        for (k, v) in ns_df {
            w.put(k);
            w.put(v);
        }
        w.finish()
    }

    /// Parse a file image; every count, row, term and namespace is checked, so a damaged file
    /// is an `Io` error, never a panic or a wrong index.
    pub fn decode(b: &[u8]) -> Result<Lexical> {
        let (_, mut r) = FORMAT.open(b)?;
        let h = r.vec::<u64>(8)?;
        let (rows, n_ns, n_terms, n_post, n_fwd, docs, tokens, n_nsdf) = (h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]);
        if rows >= u32::MAX as u64 || n_ns >= NO_DOC as u64 || n_terms > u32::MAX as u64 {
            return Err(corrupt("sizes"));
        }
        let ns_names = r.strings(n_ns)?;
        let ns_docs = r.vec::<u64>(n_ns)?;
        let ns_tokens = r.vec::<u64>(n_ns)?;
        let words = r.strings(n_terms)?;
        let max_tf = r.vec::<u16>(n_terms)?;
        let min_len = r.vec::<u32>(n_terms)?;
        let df_all = r.vec::<u32>(n_terms)?;
        let lens = r.vec::<u64>(n_terms)?;
        if lens.iter().try_fold(0u64, |a, &l| a.checked_add(l)) != Some(n_post) {
            return Err(corrupt("postings count"));
        }
        let all_rows = r.vec::<u32>(n_post)?;
        let all_tf = r.vec::<u16>(n_post)?;
        let doc_len = r.vec::<u32>(rows)?;
        let doc_ns = r.vec::<u32>(rows)?;
        let counted: Vec<bool> = r.items(rows, 1)?.iter().map(|&c| c != 0).collect();
        let fwd_off = r.vec::<u64>(rows + 1)?;
        let fwd = r.vec::<u32>(n_fwd)?;
        let nsdf = r.items(n_nsdf, 12)?;
        r.end()?;
        let mut postings = Vec::with_capacity(lens.len());
        let mut at = 0usize;
        for &l in &lens {
            let (rs, ts) = (&all_rows[at..at + l as usize], &all_tf[at..at + l as usize]);
            at += l as usize;
            if rs.windows(2).any(|w| w[0] >= w[1]) || rs.last().is_some_and(|&x| x as u64 >= rows) {
                return Err(corrupt("posting rows out of order or past the rows covered"));
            }
            postings.push(Postings { rows: rs.to_vec(), tf: ts.to_vec() });
        }
        if doc_ns.iter().any(|&n| n != NO_DOC && n as u64 >= n_ns)
            || fwd_off.first() != Some(&0)
            || fwd_off.last() != Some(&n_fwd)
            || fwd_off.windows(2).any(|w| w[0] > w[1])
            || fwd.iter().any(|&t| t as u64 >= n_terms)
            || ns_docs.iter().sum::<u64>() != docs
            || ns_tokens.iter().sum::<u64>() != tokens
        {
            return Err(corrupt("row tables"));
        }
        let mut ix = Lexical { words, postings, max_tf, min_len, df_all, ns_names, ns_docs, ns_tokens, docs, tokens,
                               doc_len, doc_ns, counted, fwd_off, fwd, n_postings: n_post as usize, ..Default::default() };
        ix.terms.reserve(ix.words.len());
        for (i, w) in ix.words.iter().enumerate() {
            if ix.terms.insert(w.clone(), i as u32).is_some() {
                return Err(corrupt("a word listed twice"));
            }
        }
        for (i, n) in ix.ns_names.iter().enumerate() {
            if ix.ns_codes.insert(n.clone(), i as u32).is_some() {
                return Err(corrupt("a namespace listed twice"));
            }
        }
        ix.ns_df.reserve(n_nsdf as usize);
        for c in nsdf.chunks_exact(12) {
            let k = u64::from_le_bytes(c[..8].try_into().unwrap());
            if k >> 32 >= n_ns || (k & 0xFFFF_FFFF) >= n_terms {
                return Err(corrupt("namespace statistics"));
            }
            ix.ns_df.insert(k, u32::from_le_bytes(c[8..].try_into().unwrap()));
        }
        Ok(ix)
    }

    /// Atomically replace `path` with this index (temp file, fsync, rename, fsync directory):
    /// a crash leaves the old file or the new one.
    pub fn save(&self, path: &Path) -> Result<()> {
        files::write_atomic(path, &self.encode())
    }

    /// Load `path`; errors name the file.
    pub fn load(path: &Path) -> Result<Lexical> {
        files::read_decoded(path, Lexical::decode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hasher_spreads_words_that_differ_late() {
        // Words alike in their first bytes must not share low hash bits (hashbrown's bucket
        // index): 4,096 such words over 4,096 buckets fill most of them when the hash is
        // uniform (~2,590 expected); the hasher without its final fold filled 32.
        use std::hash::{BuildHasher, BuildHasherDefault};
        let build = BuildHasherDefault::<FxHasher>::default();
        let buckets: std::collections::HashSet<u64> =
            (100_000..104_096).map(|i| build.hash_one(format!("m{i}")) & 4095).collect();
        assert!(buckets.len() > 2_000, "{} buckets of 4096", buckets.len());
        let top: std::collections::HashSet<u64> =
            (100_000..104_096).map(|i| build.hash_one(format!("m{i}")) >> 57).collect();
        assert_eq!(top.len(), 128, "hashbrown's 7-bit tags are the top bits");
    }

    #[test]
    fn stopwords_sorted() {
        let mut s = STOPWORDS.to_vec();
        s.sort_unstable();
        assert_eq!(s, STOPWORDS);
    }

    #[test]
    fn tokenize_unicode_and_operators() {
        assert_eq!(tokenize("The CAT's \"NEAR\" dog-house AND *fish*"), ["cat", "near", "dog", "hous", "fish"]);
        assert_eq!(tokenize("hikes hiking hiked hike"), ["hik", "hik", "hik", "hik"]);
        assert_eq!(tokenize("parties boxes glass bus running stopped walls"),
                   ["party", "box", "glass", "bus", "run", "stop", "wall"]);
        assert_eq!(tokenize("free trees see café"), ["free", "tree", "see", "café"]);
        assert_eq!(tokenize("Ünïcode Straße ΑΘΗΝΑ"), ["ünïcode", "straße", "αθηνα"]);
        assert_eq!(tokenize("東京タワー"), ["東", "京", "タ", "ワ", "ー"]);
        assert_eq!(tokenize("हिन्दी"), ["हिन्दी"]);
        assert_eq!(tokenize("ab東cd"), ["ab", "東", "cd"]);
        assert!(tokenize("!!! 🎉 ... the").is_empty());
        let long = "x".repeat(1000);
        assert_eq!(tokenize(&long)[0].chars().count(), MAX_TOKEN_CHARS);
    }

    #[test]
    fn bm25_scope_and_eligible() {
        let mut ix = Lexical::new();
        ix.add(&[0, 1, 2, 3], &["red apple pie", "green apple", "red car", "blue sky"], &["a", "a", "b", "b"])
            .unwrap();
        assert!(ix.add(&[2], &["again"], &["a"]).is_err());
        assert_eq!(ix.stats(Scope::All), (4, 9));
        assert_eq!(ix.stats(Scope::Namespace("a")), (2, 5));
        assert_eq!(ix.stats(Scope::Namespace("zz")), (0, 0));
        let m = ix.score("apple red", Scope::All, None, Bm25::default());
        assert_eq!(m.rows, [0, 1, 2]);
        assert!(m.scores[0] > m.scores[1] && m.scores[0] > m.scores[2]);
        assert_eq!(m.terms, 2);
        // Namespace a only; row 2 ("red car") is in b.
        let m = ix.score("red", Scope::Namespace("a"), None, Bm25::default());
        assert_eq!(m.rows, [0]);
        let mask = [1u8, 1, 0, 0];
        let by_mask = ix.score("red", Scope::Mask(&mask), None, Bm25::default());
        assert_eq!((by_mask.rows, by_mask.scores), (m.rows, m.scores));
        let m = ix.score("the !!", Scope::All, None, Bm25::default());
        assert!(m.rows.is_empty() && m.terms == 0);
        let t = ix.score_top("apple red", Scope::Namespace("a"), None, Bm25::default(), 2, &[3, 1, 0]);
        assert_eq!(t.rows, [0, 1]);
        assert!(t.scores[0] >= t.scores[1] && t.terms == 2);
        assert_eq!(t.looked[0], 0.0);
        assert!(t.looked[1] > 0.0 && t.looked[2] == t.scores[0]);
        // Row 0 dies: statistics and results follow; compaction drops its postings.
        let rep = ix.sync(&[0, 1, 1, 1]);
        assert_eq!(rep, SyncReport { died: 1, revived: 0, missing: 0 });
        assert_eq!(ix.stats(Scope::Namespace("a")), (1, 2));
        assert!(ix.score("red", Scope::Namespace("a"), None, Bm25::default()).rows.is_empty());
        assert_eq!(ix.sync(&[1, 1, 1, 1]).revived, 1);
        assert_eq!(ix.compact(&[0, 1, 1, 1]), 3);
        assert_eq!(ix.score("red", Scope::All, None, Bm25::default()).rows, [2]);
        assert_eq!(ix.sync(&[1, 1, 1, 1]).missing, 1);
    }

    /// A tiny deterministic generator for the randomised tests (no dev-dependency).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Zipf-ish words: low ids are frequent.
    fn text(rng: &mut Rng, vocab: u64) -> String {
        let n = 1 + rng.below(12);
        (0..n)
            .map(|_| {
                let top = 1 + rng.below(vocab);
                format!("w{}", rng.below(top))
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Brute-force BM25 over the documents in `scope` (row -> (namespace, text)).
    fn reference(docs: &[(u32, usize, String)], live: &[bool], ns: Option<usize>, query: &str) -> Vec<(u32, f32)> {
        let p = Bm25::default();
        let scope: Vec<&(u32, usize, String)> =
            docs.iter().filter(|d| live[d.0 as usize] && ns.is_none_or(|n| d.1 == n)).collect();
        let toks: Vec<Vec<String>> = scope.iter().map(|d| tokenize(&d.2)).collect();
        let n = scope.len() as f64;
        if n == 0.0 {
            return vec![];
        }
        let avgdl = toks.iter().map(|t| t.len()).sum::<usize>() as f64 / n;
        let mut q = tokenize(query);
        q.sort();
        q.dedup();
        let mut out = Vec::new();
        for (d, t) in scope.iter().zip(&toks) {
            let mut s = 0.0f64;
            for w in &q {
                let tf = t.iter().filter(|x| *x == w).count() as f64;
                if tf > 0.0 {
                    let df = toks.iter().filter(|tt| tt.contains(w)).count() as f64;
                    let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
                    s += idf * tf * 2.2 / (tf + p.k1 as f64 * (1.0 - 0.75 + 0.75 * t.len() as f64 / avgdl));
                }
            }
            if s > 0.0 {
                out.push((d.0, s as f32));
            }
        }
        out
    }

    #[test]
    fn maxscore_equals_exhaustive_and_reference() {
        let mut rng = Rng(0x9E3779B97F4A7C15);
        for round in 0..30 {
            let vocab = 5 + rng.below(200);
            let mut ix = Lexical::new();
            let mut docs = Vec::new();
            let mut row = 0u32;
            for _ in 0..(50 + rng.below(600)) {
                row += 1 + rng.below(3) as u32; // gaps: rows without documents
                let ns = rng.below(3) as usize;
                let t = text(&mut rng, vocab);
                ix.add(&[row], &[t.as_str()], &[["a", "b", "c"][ns]]).unwrap();
                docs.push((row, ns, t));
            }
            let mut live = vec![false; row as usize + 1];
            for d in &docs {
                live[d.0 as usize] = rng.below(5) > 0;
            }
            let mask: Vec<u8> = live.iter().map(|&l| l as u8).collect();
            let rep = ix.sync(&mask);
            assert_eq!(rep.missing, 0);
            if round % 3 == 2 {
                ix.compact(&mask);
            }
            for _ in 0..30 {
                let query = text(&mut rng, vocab);
                let ns = rng.below(4) as usize;
                let scope = if ns == 3 { Scope::All } else { Scope::Namespace(["a", "b", "c"][ns]) };
                let full = ix.score(&query, scope, None, Bm25::default());
                let refr = reference(&docs, &live, if ns == 3 { None } else { Some(ns) }, &query);
                assert_eq!(full.rows, refr.iter().map(|r| r.0).collect::<Vec<_>>());
                for (s, r) in full.scores.iter().zip(&refr) {
                    assert!((s - r.1).abs() <= 1e-4 * r.1.max(1.0), "{s} vs {}", r.1);
                }
                let n = 1 + rng.below(20) as usize;
                let lookup: Vec<u32> = (0..5).map(|_| rng.below(row as u64 + 3) as u32).collect();
                let top = ix.score_top(&query, scope, None, Bm25::default(), n, &lookup);
                let mut want: Vec<(f32, u32)> = full.rows.iter().zip(&full.scores).map(|(&r, &s)| (s, r)).collect();
                want.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                want.truncate(n);
                assert_eq!(top.rows, want.iter().map(|w| w.1).collect::<Vec<_>>(), "query {query:?}");
                assert_eq!(top.scores, want.iter().map(|w| w.0).collect::<Vec<_>>());
                for (&r, &s) in lookup.iter().zip(&top.looked) {
                    let exp = full.rows.binary_search(&r).map_or(0.0, |i| full.scores[i]);
                    assert_eq!(s, exp);
                }
                // An eligible mask narrower than the scope (a kind filter) and a mask scope.
                let elig: Vec<u8> = mask.iter().map(|&l| l & (rng.below(2) as u8)).collect();
                let f2 = ix.score(&query, scope, Some(&elig), Bm25::default());
                let t2 = ix.score_top(&query, scope, Some(&elig), Bm25::default(), n, &[]);
                let mut w2: Vec<(f32, u32)> = f2.rows.iter().zip(&f2.scores).map(|(&r, &s)| (s, r)).collect();
                w2.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                w2.truncate(n);
                assert_eq!(t2.rows, w2.iter().map(|w| w.1).collect::<Vec<_>>());
                let f3 = ix.score(&query, Scope::Mask(&mask), None, Bm25::default());
                let f4 = ix.score(&query, Scope::All, None, Bm25::default());
                assert_eq!((f3.rows, f3.scores), (f4.rows, f4.scores));
            }
        }
    }

    #[test]
    fn maxscore_skips_frequent_words() {
        let mut ix = Lexical::new();
        let texts: Vec<String> =
            (0..20_000).map(|i| if i % 1000 == 7 { format!("common rare{i}") } else { format!("common filler{i}") }).collect();
        let rows: Vec<u32> = (0..20_000).collect();
        let t: Vec<&str> = texts.iter().map(String::as_str).collect();
        ix.add(&rows, &t, &["n"]).unwrap();
        let top = ix.score_top("common rare7 rare1007 rare2007", Scope::All, None, Bm25::default(), 3, &[]);
        assert_eq!(top.rows, [7, 1007, 2007]);
        assert!(top.scored < 100, "scored {} rows", top.scored);
    }

    #[test]
    fn file_round_trip_and_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lexical.bin");
        let mut ix = Lexical::new();
        ix.add(&[0, 2, 5], &["red apple", "green apple pie", "東京 red"], &["a", "b", "a"]).unwrap();
        ix.sync(&[1, 0, 0, 0, 0, 1]);
        ix.save(&path).unwrap();
        let back = Lexical::load(&path).unwrap();
        assert_eq!(back.encode(), ix.encode());
        assert_eq!(back.len(), 6);
        for q in ["apple", "red", "東", "pie"] {
            for s in [Scope::All, Scope::Namespace("a"), Scope::Namespace("b")] {
                let (x, y) = (ix.score(q, s, None, Bm25::default()), back.score(q, s, None, Bm25::default()));
                assert_eq!((x.rows, x.scores), (y.rows, y.scores));
            }
        }
        let good = std::fs::read(&path).unwrap();
        for at in [0, 9, 20, good.len() / 2, good.len() - 9, good.len() - 1] {
            let mut bad = good.clone();
            bad[at] ^= 0x40;
            assert!(Lexical::decode(&bad).is_err(), "flipped byte {at}");
        }
        for len in [0, 7, 40, good.len() / 2, good.len() - 1] {
            assert!(Lexical::decode(&good[..len]).is_err(), "truncated to {len}");
        }
        assert!(Lexical::load(&dir.path().join("missing.bin")).is_err());
    }

    #[test]
    fn a_file_written_before_still_loads() {
        // A version-2 file from the first encoder of this layout; never regenerate it.
        let old: &[u8] = include_bytes!("testdata/lexical_v2.bin");
        let mut want = Lexical::new();
        want.add(&[0, 2, 5, 6], &["red apple pie", "green apples", "東京 red hiking", "blue sky"], &["a", "b", "a", "b"])
            .unwrap();
        want.sync(&[1, 0, 0, 0, 0, 1, 1]);
        let got = Lexical::decode(old).unwrap();
        assert_eq!(got.encode(), old, "the layout is unchanged: the same index encodes to the same bytes");
        assert_eq!(want.encode(), old);
        assert_eq!((got.len(), got.n_terms(), got.n_postings()), (7, 9, 11));
        assert_eq!(got.stats(Scope::Namespace("a")), (2, 7));
        for q in ["apple", "red hike", "東", "sky blue"] {
            let (x, y) = (want.score(q, Scope::All, None, Bm25::default()), got.score(q, Scope::All, None, Bm25::default()));
            assert_eq!((x.rows, x.scores), (y.rows, y.scores));
        }
        let mut bad = old.to_vec();
        bad[old.len() / 2] ^= 1;
        assert!(Lexical::decode(&bad).is_err());
    }
}
