//! Newtypes for the words of docs/spec.md section 2, parsed once at the edge.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::fmt;
use std::str::FromStr;

/// A value that is not one of the allowed words; the message names what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} `{got}` is not valid: {allowed}")]
pub struct ParseError {
    pub what: &'static str,
    pub got: String,
    pub allowed: String,
}

macro_rules! word_enum {
    ($(#[$m:meta])* $name:ident, $what:literal, { $($var:ident => $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub enum $name { $($var),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$var),+];
            pub fn as_str(self) -> &'static str {
                match self { $($name::$var => $s),+ }
            }
        }
        impl FromStr for $name {
            type Err = ParseError;
            fn from_str(s: &str) -> Result<Self, ParseError> {
                match s { $($s => Ok($name::$var),)+
                    _ => Err(ParseError {
                        what: $what,
                        got: s.to_string(),
                        allowed: format!("one of {}", [$($s),+].join(", ")),
                    }),
                }
            }
        }
        impl TryFrom<String> for $name {
            type Error = ParseError;
            fn try_from(s: String) -> Result<Self, ParseError> { s.parse() }
        }
        impl From<$name> for String {
            fn from(v: $name) -> String { v.as_str().to_string() }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.as_str()) }
        }
    };
}

word_enum!(
    /// The operations of docs/spec.md section 2 (gelu and gelu_tanh counted as two entry names),
    /// and the backward ops of section 2c (`rms_norm_backward`: the gradients of `rms_norm`;
    /// `silu_mul_backward`: those of `silu_mul`; `layer_norm_backward`: those of `layer_norm`;
    /// `gelu_tanh_mul_backward`: those of `gelu_tanh_mul`; `silu_backward`, `gelu_backward`,
    /// `gelu_tanh_backward`: those of the elementwise activations, one backward op per forward op
    /// as the forward ops are one op per activation; `fused_add_rms_norm_backward`: those of
    /// `fused_add_rms_norm`, an HF decoder block's residual add and the LlamaRMSNorm after it).
    Op, "op", {
        RmsNorm => "rms_norm",
        FusedAddRmsNorm => "fused_add_rms_norm",
        LayerNorm => "layer_norm",
        FusedAddLayerNorm => "fused_add_layer_norm",
        Silu => "silu",
        SiluAndMul => "silu_and_mul",
        Gelu => "gelu",
        GeluTanh => "gelu_tanh",
        SiluMul => "silu_mul",
        GeluTanhMul => "gelu_tanh_mul",
        RmsNormBackward => "rms_norm_backward",
        SiluMulBackward => "silu_mul_backward",
        LayerNormBackward => "layer_norm_backward",
        GeluTanhMulBackward => "gelu_tanh_mul_backward",
        SiluBackward => "silu_backward",
        GeluBackward => "gelu_backward",
        GeluTanhBackward => "gelu_tanh_backward",
        FusedAddRmsNormBackward => "fused_add_rms_norm_backward",
    }
);

word_enum!(
    /// Which eager function a kernel claims to reproduce.
    Semantics, "semantics", {
        Llama => "llama",
        Gemma => "gemma",
        Torch => "torch",
        Default => "default",
    }
);

word_enum!(
    /// Storage dtype T of docs/spec.md section 2.
    DType, "dtype", {
        Bf16 => "bf16",
        F16 => "f16",
        F32 => "f32",
    }
);

impl Op {
    /// The semantics variants this op has; the first is the default.
    pub fn semantics(self) -> &'static [Semantics] {
        match self {
            Op::RmsNorm => &[Semantics::Llama, Semantics::Gemma, Semantics::Torch],
            // HF LlamaRMSNorm's and GemmaRMSNorm's backward (docs/backward.md): one ABI, the
            // same orders; llama stays the default (the first). F.rms_norm's (torch: eager's
            // _fused_rms_norm_backward, docs/backward-rms-torch.md): the same ABI, other orders.
            Op::RmsNormBackward => &[Semantics::Llama, Semantics::Gemma, Semantics::Torch],
            _ => &[Semantics::Default],
        }
    }
    pub fn default_semantics(self) -> Semantics {
        self.semantics()[0]
    }
    /// Row-wise ops take (rows, cols); elementwise ops take n.
    pub fn is_rowwise(self) -> bool {
        matches!(
            self,
            Op::RmsNorm
                | Op::FusedAddRmsNorm
                | Op::LayerNorm
                | Op::FusedAddLayerNorm
                | Op::SiluAndMul
                | Op::SiluMul
                | Op::GeluTanhMul
                | Op::RmsNormBackward
                | Op::SiluMulBackward
                | Op::LayerNormBackward
                | Op::GeluTanhMulBackward
                | Op::FusedAddRmsNormBackward
        )
    }
    /// A backward op (docs/spec.md section 2c): the gradients of [`Op::forward`]'s op under the
    /// same semantics, launched as the several entries of [`Op::stages`].
    pub fn is_backward(self) -> bool {
        self.forward().is_some()
    }
    /// The forward op whose gradients a backward op computes; `None` for a forward op.
    pub fn forward(self) -> Option<Op> {
        match self {
            Op::RmsNormBackward => Some(Op::RmsNorm),
            Op::SiluMulBackward => Some(Op::SiluMul),
            Op::LayerNormBackward => Some(Op::LayerNorm),
            Op::GeluTanhMulBackward => Some(Op::GeluTanhMul),
            Op::SiluBackward => Some(Op::Silu),
            Op::GeluBackward => Some(Op::Gelu),
            Op::GeluTanhBackward => Some(Op::GeluTanh),
            Op::FusedAddRmsNormBackward => Some(Op::FusedAddRmsNorm),
            _ => None,
        }
    }
    /// The entries one call of the op launches, in launch order on one stream, each with its
    /// ABI: the one description of every op's ABI (docs/spec.md sections 2 and 2c). A forward
    /// op has one entry ([`FORWARD_STAGE`], its ABI [`Op::abi`]); a backward op several, named
    /// in its manifest's `[entry.<dtype>]` tables.
    pub fn stages(self) -> &'static [Stage] {
        macro_rules! one {
            ($params:expr) => {{
                const S: &[Stage] = &[Stage {
                    name: FORWARD_STAGE,
                    params: $params,
                    block: None,
                }];
                S
            }};
        }
        match self {
            Op::RmsNorm => {
                one!("T* out, const T* x, const T* w, long long rows, long long cols, float eps")
            }
            Op::FusedAddRmsNorm => one!(
                "T* out, T* residual, const T* x, const T* w, long long rows, long long cols, float eps"
            ),
            Op::LayerNorm => one!(
                "T* out, const T* x, const T* w, const T* b, long long rows, long long cols, float eps"
            ),
            Op::FusedAddLayerNorm => one!(
                "T* out, T* residual, const T* x, const T* w, const T* b, long long rows, long long cols, float eps"
            ),
            Op::Silu | Op::Gelu | Op::GeluTanh => one!("T* out, const T* x, long long n"),
            Op::SiluAndMul => one!("T* out, const T* x, long long rows, long long cols"),
            Op::SiluMul | Op::GeluTanhMul => {
                one!("T* out, const T* gate, const T* up, long long rows, long long cols")
            }
            // docs/backward.md, "The kernel": dx and the rows' r into ws; the column sums'
            // per-CTA partials into ws; their global reduce into dw.
            Op::RmsNormBackward => &[
                Stage {
                    name: "dx",
                    params: "T* dx, float* ws, const T* dy, const T* x, const T* w, long long rows, long long cols, float eps",
                    block: Some(512),
                },
                RMS_NORM_DWP,
                RMS_NORM_DW,
            ],
            // docs/backward-fused-add.md: rms_norm_backward's (llama) entries with the gradient
            // `dres` reaching the residual output (x here is that output, h = residual + x, the
            // norm's input) added into dx as eager's engine adds it; dx is the gradient of both
            // of the forward's inputs (x and residual).
            Op::FusedAddRmsNormBackward => &[
                Stage {
                    name: "dx",
                    params: "T* dx, float* ws, const T* dy, const T* dres, const T* x, const T* w, long long rows, long long cols, float eps",
                    block: Some(512),
                },
                RMS_NORM_DWP,
                RMS_NORM_DW,
            ],
            // docs/backward-gated.md: eager autograd's chain for act(gate) * up (silu, gelu_tanh),
            // elementwise, both gradients in one launch (grid-stride over rows * cols).
            Op::SiluMulBackward | Op::GeluTanhMulBackward => &[Stage {
                name: "grad",
                params: "T* d_gate, T* d_up, const T* dy, const T* gate, const T* up, long long rows, long long cols",
                block: Some(256),
            }],
            // eager autograd's SiluBackward0 / GeluBackward0 (approximate 'none', 'tanh'): one
            // elementwise kernel, dx = round_T(f'(x) * dy) in f32 (docs/backward-activations.md);
            // elementwise like the forward ops, so `n` as theirs (grid-stride over n).
            Op::SiluBackward | Op::GeluBackward | Op::GeluTanhBackward => &[Stage {
                name: "grad",
                params: "T* dx, const T* dy, const T* x, long long n",
                block: Some(256),
            }],
            // docs/backward-layer-norm.md: eager's two kernels, from the forward's saved f32
            // statistics (`mean`, `rstd`, `rows` each): dx one 128-thread block a row; dw and db
            // one column-sum kernel whose block the launch rule sizes (`backward::stage_dims`).
            Op::LayerNormBackward => &[
                Stage {
                    name: "dx",
                    params: "T* dx, const T* dy, const T* x, const float* mean, const float* rstd, const T* w, long long rows, long long cols",
                    block: Some(128),
                },
                Stage {
                    name: "dwdb",
                    params: "T* dw, T* db, const T* dy, const T* x, const float* mean, const float* rstd, long long rows, long long cols",
                    block: None,
                },
            ],
        }
    }
    /// The gated ops of HF's MLPs: `act(gate) * up` on two `[rows, cols]` tensors.
    pub fn is_gated(self) -> bool {
        matches!(self, Op::SiluMul | Op::GeluTanhMul)
    }
    /// The backward ops of [`Op::is_gated`]'s ops (docs/backward-gated.md): one elementwise
    /// stage `grad` writing `d_gate` and `d_up` from (dy, gate, up), no workspace, any grid.
    pub fn is_gated_backward(self) -> bool {
        self.forward().is_some_and(Op::is_gated)
    }
    /// The backward ops of the elementwise activations (`silu`, `gelu`, `gelu_tanh`; eager's
    /// SiluBackward0 / GeluBackward0): one elementwise stage `grad` writing `dx` from (dy, x) over
    /// `n` elements, no workspace, any grid; elementwise (not row-wise) like their forward ops, so
    /// resolved and verified by element count as those are.
    pub fn is_activation_backward(self) -> bool {
        self.forward().is_some_and(|f| !f.is_rowwise())
    }
    /// The kernel ABI of docs/spec.md section 2: a forward op's entry's parameters after its
    /// name, `T` standing for the dtype's C type ([`DType::cuda_type`]); the verifier builds its
    /// launch arguments from these names (`abi::abi_args`), and `python/tests/fixtures/abi.json`
    /// (checked by a test here) carries them to the generator of the bundled kernels and the
    /// Python client's launches. A backward op has no single entry: it is the empty string
    /// there, and its entries' parameters are [`Op::stages`]'.
    pub fn abi(self) -> &'static str {
        match self.stages() {
            [s] if s.name == FORWARD_STAGE => s.params,
            _ => "",
        }
    }
    /// The parameter names of [`Op::abi`], in order.
    /// Empty for a backward op (its stages have their own: [`Stage::names`]).
    pub fn abi_names(self) -> Vec<&'static str> {
        param_names(self.abi())
    }
    /// Ops whose ABI takes a scalar `eps` (the norms).
    pub fn takes_eps(self) -> bool {
        matches!(
            self,
            Op::RmsNorm
                | Op::FusedAddRmsNorm
                | Op::LayerNorm
                | Op::FusedAddLayerNorm
                | Op::RmsNormBackward
                | Op::FusedAddRmsNormBackward
        )
    }
    /// The inputs of a backward op that are incoming gradients (`dy`; fused_add_rms_norm_backward's
    /// `dres` too): every gradient is linear in them, and computed with roundings that are
    /// symmetric in sign (round to nearest even), so negating them all negates every gradient bit
    /// for bit (up to the sign of a zero and a NaN's bits). What a Python candidate's setup
    /// function does not get (docs/spec.md section 2b). Empty for a forward op.
    pub fn incoming_gradients(self) -> &'static [&'static str] {
        match self {
            Op::FusedAddRmsNormBackward => &["dy", "dres"],
            _ if self.is_backward() => &["dy"],
            _ => &[],
        }
    }
    /// The gradients a backward op writes, each compared and classed on its own (docs/spec.md
    /// section 2c: a class per gradient); empty for a forward op. Each is a `T*` parameter of
    /// exactly one of [`Op::stages`], the stage that writes it ([`Op::gradient_stage`]); one
    /// stage may write several (silu_mul_backward's `grad`: `d_gate` and `d_up`).
    pub fn gradients(self) -> &'static [Gradient] {
        match self {
            Op::RmsNormBackward | Op::FusedAddRmsNormBackward => &[
                Gradient {
                    name: "dx",
                    one_row: false,
                },
                Gradient {
                    name: "dw",
                    one_row: true,
                },
            ],
            Op::SiluMulBackward | Op::GeluTanhMulBackward => &[
                Gradient {
                    name: "d_gate",
                    one_row: false,
                },
                Gradient {
                    name: "d_up",
                    one_row: false,
                },
            ],
            Op::SiluBackward | Op::GeluBackward | Op::GeluTanhBackward => &[Gradient {
                name: "dx",
                one_row: false,
            }],
            Op::LayerNormBackward => &[
                Gradient {
                    name: "dx",
                    one_row: false,
                },
                Gradient {
                    name: "dw",
                    one_row: true,
                },
                Gradient {
                    name: "db",
                    one_row: true,
                },
            ],
            _ => &[],
        }
    }
    /// The stage of [`Op::stages`] that writes gradient `name` (the one with a `T* name`
    /// parameter); `None` when no stage does (not a gradient of this op).
    pub fn gradient_stage(self, name: &str) -> Option<&'static Stage> {
        self.stages().iter().find(|s| s.writes().contains(&name))
    }
    /// Whether a backward op's verdict holds only for the device figures it was measured with
    /// (SM count, threads per SM): rms_norm_backward's (and fused_add_rms_norm_backward's) dw
    /// follows eager's column sum, whose
    /// split over CTAs depends on both. The gated backward ops (silu_mul_backward,
    /// gelu_tanh_mul_backward) and the activations' (silu_backward, gelu_backward,
    /// gelu_tanh_backward) are elementwise: their bits (and eager's) depend on no device figure,
    /// and any grid gives the same bits. layer_norm_backward's column sum is one-pass up to the
    /// rows the ABI takes ([`Op::max_rows`]), whose order depends on the rows alone.
    pub fn verdict_depends_on_device(self) -> bool {
        matches!(self, Op::RmsNormBackward | Op::FusedAddRmsNormBackward)
    }
    /// The most rows one call takes, where the ABI bounds them: layer_norm_backward's column sum
    /// is eager's one-pass kernel up to 65536 rows; above, eager runs a two-pass variant whose
    /// split depends on the SM count, which the op does not implement (docs/backward-layer-norm.md),
    /// so the launch arithmetic refuses those shapes and a client keeps eager autograd there.
    pub fn max_rows(self) -> Option<u64> {
        match self {
            Op::LayerNormBackward => Some(LN_BACKWARD_MAX_ROWS),
            _ => None,
        }
    }
    /// How many `rows x cols` tensors a launch writes and a verification compares:
    /// the fused adds write `out` and update `residual`; a backward op its gradients that are
    /// not one row (rms_norm_backward: `dx`, its `dw` is one row; silu_mul_backward: `d_gate`
    /// and `d_up`); every other op writes `out`.
    pub fn outputs(self) -> u64 {
        if self.updates_residual() {
            2
        } else if self.is_backward() {
            self.gradients().iter().filter(|g| !g.one_row).count() as u64
        } else {
            1
        }
    }
    /// The ops that add `x` into `residual` in place before normalising it (`residual :=
    /// round(x + residual)`): an input the launch also writes, compared as an output.
    pub fn updates_residual(self) -> bool {
        matches!(self, Op::FusedAddRmsNorm | Op::FusedAddLayerNorm)
    }
    /// The bytes one launch on `rows x cols` must move: every input read once and every output
    /// written once (weights and biases are one row). The speed of a case is this over its
    /// median time; the verifier and the hub's report checks use this one definition.
    pub fn bytes_moved(self, dt: DType, rows: u64, cols: u64) -> u64 {
        let e = dt.size_bytes() as u64;
        let n = rows.saturating_mul(cols);
        e.saturating_mul(match self {
            Op::RmsNorm => n.saturating_mul(2).saturating_add(cols),
            Op::FusedAddRmsNorm => n.saturating_mul(4).saturating_add(cols),
            Op::LayerNorm => n.saturating_mul(2).saturating_add(2 * cols),
            Op::FusedAddLayerNorm => n.saturating_mul(4).saturating_add(2 * cols),
            Op::Silu | Op::Gelu | Op::GeluTanh => n.saturating_mul(2),
            Op::SiluAndMul | Op::SiluMul | Op::GeluTanhMul => n.saturating_mul(3),
            // dy and x read, dx written; w read and dw written (the workspace is the kernel's
            // own traffic, not the problem's).
            Op::RmsNormBackward => n.saturating_mul(3).saturating_add(2 * cols),
            // dy, gate and up read, d_gate and d_up written.
            Op::SiluMulBackward | Op::GeluTanhMulBackward => n.saturating_mul(5),
            // dy, dres and x read, dx written; w read and dw written.
            Op::FusedAddRmsNormBackward => n.saturating_mul(4).saturating_add(2 * cols),
            // dy and x read, dx written.
            Op::SiluBackward | Op::GeluBackward | Op::GeluTanhBackward => n.saturating_mul(3),
            // dy and x read, dx written; w read, dw and db written (mean and rstd, f32, below).
            Op::LayerNormBackward => n.saturating_mul(3).saturating_add(3 * cols),
        })
        .saturating_add(match self {
            // mean and rstd: 4 bytes each a row, whatever T is.
            Op::LayerNormBackward => rows.saturating_mul(8),
            _ => 0,
        })
    }
    /// Parse the semantics for this op, checking it is one this op has.
    pub fn check_semantics(self, s: Semantics) -> Result<Semantics, ParseError> {
        if self.semantics().contains(&s) {
            Ok(s)
        } else {
            Err(ParseError {
                what: "semantics",
                got: s.to_string(),
                allowed: format!(
                    "for op {self}: one of {}",
                    self.semantics()
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })
        }
    }
}

/// One gradient of a backward op ([`Op::gradients`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gradient {
    /// Its name: the ABI's parameter (`dx`, `dw`) and the key of its report.
    pub name: &'static str,
    /// A parameter's gradient (`[cols]`, summed over the rows) rather than an input's
    /// (`[rows, cols]`).
    pub one_row: bool,
}

impl Gradient {
    /// Its elements for a `rows x cols` problem.
    pub fn elements(&self, rows: u64, cols: u64) -> u64 {
        if self.one_row {
            cols
        } else {
            rows.saturating_mul(cols)
        }
    }
}

/// The ABI's alignment: every tensor a kernel is given starts at an address that is a multiple
/// of this many bytes, and nothing more is promised (docs/spec.md section 2). The one home of
/// the rule: the verifier's guards and address cases use it, and the Python client's
/// `kernelize.launch.ABI_ALIGNMENT` is checked against it (python/tests/fixtures/abi.json).
pub const ABI_ALIGN_BYTES: u64 = 16;

/// [`Op::max_rows`] of layer_norm_backward: eager's one-pass column sum's limit (`M <= 64 * 1024`
/// in `LaunchGammaBetaBackwardCUDAKernel`).
pub const LN_BACKWARD_MAX_ROWS: u64 = 65536;

/// The name of a forward op's one entry in [`Op::stages`] (its manifest's `[entry]` names one
/// symbol per dtype, no stage).
pub const FORWARD_STAGE: &str = "entry";

/// rms_norm_backward's column-sum stages (docs/backward.md, "The kernel"): the per-CTA partials
/// of dw into the workspace, then their global reduce; fused_add_rms_norm_backward has the same
/// two (its dx differs).
const RMS_NORM_DWP: Stage = Stage {
    name: "dwp",
    params: "float* ws, const T* dy, const T* x, long long rows, long long cols, long long sms, long long threads_per_sm",
    block: Some(128),
};
const RMS_NORM_DW: Stage = Stage {
    name: "dw",
    params: "T* dw, const float* ws, long long rows, long long cols, long long sms, long long threads_per_sm",
    block: Some(128),
};

/// One entry of an op's ABI: what a manifest names per dtype and a launch passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stage {
    /// The key of the entry in a backward kernel's `[entry.<dtype>]` table ([`FORWARD_STAGE`]
    /// for a forward op).
    pub name: &'static str,
    /// The parameters after the entry's name, as in [`Op::abi`].
    pub params: &'static str,
    /// Threads per block the ABI fixes for this entry (a backward op's; `None`: for a forward
    /// op the manifest's launch rule decides, for a backward op's entry the launch arithmetic,
    /// `backward::stage_dims`, as for layer_norm_backward's `dwdb`, whose 2-D block it sizes).
    pub block: Option<u32>,
}

impl Stage {
    /// The parameter names of [`Stage::params`], in order.
    pub fn names(&self) -> Vec<&'static str> {
        param_names(self.params)
    }
    /// The names of its pointer parameters (the tensors, and a backward op's workspace), in order.
    pub fn tensors(&self) -> Vec<&'static str> {
        self.params
            .split(',')
            .zip(self.names())
            .filter(|(param, _)| param.contains('*'))
            .map(|(_, name)| name)
            .collect()
    }
    /// The names of the tensors of T it writes (`T*` parameters, not `const`), in order: a
    /// forward op's `out` (and `residual`), a backward op's gradients. The workspace (`float*`)
    /// is not one.
    pub fn writes(&self) -> Vec<&'static str> {
        self.params
            .split(',')
            .zip(self.names())
            .filter(|(param, _)| param.trim().starts_with("T*"))
            .map(|(_, name)| name)
            .collect()
    }
}

/// The names of a parameter list `T* out, const T* x, long long n` (`out`, `x`, `n`).
fn param_names(params: &'static str) -> Vec<&'static str> {
    if params.is_empty() {
        return Vec::new();
    }
    params
        .split(',')
        .map(|p| p.trim().rsplit([' ', '*']).next().unwrap_or(""))
        .collect()
}

impl DType {
    pub fn size_bytes(self) -> usize {
        match self {
            DType::Bf16 | DType::F16 => 2,
            DType::F32 => 4,
        }
    }
    /// The C type name of this dtype in CUDA source.
    pub fn cuda_type(self) -> &'static str {
        match self {
            DType::Bf16 => "__nv_bfloat16",
            DType::F16 => "__half",
            DType::F32 => "float",
        }
    }
}

/// A CUDA compute capability, `sm_<major><minor>` (e.g. `sm_90`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Arch {
    pub major: u32,
    pub minor: u32,
}

impl Arch {
    pub fn new(major: u32, minor: u32) -> Self {
        Arch { major, minor }
    }
}

impl FromStr for Arch {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let err = || ParseError {
            what: "arch",
            got: s.to_string(),
            allowed: "sm_<major><minor> with a one-digit minor, e.g. sm_80, sm_89, sm_90, sm_100"
                .into(),
        };
        let digits = s.strip_prefix("sm_").ok_or_else(err)?;
        if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err());
        }
        let (maj, min) = digits.split_at(digits.len() - 1);
        let major: u32 = maj.parse().map_err(|_| err())?;
        if !(3..=20).contains(&major) {
            return Err(err());
        }
        Ok(Arch {
            major,
            minor: min.parse().map_err(|_| err())?,
        })
    }
}
impl TryFrom<String> for Arch {
    type Error = ParseError;
    fn try_from(s: String) -> Result<Self, ParseError> {
        s.parse()
    }
}
impl From<Arch> for String {
    fn from(a: Arch) -> String {
        a.to_string()
    }
}
impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}{}", self.major, self.minor)
    }
}

/// A content digest: `sha256:` followed by 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest(String);

impl Digest {
    pub fn of_bytes(bytes: &[u8]) -> Digest {
        Digest(format!("sha256:{}", hex::encode(Sha256::digest(bytes))))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The hex part alone, handy for file names and URLs.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }
}

impl FromStr for Digest {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        // Accept the bare hex too: it is what a URL path naturally carries.
        let hex_part = s.strip_prefix("sha256:").unwrap_or(s);
        if hex_part.len() == 64
            && hex_part
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(Digest(format!("sha256:{hex_part}")))
        } else {
            Err(ParseError {
                what: "digest",
                got: s.to_string(),
                allowed: "sha256:<64 lowercase hex digits> (or the 64 hex digits alone)".into(),
            })
        }
    }
}
impl TryFrom<String> for Digest {
    type Error = ParseError;
    fn try_from(s: String) -> Result<Self, ParseError> {
        s.parse()
    }
}
impl From<Digest> for String {
    fn from(d: Digest) -> String {
        d.0
    }
}
impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_reject_with_allowed_list() {
        for op in Op::ALL {
            assert_eq!(op.as_str().parse::<Op>().unwrap(), *op);
        }
        let e = "rmsnorm".parse::<Op>().unwrap_err();
        assert!(
            e.to_string().contains("rms_norm, fused_add_rms_norm"),
            "{e}"
        );
        assert!("bfloat16".parse::<DType>().is_err());
    }

    #[test]
    fn arch_parses_and_prints() {
        assert_eq!("sm_90".parse::<Arch>().unwrap(), Arch::new(9, 0));
        assert_eq!("sm_100".parse::<Arch>().unwrap(), Arch::new(10, 0));
        assert_eq!(Arch::new(8, 9).to_string(), "sm_89");
        for bad in ["90", "sm_9", "sm_x0", "sm_", "compute_90"] {
            assert!(bad.parse::<Arch>().is_err(), "{bad}");
        }
        assert!(Arch::new(8, 0) < Arch::new(9, 0));
    }

    #[test]
    fn digest_accepts_bare_hex_and_rejects_junk() {
        let d = Digest::of_bytes(b"abc");
        assert_eq!(d.hex().parse::<Digest>().unwrap(), d);
        assert!("sha256:XYZ".parse::<Digest>().is_err());
        assert!(d.as_str().to_uppercase().parse::<Digest>().is_err());
    }

    #[test]
    fn every_op_has_an_abi_with_out_first_and_its_sizes() {
        for op in Op::ALL.iter().filter(|o| !o.is_backward()) {
            assert_eq!(op.stages().len(), 1, "{op}");
            assert_eq!(op.stages()[0].name, FORWARD_STAGE, "{op}");
            assert_eq!(op.stages()[0].block, None, "{op}");
            let names = op.abi_names();
            assert_eq!(names[0], "out", "{op}");
            if op.is_rowwise() {
                assert!(
                    names.ends_with(&["rows", "cols", "eps"]) || names.ends_with(&["rows", "cols"]),
                    "{op}: {names:?}"
                );
            } else {
                assert_eq!(names.last(), Some(&"n"), "{op}");
            }
            assert_eq!(names.contains(&"eps"), op.takes_eps(), "{op}");
            assert_eq!(
                names.contains(&"gate") && names.contains(&"up"),
                op.is_gated(),
                "{op}"
            );
        }
        assert_eq!(
            Op::SiluMul.abi_names(),
            ["out", "gate", "up", "rows", "cols"]
        );
        assert_eq!(Op::GeluTanhMul.abi(), Op::SiluMul.abi());
    }

    #[test]
    fn backward_ops_launch_their_stages_with_the_gradients_and_a_workspace() {
        let op = Op::RmsNormBackward;
        assert!(op.is_backward() && !Op::RmsNorm.is_backward());
        assert_eq!(op.forward(), Some(Op::RmsNorm));
        assert_eq!(Op::RmsNorm.forward(), None);
        assert_eq!(
            op.semantics(),
            [Semantics::Llama, Semantics::Gemma, Semantics::Torch]
        );
        assert_eq!(op.default_semantics(), Semantics::Llama);
        assert!(op.check_semantics(Semantics::Gemma).is_ok());
        assert!(op.check_semantics(Semantics::Torch).is_ok());
        assert!(op.check_semantics(Semantics::Default).is_err());
        assert_eq!((op.abi(), op.abi_names()), ("", vec![]));
        let st = op.stages();
        let names: Vec<_> = st.iter().map(|s| s.name).collect();
        assert_eq!(names, ["dx", "dwp", "dw"]);
        assert_eq!(
            st[0].names(),
            ["dx", "ws", "dy", "x", "w", "rows", "cols", "eps"]
        );
        assert_eq!(st[0].tensors(), ["dx", "ws", "dy", "x", "w"]);
        assert_eq!(
            st[1].names(),
            ["ws", "dy", "x", "rows", "cols", "sms", "threads_per_sm"]
        );
        assert_eq!(
            st[2].names(),
            ["dw", "ws", "rows", "cols", "sms", "threads_per_sm"]
        );
        assert_eq!(st[2].tensors(), ["dw", "ws"]);
        // the workspace is f32 in every stage; the gradients and inputs are T
        for s in st {
            assert!(s.params.contains("float* ws"), "{}", s.name);
            assert!(s.block.is_some(), "{}", s.name);
        }
        // the bytes of the problem: dy, x read and dx written (rows x cols), w read, dw written
        assert_eq!(op.bytes_moved(DType::Bf16, 4, 8), 2 * (3 * 32 + 2 * 8));
        // each gradient written by the stage named like it; dx is its one rows x cols output
        assert_eq!(op.gradient_stage("dx").map(|s| s.name), Some("dx"));
        assert_eq!(op.gradient_stage("dw").map(|s| s.name), Some("dw"));
        assert_eq!(op.gradient_stage("ws"), None);
        assert_eq!(op.outputs(), 1);
        assert!(op.verdict_depends_on_device());
    }

    /// silu_mul_backward (docs/spec.md section 2c): one elementwise stage `grad` writes both
    /// gradients, no workspace, no eps.
    #[test]
    fn silu_mul_backward_writes_both_gradients_in_one_stage() {
        let op = Op::SiluMulBackward;
        assert!(op.is_backward() && op.is_rowwise());
        assert!(!op.takes_eps() && !op.is_gated() && !op.updates_residual());
        assert_eq!(op.forward(), Some(Op::SiluMul));
        assert_eq!(op.semantics(), [Semantics::Default]);
        assert!(op.check_semantics(Semantics::Llama).is_err());
        assert_eq!((op.abi(), op.abi_names()), ("", vec![]));
        let [st] = op.stages() else {
            panic!("one stage: {:?}", op.stages())
        };
        assert_eq!((st.name, st.block), ("grad", Some(256)));
        assert_eq!(
            st.names(),
            ["d_gate", "d_up", "dy", "gate", "up", "rows", "cols"]
        );
        assert_eq!(st.tensors(), ["d_gate", "d_up", "dy", "gate", "up"]);
        assert_eq!(st.writes(), ["d_gate", "d_up"]);
        assert!(!st.params.contains("float*"), "no workspace");
        let grads: Vec<_> = op.gradients().iter().map(|g| (g.name, g.one_row)).collect();
        assert_eq!(grads, [("d_gate", false), ("d_up", false)]);
        for g in op.gradients() {
            assert_eq!(op.gradient_stage(g.name), Some(st), "{}", g.name);
            assert_eq!(g.elements(3, 5), 15);
        }
        assert_eq!(op.outputs(), 2);
        // dy, gate, up read and d_gate, d_up written: 5 x rows x cols elements
        assert_eq!(op.bytes_moved(DType::Bf16, 4, 8), 2 * 5 * 32);
        assert_eq!(op.bytes_moved(DType::F32, 3, 7), 4 * 5 * 21);
        assert!(!op.verdict_depends_on_device());
    }

    /// fused_add_rms_norm_backward: rms_norm_backward's three entries with the residual output's
    /// gradient `dres` read by `dx`; gradients dx (of x and residual) and dw; the same device
    /// figures; 4n + 2 cols elements.
    #[test]
    fn fused_add_rms_norm_backward_is_rms_norm_backward_with_the_residuals_gradient() {
        let op = Op::FusedAddRmsNormBackward;
        assert_eq!(op.as_str(), "fused_add_rms_norm_backward");
        assert!(op.is_backward() && op.is_rowwise() && op.takes_eps());
        assert!(!op.is_gated_backward() && !op.is_activation_backward() && !op.updates_residual());
        assert_eq!(op.forward(), Some(Op::FusedAddRmsNorm));
        assert_eq!(op.semantics(), [Semantics::Default]);
        let st = op.stages();
        let llama = Op::RmsNormBackward.stages();
        assert_eq!(st.len(), 3);
        assert_eq!(
            st[0].names(),
            ["dx", "ws", "dy", "dres", "x", "w", "rows", "cols", "eps"]
        );
        assert_eq!(st[0].writes(), ["dx"]);
        assert_eq!((st[1], st[2]), (llama[1], llama[2]));
        assert_eq!(op.gradients(), Op::RmsNormBackward.gradients());
        assert_eq!(op.outputs(), 1);
        assert_eq!(op.bytes_moved(DType::Bf16, 4, 8), 2 * (4 * 32 + 2 * 8));
        assert!(op.verdict_depends_on_device());
        assert_eq!(op.max_rows(), None);
    }

    /// gelu_tanh_mul_backward: gelu_tanh_mul's gradients with silu_mul_backward's ABI (one
    /// stage `grad`, d_gate and d_up, 5n bytes, no device figure); the two are the gated
    /// backward ops.
    #[test]
    fn gelu_tanh_mul_backward_has_the_gated_backward_abi() {
        let op = Op::GeluTanhMulBackward;
        assert_eq!(op.as_str(), "gelu_tanh_mul_backward");
        assert!(op.is_backward() && op.is_rowwise() && op.is_gated_backward());
        assert!(!op.takes_eps() && !op.is_gated() && !op.updates_residual());
        assert_eq!(op.forward(), Some(Op::GeluTanhMul));
        assert_eq!(op.semantics(), [Semantics::Default]);
        assert_eq!(op.stages(), Op::SiluMulBackward.stages());
        assert_eq!(op.gradients(), Op::SiluMulBackward.gradients());
        assert_eq!(op.outputs(), 2);
        assert_eq!(op.bytes_moved(DType::Bf16, 4, 8), 2 * 5 * 32);
        assert!(!op.verdict_depends_on_device());
        let gated: Vec<Op> = Op::ALL
            .iter()
            .copied()
            .filter(|o| o.is_gated_backward())
            .collect();
        assert_eq!(gated, [Op::SiluMulBackward, Op::GeluTanhMulBackward]);
    }

    /// The activations' backward ops (silu_backward, gelu_backward, gelu_tanh_backward): one per
    /// forward activation, elementwise like it (`n`, not rows and cols), one stage `grad` writing
    /// `dx` from (dy, x), 3n elements moved, no device figure.
    #[test]
    fn the_activation_backward_ops_take_dy_and_x_over_n() {
        let ops = [
            (Op::SiluBackward, Op::Silu, "silu_backward"),
            (Op::GeluBackward, Op::Gelu, "gelu_backward"),
            (Op::GeluTanhBackward, Op::GeluTanh, "gelu_tanh_backward"),
        ];
        for (op, fwd, name) in ops {
            assert_eq!(op.as_str(), name);
            assert_eq!(op.forward(), Some(fwd));
            assert!(op.is_backward() && op.is_activation_backward());
            assert!(
                !op.is_rowwise() && !fwd.is_rowwise(),
                "{op}: elementwise as {fwd}"
            );
            assert!(!op.is_gated_backward() && !op.takes_eps() && !op.updates_residual());
            assert_eq!(op.semantics(), [Semantics::Default]);
            assert_eq!((op.abi(), op.abi_names()), ("", vec![]));
            let [st] = op.stages() else {
                panic!("one stage: {:?}", op.stages())
            };
            assert_eq!((st.name, st.block), ("grad", Some(256)));
            assert_eq!(st.names(), ["dx", "dy", "x", "n"]);
            assert_eq!(st.tensors(), ["dx", "dy", "x"]);
            assert_eq!(st.writes(), ["dx"]);
            // the forward's `n` and the forward's input name
            assert_eq!(fwd.abi_names()[1..], ["x", "n"]);
            let grads: Vec<_> = op.gradients().iter().map(|g| (g.name, g.one_row)).collect();
            assert_eq!(grads, [("dx", false)]);
            assert_eq!(op.gradient_stage("dx"), Some(st));
            assert_eq!(op.outputs(), 1);
            // dy and x read, dx written
            assert_eq!(op.bytes_moved(DType::Bf16, 4, 8), 2 * 3 * 32);
            assert_eq!(op.bytes_moved(DType::F32, 3, 7), 4 * 3 * 21);
            assert!(!op.verdict_depends_on_device());
            assert_eq!(op.max_rows(), None);
        }
        let act: Vec<Op> = Op::ALL
            .iter()
            .copied()
            .filter(|o| o.is_activation_backward())
            .collect();
        assert_eq!(act, ops.map(|o| o.0));
    }

    /// layer_norm_backward (docs/spec.md section 2c, docs/backward-layer-norm.md): dx, then dw
    /// and db in one column-sum stage, from the forward's saved f32 statistics; no workspace, no
    /// eps; at most 65536 rows.
    #[test]
    fn layer_norm_backward_reads_the_saved_statistics() {
        let op = Op::LayerNormBackward;
        assert!(op.is_backward() && op.is_rowwise());
        assert!(!op.takes_eps() && !op.is_gated() && !op.updates_residual());
        assert_eq!(op.forward(), Some(Op::LayerNorm));
        assert_eq!(op.semantics(), [Semantics::Default]);
        let [dx, dwdb] = op.stages() else {
            panic!("two stages: {:?}", op.stages())
        };
        assert_eq!((dx.name, dx.block), ("dx", Some(128)));
        assert_eq!((dwdb.name, dwdb.block), ("dwdb", None));
        assert_eq!(
            dx.names(),
            ["dx", "dy", "x", "mean", "rstd", "w", "rows", "cols"]
        );
        assert_eq!(
            dwdb.names(),
            ["dw", "db", "dy", "x", "mean", "rstd", "rows", "cols"]
        );
        assert_eq!((dx.writes(), dwdb.writes()), (vec!["dx"], vec!["dw", "db"]));
        for s in op.stages() {
            assert!(s.params.contains("const float* mean, const float* rstd"));
        }
        let grads: Vec<_> = op.gradients().iter().map(|g| (g.name, g.one_row)).collect();
        assert_eq!(grads, [("dx", false), ("dw", true), ("db", true)]);
        assert_eq!(op.gradient_stage("db"), Some(dwdb));
        assert_eq!(op.outputs(), 1);
        // dy, x read and dx written; w read, dw and db written; mean and rstd 4 bytes a row each
        assert_eq!(
            op.bytes_moved(DType::Bf16, 4, 8),
            2 * (3 * 32 + 3 * 8) + 8 * 4
        );
        assert_eq!(
            op.bytes_moved(DType::F32, 3, 7),
            4 * (3 * 21 + 3 * 7) + 8 * 3
        );
        assert!(!op.verdict_depends_on_device());
        assert_eq!(op.max_rows(), Some(65536));
        assert_eq!(Op::RmsNormBackward.max_rows(), None);
    }

    /// Every backward op: each gradient is a `T*` parameter of exactly one stage, and every
    /// `T*` a stage writes is a gradient (so a verification compares all it writes).
    #[test]
    fn every_gradient_is_written_by_one_stage() {
        for &op in Op::ALL {
            if !op.is_backward() {
                assert!(op.gradients().is_empty(), "{op}");
                assert_eq!(op.stages()[0].writes()[0], "out", "{op}");
                continue;
            }
            let names: Vec<&str> = op.gradients().iter().map(|g| g.name).collect();
            for g in &names {
                let n = op
                    .stages()
                    .iter()
                    .filter(|s| s.writes().contains(g))
                    .count();
                assert_eq!(n, 1, "{op}: {g}");
            }
            for s in op.stages() {
                for w in s.writes() {
                    assert!(names.contains(&w), "{op} `{}` writes {w}", s.name);
                }
                // a block the ABI fixes, or one the launch arithmetic sizes
                let d = crate::backward::stage_dims(
                    op,
                    s.name,
                    100,
                    4096,
                    crate::backward::DeviceShape {
                        sms: 132,
                        threads_per_sm: 2048,
                    },
                )
                .unwrap();
                if let Some(b) = s.block {
                    assert_eq!(d.block, [b, 1, 1], "{op} `{}`", s.name);
                }
            }
            assert!(op.forward().is_some_and(|f| !f.is_backward()), "{op}");
        }
    }

    /// `python/tests/fixtures/abi.json`: the ABI table for the Python side (the generator of the
    /// bundled kernels, the client's launches and op lists), written from `Op` and checked here.
    #[test]
    fn abi_fixture_for_python_is_current() {
        let ops: serde_json::Map<String, serde_json::Value> = Op::ALL
            .iter()
            .filter(|op| !op.is_backward())
            .map(|op| {
                (
                    op.to_string(),
                    serde_json::json!({
                        "abi": op.abi(),
                        "params": op.abi_names(),
                        "rowwise": op.is_rowwise(),
                        "gated": op.is_gated(),
                        "takes_eps": op.takes_eps(),
                        "semantics": op.semantics(),
                    }),
                )
            })
            .collect();
        // The backward ops (docs/spec.md section 2c): their entries, and the workspace's CTA
        // count at a few shapes and devices (python/tests/test_backward_order_on_cpu.py checks
        // kernelize.backward.col_config gives the same).
        let backward: serde_json::Map<String, serde_json::Value> = Op::ALL
            .iter()
            .filter(|op| op.is_backward())
            .map(|op| {
                let stages: Vec<_> = op
                    .stages()
                    .iter()
                    .map(|s| {
                        serde_json::json!({
                            "name": s.name, "params": s.params, "names": s.names(), "block": s.block,
                        })
                    })
                    .collect();
                (
                    op.to_string(),
                    serde_json::json!({
                        "forward": op.forward().map(|f| f.to_string()),
                        "semantics": op.semantics(),
                        "takes_eps": op.takes_eps(),
                        "stages": stages,
                        "gradients": op.gradients().iter().map(|g| serde_json::json!({
                            "name": g.name,
                            "one_row": g.one_row,
                            "stage": op.gradient_stage(g.name).map(|s| s.name),
                        })).collect::<Vec<_>>(),
                        "incoming": op.incoming_gradients(),
                        "verdict_depends_on_device": op.verdict_depends_on_device(),
                        "max_rows": op.max_rows(),
                    }),
                )
            })
            .collect();
        let mut ctas = serde_json::Map::new();
        for (sms, tps) in [(132u64, 2048u64), (114, 2048), (8, 1536)] {
            for rows in [1u64, 3, 63, 64, 1020, 1021, 4096, 16384] {
                for cols in [1001u64, 1024, 2050, 4096, 5120, 8192] {
                    let c = crate::backward::col_config(rows, cols, sms, tps);
                    ctas.insert(format!("{rows},{cols},{sms},{tps}"), c.ctas.into());
                }
            }
        }
        // Each entry's launch (kernel_registry::backward::stage_dims) at shapes on both sides of
        // every configuration change, for the client's twin (kernelize.training.stage_dims).
        let mut dims = serde_json::Map::new();
        for op in Op::ALL.iter().filter(|op| op.is_backward()) {
            for s in op.stages() {
                for (sms, tps) in [(132u64, 2048u64), (114, 2048), (8, 1536)] {
                    for rows in [1u64, 3, 40, 64, 200, 1021, 16384] {
                        for cols in [1u64, 5, 1001, 4096, 8192] {
                            let d = crate::backward::stage_dims(
                                *op,
                                s.name,
                                rows,
                                cols,
                                crate::backward::DeviceShape {
                                    sms,
                                    threads_per_sm: tps,
                                },
                            )
                            .unwrap();
                            dims.insert(
                                format!("{op},{},{rows},{cols},{sms},{tps}", s.name),
                                serde_json::json!([d.grid[0], d.block]),
                            );
                        }
                    }
                }
            }
        }
        let want = serde_json::to_string_pretty(&serde_json::json!({
            "comment": "Written by kernel-registry's test domain::tests::abi_fixture_for_python_is_current from Op (docs/spec.md section 2); do not edit: change Op and run KERNELIZE_UPDATE_FIXTURES=1 cargo test -p kernel-registry abi_fixture",
            "abi_align_bytes": ABI_ALIGN_BYTES,
            "ops": ops,
            "backward_ops": backward,
            "backward_ctas": {
                "comment": "\"rows,cols,sms,threads_per_sm\": ctas (kernel_registry::backward::col_config: the workspace's partial rows)",
                "cases": ctas,
            },
            "backward_dims": {
                "comment": "\"op,stage,rows,cols,sms,threads_per_sm\": [grid, [block x, y, z]] (kernel_registry::backward::stage_dims)",
                "cases": dims,
            },
        }))
        .unwrap()
            + "\n";
        crate::fixtures::check_current("abi.json", &want, "abi_fixture");
    }

    #[test]
    fn semantics_checked_per_op() {
        assert!(Op::RmsNorm.check_semantics(Semantics::Gemma).is_ok());
        let e = Op::Silu.check_semantics(Semantics::Llama).unwrap_err();
        assert!(e.to_string().contains("default"), "{e}");
    }
}
