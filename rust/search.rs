//! Two-stage and flat search.
//!
//! Two-stage: stage 1 scores every centre (c x dim, contiguous) and keeps the top
//! `n_probe`; stage 2 scores the members of those clusters exactly, plus the PENDING rows
//! (appended but not yet assigned, so they stay findable). Primary lists are disjoint, so
//! only secondary entries need de-duplication: a secondary entry is skipped when the row's
//! primary cluster is probed too, or when an earlier-probed cluster also lists it. That
//! avoids a per-query "seen" bitmap over all rows.
//!
//! Flat: every committed row (used as baseline and as fallback when there are no centres).
//! A single flat query is split over row chunks in parallel; batches run one query per task.

use std::cell::OnceCell;
use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;

use crate::clusters::{is_slot, Clusters};
use crate::error::{Error, Result};
use crate::kernels::{self, Scored, TopK};
use crate::quant::{self, QueryCodes};

#[derive(Default)]
pub struct Params<'a> {
    pub k: usize,
    /// Clusters probed in stage 1: exactly this many, or at most this many when `adaptive`.
    pub n_probe: usize,
    /// Per-query probe count (see [`Adaptive`]); None = exactly `n_probe` clusters.
    pub adaptive: Option<Adaptive>,
    pub flat: bool,
    /// One byte per row, non-zero = eligible (numpy bool layout).
    pub mask: Option<&'a [u8]>,
    /// Per-row score multiplier.
    pub weights: Option<&'a [f32]>,
    /// Score exactly these rows (an exact search of a small filtered set): no stage 1, no
    /// scan of the other rows. `mask` and `weights` still apply.
    pub rows: Option<&'a [u32]>,
    /// The vectors of `rows`, contiguous (row i of this block is row `rows[i]`): a caller that
    /// searches the same rows again and again gathers them once, and each search then streams
    /// one block instead of reading rows scattered over the file.
    pub rows_vectors: Option<&'a [f32]>,
    /// A weight the search met that is negative, NaN or infinite: its row + 1 (0 = none).
    /// `search` fails with it when it returns (see [`Params::weigh`]).
    pub bad_weight: AtomicUsize,
}

impl Params<'_> {
    /// Row `r`'s score multiplier from `w`. Weights are checked where a search reads them: a
    /// bad one is noted for `search` to refuse, and scores 0 meanwhile. A pass over every
    /// row's weight per search read 4 MB at 1M rows and made a decayed store's search 8x
    /// slower (1.65 vs 0.21 ms).
    #[inline]
    fn weigh(&self, w: &[f32], r: usize) -> f32 {
        let x = w[r];
        if (0.0..=f32::MAX).contains(&x) {
            x
        } else {
            let _ = self.bad_weight.compare_exchange(0, r + 1, Ordering::Relaxed, Ordering::Relaxed);
            0.0
        }
    }
}

/// Adaptive probing: the clusters are ranked by centre score s_1 >= s_2 >= ... and probed in
/// that order, up to `n_probe` in all. Cluster i is probed while i <= `min_probe`, or
/// s_i >= s_1 - `gap`, or the clusters probed before it (with the pending rows) list fewer
/// than k rows, so the top-k can fill (a mask may still leave it short); the first cluster
/// meeting none of the three ends the probe.
///
/// Why a centre-score gap and not a bound on what a cluster can still hold: the exact bound
/// from a cluster's angular radius, cos(max(0, acos(q.c) - acos(r))), is far too loose in
/// 384 dimensions. On 200k blob vectors members sit ~50 degrees from their centre and an
/// unrelated centre ~85 degrees from the query, so the bound (~0.8) stays above the k-th score
/// (~0.55) for 98% of the clusters and prunes nothing. The gap, by contrast, separates the
/// query's own clusters (within 0.06 of the best for every query measured) from the rest
/// (0.5 below) there, while on conversation stores, whose centre scores lie close together,
/// it leaves the cap in charge. Measured in benches/bench_probe.py; see BENCHMARKS.md.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adaptive {
    pub min_probe: usize,
    pub gap: f32,
    /// Rows the probed lists must hold before the gap may end the probe; 0 = k. A caller
    /// that asks for a wide candidate pool (hybrid search: k = 50) but only needs k rows to
    /// be reachable sets it lower, so small clusters are not probed just to fill the pool.
    pub min_rows: usize,
}

/// Preallocated batch results (q x k, row-major) plus per-query counts.
pub struct Results {
    pub k: usize,
    pub ids: Vec<i64>,
    pub scores: Vec<f32>,
    pub clusters: Vec<i64>,
    pub counts: Vec<i64>,
    pub scanned: Vec<i64>,
    /// Cluster ids probed in stage 1 (q x n_probe, best first, -1 padding); width 0 for a
    /// flat search.
    pub probed: Vec<i64>,
    pub probe_width: usize,
}

impl Results {
    fn new(q: usize, k: usize, probe_width: usize) -> Self {
        Results {
            k,
            probed: vec![-1; q * probe_width],
            probe_width,
            ids: vec![-1; q * k],
            scores: vec![f32::NEG_INFINITY; q * k],
            clusters: vec![-1; q * k],
            counts: vec![0; q],
            scanned: vec![0; q],
        }
    }
}

/// Largest k per query, and largest q * k per call (the preallocated results are 20 bytes
/// per slot).
pub const MAX_K: usize = 1 << 24;
pub const MAX_RESULTS: usize = 1 << 28;

/// Rows per parallel task for a single flat query (~6 MB of rows at dim 384).
const FLAT_CHUNK: usize = 4096;

/// Validate parameters against the store size before any indexing.
pub fn check(params: &Params, n_rows: usize, dim: usize, queries: &[f32]) -> Result<()> {
    if params.k == 0 {
        return Err(Error::Value("k must be >= 1".into()));
    }
    // The result arrays are q x k; refuse sizes whose allocation would abort the process.
    let q = queries.len() / dim.max(1);
    if params.k > MAX_K || q.saturating_mul(params.k) > MAX_RESULTS {
        return Err(Error::Value(format!(
            "k={} for {q} queries is too large (at most {MAX_K} per query and {MAX_RESULTS} results per call)",
            params.k
        )));
    }
    if params.n_probe == 0 && !params.flat {
        return Err(Error::Value("n_probe must be >= 1".into()));
    }
    if let Some(a) = params.adaptive {
        if a.min_probe == 0 {
            return Err(Error::Value("min_probe must be >= 1".into()));
        }
        if !(a.gap.is_finite() && a.gap >= 0.0) {
            return Err(Error::Value(format!("probe_gap must be finite and >= 0, got {}", a.gap)));
        }
    }
    if dim == 0 || !queries.len().is_multiple_of(dim) {
        return Err(Error::Value(format!("queries must have {dim} columns")));
    }
    if let Some(rows) = params.rows {
        // max() vectorises; the search for the culprit runs only when there is one.
        if rows.iter().max().is_some_and(|&m| m as usize >= n_rows) {
            let bad = rows.iter().find(|&&r| r as usize >= n_rows).expect("a row past the end");
            return Err(Error::Value(format!("row {bad} is out of range for an index of {n_rows} rows")));
        }
    }
    if let Some(block) = params.rows_vectors {
        let n = params.rows.map(|r| r.len());
        if n.is_none() || Some(block.len()) != n.map(|n| n * dim) {
            return Err(Error::Value(format!(
                "rows_vectors must hold one {dim}-float vector per listed row ({} rows listed, {} floats given)",
                n.unwrap_or(0),
                block.len()
            )));
        }
    }
    if let Some(m) = params.mask {
        if m.len() != n_rows {
            return Err(Error::Value(format!("mask has {} entries but the index has {n_rows} rows", m.len())));
        }
    }
    if let Some(w) = params.weights {
        if w.len() != n_rows {
            return Err(Error::Value(format!("weights has {} entries but the index has {n_rows} rows", w.len())));
        }
    }
    Ok(())
}

/// Search `queries` (q x dim, already normalised) over `data` (the committed rows).
pub fn search(cl: &Clusters, data: &[f32], dim: usize, queries: &[f32], p: &Params) -> Result<Results> {
    let res = search_unchecked_weights(cl, data, dim, queries, p)?;
    match (p.bad_weight.load(Ordering::Relaxed), p.weights) {
        (0, _) | (_, None) => Ok(res),
        (r, Some(w)) => Err(Error::Value(format!("weights[{}] = {} is not a finite value >= 0", r - 1, w[r - 1]))),
    }
}

/// `search`, with the weights of the rows it scores noted in `p.bad_weight`, not refused.
fn search_unchecked_weights(cl: &Clusters, data: &[f32], dim: usize, queries: &[f32], p: &Params) -> Result<Results> {
    let n_rows = data.len() / dim.max(1);
    check(p, n_rows, dim, queries)?;
    if cl.n_rows() < n_rows {
        return Err(Error::Value("internal: cluster state does not cover every row".into()));
    }
    let q = queries.len() / dim;
    if let Some(rows) = p.rows {
        return Ok(listed_rows(cl, data, dim, queries, p, rows));
    }
    let use_flat = p.flat || !cl.slots().iter().any(|c| c.has_centre);
    let pw = if use_flat { 0 } else { p.n_probe.min(cl.len()) };
    let mut res = Results::new(q, p.k, pw);
    let one = |qi: usize, ids: &mut [i64], sc: &mut [f32], cs: &mut [i64], pr: &mut [i64]| -> (i64, i64) {
        let qv = &queries[qi * dim..(qi + 1) * dim];
        let (top, scanned) = if use_flat {
            flat_one(data, dim, qv, p, q == 1)
        } else {
            // The query's int8 codes, built once for stage 1 and stage 2 when either uses them.
            let codes = OnceCell::new();
            let probed = probe(cl, dim, qv, p.k, p.n_probe, p.adaptive, &codes);
            for (o, &s) in pr.iter_mut().zip(&probed) {
                *o = cl.id_of_slot(s);
            }
            two_stage_one(cl, data, dim, qv, p, &probed, &codes)
        };
        let best = top.into_sorted();
        for (j, s) in best.iter().enumerate() {
            ids[j] = s.id as i64;
            sc[j] = s.score;
            cs[j] = cl.id_of_slot(cl.primary_of[s.id as usize]);
        }
        (best.len() as i64, scanned as i64)
    };
    let k = p.k;
    let Results { ids, scores, clusters, counts, scanned, probed, .. } = &mut res;
    if use_flat && q > 1 {
        // Batched flat search: one pass over the rows for all queries (blocked GEMM).
        let tops = flat_batch(data, dim, queries, p);
        for (qi, (top, sc)) in tops.into_iter().enumerate() {
            let best = top.into_sorted();
            for (j, s) in best.iter().enumerate() {
                ids[qi * k + j] = s.id as i64;
                scores[qi * k + j] = s.score;
                clusters[qi * k + j] = cl.id_of_slot(cl.primary_of[s.id as usize]);
            }
            counts[qi] = best.len() as i64;
            scanned[qi] = sc as i64;
        }
        return Ok(res);
    }
    if q == 1 {
        let (c, s) = one(0, ids, scores, clusters, probed);
        counts[0] = c;
        scanned[0] = s;
    } else {
        // Width-0 probe rows (flat search) still need one chunk per query.
        let mut dummy = vec![0i64; if pw == 0 { q } else { 0 }];
        let (pr, pwc) = if pw == 0 { (&mut dummy[..], 1) } else { (&mut probed[..], pw) };
        ids.par_chunks_mut(k)
            .zip(scores.par_chunks_mut(k))
            .zip(clusters.par_chunks_mut(k))
            .zip(counts.par_iter_mut().zip(scanned.par_iter_mut()))
            .zip(pr.par_chunks_mut(pwc))
            .enumerate()
            .for_each(|(qi, ((((i, s), c), (cnt, scn)), prq))| {
                let prq = if pw == 0 { &mut prq[..0] } else { prq };
                let (a, b) = one(qi, i, s, c, prq);
                *cnt = a;
                *scn = b;
            });
    }
    Ok(res)
}

#[inline]
fn score_row(data: &[f32], dim: usize, q: &[f32], r: usize, p: &Params) -> Option<f32> {
    score_vector(&data[r * dim..(r + 1) * dim], q, r, p)
}

/// Row `r`'s score from its vector `v` (wherever it is held), under `p`'s mask and weights.
#[inline]
fn score_vector(v: &[f32], q: &[f32], r: usize, p: &Params) -> Option<f32> {
    if p.mask.is_some_and(|m| m[r] == 0) {
        return None;
    }
    let s = kernels::dot(q, v);
    Some(p.weights.map_or(s, |w| s * p.weigh(w, r)))
}

/// Exact search over the listed rows only (queries in parallel): a filter that leaves a few
/// hundred rows costs their dot products, not a pass over every row's mask.
fn listed_rows(cl: &Clusters, data: &[f32], dim: usize, queries: &[f32], p: &Params, rows: &[u32]) -> Results {
    let q = queries.len() / dim;
    let k = p.k;
    let mut res = Results::new(q, k, 0);
    let Results { ids, scores, clusters, counts, scanned, .. } = &mut res;
    let one = |qi: usize, i: &mut [i64], s: &mut [f32], c: &mut [i64], cnt: &mut i64, scn: &mut i64| {
        let qv = &queries[qi * dim..(qi + 1) * dim];
        let mut top = TopK::new(k);
        let n = match p.rows_vectors {
            Some(block) => {
                let mut n = 0;
                for (&r, v) in rows.iter().zip(block.chunks_exact(dim)) {
                    if let Some(s) = score_vector(v, qv, r as usize, p) {
                        top.push(s, r);
                        n += 1;
                    }
                }
                n
            }
            // Filtered rows are scattered over the file: prefetch ahead as stage 2 does.
            None => scan_list(data, dim, qv, p, rows, |_| true, &mut top),
        };
        let best = top.into_sorted();
        for (j, b) in best.iter().enumerate() {
            i[j] = b.id as i64;
            s[j] = b.score;
            c[j] = cl.id_of_slot(cl.primary_of[b.id as usize]);
        }
        *cnt = best.len() as i64;
        *scn = n as i64;
    };
    if q == 1 {
        // One query (the store's search()): no parallel iterator to set up for a single item.
        one(0, ids, scores, clusters, &mut counts[0], &mut scanned[0]);
    } else {
        ids.par_chunks_mut(k)
            .zip(scores.par_chunks_mut(k))
            .zip(clusters.par_chunks_mut(k))
            .zip(counts.par_iter_mut().zip(scanned.par_iter_mut()))
            .enumerate()
            .for_each(|(qi, (((i, s), c), (cnt, scn)))| one(qi, i, s, c, cnt, scn));
    }
    res
}

fn scan_range(data: &[f32], dim: usize, q: &[f32], p: &Params, lo: usize, hi: usize) -> (TopK, usize) {
    let mut top = TopK::new(p.k);
    let mut scanned = 0;
    for r in lo..hi {
        if let Some(s) = score_row(data, dim, q, r, p) {
            top.push(s, r as u32);
            scanned += 1;
        }
    }
    (top, scanned)
}

fn flat_one(data: &[f32], dim: usize, q: &[f32], p: &Params, parallel: bool) -> (TopK, usize) {
    let n = data.len() / dim;
    if !parallel || n <= 2 * FLAT_CHUNK {
        return scan_range(data, dim, q, p, 0, n);
    }
    let parts: Vec<(TopK, usize)> = (0..n.div_ceil(FLAT_CHUNK))
        .into_par_iter()
        .map(|c| scan_range(data, dim, q, p, c * FLAT_CHUNK, ((c + 1) * FLAT_CHUNK).min(n)))
        .collect();
    let mut top = TopK::new(p.k);
    let mut scanned = 0;
    for (t, s) in parts {
        top.merge(t);
        scanned += s;
    }
    (top, scanned)
}

/// Rows per block of the batched flat search: 1024 rows x 100 queries of scores is 400 KB.
const FLAT_BLOCK: usize = 1024;

/// Flat search for many queries at once: the queries are packed once, each block of rows is
/// multiplied against all of them, so the rows are read from memory once per batch instead
/// of once per query. Blocks run in parallel, each thread keeping its own top-k per query.
fn flat_batch(data: &[f32], dim: usize, queries: &[f32], p: &Params) -> Vec<(TopK, usize)> {
    let n = data.len() / dim;
    let q = queries.len() / dim;
    let prep = kernels::PreparedB::new(queries, dim);
    let fresh = || -> (Vec<TopK>, usize, Vec<f32>) { ((0..q).map(|_| TopK::new(p.k)).collect(), 0, Vec::new()) };
    let (tops, scanned, _) = (0..n.div_ceil(FLAT_BLOCK))
        .into_par_iter()
        .fold(fresh, |(mut tops, mut scanned, mut buf), b| {
            let lo = b * FLAT_BLOCK;
            let hi = ((b + 1) * FLAT_BLOCK).min(n);
            buf.resize((hi - lo) * q, 0.0);
            prep.gemm(&data[lo * dim..hi * dim], &mut buf);
            for r in lo..hi {
                if p.mask.is_some_and(|m| m[r] == 0) {
                    continue;
                }
                scanned += 1;
                let w = p.weights.map_or(1.0, |w| p.weigh(w, r));
                let row = &buf[(r - lo) * q..(r - lo + 1) * q];
                for (t, &s) in tops.iter_mut().zip(row) {
                    t.push(if p.weights.is_some() { s * w } else { s }, r as u32);
                }
            }
            (tops, scanned, buf)
        })
        .reduce(fresh, |(mut a, sa, buf), (b, sb, _)| {
            for (x, y) in a.iter_mut().zip(b) {
                x.merge(y);
            }
            (a, sa + sb, buf)
        });
    tops.into_iter().map(|t| (t, scanned)).collect()
}

/// Stage 1: the `n_probe` best slots for `q`, best first (slots without a centre are
/// skipped), cut short by the `adaptive` rule when given (`k`: the rows it must reach).
pub fn probe(
    cl: &Clusters,
    dim: usize,
    q: &[f32],
    k: usize,
    n_probe: usize,
    adaptive: Option<Adaptive>,
    codes: &OnceCell<QueryCodes>,
) -> Vec<u32> {
    if cl.len() >= CODED_MIN_CENTRES && quant::fast_kernel() {
        if let Some(v) = probe_coded(cl, dim, q, k, n_probe, adaptive, codes.get_or_init(|| QueryCodes::new(q))) {
            return v;
        }
    }
    probe_exact(cl, dim, q, k, n_probe, adaptive)
}

/// Stage 1 by f32 dot products with every centre.
fn probe_exact(cl: &Clusters, dim: usize, q: &[f32], k: usize, n_probe: usize, adaptive: Option<Adaptive>) -> Vec<u32> {
    let cm = cl.centre_matrix();
    let mut top = TopK::new(n_probe);
    for (s, c) in cl.slots().iter().enumerate() {
        if c.has_centre {
            top.push(kernels::dot(q, &cm[s * dim..(s + 1) * dim]), s as u32);
        }
    }
    let best = top.into_sorted();
    let keep = match walk(cl, &best, f32::NEG_INFINITY, k, n_probe, adaptive) {
        Walk::Keep(n) => n,
        Walk::Unsure => unreachable!("every score is confirmed against -inf"),
    };
    best.into_iter().take(keep).map(|s| s.id).collect()
}

/// Below this many clusters the f32 centres stay in L2 and the int8 pre-scan saves nothing.
const CODED_MIN_CENTRES: usize = 512;
/// Centres re-scored exactly after the int8 pre-scan (beyond `min_probe`): enough for the
/// adaptive rule to stop inside them on clustered data; a query that needs more falls back
/// to the exact scan.
const CODED_SHORTLIST: usize = 12;
const CODED_MARGIN: usize = 8;

enum Walk {
    /// Probe the first n of the ranked centres.
    Keep(usize),
    /// The ranking is not proven far enough to decide.
    Unsure,
}

/// The probe rule over `best` (exact scores, best first). A score above `unsure_below` is
/// proven to hold its rank; below it a centre outside `best` might outrank it, so the walk
/// decides only what holds whatever that centre is, else answers `Unsure`.
fn walk(cl: &Clusters, best: &[Scored], unsure_below: f32, k: usize, n_probe: usize, adaptive: Option<Adaptive>) -> Walk {
    let proven = |i: usize| best[i].score > unsure_below;
    let Some(a) = adaptive else {
        let n = n_probe.min(best.len());
        return if (0..n).all(proven) && (n == n_probe || unsure_below == f32::NEG_INFINITY) { Walk::Keep(n) } else { Walk::Unsure };
    };
    let Some(first) = best.first() else { return Walk::Keep(0) };
    if !proven(0) {
        return Walk::Unsure;
    }
    let floor = first.score - a.gap;
    let need = if a.min_rows > 0 { a.min_rows } else { k };
    // Rows stage 2 will score so far: the pending rows, then each probed list.
    let mut rows = cl.n_pending();
    for (i, s) in best.iter().enumerate().take(n_probe) {
        let stop = i >= a.min_probe && rows >= need;
        if !proven(i) {
            // The true i-th score is at most max(score, unsure_below): the walk stops here
            // for sure only when even that is below the floor.
            return if stop && s.score.max(unsure_below) < floor { Walk::Keep(i) } else { Walk::Unsure };
        }
        if stop && s.score < floor {
            return Walk::Keep(i);
        }
        let c = &cl.slots()[s.id as usize];
        rows += c.primary.len() + c.secondary.len();
    }
    let n = n_probe.min(best.len());
    if n < n_probe && unsure_below > f32::NEG_INFINITY {
        return Walk::Unsure; // centres outside `best` would have been probed next
    }
    Walk::Keep(n)
}

/// Stage 1 through the centres' int8 codes: approximate scores with error bounds, the
/// best by upper bound re-scored exactly, and the probe rule run over those as far as the
/// bounds prove their ranks. The result is the exact scan's (same scores, same order, same
/// stop), or None when the shortlist cannot prove it (the caller then scans exactly).
fn probe_coded(
    cl: &Clusters,
    dim: usize,
    q: &[f32],
    k: usize,
    n_probe: usize,
    adaptive: Option<Adaptive>,
    qc: &QueryCodes,
) -> Option<Vec<u32>> {
    // The centres the walk may need, plus a margin that pushes the unproven boundary below
    // the last of them (the cap-th and next centres are often within the bounds' width).
    let m = n_probe.min(adaptive.map_or(n_probe, |a| a.min_probe + CODED_SHORTLIST)) + CODED_MARGIN;
    let q_l1: f32 = q.iter().map(|x| x.abs()).sum();
    // The m + 1 best upper bounds: the (m + 1)-th bounds every centre left out.
    let mut by_upper = TopK::new(m + 1);
    let slots = cl.slots();
    cl.centre_codes().scan_bounded(qc, q_l1, |s| slots[s].has_centre, |s, approx, bound| {
        by_upper.push(approx + bound, s as u32);
    });
    let ranked = by_upper.into_sorted();
    let outside = if ranked.len() > m { ranked[m].score } else { f32::NEG_INFINITY };
    let cm = cl.centre_matrix();
    let mut best: Vec<Scored> = ranked
        .iter()
        .take(m)
        .map(|c| Scored { score: kernels::dot(q, &cm[c.id as usize * dim..(c.id as usize + 1) * dim]), id: c.id })
        .collect();
    best.sort_unstable(); // Scored orders best first
    match walk(cl, &best, outside, k, n_probe, adaptive) {
        Walk::Keep(n) => Some(best[..n].iter().map(|s| s.id).collect()),
        Walk::Unsure => None,
    }
}

/// How many rows ahead stage 2 prefetches. Member rows are scattered over the file, so
/// each one starts with a cache miss; asking for row i + 2 while scoring row i overlaps
/// those misses with the dot products.
const PREFETCH_AHEAD: usize = 2;

#[cfg(target_arch = "x86_64")]
const L1: i32 = std::arch::x86_64::_MM_HINT_T0;
#[cfg(target_arch = "x86_64")]
const L2: i32 = std::arch::x86_64::_MM_HINT_T1;
#[cfg(not(target_arch = "x86_64"))]
const L1: i32 = 0;
#[cfg(not(target_arch = "x86_64"))]
const L2: i32 = 0;

/// Ask for row `r` into the cache level `HINT` names (`_MM_HINT_T0`: L1, for the row scored
/// next; `_MM_HINT_T1`: L2, for many rows at once, which L1 would evict before use).
#[inline(always)]
fn prefetch_row<const HINT: i32>(data: &[f32], dim: usize, r: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::_mm_prefetch;
        let row = &data[r * dim..(r + 1) * dim];
        let mut off = 0;
        while off < dim {
            // SAFETY: prefetch is only a hint; the address lies inside `row`.
            unsafe { _mm_prefetch::<HINT>(row.as_ptr().add(off) as *const i8) };
            off += 16;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, dim, r);
}

/// Score every row of `list` that passes `keep`, prefetching ahead.
#[inline]
fn scan_list(
    data: &[f32],
    dim: usize,
    q: &[f32],
    p: &Params,
    list: &[u32],
    keep: impl Fn(u32) -> bool,
    top: &mut TopK,
) -> usize {
    let mut scanned = 0;
    for (i, &r) in list.iter().enumerate() {
        if let Some(&next) = list.get(i + PREFETCH_AHEAD) {
            prefetch_row::<L1>(data, dim, next as usize);
        }
        if !keep(r) {
            continue;
        }
        if let Some(v) = score_row(data, dim, q, r as usize, p) {
            top.push(v, r);
            scanned += 1;
        }
    }
    scanned
}

fn two_stage_one(
    cl: &Clusters,
    data: &[f32],
    dim: usize,
    q: &[f32],
    p: &Params,
    probed: &[u32],
    query_codes: &OnceCell<QueryCodes>,
) -> (TopK, usize) {
    let mut top = TopK::new(p.k);
    let mut scanned = 0usize;
    // Cached members are scored from their int8 codes into a shortlist that is re-scored
    // exactly at the end; everything else (secondary entries, pending rows, the uncached
    // path) is scored exactly straight away.
    // When the probed clusters hold few rows, re-scoring the shortlist would cost about as
    // much as scoring them all exactly, so small scans skip the codes.
    let depth = quant::rescore_depth(p.k);
    let primaries: usize = probed.iter().map(|&s| cl.slots()[s as usize].primary.len()).sum();
    let use_codes = cl.member_cache && primaries > 4 * depth;
    let mut shortlist = TopK::new(if use_codes { depth } else { 0 });
    let codes = if use_codes { Some(query_codes.get_or_init(|| QueryCodes::new(q))) } else { None };
    for (j, &s) in probed.iter().enumerate() {
        let c = &cl.slots()[s as usize];
        if let Some(qc) = codes {
            let block = c.member_codes(data, dim);
            let primary = &c.primary;
            block.scan(qc, |i, approx| {
                let r = primary[i];
                if p.mask.is_some_and(|m| m[r as usize] == 0) {
                    return;
                }
                shortlist.push(if let Some(w) = p.weights { approx * p.weigh(w, r as usize) } else { approx }, r);
                scanned += 1;
            });
        } else {
            scanned += scan_list(data, dim, q, p, &c.primary, |_| true, &mut top);
        }
        // Primary lists are disjoint; a secondary entry is a duplicate when the row's primary
        // cluster or an earlier-probed cluster also lists it.
        let dup = |r: u32| {
            let prim = cl.primary_of[r as usize];
            (is_slot(prim) && probed.contains(&prim)) || cl.sec.any_in(r, &probed[..j])
        };
        scanned += scan_list(data, dim, q, p, &c.secondary, |r| !dup(r), &mut top);
    }
    for r in cl.pending_rows() {
        if (r as usize) < data.len() / dim {
            if let Some(v) = score_row(data, dim, q, r as usize, p) {
                top.push(v, r);
                scanned += 1;
            }
        }
    }
    let shortlist = shortlist.into_sorted();
    // The shortlist's rows are scattered over the memory map and were not read yet: ask for
    // all of them into L2 first, so their misses overlap instead of coming one row at a time
    // (a cold cluster's re-scoring was most of a query's time).
    for s in &shortlist {
        prefetch_row::<L2>(data, dim, s.id as usize);
    }
    for s in shortlist {
        // The mask was applied when the row entered the shortlist.
        let exact = kernels::dot(q, &data[s.id as usize * dim..(s.id as usize + 1) * dim]);
        top.push(if let Some(w) = p.weights { exact * p.weigh(w, s.id as usize) } else { exact }, s.id);
    }
    (top, scanned)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kmeans::Rng;

    /// `n` random unit rows of `dim` (also used by the quant tests).
    pub(crate) fn data(n: usize, dim: usize, seed: u64) -> Vec<f32> {
        let mut rng = Rng::new(seed);
        let raw: Vec<f32> = (0..n * dim).map(|_| rng.next_f64() as f32 - 0.5).collect();
        kernels::normalized(&raw, dim, "t").unwrap()
    }

    fn brute(d: &[f32], dim: usize, q: &[f32], k: usize) -> Vec<u32> {
        let mut v: Vec<(f32, u32)> =
            d.chunks_exact(dim).enumerate().map(|(i, r)| (kernels::dot(q, r), i as u32)).collect();
        v.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        v.into_iter().take(k).map(|x| x.1).collect()
    }

    /// Unit rows around `blobs` random centres (noise norm about `spread`).
    fn blob_data(n: usize, blobs: usize, dim: usize, spread: f32, seed: u64) -> Vec<f32> {
        let centres = data(blobs, dim, seed);
        let noise = data(n, dim, seed + 1);
        // Row i belongs to blob i % blobs.
        let raw: Vec<f32> = (0..n * dim).map(|i| centres[((i / dim) % blobs) * dim + i % dim] + spread * noise[i]).collect();
        kernels::normalized(&raw, dim, "blobs").unwrap()
    }

    #[test]
    fn coded_probe_is_the_exact_probe() {
        if !quant::fast_kernel() {
            eprintln!("no SIMD int8 kernel here: probe() scans exactly, nothing to compare");
            return;
        }
        let (dim, n) = (64, 30_000);
        let mut proven = 0;
        let mut asked = 0;
        // Clustered data (the coded probe proves its ranking) and uniform data (centre scores
        // close together: it often cannot, and must then say so rather than guess).
        for (spread, seed) in [(0.6f32, 1u64), (0.0, 2)] {
            let d = if spread > 0.0 { blob_data(n, 700, dim, spread, seed) } else { data(n, dim, seed) };
            let mut cl = Clusters::new(dim);
            cl.grow_rows(n);
            cl.kmeans(600, None, 0, &d).unwrap();
            assert!(cl.len() >= CODED_MIN_CENTRES);
            let queries = if spread > 0.0 { blob_data(200, 700, dim, spread, seed + 10) } else { data(200, dim, seed + 10) };
            let rules = [
                None,
                Some(Adaptive { min_probe: 1, gap: 0.4, min_rows: 0 }),
                Some(Adaptive { min_probe: 1, gap: 0.05, min_rows: 0 }),
                Some(Adaptive { min_probe: 4, gap: 0.0, min_rows: 0 }),
                Some(Adaptive { min_probe: 1, gap: 0.0, min_rows: 500 }),
            ];
            for q in queries.chunks_exact(dim) {
                for (n_probe, rule) in [1usize, 4, 16, 64].iter().flat_map(|&np| rules.iter().map(move |r| (np, *r))) {
                    let want = probe_exact(&cl, dim, q, 10, n_probe, rule);
                    asked += 1;
                    if let Some(got) = probe_coded(&cl, dim, q, 10, n_probe, rule, &QueryCodes::new(q)) {
                        assert_eq!(got, want, "n_probe {n_probe} rule {rule:?}");
                        proven += 1;
                    }
                    assert_eq!(probe(&cl, dim, q, 10, n_probe, rule, &OnceCell::new()), want);
                }
            }
        }
        eprintln!("{proven} of {asked} probes proven from the codes");
        // Most probes are decided from the codes (else the pre-scan is only a cost).
        assert!(proven * 2 > asked, "{proven} of {asked} probes proven");
    }

    #[test]
    fn listed_rows_match_a_masked_flat_search() {
        let dim = 8;
        let mut rng = crate::kmeans::Rng::new(3);
        let data: Vec<f32> = (0..300 * dim).map(|_| rng.next_f64() as f32 - 0.5).collect();
        let data = kernels::normalized(&data, dim, "data").unwrap();
        let q = kernels::normalized(&data[5 * dim..7 * dim], dim, "q").unwrap();
        let rows: Vec<u32> = (0..300).filter(|r| r % 7 == 2).collect();
        let mut mask = vec![0u8; 300];
        rows.iter().for_each(|&r| mask[r as usize] = 1);
        let cl = Clusters::new(dim);
        let mut cl = cl;
        cl.grow_rows(300);
        let listed = Params { k: 5, n_probe: 1, flat: true, rows: Some(&rows), ..Default::default() };
        let masked = Params { k: 5, n_probe: 1, flat: true, mask: Some(&mask), ..Default::default() };
        let a = search(&cl, &data, dim, &q, &listed).unwrap();
        let b = search(&cl, &data, dim, &q, &masked).unwrap();
        assert_eq!(a.ids, b.ids);
        // dot products here, a blocked product there: equal to rounding
        assert!(a.scores.iter().zip(&b.scores).all(|(x, y)| (x - y).abs() < 1e-6));
        assert_eq!(a.scanned, vec![rows.len() as i64; 2]);
        let bad = [300u32];
        let oob = Params { k: 5, n_probe: 1, flat: true, rows: Some(&bad), ..Default::default() };
        assert!(search(&cl, &data, dim, &q, &oob).is_err());
        // The same rows from a gathered copy: the same answer.
        let block: Vec<f32> = rows.iter().flat_map(|&r| data[r as usize * dim..(r as usize + 1) * dim].to_vec()).collect();
        let gathered = Params { rows_vectors: Some(&block), bad_weight: Default::default(), ..listed };
        let c = search(&cl, &data, dim, &q, &gathered).unwrap();
        assert_eq!(c.ids, a.ids);
        assert_eq!(c.scores, a.scores);
        let short = Params { rows_vectors: Some(&block[dim..]), bad_weight: Default::default(), ..gathered };
        assert!(search(&cl, &data, dim, &q, &short).is_err());
        // One query runs without the parallel iterator: the same answer as its row of a batch.
        let single = search(&cl, &data, dim, &q[..dim], &gathered).unwrap();
        assert_eq!(single.ids, c.ids[..5].to_vec());
        assert_eq!(single.scores, c.scores[..5].to_vec());
        assert_eq!(single.scanned, vec![rows.len() as i64]);
        let mid = [1u32, 301, 2];
        match search(&cl, &data, dim, &q[..dim], &Params { rows: Some(&mid), ..oob }) {
            Err(e) => assert!(e.to_string().contains("row 301 is out of range"), "{e}"),
            Ok(_) => panic!("row 301 of 300 was accepted"),
        }
    }

    #[test]
    fn flat_equals_brute_force_and_pads() {
        let (dim, n) = (16, 20_000);
        let d = data(n, dim, 5);
        let q = data(3, dim, 9);
        let cl = {
            let mut c = Clusters::new(dim);
            c.grow_rows(n);
            c
        };
        let p = Params { k: 10, n_probe: 1, adaptive: None, flat: true, mask: None, weights: None, rows: None, rows_vectors: None, ..Default::default() };
        let r = search(&cl, &d, dim, &q, &p).unwrap();
        for qi in 0..3 {
            let want = brute(&d, dim, &q[qi * dim..(qi + 1) * dim], 10);
            let got: Vec<u32> = r.ids[qi * 10..(qi + 1) * 10].iter().map(|&x| x as u32).collect();
            assert_eq!(got, want);
            assert_eq!(r.scanned[qi], n as i64);
        }
        // Single query takes the parallel path; same answer.
        let r1 = search(&cl, &d, dim, &q[..dim], &p).unwrap();
        assert_eq!(&r1.ids[..], &r.ids[..10]);
        // k larger than the store.
        let small = &d[..5 * dim];
        let p = Params { k: 8, n_probe: 1, adaptive: None, flat: true, mask: None, weights: None, rows: None, rows_vectors: None, ..Default::default() };
        let r = search(&cl, small, dim, &q[..dim], &p).unwrap();
        assert_eq!(r.counts[0], 5);
        assert_eq!(r.ids[5..], [-1, -1, -1]);
    }

    #[test]
    fn two_stage_with_all_probes_equals_flat_and_dedups() {
        let (dim, n) = (8, 3000);
        let d = data(n, dim, 2);
        let mut cl = Clusters::new(dim);
        cl.grow_rows(n);
        let ids = cl.kmeans(10, Some(&(0..2900).collect::<Vec<i64>>()), 0, &d).unwrap();
        // Give every row a secondary membership too: results must not repeat a row.
        let rows: Vec<i64> = (0..2900).collect();
        let t: Vec<i64> = rows
            .iter()
            .flat_map(|&r| {
                let p = cl.cluster_of(r).unwrap();
                let s = ids[(ids.iter().position(|&x| x == p).unwrap() + 1) % ids.len()];
                [p, s]
            })
            .collect();
        cl.assign(&rows, &t, 2, &d).unwrap();
        let q = data(4, dim, 7);
        let mask: Vec<u8> = (0..n).map(|r| (r % 3 != 0) as u8).collect();
        let w: Vec<f32> = (0..n).map(|r| 0.5 + (r % 5) as f32 * 0.1).collect();
        let flat = Params { k: 20, n_probe: 1, adaptive: None, flat: true, mask: Some(&mask), weights: Some(&w), rows: None, rows_vectors: None, ..Default::default() };
        let all = Params { k: 20, n_probe: 10, adaptive: None, flat: false, mask: Some(&mask), weights: Some(&w), rows: None, rows_vectors: None, ..Default::default() };
        let a = search(&cl, &d, dim, &q, &flat).unwrap();
        let b = search(&cl, &d, dim, &q, &all).unwrap();
        assert_eq!(a.ids, b.ids);
        cl.member_cache = false;
        let c = search(&cl, &d, dim, &q, &all).unwrap();
        assert_eq!(c.ids, b.ids);
        assert_eq!(c.scores, b.scores);
        cl.member_cache = true;
        assert_eq!(b.scanned[0], mask.iter().filter(|&&m| m != 0).count() as i64);
        // Pending rows (2900..3000) are findable in two-stage mode with one probe.
        let one = Params { k: 1, n_probe: 1, adaptive: None, flat: false, mask: None, weights: None, rows: None, rows_vectors: None, ..Default::default() };
        let r = search(&cl, &d, dim, &d[2950 * dim..2951 * dim], &one).unwrap();
        assert_eq!(r.ids[0], 2950);
        assert_eq!(r.clusters[0], -1);
    }

    #[test]
    fn int8_shortlist_finds_the_exact_top_k() {
        // 384-d rows in 4 clusters: enough rows that stage 2 scans int8 codes; with every
        // cluster probed the result must equal the exact flat search.
        let (dim, n) = (384, 4000);
        let d = data(n, dim, 5);
        let mut cl = Clusters::new(dim);
        cl.grow_rows(n);
        cl.kmeans(4, None, 0, &d).unwrap();
        let q = data(8, dim, 9);
        let flat = Params { k: 10, n_probe: 1, adaptive: None, flat: true, mask: None, weights: None, rows: None, rows_vectors: None, ..Default::default() };
        let all = Params { k: 10, n_probe: 4, adaptive: None, flat: false, mask: None, weights: None, rows: None, rows_vectors: None, ..Default::default() };
        let a = search(&cl, &d, dim, &q, &flat).unwrap();
        let b = search(&cl, &d, dim, &q, &all).unwrap();
        assert!(cl.slots().iter().all(|c| c.cache.get().is_some()), "codes path not taken");
        assert_eq!(a.ids, b.ids);
        // Batched flat search sums in GEMM order, so scores agree to rounding only.
        assert!(a.scores.iter().zip(&b.scores).all(|(x, y)| (x - y).abs() < 1e-5));
    }

    /// 40 tight blobs of 50 rows, clustered into 40 clusters: (clusters, data, dim).
    fn blobs() -> (Clusters, Vec<f32>, usize) {
        let (dim, n, b) = (32, 2000, 40);
        let centres = data(b, dim, 11);
        let noise = data(n, dim, 12);
        let raw: Vec<f32> =
            (0..n * dim).map(|i| centres[(i / dim % b) * dim + i % dim] + 0.3 * noise[i]).collect();
        let d = kernels::normalized(&raw, dim, "t").unwrap();
        let mut cl = Clusters::new(dim);
        cl.grow_rows(n);
        cl.kmeans(b, None, 0, &d).unwrap();
        (cl, d, dim)
    }

    #[test]
    fn adaptive_with_the_cap_at_every_cluster_and_no_cut_equals_flat() {
        let (cl, d, dim) = blobs();
        let q = data(16, dim, 13);
        let all = cl.len();
        let flat = Params { k: 10, n_probe: 1, flat: true, ..Default::default() };
        let a = search(&cl, &d, dim, &q, &flat).unwrap();
        // A gap wider than any score difference: every cluster up to the cap.
        let wide = Some(Adaptive { min_probe: 1, gap: 2.0, min_rows: 0 });
        let p = Params { k: 10, n_probe: all, adaptive: wide, ..Default::default() };
        let b = search(&cl, &d, dim, &q, &p).unwrap();
        assert_eq!(a.ids, b.ids);
        assert!(b.probed.iter().all(|&c| c >= 0), "every cluster probed");
        // min_probe at the cap: also every cluster, whatever the gap.
        let p = Params { k: 10, n_probe: all, adaptive: Some(Adaptive { min_probe: all, gap: 0.0, min_rows: 0 }), ..Default::default() };
        let c = search(&cl, &d, dim, &q, &p).unwrap();
        assert_eq!(a.ids, c.ids);
        assert_eq!(c.scanned, vec![d.len() as i64 / dim as i64; 16]);
    }

    #[test]
    fn adaptive_probes_the_clusters_within_the_gap_in_order() {
        let (cl, d, dim) = blobs();
        // Queries near rows: their own blob is far ahead of the others.
        let q = d[..8 * dim].to_vec();
        for (gap, min) in [(0.0f32, 1usize), (0.05, 1), (0.3, 2), (2.0, 3)] {
            let p = Params { k: 10, n_probe: 8, adaptive: Some(Adaptive { min_probe: min, gap, min_rows: 0 }), ..Default::default() };
            let r = search(&cl, &d, dim, &q, &p).unwrap();
            let fixed = Params { k: 10, n_probe: 8, ..Default::default() };
            let f = search(&cl, &d, dim, &q, &fixed).unwrap();
            assert_eq!(r.probe_width, 8);
            for qi in 0..8 {
                let qv = &q[qi * dim..(qi + 1) * dim];
                let score = |id: i64| kernels::dot(qv, &cl.centre_matrix()[cl.slot(id).unwrap() * dim..][..dim]);
                let got: Vec<i64> = r.probed[qi * 8..(qi + 1) * 8].iter().copied().filter(|&c| c >= 0).collect();
                let order: &[i64] = &f.probed[qi * 8..(qi + 1) * 8];
                // A prefix of the fixed order: at least `min`, and exactly those within the gap.
                assert_eq!(&order[..got.len()], &got[..]);
                assert!(got.len() >= min);
                let best = score(order[0]);
                let want = order.iter().take_while(|&&c| score(c) >= best - gap).count().max(min);
                assert_eq!(got.len(), want, "gap {gap} min {min}");
                assert!(r.probed[qi * 8 + got.len()..(qi + 1) * 8].iter().all(|&c| c == -1));
            }
        }
        // No gap and min_probe 1, but k beyond one cluster's rows: probing goes on until the
        // probed lists hold k rows, and the top-k is full.
        let p = Params { k: 120, n_probe: 8, adaptive: Some(Adaptive { min_probe: 1, gap: 0.0, min_rows: 0 }), ..Default::default() };
        let r = search(&cl, &d, dim, &q, &p).unwrap();
        for qi in 0..8 {
            let got: Vec<i64> = r.probed[qi * 8..(qi + 1) * 8].iter().copied().filter(|&c| c >= 0).collect();
            let size = |c: i64| cl.cluster(c).unwrap().primary.len();
            let before: usize = got[..got.len() - 1].iter().map(|&c| size(c)).sum();
            assert!(before < 120 && before + size(*got.last().unwrap()) >= 120);
            assert_eq!(r.counts[qi], 120);
        }
        // A zero min_probe or a bad gap is an error.
        for a in [Adaptive { min_probe: 0, gap: 0.1, min_rows: 0 }, Adaptive { min_probe: 1, gap: f32::NAN, min_rows: 0 }, Adaptive { min_probe: 1, gap: -0.1, min_rows: 0 }] {
            let p = Params { k: 10, n_probe: 8, adaptive: Some(a), ..Default::default() };
            assert!(search(&cl, &d, dim, &q, &p).is_err());
        }
    }

    #[test]
    fn bad_params_are_errors() {
        let cl = Clusters::new(4);
        let q = [1.0, 0.0, 0.0, 0.0];
        let mk = |k, n_probe| Params { k, n_probe, adaptive: None, flat: false, mask: None, weights: None, rows: None, rows_vectors: None, ..Default::default() };
        assert!(search(&cl, &[], 4, &q, &mk(0, 1)).is_err());
        assert!(search(&cl, &[], 4, &q, &mk(1, 0)).is_err());
        let r = search(&cl, &[], 4, &q, &mk(3, 1)).unwrap();
        assert_eq!(r.counts, vec![0]);
        let w = [f32::NAN];
        let one = [1.0, 0.0, 0.0, 0.0];
        let mut c1 = Clusters::new(4);
        c1.grow_rows(1);
        let p = Params { k: 1, n_probe: 1, adaptive: None, flat: true, mask: None, weights: Some(&w), rows: None, rows_vectors: None, ..Default::default() };
        assert!(search(&c1, &one, 4, &q, &p).is_err());
    }

    #[test]
    fn a_bad_weight_fails_every_search_that_scores_its_row() {
        // Weights are checked where a search reads them (not in a pass over all of them):
        // every path that scores the row refuses; a probe that never reaches it answers.
        let dim = 16;
        let n = 2000;
        let d = data(n, dim, 3);
        let mut cl = Clusters::new(dim);
        cl.grow_rows(n);
        cl.kmeans(8, Some(&(0..n as i64).collect::<Vec<i64>>()), 0, &d).unwrap();
        let q = d[..dim].to_vec(); // row 0: its own cluster is probed first
        let home = cl.cluster_of(0).unwrap();
        let far = (0..n as i64).find(|&r| cl.cluster_of(r).unwrap() != home).unwrap() as usize;
        for (bad_row, value) in [(0usize, f32::NAN), (0, -1.0), (0, f32::INFINITY), (far, f32::NAN)] {
            let mut w = vec![1.0f32; n];
            w[bad_row] = value;
            let listed = [0u32, far as u32];
            for (name, p) in [
                ("flat", Params { k: 3, flat: true, weights: Some(&w), ..Default::default() }),
                ("flat batch", Params { k: 3, flat: true, weights: Some(&w), ..Default::default() }),
                ("every cluster", Params { k: 3, n_probe: 8, weights: Some(&w), ..Default::default() }),
                ("listed", Params { k: 3, n_probe: 1, rows: Some(&listed), weights: Some(&w), ..Default::default() }),
            ] {
                let qs = if name == "flat batch" { [q.clone(), q.clone()].concat() } else { q.clone() };
                let err = search(&cl, &d, dim, &qs, &p).err().unwrap_or_else(|| panic!("{name}: row {bad_row} = {value}"));
                assert!(err.to_string().contains(&format!("weights[{bad_row}]")), "{name}: {err}");
            }
        }
        let mut w = vec![1.0f32; n];
        w[far] = f32::NAN;
        let one = Params { k: 3, n_probe: 1, weights: Some(&w), ..Default::default() };
        let r = search(&cl, &d, dim, &q, &one).unwrap();
        assert_eq!(r.ids[0], 0);
        assert!(r.scanned[0] < n as i64);
    }
}
