"""The backward of fused_add_rms_norm (an HF decoder block's residual add and the LlamaRMSNorm
after it; op fused_add_rms_norm_backward, docs/backward-fused-add.md) on the CPU:

1. The emulation (kernelize/backward_fused_add.py) equals CPU torch autograd of the HF block
   (``h = residual + x``, ``y = LlamaRMSNorm(h)``, h also read by the next residual add) bit for
   bit in bf16, f16 and f32 (dx = dresidual, dw), with the CPU's own reductions plugged in, as
   test_backward_order_on_cpu.py does for the norm alone: the engine's sum of the residual's
   gradient and the norm's is the documented one (in f32 the residual's first, three terms).
   The other order of the f32 sum, and the bf16 sum without the cast node's rounding, are not.
2. The bundled kernel (kernels/fused_add_rms_norm_backward) and the verifier's reference under
   the CPU harness: r, dx and dw equal the emulation (CUDA's orders) bit for bit.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
KSRC = REPO / "kernels" / "fused_add_rms_norm_backward" / "kernel.cu"
REF_SRC = REPO / "verifier" / "src" / "reference.cu"
sys.path.insert(0, str(REPO / "python"))

from kernelize import backward as B  # noqa: E402
from kernelize import backward_fused_add as FA  # noqa: E402
from cpu_harness import build_own_main, from_raw, to_raw  # noqa: E402
from test_backward_order_on_cpu import _cpu_pieces, _hf_llama_rms_norm  # noqa: E402

F32 = np.float32
DTYPES = ["bf16", "f16", "f32"]
TT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def _ndiff(a, b) -> int:
    a = np.ascontiguousarray(a, dtype=F32).reshape(-1)
    b = np.ascontiguousarray(b, dtype=F32).reshape(-1)
    return int((a.view(np.uint32) != b.view(np.uint32)).sum())


def _block_autograd(dt, rows, cols, seed):
    """CPU eager autograd of the HF block: h = residual + x; y = LlamaRMSNorm(h); z = h + m (the
    next residual add, m its other operand); gradients dy at y and dz at z (z's AddBackward0
    passes dz to h: dres). Returns the inputs and eager's (dx, dresidual, dw)."""
    T = TT[dt]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g).to(T)
    res = (2 * torch.randn(rows, cols, generator=g)).to(T)
    w = (1 + 0.2 * torch.randn(cols, generator=g)).to(T)
    m = torch.randn(rows, cols, generator=g).to(T)
    dy = torch.randn(rows, cols, generator=g).to(T)
    dz = torch.randn(rows, cols, generator=g).to(T)
    xr, rr, wr = (t.clone().requires_grad_(True) for t in (x, res, w))
    h = rr + xr
    y = _hf_llama_rms_norm(torch, h, wr, 1e-6)
    z = h + m
    gx, gres, gw = torch.autograd.grad((y, z), (xr, rr, wr), (dy, dz))
    return T, h.detach(), w, dy, dz, gx, gres, gw


SHAPES = [(1, 64), (3, 1001), (16, 2048), (33, 512), (7, 5120), (64, 256)]


@pytest.mark.parametrize("dt", DTYPES)
def test_the_emulation_is_cpu_autograd_of_the_block(dt):
    for i, (rows, cols) in enumerate(SHAPES):
        T, h, w, dy, dz, gx, gres, gw = _block_autograd(dt, rows, cols, 300 + i)
        assert torch.equal(gx, gres)   # AddBackward0: one gradient for both
        f = lambda t: t.float().numpy()  # noqa: E731
        dx, dw = FA.fused_add_rms_norm_backward(f(h), f(w), f(dy), f(dz), 1e-6, dt, **_cpu_pieces(torch, T))
        assert _ndiff(dx, f(gx)) == 0, (dt, rows, cols, "dx")
        assert _ndiff(dw, f(gw)) == 0, (dt, rows, cols, "dw")


@pytest.mark.parametrize("dt", ["bf16", "f32"])
def test_the_other_sums_are_not_eagers(dt):
    # f32: dres + (gh1 + gh2) (a kernel's one dx plus the residual's) differs from eager's
    # (dres + gh1) + gh2; bf16: without the cast node's rounding, fl(fl(gh1 + gh2) + dres)
    bad = 0
    for i, (rows, cols) in enumerate(SHAPES):
        T, h, w, dy, dz, gx, _, _ = _block_autograd(dt, rows, cols, 400 + i)
        f = lambda t: t.float().numpy()  # noqa: E731
        _, _, p = FA.fused_add_rms_norm_backward(f(h), f(w), f(dy), f(dz), 1e-6, dt, return_parts=True,
                                                 **_cpu_pieces(torch, T))
        gh1, gh2, dres = p["gh1"], p["gh2"], f(dz)
        if dt == "f32":
            other = (dres + (gh1 + gh2).astype(F32)).astype(F32)
        else:
            other = B.round_to(((gh1 + gh2).astype(F32) + dres).astype(F32), dt)
        bad += _ndiff(other, f(gx))
    assert bad > 0


# ---- 2. the kernel and the reference under the CPU harness ---------------------------------------

MAIN = r"""
%PRELUDE%
#define ENTRIES(N) \
  extern "C" void %P%dx_##N(void*, float*, const void*, const void*, const void*, const void*, long long, long long, float); \
  extern "C" void %P%dwp_##N(float*, const void*, const void*, long long, long long, long long, long long); \
  extern "C" void %P%dw_##N(void*, const float*, long long, long long, long long, long long);
ENTRIES(bf16) ENTRIES(f16) ENTRIES(f32)
int main(int argc, char** argv) {
  return kz_each_job(argv[1], [](std::istringstream& ss, const std::string& line) {
    std::string dt, in, out; long long rows, cols, sms, ctas; float eps; unsigned gdx, gdw;
    ss >> dt >> rows >> cols >> eps >> sms >> ctas >> gdx >> gdw >> in >> out;
    if (!ss) { std::fprintf(stderr, "bad job: %s\n", line.c_str()); return 2; }
    const size_t es = dt == "f32" ? 4 : 2, ne = (size_t)(rows * cols);
    std::ifstream f(in, std::ios::binary);
    std::vector<unsigned char> buf((std::istreambuf_iterator<char>(f)), {});
    auto al = [](size_t b) { return (unsigned char*)std::aligned_alloc(256, (b + 255) / 256 * 256 + 256); };
    unsigned char *x = al(es * ne), *dy = al(es * ne), *dres = al(es * ne), *w = al(es * cols);
    unsigned char *dx = al(es * ne), *dw = al(es * cols);
    float* ws = (float*)al(4 * (size_t)(rows + ctas * cols));
    std::memcpy(x, buf.data(), es * ne);
    std::memcpy(dy, buf.data() + es * ne, es * ne);
    std::memcpy(dres, buf.data() + 2 * es * ne, es * ne);
    std::memcpy(w, buf.data() + 3 * es * ne, es * cols);
    std::memset(dx, 0xA7, es * ne); std::memset(dw, 0xA7, es * cols);
    void (*fdx)(void*, float*, const void*, const void*, const void*, const void*, long long, long long, float);
    void (*fdwp)(float*, const void*, const void*, long long, long long, long long, long long);
    void (*fdw)(void*, const float*, long long, long long, long long, long long);
    if (dt == "bf16") { fdx = %P%dx_bf16; fdwp = %P%dwp_bf16; fdw = %P%dw_bf16; }
    else if (dt == "f16") { fdx = %P%dx_f16; fdwp = %P%dwp_f16; fdw = %P%dw_f16; }
    else { fdx = %P%dx_f32; fdwp = %P%dwp_f32; fdw = %P%dw_f32; }
    g_call = [=] { fdx(dx, ws, dy, dres, x, w, rows, cols, eps); };
    kzcpu::launch(uint3{gdx, 1, 1}, uint3{512, 1, 1}, tramp);
    g_call = [=] { fdwp(ws, dy, x, rows, cols, sms, 2048); };
    kzcpu::launch(uint3{gdw, 1, 1}, uint3{128, 1, 1}, tramp);
    g_call = [=] { fdw(dw, ws, rows, cols, sms, 2048); };
    kzcpu::launch(uint3{(unsigned)((cols + 127) / 128), 1, 1}, uint3{128, 1, 1}, tramp);
    std::ofstream of(out, std::ios::binary);
    of.write((const char*)dx, es * ne);
    of.write((const char*)dw, es * cols);
    of.write((const char*)ws, 4 * rows);
    std::free(x); std::free(dy); std::free(dres); std::free(w); std::free(dx); std::free(dw); std::free(ws);
    return 0;
  });
}
"""

SOURCES = {
    "kernel": (lambda: KSRC.read_text(encoding="utf-8"), "fused_add_rms_norm_bwd_"),
    "reference": (lambda: REF_SRC.read_text(encoding="utf-8").split("// Verifier utility")[0],
                  "ref_fused_add_rms_norm_backward_default_"),
}


@lru_cache(maxsize=4)
def _runner(src: str, prefix: str) -> Path:
    return build_own_main("fabw-", MAIN.replace("%P%", prefix), src)


def _harness_rsqrt(v):
    return (F32(1) / np.sqrt(np.asarray(v, F32))).astype(F32)  # harness.h's rsqrtf


# (rows, cols, sms, dx grid, dwp grid): test_backward_order_on_cpu's kernel shapes (every row
# class of the row order, misaligned rows, the column sum with and without the split and the
# global reduce)
KERNEL_CASES = [
    (1, 64, 132, 1, 1), (2, 1001, 132, 1, 3), (3, 4099, 132, 2, 2), (7, 8192, 132, 3, 1),
    (9, 129, 132, 2, 2), (16, 4096, 132, 1, 4), (17, 1003, 132, 2, 3), (33, 100, 132, 1, 1),
    (64, 1024, 132, 2, 5), (70, 12, 132, 1, 2), (300, 7, 132, 3, 2), (1100, 16, 1, 4, 7),
    (1100, 512, 5, 4, 9),
    # the rows dx keeps in registers (test_backward_order_on_cpu's), with the residual's gradient
    # read in the second pass; a split row read twice (8195)
    (20, 8168, 132, 3, 2), (33, 8192, 132, 5, 4), (40, 500, 132, 1, 2), (3, 4096, 132, 2, 2),
    (17, 8195, 132, 2, 3),
]


def _run(which, cases, src=None) -> list[str]:
    read, prefix = SOURCES[which]
    exe = _runner(src if src is not None else read(), prefix)
    d = Path(tempfile.mkdtemp(prefix="kz-fabw-"))
    rng = np.random.default_rng(20261129)
    jobs, meta = [], []
    for i, (rows, cols, sms, gdx, gdw) in enumerate(cases):
        for dt in DTYPES:
            x = B.round_to(rng.standard_normal((rows, cols)), dt)
            dy = B.round_to(rng.standard_normal((rows, cols)), dt)
            dres = B.round_to(rng.standard_normal((rows, cols)), dt)
            w = B.round_to(1 + 0.2 * rng.standard_normal(cols), dt)
            if i % 4 == 1:   # zeros and signed zeros in the residual's gradient and in dy
                dres[0, : min(cols, 7)] = -0.0
                dy[0, : min(cols, 3)] = 0.0
            fin = d / f"in{i}{dt}"
            fin.write_bytes(to_raw(x, dt) + to_raw(dy, dt) + to_raw(dres, dt) + to_raw(w, dt))
            ctas = B.col_config(rows, cols, num_sms=sms)["ctas"]
            jobs.append(f"{dt} {rows} {cols} 1e-6 {sms} {ctas} {gdx} {gdw} {fin} {d / f'out{i}{dt}'}")
            meta.append((i, dt, rows, cols, sms, x, dy, dres, w))
    (d / "jobs").write_text("\n".join(jobs) + "\n", encoding="utf-8")
    r = subprocess.run([str(exe), str(d / "jobs")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    bad = []
    for i, dt, rows, cols, sms, x, dy, dres, w in meta:
        raw = (d / f"out{i}{dt}").read_bytes()
        es = 4 if dt == "f32" else 2
        ne = rows * cols
        kdx = from_raw(raw[:es * ne], dt).reshape(rows, cols)
        kdw = from_raw(raw[es * ne:es * (ne + cols)], dt)
        kr = np.frombuffer(raw[es * (ne + cols):], F32)
        edx, edw, parts = FA.fused_add_rms_norm_backward(x, w, dy, dres, 1e-6, dt, rsqrt=_harness_rsqrt,
                                                         num_sms=sms, return_parts=True)
        n = (_ndiff(kr, parts["r"]), _ndiff(kdx, edx), _ndiff(kdw, edw))
        if any(n):
            bad.append(f"{dt} [{rows}, {cols}] sms {sms}: r {n[0]}, dx {n[1]}/{ne}, dw {n[2]}/{cols}")
    return bad


@pytest.mark.parametrize("which", ["kernel", "reference"])
def test_the_kernel_and_the_reference_on_the_cpu_equal_the_emulation(which):
    bad = _run(which, KERNEL_CASES)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("old,new", [
    # f32: the residual's gradient added last (a kernel's one dx plus dres)
    ("if constexpr (sizeof(T) == 4) return __fadd_rn(__fadd_rn(dres, gh1), gh2);",
     "if constexpr (sizeof(T) == 4) return __fadd_rn(dres, __fadd_rn(gh1, gh2));"),
    # bf16/f16: the norm's gradient not rounded to T before the add
    ("else return __fadd_rn(BT<T>::rnd(__fadd_rn(gh1, gh2)), dres);",
     "else return __fadd_rn(__fadd_rn(gh1, gh2), dres);"),
])
def test_a_changed_sum_in_the_kernel_is_caught(old, new):
    src = KSRC.read_text(encoding="utf-8")
    assert old in src
    bad = _run("kernel", [(3, 4099, 132, 2, 2), (16, 4096, 132, 1, 4)], src=src.replace(old, new))
    assert bad


def test_the_gpu_probe_runs_dry_on_the_cpu(tmp_path):
    import json
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "fused_add_backward_probe.py"), str(tmp_path),
                        "--dry-run"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rep = json.loads((tmp_path / "fused_add_backward_probe.json").read_text(encoding="utf-8"))
    assert rep["dry_run"] and not rep["errors"]
    assert {c["dtype"] for c in rep["cases"]} == set(DTYPES)
    assert all(c["eager_dx_is_dres"] and "emu_dx_diff" in c for c in rep["cases"]) and rep["timing"]


def test_nvrtc_compiles_it_with_every_rounding_explicit():
    import re
    from kernelize import nvrtc as N
    try:
        nv = N.load_nvrtc()
    except N.NvrtcNotFound:
        pytest.skip("no libnvrtc here")
    inc, _ = N.include_dir_for_client()
    src = KSRC.read_text(encoding="utf-8")

    def ptx(*extra):
        code = N.compile_program(src, "fused_add_rms_norm_backward.cu",
                                 ["--gpu-architecture=compute_90", f"--include-path={inc}", *extra], nv).code
        return "\n".join(ln for ln in code.decode("utf-8", "replace").rstrip("\0").splitlines()
                         if not ln.startswith("//"))

    fused, unfused = ptx(), ptx("--fmad=false")
    assert sorted(re.findall(r"\.entry (\w+)", fused)) == sorted(
        f"fused_add_rms_norm_bwd_{e}_{dt}" for e in ("dx", "dwp", "dw") for dt in DTYPES)
    assert not re.findall(r"\b(?:add|sub|mul|fma|mad)(?:\.ftz)?(?:\.sat)?\.f32\b", fused)
    assert fused == unfused


@pytest.mark.parametrize("dt", DTYPES)
def test_the_sum_is_eagers_in_an_hf_decoder_blocks_residual_stream(dt):
    # the block as HF's LlamaDecoderLayer runs its second half: h1 = residual + attn_out;
    # post_attention_layernorm(h1) -> LlamaMLP -> h2 = h1 + mlp_out; the loss reads h2. h1's
    # gradient: the MLP's residual add (dres), then the norm's paths, as the engine orders them
    # with the MLP's nodes in between; the emulation given the norm's incoming gradient (read with
    # a hook) and dres gives eager's residual gradient bit for bit
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm
    T = TT[dt]
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=160, rms_norm_eps=1e-6)
    torch.manual_seed(5)
    norm, mlp = LlamaRMSNorm(64, eps=1e-6), LlamaMLP(cfg)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.2 * torch.randn(64))
    norm, mlp = norm.to(T), mlp.to(T)
    g = torch.Generator().manual_seed(6)
    res = torch.randn(2, 9, 64, generator=g).to(T).requires_grad_(True)
    attn = torch.randn(2, 9, 64, generator=g).to(T).requires_grad_(True)
    gout = torch.randn(2, 9, 64, generator=g).to(T)
    h1 = res + attn
    n = norm(h1)
    box = {}
    n.register_hook(lambda grad: box.__setitem__("dy", grad.detach().clone()))
    h2 = h1 + mlp(n)
    h2.backward(gout)
    f = lambda t: t.detach().float().reshape(-1, 64).numpy()  # noqa: E731
    dx, dw = FA.fused_add_rms_norm_backward(f(h1), f(norm.weight), f(box["dy"]), f(gout), 1e-6, dt,
                                            **_cpu_pieces(torch, T))
    assert torch.equal(res.grad, attn.grad)
    assert _ndiff(dx, f(res.grad)) == 0, dt
    assert _ndiff(dw, norm.weight.grad.float().numpy()) == 0, dt
