//! int8 copies of cluster members for stage 2 of the two-stage search.
//!
//! Why: stage 2 is bound by memory bandwidth, not arithmetic. Scanning four 1,000-row
//! clusters of f32 rows reads 6 MB per query; the int8 copy reads 1.5 MB (and takes a
//! quarter of the RAM of an f32 copy). Scores from the codes are approximate, so the scan
//! keeps a shortlist of `rescore_depth(k)` candidates and the final top-k is chosen by exact
//! f32 dot products of that shortlist read from the memory map.
//!
//! Encoding: each row keeps a scale `max|x| / 127` and codes `round(x / scale)` in
//! [-127, 127]; the query gets one scale and *unsigned* codes `round(q / scale) + 128`,
//! because the AVX-512 VNNI instruction `vpdpbusd` multiplies u8 by i8. The +128 offset is
//! removed with the row's precomputed code sum: `sum((cq + 128) * c) - 128 * sum(c)`. The AVX2
//! kernel (CPUs without VNNI) takes the same codes and returns the signed dot product itself
//! (`Kernel::offset` 0), through `vpmaddubsw` on |q| and sign(q) * c: no product pair can
//! saturate its 16-bit sum, since both factors are at most 127.
//! Rows are padded with zero codes to a multiple of 64 bytes so the kernel needs no tail.

/// Bytes per code row: `dim` rounded up to a multiple of 64 (one zmm register).
pub fn padded(dim: usize) -> usize {
    dim.div_ceil(64) * 64
}

/// How many approximate candidates stage 2 re-scores exactly for a top-`k` search.
///
/// int8 rounding moves a unit-vector score by well under 0.01, so only rows within that of
/// the k-th score can swap; 4k + 32 (72 rows for k = 10, ~72 random row reads) gave the
/// same recall@10 as the f32 scan, to three decimals, on the easy-1M, hard-1M and LoCoMo
/// bench sets at n_probe 1, 4 and 16 (BENCHMARKS.md, "Current: int8 stage 2").
pub fn rescore_depth(k: usize) -> usize {
    k.saturating_mul(4).saturating_add(32)
}

/// Quantised rows, contiguous, in the cluster's `primary` order.
/// Fields are private: `scan` relies on every row being exactly `stride` bytes.
pub struct QuantBlock {
    stride: usize,
    codes: Vec<i8>,
    scales: Vec<f32>,
    sums: Vec<i32>,
}

impl QuantBlock {
    /// Quantise `rows` (each `dim` floats, finite).
    pub fn build<'a>(rows: impl ExactSizeIterator<Item = &'a [f32]>, dim: usize) -> Self {
        let stride = padded(dim);
        let n = rows.len();
        let mut b = QuantBlock { stride, codes: vec![0; n * stride], scales: Vec::with_capacity(n), sums: Vec::with_capacity(n) };
        for (i, row) in rows.enumerate() {
            let (scale, sum) = encode_row(row, &mut b.codes[i * stride..i * stride + dim]);
            b.scales.push(scale);
            b.sums.push(sum);
        }
        b
    }

    pub fn len(&self) -> usize {
        self.scales.len()
    }

    pub fn is_empty(&self) -> bool {
        self.scales.is_empty()
    }

    /// The codes of centres `slots` of `cc`, contiguous, in that order (one routing group's
    /// centres: every row routed through the group reads them in turn, from cache).
    pub fn gather(cc: &CentreCodes, slots: &[u32]) -> Self {
        let stride = cc.stride;
        let mut b = QuantBlock { stride, codes: Vec::with_capacity(slots.len() * stride), scales: Vec::with_capacity(slots.len()),
                                 sums: Vec::with_capacity(slots.len()) };
        for &s in slots {
            let s = s as usize;
            b.codes.extend_from_slice(&cc.codes[s * stride..(s + 1) * stride]);
            b.scales.push(cc.scales[s]);
            b.sums.push(cc.sums[s]);
        }
        b
    }

    /// The approximate score of every row into `out` (as `scan`), through the batched kernel
    /// where there is one; `raw` is scratch.
    pub fn scores_into(&self, q: &QueryCodes, raw: &mut Vec<i32>, out: &mut Vec<f32>) {
        assert_eq!(q.codes.len(), self.stride, "query and block were quantised for different dims");
        out.clear();
        let Some(dots) = q.kernel.dots else {
            self.scan(q, |_, s| out.push(s));
            return;
        };
        raw.clear();
        raw.resize(self.len(), 0);
        // SAFETY: `dots` was chosen for this CPU by `QueryCodes::new`; the query is `stride`
        // long (asserted), a multiple of 64, and the block holds `len()` rows of `stride`.
        unsafe { dots(&q.codes, &self.codes, raw) };
        let off = q.kernel.offset;
        // Plain arrays in step: the loop vectorises.
        out.extend(raw.iter().zip(&self.sums).zip(&self.scales).map(|((&d, &sum), &sc)| (d - off * sum) as f32 * q.scale * sc));
    }

    /// Call `f(i, approx_score)` for every row, in order.
    #[inline]
    pub fn scan(&self, q: &QueryCodes, mut f: impl FnMut(usize, f32)) {
        // The kernel reads `stride` bytes of both; a query of another dimension would read
        // past the row, so this is a hard check (once per block, not per row).
        assert_eq!(q.codes.len(), self.stride, "query and block were quantised for different dims");
        let Kernel { dot, offset, .. } = q.kernel;
        for i in 0..self.len() {
            let row = &self.codes[i * self.stride..(i + 1) * self.stride];
            // SAFETY: `kernel` was chosen for this CPU by `QueryCodes::new`; both slices are
            // `stride` long, a multiple of 64.
            let raw = unsafe { dot(&q.codes, row) } - offset * self.sums[i];
            f(i, raw as f32 * q.scale * self.scales[i]);
        }
    }
}

/// `v` rounded to the nearest integer (ties to even) and clamped to [-127, 127].
///
/// Adding and subtracting 1.5 * 2^23 rounds any |v| < 2^22 in plain float arithmetic, which
/// LLVM vectorises; `f32::round` is a libm call per element (a fifth of a 200k-row query's
/// instructions went to it). The error bounds allow either rounding of ties.
#[inline(always)]
fn round_code(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    let v = v.clamp(-127.0, 127.0);
    (v + MAGIC) - MAGIC
}

/// Codes of one row into `dst` (`row.len()` bytes): returns (scale, sum of codes).
fn encode_row(row: &[f32], dst: &mut [i8]) -> (f32, i32) {
    // Eight running maxima (exact in any order; one chain of dependent maxes was most of the
    // cost of re-encoding a centre, which every touched cluster pays).
    let mut lanes = [0.0f32; 8];
    let chunks = row.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for j in 0..8 {
            lanes[j] = lanes[j].max(c[j].abs());
        }
    }
    let amax = tail.iter().fold(lanes.iter().fold(0.0f32, |m, &x| m.max(x)), |m, &x| m.max(x.abs()));
    let scale = amax / 127.0;
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    let mut sum = 0i32;
    for (c, &x) in dst.iter_mut().zip(row) {
        let v = round_code(x * inv) as i8;
        *c = v;
        sum += v as i32;
    }
    (scale, sum)
}

/// int8 codes of the cluster centres, one row per slot, kept in step with the f32 centre
/// matrix (every write of a centre row re-encodes it: 384 multiplies).
///
/// Why: stage 1 scores every centre. At 1,000+ clusters the f32 matrix (1.6 MB) outgrows
/// L2 and its scan runs at cache bandwidth (~27 us of a 35 us query at 200k memories); the
/// codes are a quarter of that. Each approximate score comes with a rigorous error bound, so
/// the caller can prove which centres are the true best (`search::probe`) and the probe is
/// exactly the one the f32 scan would choose.
pub struct CentreCodes {
    dim: usize,
    stride: usize,
    codes: Vec<i8>,
    scales: Vec<f32>,
    sums: Vec<i32>,
    /// L1 norm of each centre (its share of the error bound).
    l1: Vec<f32>,
}

impl CentreCodes {
    pub fn new(dim: usize) -> Self {
        CentreCodes { dim, stride: padded(dim), codes: Vec::new(), scales: Vec::new(), sums: Vec::new(), l1: Vec::new() }
    }

    /// The codes of every row of `centres` (rows x `dim`), slot = row.
    pub fn from_rows(centres: &[f32], dim: usize) -> Self {
        let mut cc = CentreCodes::new(dim);
        for (s, row) in centres.chunks_exact(dim.max(1)).enumerate() {
            cc.set(s, row);
        }
        cc
    }

    pub fn len(&self) -> usize {
        self.scales.len()
    }

    pub fn is_empty(&self) -> bool {
        self.scales.is_empty()
    }

    /// Encode `row` as slot `s` (growing by zero rows up to `s` when needed).
    pub fn set(&mut self, s: usize, row: &[f32]) {
        debug_assert_eq!(row.len(), self.dim);
        if s >= self.len() {
            self.codes.resize((s + 1) * self.stride, 0);
            self.scales.resize(s + 1, 0.0);
            self.sums.resize(s + 1, 0);
            self.l1.resize(s + 1, 0.0);
        }
        let (scale, sum) = encode_row(row, &mut self.codes[s * self.stride..s * self.stride + self.dim]);
        self.scales[s] = scale;
        self.sums[s] = sum;
        // In f64 lanes (the f32 chain in order cost as much as the encoding; this is the more
        // exact of the two, and the bound's slack covers either).
        self.l1[s] = crate::kernels::sum_lanes(row, |x: f32| x.abs() as f64) as f32;
    }

    /// Keep the first `n` slots.
    pub fn truncate(&mut self, n: usize) {
        self.codes.truncate(n * self.stride);
        self.scales.truncate(n);
        self.sums.truncate(n);
        self.l1.truncate(n);
    }

    /// Call `f(slot, approx, bound)` for the slots `valid` accepts: `|exact - approx| <=
    /// bound`, where exact is the f32 dot product of `q` (the query `qc` encodes) and the
    /// centre.
    ///
    /// The bound: with q = s_q q^ + dq and c = s_c c^ + dc (|dq_i| <= s_q / 2, |dc_i| <=
    /// s_c / 2), exact - approx = sum dq c + sum q dc - sum dq dc, so |.| <= s_q/2 |c|_1 +
    /// s_c/2 |q|_1 + dim s_q s_c / 4; a slack of 2e-4 covers the f32 rounding of both sides.
    #[inline]
    pub fn scan_bounded(&self, qc: &QueryCodes, q_l1: f32, valid: impl Fn(usize) -> bool, mut f: impl FnMut(usize, f32, f32)) {
        assert_eq!(qc.codes.len(), self.stride, "query and centres were quantised for different dims");
        let Kernel { dot, offset, .. } = qc.kernel;
        let half_q = 0.5 * qc.scale;
        let per_scale = 0.5 * q_l1 + 0.25 * self.dim as f32 * qc.scale;
        for s in 0..self.len() {
            if !valid(s) {
                continue;
            }
            let row = &self.codes[s * self.stride..(s + 1) * self.stride];
            // SAFETY: `kernel` was chosen for this CPU by `QueryCodes::new`; both slices are
            // `stride` long, a multiple of 64.
            let raw = unsafe { dot(&qc.codes, row) } - offset * self.sums[s];
            let approx = raw as f32 * qc.scale * self.scales[s];
            f(s, approx, half_q * self.l1[s] + self.scales[s] * per_scale + 2e-4);
        }
    }
}

type DotU8I8 = unsafe fn(&[u8], &[i8]) -> i32;
/// (query codes, contiguous code rows, out): the raw dot of the query with each row.
type DotsU8I8 = unsafe fn(&[u8], &[i8], &mut [i32]);

/// A dot kernel over (query codes, row codes) and what to subtract per unit of the row's code
/// sum to get the signed dot product: 128 for kernels that multiply the offset codes as they
/// are, 0 for one that removes the offset itself. `simd`: a VNNI or AVX2 kernel, not the
/// portable loop (`fast_kernel`).
#[derive(Clone, Copy)]
pub struct Kernel {
    dot: DotU8I8,
    /// Several rows at once, sharing the query's loads and one reduction per four rows
    /// (`dots_vnni`); None where only `dot` exists.
    dots: Option<DotsU8I8>,
    offset: i32,
    simd: bool,
}

/// A query encoded for `QuantBlock::scan`, with the dot kernel picked for this CPU.
pub struct QueryCodes {
    codes: Vec<u8>,
    scale: f32,
    kernel: Kernel,
}

impl QueryCodes {
    pub fn new(q: &[f32]) -> Self {
        let stride = padded(q.len());
        let amax = q.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
        let scale = amax / 127.0;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        let mut codes = vec![128u8; stride];
        for (c, &x) in codes.iter_mut().zip(q) {
            *c = (round_code(x * inv) as i32 + 128) as u8;
        }
        QueryCodes { codes, scale, kernel: pick_kernel() }
    }
}

/// The dot kernel for this CPU, chosen once per process (a query pays no detection or
/// environment lookup).
fn pick_kernel() -> Kernel {
    static KERNEL: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
    *KERNEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if vnni_usable() {
                return Kernel { dot: dot_vnni, dots: Some(dots_vnni), offset: 128, simd: true };
            }
            if avx2_usable() {
                return Kernel { dot: dot_avx2_signed, dots: None, offset: 0, simd: true };
            }
        }
        Kernel { dot: dot_portable, dots: None, offset: 128, simd: false }
    })
}

/// True where the int8 kernel is a SIMD one (VNNI, or AVX2 without it): only then is the
/// int8 pre-scan of the centres cheaper than the f32 scan (the portable loop is not).
pub fn fast_kernel() -> bool {
    pick_kernel().simd
}

/// True where the int8 kernel scores many rows per call (`dots_vnni`): batched routing
/// against centre codes pays off only then.
pub fn batch_kernel() -> bool {
    pick_kernel().dots.is_some()
}

/// `CLAG_FAST_NO_INT8_AVX2` turns the AVX2 int8 kernel off (benchmarks compare both).
#[cfg(target_arch = "x86_64")]
fn avx2_usable() -> bool {
    is_x86_feature_detected!("avx2") && std::env::var_os("CLAG_FAST_NO_INT8_AVX2").is_none()
}

#[cfg(target_arch = "x86_64")]
fn vnni_usable() -> bool {
    is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("avx512bw")
        && std::env::var_os("CLAG_FAST_NO_AVX512").is_none()
}

/// Plain loop (LLVM vectorises it with pmaddwd on AVX2 machines).
///
/// # Safety
/// Safe for any equally long slices; `unsafe` only to share the kernel's signature.
pub unsafe fn dot_portable(a: &[u8], b: &[i8]) -> i32 {
    a.iter().zip(b).map(|(&x, &y)| x as i32 * y as i32).sum()
}

/// The signed dot product `sum((a - 128) * b)` of offset query codes `a` and row codes `b`.
///
/// `vpmaddubsw` multiplies u8 by i8 and adds pairs into a saturating i16; with the offset
/// codes as they are a pair can reach 2 * 255 * 127 and saturate. With q = a - 128 it takes
/// |q| (u8) and sign(q) * b (i8) instead, whose pairs stay within 2 * 127 * 127 < 2^15, so
/// the sum is exact (the same trick as llama.cpp's q8 dot products on AVX2).
///
/// # Safety
/// The CPU must support AVX2; both slices must have the same length, a multiple of 32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub unsafe fn dot_avx2_signed(a: &[u8], b: &[i8]) -> i32 {
    use std::arch::x86_64::*;
    debug_assert!(a.len() == b.len() && a.len().is_multiple_of(32));
    let flip = _mm256_set1_epi8(i8::MIN);
    let ones = _mm256_set1_epi16(1);
    let n = a.len() / 32;
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    // A macro, not a closure: a closure would not inherit this function's target features.
    macro_rules! step {
        ($acc:expr, $i:expr) => {{
            let q = _mm256_xor_si256(_mm256_loadu_si256(pa.add($i * 32) as *const _), flip);
            let y = _mm256_loadu_si256(pb.add($i * 32) as *const _);
            let p = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(y, q));
            _mm256_add_epi32($acc, _mm256_madd_epi16(p, ones))
        }};
    }
    let mut acc0 = _mm256_setzero_si256();
    let mut acc1 = _mm256_setzero_si256();
    let mut i = 0;
    while i + 2 <= n {
        acc0 = step!(acc0, i);
        acc1 = step!(acc1, i + 1);
        i += 2;
    }
    if i < n {
        acc0 = step!(acc0, i);
    }
    let acc = _mm256_add_epi32(acc0, acc1);
    let s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// # Safety
/// The CPU must support AVX-512 F/BW/VNNI; both slices must have the same length, a
/// multiple of 64.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn dot_vnni(a: &[u8], b: &[i8]) -> i32 {
    use std::arch::x86_64::*;
    debug_assert!(a.len() == b.len() && a.len().is_multiple_of(64));
    let mut acc0 = _mm512_setzero_si512();
    let mut acc1 = _mm512_setzero_si512();
    let n = a.len() / 64;
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut i = 0;
    while i + 2 <= n {
        let x0 = _mm512_loadu_si512(pa.add(i * 64) as *const _);
        let y0 = _mm512_loadu_si512(pb.add(i * 64) as *const _);
        let x1 = _mm512_loadu_si512(pa.add(i * 64 + 64) as *const _);
        let y1 = _mm512_loadu_si512(pb.add(i * 64 + 64) as *const _);
        acc0 = _mm512_dpbusd_epi32(acc0, x0, y0);
        acc1 = _mm512_dpbusd_epi32(acc1, x1, y1);
        i += 2;
    }
    if i < n {
        let x0 = _mm512_loadu_si512(pa.add(i * 64) as *const _);
        let y0 = _mm512_loadu_si512(pb.add(i * 64) as *const _);
        acc0 = _mm512_dpbusd_epi32(acc0, x0, y0);
    }
    _mm512_reduce_add_epi32(_mm512_add_epi32(acc0, acc1))
}

/// `out[i] = dot(a, rows[i * a.len()..][..a.len()])` for every row, four rows at a time: one
/// load of the query per 64 bytes feeds four `vpdpbusd`, and the four sums are reduced
/// together, where `dot_vnni` pays a call and a reduction for every row (with the same
/// rescoring, routing `coarse_timing`'s rows took 28.8 ms through it against 24.3 ms through
/// this kernel: BENCHMARKS.md, Ingest).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VNNI; `a.len()` is a multiple of 64 and `rows.len() ==
/// out.len() * a.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn dots_vnni(a: &[u8], rows: &[i8], out: &mut [i32]) {
    use std::arch::x86_64::*;
    let stride = a.len();
    debug_assert!(stride.is_multiple_of(64) && rows.len() == out.len() * stride);
    let chunks = stride / 64;
    let (pa, pr) = (a.as_ptr(), rows.as_ptr());
    let mut i = 0;
    while i + 4 <= out.len() {
        let p = pr.add(i * stride);
        let (mut a0, mut a1, mut a2, mut a3) =
            (_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512());
        for c in 0..chunks {
            let x = _mm512_loadu_si512(pa.add(c * 64) as *const _);
            a0 = _mm512_dpbusd_epi32(a0, x, _mm512_loadu_si512(p.add(c * 64) as *const _));
            a1 = _mm512_dpbusd_epi32(a1, x, _mm512_loadu_si512(p.add(stride + c * 64) as *const _));
            a2 = _mm512_dpbusd_epi32(a2, x, _mm512_loadu_si512(p.add(2 * stride + c * 64) as *const _));
            a3 = _mm512_dpbusd_epi32(a3, x, _mm512_loadu_si512(p.add(3 * stride + c * 64) as *const _));
        }
        // Transpose-add: each 128-bit lane of `u` holds the four rows' partial sums in order,
        // then the four lanes are added.
        let t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(a0, a1), _mm512_unpackhi_epi32(a0, a1));
        let t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(a2, a3), _mm512_unpackhi_epi32(a2, a3));
        let u = _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
        let h = _mm256_add_epi32(_mm512_castsi512_si256(u), _mm512_extracti64x4_epi64(u, 1));
        let r = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
        _mm_storeu_si128(out.as_mut_ptr().add(i) as *mut __m128i, r);
        i += 4;
    }
    for (j, o) in out.iter_mut().enumerate().skip(i) {
        *o = dot_vnni(a, &rows[j * stride..(j + 1) * stride]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels;
    use crate::search::tests::data as unit_rows;

    #[test]
    fn kernels_agree_exactly() {
        for len in [64usize, 128, 384, 448] {
            let a: Vec<u8> = (0..len).map(|i| (i * 37 % 256) as u8).collect();
            let b: Vec<i8> = (0..len).map(|i| ((i * 91 % 255) as i32 - 127) as i8).collect();
            let want: i32 = a.iter().zip(&b).map(|(&x, &y)| x as i32 * y as i32).sum();
            assert_eq!(unsafe { dot_portable(&a, &b) }, want);
        }
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx2_kernel_gives_the_signed_dot_exactly() {
        if !is_x86_feature_detected!("avx2") {
            eprintln!("no AVX2 on this CPU: dot_avx2_signed not run");
            return;
        }
        // Extremes included: offset codes 1 and 255 (q = -127, 127) against row codes -127
        // and 127, where an unsigned multiply-add of the offset codes would saturate.
        for len in [32usize, 64, 96, 384, 448] {
            for seed in 0..4usize {
                let a: Vec<u8> = (0..len).map(|i| match (i + seed) % 5 { 0 => 1, 1 => 255, 2 => 128, _ => ((i * 37 + seed * 11) % 255 + 1) as u8 }).collect();
                let b: Vec<i8> = (0..len).map(|i| match (i * 3 + seed) % 4 { 0 => 127, 1 => -127, _ => ((i * 91 % 255) as i32 - 127) as i8 }).collect();
                let want: i32 = a.iter().zip(&b).map(|(&x, &y)| (x as i32 - 128) * y as i32).sum();
                // SAFETY: AVX2 checked above; lengths are multiples of 32.
                assert_eq!(unsafe { dot_avx2_signed(&a, &b) }, want, "len {len} seed {seed}");
            }
        }
    }

    /// The VNNI kernel, on its own so that a CPU without it reports the test as ignored
    /// (never as a pass). It runs by default where the compiler targets VNNI, and with
    /// `cargo test --release -- --include-ignored` on any CPU that has it; asked for on a CPU
    /// without it, it fails rather than pass untested.
    #[test]
    #[cfg(target_arch = "x86_64")]
    #[cfg_attr(
        not(target_feature = "avx512vnni"),
        ignore = "needs AVX-512 VNNI: run `cargo test --release -- --include-ignored` on a CPU that has it"
    )]
    fn vnni_kernel_agrees_exactly() {
        assert!(vnni_usable(), "no AVX-512 VNNI on this CPU: dot_vnni cannot be tested here");
        for len in [64usize, 128, 384, 448] {
            let a: Vec<u8> = (0..len).map(|i| (i * 37 % 256) as u8).collect();
            let b: Vec<i8> = (0..len).map(|i| ((i * 91 % 255) as i32 - 127) as i8).collect();
            let want: i32 = a.iter().zip(&b).map(|(&x, &y)| x as i32 * y as i32).sum();
            // SAFETY: VNNI checked above; lengths are multiples of 64.
            assert_eq!(unsafe { dot_vnni(&a, &b) }, want);
        }
        // The batched kernel: every row count (four at a time, then the rest one by one).
        for (rows, len) in [(1usize, 384usize), (3, 384), (4, 64), (5, 448), (8, 128), (11, 384)] {
            let a: Vec<u8> = (0..len).map(|i| (i * 37 % 256) as u8).collect();
            let b: Vec<i8> = (0..rows * len).map(|i| ((i * 91 % 255) as i32 - 127) as i8).collect();
            let want: Vec<i32> = b.chunks(len).map(|r| a.iter().zip(r).map(|(&x, &y)| x as i32 * y as i32).sum()).collect();
            let mut got = vec![0i32; rows];
            // SAFETY: VNNI checked above; the query is `len` bytes (a multiple of 64), the rows `rows` x `len`.
            unsafe { dots_vnni(&a, &b, &mut got) };
            assert_eq!(got, want, "{rows} rows of {len}");
        }
    }

    /// `scores_into` gives what `scan` gives. It tests the batched kernel only on a CPU that
    /// has one (AVX-512 VNNI); elsewhere both are the row-by-row kernel.
    #[test]
    fn batched_scores_equal_row_by_row_ones() {
        for (dim, n) in [(384usize, 13usize), (100, 4), (64, 1)] {
            let rows = unit_rows(n, dim, 3);
            let q = &unit_rows(1, dim, 4)[..];
            let block = QuantBlock::build(rows.chunks(dim), dim);
            let mut one = vec![];
            block.scan(&QueryCodes::new(q), |_, s| one.push(s));
            let (mut raw, mut all) = (vec![], vec![]);
            block.scores_into(&QueryCodes::new(q), &mut raw, &mut all);
            assert_eq!(all, one, "dim {dim}");
        }
    }

    #[test]
    fn approximate_scores_track_exact_ones() {
        for dim in [3usize, 64, 100, 384] {
            let rows = unit_rows(200, dim, 7);
            let q = &unit_rows(1, dim, 8)[..];
            let block = QuantBlock::build(rows.chunks(dim), dim);
            assert_eq!(block.len(), 200);
            let mut n = 0;
            block.scan(&QueryCodes::new(q), |i, s| {
                let exact = kernels::dot(q, &rows[i * dim..(i + 1) * dim]);
                assert!((s - exact).abs() < 0.02, "dim {dim} row {i}: {s} vs {exact}");
                n += 1;
            });
            assert_eq!(n, 200);
        }
    }

    #[test]
    fn zero_rows_and_queries_score_zero() {
        let dim = 70;
        let mut rows = unit_rows(3, dim, 1);
        rows[dim..2 * dim].fill(0.0);
        let block = QuantBlock::build(rows.chunks(dim), dim);
        let mut got = vec![];
        block.scan(&QueryCodes::new(&vec![0.0; dim]), |_, s| got.push(s));
        assert_eq!(got, vec![0.0; 3]);
        block.scan(&QueryCodes::new(&rows[..dim]), |i, s| {
            if i == 1 {
                assert_eq!(s, 0.0);
            }
        });
    }
}
