//! The test suite (docs/spec.md section 3): which (dtype, shape, distribution) cases a kernel is run on,
//! and the inputs of each case, drawn from a seed so that any run can be replayed exactly.

use crate::numeric::{from_f32, set_bits};
use kernel_registry::report::ShapeRequest;
use kernel_registry::{DType, Op, Semantics};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Bumped whenever the case list, the input distributions or the reference semantics change.
pub const SUITE_VERSION: &str = "2026.3";

/// Input distributions of docs/spec.md section 3.
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
    /// Check batch invariance: every row of the case recomputed in other batch compositions.
    pub check_batch: bool,
    /// The `eps` the case launches with (norm ops; unused by the others), drawn per case.
    pub eps: f32,
    /// A case above 2^32 elements: inputs made, and outputs compared, on the GPU
    /// (`crate::large`), so that 32-bit index arithmetic fails without costing minutes.
    #[serde(default)]
    pub large_index: bool,
}

impl CaseSpec {
    /// The bytes gradient `g` of this backward case holds in its dtype (`rows x cols`, or one
    /// row for `dw` and `db`): what a call, the reference and the oracle's stand-in each give.
    pub fn gradient_bytes(&self, g: &kernel_registry::Gradient) -> usize {
        g.elements(self.rows, self.cols) as usize * self.dtype.size_bytes()
    }

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

/// The `eps` of the layer the op replaces by default (HF Llama's RMSNorm, nn.LayerNorm); the
/// conformance run uses it, the suite draws its own per case (`draw_eps`).
pub fn default_eps(op: Op) -> f32 {
    match op {
        Op::LayerNorm | Op::FusedAddLayerNorm => 1e-5,
        _ => 1e-6,
    }
}

/// `eps` values of popular models' norm layers: 1e-5 (Llama 2, Mistral, Phi, GPT-2's LayerNorm),
/// 1e-6 (Llama 3, Qwen2/3, Gemma, T5), 1e-12 (BERT's LayerNorm).
pub const MODEL_EPS: [f32; 3] = [1e-5, 1e-6, 1e-12];

/// A case's `eps`: half the time a model's value, otherwise log-uniform in [1e-12, 1e-1], so a
/// kernel that ignores or hard-codes its `eps` argument differs somewhere.
pub fn draw_eps(case_seed: u64) -> f32 {
    let mut rng = ChaCha8Rng::seed_from_u64(splitmix(case_seed ^ 0xE95));
    if rng.gen::<bool>() {
        MODEL_EPS[rng.gen_range(0..MODEL_EPS.len())]
    } else {
        10f32.powf(rng.gen_range(-12.0f32..-1.0))
    }
}

/// Row lengths of popular open models, from their published configs (`hidden_size`,
/// `intermediate_size`; `head_dim` where the model norms q/k): Llama 2 7B/13B/70B, Llama 3.x
/// 1B/3B/8B/70B/405B, Mistral 7B/Nemo/Small 24B, Mixtral 8x7B, Qwen2.5 0.5B-72B, Qwen3
/// 0.6B-32B, Gemma 2B/7B, Gemma 2 2B/9B/27B, Gemma 3 1B-27B, Phi-2, Phi-3 mini/medium, Phi-4,
/// GPT-2 (all four sizes), SmolLM2 135M/360M/1.7B, TinyLlama 1.1B, DeepSeek-V3.
pub const MODEL_WIDTHS: [u64; 51] = [
    128, 256, 576, 768, 896, 960, 1024, 1152, 1280, 1536, 1600, 2048, 2304, 2560, 3072, 3584, 3840,
    4096, 4608, 4864, 5120, 5376, 5632, 6144, 6400, 6912, 7168, 8192, 8960, 9216, 9728, 10240,
    11008, 12288, 13824, 14336, 15360, 16384, 17408, 17920, 18432, 18944, 21504, 24576, 25600,
    27648, 28672, 29568, 32768, 36864, 53248,
];

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

/// One planned case of the suite, before its id and seed.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Planned {
    rows: u64,
    cols: u64,
    dist: Dist,
    speed: bool,
    large: bool,
}

fn plan(rows: u64, cols: u64, dist: Dist, speed: bool) -> Planned {
    Planned {
        rows,
        cols,
        dist,
        speed,
        large: false,
    }
}

/// The fixed anchor shapes: rows 1..32768; cols 64, 127, 1000, 1001 (1000 is a multiple of 8;
/// 127 and 1001 are not), 768, 2048, 4096, 5120, 8192, 16384, 65536; every distribution.
fn anchors(quick: bool) -> Vec<Planned> {
    use Dist::*;
    let base: &[(u64, u64, bool)] = if quick {
        &[
            (1, 64, false),
            (7, 127, false),
            (33, 1000, false),
            (3, 1001, false),
            (1024, 4096, false),
            (4096, 8192, true),
            (4, 65536, false),
        ]
    } else {
        &[
            (1, 64, false),
            (7, 127, false),
            (33, 1000, false),
            (3, 1001, false),
            (256, 768, false),
            (64, 2048, false),
            (1024, 4096, false),
            (128, 5120, false),
            (4096, 8192, true),
            (32768, 4096, true),
            (16, 16384, false),
            (4, 65536, false),
        ]
    };
    let mut v: Vec<Planned> = base
        .iter()
        .map(|&(r, c, speed)| plan(r, c, Normal, speed))
        .collect();
    let specials: &[Dist] = if quick {
        &[NonFinite, MeanOffset, ZeroRows, Subnormal, Outliers]
    } else {
        &Dist::ALL_SPECIAL
    };
    for &d in specials {
        v.push(plan(17, 1000, d, false));
        if !quick {
            v.push(plan(64, 4096, d, false));
        }
    }
    v
}

/// A backward op's shapes besides the anchors. rms_norm_backward (docs/backward.md, "What
/// remains" 3): its column sum changes order where the warp-rows start sharing a column (64
/// rows at model widths) and where several CTAs share it (from 1021 rows on 132 SMs), and with
/// `cols % 4` (the output vector: 4, 2 or 1 columns a thread); the training shape 16384 x 4096
/// is timed. The gated backward ops (elementwise, no order to cover): problems smaller than one
/// 16-byte vector or ending in a partial one (a kernel's scalar tail), and one of more than
/// 2^20 elements ending in a partial vector (its call at other grids gets a third of the grid);
/// the activations' backward ops (elementwise too) the same shapes. rms_norm_backward's torch
/// semantics (docs/backward-rms-torch.md: eager's layer-norm backward kernels) adds
/// layer_norm_backward's chain-count boundaries (dw's chains change at 64, 128 and 256 rows; the
/// forward's order and dx's loads with cols % 4) and the kernel's two dwp modes (the chains left
/// in the workspace where Reduce.cuh's CTAs reach 32: 4096 x 1024 on 132 SMs; else the tree in
/// the block).
fn backward_anchors(op: Op, semantics: Semantics, quick: bool) -> Vec<Planned> {
    if op == Op::LayerNormBackward {
        // eager's column sum changes its chains at 64, 128 and 256 rows; the launch rule its
        // tiles at 1024 rows and 4096 columns (two columns a thread from there, even widths
        // only); dx its loads with cols % 4; 65536 rows is the most the op takes.
        let mut v: Vec<Planned> = [
            (32, 4096),
            (33, 4096),
            (63, 1000),
            (64, 4096),
            (127, 4099),
            (128, 4096),
            (255, 2048),
            (256, 1001),
            (1023, 4096),
            (1024, 4097),
            (520, 96),
            (2048, 1002),
            (65536, 64),
        ]
        .into_iter()
        .map(|(r, c)| plan(r, c, Dist::Normal, false))
        .collect();
        if !quick {
            v.push(plan(16384, 4096, Dist::Normal, true));
            v.push(plan(4096, 4095, Dist::Normal, false));
        }
        return v;
    }
    if op.is_gated_backward() || op.is_activation_backward() {
        return vec![
            plan(1, 1, Dist::Normal, false),
            plan(1, 7, Dist::Normal, false),
            plan(3, 5, Dist::Normal, false),
            plan(1500, 1001, Dist::Normal, false),
        ];
    }
    let mut v = vec![
        plan(63, 4096, Dist::Normal, false),
        plan(1020, 4096, Dist::Normal, false),
        plan(1021, 4096, Dist::Normal, false),
        plan(2048, 1002, Dist::Normal, false),
        plan(1500, 1001, Dist::Normal, false),
    ];
    if semantics == Semantics::Torch {
        v.extend(
            [
                (33, 4096),
                (64, 4096),
                (127, 4099),
                (128, 4096),
                (255, 2048),
                (256, 1001),
                (520, 96),
                (4096, 1024),
            ]
            .into_iter()
            .map(|(r, c)| plan(r, c, Dist::Normal, false)),
        );
    }
    if !quick {
        v.push(plan(16384, 4096, Dist::Normal, true));
        v.push(plan(4096, 2050, Dist::Normal, false));
    }
    v
}

/// A fresh random row length: log-uniform in [1, 20000].
fn random_width(rng: &mut ChaCha8Rng) -> u64 {
    (10f64.powf(rng.gen_range(0.0..20000f64.log10())) as u64).max(1)
}

/// Decode batches at model widths: every row count 1..=64 (quick: 1..=16), each paired with one
/// width of a per-run shuffle of `MODEL_WIDTHS` (the full suite runs every one of them), then
/// fresh random widths once that list is used up.
fn decode(quick: bool, rng: &mut ChaCha8Rng) -> Vec<Planned> {
    use rand::seq::SliceRandom;
    let mut widths = MODEL_WIDTHS.to_vec();
    widths.shuffle(rng);
    let max_rows: u64 = if quick { 16 } else { 64 };
    if quick {
        widths.truncate(12);
    }
    (1..=max_rows)
        .map(|r| {
            let cols = widths
                .get(r as usize - 1)
                .copied()
                .unwrap_or_else(|| random_width(rng));
            plan(r, cols, Dist::Normal, false)
        })
        .collect()
}

/// Fresh random shapes of this run: widths log-uniform in [1, 20000], row counts log-uniform in
/// [1, 4096], at most 2^24 elements.
fn random_shapes(n: usize, rng: &mut ChaCha8Rng) -> Vec<Planned> {
    (0..n)
        .map(|_| {
            let cols = random_width(rng);
            let max_rows = ((1u64 << 24) / cols).clamp(1, 4096);
            let rows = (10f64.powf(rng.gen_range(0.0..(max_rows as f64).log10() + 1e-9)) as u64)
                .clamp(1, max_rows);
            plan(rows, cols, Dist::Normal, false)
        })
        .collect()
}

/// The cases of a requested shape: both ends of its row range, every count up to 64 inside it,
/// and up to four drawn at random inside it.
fn requested(req: &ShapeRequest, rng: &mut ChaCha8Rng) -> Vec<Planned> {
    let mut rows: Vec<u64> = vec![req.rows_min, req.rows_max];
    rows.extend((req.rows_min..=req.rows_max.min(64)).filter(|r| *r >= 1));
    if req.rows_max > req.rows_min {
        rows.extend((0..4).map(|_| rng.gen_range(req.rows_min..=req.rows_max)));
    }
    rows.sort_unstable();
    rows.dedup();
    rows.into_iter()
        .map(|r| plan(r, req.cols, Dist::Normal, false))
        .collect()
}

/// The large-index case passes this many elements by at least two whole rows, so that a 32-bit
/// offset overflows even when only row starts are computed in 32 bits (signed or unsigned: the
/// H200 run of 2026-11-23 showed a case just above 2^31 elements misses a signed row offset).
pub const LARGE_INDEX_ELEMENTS: u64 = 1 << 32;

/// The large-index case: a model width and enough rows to pass 2^32 elements by 2-9 rows (drawn
/// per run).
fn large_index(rng: &mut ChaCha8Rng) -> Planned {
    let widths: Vec<u64> = MODEL_WIDTHS
        .iter()
        .copied()
        .filter(|&w| (1024..=16384).contains(&w))
        .collect();
    let cols = widths[rng.gen_range(0..widths.len())];
    let rows = LARGE_INDEX_ELEMENTS / cols + 2 + rng.gen_range(0..8);
    Planned {
        large: true,
        ..plan(rows, cols, Dist::Normal, false)
    }
}

/// The dtype the large-index case runs in: the narrowest of the run (it needs the least memory;
/// index arithmetic does not depend on the dtype's width).
fn large_index_dtype(dtypes: &[DType]) -> Option<DType> {
    dtypes.iter().copied().min_by_key(|d| d.size_bytes())
}

/// The cases of one run, in order: per dtype the anchors, decode batches at model widths, fresh
/// random shapes and the requested shapes; then one large-index case. Every random choice and
/// every case's seed derive from `run_seed`, so the same seed gives the same cases and inputs.
pub fn suite(
    op: Op,
    semantics: Semantics,
    dtypes: &[DType],
    quick: bool,
    run_seed: u64,
    requested_shapes: &[ShapeRequest],
) -> Vec<CaseSpec> {
    let mut out = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut push = |dtype: DType, p: Planned, out: &mut Vec<CaseSpec>| {
        let id = if p.large {
            format!("{dtype}/{}x{}/large_index", p.rows, p.cols)
        } else {
            format!("{dtype}/{}x{}/{}", p.rows, p.cols, p.dist)
        };
        // (a backward op that takes a bounded number of rows: never more, requested or not)
        if op.max_rows().is_some_and(|m| p.rows > m) || !seen.insert(id.clone()) {
            return;
        }
        let seed = splitmix(run_seed ^ stable_hash(&id));
        out.push(CaseSpec {
            seed,
            id,
            op,
            semantics,
            dtype,
            rows: p.rows,
            cols: p.cols,
            dist: p.dist,
            measure_speed: p.speed,
            // A backward op's gradient of one row (rms_norm_backward's dw) is a sum over the
            // rows: no batch invariance to check. Gradients of rows x cols are checked.
            check_batch: p.dist == Dist::Normal
                && !p.large
                && !op.gradients().iter().any(|g| g.one_row),
            eps: draw_eps(seed),
            large_index: p.large,
        });
    };
    for &dtype in dtypes {
        let mut rng = ChaCha8Rng::seed_from_u64(splitmix(run_seed ^ stable_hash(dtype.as_str())));
        let mut planned = anchors(quick);
        if op.is_backward() {
            planned.extend(backward_anchors(op, semantics, quick));
        }
        planned.extend(decode(quick, &mut rng));
        planned.extend(random_shapes(if quick { 3 } else { 6 }, &mut rng));
        for req in requested_shapes {
            planned.extend(requested(req, &mut rng));
        }
        for p in planned {
            push(dtype, p, &mut out);
        }
    }
    // A backward op has no large-index case yet (`crate::measure::large` runs forward ops).
    if let Some(dt) = large_index_dtype(dtypes).filter(|_| !op.is_backward()) {
        let mut rng = ChaCha8Rng::seed_from_u64(splitmix(run_seed ^ 0x1A46E));
        push(dt, large_index(&mut rng), &mut out);
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
    /// `x` (for silu_and_mul: `[rows, 2*cols]`, gate first; for a gated op: the gate).
    pub x: HostTensor,
    /// A gated op's `up` (`[rows, cols]`, like the gate).
    pub up: Option<HostTensor>,
    /// fused_add_rms_norm's residual (read and written).
    pub residual: Option<HostTensor>,
    pub weight: Option<HostTensor>,
    pub bias: Option<HostTensor>,
    /// A backward op's incoming gradient `dy` (`[rows, cols]`, like x).
    pub dy: Option<HostTensor>,
    /// layer_norm_backward's saved statistics of x, f32 `[rows]` each: the forward's `mean`
    /// and `rstd` ([`row_stats`]).
    pub mean: Option<HostTensor>,
    pub rstd: Option<HostTensor>,
}

/// The statistics nn.LayerNorm's forward saves for its backward, of `x`'s `rows` rows: the mean
/// and `1 / sqrt(var + eps)` (biased variance), each computed in f64 and rounded once to f32.
/// Eager's own (Welford in f32) may differ in the last bits; the backward is a function of the
/// statistics it is given, and the candidate, the reference and the oracle all get these.
pub fn row_stats(x: &HostTensor, rows: u64, cols: u64, eps: f32) -> (HostTensor, HostTensor) {
    // Each row's sums in order on its own (the rows in parallel: the same values).
    let stats: Vec<(f32, f32)> = (0..rows as usize)
        .into_par_iter()
        .map(|r| {
            let row: Vec<f64> = (0..cols as usize)
                .map(|c| x.get(r * cols as usize + c) as f64)
                .collect();
            let m = row.iter().sum::<f64>() / cols as f64;
            let v = row.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / cols as f64;
            (m as f32, (1.0 / (v + eps as f64).sqrt()) as f32)
        })
        .collect();
    let mean = stats.iter().flat_map(|s| s.0.to_le_bytes()).collect();
    let rstd = stats.iter().flat_map(|s| s.1.to_le_bytes()).collect();
    let t = |name, bytes| HostTensor {
        name,
        dtype: DType::F32,
        bytes,
    };
    (t("mean", mean), t("rstd", rstd))
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

/// Rows per generation task: about 16K elements, 1 to 64 rows (so a decode batch of a few wide
/// rows is still drawn on several cores).
fn gen_rows_per_task(cols: u64) -> u64 {
    ((1 << 14) / cols.max(1)).clamp(1, 64)
}

/// Fill a `rows x cols` tensor by distribution `dist`, in parallel but deterministically
/// (each block of rows has its own stream derived from `seed`).
fn gen_matrix(dt: DType, rows: u64, cols: u64, dist: Dist, seed: u64) -> Vec<u8> {
    let es = dt.size_bytes();
    let row_bytes = cols as usize * es;
    let mut buf = vec![0u8; rows as usize * row_bytes];
    if buf.is_empty() {
        return buf;
    }
    let per_task = gen_rows_per_task(cols);
    buf.par_chunks_mut(row_bytes * per_task as usize)
        .enumerate()
        .for_each(|(task, chunk)| {
            let mut rng = ChaCha8Rng::seed_from_u64(splitmix(seed ^ splitmix(task as u64)));
            for (k, row) in chunk.chunks_mut(row_bytes).enumerate() {
                let r = task as u64 * per_task + k as u64;
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
    // The fused adds' residual stream, which x is added into (on a stream of its own).
    let residual = || {
        spec.op.updates_residual().then(|| {
            t(
                "residual",
                gen_matrix(dt, rows, spec.cols, Dist::Normal, splitmix(s ^ 1)),
            )
        })
    };
    match spec.op {
        // rms_norm_backward's x and w are its forward's; its dy is drawn from the case's
        // distribution on a stream of its own (a zero, huge or non-finite dy is as much a case
        // as such an x).
        // fused_add_rms_norm_backward: x is the forward's residual output (the norm's input), w
        // llama's, dy and the residual output's gradient dres (in `residual`) drawn apart.
        Op::RmsNorm | Op::FusedAddRmsNorm | Op::RmsNormBackward | Op::FusedAddRmsNormBackward => {
            let (center, spread) = if spec.semantics == Semantics::Gemma {
                (0.0, 0.2)
            } else {
                (1.0, 0.2)
            };
            CaseInputs {
                mean: None,
                rstd: None,
                x: t("x", gen_matrix(dt, rows, spec.cols, spec.dist, s)),
                up: None,
                residual: if spec.op == Op::FusedAddRmsNormBackward {
                    Some(t(
                        "dres",
                        gen_matrix(dt, rows, spec.cols, spec.dist, splitmix(s ^ 6)),
                    ))
                } else {
                    residual()
                },
                weight: Some(t(
                    "weight",
                    gen_param(dt, spec.cols, center, spread, splitmix(s ^ 2)),
                )),
                bias: None,
                dy: spec.op.is_backward().then(|| {
                    t(
                        "dy",
                        gen_matrix(dt, rows, spec.cols, spec.dist, splitmix(s ^ 5)),
                    )
                }),
            }
        }
        // layer_norm_backward's x, w as its forward's, dy as rms_norm_backward's, the saved
        // statistics of x with the case's eps.
        Op::LayerNormBackward => {
            let x = t("x", gen_matrix(dt, rows, spec.cols, spec.dist, s));
            let (mean, rstd) = row_stats(&x, rows, spec.cols, spec.eps);
            CaseInputs {
                x,
                up: None,
                residual: None,
                weight: Some(t(
                    "weight",
                    gen_param(dt, spec.cols, 1.0, 0.2, splitmix(s ^ 2)),
                )),
                bias: None,
                dy: Some(t(
                    "dy",
                    gen_matrix(dt, rows, spec.cols, spec.dist, splitmix(s ^ 5)),
                )),
                mean: Some(mean),
                rstd: Some(rstd),
            }
        }
        Op::LayerNorm | Op::FusedAddLayerNorm => CaseInputs {
            mean: None,
            rstd: None,
            x: t("x", gen_matrix(dt, rows, spec.cols, spec.dist, s)),
            up: None,
            residual: residual(),
            weight: Some(t(
                "weight",
                gen_param(dt, spec.cols, 1.0, 0.2, splitmix(s ^ 2)),
            )),
            bias: Some(t(
                "bias",
                gen_param(dt, spec.cols, 0.0, 0.2, splitmix(s ^ 3)),
            )),
            dy: None,
        },
        Op::SiluAndMul => CaseInputs {
            mean: None,
            rstd: None,
            x: t("x", gen_matrix(dt, rows, 2 * spec.cols, spec.dist, s)),
            up: None,
            residual: None,
            weight: None,
            bias: None,
            dy: None,
        },
        // Gate and up both drawn from the case's distribution (as silu_and_mul's x holds
        // both), from streams of their own.
        // The gated backward's gate and up are its forward's; its dy as rms_norm_backward's.
        Op::SiluMul | Op::GeluTanhMul | Op::SiluMulBackward | Op::GeluTanhMulBackward => {
            CaseInputs {
                mean: None,
                rstd: None,
                x: t("gate", gen_matrix(dt, rows, spec.cols, spec.dist, s)),
                up: Some(t(
                    "up",
                    gen_matrix(dt, rows, spec.cols, spec.dist, splitmix(s ^ 4)),
                )),
                residual: None,
                weight: None,
                bias: None,
                dy: spec.op.is_backward().then(|| {
                    t(
                        "dy",
                        gen_matrix(dt, rows, spec.cols, spec.dist, splitmix(s ^ 5)),
                    )
                }),
            }
        }
        // An activation's backward: x as its forward's, dy as rms_norm_backward's.
        Op::Silu
        | Op::Gelu
        | Op::GeluTanh
        | Op::SiluBackward
        | Op::GeluBackward
        | Op::GeluTanhBackward => CaseInputs {
            mean: None,
            rstd: None,
            x: t("x", gen_matrix(dt, rows, spec.cols, spec.dist, s)),
            up: None,
            residual: None,
            weight: None,
            bias: None,
            dy: spec.op.is_backward().then(|| {
                t(
                    "dy",
                    gen_matrix(dt, rows, spec.cols, spec.dist, splitmix(s ^ 5)),
                )
            }),
        },
    }
}

/// Bytes that must move for one launch: inputs read once plus outputs written once (one
/// definition, `Op::bytes_moved`, shared with the hub's report checks).
pub fn bytes_moved(op: Op, dt: DType, rows: u64, cols: u64) -> u64 {
    op.bytes_moved(dt, rows, cols)
}

/// A case's report with nothing measured yet (the runner fills what it measures).
pub(crate) fn case_skeleton(
    spec: &CaseSpec,
    status: kernel_registry::report::CaseStatus,
    note: Option<String>,
) -> kernel_registry::report::CaseReport {
    kernel_registry::report::CaseReport {
        id: spec.id.clone(),
        dtype: spec.dtype,
        rows: spec.rows,
        cols: spec.cols,
        distribution: spec.dist.to_string(),
        eps: spec.op.takes_eps().then_some(spec.eps),
        status,
        note,
        exactness: None,
        accuracy: None,
        deterministic: None,
        batch_invariant: None,
        integrity_failures: vec![],
        speed: None,
        gradients: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numeric::{bits_at, is_inf, is_nan, to_f32};

    /// A backward op's cases: dy drawn from the case's distribution independently of x, the
    /// column sum's order changes covered (warp-rows, the global reduce from 1021 rows, cols %
    /// 4 of 0, 2 and odd), the training shape timed, no batch-invariance check (dw sums the
    /// rows) and no large-index case.
    #[test]
    fn backward_cases_draw_dy_and_cover_the_column_orders() {
        let cases = suite(
            Op::RmsNormBackward,
            Semantics::Llama,
            &[DType::Bf16],
            false,
            7,
            &[],
        );
        let has = |r: u64, c: u64| cases.iter().any(|s| s.rows == r && s.cols == c);
        assert!(has(1020, 4096) && has(1021, 4096) && has(2048, 1002) && has(1500, 1001));
        assert!(cases
            .iter()
            .any(|s| s.rows == 16384 && s.cols == 4096 && s.measure_speed));
        assert!(cases.iter().all(|s| !s.check_batch && !s.large_index));
        for s in cases.iter().filter(|s| s.rows * s.cols < 100_000).take(8) {
            let inp = generate(s);
            let dy = inp.dy.as_ref().expect("dy");
            assert_eq!(dy.bytes.len(), inp.x.bytes.len(), "{}", s.id);
            assert_ne!(dy.bytes, inp.x.bytes, "{}", s.id);
            assert_eq!(
                inp.weight.as_ref().unwrap().bytes.len(),
                s.cols as usize * 2
            );
        }
        // semantics gemma (GemmaRMSNorm's backward): the same shapes, weights around 0 (the
        // module multiplies by 1 + w), llama's around 1
        let gem = suite(
            Op::RmsNormBackward,
            Semantics::Gemma,
            &[DType::Bf16],
            false,
            7,
            &[],
        );
        let shapes = |v: &[CaseSpec]| v.iter().map(|s| (s.rows, s.cols)).collect::<Vec<_>>();
        assert_eq!(shapes(&gem), shapes(&cases));
        let mean_w = |s: &CaseSpec| {
            let w = generate(s).weight.unwrap();
            (0..w.len()).map(|j| w.get(j) as f64).sum::<f64>() / w.len() as f64
        };
        let (g, l) = (mean_w(&gem[0]), mean_w(&cases[0]));
        assert!(
            g.abs() < 0.25 && (l - 1.0).abs() < 0.25,
            "gemma {g}, llama {l}"
        );
        // semantics torch (F.rms_norm's backward, eager's layer-norm kernels): llama's shapes
        // and the chain counts' boundaries, weights around 1
        let tor = suite(
            Op::RmsNormBackward,
            Semantics::Torch,
            &[DType::Bf16],
            false,
            7,
            &[],
        );
        let th = |r: u64, c: u64| tor.iter().any(|s| s.rows == r && s.cols == c);
        assert!(shapes(&cases).iter().all(|&(r, c)| th(r, c)));
        assert!(th(63, 4096) && th(64, 4096) && th(127, 4099) && th(256, 1001) && th(4096, 1024));
        assert!(!has(127, 4099));
        assert!((mean_w(&tor[0]) - 1.0).abs() < 0.25);
        // fused_add_rms_norm_backward: rms_norm_backward's shapes, and dres drawn apart from dy
        let fa = suite(
            Op::FusedAddRmsNormBackward,
            Semantics::Default,
            &[DType::Bf16],
            false,
            7,
            &[],
        );
        assert_eq!(shapes(&fa), shapes(&cases));
        let inp = generate(&fa[0]);
        let dres = inp.residual.as_ref().expect("dres");
        assert_eq!(dres.name, "dres");
        assert_eq!(dres.bytes.len(), inp.x.bytes.len());
        assert_ne!(dres.bytes, inp.dy.as_ref().unwrap().bytes);
        assert_ne!(dres.bytes, inp.x.bytes);
        // a forward op's suite is unchanged by it: no dy, its own anchors
        let fwd = suite(Op::RmsNorm, Semantics::Llama, &[DType::Bf16], false, 7, &[]);
        assert!(!fwd.iter().any(|s| s.rows == 1021));
        assert!(generate(&fwd[0]).dy.is_none());
    }

    /// layer_norm_backward's cases: x and w as its forward's, dy apart, the saved statistics of
    /// x (f32, one a row, with the case's eps); eager's chain counts and the launch rule's
    /// changes covered, the training shape timed; never more than 65536 rows, even when asked.
    #[test]
    fn layer_norm_backward_cases_carry_the_saved_statistics() {
        let big = ShapeRequest {
            cols: 64,
            rows_min: 65530,
            rows_max: 70000,
        };
        let cases = suite(
            Op::LayerNormBackward,
            Semantics::Default,
            &[DType::Bf16],
            false,
            7,
            &[big],
        );
        let has = |r: u64, c: u64| cases.iter().any(|s| s.rows == r && s.cols == c);
        for (r, c) in [
            (63, 1000),
            (64, 4096),
            (127, 4099),
            (128, 4096),
            (255, 2048),
        ] {
            assert!(has(r, c), "{r} x {c}");
        }
        assert!(has(256, 1001) && has(1023, 4096) && has(1024, 4097) && has(65536, 64));
        assert!(
            cases.iter().all(|s| s.rows <= 65536),
            "no case past the op's rows"
        );
        assert!(
            cases.iter().any(|s| s.rows == 65530 && s.cols == 64),
            "the request, cut"
        );
        assert!(cases
            .iter()
            .any(|s| (s.rows, s.cols) == (16384, 4096) && s.measure_speed));
        assert!(cases.iter().all(|s| !s.check_batch && !s.large_index));
        let s = cases.iter().find(|s| s.rows == 7 && s.cols == 127).unwrap();
        let inp = generate(s);
        let (mean, rstd) = (inp.mean.as_ref().unwrap(), inp.rstd.as_ref().unwrap());
        assert_eq!((mean.dtype, mean.len(), rstd.len()), (DType::F32, 7, 7));
        assert_eq!((mean.name, rstd.name), ("mean", "rstd"));
        assert_eq!(inp.dy.as_ref().unwrap().len(), 7 * 127);
        // the statistics are x's: mean and 1 / sqrt(var + eps), rounded once
        let row: Vec<f64> = (0..127).map(|j| inp.x.get(3 * 127 + j) as f64).collect();
        let m = row.iter().sum::<f64>() / 127.0;
        let v = row.iter().map(|h| (h - m) * (h - m)).sum::<f64>() / 127.0;
        assert_eq!(mean.get(3), m as f32);
        assert_eq!(rstd.get(3), (1.0 / (v + s.eps as f64).sqrt()) as f32);
        // x and w are the forward's (the same case of layer_norm draws the same bits)
        let fwd = CaseSpec {
            op: Op::LayerNorm,
            ..s.clone()
        };
        let f = generate(&fwd);
        assert_eq!((f.x, f.weight), (inp.x.clone(), inp.weight.clone()));
    }

    /// silu_mul_backward's cases: gate and up drawn as its forward's (the same bits for the same
    /// case), dy drawn from the case's distribution apart from both, the scalar tails covered,
    /// batch invariance checked (both gradients are rows x cols), no large-index case.
    #[test]
    fn silu_mul_backward_cases_draw_gate_up_and_dy() {
        for quick in [true, false] {
            let cases = suite(
                Op::SiluMulBackward,
                Semantics::Default,
                &[DType::Bf16, DType::F32],
                quick,
                7,
                &[],
            );
            let has = |r: u64, c: u64| cases.iter().any(|s| s.rows == r && s.cols == c);
            assert!(
                has(1, 1) && has(1, 7) && has(3, 5) && has(1500, 1001),
                "{quick}"
            );
            // no column order to cover: not rms_norm_backward's shapes
            assert!(!has(1021, 4096) && !has(2048, 1002), "{quick}");
            assert!(cases
                .iter()
                .any(|s| (s.rows, s.cols) == (4096, 8192) && s.measure_speed));
            assert!(cases.iter().all(|s| !s.large_index));
            assert!(cases
                .iter()
                .all(|s| s.check_batch == (s.dist == Dist::Normal)));
            let ids: std::collections::BTreeSet<_> = cases.iter().map(|c| &c.id).collect();
            assert_eq!(ids.len(), cases.len(), "case ids are unique");
            // a modest suite: no more cases than the forward's plus the four above
            let fwd = suite(
                Op::SiluMul,
                Semantics::Default,
                &[DType::Bf16, DType::F32],
                quick,
                7,
                &[],
            );
            assert!(cases.len() <= fwd.len() + 8, "{} cases", cases.len());
        }
        let cases = suite(
            Op::SiluMulBackward,
            Semantics::Default,
            &[DType::Bf16],
            true,
            4,
            &[],
        );
        let fwd = suite(
            Op::SiluMul,
            Semantics::Default,
            &[DType::Bf16],
            true,
            4,
            &[],
        );
        let c = cases.iter().find(|c| (c.rows, c.cols) == (7, 127)).unwrap();
        let f = fwd.iter().find(|f| f.id == c.id).unwrap();
        assert_eq!(c.seed, f.seed, "the same case id, the same seed");
        assert_eq!(
            c.constraint_size(),
            127,
            "a row-wise op: constraints on cols"
        );
        let (inp, finp) = (generate(c), generate(f));
        assert_eq!(
            (&inp.x, &inp.up),
            (&finp.x, &finp.up),
            "gate and up as the forward's"
        );
        assert_eq!((inp.x.name, inp.up.as_ref().unwrap().name), ("gate", "up"));
        let dy = inp.dy.as_ref().expect("dy");
        assert_eq!((dy.name, dy.len()), ("dy", 7 * 127));
        assert_ne!(dy.bytes, inp.x.bytes);
        assert_ne!(&dy.bytes, &inp.up.as_ref().unwrap().bytes);
        assert!(inp.weight.is_none() && inp.residual.is_none() && inp.bias.is_none());
        assert!(finp.dy.is_none());
        // special distributions reach dy too
        let nf = CaseSpec {
            dist: Dist::NonFinite,
            ..c.clone()
        };
        let dy = generate(&nf).dy.unwrap();
        assert!((0..dy.len()).any(|i| is_nan(DType::Bf16, bits_at(DType::Bf16, &dy.bytes, i))));
        // no eps in its report
        assert_eq!(
            case_skeleton(c, kernel_registry::report::CaseStatus::Ran, None).eps,
            None
        );
    }

    /// The activations' backward ops' cases: x drawn as their forward's (the same bits for the
    /// same case), dy from the case's distribution apart from it; the forward's anchors plus the
    /// gated backward's problems smaller than a 16-byte vector or ending in a partial one;
    /// elementwise constraints (the element count); batch invariance checked, no large-index
    /// case.
    #[test]
    fn activation_backward_cases_draw_x_and_dy() {
        for (op, fwd) in [
            (Op::SiluBackward, Op::Silu),
            (Op::GeluBackward, Op::Gelu),
            (Op::GeluTanhBackward, Op::GeluTanh),
        ] {
            let cases = suite(op, Semantics::Default, &[DType::Bf16], true, 9, &[]);
            let fwds = suite(fwd, Semantics::Default, &[DType::Bf16], true, 9, &[]);
            let has = |r: u64, c: u64| cases.iter().any(|s| s.rows == r && s.cols == c);
            assert!(
                has(1, 1) && has(1, 7) && has(3, 5) && has(1500, 1001),
                "{op}"
            );
            assert!(cases.iter().all(|s| !s.large_index), "{op}");
            assert!(
                fwds.iter().any(|s| s.large_index),
                "{fwd}: its forward has one"
            );
            assert!(cases
                .iter()
                .all(|s| s.check_batch == (s.dist == Dist::Normal)));
            let c = cases.iter().find(|c| (c.rows, c.cols) == (7, 127)).unwrap();
            assert_eq!(c.constraint_size(), 7 * 127, "{op}: elementwise");
            let f = fwds.iter().find(|f| f.id == c.id).unwrap();
            let (inp, finp) = (generate(c), generate(f));
            assert_eq!(inp.x, finp.x, "{op}: x as its forward's");
            let dy = inp.dy.as_ref().expect("dy");
            assert_eq!(dy.bytes.len(), inp.x.bytes.len());
            assert_ne!(dy.bytes, inp.x.bytes);
            assert!(inp.up.is_none() && inp.weight.is_none() && finp.dy.is_none());
            assert_eq!(
                case_skeleton(c, kernel_registry::report::CaseStatus::Ran, None).eps,
                None
            );
        }
    }

    #[test]
    fn same_seed_same_cases_and_inputs() {
        let a = suite(Op::RmsNorm, Semantics::Llama, &[DType::Bf16], true, 42, &[]);
        let b = suite(Op::RmsNorm, Semantics::Llama, &[DType::Bf16], true, 42, &[]);
        let c = suite(Op::RmsNorm, Semantics::Llama, &[DType::Bf16], true, 43, &[]);
        assert_eq!(a, b);
        assert_ne!(a[0].seed, c[0].seed);
        let small = a.iter().find(|s| s.rows * s.cols < 100_000).unwrap();
        assert_eq!(generate(small), generate(small));
        let other = c.iter().find(|s| s.id == small.id).unwrap();
        assert_ne!(generate(small).x, generate(other).x);
    }

    #[test]
    fn suite_covers_the_spec() {
        let full = suite(Op::LayerNorm, Semantics::Default, DType::ALL, false, 1, &[]);
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
    fn every_run_covers_decode_rows_model_widths_and_fresh_shapes() {
        let full = suite(Op::RmsNorm, Semantics::Llama, &[DType::F16], false, 11, &[]);
        for r in 1..=64 {
            assert!(full.iter().any(|c| c.rows == r), "decode rows {r}");
        }
        for w in MODEL_WIDTHS {
            assert!(full.iter().any(|c| c.cols == w), "model width {w}");
        }
        let widths = |s: &[CaseSpec]| -> std::collections::BTreeSet<u64> {
            s.iter().map(|c| c.cols).collect()
        };
        // Another run draws other random shapes, besides the fixed and model ones.
        let other = suite(Op::RmsNorm, Semantics::Llama, &[DType::F16], false, 12, &[]);
        assert_ne!(widths(&full), widths(&other));
        let quick = suite(Op::RmsNorm, Semantics::Llama, &[DType::Bf16], true, 11, &[]);
        for r in 1..=16 {
            assert!(quick.iter().any(|c| c.rows == r), "quick decode rows {r}");
        }
        let mut uniq = MODEL_WIDTHS.to_vec();
        uniq.sort_unstable();
        uniq.dedup();
        assert_eq!(
            uniq.len(),
            MODEL_WIDTHS.len(),
            "model widths are listed once"
        );
    }

    #[test]
    fn eps_is_drawn_per_case_from_models_and_at_random() {
        let full = suite(Op::LayerNorm, Semantics::Default, DType::ALL, false, 5, &[]);
        let eps: Vec<f32> = full.iter().map(|c| c.eps).collect();
        assert!(eps.iter().all(|&e| (1e-12..=1e-1).contains(&e)), "{eps:?}");
        for m in MODEL_EPS {
            assert!(eps.contains(&m), "model eps {m}");
        }
        let random = eps.iter().filter(|e| !MODEL_EPS.contains(e)).count();
        assert!(
            random > full.len() / 4,
            "{random} of {} drawn at random",
            full.len()
        );
        // Replays: the same seed gives the same eps.
        let again = suite(Op::LayerNorm, Semantics::Default, DType::ALL, false, 5, &[]);
        assert_eq!(full, again);
    }

    #[test]
    fn one_large_index_case_above_2_pow_31_in_the_narrowest_dtype() {
        for quick in [true, false] {
            let s = suite(Op::Silu, Semantics::Default, DType::ALL, quick, 3, &[]);
            let large: Vec<_> = s.iter().filter(|c| c.large_index).collect();
            assert_eq!(large.len(), 1);
            let (rows, cols) = (large[0].rows, large[0].cols);
            assert!(
                (rows - 2) * cols >= 1 << 32,
                "{rows} x {cols}: two whole rows past 2^32"
            );
            assert_ne!(large[0].dtype, DType::F32);
            assert!(!large[0].check_batch && !large[0].measure_speed);
        }
    }

    #[test]
    fn requested_shapes_add_their_width_at_both_ends_and_every_decode_row() {
        let req = ShapeRequest::new(11008, 1, 300).unwrap();
        let s = suite(
            Op::RmsNorm,
            Semantics::Llama,
            &[DType::Bf16, DType::F32],
            true,
            9,
            &[req],
        );
        for dt in [DType::Bf16, DType::F32] {
            let rows: Vec<u64> = s
                .iter()
                .filter(|c| c.cols == 11008 && c.dtype == dt && !c.large_index)
                .map(|c| c.rows)
                .collect();
            assert!(rows.contains(&300), "{rows:?}");
            for r in 1..=64 {
                assert!(rows.contains(&r), "{dt} rows {r}: {rows:?}");
            }
            assert!(rows.iter().all(|&r| (1..=300).contains(&r)));
        }
    }

    #[test]
    fn distributions_have_their_shape() {
        let base = suite(Op::RmsNorm, Semantics::Llama, &[DType::Bf16], true, 7, &[])
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
        assert_eq!(bytes_moved(Op::SiluMul, DType::Bf16, 2, 8), 2 * 48);
    }

    #[test]
    fn gated_ops_draw_gate_and_up_of_the_output_shape_and_run_row_wise() {
        for op in [Op::SiluMul, Op::GeluTanhMul] {
            let s = suite(op, Semantics::Default, &[DType::Bf16], true, 4, &[]);
            let c = s.iter().find(|c| (c.rows, c.cols) == (7, 127)).unwrap();
            assert_eq!(
                c.constraint_size(),
                127,
                "a row-wise op: constraints on cols"
            );
            assert!(c.check_batch);
            let inp = generate(c);
            let up = inp.up.as_ref().expect("a gated op has up");
            assert_eq!((inp.x.name, up.name), ("gate", "up"));
            assert_eq!((inp.x.len(), up.len()), (7 * 127, 7 * 127));
            assert_ne!(inp.x.bytes, up.bytes, "gate and up are drawn apart");
            assert!(inp.weight.is_none() && inp.residual.is_none() && inp.bias.is_none());
            // special distributions reach both
            let nf = CaseSpec {
                dist: Dist::NonFinite,
                ..c.clone()
            };
            let inp = generate(&nf);
            for t in [&inp.x, inp.up.as_ref().unwrap()] {
                assert!(
                    (0..t.len()).any(|i| is_nan(DType::Bf16, bits_at(DType::Bf16, &t.bytes, i))),
                    "{}",
                    t.name
                );
            }
        }
    }
}
