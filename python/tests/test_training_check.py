"""scripts/training_check.py (issue 30's model-level training check, run on the GPU machine)
stays runnable: its --dry-run on the CPU builds the kernels folder (the bundled forwards and the
backward kernels with their entries spelled out), kernelizes the shipped tiny Llama and tiny
GPT-2 and a random tiny Gemma in training mode (every RMSNorm (llama, gemma) layer, gated MLP,
LayerNorm and standalone GELU takes both kernels, but the norms in f32; nothing is swapped
without CUDA) and
trains both copies."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO, bundled_version


def test_the_training_check_runs_on_the_cpu(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "training_check.py"), str(tmp_path),
                        "--dry-run", "--steps", "2", "--dtypes", "bf16", "--models", "tiny-llama"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    data = json.loads((tmp_path / "training_check.json").read_text())
    assert not data["errors"] and data["env"]["dry_run"] is True
    (row,) = data["rows"]
    # the tiny Llama's 9 RMSNorm layers and 4 gated MLPs: each would take the forward and the
    # backward kernel
    assert len(row["replaced"]) == 13 and row["with_backward"] == row["replaced"]
    assert row["backward_kernels"] == ["rms_norm_llama_backward", "silu_mul_backward"]
    assert len(row["losses_eager"]) == 2 and row["ok"]
    assert row["grad_steps_compared"] == 2 and row["gradients_differing"] == {}
    assert "ALL BIT-IDENTICAL" in r.stdout


def test_the_training_check_runs_a_random_tiny_gemma_with_its_backward_kernels(tmp_path):
    """`--models tiny-gemma`: a random-weight GemmaForCausalLM built by the script (models/ has no
    Gemma), its 4 GeGLU MLPs would take gelu_tanh_mul and gelu_tanh_mul_backward, its 9
    GemmaRMSNorm layers rms_norm_gemma and rms_norm_gemma_backward (but in f32: the forward
    only, F32_ACCUMULATION); f16 trains with AdamW eps 1e-4 (1e-8 is 0 in f16 and turns the
    parameters NaN), so its losses stay finite; `--no-gated` leaves the MLPs alone."""
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "training_check.py"), str(tmp_path),
                        "--dry-run", "--steps", "2", "--dtypes", "f16", "--models", "tiny-gemma"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    data = json.loads((tmp_path / "training_check.json").read_text())
    assert not data["errors"]
    (row,) = data["rows"]
    mlps = [f"model.layers.{i}.mlp" for i in range(4)]
    norms = [f"model.layers.{i}.{n}" for i in range(4)
             for n in ("input_layernorm", "post_attention_layernorm")] + ["model.norm"]
    assert sorted(row["replaced"]) == sorted(mlps + norms), row["report"]
    assert row["with_backward"] == row["replaced"]
    assert row["backward_kernels"] == ["gelu_tanh_mul_backward", "rms_norm_gemma_backward"]
    assert "backward gelu_tanh_mul_backward 1.0.0" in row["report"]
    assert "[GemmaRMSNorm: rms_norm (gemma), f16, cols=256]" in row["report"]
    assert ("(9 layers) [rms_norm (gemma), f16, cols=256] would run under autograd as the forward "
            f"kernel + backward rms_norm_gemma_backward {bundled_version('rms_norm_gemma_backward')}") in row["report"]
    assert row["adamw_eps"] == 1e-4 and row["losses_finite"] and row["ok"]
    assert len(set(row["losses_eager"])) == 2   # the step moved the model
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "training_check.py"), str(tmp_path),
                        "--dry-run", "--steps", "1", "--dtypes", "f32", "--models", "tiny-gemma",
                        "--no-gated"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    (row,) = json.loads((tmp_path / "training_check.json").read_text())["rows"]
    # the norms alone, and in f32 without their backward (eager's input-gradient order)
    assert sorted(row["replaced"]) == sorted(norms) and row["with_backward"] == [], row["report"]
    assert "(9 layers) [rms_norm (gemma), f32, cols=256] keep their original forward" in row["report"]
    assert row["adamw_eps"] == 1e-8 and row["ok"]


def test_the_training_check_runs_tiny_gpt2_with_the_layer_norm_backward(tmp_path):
    """tiny-gpt2's 9 LayerNorm layers would take layer_norm and layer_norm_backward, its 4 GELUs
    (HF GELUActivation) gelu and gelu_backward; `--kernel DIR` puts a kernel folder in place of
    the bundled one of its name (here a copy of the bundled backward kernel under another
    version), `--no-layer-norm` leaves LayerNorm's two out, `--no-activations` the GELU's."""
    mine = tmp_path / "mine" / "layer_norm_backward"
    shutil.copytree(REPO / "kernels" / "layer_norm_backward", mine)
    toml = (mine / "kernel.toml").read_text(encoding="utf-8")
    (mine / "kernel.toml").write_text(re.sub(r'(?m)^version = ".*"$', 'version = "9.9.9"', toml, count=1),
                                      encoding="utf-8")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "training_check.py"), str(out),
                        "--dry-run", "--steps", "2", "--dtypes", "f32", "--models", "tiny-gpt2",
                        "--kernel", str(mine)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    data = json.loads((out / "training_check.json").read_text())
    assert not data["errors"] and str(mine) in data["env"]["source"]
    (row,) = data["rows"]
    # the 9 LayerNorm layers, in f32 too (eager's LayerNorm backward is one node), and the 4 GELUs
    gelus = [f"transformer.h.{i}.mlp.act" for i in range(4)]
    assert len(row["replaced"]) == 13 and row["with_backward"] == row["replaced"], row["report"]
    assert sorted(p for p in row["replaced"] if p.endswith(".act")) == gelus, row["report"]
    assert row["backward_kernels"] == ["gelu_backward", "layer_norm_backward"]
    assert "layer_norm_backward 9.9.9" in row["report"] and row["ok"]
    assert ("transformer.h.0.mlp.act ... transformer.h.3.mlp.act (4 layers) [gelu, f32, cols=1024] "
            "would run under autograd as the forward kernel + backward gelu_backward 1.0.0") in row["report"]
    assert "tiny-gpt2 f32 backward launches: none" in r.stdout   # (nothing launches on the CPU)
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "training_check.py"), str(out),
                        "--dry-run", "--steps", "1", "--dtypes", "bf16", "--models", "tiny-gpt2",
                        "--no-layer-norm"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    (row,) = json.loads((out / "training_check.json").read_text())["rows"]
    assert row["replaced"] == row["with_backward"] == gelus and row["ok"], row["report"]
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "training_check.py"), str(out),
                        "--dry-run", "--steps", "1", "--dtypes", "bf16", "--models", "tiny-gpt2",
                        "--no-layer-norm", "--no-activations"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    (row,) = json.loads((out / "training_check.json").read_text())["rows"]
    assert row["replaced"] == [] and row["with_backward"] == [] and row["ok"]


def test_the_training_check_takes_both_kernels_from_a_fresh_hub(tmp_path, fresh_hub):
    """`--hub`: a hub as a new user starts it hands out the forward and the backward kernels under
    the default policy, all from the bundled certificates (the norm's backward recorded on an
    H200 in session 19, the gated MLP's in session 26; issue 30)."""
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "training_check.py"), str(tmp_path),
                        "--dry-run", "--steps", "2", "--dtypes", "bf16", "--models", "tiny-llama",
                        "--hub", fresh_hub.url],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    data = json.loads((tmp_path / "training_check.json").read_text())
    assert not data["errors"] and data["env"]["source"] == f"hub {fresh_hub.url}"
    (row,) = data["rows"]
    # the 9 RMSNorm layers and the 4 gated MLPs
    assert len(row["with_backward"]) == 13, row["report"]
    assert f"rms_norm_llama_backward {bundled_version('rms_norm_llama_backward')}" in row["report"]
    assert "(bit_exact)" in row["report"]
    assert "backward silu_mul_backward 1.0.0" in row["report"]


def test_the_training_check_runs_a_tiny_llama_with_torch_rms_norms(tmp_path):
    """`--models tiny-llama-rmsnorm`: the shipped tiny Llama with nn.RMSNorm norms (rms_norm
    semantics torch): its 9 norms would take rms_norm_torch and rms_norm_torch_backward, in f32
    too (F.rms_norm is one autograd node: no F32_ACCUMULATION), its 4 MLPs silu_mul and
    silu_mul_backward."""
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "training_check.py"), str(tmp_path),
                        "--dry-run", "--steps", "2", "--dtypes", "f32", "--models", "tiny-llama-rmsnorm"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    data = json.loads((tmp_path / "training_check.json").read_text())
    assert not data["errors"], data["errors"]
    (row,) = data["rows"]
    assert len(row["replaced"]) == 13 and row["with_backward"] == row["replaced"], row["report"]
    assert row["backward_kernels"] == ["rms_norm_torch_backward", "silu_mul_backward"]
    assert row["ok"]


_CANDIDATE_TOML = """name = "{name}"
version = "1.0.0"
op = "{op}"
semantics = "{semantics}"
description = "a test candidate"
authors = ["test"]
license = "Apache-2.0"
runtime = "python"
source = "kernel.py"

[entry]
bf16 = "{op}"
f16 = "{op}"
f32 = "{op}"
"""

_RMS_CANDIDATE = '''import torch


def rms_norm_backward(dy, x, w, eps):
    # eager autograd of HF LlamaRMSNorm's formula{note}
    with torch.enable_grad():
        xr = x.detach().requires_grad_(True)
        wr = w.detach().requires_grad_(True)
        h = xr.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        dx, dw = torch.autograd.grad(wr * h.to(x.dtype), (xr, wr), dy)
    return dx * {scale}, dw
'''

_LN_CANDIDATE = '''import torch


def layer_norm_backward(dy, x, mean, rstd, w):
    # eager's own backward op on the saved statistics (kept in x's dtype on the CPU)
    rows, cols = x.shape
    m, r = mean.reshape(rows, 1).to(x.dtype), rstd.reshape(rows, 1).to(x.dtype)
    dx, dw, db = torch.ops.aten.native_layer_norm_backward(dy, x, [cols], m, r, w, torch.zeros_like(w),
                                                           [True, True, True])
    return dx, dw, db
'''


_GATED_CANDIDATE = '''import torch
import torch.nn.functional as F


def silu_mul_backward(dy, gate, up):
    # eager autograd of F.silu(gate) * up
    with torch.enable_grad():
        g = gate.detach().requires_grad_(True)
        u = up.detach().requires_grad_(True)
        return torch.autograd.grad(F.silu(g) * u, (g, u), dy)
'''


def _candidate(folder: Path, name: str, op: str, semantics: str, source: str) -> Path:
    folder.mkdir()
    (folder / "kernel.toml").write_text(_CANDIDATE_TOML.format(name=name, op=op, semantics=semantics))
    (folder / "kernel.py").write_text(source)
    return folder


def _model_level(tmp_path: Path, candidate: Path, model: str) -> tuple[int, dict, str]:
    out = tmp_path / f"out-{candidate.name}"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "training_check.py"), str(out), "--dry-run",
                        "--steps", "2", "--dtypes", "bf16", "--models", model,
                        "--backward-candidate", str(candidate)],
                       capture_output=True, text=True, timeout=600)
    data = json.loads((out / "training_check.json").read_text())
    assert not data["errors"], data["errors"]
    (row,) = data["rows"]
    return r.returncode, row, r.stdout


def test_a_backward_candidates_model_level_trains_with_it_as_the_layers_backward(tmp_path):
    """`--backward-candidate DIR` (docs/backward.md, item 9): the layers computing the candidate's
    op keep eager's forward and run the candidate as their backward; a candidate that computes
    eager autograd's gradients trains bit for bit as eager (bf16), one whose dx is 1 % off moves
    the losses from the second step on, and the control (eager's gradients through the same
    wrapping) stays identical in both runs."""
    exact = _candidate(tmp_path / "exact", "eager_rms", "rms_norm_backward", "llama",
                       _RMS_CANDIDATE.format(note="", scale="1"))
    rc, row, out = _model_level(tmp_path, exact, "tiny-llama")
    assert rc == 0, out
    assert len(row["layers_wrapped"]) == 9 and row["ok"] and row["control_identical"]
    assert row["max_loss_abs_diff"] == 0 and "ALL BIT-IDENTICAL" in out
    off = _candidate(tmp_path / "off", "off_rms", "rms_norm_backward", "llama",
                     _RMS_CANDIDATE.format(note=", dx then scaled by 1.01", scale="1.01"))
    rc, row, out = _model_level(tmp_path, off, "tiny-llama")
    assert rc == 1 and not row["ok"] and row["control_identical"]
    assert row["candidate_loss_steps_differing"] == [1]   # the first step's loss comes before it
    assert row["candidate_gradients_differing"] and sum(row["candidate_parameters_differing"].values()) > 0


def test_a_layer_norm_backward_candidates_model_level_wraps_gpt2s_layer_norms(tmp_path):
    ln = _candidate(tmp_path / "ln", "eager_ln", "layer_norm_backward", "default", _LN_CANDIDATE)
    rc, row, out = _model_level(tmp_path, ln, "tiny-gpt2")
    assert rc == 0, out
    assert len(row["layers_wrapped"]) == 9 and row["ok"] and row["control_identical"]
    rc, row, out = _model_level(tmp_path, ln, "tiny-llama")   # no LayerNorm there: said, not failed
    assert row["skipped"] == "no layer of tiny-llama computes layer_norm (default)"
    assert rc == 1 and "NOTHING MEASURED" in out


def test_a_gated_backward_candidates_model_level_wraps_the_gated_mlps(tmp_path):
    """silu_mul_backward: each of the tiny Llama's 4 gated MLPs runs down_proj(silu(gate_proj(x))
    * up_proj(x)) with the candidate as the product's backward."""
    gated = _candidate(tmp_path / "gated", "eager_swiglu", "silu_mul_backward", "default", _GATED_CANDIDATE)
    rc, row, out = _model_level(tmp_path, gated, "tiny-llama")
    assert rc == 0, out
    assert row["layers_wrapped"] == [f"model.layers.{i}.mlp" for i in range(4)]
    assert row["ok"] and row["control_identical"]


_GELU_CANDIDATE = '''import torch
import torch.nn.functional as F


def gelu_backward(dy, x):
    # eager autograd of F.gelu (erf){note}
    with torch.enable_grad():
        xr = x.detach().requires_grad_(True)
        (dx,) = torch.autograd.grad(F.gelu(xr), (xr,), dy)
    return dx * {scale}
'''


def test_an_activation_backward_candidates_model_level_wraps_the_activation_modules(tmp_path):
    """gelu_backward: the tiny GPT-2's 4 GELU modules (its MLPs' act) keep their forward and run
    the candidate as their backward; eager's gradient trains as eager, one 1 % off does not."""
    exact = _candidate(tmp_path / "gelu", "eager_gelu", "gelu_backward", "default",
                       _GELU_CANDIDATE.format(note="", scale="1"))
    rc, row, out = _model_level(tmp_path, exact, "tiny-gpt2")
    assert rc == 0, out
    assert row["layers_wrapped"] == [f"transformer.h.{i}.mlp.act" for i in range(4)], row["layers_wrapped"]
    assert row["ok"] and row["control_identical"] and row["max_loss_abs_diff"] == 0
    off = _candidate(tmp_path / "gelu_off", "off_gelu", "gelu_backward", "default",
                     _GELU_CANDIDATE.format(note=", dx then scaled by 1.01", scale="1.01"))
    rc, row, out = _model_level(tmp_path, off, "tiny-gpt2")
    assert rc == 1 and not row["ok"] and row["control_identical"]
    assert sum(row["candidate_parameters_differing"].values()) > 0
