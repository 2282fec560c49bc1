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

use std::sync::Mutex;

use rayon::prelude::*;

use crate::kernels::{self, PreparedB};
use crate::kmeans::{self, KMeansConfig};

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
    // Per group: its rows against its centres in one product, each row's top k kept.
    let per_group: Vec<(usize, Vec<i64>, Vec<f32>)> = (0..g)
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
                    let (oid, osc) = (&mut gi[at..at + k], &mut gs[at..at + k]);
                    // Most scores lose to the current k-th best: one comparison against a
                    // local threshold skips them.
                    let mut thr = f32::NEG_INFINITY;
                    for (j, &sc) in block[i * ms.len()..(i + 1) * ms.len()].iter().enumerate() {
                        if sc < thr {
                            continue;
                        }
                        insert_sorted(oid, osc, ms[j] as i64, sc);
                        if oid[k - 1] >= 0 {
                            thr = osc[k - 1];
                        }
                    }
                }
            }
            (grp, gi, gs)
        })
        .collect();
    // Merge each row's per-group lists into its k best (ties to the lower slot); a centre
    // filed under two probed groups arrives twice and is kept once.
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

/// Insert (id, sc) into the best-first lists if it beats the last (ties: lower id first).
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

    fn unit_rows(n: usize, dim: usize, around: Option<(&[f32], usize, f32)>, rng: &mut Rng) -> Vec<f32> {
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
        top_centres(&rows, &centres, dim, k, &valid, &coarse, &mut ci, &mut cs);
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
}

#[cfg(test)]
mod timing {
    use super::*;
    use crate::kmeans::Rng;

    /// `cargo test --release coarse_timing -- --ignored --nocapture`: best-of-20 wall time of
    /// exact and coarse routing of 1,024 rows against 3,000 centres (dim 384).
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
        let centres = gen(nc, &mut rng);
        let rows = gen(n, &mut rng);
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
        let (mut te, mut tc) = (f64::MAX, f64::MAX);
        for _ in 0..20 {
            let t = cpu();
            kernels::top_centres(&rows, &centres, dim, k, Some(&valid), &mut ids, &mut sc);
            te = te.min(cpu() - t);
            let t = cpu();
            top_centres(&rows, &centres, dim, k, &valid, &coarse, &mut ids, &mut sc);
            tc = tc.min(cpu() - t);
        }
        eprintln!("CPU time: exact {:.2} ms, coarse {:.2} ms ({} groups, {} probed)", te * 1e3, tc * 1e3,
                  coarse.groups(dim), probes(coarse.groups(dim)));
    }
}
