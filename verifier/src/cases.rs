//! The test suite (SPEC section 3): which (dtype, shape, distribution) cases a kernel is run on,
//! and the inputs of each case, drawn from a seed so that any run can be replayed exactly.

use crate::numeric::{from_f32, set_bits};
use kernel_registry::{DType, Op, Semantics};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Bumped whenever the case list, the input distributions or the reference semantics change.
pub const SUITE_VERSION: &str = "2026.2";

/// Input distributions of SPEC section 3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dist {
    Normal,
    LargeScale,
    TinyScale,
    MeanOffset,
    ConstantRows,
    ZeroRows,
    Outliers,
    Subnormal,
    NonFinite,
}

impl Dist {
    pub const ALL_SPECIAL: [Dist; 8] = [
        Dist::LargeScale,
        Dist::TinyScale,
        Dist::MeanOffset,
        Dist::ConstantRows,
        Dist::ZeroRows,
        Dist::Outliers,
        Dist::Subnormal,
        Dist::NonFinite,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            Dist::Normal => "normal",
            Dist::LargeScale => "large_scale",
            Dist::TinyScale => "tiny_scale",
            Dist::MeanOffset => "mean_offset",
            Dist::ConstantRows => "constant_rows",
            Dist::ZeroRows => "zero_rows",
            Dist::Outliers => "outliers",
            Dist::Subnormal => "subnormal",
            Dist::NonFinite => "nonfinite",
        }
    }
}

impl fmt::Display for Dist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One case: everything needed to rebuild its inputs and run it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseSpec {
    pub id: String,
    pub op: Op,
    pub semantics: Semantics,
    pub dtype: DType,
    /// For elementwise ops the tensor is `rows x cols` and the kernel sees `n = rows * cols`.
    pub rows: u64,
    pub cols: u64,
    pub dist: Dist,
    /// Seed of this case's inputs (derived from the run seed and the case id).
    pub seed: u64,
    /// Measure speed (median over launches, L2 flushed) on this case.
    pub measure_speed: bool,
    /// Check batch invariance (sampled rows alone and inside other batches).
    pub check_batch: bool,
}

impl CaseSpec {
    /// The size the kernel's constraints are checked against: cols for row-wise ops, the
    /// element count for elementwise ops.
    pub fn constraint_size(&self) -> u64 {
        if self.op.is_rowwise() {
            self.cols
        } else {
            self.rows * self.cols
        }
    }
    pub fn elements(&self) -> u64 {
        self.rows * self.cols
    }
}

/// The `eps` the norm ops are launched with (HF Llama's default for RMSNorm, nn.LayerNorm's).
pub fn eps(op: Op) -> f32 {
    match op {
        Op::LayerNorm => 1e-5,
        _ => 1e-6,
    }
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A stable 64-bit hash of a string (FNV-1a folded through splitmix), independent of Rust's
/// hasher so seeds replay across builds.
pub fn stable_hash(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    splitmix(h)
}

/// A fresh run seed from the OS.
pub fn fresh_seed() -> u64 {
    rand::thread_rng().gen()
}

/// The (rows, cols, distribution, speed) list of the suite. Shapes: rows 1..32768, cols 64,
/// 127, 1000, 1001 (1000 is a multiple of 8; 127 and 1001 are not), 768, 2048, 4096, 5120, 8192, 16384, 65536.
fn shapes(quick: bool) -> Vec<(u64, u64, Dist, bool)> {
    use Dist::*;
    let mut v: Vec<(u64, u64, Dist, bool)> = if quick {
        vec![
            (1, 64, Normal, false),
            (7, 127, Normal, false),
            (33, 1000, Normal, false),
            (3, 1001, Normal, false),
            (1024, 4096, Normal, false),
            (4096, 8192, Normal, true),
            (4, 65536, Normal, false),
        ]
    } else {
        vec![
            (1, 64, Normal, false),
            (7, 127, Normal, false),
            (33, 1000, Normal, false),
            (3, 1001, Normal, false),
            (256, 768, Normal, false),
            (64, 2048, Normal, false),
            (1024, 4096, Normal, false),
            (128, 5120, Normal, false),
            (4096, 8192, Normal, true),
            (32768, 4096, Normal, true),
            (16, 16384, Normal, false),
            (4, 65536, Normal, false),
        ]
    };
    let specials: &[Dist] = if quick {
        &[NonFinite, MeanOffset, ZeroRows, Subnormal, Outliers]
    } else {
        &Dist::ALL_SPECIAL
    };
    for &d in specials {
        v.push((17, 1000, d, false));
        if !quick {
            v.push((64, 4096, d, false));
        }
    }
    v
}

/// The cases of one run, in order. Every case's seed derives from `run_seed` and its id, so
/// the same seed gives the same inputs.
pub fn suite(
    op: Op,
    semantics: Semantics,
    dtypes: &[DType],
    quick: bool,
    run_seed: u64,
) -> Vec<CaseSpec> {
    let mut out = Vec::new();
    for &dtype in dtypes {
        for (rows, cols, dist, speed) in shapes(quick) {
            let id = format!("{dtype}/{rows}x{cols}/{dist}");
            out.push(CaseSpec {
                seed: splitmix(run_seed ^ stable_hash(&id)),
                id,
                op,
                semantics,
                dtype,
                rows,
                cols,
                dist,
                measure_speed: speed,
                check_batch: dist == Dist::Normal && rows > 1,
            });
        }
    }
    out
}

/// A host tensor: raw little-endian bits of dtype values.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub name: &'static str,
    pub dtype: DType,
    pub bytes: Vec<u8>,
}

impl HostTensor {
    pub fn len(&self) -> usize {
        self.bytes.len() / self.dtype.size_bytes()
    }
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
    pub fn get(&self, i: usize) -> f32 {
        crate::numeric::to_f32(
            self.dtype,
            crate::numeric::bits_at(self.dtype, &self.bytes, i),
        )
    }
}

/// The inputs of one case, in ABI order (outputs are not included).
#[derive(Debug, Clone, PartialEq)]
pub struct CaseInputs {
    /// `x` (for silu_and_mul: `[rows, 2*cols]`, gate first).
    pub x: HostTensor,
    /// fused_add_rms_norm's residual (read and written).
    pub residual: Option<HostTensor>,
    pub weight: Option<HostTensor>,
    pub bias: Option<HostTensor>,
}

fn scale_large(dt: DType) -> f32 {
    match dt {
        DType::F16 => 1.0e3,
        _ => 1.0e15,
    }
}
fn scale_tiny(dt: DType) -> f32 {
    match dt {
        DType::F16 => 1.0e-3,
        _ => 1.0e-15,
    }
}
fn outlier(dt: DType) -> f32 {
    match dt {
        DType::F16 => 3.0e4,
        _ => 1.0e10,
    }
}
fn mean_offset(dt: DType) -> f32 {
    match dt {
        DType::F32 => 1.0e4,
        _ => 1.0e3,
    }
}

/// A random subnormal of `dt` (bits), either sign.
fn subnormal_bits(dt: DType, rng: &mut ChaCha8Rng) -> u32 {
    let (mant_max, sign) = match dt {
        DType::F32 => ((1u32 << 23) - 1, 0x8000_0000u32),
        DType::Bf16 => (0x7f, 0x8000),
        DType::F16 => (0x3ff, 0x8000),
    };
    let m = rng.gen_range(1..=mant_max);
    if rng.gen::<bool>() {
        m | sign
    } else {
        m
    }
}

const GEN_ROWS_PER_TASK: u64 = 64;

/// Fill a `rows x cols` tensor by distribution `dist`, in parallel but deterministically
/// (each block of rows has its own stream derived from `seed`).
fn gen_matrix(dt: DType, rows: u64, cols: u64, dist: Dist, seed: u64) -> Vec<u8> {
    let es = dt.size_bytes();
    let row_bytes = cols as usize * es;
    let mut buf = vec![0u8; rows as usize * row_bytes];
    if buf.is_empty() {
        return buf;
    }
    buf.par_chunks_mut(row_bytes * GEN_ROWS_PER_TASK as usize)
        .enumerate()
        .for_each(|(task, chunk)| {
            let mut rng = ChaCha8Rng::seed_from_u64(splitmix(seed ^ splitmix(task as u64)));
            for (k, row) in chunk.chunks_mut(row_bytes).enumerate() {
                let r = task as u64 * GEN_ROWS_PER_TASK + k as u64;
                gen_row(dt, row, r, cols, dist, &mut rng);
            }
        });
    buf
}

fn gen_row(dt: DType, row: &mut [u8], r: u64, cols: u64, dist: Dist, rng: &mut ChaCha8Rng) {
    let n = cols as usize;
    let normal = |rng: &mut ChaCha8Rng| -> f32 { rng.sample(StandardNormal) };
    let put = |row: &mut [u8], i: usize, v: f32| set_bits(dt, row, i, from_f32(dt, v));
    match dist {
        Dist::Normal | Dist::Outliers | Dist::NonFinite => {
            for i in 0..n {
                put(row, i, normal(rng));
            }
        }
        Dist::LargeScale => {
            let s = scale_large(dt);
            for i in 0..n {
                put(row, i, normal(rng) * s);
            }
        }
        Dist::TinyScale => {
            let s = scale_tiny(dt);
            for i in 0..n {
                put(row, i, normal(rng) * s);
            }
        }
        Dist::MeanOffset => {
            let m = mean_offset(dt);
            for i in 0..n {
                put(row, i, m + normal(rng));
            }
        }
        Dist::ConstantRows => {
            let c = normal(rng);
            for i in 0..n {
                put(row, i, c);
            }
        }
        Dist::ZeroRows => {
            // Every other row all zero (rows = 1: the only row); the rest normal.
            for i in 0..n {
                put(row, i, if r & 1 == 0 { 0.0 } else { normal(rng) });
            }
        }
        Dist::Subnormal => {
            for i in 0..n {
                set_bits(dt, row, i, subnormal_bits(dt, rng));
            }
        }
    }
    match dist {
        Dist::Outliers => {
            let i = rng.gen_range(0..n);
            let sgn = if rng.gen::<bool>() { 1.0 } else { -1.0 };
            put(row, i, sgn * outlier(dt));
        }
        Dist::NonFinite => {
            // Rows 0,1,2 (mod 4) get NaN, +Inf, -Inf at a random position; row 3 stays finite.
            let i = rng.gen_range(0..n);
            match r % 4 {
                0 => put(row, i, f32::NAN),
                1 => put(row, i, f32::INFINITY),
                2 => put(row, i, f32::NEG_INFINITY),
                _ => {}
            }
        }
        _ => {}
    }
}

/// A vector of `cols` parameters: `center + spread * N(0,1)`, rounded to T.
fn gen_param(dt: DType, cols: u64, center: f32, spread: f32, seed: u64) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut v = vec![0u8; cols as usize * dt.size_bytes()];
    for i in 0..cols as usize {
        let z: f32 = rng.sample(StandardNormal);
        set_bits(dt, &mut v, i, from_f32(dt, center + spread * z));
    }
    v
}

/// Draw the inputs of a case (deterministic in `spec.seed`).
pub fn generate(spec: &CaseSpec) -> CaseInputs {
    generate_shape(spec, spec.rows)
}

/// The inputs of `spec` but with `rows` rows (used for batches of other sizes).
pub fn generate_shape(spec: &CaseSpec, rows: u64) -> CaseInputs {
    let dt = spec.dtype;
    let s = spec.seed;
    let t = |name, bytes| HostTensor {
        name,
        dtype: dt,
        bytes,
    };
    match spec.op {
        Op::RmsNorm | Op::FusedAddRmsNorm => {
            let (center, spread) = if spec.semantics == Semantics::Gemma {
                (0.0, 0.2)
            } else {
                (1.0, 0.2)
            };
            CaseInputs {
                x: t("x", gen_matrix(dt, rows, spec.cols, spec.dist, s)),
                residual: (spec.op == Op::FusedAddRmsNorm).then(|| {
                    t(
                        "residual",
                        gen_matrix(dt, rows, spec.cols, Dist::Normal, splitmix(s ^ 1)),
                    )
                }),
                weight: Some(t(
                    "weight",
                    gen_param(dt, spec.cols, center, spread, splitmix(s ^ 2)),
                )),
                bias: None,
            }
        }
        Op::LayerNorm => CaseInputs {
            x: t("x", gen_matrix(dt, rows, spec.cols, spec.dist, s)),
            residual: None,
            weight: Some(t(
                "weight",
                gen_param(dt, spec.cols, 1.0, 0.2, splitmix(s ^ 2)),
            )),
            bias: Some(t(
                "bias",
                gen_param(dt, spec.cols, 0.0, 0.2, splitmix(s ^ 3)),
            )),
        },
        Op::SiluAndMul => CaseInputs {
            x: t("x", gen_matrix(dt, rows, 2 * spec.cols, spec.dist, s)),
            residual: None,
            weight: None,
            bias: None,
        },
        Op::Silu | Op::Gelu | Op::GeluTanh => CaseInputs {
            x: t("x", gen_matrix(dt, rows, spec.cols, spec.dist, s)),
            residual: None,
            weight: None,
            bias: None,
        },
    }
}

/// Bytes that must move for one launch: inputs read once plus outputs written once.
pub fn bytes_moved(op: Op, dt: DType, rows: u64, cols: u64) -> u64 {
    let e = dt.size_bytes() as u64;
    let n = rows * cols;
    e * match op {
        Op::RmsNorm => 2 * n + cols,
        Op::FusedAddRmsNorm => 4 * n + cols,
        Op::LayerNorm => 2 * n + 2 * cols,
        Op::Silu | Op::Gelu | Op::GeluTanh => 2 * n,
        Op::SiluAndMul => 3 * n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numeric::{bits_at, is_inf, is_nan, to_f32};

    #[test]
    fn same_seed_same_cases_and_inputs() {
        let a = suite(Op::RmsNorm, Semantics::Llama, &[DType::Bf16], true, 42);
        let b = suite(Op::RmsNorm, Semantics::Llama, &[DType::Bf16], true, 42);
        let c = suite(Op::RmsNorm, Semantics::Llama, &[DType::Bf16], true, 43);
        assert_eq!(a, b);
        assert_ne!(a[0].seed, c[0].seed);
        let small = a.iter().find(|s| s.rows * s.cols < 100_000).unwrap();
        assert_eq!(generate(small), generate(small));
        let other = c.iter().find(|s| s.id == small.id).unwrap();
        assert_ne!(generate(small).x, generate(other).x);
    }

    #[test]
    fn suite_covers_the_spec() {
        let full = suite(Op::LayerNorm, Semantics::Default, DType::ALL, false, 1);
        for cols in [64, 127, 1000, 768, 2048, 4096, 5120, 8192, 16384, 65536] {
            assert!(full.iter().any(|c| c.cols == cols), "cols {cols}");
        }
        assert!(full.iter().any(|c| c.rows == 1));
        assert!(full.iter().any(|c| c.rows >= 32768));
        for d in Dist::ALL_SPECIAL {
            assert!(full.iter().any(|c| c.dist == d), "{d}");
        }
        for dt in DType::ALL {
            assert!(full
                .iter()
                .any(|c| c.dtype == *dt && c.measure_speed && (c.rows, c.cols) == (4096, 8192)));
        }
        let ids: std::collections::BTreeSet<_> = full.iter().map(|c| &c.id).collect();
        assert_eq!(ids.len(), full.len(), "case ids are unique");
    }

    #[test]
    fn distributions_have_their_shape() {
        let base = suite(Op::RmsNorm, Semantics::Llama, &[DType::Bf16], true, 7)
            .into_iter()
            .find(|c| c.rows == 17)
            .unwrap();
        let with = |d| CaseSpec {
            dist: d,
            ..base.clone()
        };
        let dt = DType::Bf16;
        let x = generate(&with(Dist::NonFinite)).x;
        let nan = (0..x.len())
            .filter(|&i| is_nan(dt, bits_at(dt, &x.bytes, i)))
            .count();
        let inf = (0..x.len())
            .filter(|&i| is_inf(dt, bits_at(dt, &x.bytes, i)))
            .count();
        assert_eq!(
            (nan, inf),
            (5, 8),
            "rows 0..17: 5 rows with NaN, 8 with +-Inf"
        );
        let x = generate(&with(Dist::Subnormal)).x;
        assert!((0..x.len()).all(|i| {
            let v = to_f32(dt, bits_at(dt, &x.bytes, i)).abs();
            v > 0.0 && v < f32::MIN_POSITIVE
        }));
        let x = generate(&with(Dist::ConstantRows)).x;
        assert!((1..1000).all(|i| x.get(i) == x.get(0)));
        let x = generate(&with(Dist::ZeroRows)).x;
        assert!((0..1000).all(|i| x.get(i) == 0.0));
        assert!((1000..2000).any(|i| x.get(i) != 0.0));
    }

    #[test]
    fn bytes_moved_counts_reads_and_writes_once() {
        assert_eq!(
            bytes_moved(Op::RmsNorm, DType::Bf16, 4096, 8192),
            2 * (2 * 4096 * 8192 + 8192)
        );
        assert_eq!(bytes_moved(Op::SiluAndMul, DType::F32, 2, 8), 4 * 48);
    }
}
