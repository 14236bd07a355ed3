"""Training mode (`kernelize(model, ..., mode="training")`): a swapped layer under autograd runs
its forward and its backward as hub kernels (issue 30; docs/backward.md, docs/backward-gated.md,
docs/spec.md section 2c, docs/backward-layer-norm.md, docs/backward-activations.md). These layers
have a backward op:

* an HF LlamaRMSNorm-style layer (op `rms_norm`, semantics `llama`), an HF GemmaRMSNorm one
  (Gemma, Gemma2, Gemma3: semantics `gemma`, the `(1 + weight)` formula) or an nn.RMSNorm /
  F.rms_norm one (semantics `torch`: eager's `_fused_rms_norm`, docs/backward-rms-torch.md):
  `rms_norm_backward` of the layer's semantics (the same ABI and launch: one code path,
  `RMS_NORM_FORMULAS`);
* a gated MLP swapped for `silu_mul` (HF LlamaMLP's `act_fn(gate_proj(x)) * up_proj(x)`,
  act_fn SiLU): `silu_mul_backward`; for `gelu_tanh_mul` (HF GemmaMLP's, act_fn tanh GELU):
  `gelu_tanh_mul_backward` (the same ABI: one code path, `GATED_FORMULAS`);
* an nn.LayerNorm swapped for `layer_norm` (GPT-2's, say): `layer_norm_backward`.

* a standalone activation swapped for `silu`, `gelu` or `gelu_tanh` (nn.SiLU, nn.GELU, HF's
  GELUActivation, GELUTanh, ...; one whose eager autograd is the one node SiluBackward0 /
  GeluBackward0 of the same approximation on its input, `activation_node_check`):
  `silu_backward` / `gelu_backward` / `gelu_tanh_backward`, one entry
  `grad(T* dx, const T* dy, const T* x, n)`, block 256 (docs/backward-activations.md; one code
  path, `ACTIVATION_FORMULAS`, the node `activation_train`); a layer swapped by the dtype of its
  calls (no parameters) loads it with the forward kernel at its first call in each dtype.

Forward: the exact forward kernel the layer was swapped for (the same launch as in inference);
for layer_norm, eager's own `native_layer_norm` (below). Backward: the entries of the backward
kernel (the layer's dtype and width, from the same source as the forward), launched in order on
the current stream with the grids of `stage_dims`, the Python twin of
`kernel_registry::backward::stage_dims` (`launch_stages`, shared).

`rms_norm_backward` (semantics llama, gemma or torch), three entries:

    dx (T* dx, float* ws, const T* dy, const T* x, const T* w, rows, cols, float eps)   block 512
    dwp(float* ws, const T* dy, const T* x, rows, cols, sms, threads_per_sm)            block 128
    dw (T* dw, const float* ws, rows, cols, sms, threads_per_sm)                        block 128

with `ws` a fresh f32 workspace of `rows + ctas * cols` floats (`ctas`: eager's CTAs per output
of its column sum, `kernelize.backward.col_config`) and `sms`, `threads_per_sm` the device's
`multiProcessorCount` and `maxThreadsPerMultiProcessor` (eager's dw order depends on them past
1020 rows). The backward is a function of (dy, x, w, eps) alone (it recomputes r), so nothing
but x and w is saved from the forward.

`silu_mul_backward` and `gelu_tanh_mul_backward`, one entry each (elementwise, grid-stride: any
grid gives the same bits):

    grad(T* d_gate, T* d_up, const T* dy, const T* gate, const T* up, rows, cols)       block 256

eager autograd's chain for `act(gate) * up`, act = F.silu or F.gelu(approximate="tanh") (d_up =
dy * act(gate), d_act = dy * up, d_gate = silu_backward / gelu_backward(d_act, gate), each
rounded to T); gate and up are saved from the forward (eager saves act(gate) too: the kernel
recomputes it).

`layer_norm_backward`, two entries (no workspace; at most LN_MAX_ROWS = 65536 rows):

    dx  (T* dx, const T* dy, const T* x, const float* mean, const float* rstd, const T* w,
         rows, cols)                                                                 block 128
    dwdb(T* dw, T* db, const T* dy, const T* x, const float* mean, const float* rstd,
         rows, cols)                                               block by the rule, `dwdb_dims`

with mean, rstd the forward's saved f32 statistics ([rows]). The forward under autograd is
eager's own `torch.native_layer_norm(x, [cols], w, b, eps)` (eager's bits by definition, and it
gives mean and rstd: the hub's forward kernels write only the output), so x, w, b, mean, rstd are
saved, as eager saves them; the forward kernel runs where no gradient is needed. `dx` is
launched where x needs a gradient, `dwdb` where w or b does (it writes both). More than 65536
rows (eager's column sum is then a two-pass reduction split by the SM count, which the kernel
does not implement): eager's own `native_layer_norm_backward` on the same saved tensors, said
once.

The activations' `grad`, one entry (elementwise, grid-stride: the grid of 1 x n elements):

    grad(T* dx, const T* dy, const T* x, n)                                             block 256

eager's SiluBackward0 / GeluBackward0 (`dx = round_T(f(dy, x))`, f in f32); x is saved from the
forward, as eager saves it.

Eagerly the layer calls `RmsNormFunction.apply` / `GatedMulFunction.apply` /
`LayerNormFunction.apply` / `ActivationFunction.apply` (a
`torch.autograd.Function`: the launches go straight to the driver, no dispatcher round trip).
While torch.compile traces it calls the custom op `kernelize::rms_norm_train(x, weight, eps,
fkey, bkey)` / `kernelize::<op>_train(gate, up, fkey, bkey)` (op silu_mul or gelu_tanh_mul) /
`kernelize::layer_norm_train(x, weight, bias, eps, bkey) -> (y, mean, rstd)` (mean, rstd not
differentiable) / `kernelize::<act>_train(x, fkey, bkey)` (act silu, gelu or gelu_tanh),
registered with `torch.library.register_autograd`: its backward is the custom op
`kernelize::launch_rms_norm_backward(dy, x, weight, eps, key) -> (dx, dw)` /
`kernelize::launch_<op>_backward(dy, gate, up, key) -> (d_gate, d_up)` /
`kernelize::launch_layer_norm_backward(dy, x, weight, bias, mean, rstd, key) -> (dx, dw, db)` /
`kernelize::launch_<act>_backward(dy, x, key) -> dx`;
all have fake implementations, so dynamo and AOTAutograd trace the forward and the backward as
opaque nodes.

Where the kernel cannot compute a gradient it is computed by eager autograd instead, on the
layer's own formula recomputed from the saved tensors (so the gradient is eager's): a double
backward (`create_graph=True`: the kernel's gradients are not differentiable), an incoming
gradient of another dtype or device (`kernel_or_eager`, shared). The `kernelize` logger says so
once per reason. (Under torch.compile a double backward is not handled: AOTAutograd refuses it
on its own.)
"""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

import torch
from torch import Tensor

from . import launch as L
from . import nvrtc as _nv
from .discover import RMS_FORMULAS
from .manifest import BACKWARD_OF, BACKWARD_OPS, ROWWISE_OPS
from .pykernel import SharedOnCopy

log = logging.getLogger("kernelize")

OP = "rms_norm_backward"
STAGES = BACKWARD_OPS[OP]                           # ("dx", "dwp", "dw"): the launch order
BLOCKS = {"dx": 512, "dwp": 128, "dw": 128}         # the ABI's blocks (Op::stages)
# kernel_registry::backward::DX_BLOCKS_PER_SM / DWP_BLOCKS_PER_SM (the probe's plan): any grid
# of at least one block gives the same bits (dx and dwp are persistent); this only sizes it.
DX_BLOCKS_PER_SM = 8
DWP_BLOCKS_PER_SM = 16

GATED_OP = "silu_mul_backward"
GATED_STAGES = BACKWARD_OPS[GATED_OP]               # ("grad",)
GATED_BLOCKS = {"grad": 256}
# kernel_registry::backward::GRAD_BLOCKS_PER_SM: `grad` loops grid-stride over rows * cols
# elements, so any grid gives the same bits; this caps it for large problems.
GRAD_BLOCKS_PER_SM = 16

LN_OP = "layer_norm_backward"
LN_STAGES = BACKWARD_OPS[LN_OP]                     # ("dx", "dwdb")
# dx: 128 threads (eager's block); dwdb: no block in the ABI, the launch rule decides (`dwdb_dims`)
LN_BLOCKS = {"dx": 128, "dwdb": None}
# `Op::max_rows` of layer_norm_backward: above it eager's column sum for dw, db is a two-pass
# reduction split by the SM count, which the kernel does not implement (the hub refuses those
# shapes); the client runs eager's own backward there (`run_layer_norm_backward`).
LN_MAX_ROWS = 65536
# kernel_registry::backward::DWDB_TWO_COLUMNS_FROM (kernel.cu's LB_GB_VC2_COLS): from this many
# columns (even) a `dwdb` thread carries two adjacent columns (dy and x aligned, as the client
# passes them).
DWDB_TWO_COLUMNS_FROM = 4096

# gelu_tanh_mul's backward (`Op::is_gated_backward`): silu_mul_backward's ABI, launch and code path
GELU_GATED_OP = "gelu_tanh_mul_backward"

#: The gated backward ops (`Op::is_gated_backward`): one `grad` entry of one ABI each.
GATED_BACKWARD_OPS = (GATED_OP, GELU_GATED_OP)
#: The elementwise activations' backward ops (`Op::is_activation_backward`: SiluBackward0,
#: GeluBackward0 'none' and 'tanh'): one `grad` entry `(T* dx, const T* dy, const T* x, n)`,
#: block 256, launched as the gated ones over n = rows * cols elements.
#: Derived as the registry derives it: a backward op whose forward op is not row-wise.
ACTIVATION_BACKWARD_OPS = tuple(b for (f, _), b in BACKWARD_OF.items() if f not in ROWWISE_OPS)
#: Each backward op's blocks by entry (`Op::stages`; None: the launch rule decides).
# fused_add_rms_norm's backward (docs/backward-fused-add.md): rms_norm_backward's entries, blocks,
# workspace and grids, `dx` reading the residual output's gradient `dres` too. Training mode does
# not run it yet (the residual add and the norm are fused only by exact compile, which has no
# backward); its launch arithmetic is the registry's twin for the probe and the tests.
FUSED_OP = "fused_add_rms_norm_backward"
BLOCKS_OF = {OP: BLOCKS, LN_OP: LN_BLOCKS, FUSED_OP: BLOCKS,
             **{op: GATED_BLOCKS for op in GATED_BACKWARD_OPS + ACTIVATION_BACKWARD_OPS}}


# ---- launch arithmetic (kernel-registry/src/backward.rs) ------------------------------------

def _check(rows: int, cols: int, sms: int, threads_per_sm: int, op: str = OP) -> None:
    if rows <= 0 or cols <= 0:
        raise ValueError(f"{op}: an empty problem ({rows} x {cols}) launches nothing")
    if op == LN_OP and rows > LN_MAX_ROWS:
        raise ValueError(f"{op}: {rows} rows is more than the {LN_MAX_ROWS} the op takes (eager's "
                         "column sum beyond is a two-pass reduction split by the SM count, not "
                         "implemented: docs/backward-layer-norm.md); run eager autograd for this shape")
    # (silu_mul_backward's grid needs an SM; rms_norm_backward's column sum a device eager's
    # reduction is configured for)
    if sms <= 0 or (op in (OP, FUSED_OP) and threads_per_sm < 512):
        raise ValueError(f"{op}: a device of {sms} SMs x {threads_per_sm} threads per SM is not one "
                         "eager's reduction runs on")


def ctas(rows: int, cols: int, sms: int, threads_per_sm: int) -> int:
    """Eager's CTAs per output of its column sum (Reduce.cuh), `kernelize.backward.col_config`."""
    from .backward import col_config
    return int(col_config(rows, cols, sms, threads_per_sm)["ctas"])


def workspace_floats(rows: int, cols: int, sms: int, threads_per_sm: int) -> int:
    """`backward::workspace_floats` of rms_norm_backward: the rows' r, then one partial column
    sum per CTA (silu_mul_backward has none)."""
    _check(rows, cols, sms, threads_per_sm)
    return rows + ctas(rows, cols, sms, threads_per_sm) * cols


def dwdb_dims(rows: int, cols: int, sms: int,
              aligned: bool = True) -> tuple[int, tuple[int, int, int]]:
    """`backward::dwdb_dims`: (blocks, block) of layer_norm_backward's `dwdb`, for speed only
    (any block the kernel takes and any grid give the same bits). Under 64 rows a block per 32
    columns, (32, 8) from 33 rows (the rows staged through shared memory), (32, 1) below; else
    block (bx, bdy), bdy = 8 / 16 / 32 under 128 / 256 rows / above (eager's chains), a tile of
    vc * bx columns (vc = 2 at even cols >= DWDB_TWO_COLUMNS_FROM where dy and x are 2-element
    aligned, as the client's inputs always are; `aligned=False`: scripts/ln_backward_probe.py's
    unaligned cases, where the kernel carries one column a thread), bx the widest of 32, 16, 8
    (16, 8 under 1024 rows) giving at least 0.9 tiles a multiprocessor (else 8), a block a tile."""
    bdy = 1 if rows < 64 else 8 if rows < 128 else 16 if rows < 256 else 32   # kernel.cu's lb_bdy
    if bdy == 1:
        return -(-cols // 32), (32, 8 if rows > 32 else 1, 1)
    vc = 2 if cols % 2 == 0 and cols >= DWDB_TWO_COLUMNS_FROM and aligned else 1
    widths = (32, 16, 8) if rows >= 1024 else (16, 8)
    # (integers: `tiles * 10 >= sms * 9`, as the registry compares)
    bx = next((b for b in widths if -(-cols // (vc * b)) * 10 >= sms * 9), 8)
    return -(-cols // (vc * bx)), (bx, bdy, 1)


def stage_dims(stage: str, rows: int, cols: int, sms: int, threads_per_sm: int,
               op: str = OP) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """`backward::stage_dims`: (grid, block) of the entry `stage` of `op` on rows x cols (no
    dynamic shared memory). rms_norm_backward: dx persistent over rows (at most one block a
    row), dwp persistent over its (column group, CTA) items, dw one thread a column.
    silu_mul_backward (and the other gated and activation backward ops): grad one thread an
    element, at most GRAD_BLOCKS_PER_SM blocks per SM.
    layer_norm_backward (at most LN_MAX_ROWS rows): dx a block a row (eager's launch), dwdb by
    `dwdb_dims`."""
    if op not in BLOCKS_OF:
        raise ValueError(f"{op} is not a backward op the client launches "
                         f"(one of {', '.join(BLOCKS_OF)})")
    _check(rows, cols, sms, threads_per_sm, op)
    blocks_of = BLOCKS_OF[op]
    if stage not in blocks_of:
        raise ValueError(f"{op} has no entry `{stage}` (its entries: {', '.join(BACKWARD_OPS[op])})")
    block = (blocks_of[stage], 1, 1)
    if op in (OP, FUSED_OP) and stage == "dx":
        blocks = min(rows, DX_BLOCKS_PER_SM * sms)
    elif op in (OP, FUSED_OP) and stage == "dwp":
        blocks = min(-(-cols // 4) * ctas(rows, cols, sms, threads_per_sm), DWP_BLOCKS_PER_SM * sms)
    elif op in (OP, FUSED_OP) and stage == "dw":
        blocks = -(-cols // blocks_of["dw"])
    elif stage == "grad" and op in GATED_BACKWARD_OPS + ACTIVATION_BACKWARD_OPS:
        blocks = min(-(-(rows * cols) // blocks_of["grad"]), GRAD_BLOCKS_PER_SM * sms)
    elif (op, stage) == (LN_OP, "dx"):
        blocks = rows
    else:   # (LN_OP, "dwdb")
        blocks, block = dwdb_dims(rows, cols, sms)
    blocks = max(blocks, 1)
    if blocks > 2**31 - 1:
        raise ValueError(f"{op} `{stage}`: a grid of {blocks} blocks exceeds CUDA's limit of 2^31-1")
    return (blocks, 1, 1), block


def launch_stages(bk: Any, op: str, rows: int, cols: int,
                  launches: list[tuple[str, tuple, tuple]]) -> None:
    """Launch `launches` ((stage, tensors, scalars) in order) of `op`'s backward kernel `bk` on
    rows x cols, each with its ABI grid and block (`stage_dims`, with bk's device's SMs and
    threads per SM)."""
    sms, tps = int(bk.sms), int(bk.threads_per_sm)
    for stage, tensors, scalars in launches:
        grid, block = stage_dims(stage, rows, cols, sms, tps, op)
        bk.launch(stage, grid, block, tensors, scalars)


# ---- the compiled backward kernel -----------------------------------------------------------

class BackwardKernel(SharedOnCopy):
    """One dtype's module of a backward kernel (`op`: one of BLOCKS_OF, its entries
    `BACKWARD_OPS[op]`), compiled by NVRTC as the verifier compiles it and loaded on
    one device. `launch(stage, grid, block, tensors, scalars)` launches one entry on the current
    stream (ints are `long long`, floats `float`); `launches` counts them by entry (what
    scripts/training_check.py reports: the backward kernels ran)."""

    runtime = "cuda"

    def __init__(self, manifest: dict[str, Any], source: str, dtype: str, device: torch.device):
        op = manifest.get("op")
        if op not in BLOCKS_OF:
            raise ValueError(f"{manifest.get('name')}: op {op}, not a backward op the client "
                             f"launches ({', '.join(BLOCKS_OF)})")
        self.op, self.manifest, self.dtype, self.device = op, manifest, dtype, device
        # rms_norm_backward's formula (RMS_NORM_FORMULAS) is its semantics'; the others have one
        self.semantics = manifest.get("semantics", "default")
        self.symbols = dict(manifest["stages"][dtype])
        major, minor = torch.cuda.get_device_capability(device)
        props = torch.cuda.get_device_properties(device)
        self.sms = int(props.multi_processor_count)
        self.threads_per_sm = int(props.max_threads_per_multi_processor)
        self.code = _nv.compile_entry(manifest, source, dtype, (major, minor))
        self.lib = L._libcuda()
        self.module = L._load_module(self.code.code, device)  # never unloaded: cached per process
        self.funcs = {}
        for stage in BACKWARD_OPS[op]:
            func = ctypes.c_void_p()
            sym = self.symbols[stage]
            if self.lib.cuModuleGetFunction(ctypes.byref(func), self.module, sym.encode()) != 0:
                raise RuntimeError(f"entry `{sym}` ({stage}) is not in the compiled module of "
                                   f"{manifest['name']} ({dtype}); declare it `extern \"C\" __global__`")
            self.funcs[stage] = func
        self._index = device.index
        self._cu_launch = L._cu_launch(self.lib)
        self._lock = threading.Lock()
        self.launches = {stage: 0 for stage in BACKWARD_OPS[op]}
        self.record = {"kernel": manifest["name"], "op": op, "dtype": dtype,
                       "symbols": dict(self.symbols), "arch": f"sm_{major}{minor}",
                       "program_name": self.code.program_name, "options": list(self.code.options),
                       "code_sha256": self.code.code_sha256, "sms": self.sms,
                       "threads_per_sm": self.threads_per_sm}

    def launch(self, stage: str, grid: tuple, block: tuple, tensors: tuple, scalars: tuple) -> None:
        for t in tensors:
            if t.get_device() != self._index:
                raise ValueError(f"tensor on {t.device}, kernel compiled for {self.device}")
        values = [ctypes.c_void_p(t.data_ptr()) for t in tensors] + [
            ctypes.c_float(v) if isinstance(v, float) else ctypes.c_longlong(v) for v in scalars]
        argv = (ctypes.c_void_p * len(values))(
            *[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values])
        with self._lock:
            res = self._cu_launch(self.funcs[stage], *grid, *block, 0,
                                  L._current_stream(self._index), argv, None)
            self.launches[stage] += 1
        if res != 0:
            L._check(self.lib, res, f"launching {self.symbols[stage]}")


_CACHE: dict[tuple, BackwardKernel] = {}
_CACHE_LOCK = threading.Lock()


def compiled_backward(digest: str, manifest: dict[str, Any], source: str, dtype: str,
                      device: torch.device) -> BackwardKernel:
    """`dtype`'s module of the backward kernel `digest`, compiled and loaded on `device` (once
    per process). The tests replace this with a recording stand-in."""
    if device.type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError(f"{manifest['name']} is a CUDA kernel: it needs a CUDA device (got {device})")
    idx = device.index if device.index is not None else torch.cuda.current_device()
    key = (digest, dtype, idx)
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = BackwardKernel(manifest, source, dtype, torch.device("cuda", idx))
        return _CACHE[key]


# ---- where eager autograd computes the gradients instead (shared) --------------------------

def eager_autograd(formula: Any, dy: Tensor, inputs: tuple[Tensor, ...], needs: tuple[bool, ...],
                   create_graph: bool) -> tuple[Tensor | None, ...]:
    """The gradients eager autograd gives of `formula(*inputs)` (the layer's own formula) for
    the inputs `needs` asks for. With `create_graph` (a double backward: the inputs are the saved
    tensors, still in the graph) the recomputation is on the inputs themselves, so the
    gradients are differentiable with respect to them, as eager's are."""
    with torch.enable_grad():
        if create_graph:
            xs = tuple(inputs)
        else:
            xs = tuple(t.detach().requires_grad_(n) for t, n in zip(inputs, needs))
        y = formula(*xs)
        wrt = [t for t, n in zip(xs, needs) if n]
        got = iter(torch.autograd.grad(y, wrt, dy, create_graph=create_graph)) if wrt else iter(())
    return tuple(next(got) if n else None for n in needs)


_SAID: set[str] = set()


def _say_once(why: str) -> None:
    if why not in _SAID:
        _SAID.add(why)
        log.warning("kernelize: %s", why)


def kernel_or_eager(layer: str, label: str, dy: Tensor, like: Tensor, needs: tuple[bool, ...],
                    kernel: Any, formula: Any, inputs: tuple[Tensor, ...]) -> tuple:
    """A backward node's gradients: `kernel()` (the backward kernel's), or eager autograd's of
    `formula(*inputs)` where the kernel cannot give them (said once per reason): a double
    backward (grad mode on inside the backward: `create_graph=True`) or an incoming gradient
    `dy` of another dtype or device than `like` (the layer's input). None for each input whose
    gradient is not asked for (`needs`)."""
    if not any(needs):
        return tuple(None for _ in needs)
    why = None
    if torch.is_grad_enabled():
        why = (f"double backward (create_graph=True) through a kernelized {layer} layer: the "
               f"{label} kernel's gradients are not differentiable; eager autograd computes them")
    elif dy.dtype != like.dtype or dy.device != like.device:
        why = (f"the incoming gradient is {dy.dtype} on {dy.device}, the layer's input {like.dtype} "
               f"on {like.device}: eager autograd computes the gradients, not {label}")
    if why is not None:
        _say_once(why)
        return eager_autograd(formula, dy, inputs, needs, create_graph=torch.is_grad_enabled())
    got = kernel()
    return tuple(g if n else None for g, n in zip(got, needs))


# ---- rms_norm (llama, gemma) -----------------------------------------------------------------

def run_rms_norm_backward(bk: Any, dy: Tensor, x: Tensor, w: Tensor, eps: float,
                          need_dw: bool = True) -> tuple[Tensor, Tensor | None]:
    """(dx, dw) by the kernel's three entries (dw None and only `dx` launched when not
    `need_dw`: `dx` alone writes dx and the rows' r). Inputs made contiguous and aligned."""
    x, w = L.aligned(x), L.aligned(w)
    dy = L.aligned(dy)
    cols = x.shape[-1]
    rows = x.numel() // cols if cols else 0
    dx = torch.empty_like(x)
    if rows == 0:
        return dx, (torch.zeros_like(w) if need_dw else None)
    sms, tps = int(bk.sms), int(bk.threads_per_sm)
    ws = torch.empty(workspace_floats(rows, cols, sms, tps), dtype=torch.float32, device=x.device)
    dw = torch.empty_like(w) if need_dw else None
    launches = [("dx", (dx, ws, dy, x, w), (rows, cols, float(eps)))]
    if need_dw:
        launches += [("dwp", (ws, dy, x), (rows, cols, sms, tps)),
                     ("dw", (dw, ws), (rows, cols, sms, tps))]
    launch_stages(bk, OP, rows, cols, launches)
    return dx, dw


#: Each rms_norm semantics training mode runs (its backward op: manifest.BACKWARD_OF, the
#: backward kernel's `semantics`), with the layer's formula eager autograd differentiates where
#: the kernel cannot give the gradients: discovery's (`discover.RMS_FORMULAS`, checked bit for
#: bit against the layers themselves), the one home of the formulas.
RMS_NORM_FORMULAS = {sem: RMS_FORMULAS[sem] for sem in ("llama", "gemma", "torch")}


def eager_grads(dy: Tensor, x: Tensor, w: Tensor, eps: float, needs: tuple[bool, bool],
                create_graph: bool, semantics: str = "llama") -> tuple[Tensor | None, Tensor | None]:
    """The gradients eager autograd gives, on the `semantics` layer's formula (RMS_NORM_FORMULAS)
    recomputed from x and w (`eager_autograd`)."""
    formula = RMS_NORM_FORMULAS[semantics]
    return eager_autograd(lambda x_, w_: formula(x_, w_, eps), dy, (x, w), needs, create_graph)


def torch_two_pass(rows: int, cols: int, sms: int) -> bool:
    """Whether eager's dw of F.rms_norm (rms_norm_backward semantics torch: the layer-norm column
    kernel) is its two-pass variant there (`rows > 65536 and cols // 32 < sms // 2`), which the
    bundled kernel does not implement (docs/backward-rms-torch.md)."""
    return rows > LN_MAX_ROWS and cols // 32 < sms // 2


def _backward(bk: Any, label: str, dy: Tensor, x: Tensor, w: Tensor, eps: float,
              needs: tuple[bool, bool]) -> tuple[Tensor | None, Tensor | None]:
    formula = RMS_NORM_FORMULAS[bk.semantics]   # the kernel's semantics: the layer's
    cols = x.shape[-1]
    rows = x.numel() // cols if cols else 0
    if bk.semantics == "torch" and torch_two_pass(rows, cols, int(bk.sms)):
        _say_once(f"an F.rms_norm backward of {rows} x {cols}: eager's dw there is a two-pass "
                  f"column sum split by the SM count, which {label} does not implement; eager "
                  "autograd computes the gradients of such calls")
        return eager_autograd(lambda x_, w_: formula(x_, w_, eps), dy, (x, w), needs,
                              create_graph=torch.is_grad_enabled())
    return kernel_or_eager(
        "rms_norm", label, dy, x, needs,
        lambda: run_rms_norm_backward(bk, dy, x, w, eps, need_dw=needs[1]),
        lambda x_, w_: formula(x_, w_, eps), (x, w))


class RmsNormFunction(torch.autograd.Function):
    """Eager: forward = the swapped layer's forward launch (`run(compiled, x, w, eps)`),
    backward = the backward kernel `bk`'s three entries (see the module's docstring)."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, eps: float, run: Any, compiled: Any, bk: Any,
                label: str) -> Tensor:
        ctx.save_for_backward(x, w)
        ctx.eps, ctx.bk, ctx.label = eps, bk, label
        return run(compiled, x, w, eps)

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, w = ctx.saved_tensors
        dx, dw = _backward(ctx.bk, ctx.label, dy, x, w, ctx.eps, tuple(ctx.needs_input_grad[:2]))
        return dx, dw, None, None, None, None, None


def rms_norm_train(x: Tensor, w: Tensor, eps: float, run: Any, compiled: Any, bk: Any,
                   label: str = OP) -> Tensor:
    """One autograd node: the forward launch and, on backward, the backward kernel."""
    return RmsNormFunction.apply(x, w, eps, run, compiled, bk, label)


# ---- gated MLPs: silu_mul, gelu_tanh_mul (act_fn(gate) * up) --------------------------------

def run_gated_backward(bk: Any, dy: Tensor, gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    """(d_gate, d_up) by the gated backward kernel `bk`'s one entry `grad` (`bk.op`: one of
    GATED_BACKWARD_OPS, whose ABI is one), both new contiguous tensors of gate's shape and dtype.
    Inputs made contiguous and aligned."""
    op = bk.op
    if op not in GATED_BACKWARD_OPS:
        raise ValueError(f"{op} is not a gated backward op ({', '.join(GATED_BACKWARD_OPS)})")
    if not (gate.shape == up.shape == dy.shape):
        raise ValueError(f"{op}: dy {tuple(dy.shape)}, gate {tuple(gate.shape)} and up "
                         f"{tuple(up.shape)} differ in shape")
    gate, up, dy = L.aligned(gate), L.aligned(up), L.aligned(dy)
    cols = gate.shape[-1] if gate.dim() else 1
    rows = gate.numel() // cols if cols else 0
    d_gate, d_up = torch.empty_like(gate), torch.empty_like(up)
    if rows:
        launch_stages(bk, op, rows, cols, [("grad", (d_gate, d_up, dy, gate, up), (rows, cols))])
    return d_gate, d_up


def silu_mul_forward(gate: Tensor, up: Tensor) -> Tensor:
    """The gated SiLU MLP's `act_fn(gate) * up` with act_fn SiLU (discovery checked it)."""
    return torch.nn.functional.silu(gate) * up


def gelu_tanh_mul_forward(gate: Tensor, up: Tensor) -> Tensor:
    """The GeGLU MLP's `act_fn(gate) * up` with act_fn tanh GELU (Gemma's gelu_pytorch_tanh;
    discovery checked it)."""
    return torch.nn.functional.gelu(gate, approximate="tanh") * up


#: The gated forward ops training mode runs (each one's backward op: manifest.BACKWARD_OF), with
#: the formula eager autograd differentiates where the kernel cannot give the gradients.
GATED_FORMULAS = {"silu_mul": silu_mul_forward, "gelu_tanh_mul": gelu_tanh_mul_forward}


def _gated_backward(op: str, bk: Any, label: str, dy: Tensor, gate: Tensor, up: Tensor,
                    needs: tuple[bool, bool]) -> tuple[Tensor | None, Tensor | None]:
    return kernel_or_eager(op, label, dy, gate, needs,
                           lambda: run_gated_backward(bk, dy, gate, up),
                           GATED_FORMULAS[op], (gate, up))


class GatedMulFunction(torch.autograd.Function):
    """Eager: forward = the swapped MLP's forward launch (`run(compiled, gate, up)`, `op`: one of
    GATED_FORMULAS), backward = the gated backward kernel `bk`'s entry `grad` (see the module's
    docstring)."""

    @staticmethod
    def forward(ctx, gate: Tensor, up: Tensor, op: str, run: Any, compiled: Any, bk: Any,
                label: str) -> Tensor:
        ctx.save_for_backward(gate, up)
        ctx.op, ctx.bk, ctx.label = op, bk, label
        return run(compiled, gate, up)

    @staticmethod
    def backward(ctx, dy: Tensor):
        gate, up = ctx.saved_tensors
        d_gate, d_up = _gated_backward(ctx.op, ctx.bk, ctx.label, dy, gate, up,
                                       tuple(ctx.needs_input_grad[:2]))
        return d_gate, d_up, None, None, None, None, None


def gated_train(op: str, gate: Tensor, up: Tensor, run: Any, compiled: Any, bk: Any,
                label: str | None = None) -> Tensor:
    """One autograd node for the gated op `op` (silu_mul, gelu_tanh_mul): the forward launch
    and, on backward, the backward kernel."""
    return GatedMulFunction.apply(gate, up, op, run, compiled, bk, label or bk.op)


# ---- standalone activations: silu, gelu, gelu_tanh ------------------------------------------

def run_activation_backward(bk: Any, dy: Tensor, x: Tensor) -> Tensor:
    """dx by the activation backward kernel `bk`'s one entry `grad(dx, dy, x, n)` (`bk.op`: one
    of ACTIVATION_BACKWARD_OPS), a new contiguous tensor of x's shape and dtype. Inputs made
    contiguous and aligned."""
    op = bk.op
    if op not in ACTIVATION_BACKWARD_OPS:
        raise ValueError(f"{op} is not an activation backward op ({', '.join(ACTIVATION_BACKWARD_OPS)})")
    if dy.shape != x.shape:
        raise ValueError(f"{op}: dy {tuple(dy.shape)} and x {tuple(x.shape)} differ in shape")
    x, dy = L.aligned(x), L.aligned(dy)
    dx = torch.empty_like(x)
    n = x.numel()
    if n:
        # elementwise: the grid is the element count's (stage_dims of 1 x n)
        launch_stages(bk, op, 1, n, [("grad", (dx, dy, x), (n,))])
    return dx


#: The activations training mode can give a backward kernel (each one's backward op:
#: manifest.BACKWARD_OF), with the formula eager autograd differentiates where the kernel cannot
#: give the gradient (a double backward, a dy of another dtype or device).
ACTIVATION_FORMULAS = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu,
                       "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh")}


#: Each activation's one eager autograd node: its name, and GeluBackward0's `approximate`.
ACTIVATION_NODES = {"silu": ("SiluBackward0", None), "gelu": ("GeluBackward0", "none"),
                    "gelu_tanh": ("GeluBackward0", "tanh")}


def activation_node_check(forward: Any, op: str, dtype: torch.dtype) -> str | None:
    """Why a backward kernel of `op` (one of ACTIVATION_FORMULAS) would not give the gradient
    eager autograd gives through the layer whose original forward is `forward`, or None where
    it would: eager's graph of `forward(x)` must be that one node (ACTIVATION_NODES) on x itself,
    in x's dtype, as F.silu / F.gelu record it (nn.SiLU, nn.GELU, HF's GELUActivation, GELUTanh,
    SiLUActivation). A layer matched by its forward's bits alone (discovery's probe) may compute
    them with other ops, whose backward is another chain of nodes (HF's NewGELUActivation,
    GPT-2's gelu_new, is `0.5 * x * (1 + tanh(...))`: MulBackward0 ...). Probed on a CPU
    tensor of `dtype`."""
    name, approximate = ACTIVATION_NODES[op]
    g = torch.Generator().manual_seed(5)
    with torch.enable_grad():
        leaf = (torch.randn(3, 64, generator=g) * 3).to(dtype).requires_grad_(True)
        x = leaf.clone()                      # not a leaf: an in-place forward is recorded too
        before = x.grad_fn
        try:
            y = forward(x)
        except Exception as e:  # noqa: BLE001 (the layer's own error: no backward kernel)
            return f"its forward failed on an autograd probe ({type(e).__name__}: {e})"
    node = getattr(y, "grad_fn", None)
    got = type(node).__name__ if node is not None else "no node"
    if (node is None or got != name
            or (approximate is not None and getattr(node, "_saved_approximate", None) != approximate)
            or [f for f, _ in node.next_functions] != [before] or y.dtype != dtype):
        want = name + (f"(approximate={approximate!r})" if approximate else "")
        return (f"its eager autograd is not one {want} on its input (the probe's output node: "
                f"{got}); the {BACKWARD_OF[(op, 'default')]} kernel gives that node's bits only")
    return None


class ActivationFunction(torch.autograd.Function):
    """Eager: forward = the swapped activation's forward launch (`run(compiled, x)`, `op`: one of
    ACTIVATION_FORMULAS), backward = the activation backward kernel `bk`'s entry `grad` on (dy,
    x), x saved (as eager's SiluBackward0 / GeluBackward0 save it)."""

    @staticmethod
    def forward(ctx, x: Tensor, op: str, run: Any, compiled: Any, bk: Any, label: str) -> Tensor:
        ctx.save_for_backward(x)
        ctx.op, ctx.bk, ctx.label = op, bk, label
        return run(compiled, x)

    @staticmethod
    def backward(ctx, dy: Tensor):
        (x,) = ctx.saved_tensors
        (dx,) = kernel_or_eager(ctx.op, ctx.label, dy, x, (ctx.needs_input_grad[0],),
                                lambda: (run_activation_backward(ctx.bk, dy, x),),
                                ACTIVATION_FORMULAS[ctx.op], (x,))
        return dx, None, None, None, None, None


def activation_train(op: str, x: Tensor, run: Any, compiled: Any, bk: Any,
                     label: str | None = None) -> Tensor:
    """One autograd node for the activation `op` (silu, gelu, gelu_tanh): the forward launch and,
    on backward, the backward kernel: what a standalone activation swapped in training mode runs
    under autograd (core's `_fwd_elementwise_train`), where its eager autograd is that one node
    (`activation_node_check`)."""
    return ActivationFunction.apply(x, op, run, compiled, bk, label or bk.op)


def _act_launch_backward(dy: Tensor, x: Tensor, key: int) -> Tensor:
    from . import ops
    return run_activation_backward(ops.kernel(key), dy, x)


def _act_train_forward(x: Tensor, fkey: int, bkey: int) -> Tensor:
    from . import ops
    return L.run_elementwise(ops.kernel(fkey), x)


def _setup_act(ctx, inputs, output):
    x, _fkey, bkey = inputs
    ctx.save_for_backward(x)
    ctx.bkey = bkey


def _act_train_ops(op: str) -> Any:
    """`kernelize::<op>_train(x, fkey, bkey)` with its backward
    `kernelize::launch_<op>_backward(dy, x, key) -> dx` (fakes for both): the same two functions
    for every activation (the kernels know their op)."""
    launch = torch.library.custom_op(f"kernelize::launch_{op}_backward", _act_launch_backward,
                                     mutates_args=(), device_types="cuda")
    launch.register_fake(lambda dy, x, key: x.new_empty(x.shape))
    train = torch.library.custom_op(f"kernelize::{op}_train", _act_train_forward,
                                    mutates_args=(), device_types="cuda")
    train.register_fake(lambda x, fkey, bkey: x.new_empty(x.shape))

    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return launch(dy, x, ctx.bkey), None, None

    train.register_autograd(backward, setup_context=_setup_act)
    return train


#: Each activation's training custom op (`kernelize::<op>_train`), what a swapped activation
#: calls under autograd while torch.compile traces.
ACTIVATION_TRAIN_OPS = {op: _act_train_ops(op) for op in ACTIVATION_FORMULAS}


# ---- layer_norm (nn.LayerNorm; forward eager's own op) ---------------------------------------

def layer_norm_forward(x: Tensor, w: Tensor, b: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """nn.LayerNorm's forward as eager runs it (`F.layer_norm` -> `aten::native_layer_norm`):
    (y, mean, rstd), the statistics its backward reads (f32 on CUDA, [*x.shape[:-1], 1])."""
    return torch.native_layer_norm(x, [x.shape[-1]], w, b, eps)


def run_layer_norm_backward(bk: Any, dy: Tensor, x: Tensor, w: Tensor, b: Tensor, mean: Tensor,
                            rstd: Tensor, needs: tuple[bool, bool, bool] = (True, True, True)
                            ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(dx, dw, db) by the kernel's two entries from the forward's saved mean and rstd: `dx`
    where needs[0], `dwdb` where needs[1] or needs[2] (it writes both; the one not asked for is
    dropped); None where not asked for. Inputs made contiguous and aligned (eager's backward
    makes dy contiguous too), mean and rstd f32 [rows]. Where the kernel takes no such shape
    (more than LN_MAX_ROWS rows, or none) eager's own backward op runs on the same saved
    tensors (the first time said once)."""
    cols = x.shape[-1]
    rows = x.numel() // cols if cols else 0
    if rows == 0 or rows > LN_MAX_ROWS:
        if rows:
            _say_once(f"a LayerNorm backward of {rows} rows: {LN_OP} takes at most {LN_MAX_ROWS} "
                      "(eager's column sum beyond is a two-pass reduction split by the SM count); "
                      "eager's backward computes the gradients of such calls")
        got = torch.ops.aten.native_layer_norm_backward(dy, x, [cols], mean, rstd, w, b,
                                                        [bool(n) for n in needs])
        return tuple(g if n else None for g, n in zip(got, needs))
    x, w, dy = L.aligned(x), L.aligned(w), L.aligned(dy)
    mean = L.aligned(mean.reshape(rows).to(torch.float32))
    rstd = L.aligned(rstd.reshape(rows).to(torch.float32))
    launches, dx, dw, db = [], None, None, None
    if needs[0]:
        dx = torch.empty_like(x)
        launches.append(("dx", (dx, dy, x, mean, rstd, w), (rows, cols)))
    if needs[1] or needs[2]:
        dw, db = torch.empty_like(w), torch.empty_like(w)
        launches.append(("dwdb", (dw, db, dy, x, mean, rstd), (rows, cols)))
    launch_stages(bk, LN_OP, rows, cols, launches)
    return dx, (dw if needs[1] else None), (db if needs[2] else None)


def _ln_backward(bk: Any, label: str, dy: Tensor, saved: tuple[Tensor, ...], eps: float,
                 needs: tuple[bool, bool, bool]) -> tuple[Tensor | None, ...]:
    x, w, b, mean, rstd = saved
    return kernel_or_eager(
        "layer_norm", label, dy, x, needs,
        lambda: run_layer_norm_backward(bk, dy, x, w, b, mean, rstd, needs),
        lambda x_, w_, b_: layer_norm_forward(x_, w_, b_, eps)[0], (x, w, b))


class LayerNormFunction(torch.autograd.Function):
    """Eager: forward = eager's own `native_layer_norm` (its bits by definition, and the mean
    and rstd its backward reads), backward = the backward kernel `bk`'s two entries on (dy, x,
    mean, rstd, w) (see the module's docstring)."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, b: Tensor, eps: float, bk: Any, label: str) -> Tensor:
        y, mean, rstd = layer_norm_forward(x, w, b, eps)
        ctx.save_for_backward(x, w, b, mean, rstd)
        ctx.eps, ctx.bk, ctx.label = eps, bk, label
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):
        dx, dw, db = _ln_backward(ctx.bk, ctx.label, dy, ctx.saved_tensors, ctx.eps,
                                  tuple(ctx.needs_input_grad[:3]))
        return dx, dw, db, None, None, None


def layer_norm_train(x: Tensor, w: Tensor, b: Tensor, eps: float, bk: Any,
                     label: str = LN_OP) -> Tensor:
    """One autograd node: eager's forward and, on backward, the backward kernel."""
    return LayerNormFunction.apply(x, w, b, eps, bk, label)


# ---- the same as custom ops, for torch.compile ----------------------------------------------

@torch.library.custom_op("kernelize::launch_rms_norm_backward", mutates_args=(), device_types="cuda")
def launch_rms_norm_backward(dy: Tensor, x: Tensor, weight: Tensor, eps: float,
                             key: int) -> tuple[Tensor, Tensor]:
    from . import ops
    dx, dw = run_rms_norm_backward(ops.kernel(key), dy, x, weight, eps)
    return dx, dw


@launch_rms_norm_backward.register_fake
def _(dy, x, weight, eps, key):
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


@torch.library.custom_op("kernelize::rms_norm_train", mutates_args=(), device_types="cuda")
def rms_norm_train_op(x: Tensor, weight: Tensor, eps: float, fkey: int, bkey: int) -> Tensor:
    from . import ops
    return L.run_rms_norm(ops.kernel(fkey), x, weight, eps)


@rms_norm_train_op.register_fake
def _(x, weight, eps, fkey, bkey):
    return x.new_empty(x.shape)


def _setup(ctx, inputs, output):
    x, weight, eps, _fkey, bkey = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps, ctx.bkey = eps, bkey


def _train_op_backward(ctx, dy):
    x, weight = ctx.saved_tensors
    dx, dw = torch.ops.kernelize.launch_rms_norm_backward(dy, x, weight, ctx.eps, ctx.bkey)
    return dx, dw, None, None, None


rms_norm_train_op.register_autograd(_train_op_backward, setup_context=_setup)


def _gated_launch_backward(dy: Tensor, gate: Tensor, up: Tensor, key: int) -> tuple[Tensor, Tensor]:
    from . import ops
    d_gate, d_up = run_gated_backward(ops.kernel(key), dy, gate, up)
    return d_gate, d_up


def _gated_train_forward(gate: Tensor, up: Tensor, fkey: int, bkey: int) -> Tensor:
    from . import ops
    return L.run_gated(ops.kernel(fkey), gate, up)


def _setup_gated(ctx, inputs, output):
    gate, up, _fkey, bkey = inputs
    ctx.save_for_backward(gate, up)
    ctx.bkey = bkey


def _gated_train_ops(op: str) -> Any:
    """`kernelize::<op>_train(gate, up, fkey, bkey)` with its backward
    `kernelize::launch_<op>_backward(dy, gate, up, key) -> (d_gate, d_up)` (fakes for both):
    the same two functions for every gated op (the kernels know their op)."""
    launch = torch.library.custom_op(f"kernelize::launch_{op}_backward", _gated_launch_backward,
                                     mutates_args=(), device_types="cuda")
    launch.register_fake(lambda dy, gate, up, key: (gate.new_empty(gate.shape), up.new_empty(up.shape)))
    train = torch.library.custom_op(f"kernelize::{op}_train", _gated_train_forward,
                                    mutates_args=(), device_types="cuda")
    train.register_fake(lambda gate, up, fkey, bkey: gate.new_empty(gate.shape))

    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        d_gate, d_up = launch(dy, gate, up, ctx.bkey)
        return d_gate, d_up, None, None

    train.register_autograd(backward, setup_context=_setup_gated)
    return train


#: Each gated forward op's training custom op (`kernelize::<op>_train`), what a swapped MLP calls
#: while torch.compile traces.
GATED_TRAIN_OPS = {op: _gated_train_ops(op) for op in GATED_FORMULAS}


@torch.library.custom_op("kernelize::launch_layer_norm_backward", mutates_args=(), device_types="cuda")
def launch_layer_norm_backward(dy: Tensor, x: Tensor, weight: Tensor, bias: Tensor, mean: Tensor,
                               rstd: Tensor, key: int) -> tuple[Tensor, Tensor, Tensor]:
    from . import ops
    dx, dw, db = run_layer_norm_backward(ops.kernel(key), dy, x, weight, bias, mean, rstd)
    return dx, dw, db


@launch_layer_norm_backward.register_fake
def _(dy, x, weight, bias, mean, rstd, key):
    return x.new_empty(x.shape), weight.new_empty(weight.shape), bias.new_empty(bias.shape)


@torch.library.custom_op("kernelize::layer_norm_train", mutates_args=(), device_types="cuda")
def layer_norm_train_op(x: Tensor, weight: Tensor, bias: Tensor, eps: float,
                        bkey: int) -> tuple[Tensor, Tensor, Tensor]:
    y, mean, rstd = layer_norm_forward(x, weight, bias, eps)
    return y, mean, rstd


@layer_norm_train_op.register_fake
def _(x, weight, bias, eps, bkey):
    stats = (*x.shape[:-1], 1)
    return (x.new_empty(x.shape), x.new_empty(stats, dtype=torch.float32),
            x.new_empty(stats, dtype=torch.float32))


def _setup_ln(ctx, inputs, output):
    x, weight, bias, _eps, bkey = inputs
    _y, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)
    ctx.save_for_backward(x, weight, bias, mean, rstd)
    ctx.bkey = bkey


def _ln_train_op_backward(ctx, dy, _dmean, _drstd):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    dx, dw, db = torch.ops.kernelize.launch_layer_norm_backward(dy, x, weight, bias, mean, rstd,
                                                                ctx.bkey)
    return dx, dw, db, None, None


layer_norm_train_op.register_autograd(_ln_train_op_backward, setup_context=_setup_ln)
