//! Hot numeric kernels on plain slices: dot products, normalisation, top-k selection,
//! `A * B^T` blocks and batched top-K centre assignment.
//!
//! SIMD: `dot` uses explicit `std::arch` AVX2+FMA intrinsics, chosen at run time with
//! `is_x86_feature_detected!` (the detection result is cached by std, so the check is one
//! relaxed atomic load). Other CPUs get a portable loop with eight independent accumulators,
//! which LLVM auto-vectorises to SSE/NEON. Matrix products (batched assignment, k-means,
//! batched flat search) go through `matrixmultiply::sgemm`, a cache-blocked micro-kernel
//! GEMM that also detects AVX/FMA at run time.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use rayon::prelude::*;

use crate::error::{Error, Result};

/// Dot product of two equally long slices.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            return unsafe { dot_avx2(a, b) };
        }
    }
    dot_portable(a, b)
}

/// Portable dot product; eight accumulators break the add dependency chain so LLVM can
/// vectorise it, and so that results stay close to the SIMD path.
pub fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 8];
    let chunks = n / 8;
    for i in 0..chunks {
        let (x, y) = (&a[i * 8..i * 8 + 8], &b[i * 8..i * 8 + 8]);
        for j in 0..8 {
            acc[j] += x[j] * y[j];
        }
    }
    let mut s = (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for i in chunks * 8..n {
        s += a[i] * b[i];
    }
    s
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    // Four independent 8-lane accumulators: FMA latency is 4 cycles and two ports issue
    // per cycle, so one accumulator would leave most of the throughput unused.
    let mut s0 = _mm256_setzero_ps();
    let mut s1 = _mm256_setzero_ps();
    let mut s2 = _mm256_setzero_ps();
    let mut s3 = _mm256_setzero_ps();
    let mut i = 0;
    while i + 32 <= n {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i + 8)), _mm256_loadu_ps(pb.add(i + 8)), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i + 16)), _mm256_loadu_ps(pb.add(i + 16)), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i + 24)), _mm256_loadu_ps(pb.add(i + 24)), s3);
        i += 32;
    }
    while i + 8 <= n {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), s0);
        i += 8;
    }
    let s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    let hi = _mm256_extractf128_ps(s, 1);
    let lo = _mm256_castps256_ps128(s);
    let q = _mm_add_ps(lo, hi);
    let q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    let q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 0x55));
    let mut total = _mm_cvtss_f32(q);
    while i < n {
        total += *pa.add(i) * *pb.add(i);
        i += 1;
    }
    total
}

/// Euclidean norm accumulated in f64, so tiny or huge (but finite) values neither underflow
/// to zero nor overflow to infinity.
pub fn norm_f64(v: &[f32]) -> f64 {
    sum_lanes(v, |x| (x as f64) * (x as f64)).sqrt()
}

/// Sum of `f(x)` over `v` in f64, kept in eight partial sums: independent chains the compiler
/// holds in vector lanes (one chain of `dim` dependent adds was most of what checking an
/// appended row, or refreshing a centre and its int8 codes, cost). The order of the adds is
/// fixed, so results do not depend on the machine.
pub fn sum_lanes<T: Copy>(v: &[T], f: impl Fn(T) -> f64) -> f64 {
    let mut acc = [0f64; 8];
    let chunks = v.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for j in 0..8 {
            acc[j] += f(c[j]);
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for &x in tail {
        s += f(x);
    }
    s
}

/// Rows whose norm is this close to 1 are taken as already normalised (scale 1.0). A row
/// this crate normalised lies within 1e-7 of unit norm (measured up to dim 4096), so writing
/// a stored row again (an export imported into another store, vectors read back and
/// re-added) keeps it bit for bit instead of rescaling it by 1 +- one ulp.
pub const UNIT_TOLERANCE: f64 = 1e-6;

/// Checks that every row of `data` (`dim` wide) is finite and non-zero and returns the
/// inverse norms (exactly 1.0 for rows already of unit norm, see `UNIT_TOLERANCE`). Errors
/// name the first bad row, so nothing needs to be written before the whole batch is known to
/// be valid.
pub fn check_rows(data: &[f32], dim: usize, what: &str) -> Result<Vec<f32>> {
    if dim == 0 {
        return Err(Error::Value("dim must be >= 1".into()));
    }
    if !data.len().is_multiple_of(dim) {
        return Err(Error::Value(format!(
            "{what}: {} values is not a whole number of rows of dim {dim}",
            data.len()
        )));
    }
    let mut inv = Vec::with_capacity(data.len() / dim);
    for (i, row) in data.chunks_exact(dim).enumerate() {
        let n = norm_f64(row);
        // Squares of f32 values cannot overflow f64, so the norm is finite exactly when every
        // value is: the row is searched for the culprit only when it is not.
        if !n.is_finite() {
            let j = row.iter().position(|x| !x.is_finite()).unwrap_or(0);
            return Err(Error::Value(format!(
                "{what}: row {i} has a non-finite value ({}) at column {j} (NaN or infinity)",
                row[j]
            )));
        }
        if n <= 1e-30 {
            return Err(Error::Value(format!("{what}: row {i} is a zero vector (cannot be normalised)")));
        }
        inv.push(if (n - 1.0).abs() <= UNIT_TOLERANCE { 1.0 } else { (1.0 / n) as f32 });
    }
    Ok(inv)
}

/// Validated, L2-normalised copy of `data` (rows of `dim`).
pub fn normalized(data: &[f32], dim: usize, what: &str) -> Result<Vec<f32>> {
    let inv = check_rows(data, dim, what)?;
    let mut out = data.to_vec();
    for (row, s) in out.chunks_exact_mut(dim).zip(inv) {
        row.iter_mut().for_each(|x| *x *= s);
    }
    Ok(out)
}

/// Normalise `v` in place from an f64 accumulator; returns false (leaving `out` untouched)
/// when the vector is zero.
pub fn normalize_f64_into(v: &[f64], out: &mut [f32]) -> bool {
    let n = sum_lanes(v, |x| x * x).sqrt();
    if n.is_nan() || n <= 1e-30 || !n.is_finite() {
        return false;
    }
    for (o, x) in out.iter_mut().zip(v) {
        *o = (x / n) as f32;
    }
    true
}

/// `c[m x n] = a[m x d] * b[n x d]^T` (all row-major). Single-threaded: callers parallelise
/// over blocks so that results do not depend on the thread count.
///
/// With AVX-512F an explicit `std::arch` micro-kernel is used (runtime detection; set
/// CLAG_FAST_NO_AVX512=1 to force the fallback), otherwise `matrixmultiply::sgemm`
/// (AVX2/FMA or portable). Batched callers use `PreparedB` to pack the centres once.
pub fn gemm_nt(a: &[f32], b: &[f32], d: usize, c: &mut [f32]) {
    let m = a.len() / d.max(1);
    let n = b.len() / d.max(1);
    assert!(d > 0 && a.len() == m * d && b.len() == n * d && c.len() == m * n, "gemm_nt shapes");
    if m == 0 || n == 0 {
        return;
    }
    PreparedB::new(b, d).gemm(a, c);
}

/// `gemm_nt` through `matrixmultiply` (AVX2/FMA detected at run time, else portable).
pub fn gemm_nt_portable(a: &[f32], b: &[f32], d: usize, c: &mut [f32]) {
    let m = a.len() / d.max(1);
    let n = b.len() / d.max(1);
    assert!(d > 0 && a.len() == m * d && b.len() == n * d && c.len() == m * n, "gemm_nt shapes");
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: the asserts above guarantee every index sgemm touches is in bounds:
    // a is m x d (row stride d), b^T is d x n read from b with row stride 1 / col stride d,
    // c is m x n with row stride n.
    unsafe {
        matrixmultiply::sgemm(
            m,
            d,
            n,
            1.0,
            a.as_ptr(),
            d as isize,
            1,
            b.as_ptr(),
            1,
            d as isize,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! Outer-product micro-kernel (the classic GEMM design): the centres are packed into
    //! strips of 32 (d x 32, k-major), so each step k loads two zmm of centres, broadcasts
    //! one value from each of 12 rows and runs 24 FMAs into 24 accumulator registers.
    //! Loads (2 + 12) stay below the FMA count, so the kernel is FMA-bound with no
    //! horizontal reductions; the 32-wide strip (48 KB at d = 384) stays in L1/L2 while a
    //! 256-row block streams past it.
    use std::arch::x86_64::*;

    const W: usize = 32;
    const R: usize = 12;

    /// Pack b (n x d) into ceil(n / 32) strips of d x 32, zero padded.
    pub fn pack(b: &[f32], d: usize, n: usize) -> Vec<f32> {
        let strips = n.div_ceil(W);
        let mut p = vec![0.0f32; strips * d * W];
        for j in 0..n {
            let (st, lane) = (j / W, j % W);
            let base = st * d * W;
            for k in 0..d {
                p[base + k * W + lane] = b[j * d + k];
            }
        }
        p
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn kernel<const RR: usize>(a: *const f32, d: usize, bp: *const f32, c: *mut f32, ldc: usize, m0: u16, m1: u16) {
        let mut acc0 = [_mm512_setzero_ps(); RR];
        let mut acc1 = [_mm512_setzero_ps(); RR];
        for k in 0..d {
            let b0 = _mm512_loadu_ps(bp.add(k * W));
            let b1 = _mm512_loadu_ps(bp.add(k * W + 16));
            for r in 0..RR {
                let av = _mm512_set1_ps(*a.add(r * d + k));
                acc0[r] = _mm512_fmadd_ps(av, b0, acc0[r]);
                acc1[r] = _mm512_fmadd_ps(av, b1, acc1[r]);
            }
        }
        for r in 0..RR {
            _mm512_mask_storeu_ps(c.add(r * ldc), m0, acc0[r]);
            _mm512_mask_storeu_ps(c.add(r * ldc + 16), m1, acc1[r]);
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    unsafe fn rest(a: *const f32, d: usize, bp: *const f32, c: *mut f32, ldc: usize, m0: u16, m1: u16, rows: usize) {
        match rows {
            1 => kernel::<1>(a, d, bp, c, ldc, m0, m1),
            2 => kernel::<2>(a, d, bp, c, ldc, m0, m1),
            3 => kernel::<3>(a, d, bp, c, ldc, m0, m1),
            4 => kernel::<4>(a, d, bp, c, ldc, m0, m1),
            5 => kernel::<5>(a, d, bp, c, ldc, m0, m1),
            6 => kernel::<6>(a, d, bp, c, ldc, m0, m1),
            7 => kernel::<7>(a, d, bp, c, ldc, m0, m1),
            8 => kernel::<8>(a, d, bp, c, ldc, m0, m1),
            9 => kernel::<9>(a, d, bp, c, ldc, m0, m1),
            10 => kernel::<10>(a, d, bp, c, ldc, m0, m1),
            11 => kernel::<11>(a, d, bp, c, ldc, m0, m1),
            _ => {}
        }
    }

    /// # Safety
    /// AVX-512F must be available; `a` is m x d, `packed` comes from `pack(b, d, n)`,
    /// `c` is m x n.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn gemm_nt_packed(a: &[f32], packed: &[f32], d: usize, m: usize, n: usize, c: &mut [f32]) {
        let pc = c.as_mut_ptr();
        let pa = a.as_ptr();
        for st in 0..n.div_ceil(W) {
            let j = st * W;
            let valid = (n - j).min(W);
            let m0: u16 = if valid >= 16 { 0xffff } else { ((1u32 << valid) - 1) as u16 };
            let m1: u16 = if valid >= W { 0xffff } else if valid > 16 { ((1u32 << (valid - 16)) - 1) as u16 } else { 0 };
            let bp = packed.as_ptr().add(st * d * W);
            let mut i = 0;
            while i + R <= m {
                kernel::<R>(pa.add(i * d), d, bp, pc.add(i * n + j), n, m0, m1);
                i += R;
            }
            if i < m {
                rest(pa.add(i * d), d, bp, pc.add(i * n + j), n, m0, m1, m - i);
            }
        }
    }
}

/// Centres prepared once for many `gemm_nt_prepared` calls (packed for the AVX-512 kernel
/// when the CPU has it).
pub struct PreparedB<'a> {
    b: &'a [f32],
    d: usize,
    n: usize,
    packed: Option<Vec<f32>>,
}

impl<'a> PreparedB<'a> {
    pub fn new(b: &'a [f32], d: usize) -> Self {
        let n = b.len() / d.max(1);
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f") && std::env::var_os("CLAG_FAST_NO_AVX512").is_none() {
                return PreparedB { b, d, n, packed: Some(avx512::pack(b, d, n)) };
            }
        }
        PreparedB { b, d, n, packed: None }
    }

    /// `c[m x n] = a[m x d] * b^T`.
    pub fn gemm(&self, a: &[f32], c: &mut [f32]) {
        let d = self.d;
        let m = a.len() / d.max(1);
        assert!(d > 0 && a.len() == m * d && c.len() == m * self.n, "gemm shapes");
        if m == 0 || self.n == 0 {
            return;
        }
        match &self.packed {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `packed` exists only when AVX-512F was detected; shapes checked above.
            Some(p) => unsafe { avx512::gemm_nt_packed(a, p, d, m, self.n, c) },
            _ => gemm_nt_portable(a, self.b, d, c),
        }
    }
}

/// A scored item; ordered so that the *worst* item is the greatest (top of a max-heap):
/// lower score is worse; on equal scores the larger id is worse (deterministic ties).
#[derive(Clone, Copy, Debug)]
pub struct Scored {
    pub score: f32,
    pub id: u32,
}

impl PartialEq for Scored {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Scored {}
impl PartialOrd for Scored {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Scored {
    fn cmp(&self, o: &Self) -> Ordering {
        o.score.total_cmp(&self.score).then(self.id.cmp(&o.id))
    }
}

/// Bounded top-k collector (heap of the k best; the root is the worst kept item).
pub struct TopK {
    k: usize,
    heap: BinaryHeap<Scored>,
    /// Score of the worst kept item once full; lets the hot loop reject with one compare.
    floor: f32,
}

impl TopK {
    pub fn new(k: usize) -> Self {
        TopK { k, heap: BinaryHeap::with_capacity(k.min(4096) + 1), floor: f32::NEG_INFINITY }
    }

    #[inline]
    pub fn push(&mut self, score: f32, id: u32) {
        if self.k == 0 {
            return;
        }
        if self.heap.len() < self.k {
            self.heap.push(Scored { score, id });
            if self.heap.len() == self.k {
                self.floor = self.heap.peek().map_or(f32::NEG_INFINITY, |s| s.score);
            }
            return;
        }
        if score < self.floor {
            return;
        }
        let cand = Scored { score, id };
        let mut top = self.heap.peek_mut().expect("heap is full");
        if cand < *top {
            *top = cand;
            drop(top);
            self.floor = self.heap.peek().map_or(f32::NEG_INFINITY, |s| s.score);
        }
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Kept items, best first.
    pub fn into_sorted(self) -> Vec<Scored> {
        self.heap.into_sorted_vec()
    }

    /// Merge another collector into this one.
    pub fn merge(&mut self, other: TopK) {
        for s in other.heap {
            self.push(s.score, s.id);
        }
    }
}

/// Top-`k` columns of one score row, best first (ties: lower index first).
pub fn top_k_of_row(scores: &[f32], k: usize, valid: Option<&[bool]>) -> Vec<Scored> {
    let mut t = TopK::new(k);
    for (j, &s) in scores.iter().enumerate() {
        if valid.is_none_or(|v| v[j]) {
            t.push(s, j as u32);
        }
    }
    t.into_sorted()
}

/// Rows per block in batched products: a 256 x 1000 score block is 1 MB, which stays in L2
/// while top-K reads it back.
pub const BLOCK_ROWS: usize = 256;

/// For every row of `rows` (n x dim, normalised), the top-`k` of `centres` (c x dim) by dot
/// product, written into `ids` / `scores` (n x k, best first; padding -1 / -inf when fewer
/// than k centres are valid). `valid` excludes centres (e.g. clusters without a centre).
/// Parallel over row blocks with rayon; the result does not depend on the thread count.
pub fn top_centres(
    rows: &[f32],
    centres: &[f32],
    dim: usize,
    k: usize,
    valid: Option<&[bool]>,
    ids: &mut [i64],
    scores: &mut [f32],
) {
    let c = centres.len() / dim;
    let n = rows.len() / dim;
    assert!(ids.len() == n * k && scores.len() == n * k);
    if k == 0 {
        return;
    }
    let prep = PreparedB::new(centres, dim);
    ids.par_chunks_mut(BLOCK_ROWS * k)
        .zip(scores.par_chunks_mut(BLOCK_ROWS * k))
        .zip(rows.par_chunks(BLOCK_ROWS * dim))
        .for_each(|((bid, bsc), brows)| {
            let m = brows.len() / dim;
            let mut block = vec![0.0f32; m * c];
            prep.gemm(brows, &mut block);
            for r in 0..m {
                let row = &block[r * c..(r + 1) * c];
                let (oid, osc) = (&mut bid[r * k..(r + 1) * k], &mut bsc[r * k..(r + 1) * k]);
                if k <= SMALL_K {
                    small_top_k(row, valid, oid, osc);
                } else {
                    let best = top_k_of_row(row, k, valid);
                    for j in 0..k {
                        let (id, sc) = best.get(j).map_or((-1, f32::NEG_INFINITY), |s| (s.id as i64, s.score));
                        oid[j] = id;
                        osc[j] = sc;
                    }
                }
            }
        });
}

/// Up to this k, batched assignment keeps the best k in a sorted array (insertion), which
/// beats a heap and allocates nothing: most of the c scores fail the first compare.
const SMALL_K: usize = 8;

/// Top-k (k = ids.len()) of one score row into ids / scores, best first, ties to the lower
/// index, padding -1 / -inf.
fn small_top_k(row: &[f32], valid: Option<&[bool]>, ids: &mut [i64], scores: &mut [f32]) {
    let k = ids.len();
    ids.fill(-1);
    scores.fill(f32::NEG_INFINITY);
    let mut filled = 0;
    for (j, &s) in row.iter().enumerate() {
        if filled == k && s <= scores[k - 1] {
            continue;
        }
        if valid.is_some_and(|v| !v[j]) {
            continue;
        }
        // Insert after every kept score >= s (earlier index wins ties).
        let mut pos = filled.min(k - 1);
        while pos > 0 && scores[pos - 1] < s {
            pos -= 1;
        }
        if filled < k {
            filled += 1;
        }
        for t in (pos + 1..filled).rev() {
            ids[t] = ids[t - 1];
            scores[t] = scores[t - 1];
        }
        ids[pos] = j as i64;
        scores[pos] = s;
    }
}

/// Nearest centre (index, score) for each of the rows named by `ids` in `data`; gathers each
/// block into a contiguous buffer so the GEMM reads sequential memory.
pub fn nearest_centre_gather(
    data: &[f32],
    ids: &[u32],
    centres: &[f32],
    dim: usize,
    labels: &mut [u32],
    best: &mut [f32],
) {
    let c = centres.len() / dim;
    let prep = PreparedB::new(centres, dim);
    labels
        .par_chunks_mut(BLOCK_ROWS)
        .zip(best.par_chunks_mut(BLOCK_ROWS))
        .zip(ids.par_chunks(BLOCK_ROWS))
        // At least 4 blocks per task: the 2-means of a split (a few hundred rows, ~10 rounds)
        // spent more on waking a second thread per round than on the products.
        .with_min_len(4)
        .for_each(|((lab, bs), bids)| {
            let m = bids.len();
            let mut block = vec![0.0f32; m * c];
            // A run of consecutive row ids (the common "every row" case) is already contiguous.
            let (first, last) = (bids[0] as usize, bids[m - 1] as usize);
            if last - first + 1 == m && bids.windows(2).all(|w| w[1] == w[0] + 1) {
                prep.gemm(&data[first * dim..(last + 1) * dim], &mut block);
            } else {
                let mut buf = vec![0.0f32; m * dim];
                for (i, &r) in bids.iter().enumerate() {
                    let r = r as usize;
                    buf[i * dim..(i + 1) * dim].copy_from_slice(&data[r * dim..(r + 1) * dim]);
                }
                prep.gemm(&buf, &mut block);
            }
            for i in 0..m {
                let row = &block[i * c..(i + 1) * c];
                let (mut bj, mut bv) = (0usize, f32::NEG_INFINITY);
                for (j, &v) in row.iter().enumerate() {
                    if v > bv {
                        bv = v;
                        bj = j;
                    }
                }
                lab[i] = bj as u32;
                bs[i] = bv;
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    #[test]
    fn dot_matches_scalar_for_all_lengths() {
        let mut s = 1u64;
        for n in 0..100 {
            let a: Vec<f32> = (0..n).map(|_| lcg(&mut s)).collect();
            let b: Vec<f32> = (0..n).map(|_| lcg(&mut s)).collect();
            let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot(&a, &b) as f64 - want).abs() < 1e-4, "n={n}");
            assert!((dot_portable(&a, &b) as f64 - want).abs() < 1e-4, "n={n}");
        }
    }

    #[test]
    fn gemm_paths_agree_with_naive_for_odd_shapes() {
        let mut s = 11u64;
        for &(m, n, d) in &[(1, 1, 1), (5, 7, 17), (9, 4, 384), (4, 9, 31), (3, 2, 16)] {
            let a: Vec<f32> = (0..m * d).map(|_| lcg(&mut s)).collect();
            let b: Vec<f32> = (0..n * d).map(|_| lcg(&mut s)).collect();
            let mut c1 = vec![0f32; m * n];
            let mut c2 = vec![0f32; m * n];
            gemm_nt(&a, &b, d, &mut c1);
            gemm_nt_portable(&a, &b, d, &mut c2);
            for i in 0..m {
                for j in 0..n {
                    let want = dot_portable(&a[i * d..][..d], &b[j * d..][..d]);
                    assert!((c1[i * n + j] - want).abs() < 1e-4, "{m}x{n}x{d}");
                    assert!((c2[i * n + j] - want).abs() < 1e-4, "{m}x{n}x{d}");
                }
            }
        }
    }

    #[test]
    fn topk_keeps_best_sorted_with_id_ties() {
        let mut t = TopK::new(3);
        for (i, s) in [0.1, 0.9, 0.5, 0.9, -1.0, 0.7].iter().enumerate() {
            t.push(*s, i as u32);
        }
        let v: Vec<(f32, u32)> = t.into_sorted().iter().map(|s| (s.score, s.id)).collect();
        assert_eq!(v, vec![(0.9, 1), (0.9, 3), (0.7, 5)]);
        assert!(TopK::new(0).into_sorted().is_empty());
    }

    #[test]
    fn check_rows_rejects_bad_rows() {
        assert!(check_rows(&[1.0, 0.0, 0.0, 0.0], 2, "x").is_err());
        assert!(check_rows(&[1.0, f32::NAN], 2, "x").is_err());
        assert!(check_rows(&[1.0, 2.0, 3.0], 2, "x").is_err());
        let inv = check_rows(&[3.0, 4.0], 2, "x").unwrap();
        assert!((inv[0] - 0.2).abs() < 1e-7);
    }

    #[test]
    fn normalising_a_normalised_row_keeps_its_bits() {
        let mut s = 11u64;
        for dim in [3usize, 384, 1536] {
            let raw: Vec<f32> = (0..50 * dim).map(|_| lcg(&mut s) * 7.0).collect();
            let once = normalized(&raw, dim, "x").unwrap();
            let twice = normalized(&once, dim, "x").unwrap();
            assert!(once.iter().zip(&twice).all(|(a, b)| a.to_bits() == b.to_bits()), "dim {dim}");
            assert!(check_rows(&once, dim, "x").unwrap().iter().all(|&f| f == 1.0));
        }
    }

    #[test]
    fn top_centres_matches_brute_force() {
        let mut s = 7u64;
        let dim = 13;
        let rows: Vec<f32> = (0..600 * dim).map(|_| lcg(&mut s)).collect();
        let cent: Vec<f32> = (0..5 * dim).map(|_| lcg(&mut s)).collect();
        let k = 7; // more than there are centres: padding
        let mut ids = vec![0i64; 600 * k];
        let mut sc = vec![0f32; 600 * k];
        top_centres(&rows, &cent, dim, k, None, &mut ids, &mut sc);
        for r in 0..600 {
            let mut all: Vec<(f32, i64)> =
                (0..5).map(|c| (dot(&rows[r * dim..][..dim], &cent[c * dim..][..dim]), c as i64)).collect();
            all.sort_by(|a, b| b.0.total_cmp(&a.0));
            for j in 0..5 {
                assert_eq!(ids[r * k + j], all[j].1);
                assert!((sc[r * k + j] - all[j].0).abs() < 1e-4);
            }
            assert_eq!(ids[r * k + 5], -1);
            assert_eq!(sc[r * k + 6], f32::NEG_INFINITY);
        }
    }
}
