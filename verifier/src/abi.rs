//! The kernel ABI on the device: the reference layers' source and symbols, a case's device
//! buffers and the argument list of each op's entry (docs/spec.md section 2), and the compile
//! jobs of a kernel's entries. What the executor (`crate::gpu`) and the measurements
//! (`crate::measure`) share, so that neither imports the other for it.

use crate::cases::{self, CaseInputs, CaseSpec};
use crate::cuda::{Arg, CompileJob, DevBuf, Gpu};
use crate::exec::ExecError;
use kernel_registry::backward::DeviceShape;
use kernel_registry::manifest::{entry_options, LaunchDims};
use kernel_registry::{DType, KernelBundle, Op, Semantics, Stage};

/// The ABI's alignment (`kernel_registry::ABI_ALIGN_BYTES`, its one home): the guard regions
/// keep it (`cuda::GUARD_BYTES`) and the address cases place buffers at every residue it allows
/// (`crate::measure::address`).
pub use kernel_registry::ABI_ALIGN_BYTES;

/// The tensors of a forward op's ABI (its pointer arguments), by their ABI names, in ABI order;
/// a backward op's are per entry ([`Stage::tensors`]), and this is empty for it.
pub fn abi_tensors(op: Op) -> Vec<&'static str> {
    match op.stages() {
        [s] if !op.is_backward() => s.tensors(),
        _ => Vec::new(),
    }
}

/// The reference layers' CUDA source (docs/reference-semantics.md).
pub const REFERENCE_SOURCE: &str = include_str!("reference.cu");

/// The reference entry for (op, semantics, dtype).
pub fn reference_symbol(op: Op, sem: Semantics, dt: DType) -> String {
    format!("{}{dt}", reference_prefix(op, sem))
}

/// What every reference entry of (op, semantics) is named with: `ref_{op}_{sem}_`, then the dtype
/// ([`reference_symbol`]) or the stage and the dtype ([`reference_stage_symbol`]).
pub fn reference_prefix(op: Op, sem: Semantics) -> String {
    format!("ref_{op}_{sem}_")
}

/// The reference entry of one stage of a backward op (its [`Op::stages`], the candidate's ABI).
pub fn reference_stage_symbol(op: Op, sem: Semantics, stage: &Stage, dt: DType) -> String {
    format!("{}{}_{dt}", reference_prefix(op, sem), stage.name)
}

pub(crate) fn reference_digest() -> String {
    format!(
        "builtin-reference-{}",
        crate::cases::stable_hash(REFERENCE_SOURCE)
    )
}

/// Launch dimensions of the reference layers.
pub fn reference_dims(op: Op, rows: u64, cols: u64) -> LaunchDims {
    // Row-wise references: one 512-thread block per row (reference.cu's RB).
    let (grid, threads) = match op {
        Op::RmsNorm | Op::FusedAddRmsNorm | Op::LayerNorm | Op::FusedAddLayerNorm => {
            (rows.max(1), 512)
        }
        _ => ((rows * cols).div_ceil(256).clamp(1, 1 << 20), 256),
    };
    LaunchDims {
        grid: [grid as u32, 1, 1],
        block: [threads, 1, 1],
        shared_mem_bytes: 0,
    }
}

/// Device copies of a case's inputs (`residual` is the pristine copy; launches get their own).
pub(crate) struct Bufs {
    /// `x`, or the gate of a gated op.
    pub x: DevBuf,
    /// The `up` tensor of a gated op (`[rows, cols]` like the gate).
    pub up: Option<DevBuf>,
    pub residual: Option<DevBuf>,
    pub weight: Option<DevBuf>,
    pub bias: Option<DevBuf>,
}

impl Bufs {
    pub fn upload(gpu: &Gpu, inp: &CaseInputs) -> Result<Bufs, ExecError> {
        let up = |t: &cases::HostTensor| -> Result<DevBuf, ExecError> {
            let b = gpu.alloc(t.bytes.len())?;
            gpu.upload(&b, &t.bytes)?;
            Ok(b)
        };
        Ok(Bufs {
            x: up(&inp.x)?,
            up: inp.up.as_ref().map(up).transpose()?,
            residual: inp.residual.as_ref().map(up).transpose()?,
            weight: inp.weight.as_ref().map(up).transpose()?,
            bias: inp.bias.as_ref().map(up).transpose()?,
        })
    }

    /// The tensors of a launch on these inputs, writing `out` (and `residual`, fused_add's
    /// launch copy).
    pub fn ptrs(&self, out: &DevBuf, residual: Option<&DevBuf>) -> Ptrs {
        Ptrs {
            out: out.ptr(),
            residual: residual.map(DevBuf::ptr),
            x: self.x.ptr(),
            up: self.up.as_ref().map(DevBuf::ptr),
            weight: self.weight.as_ref().map(DevBuf::ptr),
            bias: self.bias.as_ref().map(DevBuf::ptr),
        }
    }
}

/// Device addresses of one launch's tensors (`x`, `up` and `residual` may be slices of larger
/// buffers: batch compositions).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ptrs {
    pub out: u64,
    pub residual: Option<u64>,
    /// `x`, or the gate of a gated op.
    pub x: u64,
    pub up: Option<u64>,
    pub weight: Option<u64>,
    pub bias: Option<u64>,
}

/// Kernel arguments in the ABI order of docs/spec.md section 2, built from the one description of it
/// (`Op::abi_names`): `rows` rows of the tensors at `t`, the case's `eps`.
pub(crate) fn abi_args(spec: &CaseSpec, t: Ptrs, rows: u64) -> Vec<Arg> {
    let cols = spec.cols;
    let ptr = |p: Option<u64>, what: &str| {
        Arg::Ptr(p.unwrap_or_else(|| panic!("{}: the case has no {what}", spec.op)))
    };
    spec.op
        .abi_names()
        .into_iter()
        .map(|name| match name {
            "out" => Arg::Ptr(t.out),
            "x" | "gate" => Arg::Ptr(t.x),
            "up" => ptr(t.up, "up tensor"),
            "residual" => ptr(t.residual, "residual"),
            "w" => ptr(t.weight, "weight"),
            "b" => ptr(t.bias, "bias"),
            "rows" => Arg::I64(rows as i64),
            "cols" => Arg::I64(cols as i64),
            "n" => Arg::I64((rows * cols) as i64),
            "eps" => Arg::F32(spec.eps),
            other => unreachable!(
                "Op::abi of {} names `{other}`, unknown to the verifier",
                spec.op
            ),
        })
        .collect()
}

/// Device addresses of one call of a backward op (docs/spec.md section 2c), by the ABI names of
/// its stages' tensors ([`Stage::tensors`]): the gradients it writes, its workspace (`ws`,
/// `kernel_registry::backward::workspace_bytes` of f32, where the op has one), and its inputs.
#[derive(Debug, Clone, Default)]
pub(crate) struct BackwardPtrs(pub Vec<(&'static str, u64)>);

impl BackwardPtrs {
    /// The address of tensor `name`.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.0.iter().find(|(n, _)| *n == name).map(|&(_, p)| p)
    }
}

/// Kernel arguments of a backward op's entry `stage` in the ABI order of docs/spec.md section
/// 2c, built from its one description (`Op::stages`): its tensors at `t`, `rows x cols`, the
/// case's `eps`, the device's SM count and threads per SM (eager's dw order depends on both).
pub(crate) fn stage_args(
    stage: &Stage,
    t: &BackwardPtrs,
    rows: u64,
    cols: u64,
    eps: f32,
    dev: DeviceShape,
) -> Vec<Arg> {
    let tensors = stage.tensors();
    stage
        .names()
        .into_iter()
        .map(|name| match name {
            _ if tensors.contains(&name) => Arg::Ptr(t.get(name).unwrap_or_else(|| {
                panic!(
                    "entry `{}` takes tensor `{name}`, which the call has no address for",
                    stage.name
                )
            })),
            "rows" => Arg::I64(rows as i64),
            "cols" => Arg::I64(cols as i64),
            // an elementwise backward op's element count (the activations')
            "n" => Arg::I64((rows * cols) as i64),
            "eps" => Arg::F32(eps),
            "sms" => Arg::I64(dev.sms as i64),
            "threads_per_sm" => Arg::I64(dev.threads_per_sm as i64),
            other => unreachable!(
                "Op::stages names `{other}` in entry `{}`, unknown to the verifier",
                stage.name
            ),
        })
        .collect()
}

/// One module per dtype entry of the bundle: the author's options plus the dtype macro, named as
/// the clients name it (`cuda::module_what`).
pub(crate) fn entry_jobs<'a>(bundle: &'a KernelBundle, digest: &'a str) -> Vec<CompileJob<'a>> {
    let m = &bundle.manifest;
    m.entries
        .keys()
        .map(|&d| CompileJob {
            digest,
            what: crate::cuda::module_what(&m.name, d),
            source: &bundle.source,
            options: entry_options(&m.nvrtc_options, d),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel_registry::DType;

    fn spec(op: Op) -> CaseSpec {
        let sem = op.default_semantics();
        let mut s = cases::suite(op, sem, &[DType::Bf16], true, 1, &[])[0].clone();
        (s.rows, s.cols, s.eps) = (3, 5, 0.25);
        s
    }

    #[test]
    fn launch_arguments_follow_the_abi_of_every_op() {
        let t = Ptrs {
            out: 100,
            residual: Some(200),
            x: 300,
            up: Some(400),
            weight: Some(500),
            bias: Some(600),
        };
        let want = |op: Op| -> &'static str {
            match op {
                Op::RmsNorm => "[Ptr(100), Ptr(300), Ptr(500), I64(3), I64(5), F32(0.25)]",
                Op::FusedAddRmsNorm => {
                    "[Ptr(100), Ptr(200), Ptr(300), Ptr(500), I64(3), I64(5), F32(0.25)]"
                }
                Op::LayerNorm => {
                    "[Ptr(100), Ptr(300), Ptr(500), Ptr(600), I64(3), I64(5), F32(0.25)]"
                }
                Op::FusedAddLayerNorm => {
                    "[Ptr(100), Ptr(200), Ptr(300), Ptr(500), Ptr(600), I64(3), I64(5), F32(0.25)]"
                }
                Op::Silu | Op::Gelu | Op::GeluTanh => "[Ptr(100), Ptr(300), I64(15)]",
                Op::SiluAndMul => "[Ptr(100), Ptr(300), I64(3), I64(5)]",
                Op::SiluMul | Op::GeluTanhMul => "[Ptr(100), Ptr(300), Ptr(400), I64(3), I64(5)]",
                Op::RmsNormBackward
                | Op::SiluMulBackward
                | Op::LayerNormBackward
                | Op::GeluTanhMulBackward
                | Op::SiluBackward
                | Op::GeluBackward
                | Op::GeluTanhBackward
                | Op::FusedAddRmsNormBackward => unreachable!(),
            }
        };
        for &op in Op::ALL.iter().filter(|o| !o.is_backward()) {
            assert_eq!(format!("{:?}", abi_args(&spec(op), t, 3)), want(op), "{op}");
        }
    }

    #[test]
    fn the_tensors_of_each_op_are_its_pointer_arguments() {
        let want = |op: Op| -> &'static [&'static str] {
            match op {
                Op::RmsNorm => &["out", "x", "w"],
                Op::FusedAddRmsNorm => &["out", "residual", "x", "w"],
                Op::LayerNorm => &["out", "x", "w", "b"],
                Op::FusedAddLayerNorm => &["out", "residual", "x", "w", "b"],
                Op::Silu | Op::Gelu | Op::GeluTanh | Op::SiluAndMul => &["out", "x"],
                Op::SiluMul | Op::GeluTanhMul => &["out", "gate", "up"],
                Op::RmsNormBackward
                | Op::SiluMulBackward
                | Op::LayerNormBackward
                | Op::GeluTanhMulBackward
                | Op::SiluBackward
                | Op::GeluBackward
                | Op::GeluTanhBackward
                | Op::FusedAddRmsNormBackward => &[],
            }
        };
        for &op in Op::ALL {
            assert_eq!(abi_tensors(op), want(op), "{op}");
        }
    }

    #[test]
    #[should_panic(expected = "silu_mul: the case has no up tensor")]
    fn a_gated_launch_without_up_is_a_bug_that_names_it() {
        let t = Ptrs {
            out: 1,
            residual: None,
            x: 2,
            up: None,
            weight: None,
            bias: None,
        };
        abi_args(&spec(Op::SiluMul), t, 3);
    }

    #[test]
    fn backward_launch_arguments_follow_each_entrys_abi() {
        let t = BackwardPtrs(vec![
            ("dx", 100),
            ("dw", 200),
            ("ws", 300),
            ("dy", 400),
            ("x", 500),
            ("w", 600),
        ]);
        let dev = DeviceShape {
            sms: 132,
            threads_per_sm: 2048,
        };
        let op = Op::RmsNormBackward;
        let want = [
            "[Ptr(100), Ptr(300), Ptr(400), Ptr(500), Ptr(600), I64(3), I64(5), F32(0.25)]",
            "[Ptr(300), Ptr(400), Ptr(500), I64(3), I64(5), I64(132), I64(2048)]",
            "[Ptr(200), Ptr(300), I64(3), I64(5), I64(132), I64(2048)]",
        ];
        assert_eq!(op.stages().len(), want.len());
        for (s, want) in op.stages().iter().zip(want) {
            let args = stage_args(s, &t, 3, 5, 0.25, dev);
            assert_eq!(format!("{args:?}"), want, "{}", s.name);
        }
        // no single-entry ABI: the forward helpers give nothing for it
        assert!(abi_tensors(op).is_empty());
        // silu_mul_backward's one entry: both gradients, then dy, gate, up, rows, cols
        let t = BackwardPtrs(vec![
            ("d_gate", 100),
            ("d_up", 200),
            ("dy", 300),
            ("gate", 400),
            ("up", 500),
        ]);
        let [s] = Op::SiluMulBackward.stages() else {
            panic!("one stage")
        };
        assert_eq!(
            format!("{:?}", stage_args(s, &t, 3, 5, 0.25, dev)),
            "[Ptr(100), Ptr(200), Ptr(300), Ptr(400), Ptr(500), I64(3), I64(5)]"
        );
        assert!(abi_tensors(Op::SiluMulBackward).is_empty());
        // layer_norm_backward: dx from dy, x, the saved statistics and w; dw and db together
        let t = BackwardPtrs(vec![
            ("dx", 100),
            ("dw", 200),
            ("db", 300),
            ("dy", 400),
            ("x", 500),
            ("mean", 600),
            ("rstd", 700),
            ("w", 800),
        ]);
        let want = [
            "[Ptr(100), Ptr(400), Ptr(500), Ptr(600), Ptr(700), Ptr(800), I64(3), I64(5)]",
            "[Ptr(200), Ptr(300), Ptr(400), Ptr(500), Ptr(600), Ptr(700), I64(3), I64(5)]",
        ];
        for (s, want) in Op::LayerNormBackward.stages().iter().zip(want) {
            let args = stage_args(s, &t, 3, 5, 0.25, dev);
            assert_eq!(format!("{args:?}"), want, "{}", s.name);
        }
        // the activations' backward: dx, dy, x and the element count n = rows * cols
        let t = BackwardPtrs(vec![("dx", 100), ("dy", 200), ("x", 300)]);
        for op in [Op::SiluBackward, Op::GeluBackward, Op::GeluTanhBackward] {
            let [s] = op.stages() else {
                panic!("one stage")
            };
            assert_eq!(
                format!("{:?}", stage_args(s, &t, 3, 5, 0.25, dev)),
                "[Ptr(100), Ptr(200), Ptr(300), I64(15)]",
                "{op}"
            );
        }
    }

    #[test]
    #[should_panic(expected = "entry `grad` takes tensor `up`, which the call has no address for")]
    fn a_backward_launch_without_one_of_its_tensors_is_a_bug_that_names_it() {
        let t = BackwardPtrs(vec![("d_gate", 1), ("d_up", 2), ("dy", 3), ("gate", 4)]);
        let dev = DeviceShape {
            sms: 132,
            threads_per_sm: 2048,
        };
        stage_args(&Op::SiluMulBackward.stages()[0], &t, 3, 5, 0.25, dev);
    }

    /// The reference entries of the backward ops, by name (`reference_stage_symbol`): what
    /// reference.cu defines for each stage and dtype.
    #[test]
    fn the_backward_reference_symbols_are_named_by_op_semantics_stage_and_dtype() {
        let sym = |op: Op, dt| -> Vec<String> {
            op.stages()
                .iter()
                .map(|st| reference_stage_symbol(op, op.default_semantics(), st, dt))
                .collect()
        };
        assert_eq!(
            sym(Op::SiluMulBackward, DType::Bf16),
            ["ref_silu_mul_backward_default_grad_bf16"]
        );
        assert_eq!(
            sym(Op::SiluMulBackward, DType::F32),
            ["ref_silu_mul_backward_default_grad_f32"]
        );
        assert_eq!(
            sym(Op::GeluTanhMulBackward, DType::F16),
            ["ref_gelu_tanh_mul_backward_default_grad_f16"]
        );
        assert_eq!(
            sym(Op::RmsNormBackward, DType::F16),
            [
                "ref_rms_norm_backward_llama_dx_f16",
                "ref_rms_norm_backward_llama_dwp_f16",
                "ref_rms_norm_backward_llama_dw_f16"
            ]
        );
        assert_eq!(
            sym(Op::LayerNormBackward, DType::Bf16),
            [
                "ref_layer_norm_backward_default_dx_bf16",
                "ref_layer_norm_backward_default_dwdb_bf16"
            ]
        );
        // each defined once per dtype, by the REFS macro's instantiations
        assert!(REFERENCE_SOURCE.contains("void ref_silu_mul_backward_default_grad_##S("));
        assert!(REFERENCE_SOURCE.contains("void ref_gelu_tanh_mul_backward_default_grad_##S("));
        for dt in DType::ALL {
            assert!(
                REFERENCE_SOURCE
                    .lines()
                    .any(|l| l.starts_with("REFS(") && l.ends_with(&format!(", {dt})"))),
                "{dt}"
            );
        }
    }

    #[test]
    fn the_reference_has_every_op_with_its_abi() {
        // reference.cu spells each entry's parameters out; they must be the op's stages' (a
        // forward op's one entry is Op::abi), T = the dtype; a backward op's reference has the
        // candidate's entries, named by reference_stage_symbol.
        for &op in Op::ALL {
            for &sem in op.semantics() {
                for st in op.stages() {
                    let head = if op.is_backward() {
                        reference_stage_symbol(op, sem, st, DType::F32).replace("_f32", "_##S(")
                    } else {
                        format!("ref_{op}_{sem}_##S(")
                    };
                    let line = REFERENCE_SOURCE
                        .lines()
                        .find(|l| l.contains(&head))
                        .unwrap_or_else(|| panic!("reference.cu has no {head}"));
                    let params = line.split_once(&head).unwrap().1;
                    let params = &params[..params.find(')').unwrap()];
                    assert_eq!(params, st.params, "{op} ({sem}) {}", st.name);
                }
            }
        }
    }
}
