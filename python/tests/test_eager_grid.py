"""scripts/eager_grid.py (every bundled exact kernel against the real eager layer on a shape
grid, run on the GPU machine by scripts/gpu-check): its coverage and its bookkeeping, checked on
the CPU. run_grid runs here with stand-in launchers on the CPU device: one that computes what
eager computes (no mismatch may be counted) and one that rounds once where eager rounds twice
(its mismatches must be counted, listed per shape and fail the summary)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import load_script

REPO = Path(__file__).resolve().parents[2]


def _grid():
    return load_script(REPO / "scripts" / "eager_grid.py", "eager_grid")


G = _grid()


def test_every_bundled_exact_kernel_has_an_eager_layer():
    kernels, uncovered = G.load_kernels(str(REPO / "kernels"), set(), False)
    assert uncovered == [], uncovered
    names = {k["name"] for k in kernels}
    from kernelize.manifest import BACKWARD_OPS, parse_manifest_toml
    # each backward op's probe against eager autograd
    probes = {"rms_norm_backward": "backward_probe.py", "silu_mul_backward": "gated_backward_probe.py",
              "layer_norm_backward": "ln_backward_probe.py", "gelu_tanh_mul_backward": "gated_backward_probe.py",
              **{f"{a}_backward": "activation_backward_probe.py" for a in ("silu", "gelu", "gelu_tanh")},
              "fused_add_rms_norm_backward": "fused_add_backward_probe.py"}
    assert set(probes) == set(BACKWARD_OPS)
    for d in (REPO / "kernels").iterdir():
        toml = d / "kernel.toml"
        if not toml.is_file() or "KNOWN-DIFFERENT" in toml.read_text(encoding="utf-8"):
            continue
        op = parse_manifest_toml(toml.read_text(encoding="utf-8"))["op"]
        if op in BACKWARD_OPS:
            # a backward kernel: checked against eager autograd by its op's probe
            # (F.rms_norm's backward, rms_norm_backward semantics torch, has a probe of its own)
            probe_name = "rms_torch_backward_probe.py" if d.name == "rms_norm_torch_backward" else probes[op]
            probe = (REPO / "scripts" / probe_name).read_text(encoding="utf-8")
            # (the activations' probe names each kernel by its activation, ACTS's key, and finds it
            # as kernels/<act>_backward/kernel.cu)
            act = d.name.removesuffix("_backward")
            runs_it = f'"{d.name}", "kernel.cu"' in probe or (
                probes[op] == "activation_backward_probe.py" and f'    "{act}": (' in probe
                and 'f"{act}_backward", "kernel.cu"' in probe)
            runs_it = runs_it or (probe_name == "rms_torch_backward_probe.py"
                                  and '"rms_norm_torch_backward", "kernel.cu"' in probe)
            assert runs_it, f"{d.name}: scripts/{probe_name} does not run it"
            continue
        assert d.name in names, f"{d.name} is an exact bundled kernel the grid does not run"
    assert all(k["exact"] for k in kernels)
    with_variants, _ = G.load_kernels(str(REPO / "kernels"), set(), True)
    assert {k["name"] for k in with_variants} > names


def test_the_grid():
    full = G.grid_shapes()
    assert len(full) == 35 * 18 + 2 == len(set(full))
    rows = {r for r, _ in full}
    assert set(range(1, 33)) <= rows and {64, 333, 2048, 4096} <= rows
    assert {c for _, c in full} == set(G.MODEL_WIDTHS + G.ODD_WIDTHS)
    assert max(r * c for r, c in full) <= 32 * 1024 * 1024
    assert set(G.QUICK_ROWS) <= set(range(1, 65)) and len(G.grid_shapes(quick=True)) < 100


def _stand_ins(torch, F, wrong=False):
    def llama(x, w, eps):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        if wrong:  # weight before rounding (rms_norm_llama_wbr's formula): one rounding
            return (w.float() * h).to(x.dtype)
        return w * h.to(x.dtype)

    def gemma(x, w, eps):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return (h * (1.0 + w.float())).type_as(x)

    def fused(x, res, w, eps):
        res.copy_(res + x)
        return llama(res, w, eps)

    def fused_ln(x, res, w, b, eps):
        res.copy_(res + x)
        return F.layer_norm(res, (x.shape[-1],), w, b, eps)

    return {
        ("rms_norm", "llama"): llama,
        ("rms_norm", "gemma"): gemma,
        ("rms_norm", "torch"): lambda x, w, eps: F.rms_norm(x, (x.shape[-1],), w, eps),
        ("fused_add_rms_norm", None): fused,
        ("layer_norm", None): lambda x, w, b, eps: F.layer_norm(x, (x.shape[-1],), w, b, eps),
        ("fused_add_layer_norm", None): fused_ln,
        ("silu", None): F.silu,
        ("gelu", None): F.gelu,
        ("gelu_tanh", None): lambda x: F.gelu(x, approximate="tanh"),
        ("silu_and_mul", None): lambda g, u: F.silu(g) * u,
    }


def test_run_grid_counts_what_differs_on_the_cpu():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch.nn.functional as F

    kernels, _ = G.load_kernels(str(REPO / "kernels"), set(), True)
    kernels = [k for k in kernels if k["name"] in {"rms_norm_llama", "rms_norm_gemma", "rms_norm_torch",
                                                    "fused_add_rms_norm", "layer_norm", "fused_add_layer_norm",
                                                    "silu", "gelu", "gelu_tanh", "silu_and_mul",
                                                    "rms_norm_llama_wbr"}]
    assert len(kernels) == 11
    right, wrong = _stand_ins(torch, F), _stand_ins(torch, F, wrong=True)
    launchers = {}
    for k in kernels:
        table = wrong if k["name"] == "rms_norm_llama_wbr" else right
        f = table.get((k["op"], k["semantics"])) or table[(k["op"], None)]
        for dt in G.DTYPE_NAMES:
            launchers[(k["name"], dt)] = f
    shapes = [(1, 127), (3, 256), (17, 96)]
    cells, incomplete = G.run_grid(kernels, launchers, torch.device("cpu"), shapes, log=lambda s: None)
    assert not incomplete
    assert len(cells) == len(kernels) * 3 * 3
    for (name, dt, dist), c in cells.items():
        assert c["shapes"] == len(shapes), (name, dt, dist)
        if name != "rms_norm_llama_wbr":
            assert c["mismatched_elements"] == 0, (name, dt, dist, c["failing"])
    wbr = [c for (name, dt, _), c in cells.items() if name == "rms_norm_llama_wbr" and dt == "bf16"]
    assert sum(c["mismatched_elements"] for c in wbr) > 0
    for c in wbr:
        for f in c["failing"]:
            assert 0 < f["mismatched"] <= f["elements"] and f["max_ulp"] >= 1
    f32 = [c for (name, dt, _), c in cells.items() if name == "rms_norm_llama_wbr" and dt == "f32"]
    assert sum(c["mismatched_elements"] for c in f32) == 0  # no intermediate rounding in f32
    fused = cells[("fused_add_rms_norm", "bf16", "normal")]
    assert fused["elements"] == 2 * sum(r * c for r, c in shapes)  # output and residual
    fused_ln = cells[("fused_add_layer_norm", "f16", "scaled")]
    assert fused_ln["elements"] == 2 * sum(r * c for r, c in shapes)

    meta = dict(date="d", device="cpu", torch="t", cuda="c", transformers="x", commit="abc", grid="g",
                seconds=1.0, incomplete=False)
    res = G.make_result(kernels, cells, meta, [])
    assert res["totals"]["exact_kernels"] == 10 and res["totals"]["mismatched_elements"] == 0
    md = G.render_markdown(res)
    assert "every exact kernel matches eager in every cell" in md
    assert "| rms_norm_llama " in md and "Known-different variants" in md and "| rms_norm_llama_wbr | no | bf16 |" in md
    assert G.summary_line(res).startswith("eager grid OK: 10 exact kernels")

    # an exact kernel that differs fails the summary and is listed shape by shape
    for k in kernels:
        if k["name"] == "rms_norm_llama_wbr":
            k["exact"] = True
    cells2 = {key: dict(c, exact=True) if key[0] == "rms_norm_llama_wbr" else c for key, c in cells.items()}
    bad = G.make_result(kernels, cells2, meta, [])
    assert bad["totals"]["mismatched_elements"] > 0
    assert G.summary_line(bad).startswith("eager grid FAIL")
    assert "| rms_norm_llama_wbr | yes | bf16 |" in G.render_markdown(bad)
