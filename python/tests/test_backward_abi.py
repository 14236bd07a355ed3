"""The backward op's ABI on the Python side (docs/spec.md section 2c, docs/backward.md).

python/tests/fixtures/abi.json is written from kernel-registry's `Op::stages` and
`backward::col_config` by a Rust test; here the emulator's column-sum configuration
(kernelize.backward.col_config) must give the same CTA count, and so the same workspace
(`rows + ctas * cols` floats), as the hub computes.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("numpy")

from kernelize import backward as B  # noqa: E402

ABI = json.loads((Path(__file__).parent / "fixtures" / "abi.json").read_text(encoding="utf-8"))


def test_the_workspace_ctas_are_the_registrys():
    cases = ABI["backward_ctas"]["cases"]
    assert len(cases) >= 100
    for key, ctas in cases.items():
        rows, cols, sms, tps = (int(v) for v in key.split(","))
        assert B.col_config(rows, cols, sms, tps)["ctas"] == ctas, key


def test_the_clients_backward_launches_are_the_registrys():
    # kernelize.training.stage_dims, the client's twin of kernel_registry::backward::stage_dims,
    # at every shape and device of the fixture's table, for every backward op
    from kernelize import training
    cases = ABI["backward_dims"]["cases"]
    assert len(cases) >= 200
    assert {k.split(",")[0] for k in cases} == set(training.BLOCKS_OF) == set(ABI["backward_ops"])
    for key, (grid, block) in cases.items():
        op, stage, rows, cols, sms, tps = key.split(",")
        got = training.stage_dims(stage, int(rows), int(cols), int(sms), int(tps), op)
        assert got == ((grid, 1, 1), tuple(block)), key


def test_the_backward_ops_are_the_registrys():
    from kernelize import training
    ops = ABI["backward_ops"]
    assert set(ops) == {"rms_norm_backward", "silu_mul_backward", "layer_norm_backward",
                        "gelu_tanh_mul_backward", "silu_backward", "gelu_backward", "gelu_tanh_backward",
                        "fused_add_rms_norm_backward"}
    # fused_add_rms_norm's: rms_norm_backward's entries, dx reading the residual's gradient too
    fa = ops["fused_add_rms_norm_backward"]
    assert (fa["forward"], fa["semantics"]) == ("fused_add_rms_norm", ["default"])
    assert fa["stages"][0]["names"] == ["dx", "ws", "dy", "dres", "x", "w", "rows", "cols", "eps"]
    assert fa["stages"][1:] == ops["rms_norm_backward"]["stages"][1:]
    op = ops["rms_norm_backward"]
    # HF LlamaRMSNorm's, GemmaRMSNorm's and F.rms_norm's gradients: one ABI (llama the default)
    assert (op["forward"], op["semantics"]) == ("rms_norm", ["llama", "gemma", "torch"])
    assert [s["name"] for s in op["stages"]] == ["dx", "dwp", "dw"]
    assert [s["block"] for s in op["stages"]] == [512, 128, 128]
    op = ops["silu_mul_backward"]
    assert (op["forward"], op["semantics"]) == ("silu_mul", ["default"])
    assert [(s["name"], s["block"]) for s in op["stages"]] == [("grad", 256)]
    assert op["stages"][0]["names"] == ["d_gate", "d_up", "dy", "gate", "up", "rows", "cols"]
    # gelu_tanh_mul's: silu_mul_backward's ABI (the gated backward ops)
    op = ops["gelu_tanh_mul_backward"]
    assert (op["forward"], op["semantics"]) == ("gelu_tanh_mul", ["default"])
    assert op["stages"] == ops["silu_mul_backward"]["stages"]
    assert op["gradients"] == ops["silu_mul_backward"]["gradients"]
    # the activations' (SiluBackward0, GeluBackward0 'none' / 'tanh'): one elementwise entry over n
    for act in ("silu", "gelu", "gelu_tanh"):
        op = ops[f"{act}_backward"]
        assert (op["forward"], op["semantics"], op["takes_eps"]) == (act, ["default"], False)
        assert [(s["name"], s["block"]) for s in op["stages"]] == [("grad", 256)]
        assert op["stages"][0]["names"] == ["dx", "dy", "x", "n"]
        assert [(g["name"], g["one_row"], g["stage"]) for g in op["gradients"]] == [("dx", False, "grad")]
        assert not op["verdict_depends_on_device"] and op["max_rows"] is None
        assert not ABI["ops"][act]["rowwise"], f"{act}: elementwise, as its backward"
    op = ops["layer_norm_backward"]
    assert (op["forward"], op["semantics"], op["takes_eps"]) == ("layer_norm", ["default"], False)
    # dx a 128-thread block a row; dwdb's 2-D block the launch rule's (no block in the ABI)
    assert [(s["name"], s["block"]) for s in op["stages"]] == [("dx", 128), ("dwdb", None)]
    assert op["stages"][0]["names"] == ["dx", "dy", "x", "mean", "rstd", "w", "rows", "cols"]
    assert op["stages"][1]["names"] == ["dw", "db", "dy", "x", "mean", "rstd", "rows", "cols"]
    assert [(g["name"], g["one_row"], g["stage"]) for g in op["gradients"]] == \
        [("dx", False, "dx"), ("dw", True, "dwdb"), ("db", True, "dwdb")]
    # the client launches each with the ABI's blocks
    assert {o: {s["name"]: s["block"] for s in a["stages"]} for o, a in ops.items()} == training.BLOCKS_OF
    # the backward ops are not forward ops: no client launch, generator or op list knows them
    assert not set(ops) & set(ABI["ops"])


def test_the_manifest_rules_know_the_backward_entries():
    from kernelize import manifest
    ops = ABI["backward_ops"]
    # the client's map from a forward (op, semantics) to its backward op is Op::forward's: training
    # mode has every backward op, of every semantics (GemmaRMSNorm's, rms_norm_backward semantics
    # gemma, beside LlamaRMSNorm's)
    registry = {(a["forward"], sem): op for op, a in ops.items() for sem in a["semantics"]}
    assert ("rms_norm", "gemma") in registry
    assert manifest.BACKWARD_OF == registry
    assert {op: tuple(s["name"] for s in a["stages"]) for op, a in ops.items()} == manifest.BACKWARD_OPS
    assert {op: list(manifest.SEMANTICS.get(op, ("default",))) for op in ops} == \
        {op: a["semantics"] for op, a in ops.items()}
    # the most rows a call takes (Op::max_rows): the client's bound is the registry's
    from kernelize import training
    assert {op: a["max_rows"] for op, a in ops.items() if a["max_rows"] is not None} == \
        {"layer_norm_backward": training.LN_MAX_ROWS}
    # the ops whose verdict holds only for the GPU figures it was measured with
    assert set(manifest.VERDICT_ON_DEVICE) == {op for op, a in ops.items() if a["verdict_depends_on_device"]}


CASES = json.loads((Path(__file__).parent / "fixtures" / "backward_digests.json").read_text(encoding="utf-8"))["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_a_backward_manifest_parses_and_digests_as_the_registrys(case):
    from kernelize.digest import digest_of
    from kernelize.manifest import canonical_manifest, parse_manifest_toml
    m = parse_manifest_toml(case["manifest_toml"])
    assert m == canonical_manifest(case["manifest"])
    assert digest_of(m, case["source"]) == digest_of(case["manifest"], case["source"]) == case["digest"]


@pytest.mark.parametrize("edit,field", [
    (("[entry.f32]\ndx = \"bwd_dx_f32\"\ndwp = \"bwd_dwp_f32\"\ndw = \"bwd_dw_f32\"\n", "[entry]\nf32 = \"bwd_dx_f32\"\n"), "entry.f32"),
    (("dw = \"bwd_dw_bf16\"\n", ""), "entry.bf16.dw"),
    (("dw = \"bwd_dw_bf16\"\n", "dw = \"bwd_dw_bf16\"\ndb = \"x\"\n"), "entry.bf16.db"),
    (("dw = \"bwd_dw_bf16\"", "dw = \"bwd_dx_bf16\""), "entry.bf16.dx"),
    (("source = \"kernel.cu\"", "source = \"kernel.cu\"\n[launch]\nblock = 512\ngrid = \"persistent\"\nblocks_per_sm = 8\n"), "launch"),
    (("semantics = \"llama\"", "semantics = \"default\""), "semantics"),
])
def test_bad_backward_manifests_name_the_field_as_the_registry(edit, field):
    from kernelize.manifest import ManifestError, parse_manifest_toml
    text = CASES[0]["manifest_toml"]
    assert edit[0] in text
    with pytest.raises(ManifestError, match=f"field `{field}`"):
        parse_manifest_toml(text.replace(edit[0], edit[1], 1))
