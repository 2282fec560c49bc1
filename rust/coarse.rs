//! Routing against many clusters: the top-k centres of each row through a coarse layer.
//!
//! Exact routing scores every row against every centre, so ingest slows down as the store
//! grows its cluster count (at 1M memories, ~2,900 clusters, routing was a third of
//! `add_many`). Past `COARSE_MIN` centres the centres are grouped (spherical k-means of the
//! centres into about sqrt(c) groups, rebuilt when the centre count has drifted by a quarter);
//! each row scores the group centroids, then only the centres of its `probes` best groups, as
//! in an IVF index over centres. Group membership is recomputed on every call (c x groups, a
//! few ms), so centres that moved or were added since the build are filed correctly; only the
//! group centroids are cached. The work per row falls from c to about
//! `sqrt(c) + probes * sqrt(c)` dot products; the cost is that a row whose best centre lies in
//! a group it did not probe gets the best centre of the groups it did (measured agreement of
//! the top-1 with exact routing: `coarse_matches_exact_on_clustered_data` and
//! benches/bench_ingest.py).
//!
//! On a CPU with AVX-512 VNNI the probed centres are first scored from their int8 codes (the
//! ones stage 1 of the search keeps, `quant::CentreCodes`); each group's best k by those
//! scores are then scored exactly in f32 (`route_coded`): 13.5-14.0 against 16.5 ms of CPU
//! for `coarse_timing`'s 1,024 rows, isotropic or around blobs (BENCHMARKS.md, twentieth
//! session).

use std::sync::Mutex;

use rayon::prelude::*;

use crate::kernels::{self, PreparedB};
use crate::kmeans::{self, KMeansConfig};
use crate::quant::{self, CentreCodes, QuantBlock, QueryCodes};

/// Below this many centres routing is exact (the product is cheap and exactness free).
pub const COARSE_MIN: usize = 1024;

/// Group centroids, built from the centres present at build time.
pub struct Coarse {
    centroids: Vec<f32>,
    built_for: usize,
    /// Group of every slot (-1: none) and the calls since the last full refiling.
    filing: Mutex<(Vec<i64>, usize)>,
}

/// Calls between two full refilings of every centre; in between only new slots are filed.
/// Centres drift slowly (a running mean), so a filing a few calls old is nearly exact, and
/// filing every centre on every call cost a quarter of the routing work for 1,024 rows.
const REFILE_EVERY: usize = 8;

/// Groups each centre is filed under: its best two, so a centre on the border between two
/// groups is found from either side (the usual remedy for IVF border misses; it doubles the
/// centres scored per probe).
const FILE_WIDTH: usize = 2;

/// Rows of a group scored per product in `top_centres` (64 rows x ~100 centres: a 25 KB block).
const GROUP_CHUNK: usize = 64;

impl Coarse {
    /// Group the valid rows of `centres` (slots x dim). None when there are too few.
    pub fn build(centres: &[f32], valid: &[bool], dim: usize) -> Option<Coarse> {
        let ids: Vec<u32> = (0..valid.len() as u32).filter(|&s| valid[s as usize]).collect();
        let c = ids.len();
        if c < COARSE_MIN {
            return None;
        }
        let groups = (c as f64).sqrt().round() as usize;
        let cfg = KMeansConfig { max_iter: 10, sample_per_centre: 64, seed_per_centre: 8, full_passes: 1, settled_per_mille: 1 };
        let km = kmeans::fit(centres, &ids, dim, groups, 0x5eed, &cfg).ok()?;
        Some(Coarse { centroids: km.centres, built_for: c, filing: Mutex::new((Vec::new(), 0)) })
    }

    /// Still a fair grouping for `c` centres (within a quarter of the count it was built for).
    pub fn fits(&self, c: usize) -> bool {
        4 * c >= 3 * self.built_for && 4 * c <= 5 * self.built_for
    }

    pub fn groups(&self, dim: usize) -> usize {
        self.centroids.len() / dim
    }

    /// Slot lists per group for the valid slots of `centres`: slots never filed are filed
    /// now, and every slot again each `REFILE_EVERY` calls.
    fn file(&self, centres: &[f32], valid: &[bool], dim: usize) -> Vec<Vec<u32>> {
        let mut guard = self.filing.lock().unwrap_or_else(|e| e.into_inner());
        let (group_of, calls) = &mut *guard;
        let slots = valid.len();
        let w = FILE_WIDTH.min(self.groups(dim));
        let filed = group_of.len() / w;
        let from = if *calls % REFILE_EVERY == 0 || filed > slots { 0 } else { filed };
        *calls += 1;
        group_of.resize(slots * w, -1);
        if from < slots {
            let rows = &centres[from * dim..slots * dim];
            let mut sc = vec![0.0f32; (slots - from) * w];
            kernels::top_centres(rows, &self.centroids, dim, w, None, &mut group_of[from * w..], &mut sc);
        }
        let mut members: Vec<Vec<u32>> = vec![Vec::new(); self.groups(dim)];
        for (i, &grp) in group_of.iter().enumerate() {
            if valid[i / w] && grp >= 0 {
                members[grp as usize].push((i / w) as u32);
            }
        }
        members
    }
}

/// Groups each row probes: an eighth of them, at least 8. With each centre filed under two
/// groups, at 3,000 centres (55 groups) a row scores ~900 centres instead of 3,000: CPU time
/// 15.5 vs 25.0 ms for 1,024 rows (`coarse_timing`), top-1 within 0.01 of exact for 99.9% of
/// blob rows (dim 384). Filing once and probing 8 was faster (9.6 ms) but missed more (99.6%;
/// on weakly clustered rows 95.6% vs 98.5%).
pub fn probes(groups: usize) -> usize {
    (groups / 8).max(8).min(groups)
}

/// As `kernels::top_centres`, through `coarse` (see the module docs): for every row of `rows`
/// (n x dim, normalised) its best `k` valid centres among the groups it probes, best first,
/// ids are slot indices; padding -1 / -inf.
#[allow(clippy::too_many_arguments)] // the same arguments as kernels::top_centres, plus the groups
pub fn top_centres(
    rows: &[f32],
    centres: &[f32],
    dim: usize,
    k: usize,
    valid: &[bool],
    coarse: &Coarse,
    codes: Option<&CentreCodes>,
    ids: &mut [i64],
    scores: &mut [f32],
) {
    let n = rows.len() / dim;
    let g = coarse.groups(dim);
    assert!(ids.len() == n * k && scores.len() == n * k);
    ids.fill(-1);
    scores.fill(f32::NEG_INFINITY);
    if n == 0 || k == 0 || g == 0 {
        return;
    }
    // Every valid centre under its nearest groups.
    let members = coarse.file(centres, valid, dim);
    // Each row's best groups.
    let p = probes(g);
    let mut pid = vec![-1i64; n * p];
    let mut psc = vec![0.0f32; n * p];
    kernels::top_centres(rows, &coarse.centroids, dim, p, None, &mut pid, &mut psc);
    let mut rows_of: Vec<Vec<u32>> = vec![Vec::new(); g];
    for r in 0..n {
        for &grp in &pid[r * p..(r + 1) * p] {
            if grp >= 0 {
                rows_of[grp as usize].push(r as u32);
            }
        }
    }
    match usable_codes(codes, centres.len(), dim) {
        Some(cc) => route_coded(rows, centres, dim, k, cc, &members, &rows_of, p, ids, scores),
        None => route_f32(rows, centres, dim, k, &members, &rows_of, ids, scores),
    }
}

/// The codes routing scores from: where the CPU has the batched int8 kernel and there is a
/// code row for every centre row.
fn usable_codes(codes: Option<&CentreCodes>, centre_floats: usize, dim: usize) -> Option<&CentreCodes> {
    codes.filter(|c| c.len() * dim >= centre_floats && coded_routing())
}

/// Per group: its rows against its centres in f32 products, each row's top k kept; then each
/// row's lists merged.
#[allow(clippy::too_many_arguments)]
fn route_f32(rows: &[f32], centres: &[f32], dim: usize, k: usize, members: &[Vec<u32>], rows_of: &[Vec<u32>],
             ids: &mut [i64], scores: &mut [f32]) {
    let per_group: Vec<(usize, Vec<i64>, Vec<f32>)> = (0..members.len())
        .into_par_iter()
        .filter(|&grp| !rows_of[grp].is_empty() && !members[grp].is_empty())
        .map(|grp| {
            let (rs, ms) = (&rows_of[grp], &members[grp]);
            let b = kmeans::gather(centres, ms, dim);
            let prep = PreparedB::new(&b, dim);
            let mut gi = vec![-1i64; rs.len() * k];
            let mut gs = vec![f32::NEG_INFINITY; rs.len() * k];
            // Rows in chunks, so a chunk's gathered rows and its score block stay in cache
            // between the product and the selection (one block for every row of a group was
            // ~1 MB, read back from memory).
            let mut a = Vec::with_capacity(GROUP_CHUNK * dim);
            let mut block = vec![0.0f32; GROUP_CHUNK * ms.len()];
            for (ci, chunk) in rs.chunks(GROUP_CHUNK).enumerate() {
                a.clear();
                for &r in chunk {
                    a.extend_from_slice(&rows[r as usize * dim..(r as usize + 1) * dim]);
                }
                let block = &mut block[..chunk.len() * ms.len()];
                prep.gemm(&a, block);
                for i in 0..chunk.len() {
                    let at = (ci * GROUP_CHUNK + i) * k;
                    keep_best(&block[i * ms.len()..(i + 1) * ms.len()], ms, &mut gi[at..at + k], &mut gs[at..at + k]);
                }
            }
            (grp, gi, gs)
        })
        .collect();
    merge_groups(per_group, rows_of, k, ids, scores);
}

/// As `route_f32`, from the centres' int8 codes (four times the multiplies per instruction
/// with AVX-512 VNNI): per group, each row's best k centres by approximate score; per row,
/// those of all its groups scored exactly in f32, the best k kept. int8 rounding moves a
/// score by well under 0.01 (`quant`), so a centre of the f32 top k is missed only where a
/// centre of its group that close to it took its place (`coded_routing_returns_the_f32_top_k`).
#[allow(clippy::too_many_arguments)]
fn route_coded(rows: &[f32], centres: &[f32], dim: usize, k: usize, cc: &CentreCodes, members: &[Vec<u32>],
               rows_of: &[Vec<u32>], n_probes: usize, ids: &mut [i64], scores: &mut [f32]) {
    let queries: Vec<QueryCodes> = rows.par_chunks(dim).map(QueryCodes::new).collect();
    let per_group: Vec<(usize, Vec<i64>)> = (0..members.len())
        .into_par_iter()
        .filter(|&grp| !rows_of[grp].is_empty() && !members[grp].is_empty())
        .map(|grp| {
            let (rs, ms) = (&rows_of[grp], &members[grp]);
            let block = QuantBlock::gather(cc, ms);
            let mut gi = vec![-1i64; rs.len() * k];
            let mut gs = vec![f32::NEG_INFINITY; k];
            let (mut raw, mut approx) = (Vec::with_capacity(ms.len()), Vec::with_capacity(ms.len()));
            for (i, &r) in rs.iter().enumerate() {
                block.scores_into(&queries[r as usize], &mut raw, &mut approx);
                gs.fill(f32::NEG_INFINITY);
                keep_best(&approx, ms, &mut gi[i * k..(i + 1) * k], &mut gs);
            }
            (grp, gi)
        })
        .collect();
    // Each row's candidates from its groups side by side (`n_probes` lists of k), then scored.
    let n = rows.len() / dim;
    let width = n_probes * k;
    let mut cand = vec![-1i64; n * width];
    let mut filled = vec![0usize; n];
    for (grp, gi) in per_group {
        for (i, &r) in rows_of[grp].iter().enumerate() {
            let r = r as usize;
            let at = r * width + filled[r] * k;
            cand[at..at + k].copy_from_slice(&gi[i * k..(i + 1) * k]);
            filled[r] += 1;
        }
    }
    ids.par_chunks_mut(k)
        .zip(scores.par_chunks_mut(k))
        .zip(rows.par_chunks(dim))
        .zip(cand.par_chunks(width))
        .for_each(|(((oid, osc), row), cands)| {
            for &s in cands {
                // A centre filed under two probed groups arrives twice and is kept once.
                if s >= 0 && !oid.contains(&s) {
                    let at = s as usize * dim;
                    insert_sorted(oid, osc, s, kernels::dot(row, &centres[at..at + dim]));
                }
            }
        });
}

/// One row's scores against centres `ms` into its best-first lists `oid` / `osc`.
#[inline]
fn keep_best(row: &[f32], ms: &[u32], oid: &mut [i64], osc: &mut [f32]) {
    let k = oid.len();
    // Most scores lose to the current k-th best: one comparison against a local threshold
    // skips them.
    let mut thr = f32::NEG_INFINITY;
    for (j, &sc) in row.iter().enumerate() {
        if sc < thr {
            continue;
        }
        insert_sorted(oid, osc, ms[j] as i64, sc);
        if oid[k - 1] >= 0 {
            thr = osc[k - 1];
        }
    }
}

/// Merge each row's per-group lists (`k` per row of the group, in `rows_of` order) into its
/// `k` best (ties to the lower slot); a centre filed under two probed groups arrives twice and
/// is kept once.
fn merge_groups(per_group: Vec<(usize, Vec<i64>, Vec<f32>)>, rows_of: &[Vec<u32>], k: usize, ids: &mut [i64],
                scores: &mut [f32]) {
    for (grp, gi, gs) in per_group {
        for (i, &r) in rows_of[grp].iter().enumerate() {
            let r = r as usize;
            let (oid, osc) = (&mut ids[r * k..(r + 1) * k], &mut scores[r * k..(r + 1) * k]);
            for j in 0..k {
                let (id, sc) = (gi[i * k + j], gs[i * k + j]);
                if id >= 0 && !oid.contains(&id) {
                    insert_sorted(oid, osc, id, sc);
                }
            }
        }
    }
}

/// Whether routing scores the centres from their int8 codes first: on a CPU with the batched
/// int8 kernel (AVX-512 VNNI), unless `CLAG_FAST_F32_ROUTING` is set (benchmarks compare both).
fn coded_routing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| quant::batch_kernel() && std::env::var_os("CLAG_FAST_F32_ROUTING").is_none())
}

/// Insert (id, sc) into the best-first lists if it beats the last (ties: lower id first).
#[inline]
fn insert_sorted(ids: &mut [i64], scores: &mut [f32], id: i64, sc: f32) {
    let k = ids.len();
    let worse = |a_sc: f32, a_id: i64| a_id < 0 || sc > a_sc || (sc == a_sc && id < a_id);
    if !worse(scores[k - 1], ids[k - 1]) {
        return;
    }
    let mut pos = k - 1;
    while pos > 0 && worse(scores[pos - 1], ids[pos - 1]) {
        ids[pos] = ids[pos - 1];
        scores[pos] = scores[pos - 1];
        pos -= 1;
    }
    ids[pos] = id;
    scores[pos] = sc;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kmeans::Rng;

    pub(super) fn unit_rows(n: usize, dim: usize, around: Option<(&[f32], usize, f32)>, rng: &mut Rng) -> Vec<f32> {
        let mut out = vec![0.0f32; n * dim];
        for r in 0..n {
            let row = &mut out[r * dim..(r + 1) * dim];
            for v in row.iter_mut() {
                // a rough normal from the sum of uniforms
                *v = (0..4).map(|_| rng.next_f64() as f32 - 0.5).sum::<f32>();
            }
            if let Some((centres, nc, noise)) = around {
                let c = rng.below(nc);
                let norm = kernels::dot(row, row).sqrt();
                for (j, v) in row.iter_mut().enumerate() {
                    *v = centres[c * dim + j] + noise * *v / norm;
                }
            }
            let norm = kernels::dot(row, row).sqrt();
            row.iter_mut().for_each(|v| *v /= norm);
        }
        out
    }

    #[test]
    fn small_sets_stay_exact() {
        let mut rng = Rng::new(1);
        let c = unit_rows(COARSE_MIN - 1, 16, None, &mut rng);
        assert!(Coarse::build(&c, &vec![true; COARSE_MIN - 1], 16).is_none());
    }

    #[test]
    fn coarse_matches_exact_on_clustered_data() {
        // Topics (blobs), several cluster centres per topic as splits leave them, and rows
        // spread around the topics.
        let (dim, nb, nc, n, k) = (64, 500, 2000, 2000, 4);
        let mut rng = Rng::new(7);
        let blobs = unit_rows(nb, dim, None, &mut rng);
        let centres = unit_rows(nc, dim, Some((&blobs, nb, 0.2)), &mut rng);
        let rows = unit_rows(n, dim, Some((&blobs, nb, 0.6)), &mut rng);
        let mut valid = vec![true; nc];
        valid[3] = false; // a slot without a centre is never returned
        let coarse = Coarse::build(&centres, &valid, dim).unwrap();
        assert!(coarse.fits(nc) && !coarse.fits(nc * 2));
        let (mut ei, mut es) = (vec![0i64; n * k], vec![0.0f32; n * k]);
        kernels::top_centres(&rows, &centres, dim, k, Some(&valid), &mut ei, &mut es);
        let (mut ci, mut cs) = (vec![0i64; n * k], vec![0.0f32; n * k]);
        top_centres(&rows, &centres, dim, k, &valid, &coarse, None, &mut ci, &mut cs);
        // The same best centre, or one as good within 0.02 cosine (near-duplicate centres).
        let same = (0..n).filter(|&r| ci[r * k] == ei[r * k]).count();
        let close = (0..n).filter(|&r| cs[r * k] >= es[r * k] - 0.02).count();
        eprintln!("coarse routing: top-1 same {same}/{n}, within 0.02 {close}/{n}");
        assert!(close as f64 >= 0.97 * n as f64, "top-1 within 0.02 of exact: {close}/{n}");
        for r in 0..n {
            // sorted, valid, and never better than exact
            assert!(ci[r * k..(r + 1) * k].iter().all(|&s| s != 3 && s >= 0));
            assert!(cs[r * k..(r + 1) * k].windows(2).all(|w| w[0] >= w[1]));
            assert!(cs[r * k] <= es[r * k] + 1e-5);
            let s = ci[r * k] as usize;
            let d = kernels::dot(&rows[r * dim..(r + 1) * dim], &centres[s * dim..(s + 1) * dim]);
            assert!((d - cs[r * k]).abs() < 1e-4);
        }
    }

    /// Routing from the int8 codes returns what the f32 products do, to the rounding of the
    /// codes: the same best centre (or one tied with it within 0.002), every rank's score
    /// within 0.01 of the f32 path's, and each score the exact f32 dot product; on clustered
    /// rows (many centres within the codes' error of each other) and on isotropic ones.
    /// Like `quant`'s VNNI kernel test: runs where the compiler targets VNNI, and with
    /// `cargo test --release -- --include-ignored` on any CPU that has it; asked for on a CPU
    /// without it (or with `CLAG_FAST_F32_ROUTING` set), it fails rather than pass untested.
    #[test]
    #[cfg_attr(
        not(target_feature = "avx512vnni"),
        ignore = "needs AVX-512 VNNI: run `cargo test --release -- --include-ignored` on a CPU that has it"
    )]
    fn coded_routing_returns_the_f32_top_k() {
        assert!(coded_routing(), "no batched int8 kernel on this CPU (or CLAG_FAST_F32_ROUTING set)");
        for (dim, spread, seed) in [(384usize, 0.2f32, 3u64), (384, 0.6, 4), (100, 0.3, 5), (64, 0.0, 6)] {
            let (nb, nc, n, k) = (300, 1500, 1500, 5);
            let mut rng = Rng::new(seed);
            let blobs = unit_rows(nb, dim, None, &mut rng);
            let centres = unit_rows(nc, dim, Some((&blobs, nb, spread)), &mut rng);
            let rows = if spread > 0.0 { unit_rows(n, dim, Some((&blobs, nb, 0.5)), &mut rng) } else { unit_rows(n, dim, None, &mut rng) };
            let mut valid = vec![true; nc];
            valid[7] = false;
            let coarse = Coarse::build(&centres, &valid, dim).unwrap();
            let cc = CentreCodes::from_rows(&centres, dim);
            assert!(usable_codes(Some(&cc), centres.len(), dim).is_some(), "the codes would not be used");
            let (mut fi, mut fs) = (vec![0i64; n * k], vec![0.0f32; n * k]);
            top_centres(&rows, &centres, dim, k, &valid, &coarse, None, &mut fi, &mut fs);
            let (mut qi, mut qs) = (vec![0i64; n * k], vec![0.0f32; n * k]);
            top_centres(&rows, &centres, dim, k, &valid, &coarse, Some(&cc), &mut qi, &mut qs);
            let mut other_best = 0;
            for r in 0..n {
                let row = &rows[r * dim..(r + 1) * dim];
                if qi[r * k] != fi[r * k] {
                    other_best += 1;
                    assert!(qs[r * k] >= fs[r * k] - 0.002, "dim {dim} row {r}: best {} vs {}", qs[r * k], fs[r * k]);
                }
                for j in r * k..(r + 1) * k {
                    assert!(qi[j] >= 0 && qi[j] != 7, "dim {dim} row {r}: slot {}", qi[j]);
                    assert!((qs[j] - fs[j]).abs() < 0.01, "dim {dim} row {r} rank {}: {} vs {}", j - r * k, qs[j], fs[j]);
                    // The same candidates, exactly scored: never better than the f32 path.
                    assert!(qs[j] <= fs[j] + 1e-5, "dim {dim} row {r} rank {}: {} above {}", j - r * k, qs[j], fs[j]);
                    let s = qi[j] as usize;
                    assert!((qs[j] - kernels::dot(row, &centres[s * dim..(s + 1) * dim])).abs() < 1e-5);
                }
                assert!(qs[r * k..(r + 1) * k].windows(2).all(|w| w[0] >= w[1]));
            }
            eprintln!("dim {dim} spread {spread}: another best centre (tied) for {other_best} of {n} rows");
            assert!(other_best * 100 <= n, "dim {dim}: {other_best} of {n} rows routed elsewhere");
        }
    }
}

#[cfg(test)]
mod timing {
    use super::*;
    use crate::kmeans::Rng;

    /// `cargo test --release coarse_timing -- --ignored --nocapture`: best-of-20 CPU time of
    /// exact routing, coarse routing and coarse routing from int8 codes, 1,024 rows against
    /// 3,000 centres (dim 384).
    #[test]
    #[ignore = "a timing report, not a check; run it by hand"]
    fn coarse_timing() {
        let (dim, nc, n, k) = (384, 3000, 1024, 4);
        let mut rng = Rng::new(5);
        let gen = |m: usize, rng: &mut Rng| -> Vec<f32> {
            let mut v: Vec<f32> = (0..m * dim).map(|_| rng.next_f64() as f32 - 0.5).collect();
            for r in v.chunks_mut(dim) {
                let nn = kernels::dot(r, r).sqrt();
                r.iter_mut().for_each(|x| *x /= nn);
            }
            v
        };
        // CLAG_FAST_TIMING_BLOBS: rows and centres around 1,000 blobs (the shape of a store's
        // data) instead of isotropic ones (every centre about as far as any other).
        let (centres, rows) = if std::env::var_os("CLAG_FAST_TIMING_BLOBS").is_some() {
            let blobs = super::tests::unit_rows(1000, dim, None, &mut rng);
            (super::tests::unit_rows(nc, dim, Some((&blobs, 1000, 0.3)), &mut rng),
             super::tests::unit_rows(n, dim, Some((&blobs, 1000, 1.0)), &mut rng))
        } else {
            (gen(nc, &mut rng), gen(n, &mut rng))
        };
        let valid = vec![true; nc];
        let coarse = Coarse::build(&centres, &valid, dim).unwrap();
        let (mut ids, mut sc) = (vec![0i64; n * k], vec![0.0f32; n * k]);
        // Process CPU time: what the work costs, whatever else the machine is running.
        let cpu = || {
            let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // SAFETY: a valid clock id and a valid out pointer.
            unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
            ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
        };
        let cc = CentreCodes::from_rows(&centres, dim);
        let (mut te, mut tc, mut tq) = (f64::MAX, f64::MAX, f64::MAX);
        for _ in 0..20 {
            let t = cpu();
            kernels::top_centres(&rows, &centres, dim, k, Some(&valid), &mut ids, &mut sc);
            te = te.min(cpu() - t);
            let t = cpu();
            top_centres(&rows, &centres, dim, k, &valid, &coarse, None, &mut ids, &mut sc);
            tc = tc.min(cpu() - t);
            let t = cpu();
            top_centres(&rows, &centres, dim, k, &valid, &coarse, Some(&cc), &mut ids, &mut sc);
            tq = tq.min(cpu() - t);
        }
        eprintln!("CPU time: exact {:.2} ms, coarse {:.2} ms, coarse from int8 codes {:.2} ms ({} groups, {} probed)",
                  te * 1e3, tc * 1e3, tq * 1e3, coarse.groups(dim), probes(coarse.groups(dim)));
    }
}
