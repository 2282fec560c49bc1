//! Top-N by MaxScore (see the `lexical` module comment): the best rows of a query without
//! scoring most of the rows that match it, equal to the exhaustive `score` bit for bit.

use std::collections::BinaryHeap;

use super::score::{bm25, Bm25, Eligible, Query};
use super::{Lexical, Postings, Scope};

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

/// Relative slack on score bounds: contributions are summed in a different order than their
/// bounds, so a bound is only trusted to prune when it is below the threshold by more than
/// rounding could explain.
const SLACK: f32 = 1e-5;

#[inline]
fn below(bound: f32, theta: f32) -> bool {
    bound * (1.0 + SLACK) < theta
}

/// Max-heap entry whose greatest element is the worst held hit (lowest score, then highest row).
#[derive(Clone, Copy)]
struct Hit(f32, u32);

impl PartialEq for Hit {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == std::cmp::Ordering::Equal
    }
}
impl Eq for Hit {}
impl PartialOrd for Hit {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Hit {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        o.0.total_cmp(&self.0).then(self.1.cmp(&o.1))
    }
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

/// A query's postings in ascending order of their term's score bound.
struct Lists<'a> {
    ix: &'a Lexical,
    q: &'a Query,
    e: Eligible<'a>,
    p: Bm25,
    /// lists[k] belongs to query term q.terms[order[k]].
    order: Vec<usize>,
    lists: Vec<&'a Postings>,
    /// prefix[k]: the bound of a row matched only by lists[..k].
    prefix: Vec<f32>,
}

/// The smallest row at the head of lists `from..` (u32::MAX once they are all read: no
/// posting holds that row, `add` refuses it).
#[inline(always)]
fn next_row(lists: &[&Postings], pos: &[usize], from: usize) -> u32 {
    let mut cand = u32::MAX;
    for k in from..lists.len() {
        if let Some(&r) = lists[k].rows.get(pos[k]) {
            cand = cand.min(r);
        }
    }
    cand
}

/// Hold `h` if it is among the `n` best so far (the heap's top is the worst held). A full heap
/// replaces its top in place and sifts it down once (`PeekMut`), rather than a pop and a push.
#[inline(always)]
fn offer(heap: &mut BinaryHeap<Hit>, n: usize, h: Hit) {
    if heap.len() < n {
        heap.push(h);
    } else if let Some(mut worst) = heap.peek_mut() {
        if h < *worst {
            *worst = h;
        }
    }
}

impl<'a> Lists<'a> {
    /// Sorted by each term's upper bound: its contribution at its largest tf in its shortest
    /// document.
    fn new(ix: &'a Lexical, q: &'a Query, e: Eligible<'a>, p: Bm25) -> Self {
        let m = q.terms.len();
        let ub: Vec<f32> = (0..m)
            .map(|i| {
                let t = q.terms[i] as usize;
                bm25(q.idf[i], ix.max_tf[t], ix.min_len[t], q.avgdl, p)
            })
            .collect();
        let mut order: Vec<usize> = (0..m).collect();
        order.sort_by(|&a, &b| ub[a].total_cmp(&ub[b]));
        let mut prefix = vec![0.0f32; m + 1];
        for i in 0..m {
            prefix[i + 1] = prefix[i] + ub[order[i]];
        }
        let lists = order.iter().map(|&i| &ix.postings[q.terms[i] as usize]).collect();
        Lists { ix, q, e, p, order, lists, prefix }
    }

    /// Seed rows: those of the highest-bound (rarest) terms, whole lists, rarest first, until N
    /// rows are seeded (a prefix when one list is huge); ascending. Scored in full first, they
    /// start the threshold near its final value instead of letting it rise only as the walk
    /// meets good rows (with N = 50 that would score every frequent posting up to the 50th
    /// good row). Any real rows give a valid threshold; the walk skips them.
    fn seeds(&self, top_n: usize) -> Vec<u32> {
        let budget = (4 * top_n).max(256);
        let mut seeds: Vec<u32> = Vec::new();
        for l in self.lists.iter().rev() {
            if seeds.len() >= top_n.min(budget) {
                break;
            }
            seeds.extend_from_slice(&l.rows[..l.rows.len().min(budget - seeds.len())]);
        }
        seeds.sort_unstable();
        seeds.dedup();
        seeds
    }

    /// Score the eligible `seeds` in full into `heap` (the `top_n` best held); returns the
    /// rows scored.
    fn hold_seeds(&self, seeds: &[u32], top_n: usize, heap: &mut BinaryHeap<Hit>) -> usize {
        let mut scored = 0;
        for &r in seeds {
            if self.ix.ok(self.e, r) {
                scored += 1;
                offer(heap, top_n, Hit(self.ix.row_score(self.q, self.p, r), r));
            }
        }
        scored
    }

    /// The `top_n` best eligible rows (a heap whose top is the worst held) and the rows scored
    /// in full: the seeds, then the essential lists' rows in order, each completed from the
    /// non-essential lists unless its bound falls below the N-th held score.
    ///
    /// The walk's state is local variables and its steps are inline blocks, and it is kept out
    /// of line: with its state in struct fields, its steps as methods, or inlined into
    /// `score_top`, the compiler spilled the lists' pointers inside the row loop, and a query
    /// executed 6-13% more instructions (callgrind, 200k documents, 4-word queries).
    #[inline(never)]
    fn walk(&self, seeds: &[u32], top_n: usize) -> (BinaryHeap<Hit>, usize) {
        let Lists { ix, q, e, p, ref order, ref lists, ref prefix } = *self;
        // The slices the row loop reads, as locals: read through `ix` and `q`, their pointers
        // were loaded again after every store into `contrib`.
        let (doc_len, idf, avgdl): (&[u32], &[f32], f32) = (&ix.doc_len, &q.idf, q.avgdl);
        let (counted, doc_ns): (&[bool], &[u32]) = (&ix.counted, &ix.doc_ns);
        let m = lists.len();
        let mut heap: BinaryHeap<Hit> = BinaryHeap::with_capacity(top_n + 1);
        let mut scored = self.hold_seeds(seeds, top_n, &mut heap);
        // Once N rows are held: theta is the N-th score, and lists[..first_ess], whose bounds
        // together cannot reach it, stop generating rows (they become non-essential).
        let mut theta = f32::NEG_INFINITY;
        let mut first_ess = 0;
        let raise = |heap: &BinaryHeap<Hit>, theta: &mut f32, first_ess: &mut usize| {
            if heap.len() == top_n {
                *theta = heap.peek().unwrap().0;
                while *first_ess < m && below(prefix[*first_ess + 1], *theta) {
                    *first_ess += 1;
                }
            }
        };
        raise(&heap, &mut theta, &mut first_ess);
        let mut pos = vec![0usize; m];
        let mut contrib = vec![0.0f32; m];
        let mut next_seed = 0;
        loop {
            let cand = next_row(lists, &pos, first_ess);
            if cand == u32::MAX {
                break;
            }
            while next_seed < seeds.len() && seeds[next_seed] < cand {
                next_seed += 1;
            }
            let eligible = seeds.get(next_seed) != Some(&cand) && e.allows(counted, doc_ns, cand);
            // The essential lists: step past the row, and when it counts, take their share.
            let mut s = 0.0f32;
            for k in first_ess..m {
                let l = lists[k];
                if l.rows.get(pos[k]) == Some(&cand) {
                    if eligible {
                        let c = bm25(idf[order[k]], l.tf[pos[k]], doc_len[cand as usize], avgdl, p);
                        contrib[order[k]] = c;
                        s += c;
                    }
                    pos[k] += 1;
                }
            }
            if !eligible {
                continue;
            }
            // The non-essential lists, highest bound first, looked up by galloping; the row is
            // dropped as soon as its bound falls below theta.
            let mut pruned = false;
            for k in (0..first_ess).rev() {
                if below(s + prefix[k + 1], theta) {
                    pruned = true;
                    break;
                }
                let l = lists[k];
                pos[k] = seek(&l.rows, pos[k], cand);
                if l.rows.get(pos[k]) == Some(&cand) {
                    let c = bm25(idf[order[k]], l.tf[pos[k]], doc_len[cand as usize], avgdl, p);
                    contrib[order[k]] = c;
                    s += c;
                }
            }
            if !pruned {
                scored += 1;
                // Canonical order: the exhaustive path's sum, bit for bit.
                let mut total = 0.0f32;
                for c in &contrib {
                    total += c;
                }
                offer(&mut heap, top_n, Hit(total, cand));
                raise(&heap, &mut theta, &mut first_ess);
            }
            contrib.iter_mut().for_each(|c| *c = 0.0);
        }
        (heap, scored)
    }
}

impl Lexical {
    /// The `top_n` best eligible rows for `query` (best first, ties by row) and the scores of
    /// the `lookup` rows, by MaxScore (module comment). Same statistics and eligibility as
    /// `score`, and the same scores bit for bit.
    pub fn score_top(&self, query: &str, scope: Scope, eligible: Option<&[u8]>, p: Bm25, top_n: usize,
                     lookup: &[u32]) -> Top {
        let mut out = Top::default();
        let Some((q, e)) = self.prepare(query, scope, eligible, p) else {
            out.looked = vec![0.0; lookup.len()];
            return out;
        };
        out.terms = q.terms.len();
        out.max_possible = q.max_possible;
        out.looked = lookup
            .iter()
            .map(|&r| if (r as usize) < self.doc_len.len() && self.ok(e, r) { self.row_score(&q, p, r) } else { 0.0 })
            .collect();
        if top_n == 0 || q.terms.is_empty() {
            return out;
        }
        let lists = Lists::new(self, &q, e, p);
        let seeds = lists.seeds(top_n);
        let (heap, scored) = lists.walk(&seeds, top_n);
        let mut held = heap.into_vec();
        held.sort_unstable();
        out.scored = scored;
        out.rows = held.iter().map(|h| h.1).collect();
        out.scores = held.iter().map(|h| h.0).collect();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lexical::tokenize;

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
}
