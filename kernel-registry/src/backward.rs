//! The launch arithmetic of the backward ops (docs/spec.md section 2c, docs/backward.md): the
//! workspace a call needs and each entry's grid and block. The entries and their parameters are
//! [`Op::stages`]; this is what a caller computes to launch them.
//!
//! The workspace of `rms_norm_backward` holds `rows + ctas * cols` floats: the rows' `r`, then
//! one partial column sum per CTA of eager's own dw reduction. `ctas` is Reduce.cuh's
//! `ctas_per_output` for `sum(dim=0)` of a `[rows, cols]` tensor, which depends on the device's
//! SM count and threads per SM (eager's dw bits do too), so a call takes both.
//! [`col_config`] is that configuration; the kernel's `kb_col_cfg`
//! (kernels/rms_norm_llama_backward/kernel.cu) and the emulator's `col_config`
//! (python/kernelize/backward.py) compute the same, which tests pin: the C++ and Python against
//! each other on the CPU (python/tests/test_backward_order_on_cpu.py), this one against the
//! Python through `python/tests/fixtures/abi.json`'s `backward` table.
//!
//! The gated backward ops `silu_mul_backward` and `gelu_tanh_mul_backward`
//! (docs/backward-gated.md, [`Op::is_gated_backward`]) are elementwise: no workspace, and their
//! one entry `grad` loops over `rows * cols` elements, so any grid gives the same bits. So do the
//! activations' backward ops `silu_backward`, `gelu_backward` and `gelu_tanh_backward`
//! ([`Op::is_activation_backward`]), whose one entry `grad` loops over `n` elements.
//!
//! `layer_norm_backward` (docs/backward-layer-norm.md) has no workspace either: `dx` is one
//! 128-thread block a row (eager's launch), `dwdb` one 2-D block a tile of columns, sized by
//! [`dwdb_dims`] for speed; both loop over their work, so their bits depend on no grid or block
//! the rule may choose. It takes at most [`Op::max_rows`] rows.

use crate::domain::Op;
use crate::manifest::LaunchDims;

/// Reduce.cuh's `setReduceConfig` for `sum(dim=0)` of a fresh contiguous `[rows, cols]` tensor
/// (the outer reduction; docs/backward.md, "The column sum").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColConfig {
    /// Output vector size: 4, 2 or 1 columns a thread (by `cols % 4`).
    pub out_vec: u64,
    /// Block width (lanes over outputs) and height (warp-rows).
    pub bw: u64,
    pub bh: u64,
    /// Whether the block's warp-rows share each column (`rows >= min(16 * bh, 256)`).
    pub split: bool,
    /// CTAs per output (the global reduce when > 1).
    pub ctas: u64,
    /// The row stride of one thread's chain (`step_input`).
    pub step: u64,
}

fn last_pow2(n: u64) -> u64 {
    if n == 0 {
        1
    } else {
        1 << (63 - n.leading_zeros())
    }
}

/// Eager's outer-reduction configuration on a device with `sms` SMs of `threads_per_sm`
/// threads (`multiProcessorCount`, `maxThreadsPerMultiProcessor`).
pub fn col_config(rows: u64, cols: u64, sms: u64, threads_per_sm: u64) -> ColConfig {
    let out_vec = if cols.is_multiple_of(4) {
        4
    } else if cols.is_multiple_of(2) {
        2
    } else {
        1
    };
    let max_t = 512 / out_vec;
    let dim0 = cols / out_vec;
    let d0 = if dim0 < max_t { last_pow2(dim0) } else { max_t };
    let d1 = if rows < max_t { last_pow2(rows) } else { max_t };
    let bw = d0.min(32);
    let bh = d1.min(max_t / bw);
    let bw = d0.min(max_t / bh);
    let (mut step_in, mut step_out) = (1u64, bw);
    let split = rows >= (bh * 16).min(256);
    if split {
        step_in *= bh;
    } else {
        step_out *= bh;
    }
    let target = sms.saturating_mul(threads_per_sm / (bw * bh));
    let grid_x = dim0.div_ceil(step_out);
    let vpt = rows.div_ceil(step_in);
    let mut ctas = 1;
    if split && vpt >= 256 && grid_x <= target {
        ctas = target
            .div_ceil(grid_x.max(1))
            .min(vpt.div_ceil(16))
            .max(vpt.div_ceil(256));
        if ctas > 1 {
            step_in *= ctas;
        }
    }
    ColConfig {
        out_vec,
        bw,
        bh,
        split,
        ctas,
        step: step_in,
    }
}

/// A device's figures that a backward launch depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceShape {
    /// `multiProcessorCount`.
    pub sms: u64,
    /// `maxThreadsPerMultiProcessor`.
    pub threads_per_sm: u64,
}

/// Why `op` has no backward launch arithmetic, or why the problem is out of the ABI's range.
fn check(op: Op, rows: u64, cols: u64, dev: DeviceShape) -> Result<(), String> {
    if !op.is_backward() {
        return Err(format!(
            "{op} is not a backward op (docs/spec.md section 2c)"
        ));
    }
    if rows == 0 || cols == 0 {
        return Err(format!(
            "{op}: an empty problem ({rows} x {cols}) launches nothing"
        ));
    }
    if let Some(max) = op.max_rows().filter(|&m| rows > m) {
        return Err(format!(
            "{op}: {rows} rows is more than the {max} the op takes (eager's column sum beyond is a \
             two-pass reduction split by the SM count, not implemented: docs/backward-layer-norm.md); \
             run eager autograd for this shape"
        ));
    }
    // (the gated backward's grid needs an SM; rms_norm_backward's column sum a device eager's
    // reduction is configured for)
    if dev.sms == 0 || (op.verdict_depends_on_device() && dev.threads_per_sm < 512) {
        return Err(format!(
            "{op}: a device of {} SMs x {} threads per SM is not one eager's reduction runs on",
            dev.sms, dev.threads_per_sm
        ));
    }
    Ok(())
}

/// The workspace `ws` of one call, in floats: `rows + ctas * cols` for rms_norm_backward
/// (docs/backward.md); none for the gated backward ops and layer_norm_backward.
pub fn workspace_floats(op: Op, rows: u64, cols: u64, dev: DeviceShape) -> Result<u64, String> {
    check(op, rows, cols, dev)?;
    if !op.verdict_depends_on_device() {
        return Ok(0);
    }
    let c = col_config(rows, cols, dev.sms, dev.threads_per_sm);
    c.ctas
        .checked_mul(cols)
        .and_then(|p| p.checked_add(rows))
        .ok_or_else(|| format!("{op}: the workspace of {rows} x {cols} overflows"))
}

/// The workspace in bytes (f32 elements).
pub fn workspace_bytes(op: Op, rows: u64, cols: u64, dev: DeviceShape) -> Result<u64, String> {
    workspace_floats(op, rows, cols, dev)?
        .checked_mul(4)
        .ok_or_else(|| format!("{op}: the workspace of {rows} x {cols} overflows"))
}

/// Blocks per SM of the persistent entries' grids (dx, dwp): the probe's plan
/// (scripts/backward_probe.py). Any grid of at least one block gives the same bits (the entries
/// loop over their work); this only sizes it.
pub const DX_BLOCKS_PER_SM: u64 = 8;
pub const DWP_BLOCKS_PER_SM: u64 = 16;
/// Blocks per SM at most of the gated backward ops' `grad` grid (grid-stride over its elements: any
/// grid of at least one block gives the same bits; this caps it for large problems).
pub const GRAD_BLOCKS_PER_SM: u64 = 16;

/// Whether entry `stage` of `op` gives the same bits at any grid of at least one block (it loops
/// over its work): rms_norm_backward's `dx` and `dwp` (persistent), the gated backward's `grad`
/// (grid-stride), layer_norm_backward's `dx` (blocks loop over rows) and `dwdb` (over column
/// tiles); not rms_norm_backward's `dw` (one thread a column). The verifier launches these at
/// other grids too.
pub fn any_grid(op: Op, stage: &str) -> bool {
    match (op, stage) {
        (op, "grad") if op.is_gated_backward() || op.is_activation_backward() => true,
        _ => matches!(
            (op, stage),
            (
                Op::RmsNormBackward | Op::FusedAddRmsNormBackward,
                "dx" | "dwp"
            ) | (Op::LayerNormBackward, "dx" | "dwdb")
        ),
    }
}

/// layer_norm_backward's `dwdb` at or above this many columns (even) takes two adjacent columns
/// a thread where `dy` and `x` allow (kernel.cu's `LB_GB_VC2_COLS`); the rule assumes they do.
pub const DWDB_TWO_COLUMNS_FROM: u64 = 4096;

/// Grid and block of layer_norm_backward's `dwdb` (docs/backward-layer-norm.md, "dw/db as fast
/// as the order allows"; measured on an H200): under 64 rows a block per 32 columns, (32, 8)
/// from 33 rows (the rows staged through shared memory), (32, 1) below; else block (bx, bdy),
/// bdy = 8 / 16 / 32 under 128 / 256 rows / above (eager's chains), a tile of vc * bx columns
/// (vc = 2 at even cols >= [`DWDB_TWO_COLUMNS_FROM`]), bx the widest of 32, 16, 8 (16, 8 under
/// 1024 rows) that gives at least 0.9 tiles a multiprocessor (else 8), a block a tile. The kernel
/// takes any (bx in 8, 16, 32; bdy <= by <= 32) block and any grid with the same bits.
pub fn dwdb_dims(rows: u64, cols: u64, sms: u64) -> (u64, [u32; 3]) {
    let bdy: u32 = match rows {
        0..64 => 1,
        64..128 => 8,
        128..256 => 16,
        _ => 32,
    };
    if bdy == 1 {
        return (cols.div_ceil(32), [32, if rows > 32 { 8 } else { 1 }, 1]);
    }
    let vc = if cols.is_multiple_of(2) && cols >= DWDB_TWO_COLUMNS_FROM {
        2
    } else {
        1
    };
    let widths: &[u64] = if rows >= 1024 { &[32, 16, 8] } else { &[16, 8] };
    let bx = widths
        .iter()
        .copied()
        .find(|&b| cols.div_ceil(vc * b).saturating_mul(10) >= sms.saturating_mul(9))
        .unwrap_or(8);
    (cols.div_ceil(vc * bx), [bx as u32, bdy, 1])
}

/// Grid and block of the entry named `stage` of `op` on `rows x cols` (no dynamic shared
/// memory): `dx` persistent over rows (at most one block a row), `dwp` persistent over its
/// (column group, CTA) items, `dw` one thread a column; the gated backward's `grad` one thread
/// an element up to [`GRAD_BLOCKS_PER_SM`] blocks per SM (grid-stride beyond);
/// layer_norm_backward's `dx` a block a row, `dwdb` by [`dwdb_dims`]. The block is the ABI's
/// ([`crate::domain::Stage::block`]) where it fixes one.
pub fn stage_dims(
    op: Op,
    stage: &str,
    rows: u64,
    cols: u64,
    dev: DeviceShape,
) -> Result<LaunchDims, String> {
    check(op, rows, cols, dev)?;
    let Some(s) = op.stages().iter().find(|s| s.name == stage) else {
        return Err(format!(
            "{op} has no entry `{stage}` (its entries: {})",
            op.stages()
                .iter()
                .map(|s| s.name)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    };
    let fixed = s
        .block
        .ok_or_else(|| format!("{op}: entry `{stage}` has no block in the ABI"));
    let (blocks, block) = match (op, stage) {
        (Op::RmsNormBackward | Op::FusedAddRmsNormBackward, "dx") => {
            (rows.min(DX_BLOCKS_PER_SM * dev.sms), [fixed?, 1, 1])
        }
        (Op::RmsNormBackward | Op::FusedAddRmsNormBackward, "dwp") => {
            let c = col_config(rows, cols, dev.sms, dev.threads_per_sm);
            let b = cols
                .div_ceil(4)
                .saturating_mul(c.ctas)
                .min(DWP_BLOCKS_PER_SM * dev.sms);
            (b, [fixed?, 1, 1])
        }
        (Op::RmsNormBackward | Op::FusedAddRmsNormBackward, "dw") => {
            (cols.div_ceil(u64::from(fixed.clone()?)), [fixed?, 1, 1])
        }
        // (an activation's backward takes n = rows * cols: the same count)
        (op, "grad") if op.is_gated_backward() || op.is_activation_backward() => {
            let b = rows
                .saturating_mul(cols)
                .div_ceil(u64::from(fixed.clone()?))
                .min(GRAD_BLOCKS_PER_SM.saturating_mul(dev.sms));
            (b, [fixed?, 1, 1])
        }
        // eager's launch: a block a row
        (Op::LayerNormBackward, "dx") => (rows, [fixed?, 1, 1]),
        (Op::LayerNormBackward, "dwdb") => dwdb_dims(rows, cols, dev.sms),
        (_, other) => unreachable!("Op::stages of {op} names `{other}` without launch arithmetic"),
    };
    let blocks = blocks.max(1);
    if blocks > i32::MAX as u64 {
        return Err(format!(
            "{op} `{stage}`: a grid of {blocks} blocks exceeds CUDA's limit of 2^31-1"
        ));
    }
    Ok(LaunchDims {
        grid: [blocks as u32, 1, 1],
        block,
        shared_mem_bytes: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100: DeviceShape = DeviceShape {
        sms: 132,
        threads_per_sm: 2048,
    };

    /// docs/backward.md's table of the probe's shapes (132 SMs, 2048 threads per SM), and the
    /// H100 PCIe's 29 CTAs at 4096 x 8192.
    #[test]
    fn ctas_are_the_documented_ones() {
        let want: [(u64, [u64; 6]); 2] = [
            (4096, [64, 64, 64, 64, 53, 33]),
            (16384, [256, 132, 106, 66, 53, 33]),
        ];
        for (rows, ctas) in want {
            for (cols, c) in [1024, 2048, 2560, 4096, 5120, 8192].into_iter().zip(ctas) {
                let cfg = col_config(rows, cols, 132, 2048);
                assert_eq!((cfg.ctas, cfg.bw, cfg.bh), (c, 32, 4), "{rows} x {cols}");
                assert_eq!(cfg.step, 4 * c, "{rows} x {cols}");
            }
        }
        for rows in [1, 2, 3, 7, 15, 63] {
            let c = col_config(rows, 4096, 132, 2048);
            assert!(!c.split && c.ctas == 1, "{rows}: {c:?}");
        }
        for rows in [64, 128, 1000, 1020] {
            let c = col_config(rows, 4096, 132, 2048);
            assert!(c.split && c.ctas == 1 && c.bh == 4, "{rows}: {c:?}");
        }
        assert!(col_config(1021, 4096, 132, 2048).ctas > 1);
        assert_eq!(col_config(1, 4096, 132, 2048).bw, 128);
        assert_eq!(col_config(2, 4096, 132, 2048).bh, 2);
        assert_eq!(col_config(4096, 8192, 114, 2048).ctas, 29);
        // odd widths: one column a thread, 512 threads
        let c = col_config(4096, 1001, 132, 2048);
        assert_eq!((c.out_vec, c.bw * c.bh), (1, 512));
    }

    #[test]
    fn the_workspace_is_r_then_one_partial_row_per_cta() {
        let op = Op::RmsNormBackward;
        assert_eq!(workspace_floats(op, 4096, 8192, H100), Ok(4096 + 33 * 8192));
        assert_eq!(workspace_floats(op, 7, 4096, H100), Ok(7 + 4096));
        assert_eq!(workspace_bytes(op, 7, 4096, H100), Ok(4 * (7 + 4096)));
        // the kernel's documented bound: rows + cols * max(1, ceil(rows / 16)) always suffices
        for rows in [1, 15, 64, 1021, 4096, 16384, 100_000] {
            for cols in [1, 3, 64, 1001, 4096, 8192, 65536] {
                for sms in [1, 2, 114, 132] {
                    let dev = DeviceShape {
                        sms,
                        threads_per_sm: 2048,
                    };
                    let ws = workspace_floats(op, rows, cols, dev).unwrap();
                    assert!(
                        ws <= rows + cols * rows.div_ceil(16).max(1),
                        "{rows} x {cols}"
                    );
                }
            }
        }
    }

    #[test]
    fn bad_calls_say_why() {
        let e = workspace_floats(Op::RmsNorm, 4, 4, H100).unwrap_err();
        assert!(e.contains("not a backward op"), "{e}");
        let e = workspace_floats(Op::RmsNormBackward, 0, 4, H100).unwrap_err();
        assert!(e.contains("empty problem"), "{e}");
        let dev = DeviceShape {
            sms: 0,
            threads_per_sm: 2048,
        };
        assert!(workspace_floats(Op::RmsNormBackward, 4, 4, dev).is_err());
        let e = stage_dims(Op::RmsNormBackward, "db", 4, 4, H100).unwrap_err();
        assert!(e.contains("its entries: dx, dwp, dw"), "{e}");
        let e = workspace_floats(Op::RmsNormBackward, u64::MAX / 2, 4096, H100).unwrap_err();
        assert!(e.contains("overflows"), "{e}");
    }

    /// The parameter types of an entry's parameter list, names dropped and spaces removed
    /// (`i64` read as `long long`): what the kernel tests compare with the ABI's.
    fn param_types(params: &str) -> Vec<String> {
        params
            .split(',')
            .map(|p| {
                let p = p.trim().replace("i64", "long long");
                let name_at = p.rfind([' ', '*']).unwrap();
                p[..=name_at].replace(' ', "")
            })
            .collect()
    }

    /// Entry `stage`'s parameter list in the source of kernel `k` (`rms_norm_llama`, ...) and the
    /// first `__launch_bounds__` argument it is compiled with. The RMSNorm engine's kernels
    /// (kernels/src/rms_backward.cuh) make their entries with its `KB_ENTRIES(K, NAME, T,
    /// RESID)` through `KB_KERNEL(k, RESID)` (dx takes `dres` where RESID is 1); the others
    /// spell `<k>_bwd_<stage>_##NAME(` themselves.
    fn entry_in_source<'s>(src: &'s str, k: &str, stage: &str) -> (String, &'s str) {
        let own = format!("{k}_bwd_{stage}_##NAME(");
        let (at, resid) = match src.find(&own) {
            Some(at) => (at + own.len(), None),
            None => {
                let call = format!("KB_KERNEL({k}, ");
                let c = src
                    .find(&call)
                    .unwrap_or_else(|| panic!("no {own} nor {call}"));
                let r = &src[c + call.len()..c + call.len() + 1];
                let head = format!("K##_bwd_{stage}_##NAME(");
                let at = src.find(&head).unwrap_or_else(|| panic!("no {head}")) + head.len();
                (at, Some(r == "1"))
            }
        };
        // the list ends at the body's brace (the engine's holds `KB_DRES_PARAM_##RESID(T)`)
        let mut params = src[at..at + src[at..].find(") {").unwrap()].replace('\\', " ");
        if let Some(resid) = resid {
            let dres = if resid { "const T* dres," } else { "" };
            params = params.replace("KB_DRES_PARAM_##RESID(T)", dres);
        }
        let bound = src[..at].rsplit("__launch_bounds__(").next().unwrap();
        (params, bound.split([',', ')']).next().unwrap())
    }

    /// The kernels of docs/backward.md (rms_norm_backward, semantics llama and gemma) and of
    /// docs/backward-rms-torch.md (semantics torch) spell each
    /// entry with the ABI's parameter types, in order (their names may differ: `tps` for
    /// `threads_per_sm`; `i64` is `long long`).
    #[test]
    fn the_backward_kernel_has_the_abi_of_every_entry() {
        for sem in ["llama", "gemma", "torch"] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(format!("../kernels/rms_norm_{sem}_backward/kernel.cu"));
            let src = std::fs::read_to_string(&path).unwrap();
            for s in Op::RmsNormBackward.stages() {
                let (params, threads) = entry_in_source(&src, &format!("rms_norm_{sem}"), s.name);
                assert_eq!(
                    param_types(&params),
                    param_types(s.params),
                    "{sem} {}",
                    s.name
                );
                // the block the ABI fixes is the one the kernel is compiled for
                let want = match threads {
                    "KB_DX_THREADS" => 512,
                    "KB_DW_THREADS" => 128,
                    other => panic!("{other}"),
                };
                assert_eq!(s.block, Some(want), "{sem} {}", s.name);
            }
            assert!(src.contains("#define KB_DX_THREADS 512"), "{sem}");
            assert!(src.contains("#define KB_DW_THREADS 128"), "{sem}");
        }
    }

    /// The kernel folders `kernels/rms_norm_llama_backward/`, `kernels/rms_norm_gemma_backward/`
    /// and `kernels/rms_norm_torch_backward/`
    /// (the one home of each manifest: the GPU check, the training check and the client's tests
    /// load them) have the manifest form of docs/backward.md and fit their source: the source
    /// makes its symbols by token pasting, so it spells the nine of them out, and without them it
    /// is refused.
    #[test]
    fn the_backward_kernel_fits_the_manifest_form() {
        for (sem, want_sem) in [
            ("llama", crate::Semantics::Llama),
            ("gemma", crate::Semantics::Gemma),
            ("torch", crate::Semantics::Torch),
        ] {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(format!("../kernels/rms_norm_{sem}_backward"));
            let b = crate::KernelBundle::load_dir(&dir).unwrap();
            assert_eq!(
                (b.manifest.op, b.manifest.semantics),
                (Op::RmsNormBackward, want_sem)
            );
            assert_eq!(b.manifest.dtypes(), crate::DType::ALL);
            assert_eq!(
                b.manifest.entries[&crate::DType::F16],
                format!("rms_norm_{sem}_bwd_dx_f16")
            );
            for dt in crate::DType::ALL {
                for s in Op::RmsNormBackward.stages() {
                    assert_eq!(
                        b.manifest.stages[dt][s.name],
                        format!("rms_norm_{sem}_bwd_{}_{dt}", s.name)
                    );
                }
            }
            // The source makes its symbols by token pasting (`rms_norm_<sem>_bwd_dx_##NAME`),
            // and a bundle's check looks for each symbol's text: without the spelled-out list
            // the source is refused ...
            let toml = std::fs::read_to_string(dir.join("kernel.toml")).unwrap();
            let src = &b.source;
            let cut = src
                .find("// The entries KB_ENTRIES makes, spelled out")
                .or_else(|| src.find("// The entries KB_KERNEL makes"))
                .expect("kernel.cu spells its entries out");
            let e = crate::KernelBundle::from_parts(&toml, &src[..cut]).unwrap_err();
            assert_eq!(e.field_name(), Some("entry.bf16.dw"), "{sem}: {e}");
            // ... and the macro's instantiations name every dtype (from_parts only finds the
            // symbols as text)
            for dt in crate::DType::ALL {
                let own = format!("KB_ENTRIES({dt}, ");
                let engine = format!("(KB_ENTRIES(K, {dt}, ");
                let made = src.contains(&own)
                    || (src.contains(&engine)
                        && src.contains(&format!("KB_KERNEL(rms_norm_{sem}, ")));
                assert!(made, "{sem} {dt}");
            }
        }
    }

    /// fused_add_rms_norm_backward (docs/backward-fused-add.md): rms_norm_backward's workspace
    /// and grids; its bundled kernel spells each entry with the ABI's parameter types and blocks,
    /// and fits the manifest form.
    #[test]
    fn fused_add_rms_norm_backward_launches_as_rms_norm_backward_and_its_kernel_fits() {
        let op = Op::FusedAddRmsNormBackward;
        for (rows, cols) in [(1, 64), (1021, 4096), (16384, 4096), (3, 1001)] {
            assert_eq!(
                workspace_floats(op, rows, cols, H100),
                workspace_floats(Op::RmsNormBackward, rows, cols, H100)
            );
            for s in ["dx", "dwp", "dw"] {
                assert_eq!(
                    stage_dims(op, s, rows, cols, H100),
                    stage_dims(Op::RmsNormBackward, s, rows, cols, H100),
                    "{s}"
                );
                assert_eq!(any_grid(op, s), any_grid(Op::RmsNormBackward, s));
            }
        }
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../kernels/fused_add_rms_norm_backward");
        let src = std::fs::read_to_string(dir.join("kernel.cu")).unwrap();
        for s in op.stages() {
            let (params, threads) = entry_in_source(&src, "fused_add_rms_norm", s.name);
            assert_eq!(param_types(&params), param_types(s.params), "{}", s.name);
            let want = match threads {
                "KB_DX_THREADS" => 512,
                "KB_DW_THREADS" => 128,
                other => panic!("{other}"),
            };
            assert_eq!(s.block, Some(want), "{}", s.name);
        }
        let b = crate::KernelBundle::load_dir(&dir).unwrap();
        assert_eq!(
            (b.manifest.op, b.manifest.semantics),
            (op, crate::Semantics::Default)
        );
        for dt in crate::DType::ALL {
            for s in op.stages() {
                assert_eq!(
                    b.manifest.stages[dt][s.name],
                    format!("fused_add_rms_norm_bwd_{}_{dt}", s.name)
                );
            }
        }
    }

    /// silu_mul_backward: no workspace; `grad` one thread an element, at most
    /// GRAD_BLOCKS_PER_SM blocks per SM, at least one.
    #[test]
    fn silu_mul_backward_has_no_workspace_and_a_grid_stride_grid() {
        let op = Op::SiluMulBackward;
        for (rows, cols) in [(1, 1), (3, 5), (4096, 8192), (100_000, 65536)] {
            assert_eq!(workspace_floats(op, rows, cols, H100), Ok(0));
            assert_eq!(workspace_bytes(op, rows, cols, H100), Ok(0));
        }
        let dims = |r, c, dev| stage_dims(op, "grad", r, c, dev).unwrap();
        assert_eq!(dims(1, 1, H100).grid, [1, 1, 1]);
        assert_eq!(dims(3, 5, H100).grid, [1, 1, 1]);
        assert_eq!(dims(1, 256, H100).grid, [1, 1, 1]);
        assert_eq!(dims(1, 257, H100).grid, [2, 1, 1]);
        assert_eq!(dims(1000, 256, H100).grid, [1000, 1, 1]);
        assert_eq!(dims(2112, 256, H100).grid, [2112, 1, 1]);
        assert_eq!(dims(2113, 256, H100).grid, [16 * 132, 1, 1]);
        assert_eq!(dims(4096, 8192, H100).grid, [16 * 132, 1, 1]);
        assert_eq!(dims(4096, 8192, H100).block, [256, 1, 1]);
        assert_eq!(dims(4096, 8192, H100).shared_mem_bytes, 0);
        let small = DeviceShape {
            sms: 1,
            threads_per_sm: 256,
        };
        assert_eq!(dims(4096, 8192, small).grid, [16, 1, 1]);
        // larger than any grid: capped, never past CUDA's limit
        assert_eq!(
            dims(u64::MAX / 2, 2, H100).grid,
            [(GRAD_BLOCKS_PER_SM * 132) as u32, 1, 1]
        );
        let e = stage_dims(op, "dx", 4, 4, H100).unwrap_err();
        assert!(e.contains("its entries: grad"), "{e}");
        let e = stage_dims(op, "grad", 0, 4, H100).unwrap_err();
        assert!(e.contains("empty problem"), "{e}");
        let none = DeviceShape {
            sms: 0,
            threads_per_sm: 2048,
        };
        assert!(stage_dims(op, "grad", 4, 4, none).is_err());
    }

    /// gelu_tanh_mul_backward launches as silu_mul_backward does (one rule for the gated
    /// backward ops), and any other op has no `grad` entry.
    #[test]
    fn gelu_tanh_mul_backward_launches_as_the_silu_one() {
        let small = DeviceShape {
            sms: 1,
            threads_per_sm: 256,
        };
        for (rows, cols) in [
            (1, 1),
            (3, 5),
            (1, 257),
            (2113, 256),
            (4096, 8192),
            (7, 1001),
        ] {
            for dev in [H100, small] {
                assert_eq!(
                    stage_dims(Op::GeluTanhMulBackward, "grad", rows, cols, dev),
                    stage_dims(Op::SiluMulBackward, "grad", rows, cols, dev)
                );
                assert_eq!(
                    workspace_floats(Op::GeluTanhMulBackward, rows, cols, dev),
                    Ok(0)
                );
            }
        }
        let e = stage_dims(Op::LayerNormBackward, "grad", 4, 4, H100).unwrap_err();
        assert!(e.contains("no entry `grad`"), "{e}");
    }

    /// kernels/silu_mul_backward/kernel.cu spells its entry with the ABI's parameter types, in
    /// order (`i64` is `long long`), and the bundle fits the manifest form: one `grad` symbol
    /// per dtype, spelled out in the source (it makes them by token pasting).
    #[test]
    fn the_silu_mul_backward_kernel_fits_its_abi_and_manifest() {
        grad_kernel_fits(Op::SiluMulBackward, "silu_mul_bwd", "SMB_ENTRY");
    }

    /// kernels/gelu_tanh_mul_backward/kernel.cu likewise.
    #[test]
    fn the_gelu_tanh_mul_backward_kernel_fits_its_abi_and_manifest() {
        grad_kernel_fits(Op::GeluTanhMulBackward, "gelu_tanh_mul_bwd", "GMB_ENTRY");
    }

    /// kernels/{silu,gelu,gelu_tanh}_backward/kernel.cu likewise: the activations' backward ops
    /// (their entry `grad(T* dx, const T* dy, const T* x, long long n)`).
    #[test]
    fn the_activation_backward_kernels_fit_their_abi_and_manifest() {
        for (op, entry, mac) in [
            (Op::SiluBackward, "silu_bwd", "SB_ENTRY"),
            (Op::GeluBackward, "gelu_bwd", "GB_ENTRY"),
            (Op::GeluTanhBackward, "gelu_tanh_bwd", "GTB_ENTRY"),
        ] {
            grad_kernel_fits(op, entry, mac);
        }
    }

    /// The bundled kernel of a one-entry (`grad`) backward op `op` (kernels/<op>/): its entry
    /// macro `mac` makes `<entry>_<dt>` with the ABI's parameters, named in the manifest and
    /// spelled out.
    fn grad_kernel_fits(op: Op, entry: &str, mac: &str) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../kernels")
            .join(op.as_str());
        let src = std::fs::read_to_string(dir.join("kernel.cu")).unwrap();
        let [st] = op.stages() else {
            panic!("one stage")
        };
        let head = format!("{entry}_##NAME(");
        let at = src.find(&head).expect("the entry macro") + head.len();
        let params = src[at..at + src[at..].find(')').unwrap()].replace('\\', " ");
        assert_eq!(param_types(&params), param_types(st.params));
        let names: Vec<String> = params
            .split(',')
            .map(|p| p.trim().rsplit([' ', '*']).next().unwrap().to_string())
            .collect();
        assert_eq!(names, st.names());

        let b = crate::KernelBundle::load_dir(&dir).unwrap();
        let m = &b.manifest;
        assert_eq!((m.op, m.semantics), (op, crate::Semantics::Default));
        assert_eq!(m.dtypes(), crate::DType::ALL);
        assert!(m.launch.is_empty());
        for dt in crate::DType::ALL {
            let sym = format!("{entry}_{dt}");
            assert_eq!(m.entries[dt], sym);
            assert_eq!(m.stages[dt].len(), 1);
            assert_eq!(m.stages[dt]["grad"], sym);
            assert!(src.contains(&format!("{mac}({dt}, ")), "{dt}");
        }
        // without the spelled-out symbols the source is refused
        let toml = std::fs::read_to_string(dir.join("kernel.toml")).unwrap();
        let cut = src
            .find(&format!("// The entries {mac} makes, spelled out"))
            .expect("kernel.cu spells its entries out");
        let e = crate::KernelBundle::from_parts(&toml, &src[..cut]).unwrap_err();
        assert_eq!(e.field_name(), Some("entry.bf16.grad"), "{e}");
    }

    #[test]
    fn the_entries_that_take_any_grid() {
        let any: Vec<(Op, &str)> = Op::ALL
            .iter()
            .flat_map(|&op| op.stages().iter().map(move |s| (op, s.name)))
            .filter(|&(op, s)| any_grid(op, s))
            .collect();
        assert_eq!(
            any,
            [
                (Op::RmsNormBackward, "dx"),
                (Op::RmsNormBackward, "dwp"),
                (Op::SiluMulBackward, "grad"),
                (Op::LayerNormBackward, "dx"),
                (Op::LayerNormBackward, "dwdb"),
                (Op::GeluTanhMulBackward, "grad"),
                (Op::SiluBackward, "grad"),
                (Op::GeluBackward, "grad"),
                (Op::GeluTanhBackward, "grad"),
                (Op::FusedAddRmsNormBackward, "dx"),
                (Op::FusedAddRmsNormBackward, "dwp")
            ]
        );
    }

    /// The activations' backward ops launch `grad` as the gated backward ops do over the same
    /// element count (their `n` is the `rows * cols` of a call), with no workspace.
    #[test]
    fn the_activation_backward_ops_launch_as_the_gated_ones_over_n() {
        let small = DeviceShape {
            sms: 1,
            threads_per_sm: 256,
        };
        for op in [Op::SiluBackward, Op::GeluBackward, Op::GeluTanhBackward] {
            for (rows, cols) in [
                (1, 1),
                (3, 5),
                (1, 257),
                (2113, 256),
                (4096, 8192),
                (7, 1001),
            ] {
                for dev in [H100, small] {
                    assert_eq!(
                        stage_dims(op, "grad", rows, cols, dev),
                        stage_dims(Op::SiluMulBackward, "grad", rows, cols, dev),
                        "{op} {rows} x {cols}"
                    );
                    // the grid depends on the element count alone
                    assert_eq!(
                        stage_dims(op, "grad", rows, cols, dev),
                        stage_dims(op, "grad", 1, rows * cols, dev),
                        "{op} {rows} x {cols}"
                    );
                    assert_eq!(workspace_floats(op, rows, cols, dev), Ok(0));
                }
            }
            assert!(stage_dims(op, "grad", 0, 5, H100).is_err());
            let e = stage_dims(op, "dx", 4, 4, H100).unwrap_err();
            assert!(e.contains("its entries: grad"), "{e}");
        }
    }

    /// layer_norm_backward: no workspace; dx a block a row; dwdb by the launch rule, at the
    /// launches docs/backward-layer-norm.md's table names for an H200 (132 SMs); no more than
    /// 65536 rows.
    #[test]
    fn layer_norm_backward_launches_by_its_rule() {
        let op = Op::LayerNormBackward;
        let dims = |s, r, c| stage_dims(op, s, r, c, H100).unwrap();
        for (rows, cols) in [(1, 1), (3, 5), (4096, 8192), (65536, 65536)] {
            assert_eq!(workspace_floats(op, rows, cols, H100), Ok(0));
        }
        assert_eq!(dims("dx", 1, 4096).grid, [1, 1, 1]);
        assert_eq!(dims("dx", 65536, 8).grid, [65536, 1, 1]);
        assert_eq!(dims("dx", 7, 5).block, [128, 1, 1]);
        let dwdb = |r, c| {
            let d = dims("dwdb", r, c);
            (d.grid[0], [d.block[0], d.block[1]])
        };
        // (rows, cols) -> grid x block, the documented table's launches
        for ((rows, cols), want) in [
            ((64, 4096), (128, [16, 8])),
            ((256, 1024), (128, [8, 32])),
            ((256, 4096), (128, [16, 32])),
            ((1024, 8192), (128, [32, 32])),
            ((4096, 256), (32, [8, 32])),
            ((4096, 4096), (128, [16, 32])),
            ((8192, 1024), (128, [8, 32])),
            ((8192, 8192), (128, [32, 32])),
            ((8192, 16384), (256, [32, 32])),
        ] {
            assert_eq!(dwdb(rows, cols), want, "{rows} x {cols}");
        }
        // under 64 rows: eager's one chain, (32, 8) staged from 33 rows; 32 columns a block
        assert_eq!(dwdb(1, 4096), (128, [32, 1]));
        assert_eq!(dwdb(32, 4097), (129, [32, 1]));
        assert_eq!(dwdb(33, 100), (4, [32, 8]));
        assert_eq!(dwdb(63, 1), (1, [32, 8]));
        // the chains: 8 / 16 / 32 under 128 / 256 rows / above; odd columns take one a thread
        assert_eq!(dwdb(127, 4095).1, [16, 8]);
        assert_eq!(dwdb(128, 4097).1[1], 16);
        assert_eq!(dwdb(65536, 1).1, [8, 32]);
        // the block stays one the kernel takes: x in 8, 16, 32; y <= 32; a whole number of warps
        for rows in [1, 2, 33, 63, 64, 100, 128, 255, 256, 1023, 1024, 65536] {
            for cols in [1, 7, 32, 1000, 4096, 4099, 65536] {
                for sms in [1, 8, 114, 132, 1000] {
                    let dev = DeviceShape {
                        sms,
                        threads_per_sm: 2048,
                    };
                    let d = stage_dims(op, "dwdb", rows, cols, dev).unwrap();
                    let [x, y, z] = d.block;
                    assert!([8, 16, 32].contains(&x) && (1..=32).contains(&y) && z == 1);
                    assert_eq!((x * y) % 32, 0, "{rows} x {cols}");
                    assert!(d.grid[0] >= 1 && d.shared_mem_bytes == 0);
                }
            }
        }
        for s in ["dx", "dwdb"] {
            let e = stage_dims(op, s, 65537, 4096, H100).unwrap_err();
            assert!(
                e.contains("65537 rows") && e.contains("eager autograd"),
                "{e}"
            );
        }
        let e = workspace_floats(op, 100_000, 8, H100).unwrap_err();
        assert!(e.contains("more than the 65536"), "{e}");
    }

    /// kernels/layer_norm_backward/kernel.cu spells both entries with the ABI's parameter types
    /// and names, in order (`i64` is `long long`), dx compiled for the ABI's 128 threads, and the
    /// bundle fits the manifest form (the symbols spelled out: the source pastes them).
    #[test]
    fn the_layer_norm_backward_kernel_fits_its_abi_and_manifest() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels/layer_norm_backward");
        let src = std::fs::read_to_string(dir.join("kernel.cu")).unwrap();
        for st in Op::LayerNormBackward.stages() {
            let head = format!("ln_bwd_{}_##NAME(", st.name);
            let at = src.find(&head).expect("the entry macro") + head.len();
            let params = src[at..at + src[at..].find(')').unwrap()].replace('\\', " ");
            assert_eq!(param_types(&params), param_types(st.params), "{}", st.name);
            let names: Vec<String> = params
                .split(',')
                .map(|p| p.trim().rsplit([' ', '*']).next().unwrap().to_string())
                .collect();
            assert_eq!(names, st.names(), "{}", st.name);
        }
        assert!(src.contains("#define LB_DX_THREADS 128"));
        assert!(src.contains("__launch_bounds__(LB_DX_THREADS) ln_bwd_dx_##NAME("));
        assert!(src.contains(&format!("#define LB_GB_VC2_COLS {DWDB_TWO_COLUMNS_FROM}")));

        let b = crate::KernelBundle::load_dir(&dir).unwrap();
        let m = &b.manifest;
        assert_eq!(
            (m.op, m.semantics),
            (Op::LayerNormBackward, crate::Semantics::Default)
        );
        assert_eq!(m.dtypes(), crate::DType::ALL);
        assert!(m.launch.is_empty());
        for dt in crate::DType::ALL {
            for st in Op::LayerNormBackward.stages() {
                assert_eq!(m.stages[dt][st.name], format!("ln_bwd_{}_{dt}", st.name));
            }
            assert!(src.contains(&format!("LB_ENTRIES({dt}, ")), "{dt}");
        }
        let toml = std::fs::read_to_string(dir.join("kernel.toml")).unwrap();
        let cut = src
            .find("// The entries LB_ENTRIES makes, spelled out")
            .expect("kernel.cu spells its entries out");
        let e = crate::KernelBundle::from_parts(&toml, &src[..cut]).unwrap_err();
        assert!(
            e.field_name().is_some_and(|f| f.starts_with("entry.bf16.")),
            "{e}"
        );
    }

    #[test]
    fn every_entry_has_its_launch() {
        let op = Op::RmsNormBackward;
        let dims = |s, r, c| stage_dims(op, s, r, c, H100).unwrap();
        assert_eq!(dims("dx", 3, 4096).grid, [3, 1, 1]);
        assert_eq!(dims("dx", 16384, 4096).grid, [8 * 132, 1, 1]);
        assert_eq!(dims("dx", 1, 4096).block, [512, 1, 1]);
        assert_eq!(dims("dwp", 16384, 4096).grid, [16 * 132, 1, 1]);
        assert_eq!(dims("dwp", 1, 5).grid, [2, 1, 1]);
        assert_eq!(dims("dwp", 1, 5).block, [128, 1, 1]);
        assert_eq!(dims("dw", 4096, 8192).grid, [64, 1, 1]);
        assert_eq!(dims("dw", 1, 1).grid, [1, 1, 1]);
        for s in op.stages() {
            let d = dims(s.name, 5, 7);
            assert_eq!(Some(d.block[0]), s.block, "{}", s.name);
            assert_eq!(d.shared_mem_bytes, 0);
        }
    }
}
