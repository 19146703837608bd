//! The inner loops, one per instruction set, and the only unsafe code of the engine.
//!
//! Each x86 function is compiled for its target features and reads through raw pointers. Both
//! are sound for the same two reasons, checked by the safe dispatchers at the bottom of this
//! module: the dispatchers are reached only through a [`crate::Cpu`], which is built only for an
//! [`Isa`] the running CPU reports, and they assert every slice's length before entering.
//!
//! The int8 dot follows GGML's trick for signed × signed bytes with `maddubs` (which wants
//! unsigned × signed): take `|w|`, move `w`'s sign onto `a`, and multiply. Quantization never
//! produces −128, so each pair sum is at most 2 × 127 × 127 and fits in 16 bits.

use half::f16;

use crate::q8::QK8;

/// The instruction set the kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust; the reference the others are tested against.
    Scalar,
    /// 128-bit integer (SSSE3) dot products, 256-bit float with FMA: CPUs with AVX and FMA but
    /// no AVX2.
    Avx,
    /// 256-bit integer dot products with FMA.
    Avx2,
}

impl Isa {
    /// The best the running CPU supports.
    pub fn detect() -> Self {
        [Isa::Avx2, Isa::Avx]
            .into_iter()
            .find(|isa| isa.available())
            .unwrap_or(Isa::Scalar)
    }

    /// Whether the running CPU supports it.
    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx => {
                is_x86_feature_detected!("avx")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("ssse3")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Its name in settings and logs: `scalar`, `avx` or `avx2`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx => "avx",
            Isa::Avx2 => "avx2",
        }
    }

    /// Reads a name written by [`Isa::name`].
    pub fn from_name(name: &str) -> Option<Self> {
        [Isa::Scalar, Isa::Avx, Isa::Avx2]
            .into_iter()
            .find(|isa| isa.name().eq_ignore_ascii_case(name))
    }
}

/// A weight row in int8 blocks: bytes and scales.
pub(crate) type Q8Row<'a> = (&'a [i8], &'a [f32]);
/// A weight row in 4-bit blocks: nibbles, scales and minimums.
pub(crate) type Q4Row<'a> = (&'a [u8], &'a [f32], &'a [f32]);
/// An activation row: bytes, scales, and per-block `scale × Σ bytes`.
pub(crate) type ActRow<'a> = (&'a [i8], &'a [f32], &'a [f32]);

fn check_acts<const N: usize>(blocks: usize, a: &[ActRow<'_>; N]) {
    for (qs, scales, sums) in a {
        assert_eq!(qs.len(), blocks * QK8, "activation row length");
        assert_eq!(scales.len(), blocks, "activation scales");
        assert_eq!(sums.len(), blocks, "activation sums");
    }
}

/// `W × N` int8 dot products of `W` weight rows against `N` activation rows:
/// `Σ_blocks (Σ w·a) × w_scale × a_scale`. Every output accumulates its blocks in order into
/// its own accumulator, so the result of a pair does not depend on `W`, `N` or the other rows.
#[allow(unsafe_code)]
pub(crate) fn dot_q8<const W: usize, const N: usize>(
    isa: Isa,
    w: [Q8Row<'_>; W],
    a: [ActRow<'_>; N],
) -> [[f32; N]; W] {
    let blocks = w.first().map_or(0, |w| w.1.len());
    for (qs, scales) in &w {
        assert_eq!(scales.len(), blocks, "weight scales");
        assert_eq!(qs.len(), blocks * QK8, "weight row length");
    }
    check_acts(blocks, &a);
    match isa {
        // SAFETY: `isa` came from a `Cpu`, which exists only where `Isa::available` holds; the
        // lengths were asserted above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::dot_q8_avx2(w, a) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx => unsafe { x86::dot_q8_avx(w, a) },
        _ => dot_q8_scalar(w, a),
    }
}

/// `W × N` dot products of 4-bit weight rows against activation rows:
/// `Σ_blocks (Σ nibble·a) × w_scale × a_scale + w_min × a_sum`; ordered as [`dot_q8`].
#[allow(unsafe_code)]
pub(crate) fn dot_q4<const W: usize, const N: usize>(
    isa: Isa,
    w: [Q4Row<'_>; W],
    a: [ActRow<'_>; N],
) -> [[f32; N]; W] {
    let blocks = w.first().map_or(0, |w| w.1.len());
    for (nibbles, scales, mins) in &w {
        assert_eq!(scales.len(), blocks, "weight scales");
        assert_eq!(mins.len(), blocks, "weight minimums");
        assert_eq!(nibbles.len(), blocks * QK8 / 2, "weight row length");
    }
    check_acts(blocks, &a);
    match isa {
        // SAFETY: as in `dot_q8`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::dot_q4_avx2(w, a) },
        // SAFETY: as in `dot_q8`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx => unsafe { x86::dot_q4_avx(w, a) },
        _ => dot_q4_scalar(w, a),
    }
}

/// `Σ a·b` over `f32`s of equal length.
pub(crate) fn dot_f32(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot of unequal lengths");
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa` came from a `Cpu` (AVX and FMA present in both cases); equal lengths
        // asserted above.
        #[allow(unsafe_code)]
        Isa::Avx2 | Isa::Avx => unsafe { x86::dot_f32(a, b) },
        _ => a.iter().zip(b).map(|(x, y)| x * y).sum(),
    }
}

/// The shape of grouped-query attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (`heads` is a multiple of it).
    pub kv_heads: usize,
    /// Values per head.
    pub head_dim: usize,
}

/// Softmax attention of one query over the positions at `offsets` of the half-precision K
/// and V pools (each offset is where a position's `kv_heads × head_dim` values start), into
/// `out` (`heads × head_dim`). `scores` is scratch space.
#[allow(unsafe_code)]
pub(crate) fn attend(
    isa: Isa,
    shape: AttentionShape,
    q: &[f32],
    offsets: &[usize],
    (k_pool, v_pool): (&[f16], &[f16]),
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let kv_dim = shape.kv_heads * shape.head_dim;
    assert!(
        shape.kv_heads > 0 && shape.heads.is_multiple_of(shape.kv_heads),
        "heads per group"
    );
    assert_eq!(q.len(), shape.heads * shape.head_dim, "query length");
    assert_eq!(out.len(), q.len(), "output length");
    assert_eq!(k_pool.len(), v_pool.len(), "pool lengths");
    assert!(
        offsets.iter().all(|o| o + kv_dim <= k_pool.len()),
        "offsets inside the pools"
    );
    match isa {
        // SAFETY: `isa` came from a `Cpu` (AVX, FMA and F16C present); every slice taken
        // below is inside the lengths asserted above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx => unsafe {
            x86::attend(shape, q, offsets, (k_pool, v_pool), scores, out)
        },
        _ => attend_with(
            shape,
            q,
            offsets,
            (k_pool, v_pool),
            scores,
            out,
            |a, b| a.iter().zip(b).map(|(x, y)| x * y.to_f32()).sum(),
            |alpha, x, y| {
                for (y, x) in y.iter_mut().zip(x) {
                    *y += alpha * x.to_f32();
                }
            },
        ),
    }
}

/// [`attend`] over given dot and axpy: each key and value row is read once for all the query
/// heads of its group.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_with(
    shape: AttentionShape,
    q: &[f32],
    offsets: &[usize],
    (k_pool, v_pool): (&[f16], &[f16]),
    scores: &mut Vec<f32>,
    out: &mut [f32],
    dot: impl Fn(&[f32], &[f16]) -> f32,
    axpy: impl Fn(f32, &[f16], &mut [f32]),
) {
    let hd = shape.head_dim;
    let group = shape.heads / shape.kv_heads;
    let n = offsets.len();
    let scale = 1.0 / (hd as f32).sqrt();
    scores.clear();
    scores.resize(group * n, 0.0);
    out.fill(0.0);
    for g in 0..shape.kv_heads {
        for (j, at) in offsets.iter().enumerate() {
            let k = &k_pool[at + g * hd..at + (g + 1) * hd];
            for h in 0..group {
                let head = g * group + h;
                scores[h * n + j] = dot(&q[head * hd..(head + 1) * hd], k) * scale;
            }
        }
        for h in 0..group {
            let s = &mut scores[h * n..(h + 1) * n];
            let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0;
            for v in s.iter_mut() {
                *v = (*v - max).exp();
                sum += *v;
            }
            let inverse = 1.0 / sum;
            for v in s.iter_mut() {
                *v *= inverse;
            }
        }
        for (j, at) in offsets.iter().enumerate() {
            let v = &v_pool[at + g * hd..at + (g + 1) * hd];
            for h in 0..group {
                let head = g * group + h;
                axpy(scores[h * n + j], v, &mut out[head * hd..(head + 1) * hd]);
            }
        }
    }
}

/// `y += alpha · x`.
pub(crate) fn axpy_f32(isa: Isa, alpha: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy of unequal lengths");
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `dot_f32`.
        #[allow(unsafe_code)]
        Isa::Avx2 | Isa::Avx => unsafe { x86::axpy_f32(alpha, x, y) },
        _ => {
            for (y, x) in y.iter_mut().zip(x) {
                *y += alpha * x;
            }
        }
    }
}

fn dot_q8_scalar<const W: usize, const N: usize>(
    w: [Q8Row<'_>; W],
    a: [ActRow<'_>; N],
) -> [[f32; N]; W] {
    let mut out = [[0.0f32; N]; W];
    for (k, (qs, scales)) in w.iter().enumerate() {
        for (b, w_scale) in scales.iter().enumerate() {
            let wb = &qs[b * QK8..(b + 1) * QK8];
            for (i, (a_qs, a_scales, _)) in a.iter().enumerate() {
                let ab = &a_qs[b * QK8..(b + 1) * QK8];
                let sum: i32 = wb
                    .iter()
                    .zip(ab)
                    .map(|(w, a)| i32::from(*w) * i32::from(*a))
                    .sum();
                out[k][i] += sum as f32 * (w_scale * a_scales[b]);
            }
        }
    }
    out
}

fn dot_q4_scalar<const W: usize, const N: usize>(
    w: [Q4Row<'_>; W],
    a: [ActRow<'_>; N],
) -> [[f32; N]; W] {
    let mut out = [[0.0f32; N]; W];
    let half = QK8 / 2;
    for (k, (nibbles, scales, mins)) in w.iter().enumerate() {
        for b in 0..scales.len() {
            let bytes = &nibbles[b * half..(b + 1) * half];
            for (i, (a_qs, a_scales, a_sums)) in a.iter().enumerate() {
                let ab = &a_qs[b * QK8..(b + 1) * QK8];
                let sum: i32 = (0..half)
                    .map(|j| {
                        i32::from(bytes[j] & 0x0f) * i32::from(ab[j])
                            + i32::from(bytes[j] >> 4) * i32::from(ab[j + half])
                    })
                    .sum();
                out[k][i] += sum as f32 * (scales[b] * a_scales[b]) + mins[b] * a_sums[b];
            }
        }
    }
    out
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86 {
    use std::arch::x86_64::*;

    use half::f16;

    use super::{ActRow, Q4Row, Q8Row};
    use crate::q8::QK8;

    #[target_feature(enable = "avx")]
    fn sum_lanes(v: __m256) -> f32 {
        let pair = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        sum_lanes_128(pair)
    }

    #[target_feature(enable = "avx")]
    fn sum_lanes_128(v: __m128) -> f32 {
        let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 1)))
    }

    /// # Safety
    /// AVX2 and FMA present; every weight row `blocks × QK8` bytes with `blocks` scales, every
    /// activation row likewise (`blocks` taken from the first weight row).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_q8_avx2<const W: usize, const N: usize>(
        w: [Q8Row<'_>; W],
        a: [ActRow<'_>; N],
    ) -> [[f32; N]; W] {
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); N]; W];
        let blocks = w.first().map_or(0, |w| w.1.len());
        for b in 0..blocks {
            // SAFETY: `b < blocks`, so `b * QK8 + 32` is within every row (caller's contract).
            unsafe {
                for k in 0..W {
                    let wv = _mm256_loadu_si256(w[k].0.as_ptr().add(b * QK8).cast());
                    let w_abs = _mm256_sign_epi8(wv, wv);
                    let w_scale = *w[k].1.get_unchecked(b);
                    for i in 0..N {
                        let av = _mm256_loadu_si256(a[i].0.as_ptr().add(b * QK8).cast());
                        let pairs = _mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(av, wv));
                        let sums = _mm256_madd_epi16(pairs, ones);
                        let scale = _mm256_set1_ps(w_scale * *a[i].1.get_unchecked(b));
                        acc[k][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc[k][i]);
                    }
                }
            }
        }
        let mut out = [[0.0; N]; W];
        for k in 0..W {
            for i in 0..N {
                out[k][i] = sum_lanes(acc[k][i]);
            }
        }
        out
    }

    /// # Safety
    /// AVX, FMA and SSSE3 present; lengths as for [`dot_q8_avx2`].
    #[target_feature(enable = "avx,fma,ssse3")]
    pub(super) unsafe fn dot_q8_avx<const W: usize, const N: usize>(
        w: [Q8Row<'_>; W],
        a: [ActRow<'_>; N],
    ) -> [[f32; N]; W] {
        let ones = _mm_set1_epi16(1);
        let mut acc = [[_mm_setzero_ps(); N]; W];
        let blocks = w.first().map_or(0, |w| w.1.len());
        for b in 0..blocks {
            // SAFETY: as in `dot_q8_avx2`; two 16-byte halves of each 32-byte block.
            unsafe {
                for k in 0..W {
                    let p = w[k].0.as_ptr().add(b * QK8);
                    let w_lo = _mm_loadu_si128(p.cast());
                    let w_hi = _mm_loadu_si128(p.add(16).cast());
                    let abs_lo = _mm_sign_epi8(w_lo, w_lo);
                    let abs_hi = _mm_sign_epi8(w_hi, w_hi);
                    let w_scale = *w[k].1.get_unchecked(b);
                    for i in 0..N {
                        let q = a[i].0.as_ptr().add(b * QK8);
                        let a_lo = _mm_loadu_si128(q.cast());
                        let a_hi = _mm_loadu_si128(q.add(16).cast());
                        let lo = _mm_madd_epi16(
                            _mm_maddubs_epi16(abs_lo, _mm_sign_epi8(a_lo, w_lo)),
                            ones,
                        );
                        let hi = _mm_madd_epi16(
                            _mm_maddubs_epi16(abs_hi, _mm_sign_epi8(a_hi, w_hi)),
                            ones,
                        );
                        let scale = _mm_set1_ps(w_scale * *a[i].1.get_unchecked(b));
                        acc[k][i] =
                            _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_add_epi32(lo, hi)), scale, acc[k][i]);
                    }
                }
            }
        }
        let mut out = [[0.0; N]; W];
        for k in 0..W {
            for i in 0..N {
                out[k][i] = sum_lanes_128(acc[k][i]);
            }
        }
        out
    }

    /// # Safety
    /// AVX2 and FMA present; every weight row `blocks × 16` nibble bytes with `blocks` scales
    /// and minimums; activation rows as for [`dot_q8_avx2`].
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_q4_avx2<const W: usize, const N: usize>(
        w: [Q4Row<'_>; W],
        a: [ActRow<'_>; N],
    ) -> [[f32; N]; W] {
        let low = _mm256_set1_epi8(0x0f);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); N]; W];
        let mut mins = [[0.0f32; N]; W];
        let blocks = w.first().map_or(0, |w| w.1.len());
        for b in 0..blocks {
            // SAFETY: `b < blocks` (caller's contract on every length).
            unsafe {
                for k in 0..W {
                    let bytes = _mm_loadu_si128(w[k].0.as_ptr().add(b * QK8 / 2).cast());
                    // Values 0..16 are the low nibbles, 16..32 the high ones.
                    let q =
                        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes), low);
                    let w_scale = *w[k].1.get_unchecked(b);
                    let w_min = *w[k].2.get_unchecked(b);
                    for i in 0..N {
                        let av = _mm256_loadu_si256(a[i].0.as_ptr().add(b * QK8).cast());
                        let sums = _mm256_madd_epi16(_mm256_maddubs_epi16(q, av), ones);
                        let scale = _mm256_set1_ps(w_scale * *a[i].1.get_unchecked(b));
                        acc[k][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc[k][i]);
                        mins[k][i] += w_min * *a[i].2.get_unchecked(b);
                    }
                }
            }
        }
        let mut out = [[0.0; N]; W];
        for k in 0..W {
            for i in 0..N {
                out[k][i] = sum_lanes(acc[k][i]) + mins[k][i];
            }
        }
        out
    }

    /// # Safety
    /// AVX, FMA and SSSE3 present; lengths as for [`dot_q4_avx2`].
    #[target_feature(enable = "avx,fma,ssse3")]
    pub(super) unsafe fn dot_q4_avx<const W: usize, const N: usize>(
        w: [Q4Row<'_>; W],
        a: [ActRow<'_>; N],
    ) -> [[f32; N]; W] {
        let low = _mm_set1_epi8(0x0f);
        let ones = _mm_set1_epi16(1);
        let mut acc = [[_mm_setzero_ps(); N]; W];
        let mut mins = [[0.0f32; N]; W];
        let blocks = w.first().map_or(0, |w| w.1.len());
        for b in 0..blocks {
            // SAFETY: as in `dot_q4_avx2`.
            unsafe {
                for k in 0..W {
                    let bytes = _mm_loadu_si128(w[k].0.as_ptr().add(b * QK8 / 2).cast());
                    let q_lo = _mm_and_si128(bytes, low);
                    let q_hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low);
                    let w_scale = *w[k].1.get_unchecked(b);
                    let w_min = *w[k].2.get_unchecked(b);
                    for i in 0..N {
                        let q = a[i].0.as_ptr().add(b * QK8);
                        let lo = _mm_madd_epi16(
                            _mm_maddubs_epi16(q_lo, _mm_loadu_si128(q.cast())),
                            ones,
                        );
                        let hi = _mm_madd_epi16(
                            _mm_maddubs_epi16(q_hi, _mm_loadu_si128(q.add(16).cast())),
                            ones,
                        );
                        let scale = _mm_set1_ps(w_scale * *a[i].1.get_unchecked(b));
                        acc[k][i] =
                            _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_add_epi32(lo, hi)), scale, acc[k][i]);
                        mins[k][i] += w_min * *a[i].2.get_unchecked(b);
                    }
                }
            }
        }
        let mut out = [[0.0; N]; W];
        for k in 0..W {
            for i in 0..N {
                out[k][i] = sum_lanes_128(acc[k][i]) + mins[k][i];
            }
        }
        out
    }

    /// # Safety
    /// AVX, FMA and F16C present; slices as asserted by [`super::attend`].
    #[target_feature(enable = "avx,fma,f16c")]
    pub(super) unsafe fn attend(
        shape: super::AttentionShape,
        q: &[f32],
        offsets: &[usize],
        pools: (&[f16], &[f16]),
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        // SAFETY: this function has the features `dot_f16` and `axpy_f16` need, and the
        // closures keep their equal-length contract (head-sized slices).
        super::attend_with(
            shape,
            q,
            offsets,
            pools,
            scores,
            out,
            |a, b| unsafe { dot_f16(a, b) },
            |alpha, x, y| unsafe { axpy_f16(alpha, x, y) },
        )
    }

    /// `Σ a·b` with `b` in half precision.
    ///
    /// # Safety
    /// AVX, FMA and F16C present; `a` and `b` of equal length.
    #[target_feature(enable = "avx,fma,f16c")]
    unsafe fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
        let n = a.len();
        debug_assert_eq!(n, b.len());
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        // SAFETY: every load is at `i + 8 <= n`; f16 is 2 bytes, 8 of them one 128-bit load.
        unsafe {
            while i + 8 <= n {
                let bv = _mm256_cvtph_ps(_mm_loadu_si128(b.as_ptr().add(i).cast()));
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i)), bv, acc);
                i += 8;
            }
        }
        let mut sum = sum_lanes(acc);
        for j in i..n {
            sum += a[j] * b[j].to_f32();
        }
        sum
    }

    /// `y += alpha · x` with `x` in half precision.
    ///
    /// # Safety
    /// AVX, FMA and F16C present; `x` and `y` of equal length.
    #[target_feature(enable = "avx,fma,f16c")]
    unsafe fn axpy_f16(alpha: f32, x: &[f16], y: &mut [f32]) {
        let n = x.len();
        debug_assert_eq!(n, y.len());
        let a = _mm256_set1_ps(alpha);
        let mut i = 0;
        // SAFETY: every access is at `i + 8 <= n`.
        unsafe {
            while i + 8 <= n {
                let yp = y.as_mut_ptr().add(i);
                let xv = _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().add(i).cast()));
                _mm256_storeu_ps(yp, _mm256_fmadd_ps(a, xv, _mm256_loadu_ps(yp)));
                i += 8;
            }
        }
        for j in i..n {
            y[j] += alpha * x[j].to_f32();
        }
    }

    /// # Safety
    /// AVX and FMA present; `a` and `b` of equal length.
    #[target_feature(enable = "avx,fma")]
    pub(super) unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut i = 0;
        // SAFETY: every load is at `i + 8 <= n` or `i + 16 <= n`.
        unsafe {
            while i + 16 <= n {
                acc0 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(a.as_ptr().add(i)),
                    _mm256_loadu_ps(b.as_ptr().add(i)),
                    acc0,
                );
                acc1 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(a.as_ptr().add(i + 8)),
                    _mm256_loadu_ps(b.as_ptr().add(i + 8)),
                    acc1,
                );
                i += 16;
            }
            while i + 8 <= n {
                acc0 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(a.as_ptr().add(i)),
                    _mm256_loadu_ps(b.as_ptr().add(i)),
                    acc0,
                );
                i += 8;
            }
        }
        let mut sum = sum_lanes(_mm256_add_ps(acc0, acc1));
        for j in i..n {
            sum += a[j] * b[j];
        }
        sum
    }

    /// # Safety
    /// AVX and FMA present; `x` and `y` of equal length.
    #[target_feature(enable = "avx,fma")]
    pub(super) unsafe fn axpy_f32(alpha: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len();
        let a = _mm256_set1_ps(alpha);
        let mut i = 0;
        // SAFETY: every access is at `i + 8 <= n`.
        unsafe {
            while i + 8 <= n {
                let yp = y.as_mut_ptr().add(i);
                _mm256_storeu_ps(
                    yp,
                    _mm256_fmadd_ps(a, _mm256_loadu_ps(x.as_ptr().add(i)), _mm256_loadu_ps(yp)),
                );
                i += 8;
            }
        }
        for j in i..n {
            y[j] += alpha * x[j];
        }
    }
}
