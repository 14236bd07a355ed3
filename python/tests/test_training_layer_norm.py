"""Training mode for nn.LayerNorm (issue 30): a LayerNorm swapped for `layer_norm` gets the
backward op `layer_norm_backward`, on the CPU.

Under autograd the layer's forward is eager's own `native_layer_norm` (its bits by definition,
and the mean and rstd its backward reads); its backward is the kernel's two entries, `dx` and
`dwdb`, on (dy, x, mean, rstd, w). The stand-ins are test_training's: the backward kernel
(`RecordingLnBackward`) records its launches (stage, grid, block, tensors, scalars: exactly
what the CUDA entries would receive) and writes eager's gradients entry by entry from the
tensors of its ABI slots (`eager_ln_grads`: eager's own backward op, checked here against
torch.autograd bit for bit, so a gradient that lands in the wrong slot or tensor shows). The
real kernel runs only on a GPU (test_gpu.py's training test on tiny-gpt2,
scripts/training_check.py, scripts/ln_backward_probe.py).
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import pickle
import shutil
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kernelize
from conftest import REPO, bundled_version
from kernelize import core, ops, training
from test_training import (assert_double_backward_is_eagers, train_bit_for_bit, ABI, DTYPES,
                           RecordingLnBackward, _IS_AVAILABLE, _kz, _training_lines,
                           eager_ln_grads, gpu_faked, recording_aot_backend)  # noqa: F401 (gpu_faked: a fixture)
from test_training_gated import _Hub, _Props, _folder, _kernels

transformers = pytest.importorskip("transformers")
pytest.importorskip("numpy")

OP = "layer_norm_backward"
# The ABI of docs/spec.md section 2c (kernel-registry's Op::stages; abi.json has it too)
PARAMS = {
    "dx": "T* dx, const T* dy, const T* x, const float* mean, const float* rstd, const T* w, "
          "long long rows, long long cols",
    "dwdb": "T* dw, T* db, const T* dy, const T* x, const float* mean, const float* rstd, "
            "long long rows, long long cols",
}
NAMES = {"dx": ["dx", "dy", "x", "mean", "rstd", "w", "rows", "cols"],
         "dwdb": ["dw", "db", "dy", "x", "mean", "rstd", "rows", "cols"]}
ALL = ("layer_norm", "layer_norm_backward")
# a GPT-2 block's two LayerNorms, and the final one
GPT2_LNS = ["transformer.h.0.ln_1", "transformer.h.0.ln_2", "transformer.h.1.ln_1",
            "transformer.h.1.ln_2", "transformer.ln_f"]
INT_OF = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def _same_bits(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(INT_OF[a.dtype]),
                                                                     b.view(INT_OF[b.dtype]))


@pytest.fixture
def kernels(tmp_path):
    """A kernels_dir with the exact forward (layer_norm) and the backward kernel."""
    return _kernels(tmp_path / "kernels", *ALL)


@pytest.fixture
def forward_only(tmp_path):
    return _kernels(tmp_path / "fwd", "layer_norm")


def _ln(cols=16, dtype=torch.float32, seed=3, **kw):
    torch.manual_seed(seed)
    ln = nn.LayerNorm(cols, **kw).to(dtype)
    with torch.no_grad():
        if ln.weight is not None:
            ln.weight.copy_(1 + 0.3 * torch.randn(cols))
        if ln.bias is not None:
            ln.bias.copy_(0.2 * torch.randn(cols))
    return ln


def _gpt2(dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                  attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0,
                                  activation_function="gelu")
    return transformers.GPT2LMHeadModel(cfg).to(dtype)


def _ids(rows=2, cols=7, seed=0, vocab=128):
    return torch.randint(0, vocab, (rows, cols), generator=torch.Generator().manual_seed(seed))


def _grads(model, ids):
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, use_cache=False).logits.float().square().mean().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _inputs(shape, dtype, seed=1):
    """x, w, b, dy with rows of different scales and shifts (as the probe draws them)."""
    g = torch.Generator().manual_seed(seed)
    cols = shape[-1]
    scale = torch.empty(*shape[:-1], 1).uniform_(0.5, 2.0, generator=g)
    shift = torch.empty(*shape[:-1], 1).uniform_(-1.0, 1.0, generator=g)
    x = (torch.randn(shape, generator=g) * scale + shift).to(dtype)
    w = (1 + 0.2 * torch.randn(cols, generator=g)).to(dtype)
    b = (0.1 * torch.randn(cols, generator=g)).to(dtype)
    dy = torch.randn(shape, generator=g).to(dtype)
    return x, w, b, dy


def _autograd(x, w, b, dy, eps=1e-5):
    """Eager autograd of nn.LayerNorm's F.layer_norm: (dx, dw, db)."""
    xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
    return torch.autograd.grad(F.layer_norm(xs, [x.shape[-1]], ws, bs, eps), (xs, ws, bs), dy)


def _probe():
    """scripts/ln_backward_probe.py as a module (its launch rule, `dwdb_launch`)."""
    spec = importlib.util.spec_from_file_location("ln_backward_probe",
                                                  REPO / "scripts" / "ln_backward_probe.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---- the stand-in computes eager's gradients -----------------------------------------------

@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("shape", [(9, 40), (2, 3, 64)])
def test_the_stand_ins_gradients_are_eager_autograds_bit_for_bit(dtype, shape):
    t = DTYPES[dtype]
    x, w, b, dy = _inputs(shape, t)
    want = _autograd(x, w, b, dy)
    _, mean, rstd = training.layer_norm_forward(x, w, b, 1e-5)
    bk = RecordingLnBackward()
    got = training.run_layer_norm_backward(bk, dy, x, w, b, mean, rstd)
    assert bk.stages() == ["dx", "dwdb"]
    for a, c in zip(got, want):
        assert _same_bits(a, c)
    # the formula training falls back to is the same (its eager autograd)
    fb = training.eager_autograd(lambda x_, w_, b_: training.layer_norm_forward(x_, w_, b_, 1e-5)[0],
                                 dy, (x, w, b), (True, True, True), False)
    assert all(_same_bits(a, c) for a, c in zip(fb, want))
    # and the forward is eager's
    assert _same_bits(training.layer_norm_forward(x, w, b, 1e-5)[0], F.layer_norm(x, [shape[-1]], w, b))


# ---- the launches --------------------------------------------------------------------------

def test_the_layer_norm_backward_launches_are_the_registrys_rule():
    """kernel_registry::backward's layer_norm_backward_launches_by_its_rule (132 SMs): dx a
    block a row, dwdb by the launch rule at docs/backward-layer-norm.md's table."""
    dims = lambda s, r, c, sms=132: training.stage_dims(s, r, c, sms, 2048, OP)  # noqa: E731
    assert dims("dx", 1, 4096) == ((1, 1, 1), (128, 1, 1))
    assert dims("dx", 65536, 8) == ((65536, 1, 1), (128, 1, 1))
    assert dims("dx", 7, 5)[1] == (128, 1, 1)
    dwdb = lambda r, c, sms=132: (dims("dwdb", r, c, sms)[0][0], dims("dwdb", r, c, sms)[1][:2])  # noqa: E731
    for (rows, cols), want in [((64, 4096), (128, (16, 8))), ((256, 1024), (128, (8, 32))),
                               ((256, 4096), (128, (16, 32))), ((1024, 8192), (128, (32, 32))),
                               ((4096, 256), (32, (8, 32))), ((4096, 4096), (128, (16, 32))),
                               ((8192, 1024), (128, (8, 32))), ((8192, 8192), (128, (32, 32))),
                               ((8192, 16384), (256, (32, 32)))]:
        assert dwdb(rows, cols) == want, (rows, cols)
    assert dwdb(1, 4096) == (128, (32, 1))
    assert dwdb(32, 4097) == (129, (32, 1))
    assert dwdb(33, 100) == (4, (32, 8))
    assert dwdb(63, 1) == (1, (32, 8))
    assert dwdb(127, 4095)[1] == (16, 8)
    assert dwdb(128, 4097)[1][1] == 16
    assert dwdb(65536, 1)[1] == (8, 32)
    assert training.BLOCKS_OF[OP] == {"dx": 128, "dwdb": None} and training.LN_STAGES == ("dx", "dwdb")
    # a block the kernel takes (x in 8, 16, 32; y <= 32; whole warps), a grid of at least one
    for rows in (1, 2, 33, 63, 64, 100, 128, 255, 256, 1023, 1024, 65536):
        for cols in (1, 7, 32, 1000, 4096, 4099, 65536):
            for sms in (1, 8, 114, 132, 1000):
                grid, (x, y, z) = dims("dwdb", rows, cols, sms)
                assert x in (8, 16, 32) and 1 <= y <= 32 and z == 1 and (x * y) % 32 == 0
                assert grid[0] >= 1 and grid[1:] == (1, 1)
    for stage in ("dx", "dwdb"):
        with pytest.raises(ValueError, match="65537 rows is more than the 65536.*eager autograd"):
            dims(stage, 65537, 4096)
    with pytest.raises(ValueError, match="no entry `dw`"):
        dims("dw", 4, 4)
    with pytest.raises(ValueError, match="empty problem"):
        dims("dx", 0, 4)


def test_the_dwdb_launch_takes_two_columns_where_the_kernel_does():
    """training.dwdb_dims (the one launch rule; scripts/ln_backward_probe.py's `dwdb_launch`
    calls it) sizes a tile of two columns a thread exactly where the kernel carries two: even
    cols from the kernel's LB_GB_VC2_COLS, dy and x aligned (the client's inputs always are);
    for the probe's unaligned cases, one column a thread."""
    import re
    src = (REPO / "kernels" / "layer_norm_backward" / "kernel.cu").read_text()
    assert int(re.search(r"#define LB_GB_VC2_COLS (\d+)", src).group(1)) == training.DWDB_TWO_COLUMNS_FROM
    probe = _probe()
    for rows in (64, 100, 1023, 1024, 4096, 65536):
        for cols in (1000, 4094, 4095, 4096, 4097, 8192, 16384):
            for sms in (78, 114, 132):
                two = cols % 2 == 0 and cols >= training.DWDB_TWO_COLUMNS_FROM
                blocks, (bx, by, bz) = training.dwdb_dims(rows, cols, sms)
                assert blocks == -(-cols // ((2 if two else 1) * bx)) and bz == 1
                ublocks, (ubx, uby, _) = training.dwdb_dims(rows, cols, sms, aligned=False)
                assert ublocks == -(-cols // ubx) and uby == by
                assert probe.dwdb_launch(rows, cols, sms, aligned=False) == (ublocks, (ubx, uby))
                assert probe.dwdb_launch(rows, cols, sms) == (blocks, (bx, by))


def test_the_launches_are_the_fixtures_table():
    """Against python/tests/fixtures/abi.json's `backward_dims` (kernel_registry's stage_dims
    at every shape and device of its table), once the fixture carries the op."""
    cases = {k: v for k, v in ABI["backward_dims"]["cases"].items() if k.startswith(OP + ",")}
    if not cases:
        pytest.skip(f"python/tests/fixtures/abi.json has no {OP} entries in `backward_dims` yet "
                    "(regenerated from kernel-registry)")
    assert {k.split(",")[1] for k in cases} == {"dx", "dwdb"}
    for key, (grid, block) in cases.items():
        _, stage, rows, cols, sms, tps = key.split(",")
        got = training.stage_dims(stage, int(rows), int(cols), int(sms), int(tps), OP)
        assert got == ((grid, 1, 1), tuple(block)), key


def test_the_layer_norm_abi_is_the_registrys():
    spec = ABI["backward_ops"].get(OP)
    if spec is None:
        pytest.skip(f"python/tests/fixtures/abi.json has no {OP} in `backward_ops` yet")
    assert (spec["forward"], spec["semantics"], spec["takes_eps"]) == ("layer_norm", ["default"], False)
    assert spec["verdict_depends_on_device"] is False and OP not in kernelize.manifest.VERDICT_ON_DEVICE
    assert [(s["name"], s["block"], s["params"], s["names"]) for s in spec["stages"]] == \
        [(n, training.LN_BLOCKS[n], PARAMS[n], NAMES[n]) for n in ("dx", "dwdb")]
    assert [(g["name"], g["stage"], g["one_row"]) for g in spec["gradients"]] == \
        [("dx", "dx", False), ("dw", "dwdb", True), ("db", "dwdb", True)]
    assert kernelize.manifest.BACKWARD_OF[("layer_norm", "default")] == OP
    assert kernelize.manifest.BACKWARD_OPS[OP] == ("dx", "dwdb")


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("shape,sms", [((6, 40), 132), ((2, 3, 4096), 132), ((300, 24), 8)])
def test_the_backward_launches_both_entries_with_the_abi(dtype, shape, sms):
    t = DTYPES[dtype]
    cols = shape[-1]
    rows = int(torch.Size(shape).numel()) // cols
    x, w, b, dy = _inputs(shape, t, seed=5)
    # dy not contiguous (as a transposed matmul's gradient can be): passed as a contiguous copy,
    # as eager's backward makes it contiguous itself
    dy = dy.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert not dy.is_contiguous()
    _, mean, rstd = training.layer_norm_forward(x, w, b, 1e-5)
    bk = RecordingLnBackward(sms=sms)
    dx, dw, db = training.run_layer_norm_backward(bk, dy, x, w, b, mean, rstd)
    assert bk.stages() == ["dx", "dwdb"]
    for stage, grid, block, tensors, scalars in bk.calls:
        assert (grid, block) == training.stage_dims(stage, rows, cols, sms, 2048, OP)
        if stage == "dx":
            assert (grid, block) == ((rows, 1, 1), (128, 1, 1))
        else:
            g, blk = training.dwdb_dims(rows, cols, sms)
            assert (grid, block) == ((g, 1, 1), blk)
        args = [*tensors, *scalars]
        params = [p.strip() for p in PARAMS[stage].split(",")]
        assert len(args) == len(params) == len(NAMES[stage])
        for p, a in zip(params, args):
            if "*" in p:
                want = torch.float32 if p.startswith(("float", "const float")) else t
                assert isinstance(a, torch.Tensor) and a.is_contiguous() and a.dtype == want, (stage, p)
                assert a.data_ptr() % 16 == 0, (stage, p)
            else:
                assert isinstance(a, int) and not isinstance(a, bool), (stage, p)
        named = dict(zip(NAMES[stage], args))
        assert (named["rows"], named["cols"]) == (rows, cols)
        assert named["x"] is x and torch.equal(named["dy"], dy) and named["dy"].data_ptr() != dy.data_ptr()
        assert named["mean"].shape == named["rstd"].shape == (rows,)
        assert torch.equal(named["mean"], mean.reshape(rows).float())
        assert torch.equal(named["rstd"], rstd.reshape(rows).float())
        if stage == "dx":
            assert named["dx"] is dx and named["w"] is w
        else:
            assert named["dw"] is dw and named["db"] is db
    assert dx.shape == x.shape and dw.shape == db.shape == (cols,)
    assert dx.dtype == dw.dtype == db.dtype == t
    # each gradient in its slot: eager autograd's bits
    want = _autograd(x, w, b, dy.contiguous())
    assert all(_same_bits(a, c) for a, c in zip((dx, dw, db), want))


def test_only_the_entries_needed_are_launched():
    x, w, b, dy = _inputs((5, 32), torch.bfloat16)
    _, mean, rstd = training.layer_norm_forward(x, w, b, 1e-5)
    want = _autograd(x, w, b, dy)
    for needs, stages in [((True, False, False), ["dx"]), ((False, True, False), ["dwdb"]),
                          ((False, False, True), ["dwdb"]), ((False, True, True), ["dwdb"]),
                          ((True, True, False), ["dx", "dwdb"])]:
        bk = RecordingLnBackward()
        got = training.run_layer_norm_backward(bk, dy, x, w, b, mean, rstd, needs)
        assert bk.stages() == stages, needs
        for g, n, c in zip(got, needs, want):
            assert (g is None) == (not n) and (g is None or _same_bits(g, c)), needs


def test_more_rows_than_the_op_takes_run_eagers_backward_and_say_so_once(caplog):
    rows = training.LN_MAX_ROWS + 1
    x, w, b, dy = _inputs((rows, 4), torch.float32)
    _, mean, rstd = training.layer_norm_forward(x, w, b, 1e-5)
    bk = RecordingLnBackward()
    with caplog.at_level(logging.WARNING, logger="kernelize"):
        got = training.run_layer_norm_backward(bk, dy, x, w, b, mean, rstd)
        again = training.run_layer_norm_backward(bk, dy, x, w, b, mean, rstd, (True, False, True))
    assert bk.calls == []
    want = _autograd(x, w, b, dy)
    assert all(_same_bits(a, c) for a, c in zip(got, want))
    assert _same_bits(again[0], want[0]) and again[1] is None and _same_bits(again[2], want[2])
    said = [r.getMessage() for r in caplog.records if "takes at most 65536" in r.getMessage()]
    assert len(said) <= 1 and any("65537 rows" in w and "eager's backward" in w for w in training._SAID)
    # at the limit the kernel runs
    x, w, b, dy = _inputs((training.LN_MAX_ROWS, 2), torch.float32)
    _, mean, rstd = training.layer_norm_forward(x, w, b, 1e-5)
    training.run_layer_norm_backward(bk, dy, x, w, b, mean, rstd)
    assert bk.stages() == ["dx", "dwdb"]


def test_an_empty_batch_launches_nothing():
    bk = RecordingLnBackward()
    x = torch.empty(0, 8, dtype=torch.bfloat16)
    w, b = torch.ones(8, dtype=torch.bfloat16), torch.zeros(8, dtype=torch.bfloat16)
    _, mean, rstd = training.layer_norm_forward(x, w, b, 1e-5)
    dx, dw, db = training.run_layer_norm_backward(bk, x, x, w, b, mean, rstd)
    assert bk.calls == [] and dx.shape == (0, 8)
    assert torch.equal(dw, torch.zeros(8, dtype=torch.bfloat16)) and torch.equal(db, dw)


# ---- training mode on a model ----------------------------------------------------------------

def test_a_gpt2s_layer_norms_all_get_the_backward_kernel_and_eagers_gradients(kernels, gpu_faked):
    ref, m = _gpt2(), _gpt2()
    ids = _ids()
    want = _grads(ref, ids)
    rep = _kz(m, kernels_dir=kernels, mode="training")
    lns = {e.path: e for e in rep.entries if e.op == "layer_norm"}
    assert sorted(lns) == sorted(GPT2_LNS)
    assert all(e.status == "replaced" and e.backward is not None and e.backward.name == OP
               for e in lns.values()), str(rep)
    lines = [ln for ln in _training_lines(rep) if "[layer_norm, bf16, cols=64]" in ln]
    assert len(lines) == 1 and "(5 layers)" in lines[0] \
        and f"layer_norm_backward {bundled_version('layer_norm_backward')}" in lines[0], \
        _training_lines(rep)
    assert "run under autograd as the forward kernel + backward" in lines[0]
    assert gpu_faked.loaded and {dt for _, dt in gpu_faked.loaded} == {"bf16"}
    got = _grads(m, ids)
    assert set(got) == set(want)
    for n in want:
        assert torch.equal(got[n], want[n]), n
    # under autograd the forward is eager's op (the forward kernel not launched, not counted);
    # each LayerNorm's backward: dx and dwdb once, on [2*7, 64]
    assert kernelize.launch_counts(m) == {p: 0 for p in GPT2_LNS}
    ln = gpu_faked.ln
    assert ln.stages() == ["dx", "dwdb"] * 5
    for stage, grid, block, tensors, scalars in ln.calls:
        assert scalars == (14, 64)
        assert (grid, block) == training.stage_dims(stage, 14, 64, 132, 2048, OP)
    # no autograd: the forward kernel alone
    with torch.no_grad():
        m(input_ids=ids, use_cache=False)
    assert kernelize.launch_counts(m) == {p: 1 for p in GPT2_LNS} and len(ln.calls) == 10
    # copies keep the training forward; unkernelize restores the layers
    c = copy.deepcopy(m)
    assert c.transformer.ln_f.__dict__["_kernelize_backward"].name == OP
    assert kernelize.unkernelize(m) == 5 and "_kz_bwd" not in m.transformer.ln_f.__dict__


def test_the_gradients_reach_x_w_and_b_through_the_kernel(kernels, gpu_faked):
    """A stand-in that swaps dw and db (or reads mean where rstd goes) changes the gradients:
    the bit-for-bit checks have teeth."""
    ref, m = _ln(dtype=torch.bfloat16), _ln(dtype=torch.bfloat16)
    _kz(m, kernels_dir=kernels, mode="training")
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)

    def grads(layer):
        layer.zero_grad(set_to_none=True)
        xs = x.clone().requires_grad_()
        layer(xs).float().square().sum().backward()
        return xs.grad, layer.weight.grad, layer.bias.grad

    want = grads(ref)
    assert all(_same_bits(a, c) for a, c in zip(grads(m), want))
    ln = gpu_faked.ln
    assert ln.stages() == ["dx", "dwdb"]
    real = ln.launch

    def swapped(stage, grid, block, tensors, scalars):
        if stage == "dwdb":
            dw, db, *rest = tensors
            tensors = (db, dw, *rest)
        else:
            dx, dy, x_, mean, rstd, w = tensors
            tensors = (dx, dy, x_, rstd, mean, w)
        real(stage, grid, block, tensors, scalars)
    ln.launch = swapped
    bad = grads(m)
    assert not any(torch.equal(a, c) for a, c in zip(bad, want))


def test_only_the_gradients_asked_for_are_computed(kernels, gpu_faked):
    m, ref = _ln(), _ln()
    _kz(m, kernels_dir=kernels, mode="training")
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(2))
    for layer in (m, ref):
        layer.bias.requires_grad_(False)
    m(x).square().sum().backward()          # x needs none, b none: dwdb alone, db dropped
    ref(x).square().sum().backward()
    assert gpu_faked.ln.stages() == ["dwdb"]
    assert m.bias.grad is None and torch.equal(m.weight.grad, ref.weight.grad)
    gpu_faked.ln.calls.clear()
    m.weight.requires_grad_(False)
    xs = x.clone().requires_grad_()
    m(xs).square().sum().backward()         # x alone: dx alone
    assert gpu_faked.ln.stages() == ["dx"] and m.weight.grad is not None
    xr = x.clone().requires_grad_()
    ref.weight.requires_grad_(False)
    ref(xr).square().sum().backward()
    assert torch.equal(xs.grad, xr.grad)
    # nothing needs a gradient: the forward kernel alone, no autograd node
    y = m(x)
    assert not y.requires_grad and gpu_faked.ln.stages() == ["dx"]
    assert kernelize.launch_counts(m) == {"<root>": 1}


@pytest.mark.parametrize("dtype", ["bf16", "f32"])   # (f16: bf16's path; slow on a CPU)
def test_the_shipped_tiny_gpt2_trains_as_eager_with_the_layer_norm_backward(kernels, gpu_faked, dtype,
                                                                            monkeypatch):
    """models/tiny-gpt2 (4 blocks: 9 LayerNorms), three AdamW steps kernelized in training mode
    against eager: every loss and every parameter bit for bit, in f32 too (eager's LayerNorm
    backward is one node whose dx the kernel gives whole: no F32_ACCUMULATION as for the norms)."""
    t = DTYPES[dtype]

    def load():
        return transformers.AutoModelForCausalLM.from_pretrained(
            REPO / "models" / "tiny-gpt2", attn_implementation="eager").to(t).train()
    eager, kz = load(), load()
    rep = _kz(kz, kernels_dir=kernels, mode="training")
    lns = [e for e in rep.entries if e.op == "layer_norm"]
    assert len(lns) == 9
    assert all(e.backward is not None and e.backward.name == OP for e in lns), str(rep)
    monkeypatch.setattr(torch.cuda, "is_available", _IS_AVAILABLE)  # swapped; AdamW asks CUDA
    data = [_ids(2, 16, seed=s, vocab=256) for s in range(3)]

    train_bit_for_bit(eager, kz, data)
    assert gpu_faked.ln.stages() == ["dx", "dwdb"] * 9 * 3


def test_a_pickled_training_model_loads_the_layer_norm_backward_again(kernels, gpu_faked):
    ref, m = _gpt2(), _gpt2()
    ids = _ids(2, 6, seed=3)
    want = _grads(ref, ids)
    _kz(m, kernels_dir=kernels, mode="training")
    loads = len(gpu_faked.loaded)
    twin = pickle.loads(pickle.dumps(m))
    assert len(gpu_faked.loaded) == loads + 5, "each LayerNorm's backward kernel is loaded again"
    assert twin.transformer.h[1].ln_2.__dict__["_kernelize_backward"].name == OP
    got = _grads(twin, ids)
    assert all(torch.equal(got[n], want[n]) for n in want)
    assert gpu_faked.ln.stages() == ["dx", "dwdb"] * 5


# ---- where no backward kernel qualifies ----------------------------------------------------

def test_no_layer_norm_backward_kernel_keeps_the_original_forward_and_says_why(forward_only, gpu_faked):
    ref, m = _gpt2(), _gpt2()
    ids = _ids()
    rep = _kz(m, kernels_dir=forward_only, mode="training")
    lns = [e for e in rep.entries if e.op == "layer_norm"]
    assert len(lns) == 5 and all(e.status == "replaced" and e.backward is None for e in lns)
    assert all(any("no kernel for layer_norm_backward" in r for r in e.backward_reasons) for e in lns), \
        [e.backward_reasons for e in lns]
    (line,) = [ln for ln in _training_lines(rep) if "[layer_norm, bf16, cols=64]" in ln]
    assert "(5 layers)" in line
    assert "keep their original forward under autograd: no layer_norm_backward kernel" in line
    assert str(rep).count("no layer_norm_backward kernel") == 1
    got, want = _grads(m, ids), _grads(ref, ids)
    assert all(torch.equal(got[n], want[n]) for n in want)
    assert kernelize.launch_counts(m) == {p: 0 for p in GPT2_LNS}   # the original forwards ran
    assert gpu_faked.ln.calls == [] and "_kz_bwd" not in m.transformer.ln_f.__dict__
    with torch.no_grad():   # the forward kernel still runs where no gradient is needed
        m(input_ids=ids, use_cache=False)
    assert kernelize.launch_counts(m) == {p: 1 for p in GPT2_LNS}


def test_a_layer_norm_backward_kernel_outside_its_dtypes_is_not_taken(tmp_path, gpu_faked):
    root = _kernels(tmp_path / "k", "layer_norm")
    _folder(root, OP, dtypes=("f32",))
    rep = _kz(_gpt2(), kernels_dir=root, mode="training")
    (line,) = [ln for ln in _training_lines(rep) if "[layer_norm, bf16" in ln]
    assert "no layer_norm_backward kernel" in line and "has no bf16 entry" in line, line
    assert gpu_faked.loaded == []


def test_a_layer_norm_backward_kernel_that_fails_to_load_is_reported(kernels, gpu_faked, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("no NVRTC here")
    monkeypatch.setattr(training, "compiled_backward", broken)
    m = _gpt2()
    rep = _kz(m, kernels_dir=kernels, mode="training")
    (line,) = [ln for ln in _training_lines(rep) if "[layer_norm" in ln]
    assert "could not be loaded (RuntimeError: no NVRTC here)" in line
    assert all(e.backward is None for e in rep.entries if e.op == "layer_norm")
    assert "_kz_bwd" not in m.transformer.ln_f.__dict__


def test_a_dry_run_says_which_layer_norm_backward_it_would_take(kernels):
    rep = kernelize.kernelize(_gpt2(), kernels_dir=kernels, arch="sm_90", verbose=False,
                              mode="training")
    assert not rep.swapped
    (line,) = [ln for ln in _training_lines(rep) if "[layer_norm" in ln]
    assert "would run under autograd" in line \
        and f"layer_norm_backward {bundled_version('layer_norm_backward')}" in line


@pytest.mark.parametrize("kw", [{"bias": False}, {"elementwise_affine": False}])
def test_a_layer_norm_without_weight_or_bias_is_not_swapped_and_runs_eager_autograd(kernels, gpu_faked, kw):
    """The ABI takes w (dx) and writes db (dwdb): such a layer is not swapped (discovery says
    why), so its original forward runs under eager autograd."""
    ref, m = _ln(**kw), _ln(**kw)
    rep = _kz(m, kernels_dir=kernels, mode="training")
    (e,) = rep.entries
    assert e.status == "kept" and any("no affine weight and bias" in r for r in e.reasons), str(rep)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    xs, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    m(xs).square().sum().backward()
    ref(xr).square().sum().backward()
    assert torch.equal(xs.grad, xr.grad) and gpu_faked.ln.calls == [] and gpu_faked.loaded == []


def test_more_rows_than_the_op_takes_through_a_layer_run_eagers_backward(kernels, gpu_faked):
    ref, m = _ln(4), _ln(4)
    _kz(m, kernels_dir=kernels, mode="training")
    x = torch.randn(training.LN_MAX_ROWS + 3, 4, generator=torch.Generator().manual_seed(2))
    xs, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    m(xs).square().sum().backward()
    ref(xr).square().sum().backward()
    assert gpu_faked.ln.calls == []
    assert torch.equal(xs.grad, xr.grad) and torch.equal(m.weight.grad, ref.weight.grad)
    assert torch.equal(m.bias.grad, ref.bias.grad)
    assert any(f"{training.LN_MAX_ROWS + 3} rows" in w for w in training._SAID)


# ---- eager autograd where the kernel cannot give the gradients -------------------------------

def test_double_backward_through_a_layer_norm_is_computed_by_eager_autograd_and_said_once(
        kernels, gpu_faked, caplog):
    ref, ln = _ln(), _ln()
    _kz(ln, kernels_dir=kernels, mode="training")
    assert "_kz_bwd" in ln.__dict__
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(4))

    assert_double_backward_is_eagers(ln, ref, x, lambda m: (m.weight, m.bias), gpu_faked.ln,
                                     "layer_norm layer", caplog)
    xs = x.clone().requires_grad_()
    ln(xs).sum().backward()   # a first-order backward launches the kernel
    assert gpu_faked.ln.stages() == ["dx", "dwdb"]


def test_an_incoming_gradient_of_another_dtype_is_computed_by_eager_autograd():
    """The engine casts a node's incoming gradient to its output's dtype, so this is the
    Function's own guard, called as the engine would call it."""
    bk = RecordingLnBackward()
    x, w, b, _ = _inputs((3, 8), torch.bfloat16, seed=9)
    _, mean, rstd = training.layer_norm_forward(x, w, b, 1e-5)
    dy = torch.randn(3, 8)   # f32
    ctx = types.SimpleNamespace(saved_tensors=(x, w, b, mean, rstd), bk=bk, eps=1e-5,
                                label="layer_norm_backward 1.0.0 (test)",
                                needs_input_grad=(True, True, True, False, False, False))
    with torch.no_grad():
        dx, dw, db, *rest = training.LayerNormFunction.backward(ctx, dy)
    assert bk.calls == [] and rest == [None] * 3
    want = _autograd(x, w, b, dy.to(torch.bfloat16))
    assert all(_same_bits(a, c) for a, c in zip((dx, dw, db), want))
    assert ("the incoming gradient is torch.float32 on cpu, the layer's input torch.bfloat16 on cpu: "
            "eager autograd computes the gradients, not layer_norm_backward 1.0.0 (test)") in training._SAID
    # the same dtype: the kernel, each gradient asked for
    ctx.needs_input_grad = (False, False, True, False, False, False)
    with torch.no_grad():
        dx, dw, db, *_ = training.LayerNormFunction.backward(ctx, dy.to(torch.bfloat16))
    assert bk.stages() == ["dwdb"] and dx is None and dw is None and _same_bits(db, want[2])


# ---- torch.compile ---------------------------------------------------------------------------

_LN_OPS_REGISTERED = False


@pytest.fixture
def cpu_ln_ops():
    """CPU implementations of the LayerNorm training custom ops (this process only; the package
    registers CUDA ones): eager's forward (its statistics as f32, as on CUDA), and the backward
    through the recording kernel."""
    global _LN_OPS_REGISTERED
    if not _LN_OPS_REGISTERED:
        def fwd(x, w, b, eps, bkey):
            y, mean, rstd = training.layer_norm_forward(x, w, b, eps)
            return y, mean.float(), rstd.float()
        torch.library.register_kernel("kernelize::layer_norm_train", "cpu", fwd)
        torch.library.register_kernel(
            "kernelize::launch_layer_norm_backward", "cpu",
            lambda dy, x, w, b, mean, rstd, key: training.run_layer_norm_backward(
                ops.kernel(key), dy, x, w, b, mean, rstd))
        _LN_OPS_REGISTERED = True


def test_the_layer_norm_training_ops_are_registered_with_fakes_and_autograd():
    from torch._subclasses.fake_tensor import FakeTensorMode
    for name in ("layer_norm_train", "launch_layer_norm_backward"):
        assert hasattr(torch.ops.kernelize, name)
    with FakeTensorMode():
        x, w = torch.empty(2, 3, 8, dtype=torch.bfloat16), torch.empty(8, dtype=torch.bfloat16)
        y, mean, rstd = torch.ops.kernelize.layer_norm_train(x, w, w, 1e-5, 2)
        dx, dw, db = torch.ops.kernelize.launch_layer_norm_backward(x, x, w, w, mean, rstd, 2)
    assert (y.shape, y.dtype, mean.shape, mean.dtype, rstd.shape) == \
        ((2, 3, 8), torch.bfloat16, (2, 3, 1), torch.float32, (2, 3, 1))
    assert (dx.shape, dw.shape, db.shape, db.dtype) == ((2, 3, 8), (8,), (8,), torch.bfloat16)


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_a_training_mode_layer_norm_compiles_without_graph_breaks(kernels, gpu_faked, cpu_ln_ops,
                                                                  monkeypatch, dtype):
    t = DTYPES[dtype]
    ref, ln = _ln(dtype=t), _ln(dtype=t)
    _kz(ln, kernels_dir=kernels, mode="training")
    monkeypatch.setattr(torch.cuda, "is_available", _IS_AVAILABLE)  # swapped; dynamo asks CUDA
    graphs = []
    torch._dynamo.reset()
    f = torch.compile(ln, backend=recording_aot_backend(graphs), fullgraph=True)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(5)).to(t)
    xs, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    ys, yr = f(xs), ref(xr)
    assert _same_bits(ys, yr)
    ys.float().square().sum().backward()
    yr.float().square().sum().backward()
    assert len(graphs) == 1
    assert "kernelize.layer_norm_train" in str(graphs[0].graph)
    # the stand-in computes eager's backward op: eager's gradients bit for bit
    assert _same_bits(xs.grad, xr.grad)
    assert _same_bits(ln.weight.grad, ref.weight.grad) and _same_bits(ln.bias.grad, ref.bias.grad)
    assert gpu_faked.ln.stages() == ["dx", "dwdb"]   # the backward op launched the entries
    torch._dynamo.reset()


# ---- the source's answer -------------------------------------------------------------------

def test_the_layer_norm_backward_does_not_depend_on_the_gpus_figures(kernels, gpu_faked, monkeypatch):
    """layer_norm_backward's verdict holds on any GPU (at most 65536 rows: eager's column sum
    does not depend on the SM count there): its query carries no GPU figures and a verification
    on a GPU of other figures is taken."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: _Props())
    hub = _Hub(kernels, {"name": "NVIDIA H200", "sm_count": 132, "threads_per_sm": 2048})
    rep = _kz(_gpt2(), hub=hub, mode="training")
    assert all(e.backward is not None for e in rep.entries if e.op == "layer_norm"), str(rep)
    sent = dict(q for q in hub.queries if q[0] in training.BLOCKS_OF)
    assert sent == {OP: None}


def test_a_training_lock_pins_the_layer_norm_backward(kernels, tmp_path):
    path = tmp_path / "k.lock.json"
    data = kernelize.lock(_gpt2(), hub=_Hub(kernels), path=path, arch="sm_90", mode="training")
    pinned = {r["op"]: r["digest"] is not None for r in data["resolutions"]}
    assert pinned.get("layer_norm") is True and pinned.get(OP) is True, pinned
    rep = kernelize.kernelize(_gpt2(), lock=path, arch="sm_90", verbose=False, mode="training")
    assert all(e.backward is not None and e.backward.name == OP
               for e in rep.entries if e.op == "layer_norm"), str(rep)
