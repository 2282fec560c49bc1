//! Okapi BM25: a query's terms and their statistics in scope, which rows it may return, and
//! the exhaustive scorer (`score`), the reference the pruned top-N (`maxscore`) must equal.

use super::tokenize::for_each_token;
use super::{in_mask, Lexical, Scope, NO_DOC};

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

/// Which rows a query may return.
#[derive(Clone, Copy)]
pub(super) enum Eligible<'a> {
    Counted,
    CountedIn(u32),
    Mask(&'a [u8]),
}

impl Eligible<'_> {
    /// Whether `row` may be returned, given which rows are counted and their namespaces.
    #[inline]
    pub(super) fn allows(self, counted: &[bool], doc_ns: &[u32], row: u32) -> bool {
        let r = row as usize;
        match self {
            Eligible::Counted => counted[r],
            Eligible::CountedIn(ns) => counted[r] && doc_ns[r] == ns,
            Eligible::Mask(m) => in_mask(m, r),
        }
    }
}

/// A query's terms with their statistics in scope, in canonical (term id) order.
pub(super) struct Query {
    pub terms: Vec<u32>,
    pub idf: Vec<f32>,
    pub avgdl: f32,
    pub max_possible: f32,
}

/// One term's contribution to a row's score.
#[inline]
pub(super) fn bm25(idf: f32, tf: u16, dl: u32, avgdl: f32, p: Bm25) -> f32 {
    let tf = tf as f32;
    idf * tf * (p.k1 + 1.0) / (tf + p.k1 * (1.0 - p.b + p.b * dl as f32 / avgdl))
}

impl Lexical {
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

    /// The rows a query may return: the caller's mask when given, else the scope's rows.
    fn eligible<'a>(&self, scope: Scope<'a>, eligible: Option<&'a [u8]>) -> Eligible<'a> {
        match (eligible, scope) {
            (Some(m), _) => Eligible::Mask(m),
            (None, Scope::All) => Eligible::Counted,
            (None, Scope::Namespace(ns)) => Eligible::CountedIn(self.ns_codes.get(ns).copied().unwrap_or(NO_DOC - 1)),
            (None, Scope::Mask(m)) => Eligible::Mask(m),
        }
    }

    /// The query's terms in `scope` and the rows it may return; None when no term is there.
    pub(super) fn prepare<'a>(&self, text: &str, scope: Scope<'a>, eligible: Option<&'a [u8]>, p: Bm25)
                              -> Option<(Query, Eligible<'a>)> {
        Some((self.query(text, scope, p)?, self.eligible(scope, eligible)))
    }

    #[inline]
    pub(super) fn ok(&self, e: Eligible, row: u32) -> bool {
        e.allows(&self.counted, &self.doc_ns, row)
    }

    /// BM25 of one row (eligible or not), each term looked up in its postings, summed in
    /// canonical term order.
    #[inline]
    pub(super) fn row_score(&self, q: &Query, p: Bm25, row: u32) -> f32 {
        let mut s = 0.0f32;
        for (&t, &idf) in q.terms.iter().zip(&q.idf) {
            let post = &self.postings[t as usize];
            if let Ok(j) = post.rows.binary_search(&row) {
                s += bm25(idf, post.tf[j], self.doc_len[row as usize], q.avgdl, p);
            }
        }
        s
    }

    /// BM25 of every eligible row that shares a word with `query` (the exhaustive reference;
    /// `score_top` returns the same top rows and scores without scoring most of them). Term
    /// statistics come from `scope`; `eligible` (the caller's filters, inside the scope)
    /// restricts the rows returned, None = the scope's rows. Each distinct word counts once.
    pub fn score(&self, query: &str, scope: Scope, eligible: Option<&[u8]>, p: Bm25) -> Matches {
        let mut out = Matches::default();
        let Some((q, e)) = self.prepare(query, scope, eligible, p) else { return out };
        out.terms = q.terms.len();
        out.max_possible = q.max_possible;
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lexical::SyncReport;

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
}
