"""Python candidates (docs/spec.md section 2b): the client's parser and digest against the Rust registry's
(python/tests/fixtures/python_digests.json is written by a kernel-registry test)."""

import json
from pathlib import Path

import pytest

from kernelize.digest import digest_of
from kernelize.manifest import ManifestError, canonical_manifest, check_requirement, parse_manifest_toml

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "python_digests.json")
                     .read_text(encoding="utf-8"))
CASES = FIXTURE["cases"]
GOOD = next(c for c in CASES if c["name"] == "inline")["manifest_toml"]


def test_fixture_covers_the_third_party_candidates():
    names = {c["name"] for c in CASES}
    assert {"liger_rms_norm_llama", "liger_rms_norm_gemma", "liger_layer_norm", "liger_swiglu",
            "liger_geglu", "compile_llama_rms_norm", "compile_gemma_rms_norm",
            "compile_layer_norm", "compile_silu_mul", "f_rms_norm_as_llama"} <= names


def assert_refused(base: str, old: str, new: str, field: str, words: str) -> None:
    """`base` with `old` replaced by `new` is refused, the message naming `field` and saying
    `words`."""
    assert old in base
    with pytest.raises(ManifestError) as e:
        parse_manifest_toml(base.replace(old, new, 1))
    assert field in str(e.value) and words in str(e.value), str(e.value)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_python_candidates_hash_as_in_rust(case):
    m = parse_manifest_toml(case["manifest_toml"])
    assert m == canonical_manifest(case["manifest"])
    assert m["runtime"] == "python" and m["requires"] and m["launch"] == []
    assert digest_of(m, case["source"]) == case["digest"]
    assert digest_of(case["manifest"], case["source"]) == case["digest"]


def test_cuda_manifests_keep_no_runtime_key():
    cuda = json.loads((Path(__file__).parent / "fixtures" / "digests.json").read_text())["cases"]
    for c in cuda:
        m = parse_manifest_toml(c["manifest_toml"])
        assert "runtime" not in m and "requires" not in m
        assert digest_of(m, c["source"]) == c["digest"]
        explicit = parse_manifest_toml(c["manifest_toml"].replace(
            'source = "kernel.cu"', 'source = "kernel.cu"\nruntime = "cuda"', 1))
        assert digest_of(explicit, c["source"]) == c["digest"]


REQ = 'requires = ["liger-kernel==0.8.5", "torch>=2.5,<3"]'


@pytest.mark.parametrize("old,new,field,words", [
    ('runtime = "python"', 'runtime = "triton"', "`runtime`", "one of cuda, python"),
    ('source = "kernel.py"', 'source = "kernel.cu"', "`source`", "`.py` file"),
    (REQ + "\n", "", "`requires`", "list the Python packages"),
    (REQ, "requires = []", "`requires`", "1 to 16"),
    ('"liger-kernel==0.8.5"', '"liger-kernel"', "`requires[0]`", "gives no version"),
    ('"liger-kernel==0.8.5"', '"liger-kernel @ https://x/y.whl"', "`requires[0]`",
     "not a version specifier"),
    ('"torch>=2.5,<3"', '"torch>=two"', "`requires[1]`", "not a version"),
    ('"torch>=2.5,<3"', '"Liger_Kernel>=0.8"', "`requires[1]`", "listed twice"),
    ('bf16 = "rms_norm"', 'bf16 = "rms-norm"', "`entry.bf16`", "not a Python function name"),
    ('bf16 = "rms_norm"', 'bf16 = "__import__"', "`entry.bf16`", "not a Python function name"),
    ('runtime = "python"', 'runtime = "python"\nnvrtc_options = ["--use_fast_math"]',
     "`nvrtc_options`", "not compiled by NVRTC"),
    ("cols_max = 65536", "cols_max = 65536\ncols_min = 0", "`constraints.cols_min`", "at least 1"),
    ('runtime = "python"', 'runtime = "python"\nextra = 1', "unknown field `extra`", ""),
])
def test_bad_python_candidates_name_the_field(old, new, field, words):
    assert_refused(GOOD, old, new, field, words)


def test_launch_rules_are_refused_for_python_and_required_for_cuda():
    with pytest.raises(ManifestError, match="`launch`.*no launch rules"):
        parse_manifest_toml(GOOD + '\n[launch]\nblock = 256\ngrid = "per_row"\n')
    cuda = GOOD.replace('runtime = "python"\n', "").replace('source = "kernel.py"', 'source = "k.cu"')
    with pytest.raises(ManifestError, match="`requires`.*only a Python candidate"):
        parse_manifest_toml(cuda)
    with pytest.raises(ManifestError, match="`launch`.*needs launch rules"):
        parse_manifest_toml(cuda.replace(REQ + "\n", ""))


def test_requirement_names_normalise_as_pip_does():
    assert check_requirement("Liger_Kernel==0.8.5") == "liger-kernel"
    assert check_requirement("a.b__c>=1.0,!=1.2.*") == "a-b-c"
    assert check_requirement("torch >= 2.5") == "torch"
    with pytest.raises(ValueError):
        check_requirement("torch>=2.5 ; python_version>'3'")


def test_ptxas_threads_is_the_one_ptxas_option_and_only_whole():
    """As kernel_registry's manifest test of the same name: `-Xptxas=--split-compile=N` (N of one
    to three digits) is allowed whole, nothing else for ptxas."""
    from kernelize.manifest import is_ptxas_threads_option
    toml = (Path(__file__).resolve().parents[2] / "kernels" / "silu" / "kernel.toml").read_text()
    assert 'source = "kernel.cu"' in toml
    for ok in ("-Xptxas=--split-compile=0", "-Xptxas=--split-compile=16",
               "--ptxas-options=--split-compile=128"):
        assert is_ptxas_threads_option(ok)
        m = parse_manifest_toml(toml.replace('source = "kernel.cu"',
                                             f'source = "kernel.cu"\nnvrtc_options = ["{ok}"]', 1))
        assert m["nvrtc_options"] == [ok]
    for bad in ("-Xptxas=--split-compile=", "-Xptxas=--split-compile=0,-O0",
                "-Xptxas=--split-compile=1234", "-Xptxas=-O0", "-Xptxas=--split-compile=٣",
                "--ptxas-options=--gpu-name=sm_80"):
        assert not is_ptxas_threads_option(bad)
        with pytest.raises(ManifestError, match="not allowed"):
            parse_manifest_toml(toml.replace('source = "kernel.cu"',
                                             f'source = "kernel.cu"\nnvrtc_options = ["{bad}"]', 1))


# ---- Python candidates of backward ops (docs/spec.md section 2b; docs/backward.md, "What the
# verifier lacks", item 1) --------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
# kernel-registry's manifest::tests::PY_BWD and PY_BWD_SRC, and the digest Rust gives them
# (asserted there too: a_python_candidate_of_a_backward_op_hashes_as_in_python).
PY_BWD = """
name = "liger_rms_norm_llama_backward"
version = "1.0.0"
op = "rms_norm_backward"
semantics = "llama"
description = "Liger-Kernel's RMSNorm backward, llama casting mode"
authors = ["kernelize"]
license = "Apache-2.0"
runtime = "python"
source = "kernel.py"
requires = ["liger-kernel==0.8.5", "torch>=2.5"]

[entry]
bf16 = "rms_norm_backward"
f32 = "rms_norm_backward"
"""
PY_BWD_SRC = "import torch\n\n\ndef rms_norm_backward(dy, x, w, eps):\n    return dy.clone(), w.clone()\n"
PY_BWD_DIGEST = "sha256:1ab5f747654c767a854d211f5427889d80f9526aa54a8f26802565b3ae11fc1e"


def test_a_python_candidate_of_a_backward_op_is_accepted_as_in_rust():
    m = parse_manifest_toml(PY_BWD)
    assert (m["op"], m["runtime"], m["launch"]) == ("rms_norm_backward", "python", [])
    assert m["entries"] == {"bf16": "rms_norm_backward", "f32": "rms_norm_backward"}
    assert "stages" not in m  # a forward Python candidate's canonical form
    assert m == canonical_manifest(m)
    assert digest_of(m, PY_BWD_SRC) == PY_BWD_DIGEST


@pytest.mark.parametrize("op", ["rms_norm_backward", "fused_add_rms_norm_backward",
                                "layer_norm_backward", "silu_mul_backward",
                                "gelu_tanh_mul_backward", "silu_backward", "gelu_backward",
                                "gelu_tanh_backward"])
def test_every_backward_op_takes_a_python_candidate(op):
    sem = "llama" if op == "rms_norm_backward" else "default"
    m = parse_manifest_toml(PY_BWD.replace('op = "rms_norm_backward"', f'op = "{op}"')
                            .replace('semantics = "llama"', f'semantics = "{sem}"'))
    assert (m["op"], m["semantics"], m["runtime"]) == (op, sem, "python")


@pytest.mark.parametrize("old,new,field,words", [
    ('[entry]\nbf16 = "rms_norm_backward"\nf32 = "rms_norm_backward"\n',
     '[entry.bf16]\ndx = "dx"\ndwp = "dwp"\ndw = "dw"\n', "`entry.bf16`", "name one Python function"),
    ('f32 = "rms_norm_backward"\n', 'f32 = "rms_norm_backward"\n\n[launch]\nblock = 256\n',
     "`launch`", "no launch rules"),
    ('requires = ["liger-kernel==0.8.5", "torch>=2.5"]\n', "", "`requires`", "list the Python packages"),
    ('bf16 = "rms_norm_backward"', 'bf16 = "__rms_norm_backward"', "`entry.bf16`",
     "not a Python function name"),
])
def test_bad_python_backward_candidates_name_the_field(old, new, field, words):
    """As kernel-registry's a_python_candidate_of_a_backward_op_names_one_function_per_dtype."""
    assert_refused(PY_BWD, old, new, field, words)


# kernel-registry's manifest::tests::py_bwd_setup() and PY_BWD_SETUP_SRC, and their digest
# (a_python_backward_candidate_may_name_a_setup_function_per_dtype asserts it there).
PY_BWD_SETUP = PY_BWD + '\n[setup]\nbf16 = "forward"\nf32 = "forward"\n'
PY_BWD_SETUP_SRC = ("import torch\n\n\ndef forward(x, w, eps):\n    return None\n\n\n"
                    "def rms_norm_backward(dy, x, w, eps, state):\n    return dy.clone(), w.clone()\n")
PY_BWD_SETUP_DIGEST = "sha256:6d56547d90ec5bcdac21a2a527e1892e6e600f3834f9ed49a6e06ab0f961e164"


def test_a_python_backward_candidates_setup_is_read_and_hashed_as_in_rust():
    m = parse_manifest_toml(PY_BWD_SETUP)
    assert m["setup"] == {"bf16": "forward", "f32": "forward"}
    assert list(canonical_manifest(m))[-1] == "setup" and m == canonical_manifest(m)
    assert digest_of(m, PY_BWD_SETUP_SRC) == PY_BWD_SETUP_DIGEST
    assert "setup" not in parse_manifest_toml(PY_BWD)  # absent: the digests before it hold


@pytest.mark.parametrize("old,new,field,words", [
    ('f32 = "forward"\n', 'f32 = "forward"\nf16 = "forward"\n', "`setup.f16`", "names no function"),
    ('f32 = "forward"\n', "", "`setup`", "no setup function for f32"),
    ('bf16 = "forward"', 'bf16 = "__forward"', "`setup.bf16`", "not a Python function name"),
    ('bf16 = "forward"', 'fp8 = "forward"', "`setup.fp8`", "not valid"),
    ('op = "rms_norm_backward"', 'op = "rms_norm"', "`setup`", "forward op"),
])
def test_bad_setup_tables_name_the_field(old, new, field, words):
    """As kernel-registry's a_python_backward_candidate_may_name_a_setup_function_per_dtype."""
    assert_refused(PY_BWD_SETUP, old, new, field, words)


def test_a_cuda_kernel_has_no_setup():
    cuda = (REPO / "kernels" / "rms_norm_llama_backward" / "kernel.toml").read_text(encoding="utf-8")
    with pytest.raises(ManifestError) as e:
        parse_manifest_toml(cuda + '\n[setup]\nbf16 = "forward"\n')
    assert "`setup`" in str(e.value), str(e.value)


def test_the_field_backward_candidates_parse():
    """The backward candidates of kernels/third-party/ (docs/backward.md, "The field's backward
    as Python candidates"): each parses, and each entry and setup is defined in its source."""
    from kernelize.manifest import defines_function
    folders = sorted(p for p in (REPO / "kernels" / "third-party").iterdir()
                     if (p / "kernel.toml").exists() and p.name.endswith("_backward"))
    assert len(folders) >= 7
    for f in folders:
        m = parse_manifest_toml((f / "kernel.toml").read_text(encoding="utf-8"))
        assert m["runtime"] == "python" and m["op"].endswith("_backward"), f.name
        src = (f / m["source"]).read_text(encoding="utf-8")
        assert all(defines_function(src, fn) for fn in m["entries"].values()), f.name
        assert all(defines_function(src, fn) for fn in m.get("setup", {}).values()), f.name
