//! Bit-level arithmetic on stored values of dtype T: widening, rounding, ulp distance, and the
//! bitwise comparison of a candidate output with a reference output (exactness metrics).

use half::{bf16, f16};
use kernel_registry::report::{Exactness, ULP_BUCKETS, ULP_INFINITE};
use kernel_registry::DType;
use rayon::prelude::*;

/// Raw bits of element `i` of a little-endian buffer of `dt` values (zero-extended).
#[inline]
pub fn bits_at(dt: DType, buf: &[u8], i: usize) -> u32 {
    match dt {
        DType::F32 => u32::from_le_bytes(buf[4 * i..4 * i + 4].try_into().unwrap()),
        DType::Bf16 | DType::F16 => u16::from_le_bytes([buf[2 * i], buf[2 * i + 1]]) as u32,
    }
}

/// Store `bits` as element `i`.
#[inline]
pub fn set_bits(dt: DType, buf: &mut [u8], i: usize, bits: u32) {
    match dt {
        DType::F32 => buf[4 * i..4 * i + 4].copy_from_slice(&bits.to_le_bytes()),
        DType::Bf16 | DType::F16 => {
            buf[2 * i..2 * i + 2].copy_from_slice(&(bits as u16).to_le_bytes())
        }
    }
}

/// Number of elements of `dt` in `buf`.
pub fn len(dt: DType, buf: &[u8]) -> usize {
    buf.len() / dt.size_bytes()
}

/// `f32(.)`: exact widening.
#[inline]
pub fn to_f32(dt: DType, bits: u32) -> f32 {
    match dt {
        DType::F32 => f32::from_bits(bits),
        DType::Bf16 => bf16::from_bits(bits as u16).to_f32(),
        DType::F16 => f16::from_bits(bits as u16).to_f32(),
    }
}

/// `round(.)`: round-to-nearest-even from f32 to `dt`.
#[inline]
pub fn from_f32(dt: DType, v: f32) -> u32 {
    match dt {
        DType::F32 => v.to_bits(),
        DType::Bf16 => bf16::from_f32(v).to_bits() as u32,
        DType::F16 => f16::from_f32(v).to_bits() as u32,
    }
}

/// Round an f64 to `dt` and widen it back (the value a dtype can hold nearest to `v`).
pub fn round_f64(dt: DType, v: f64) -> f32 {
    match dt {
        DType::F32 => v as f32,
        DType::Bf16 => bf16::from_f64(v).to_f32(),
        DType::F16 => f16::from_f64(v).to_f32(),
    }
}

fn sign_mask(dt: DType) -> u32 {
    match dt {
        DType::F32 => 0x8000_0000,
        _ => 0x8000,
    }
}

fn exp_mask(dt: DType) -> u32 {
    match dt {
        DType::F32 => 0x7f80_0000,
        DType::Bf16 => 0x7f80,
        DType::F16 => 0x7c00,
    }
}

#[inline]
pub fn is_nan(dt: DType, bits: u32) -> bool {
    let m = bits & !sign_mask(dt);
    m > exp_mask(dt)
}

#[inline]
pub fn is_inf(dt: DType, bits: u32) -> bool {
    bits & !sign_mask(dt) == exp_mask(dt)
}

/// The ordered-integer image of a value: monotone in the value, +0 and -0 both map to 0,
/// neighbouring representable values differ by 1.
#[inline]
pub fn ordered(dt: DType, bits: u32) -> i64 {
    let s = sign_mask(dt);
    let mag = (bits & !s) as i64;
    if bits & s != 0 {
        -mag
    } else {
        mag
    }
}

/// Ulp distance in `dt`: 0 for equal values (+0 == -0, NaN == NaN); `ULP_INFINITE` for NaN
/// against a number and for an infinity against anything but the same infinity.
#[inline]
pub fn ulp_distance(dt: DType, a: u32, b: u32) -> u64 {
    let (na, nb) = (is_nan(dt, a), is_nan(dt, b));
    if na || nb {
        return if na && nb { 0 } else { ULP_INFINITE };
    }
    if is_inf(dt, a) || is_inf(dt, b) {
        return if a == b { 0 } else { ULP_INFINITE };
    }
    ordered(dt, a).abs_diff(ordered(dt, b))
}

/// `torch.testing.assert_close` default (rtol, atol) for `dt`.
pub fn tolerance(dt: DType) -> (f64, f64) {
    match dt {
        DType::Bf16 => (1.6e-2, 1e-5),
        DType::F16 => (1e-3, 1e-5),
        DType::F32 => (1.3e-6, 1e-5),
    }
}

/// Index of the `ULP_BUCKETS` histogram slot for a distance (one definition, shared with the
/// hub's report checks).
pub use kernel_registry::report::ulp_bucket;

#[derive(Debug, Clone)]
struct Acc {
    elements: u64,
    mismatches: u64,
    max_abs: f64,
    max_rel: f64,
    max_ulp: u64,
    parity: bool,
    close: bool,
    hist: [u64; ULP_BUCKETS.len() + 1],
}

impl Acc {
    fn new() -> Self {
        Acc {
            elements: 0,
            mismatches: 0,
            max_abs: 0.0,
            max_rel: 0.0,
            max_ulp: 0,
            parity: true,
            close: true,
            hist: [0; ULP_BUCKETS.len() + 1],
        }
    }
    /// A finished comparison as an accumulator again (its histogram has `ULP_BUCKETS + 1`
    /// buckets, as `finish` writes it).
    fn of(e: &Exactness) -> Acc {
        let mut hist = [0; ULP_BUCKETS.len() + 1];
        for (h, n) in hist.iter_mut().zip(&e.ulp_histogram) {
            *h = *n;
        }
        Acc {
            elements: e.elements,
            mismatches: e.mismatches,
            max_abs: e.max_abs_diff,
            max_rel: e.max_rel_diff,
            max_ulp: e.max_ulp,
            parity: e.nonfinite_parity,
            close: e.within_tolerance,
            hist,
        }
    }
    fn merge(mut self, o: Acc) -> Acc {
        self.elements += o.elements;
        self.mismatches += o.mismatches;
        self.max_abs = self.max_abs.max(o.max_abs);
        self.max_rel = self.max_rel.max(o.max_rel);
        self.max_ulp = self.max_ulp.max(o.max_ulp);
        self.parity &= o.parity;
        self.close &= o.close;
        for (a, b) in self.hist.iter_mut().zip(o.hist) {
            *a += b;
        }
        self
    }
    #[inline]
    fn push(&mut self, dt: DType, c: u32, r: u32, rtol: f64, atol: f64) {
        self.elements += 1;
        if c == r {
            self.hist[0] += 1;
            return;
        }
        let (cn, rn) = (is_nan(dt, c), is_nan(dt, r));
        if cn && rn {
            self.hist[0] += 1;
            return;
        }
        self.mismatches += 1;
        let d = ulp_distance(dt, c, r);
        self.hist[ulp_bucket(d)] += 1;
        self.max_ulp = self.max_ulp.max(d);
        let (ci, ri) = (is_inf(dt, c), is_inf(dt, r));
        if cn || rn || ci || ri {
            // +-Inf against anything else, or NaN against a number.
            self.parity = false;
            self.close = false;
            return;
        }
        let (cv, rv) = (to_f32(dt, c) as f64, to_f32(dt, r) as f64);
        let abs = (cv - rv).abs();
        self.max_abs = self.max_abs.max(abs);
        if rv != 0.0 {
            self.max_rel = self.max_rel.max(abs / rv.abs());
        }
        if abs > atol + rtol * rv.abs() {
            self.close = false;
        }
    }
    fn finish(self) -> Exactness {
        Exactness {
            elements: self.elements,
            mismatches: self.mismatches,
            mismatch_fraction: if self.elements == 0 {
                0.0
            } else {
                self.mismatches as f64 / self.elements as f64
            },
            max_abs_diff: self.max_abs,
            max_rel_diff: self.max_rel,
            max_ulp: self.max_ulp,
            nonfinite_parity: self.parity,
            within_tolerance: self.close,
            ulp_histogram: self.hist.to_vec(),
        }
    }
}

/// Compare candidate against reference, pairwise over each (candidate, reference) buffer pair
/// (several pairs for ops with several outputs, e.g. fused_add_rms_norm's out and residual).
///
/// Bitwise mismatch counts NaN == NaN as equal and +0 / -0 as different bits (0 ulp). Absolute
/// and relative differences are over pairs where both values are finite (relative: reference
/// non-zero); a NaN or Inf that is not matched breaks `nonfinite_parity` instead. Tolerance is
/// `assert_close`'s default rtol/atol for the dtype with `equal_nan=True`.
pub fn compare(dt: DType, pairs: &[(&[u8], &[u8])]) -> Exactness {
    let (rtol, atol) = tolerance(dt);
    let mut total = Acc::new();
    for (cand, refr) in pairs {
        assert_eq!(
            cand.len(),
            refr.len(),
            "compare: buffers of different sizes"
        );
        let n = len(dt, cand);
        const CHUNK: usize = 1 << 16;
        let acc = (0..n.div_ceil(CHUNK))
            .into_par_iter()
            .map(|k| {
                let mut a = Acc::new();
                let (lo, hi) = (k * CHUNK, ((k + 1) * CHUNK).min(n));
                let es = dt.size_bytes();
                let (cs, rs) = (&cand[lo * es..hi * es], &refr[lo * es..hi * es]);
                if cs == rs {
                    a.elements = (hi - lo) as u64;
                    a.hist[0] = a.elements;
                    return a;
                }
                for i in 0..hi - lo {
                    a.push(dt, bits_at(dt, cs, i), bits_at(dt, rs, i), rtol, atol);
                }
                a
            })
            .reduce(Acc::new, Acc::merge);
        total = total.merge(acc);
    }
    total.finish()
}

/// Several outputs' exactness as one (a backward case's gradients, each compared on its own):
/// what `compare` over all the pairs at once gives, from the parts (`Acc::merge`).
pub fn combine(parts: &[&Exactness]) -> Exactness {
    parts
        .iter()
        .map(|e| Acc::of(e))
        .fold(Acc::new(), Acc::merge)
        .finish()
}

/// Merge exactness of several launches into the worst case (used when launches differ).
pub fn worst(a: Exactness, b: Exactness) -> Exactness {
    if (b.mismatches, b.max_ulp) > (a.mismatches, a.max_ulp) || !b.nonfinite_parity {
        Exactness {
            nonfinite_parity: a.nonfinite_parity && b.nonfinite_parity,
            within_tolerance: a.within_tolerance && b.within_tolerance,
            ..b
        }
    } else {
        Exactness {
            nonfinite_parity: a.nonfinite_parity && b.nonfinite_parity,
            within_tolerance: a.within_tolerance && b.within_tolerance,
            ..a
        }
    }
}

/// Count of elements whose bits differ (NaN == NaN); cheap determinism check.
/// The keyed sum of `kz_keyed_sum_u32` (reference.cu) over `bytes` read as little-endian
/// 32-bit words, a partial last word padded with `pad` (the guard byte that follows a device
/// buffer's payload): sum over i of mix(key, i, word[i]) mod 2^64.
pub fn keyed_sum(bytes: &[u8], key: u64, pad: u8) -> u64 {
    fn mix(key: u64, i: u64, w: u32) -> u64 {
        let mut z = key.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)) ^ u64::from(w);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    // Blocks of words, each summed by a plain loop: 3.6 GB/s against 2.9 with rayon per word
    // (256 MB, two cores of the build machine, `cargo run --release --example keyed_sum_speed`).
    const WORDS: usize = 1 << 14;
    let whole = bytes.len() / 4;
    let mut sum = bytes[..whole * 4]
        .par_chunks(4 * WORDS)
        .enumerate()
        .map(|(b, block)| {
            let first = (b * WORDS) as u64;
            block.chunks_exact(4).enumerate().fold(0u64, |acc, (i, c)| {
                let w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                acc.wrapping_add(mix(key, first + i as u64, w))
            })
        })
        .reduce(|| 0, u64::wrapping_add);
    let tail = &bytes[whole * 4..];
    if !tail.is_empty() {
        let mut w = [pad; 4];
        w[..tail.len()].copy_from_slice(tail);
        sum = sum.wrapping_add(mix(key, whole as u64, u32::from_le_bytes(w)));
    }
    sum
}

pub fn count_bit_differences(dt: DType, a: &[u8], b: &[u8]) -> u64 {
    if a == b {
        return 0;
    }
    let es = dt.size_bytes();
    a.par_chunks(es << 14)
        .zip(b.par_chunks(es << 14))
        .map(|(x, y)| {
            if x == y {
                return 0;
            }
            (0..x.len() / es)
                .filter(|&i| {
                    let (p, q) = (bits_at(dt, x, i), bits_at(dt, y, i));
                    p != q && !(is_nan(dt, p) && is_nan(dt, q))
                })
                .count() as u64
        })
        .sum()
}

#[cfg(test)]
mod tests {

    #[test]
    fn keyed_sum_changes_with_any_word_and_pads_the_tail() {
        let bytes: Vec<u8> = (0..4099u32).map(|i| (i * 37 % 251) as u8).collect();
        let key = 0x1234_5678_9abc_def0;
        let base = keyed_sum(&bytes, key, 0xA5);
        // One changed byte anywhere (the mix is a bijection in the word) changes the sum.
        for i in [0, 1, 2, 3, 4, 2047, 4095, 4096, 4098] {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert_ne!(keyed_sum(&b, key, 0xA5), base, "byte {i}");
        }
        // Another key, another sum; the same key, the same sum.
        assert_ne!(keyed_sum(&bytes, key ^ 1, 0xA5), base);
        assert_eq!(keyed_sum(&bytes, key, 0xA5), base);
        // A partial last word is padded with the guard byte, as the device reads it.
        let mut padded = bytes.clone();
        padded.push(0xA5);
        assert_eq!(keyed_sum(&padded, key, 0x00), base);
        // Word order matters (the index is mixed in): swapping two words changes the sum.
        let mut swapped = bytes.clone();
        swapped[..4].copy_from_slice(&bytes[4..8]);
        swapped[4..8].copy_from_slice(&bytes[..4]);
        assert_ne!(keyed_sum(&swapped, key, 0xA5), base);
    }

    /// The blocked sum is the word-by-word definition (`kz_keyed_sum_u32`'s) at lengths that
    /// span several blocks and end in a partial block and a partial word: fixed known answers
    /// of the definition, written out here one word at a time.
    #[test]
    fn keyed_sum_is_the_word_by_word_definition_across_blocks() {
        fn definition(bytes: &[u8], key: u64, pad: u8) -> u64 {
            let mut sum = 0u64;
            for (i, c) in bytes.chunks(4).enumerate() {
                let mut w = [pad; 4];
                w[..c.len()].copy_from_slice(c);
                let mut z = key.wrapping_add((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                    ^ u64::from(u32::from_le_bytes(w));
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                sum = sum.wrapping_add(z ^ (z >> 31));
            }
            sum
        }
        let key = 0x0bad_cafe_dead_beef;
        for len in [
            0usize,
            3,
            4,
            65_535,
            65_536,
            65_537,
            3 * 65_536 + 7,
            1 << 20,
        ] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 131 % 253) as u8).collect();
            assert_eq!(
                keyed_sum(&bytes, key, 0x5A),
                definition(&bytes, key, 0x5A),
                "{len} bytes"
            );
        }
    }
    use super::*;

    /// `combine` of each output's comparison is the comparison of all the outputs at once.
    #[test]
    fn combining_outputs_equals_comparing_them_together() {
        let dt = DType::Bf16;
        let mk = |vals: &[f32]| -> Vec<u8> {
            let mut b = vec![0u8; vals.len() * 2];
            for (i, &v) in vals.iter().enumerate() {
                set_bits(dt, &mut b, i, from_f32(dt, v));
            }
            b
        };
        let (a, ar) = (
            mk(&[1.0, 2.0, 3.0, 4.0]),
            mk(&[1.0, 2.0078125, 3.0, f32::NAN]),
        );
        let (b, br) = (mk(&[0.5, -1.0]), mk(&[0.5, -1.0078125]));
        let together = compare(dt, &[(&a, &ar), (&b, &br)]);
        let parts = combine(&[&compare(dt, &[(&a, &ar)]), &compare(dt, &[(&b, &br)])]);
        assert_eq!(parts, together);
        assert_eq!(parts.elements, 6);
        assert!(
            parts.mismatches >= 2 && !parts.nonfinite_parity,
            "{parts:?}"
        );
    }
    use proptest::prelude::*;

    fn b16(v: f32) -> u32 {
        from_f32(DType::Bf16, v)
    }

    #[test]
    fn ulp_special_values() {
        let dt = DType::Bf16;
        assert_eq!(ulp_distance(dt, b16(0.0), b16(-0.0)), 0);
        assert_eq!(ulp_distance(dt, 0x7fc0, 0xffc1), 0, "NaN == NaN");
        assert_eq!(ulp_distance(dt, 0x7fc0, b16(1.0)), ULP_INFINITE);
        assert_eq!(
            ulp_distance(dt, b16(f32::INFINITY), b16(3.0e38)),
            ULP_INFINITE
        );
        assert_eq!(
            ulp_distance(dt, b16(f32::INFINITY), b16(f32::NEG_INFINITY)),
            ULP_INFINITE
        );
        assert_eq!(ulp_distance(dt, b16(f32::INFINITY), b16(f32::INFINITY)), 0);
        // Smallest subnormals on either side of zero are 2 ulp apart.
        assert_eq!(ulp_distance(dt, 0x0001, 0x8001), 2);
        assert_eq!(ulp_distance(dt, b16(1.0), b16(1.0078125)), 1);
        assert_eq!(ulp_distance(DType::F16, 0x3c00, 0x3c02), 2);
        assert_eq!(
            ulp_distance(DType::F32, 1.0f32.to_bits(), (-1.0f32).to_bits()),
            2 * 0x3f80_0000
        );
    }

    #[test]
    fn rounding_is_nearest_even() {
        // 1 + 2^-8 lies halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
        assert_eq!(b16(1.0 + 1.0 / 256.0), b16(1.0));
        // 1 + 3*2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even).
        assert_eq!(to_f32(DType::Bf16, b16(1.0 + 3.0 / 256.0)), 1.015625);
        assert_eq!(
            to_f32(DType::F16, from_f32(DType::F16, 65520.0)),
            f32::INFINITY
        );
    }

    #[test]
    fn compare_counts_and_classifies() {
        let dt = DType::Bf16;
        let mk = |vals: &[u32]| -> Vec<u8> {
            let mut v = vec![0u8; vals.len() * 2];
            for (i, &b) in vals.iter().enumerate() {
                set_bits(dt, &mut v, i, b);
            }
            v
        };
        let r = mk(&[b16(1.0), b16(2.0), 0x7fc0, b16(0.0), b16(4.0)]);
        let c = mk(&[b16(1.0), b16(2.015625), 0x7fc1, b16(-0.0), b16(4.0)]);
        let e = compare(dt, &[(&c, &r)]);
        assert_eq!(e.elements, 5);
        assert_eq!(e.mismatches, 2, "2.0 vs next, and +0 vs -0 (bitwise)");
        assert_eq!(e.max_ulp, 1);
        assert!(e.nonfinite_parity);
        assert!((e.max_abs_diff - 0.015625).abs() < 1e-12);
        assert!(e.within_tolerance);
        assert_eq!(e.ulp_histogram[0], 4);
        assert_eq!(e.ulp_histogram[1], 1);
        let c2 = mk(&[b16(1.0), b16(2.0), b16(5.0), b16(0.0), b16(f32::INFINITY)]);
        let e2 = compare(dt, &[(&c2, &r)]);
        assert_eq!(e2.max_ulp, ULP_INFINITE);
        assert!(!e2.nonfinite_parity && !e2.within_tolerance);
        assert_eq!(*e2.ulp_histogram.last().unwrap(), 2);
        assert_eq!(count_bit_differences(dt, &c, &r), 2);
    }

    fn dtype() -> impl Strategy<Value = DType> {
        prop_oneof![Just(DType::Bf16), Just(DType::F16), Just(DType::F32)]
    }

    fn finite_bits(dt: DType) -> impl Strategy<Value = u32> {
        let max = match dt {
            DType::F32 => u32::MAX,
            _ => 0xffff,
        };
        (0..=max).prop_filter("finite", move |b| !is_nan(dt, *b) && !is_inf(dt, *b))
    }

    proptest! {
        #[test]
        fn ulp_is_a_metric_on_finite_values(
            (dt, a, b, c) in dtype().prop_flat_map(|dt| (Just(dt), finite_bits(dt), finite_bits(dt), finite_bits(dt)))
        ) {
            prop_assert_eq!(ulp_distance(dt, a, a), 0);
            prop_assert_eq!(ulp_distance(dt, a, b), ulp_distance(dt, b, a));
            prop_assert!(ulp_distance(dt, a, c) <= ulp_distance(dt, a, b) + ulp_distance(dt, b, c));
            // Zero distance means the same value (only +0/-0 differ in bits).
            if ulp_distance(dt, a, b) == 0 {
                prop_assert_eq!(to_f32(dt, a), to_f32(dt, b));
            }
            // Ordering agrees with the values.
            let (x, y) = (to_f32(dt, a), to_f32(dt, b));
            if x < y { prop_assert!(ordered(dt, a) < ordered(dt, b)); }
        }

        #[test]
        fn next_representable_is_one_ulp((dt, a) in dtype().prop_flat_map(|dt| (Just(dt), finite_bits(dt)))) {
            let x = to_f32(dt, a);
            prop_assume!(x > 0.0);
            let next = a + 1;
            prop_assume!(!is_inf(dt, next));
            prop_assert_eq!(ulp_distance(dt, a, next), 1);
        }

        #[test]
        fn rounding_picks_a_nearest_neighbour((dt, v) in (dtype(), -1.0e4f32..1.0e4f32)) {
            let r = from_f32(dt, v);
            let rv = to_f32(dt, r) as f64;
            // No representable value is strictly closer than the rounded one.
            let err = (rv - v as f64).abs();
            for nb in [r.wrapping_add(1), r.wrapping_sub(1)] {
                if !is_nan(dt, nb) && !is_inf(dt, nb) {
                    prop_assert!(err <= (to_f32(dt, nb) as f64 - v as f64).abs());
                }
            }
            // Round trip of a representable value is exact.
            prop_assert_eq!(from_f32(dt, to_f32(dt, r)), r);
        }
    }
}
