//! The lexical index: Unicode word postings with Okapi BM25 scoring, kept beside the vectors.
//!
//! Documents are vector rows (rows are append-only and never reused, so a row id is a stable
//! document id). The index itself is append-only: deleting, archiving or replacing a memory
//! only kills its row in the store's row table, and every query passes the live rows it may
//! count as a mask. Term statistics (document frequency, document count, average length) are
//! therefore computed over exactly the rows the caller says are in scope (one namespace's live
//! memories), so one namespace's writes never move another namespace's scores, and no
//! per-namespace counters have to be kept in step with deletes. `compact` drops the postings
//! of dead rows once they are a large share.
//!
//! Why postings here rather than SQLite FTS5: see BENCHMARKS.md ("Lexical index"): adds cost
//! a fraction of FTS5's, and the per-row scores come back as arrays that the cluster-aware
//! stage 1 aggregates per cluster.

use std::collections::HashMap;

use crate::error::{Error, Result};

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

/// Split `text` into lower-cased Unicode words (letters, digits and combining marks; anything
/// else separates), one token per character in unspaced scripts, stopwords dropped, tokens cut
/// to `MAX_TOKEN_CHARS`. Nothing in the text is ever an operator: quotes, `*`, `-`, `AND`,
/// `NEAR` are separators or plain words.
pub fn tokenize(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut cur_chars = 0usize;
    let flush = |cur: &mut String, cur_chars: &mut usize, out: &mut Vec<String>| {
        if !cur.is_empty() {
            if !is_stopword(cur) {
                out.push(std::mem::take(cur));
            } else {
                cur.clear();
            }
        }
        *cur_chars = 0;
    };
    for c in text.chars() {
        if is_unspaced(c) {
            flush(&mut cur, &mut cur_chars, &mut out);
            out.push(c.to_string());
        } else if c.is_alphanumeric() || is_mark(c) {
            if cur_chars < MAX_TOKEN_CHARS {
                for l in c.to_lowercase() {
                    cur.push(l);
                }
                cur_chars += 1;
            }
        } else {
            flush(&mut cur, &mut cur_chars, &mut out);
        }
    }
    flush(&mut cur, &mut cur_chars, &mut out);
    out
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

/// One term's postings: rows ascending (rows are appended in increasing order), with the
/// term's count in that row (saturating at u16::MAX).
#[derive(Default, Clone)]
struct Postings {
    rows: Vec<u32>,
    tf: Vec<u16>,
}

/// The append-only postings index. See the module comment for how deletes are handled.
#[derive(Default)]
pub struct Lexical {
    terms: HashMap<String, u32>,
    postings: Vec<Postings>,
    /// Tokens per row (0: no document at that row, or one with no indexable words).
    doc_len: Vec<u32>,
    n_postings: usize,
}

/// Scores of the rows that match a query, rows ascending.
#[derive(Default, Debug, Clone)]
pub struct Matches {
    pub rows: Vec<u32>,
    pub scores: Vec<f32>,
    /// Query terms found in the index (0: no indexable word matched; fall back to vectors).
    pub terms: usize,
    /// The largest score any row could reach: sum over matched terms of idf * (k1 + 1).
    pub max_possible: f32,
}

fn in_mask(mask: Option<&[u8]>, row: usize) -> bool {
    match mask {
        None => true,
        Some(m) => m.get(row).is_some_and(|&v| v != 0),
    }
}

impl Lexical {
    pub fn new() -> Self {
        Self::default()
    }

    /// Rows covered (one past the highest row indexed).
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

    /// Index `texts` at `rows`. Rows must be new and increasing (above every indexed row), as
    /// vector rows are; a row seen before is a `Value` error and nothing is added.
    pub fn add(&mut self, rows: &[u32], texts: &[&str]) -> Result<()> {
        if rows.len() != texts.len() {
            return Err(Error::Value(format!("{} rows for {} texts", rows.len(), texts.len())));
        }
        let mut prev = self.doc_len.len() as i64 - 1;
        for &r in rows {
            if (r as i64) <= prev {
                return Err(Error::Value(format!(
                    "row {r} is not above the highest indexed row ({prev}): rows are append-only"
                )));
            }
            prev = r as i64;
        }
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for (&row, text) in rows.iter().zip(texts) {
            let toks = tokenize(text);
            counts.clear();
            for t in &toks {
                let id = match self.terms.get(t.as_str()) {
                    Some(&id) => id,
                    None => {
                        let id = self.postings.len() as u32;
                        self.terms.insert(t.clone(), id);
                        self.postings.push(Postings::default());
                        id
                    }
                };
                *counts.entry(id).or_insert(0) += 1;
            }
            for (&id, &c) in &counts {
                let p = &mut self.postings[id as usize];
                p.rows.push(row);
                p.tf.push(c.min(u16::MAX as u32) as u16);
            }
            self.n_postings += counts.len();
            let row = row as usize;
            if self.doc_len.len() <= row {
                self.doc_len.resize(row + 1, 0);
            }
            self.doc_len[row] = toks.len() as u32;
        }
        Ok(())
    }

    /// (documents, tokens) over the rows in `mask` (all indexed rows when None).
    pub fn stats(&self, mask: Option<&[u8]>) -> (u64, u64) {
        let mut docs = 0u64;
        let mut tokens = 0u64;
        for (r, &l) in self.doc_len.iter().enumerate() {
            if in_mask(mask, r) {
                docs += 1;
                tokens += l as u64;
            }
        }
        (docs, tokens)
    }

    /// BM25 of every row in `eligible` that shares a word with `query`. Document frequencies
    /// count the rows in `scope` (the live rows whose statistics apply, e.g. one namespace);
    /// `docs` and `tokens` are `stats(scope)`. Each distinct query word counts once.
    pub fn score(
        &self,
        query: &str,
        scope: Option<&[u8]>,
        eligible: Option<&[u8]>,
        docs: u64,
        tokens: u64,
        p: Bm25,
    ) -> Matches {
        let mut qterms: Vec<u32> = tokenize(query).iter().filter_map(|t| self.terms.get(t.as_str()).copied()).collect();
        qterms.sort_unstable();
        qterms.dedup();
        let mut out = Matches::default();
        if qterms.is_empty() || docs == 0 {
            return out;
        }
        let n = docs as f32;
        let avgdl = (tokens as f32 / n).max(1e-6);
        // Per term: its postings in scope, then the weighted tf of those also eligible.
        let mut lists: Vec<(Vec<u32>, Vec<f32>)> = Vec::with_capacity(qterms.len());
        for &t in &qterms {
            let post = &self.postings[t as usize];
            let df = match scope {
                None => post.rows.len(),
                Some(_) => post.rows.iter().filter(|&&r| in_mask(scope, r as usize)).count(),
            };
            if df == 0 {
                continue;
            }
            // Lucene's idf: never negative, so a word in most documents still counts a little.
            let idf = (1.0 + (n - df as f32 + 0.5) / (df as f32 + 0.5)).ln();
            out.max_possible += idf * (p.k1 + 1.0);
            out.terms += 1;
            let mut rows = Vec::new();
            let mut sc = Vec::new();
            for (&r, &tf) in post.rows.iter().zip(&post.tf) {
                let ru = r as usize;
                // `eligible` (the caller's filters) lies inside `scope`; without it, the scope.
                if !in_mask(if eligible.is_some() { eligible } else { scope }, ru) {
                    continue;
                }
                let tf = tf as f32;
                let dl = self.doc_len[ru] as f32;
                rows.push(r);
                sc.push(idf * tf * (p.k1 + 1.0) / (tf + p.k1 * (1.0 - p.b + p.b * dl / avgdl)));
            }
            lists.push((rows, sc));
        }
        merge(lists, &mut out);
        out
    }

    /// `score`, then only what hybrid search needs: the `top_n` best rows (best first) and the
    /// scores of `lookup` rows (0 where a row does not match). Returns (top rows, top scores,
    /// lookup scores, terms, max_possible).
    #[allow(clippy::too_many_arguments)]
    pub fn score_top(
        &self,
        query: &str,
        scope: Option<&[u8]>,
        eligible: Option<&[u8]>,
        docs: u64,
        tokens: u64,
        p: Bm25,
        top_n: usize,
        lookup: &[u32],
    ) -> (Vec<u32>, Vec<f32>, Vec<f32>, usize, f32) {
        let m = self.score(query, scope, eligible, docs, tokens, p);
        let mut order: Vec<u32> = (0..m.rows.len() as u32).collect();
        let by_score = |a: &u32, b: &u32| {
            m.scores[*b as usize].total_cmp(&m.scores[*a as usize]).then(m.rows[*a as usize].cmp(&m.rows[*b as usize]))
        };
        if order.len() > top_n && top_n > 0 {
            order.select_nth_unstable_by(top_n - 1, by_score);
            order.truncate(top_n);
        }
        order.sort_unstable_by(by_score);
        let rows = order.iter().map(|&i| m.rows[i as usize]).collect();
        let scores = order.iter().map(|&i| m.scores[i as usize]).collect();
        let looked = lookup
            .iter()
            .map(|r| m.rows.binary_search(r).map_or(0.0, |i| m.scores[i]))
            .collect();
        (rows, scores, looked, m.terms, m.max_possible)
    }

    /// Drop the postings of rows outside `live`; returns the postings removed.
    pub fn compact(&mut self, live: &[u8]) -> usize {
        let before = self.n_postings;
        let mut total = 0;
        for p in &mut self.postings {
            let mut w = 0;
            for i in 0..p.rows.len() {
                if in_mask(Some(live), p.rows[i] as usize) {
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
        for (r, l) in self.doc_len.iter_mut().enumerate() {
            if !in_mask(Some(live), r) {
                *l = 0;
            }
        }
        self.n_postings = total;
        before - total
    }
}

/// Sum per-term (rows ascending, scores) lists into one list, rows ascending.
fn merge(mut lists: Vec<(Vec<u32>, Vec<f32>)>, out: &mut Matches) {
    lists.retain(|l| !l.0.is_empty());
    if lists.len() == 1 {
        let (r, s) = lists.pop().unwrap();
        out.rows = r;
        out.scores = s;
        return;
    }
    let total: usize = lists.iter().map(|l| l.0.len()).sum();
    let mut pairs: Vec<(u32, f32)> = Vec::with_capacity(total);
    for (r, s) in &lists {
        pairs.extend(r.iter().copied().zip(s.iter().copied()));
    }
    // Sorting the concatenation is simpler than a k-way merge and as fast for the few terms a
    // query has (measured in benches/bench_hybrid.py).
    pairs.sort_unstable_by_key(|p| p.0);
    out.rows.reserve(pairs.len());
    out.scores.reserve(pairs.len());
    for (r, s) in pairs {
        if out.rows.last() == Some(&r) {
            *out.scores.last_mut().unwrap() += s;
        } else {
            out.rows.push(r);
            out.scores.push(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stopwords_sorted() {
        let mut s = STOPWORDS.to_vec();
        s.sort_unstable();
        assert_eq!(s, STOPWORDS);
    }

    #[test]
    fn tokenize_unicode_and_operators() {
        assert_eq!(tokenize("The CAT's \"NEAR\" dog-house AND *fish*"), ["cat", "near", "dog", "house", "fish"]);
        assert_eq!(tokenize("Ünïcode Straße ΑΘΗΝΑ"), ["ünïcode", "straße", "αθηνα"]);
        assert_eq!(tokenize("東京タワー"), ["東", "京", "タ", "ワ", "ー"]);
        assert_eq!(tokenize("हिन्दी"), ["हिन्दी"]);
        assert!(tokenize("!!! 🎉 ... the").is_empty());
        let long = "x".repeat(1000);
        assert_eq!(tokenize(&long)[0].chars().count(), MAX_TOKEN_CHARS);
    }

    #[test]
    fn bm25_scope_and_eligible() {
        let mut ix = Lexical::new();
        ix.add(&[0, 1, 2, 3], &["red apple pie", "green apple", "red car", "blue sky"]).unwrap();
        assert!(ix.add(&[2], &["again"]).is_err());
        let (d, t) = ix.stats(None);
        assert_eq!((d, t), (4, 9));
        let m = ix.score("apple red", None, None, d, t, Bm25::default());
        assert_eq!(m.rows, [0, 1, 2]);
        assert!(m.scores[0] > m.scores[1] && m.scores[0] > m.scores[2]);
        assert_eq!(m.terms, 2);
        // Scope: rows 0 and 1 only; row 2 is eligible but out of scope.
        let scope = [1u8, 1, 0, 0];
        let (d, t) = ix.stats(Some(&scope));
        let m = ix.score("red", Some(&scope), Some(&scope), d, t, Bm25::default());
        assert_eq!(m.rows, [0]);
        let m = ix.score("the !!", None, None, 4, 9, Bm25::default());
        assert!(m.rows.is_empty() && m.terms == 0);
        let (top, sc, looked, terms, _) =
            ix.score_top("apple red", None, None, d, t, Bm25::default(), 2, &[3, 1, 0]);
        assert_eq!(top, [0, 1]);
        assert!(sc[0] >= sc[1] && terms == 2);
        assert_eq!(looked[0], 0.0);
        assert!(looked[1] > 0.0 && looked[2] == sc[0]);
        assert_eq!(ix.compact(&scope), 4);
        let m = ix.score("red", None, None, 4, 9, Bm25::default());
        assert_eq!(m.rows, [0]);
    }
}
