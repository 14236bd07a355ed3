"""The verifier's model-level harness (`python3 -m kernelize_verifier.model_level`) on the CPU:
tokenisation, loading, semantics adaptation, matching, the summary contract (through --dry-run,
which does all but the launch) and exit statuses. The launch itself is covered by test_gpu.py on
a GPU."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import REPO, tiny_gemma
from kernelize import DirSource, core
from kernelize.discover import discover
from kernelize_verifier import model_level

transformers = pytest.importorskip("transformers")
KERNELS = REPO / "kernels"
#: The verifier's confinement check, which it writes beside the harness and names with --confinement.
CONFINEMENT = REPO / "verifier" / "src" / "confinement.py"
EVAL = REPO / "models" / "eval.txt"


# ---- fixtures: tiny random models saved as checkpoint folders -------------------------------

def _save(model, folder, tokenizer="bytes"):
    if tokenizer:
        model.config.kernelize_tokenizer = tokenizer
    model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=160,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=96,
                                   rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None)
    llama = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():  # trained-looking norm weights, inside [0.5, 2]
        for m in llama.modules():
            if "RMSNorm" in type(m).__name__:
                m.weight.copy_((1 + 0.2 * torch.randn_like(m.weight)).clamp(0.5, 2))
    out = {"llama": _save(llama, root / "tiny-llama")}
    for act in ("gelu", "gelu_new"):
        cfg = transformers.GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4,
                                      n_positions=96, activation_function=act,
                                      bos_token_id=None, eos_token_id=None)
        out[f"gpt2-{act}"] = _save(transformers.GPT2LMHeadModel(cfg), root / f"tiny-gpt2-{act}")
    return out


def _ids(n=40):
    return torch.tensor(model_level.byte_ids(EVAL.read_text(encoding="utf-8"))[:n])


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids[None], use_cache=False).logits[0].float()


# ---- tokens ---------------------------------------------------------------------------------

def test_byte_tokenisation(tmp_path, models):
    assert model_level.byte_ids("aé\n") == [97, 0xC3, 0xA9, 10]
    ids, how = model_level.tokenize(models["llama"],
                                    {"kernelize_tokenizer": "bytes", "vocab_size": 256},
                                    "kernelize")
    assert ids == list(b"kernelize") and how.startswith("bytes")
    with pytest.raises(model_level.HarnessError, match="vocab_size is 128"):
        model_level.tokenize(tmp_path, {"kernelize_tokenizer": "bytes", "vocab_size": 128}, "x")
    with pytest.raises(model_level.HarnessError, match="not known"):
        model_level.tokenize(tmp_path, {"kernelize_tokenizer": "words"}, "x")
    with pytest.raises(model_level.HarnessError, match="no usable tokenizer"):
        model_level.tokenize(tmp_path, {"vocab_size": 256}, "x")  # no key, no tokenizer files


def test_eval_text_is_in_the_corpus():
    corpus = (REPO / "models" / "corpus.txt").read_bytes()
    text = EVAL.read_bytes()
    assert 1000 < len(text) < 2000 and text in corpus


# ---- adaptation -----------------------------------------------------------------------------

def _norm_paths(model, semantics):
    return {s.path for s in discover(model).sites if s.op == "rms_norm" and s.semantics == semantics}


@pytest.mark.parametrize("semantics", ["llama", "gemma", "torch"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_rmsnorm_adaptation_same_function(models, semantics, dtype):
    model = model_level.load_model(models["llama"], dtype, torch.device("cpu"))
    norms = _norm_paths(model, "llama")
    assert len(norms) == 5
    before = {p: model.get_submodule(p) for p in norms}
    ids = _ids()
    eager = _logits(model, ids)
    ad = model_level.adapt_model(model, "rms_norm", semantics)
    # discovery sees the intended semantics on every converted layer, and nothing else
    assert _norm_paths(model, semantics) == norms
    if semantics == "llama":
        assert ad.paths == [] and ad.describe().startswith("none")
    else:
        assert sorted(ad.paths) == sorted(norms) and "5 x LlamaRMSNorm -> " in ad.describe()
    # each layer computes the same function up to the formula's rounding points
    x = torch.randn(7, 64).to(model_level.torch_dtype(dtype)) * 3
    with torch.no_grad():
        for p, old in before.items():
            torch.testing.assert_close(model.get_submodule(p)(x), old(x))
    # and so does the model
    tol = {"f32": dict(rtol=1e-4, atol=1e-5), "bf16": dict(rtol=0.05, atol=0.02)}[dtype]
    torch.testing.assert_close(_logits(model, ids), eager, **tol)


@pytest.mark.parametrize("src,op,approx", [("gpt2-gelu", "gelu_tanh", "tanh"),
                                           ("gpt2-gelu_new", "gelu", "none"),
                                           ("gpt2-gelu", "gelu", None)])
def test_gelu_adaptation(models, src, op, approx):
    model = model_level.load_model(models[src], "f32", torch.device("cpu"))
    ids = _ids()
    eager = _logits(model, ids)
    ad = model_level.adapt_model(model, op, "default")
    acts = {s.path for s in discover(model).sites if s.op == op}
    assert acts == {"transformer.h.0.mlp.act", "transformer.h.1.mlp.act"}
    if approx is None:  # already eager F.gelu: left as is
        assert ad.paths == []
    else:
        assert sorted(ad.paths) == sorted(acts)
        assert f"nn.GELU(approximate='{approx}')" in ad.describe()
        # the tanh approximation is within ~1e-3 of exact GELU: the same model, closely
        torch.testing.assert_close(_logits(model, ids), eager, rtol=1e-2, atol=1e-2)


def test_silu_goes_into_act_fn_of_gated_mlp(models):
    model = model_level.load_model(models["llama"], "bf16", torch.device("cpu"))
    assert {s.op for s in discover(model).sites} == {"rms_norm", "silu_mul"}
    ad = model_level.adapt_model(model, "silu", "default")
    assert not ad.fuse_gated_mlp and "2 gated MLP(s) not fused" in ad.describe()
    sites = [s for s in discover(model, fuse_gated_mlp=False).sites if s.op == "silu"]
    assert {(s.path, s.cols) for s in sites} == {("model.layers.0.mlp.act_fn", 160),
                                                 ("model.layers.1.mlp.act_fn", 160)}
    rep = core.kernelize(model, kernels_dir=KERNELS / "silu", arch="sm_90", verbose=False,
                         fuse_gated_mlp=False)
    assert {e.path for e in rep.replaced} == {s.path for s in sites}
    assert all(e.status == "would replace" for e in rep.replaced)


# ---- single kernel folders ------------------------------------------------------------------

def test_dir_source_single_kernel_folder(tmp_path):
    one = DirSource(KERNELS / "rms_norm_llama")
    many = DirSource(KERNELS, names=["rms_norm_llama"])
    assert [d for _, _, d in one.kernels] == [d for _, _, d in many.kernels]
    broken = tmp_path / "broken"
    shutil.copytree(KERNELS / "silu", broken)
    (broken / "kernel.toml").write_text("name = 'x'\n")
    with pytest.raises(ValueError, match="missing field"):
        DirSource(broken)


# ---- the command line (in process: main(argv) is what `-m kernelize_verifier.model_level` runs)

def _run(tmp_path, kernel, model_dirs, *extra, dtype="bf16", dry=True):
    out = tmp_path / "out"
    argv = ["--kernel", str(kernel), "--dtype", dtype, "--text", str(EVAL), "--out-dir", str(out)]
    for m in model_dirs:
        argv += ["--model", str(m)]
    if dry:
        argv += ["--dry-run", "--device", "cpu", "--arch", "sm_90"]
    rc = model_level.main(argv + list(extra))
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else None
    return rc, summary, out


def test_a_cuda_backward_kernels_training_is_refused_with_the_reason(tmp_path, models, capsys):
    """A backward op's model level is training; the harness runs it for Python candidates
    (verifier/tests/python_candidates.rs trains the model with one), not yet for CUDA ones."""
    rc, s, _ = _run(tmp_path, KERNELS / "rms_norm_llama_backward", [models["llama"]])
    err = capsys.readouterr().err
    assert rc == 1 and s is None
    assert "the training steps of a CUDA backward kernel are not run by this harness yet" in err, err


def test_dry_run_summary_contract(tmp_path, models, capsys):
    rc, s, out = _run(tmp_path, KERNELS / "rms_norm_torch", [models["llama"], models["gpt2-gelu"]],
                      dtype="bf16,f32")
    cap = capsys.readouterr()
    assert rc == 0 and cap.out == ""  # stdout stays empty
    assert "tiny-llama bf16: 96 tokens, would replace 5 layer(s)" in cap.err
    assert s["harness_version"] == 1 and s["dry_run"] is True and s["device"] == "cpu"
    assert s["torch"] == torch.__version__ and s["transformers"] == transformers.__version__
    assert s["kernel"]["name"] == "rms_norm_torch" and s["kernel"]["digest"].startswith("sha256:")
    assert [(r["model_name"], r["dtype"]) for r in s["runs"]] == [("tiny-llama", "bf16"),
                                                                   ("tiny-llama", "f32")]
    r = s["runs"][0]
    assert r["tokens"] == 96  # the model's max positions cap --max-tokens 512
    assert r["layers_replaced"] == 5 and len(r["replaced"]) == 5 and r["file"] is None
    assert r["adaptation"].startswith("5 x LlamaRMSNorm -> nn.RMSNorm (same weights, eps 1e-06")
    assert 0 < r["eager_mean_top1_prob"] <= 1 and r["seconds"] > 0
    assert [(k["model_name"], k["dtype"]) for k in s["skipped"]] == [("tiny-gpt2-gelu", "bf16"),
                                                                      ("tiny-gpt2-gelu", "f32")]
    assert "no layer of tiny-gpt2-gelu computes rms_norm (torch)" in s["skipped"][0]["reason"]
    assert list(out.glob("*.safetensors")) == []


@pytest.mark.parametrize("kernel,tried", [("silu_mul", ["silu_mul"]),
                                          ("silu_and_mul", ["silu_mul", "silu_and_mul"])])
def test_gated_mlp_kernels_replace_the_mlps(tmp_path, models, kernel, tried):
    # a silu_and_mul kernel replaces the gated MLPs as the fallback of their silu_mul sites
    rc, s, _ = _run(tmp_path, KERNELS / kernel, [models["llama"]])
    assert rc == 0 and s["skipped"] == [], s["skipped"]
    r = s["runs"][0]
    assert r["replaced"] == ["model.layers.0.mlp", "model.layers.1.mlp"]
    assert r["adaptation"] == "none (the model as saved)"
    model = model_level.load_model(models["llama"], "bf16", torch.device("cpu"))
    rep = core.kernelize(model, kernels_dir=KERNELS / kernel, arch="sm_90", verbose=False)
    mlp = {e.path: e for e in rep.entries}["model.layers.0.mlp"]
    assert (mlp.op, mlp.tried, mlp.kernel.name) == (kernel, tried, kernel)


def test_max_tokens_and_layer_norm_on_gpt2(tmp_path, models):
    rc, s, _ = _run(tmp_path, KERNELS / "layer_norm", [models["gpt2-gelu"]], "--max-tokens", "17")
    assert rc == 0 and s["runs"][0]["tokens"] == 17 and s["runs"][0]["layers_replaced"] == 5


@pytest.mark.parametrize("kernel,expect", [("layer_norm", "no layer of tiny-llama computes layer_norm"),
                                           ("fused_add_rms_norm", "not applicable")])
def test_no_matching_layer_is_skipped_not_an_error(tmp_path, models, kernel, expect):
    rc, s, _ = _run(tmp_path, KERNELS / kernel, [models["llama"]])
    assert rc == 0 and s["runs"] == [] and len(s["skipped"]) == 1
    assert expect in s["skipped"][0]["reason"]


def test_constraints_or_dtype_excluding_every_layer_is_skipped(tmp_path, models):
    k = tmp_path / "narrow"
    shutil.copytree(KERNELS / "rms_norm_llama", k)
    toml = (k / "kernel.toml").read_text().replace('f32 = "rms_norm_llama_f32"\n', "")
    (k / "kernel.toml").write_text(toml + "\n[constraints]\ncols_min = 4096\n")
    rc, s, _ = _run(tmp_path, k, [models["llama"]], dtype="bf16,f32")
    assert rc == 0 and s["runs"] == []
    reasons = [x["reason"] for x in s["skipped"]]
    assert "kernelize replaced none" in reasons[0] and "cols 64 < cols_min 4096" in reasons[0]
    assert "has no f32 entry" in reasons[1]


def test_bad_arguments_exit_2(tmp_path, models, capsys):
    base = ["--kernel", str(KERNELS / "silu"), "--model", str(models["llama"]),
            "--text", str(EVAL), "--out-dir", str(tmp_path)]
    for argv in ([], base, base + ["--dtype", "bf8"], base + ["--dtype", "bf16", "--device", "cpu"],
                 base + ["--dtype", "bf16", "--max-tokens", "1"],
                 base + ["--dtype", "bf16", "--dry-run", "--device", "cpu"],
                 base + ["--dtype", "bf16", "--model", str(models["llama"])]):
        with pytest.raises(SystemExit) as e:
            model_level.main(argv)
        assert e.value.code == 2, argv
    assert capsys.readouterr().out == ""


def test_missing_model_folder_exits_1_with_a_clear_message(tmp_path, capsys):
    rc, s, _ = _run(tmp_path, KERNELS / "silu", [tmp_path / "nope"])
    err = capsys.readouterr().err
    assert rc == 1 and s is None
    assert "model folder" in err and "not found" in err and "models/train.py" in err
    (tmp_path / "empty").mkdir()
    rc, _, _ = _run(tmp_path, KERNELS / "silu", [tmp_path / "empty"])
    assert rc == 1 and "has no config.json" in capsys.readouterr().err


def test_missing_weights_and_bad_kernel_exit_1(tmp_path, models, capsys):
    bare = tmp_path / "tiny-llama"
    bare.mkdir()
    shutil.copy(models["llama"] / "config.json", bare / "config.json")
    rc, _, _ = _run(tmp_path, KERNELS / "silu", [bare])
    assert rc == 1 and "cannot load" in capsys.readouterr().err
    rc, _, _ = _run(tmp_path, KERNELS, [models["llama"]])  # the parent folder, not one kernel
    assert rc == 1 and "no kernel.toml" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_module_entry_point_without_cuda(tmp_path, models):
    """`python3 -m kernelize_verifier.model_level` as the verifier runs it: no CUDA here -> exit 1
    with a message that says so; stdout empty."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    p = subprocess.run([sys.executable, "-m", "kernelize_verifier.model_level",
                        "--kernel", str(KERNELS / "silu"),
                        "--model", str(models["llama"]), "--dtype", "bf16", "--text", str(EVAL),
                        "--out-dir", str(tmp_path / "o")], capture_output=True, text=True, env=env)
    assert p.returncode == 1 and p.stdout == ""
    assert "sees no CUDA device" in p.stderr and "--dry-run" in p.stderr


def test_safetensors_layout(tmp_path):
    from safetensors.torch import load_file
    ids = torch.tensor([1, 2, 3])
    e = torch.randn(3, 256).to(torch.bfloat16).float()
    model_level._save(tmp_path / "m.bf16.safetensors", ids, e, e + 1, {"model_name": "m"})
    t = load_file(str(tmp_path / "m.bf16.safetensors"))
    assert t["input_ids"].dtype == torch.int64 and t["input_ids"].shape == (3,)
    assert t["eager_logits"].dtype == torch.float32 and t["candidate_logits"].shape == (3, 256)
    assert torch.equal(t["eager_logits"], e)


def test_gelu_tanh_goes_into_act_fn_of_gemma_mlps_and_gelu_leaves_them_fused():
    model = tiny_gemma(layers=2)
    assert {s.op for s in discover(model).sites} == {"rms_norm", "gelu_tanh_mul"}
    ad = model_level.adapt_model(model, "gelu_tanh", "default")
    assert not ad.fuse_gated_mlp and "2 gated MLP(s) not fused: the gelu_tanh kernel" in ad.describe()
    sites = [s for s in discover(model, fuse_gated_mlp=False).sites if s.op == "gelu_tanh"]
    assert {(s.path, s.cols) for s in sites} == {("model.layers.0.mlp.act_fn", 96),
                                                 ("model.layers.1.mlp.act_fn", 96)}
    # the gated op's kernel measures the MLPs as they are; an erf-GELU kernel changes nothing
    # in the MLPs (no gated op is erf GELU)
    assert model_level.adapt_model(model, "gelu_tanh_mul", "default").fuse_gated_mlp
    assert model_level.adapt_model(model, "gelu", "default").fuse_gated_mlp


# ---- Python candidates (docs/spec.md section 2b): the function swapped in, on the CPU ------------------------

PY_TOML = """name = "{name}"
version = "1.0.0"
op = "rms_norm"
semantics = "llama"
description = "a fake Python candidate"
authors = ["tests"]
license = "MIT"
runtime = "python"
source = "kernel.py"
requires = [{requires}]

[entry]
bf16 = "rms_norm"
f32 = "rms_norm"
"""


def _py_candidate(root, name, body, requires='"torch>=2.0"'):
    d = root / name
    d.mkdir()
    (d / "kernel.toml").write_text(PY_TOML.format(name=name, requires=requires))
    (d / "kernel.py").write_text(body)
    return d


def _fake_package(root):
    """A package folder as `pip install --target` leaves it: the module and its dist-info.
    Its rms_norm is eager HF LlamaRMSNorm, so a candidate calling it is bit-exact."""
    pkgs = root / "pkgs"
    (pkgs / "kz_fake_norms").mkdir(parents=True)
    (pkgs / "kz_fake_norms" / "__init__.py").write_text(
        "import torch\n\nCALLS = []\n\n\ndef llama_rms_norm(x, weight, eps):\n"
        "    CALLS.append(tuple(x.shape))\n"
        "    h = x.float()\n"
        "    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)\n"
        "    return weight * h.to(x.dtype)\n")
    (pkgs / "kz_fake_norms-1.2.3.dist-info").mkdir()
    (pkgs / "kz_fake_norms-1.2.3.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: kz_fake_norms\nVersion: 1.2.3\n")
    return pkgs


@pytest.fixture
def clean_sys_path(monkeypatch):
    """--package-dir changes sys.path (and imports) of this process; undo both."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    sys.modules.pop("kz_fake_norms", None)


def _run_cpu(tmp_path, kernel, model_dirs, *extra, dtype="bf16"):
    return _run(tmp_path, kernel, model_dirs, "--device", "cpu", "--arch", "sm_90", *extra,
                dtype=dtype, dry=False)


def test_python_candidate_function_replaces_each_matching_layer(tmp_path, models, capsys,
                                                                clean_sys_path):
    pkgs = _fake_package(tmp_path)
    k = _py_candidate(tmp_path, "fake_llama_norm",
                      "import kz_fake_norms\n\n\ndef rms_norm(x, weight, eps):\n"
                      "    return kz_fake_norms.llama_rms_norm(x, weight, eps)\n",
                      requires='"kz-fake-norms==1.2.3", "torch>=2.0"')
    rc, s, out = _run_cpu(tmp_path, k, [models["llama"], models["gpt2-gelu"]],
                          "--package-dir", str(pkgs), "--confinement", str(CONFINEMENT),
                          dtype="bf16,f32")
    err = capsys.readouterr().err
    assert rc == 0, err
    assert s["dry_run"] is False and s["kernel"]["runtime"] == "python"
    import importlib.metadata
    assert s["python"]["packages"] == {"kz-fake-norms": "1.2.3",
                                       "torch": importlib.metadata.version("torch")}
    assert s["python"]["torch"] == torch.__version__
    # the verifier's confinement check (the case runner's), its three lines
    assert s["python"]["isolation"][0].split(":")[0] in ("isolated", "NOT isolated", "unknown (cannot list the network interfaces")
    assert s["python"]["isolation"][1].startswith("working directory ")
    assert [(r["model_name"], r["dtype"]) for r in s["runs"]] == [("tiny-llama", "bf16"),
                                                                   ("tiny-llama", "f32")]
    import kz_fake_norms  # the package the candidate imported, from --package-dir
    assert kz_fake_norms.__file__.startswith(str(pkgs))
    for r in s["runs"]:
        # every RMSNorm (2 per layer, the final norm) called the function once per forward
        assert r["layers_replaced"] == 5 and r["kernel_launches"] == 5, r
        assert r["replaced_never_launched"] == [] and r["eager_repeat_identical"] is True
        # eager LlamaRMSNorm's own formula: the logits are the same bits
        assert r["bit_identical"] is True, r
        assert (out / r["file"]).is_file()
    assert len(kz_fake_norms.CALLS) == 10 and kz_fake_norms.CALLS[0] == (96, 64)
    assert "tiny-gpt2-gelu" in {k["model_name"] for k in s["skipped"]}


def test_f_rms_norm_posing_as_llama_moves_the_logits_on_the_cpu(tmp_path, models):
    """The shipped third-party candidate, as the verifier's model level runs it: F.rms_norm
    rounds once where LlamaRMSNorm rounds twice, so the bf16 logits differ."""
    from safetensors.torch import load_file
    rc, s, out = _run_cpu(tmp_path, KERNELS / "third-party" / "f_rms_norm_as_llama",
                          [models["llama"]])
    assert rc == 0
    r = s["runs"][0]
    assert r["kernel_launches"] == 5 and r["bit_identical"] is False
    t = load_file(str(out / r["file"]))
    assert not torch.equal(t["eager_logits"], t["candidate_logits"])
    assert (t["eager_logits"] - t["candidate_logits"]).abs().max() < 1.0


def test_python_candidate_failures_are_clear(tmp_path, models, capsys, clean_sys_path):
    # its package not installed (no --package-dir): exit 1, naming it and the flag
    k = _py_candidate(tmp_path, "needs_pkg", "import kz_fake_norms\n\n\ndef rms_norm(x, weight, eps):\n"
                      "    return x\n", requires='"kz-fake-norms==1.2.3"')
    rc, s, _ = _run_cpu(tmp_path, k, [models["llama"]])
    err = capsys.readouterr().err
    assert rc == 1 and s is None
    assert "importing the Python candidate needs_pkg" in err and "ModuleNotFoundError" in err
    assert "kz-fake-norms" in err and "--package-dir" in err
    # a function that raises fails the run with its exception (the candidate's, not ours)
    k = _py_candidate(tmp_path, "raises", "def rms_norm(x, weight, eps):\n"
                      "    raise RuntimeError('candidate bug')\n")
    rc, _, _ = _run_cpu(tmp_path, k, [models["llama"]])
    err = capsys.readouterr().err
    assert rc == 1 and "the Python candidate raises failed inside tiny-llama (bf16)" in err
    assert "RuntimeError: candidate bug" in err
    # a wrong output shape is refused by the swapped forward, naming the candidate
    k = _py_candidate(tmp_path, "bad_shape", "def rms_norm(x, weight, eps):\n"
                      "    return x[:1]\n")
    rc, _, _ = _run_cpu(tmp_path, k, [models["llama"]])
    err = capsys.readouterr().err
    assert rc == 1 and "the Python candidate bad_shape failed" in err and "bad_shape: returned" in err


def test_require_network_isolation_refuses_before_running_the_candidate(tmp_path, models, capsys,
                                                                        monkeypatch):
    marker = tmp_path / "ran"
    k = _py_candidate(tmp_path, "marks", f"open({str(marker)!r}, 'w').close()\n\n\n"
                      "def rms_norm(x, weight, eps):\n    return x\n")
    # the verifier's check, with the interfaces this process sees stubbed: first not isolated,
    # then isolated; and without the check, unknown, which the flag refuses too
    import socket
    monkeypatch.setattr(socket, "if_nameindex", lambda: [(1, "lo"), (2, "eth0")])
    rc, _, _ = _run_cpu(tmp_path, k, [models["llama"]], "--require-network-isolation",
                        "--confinement", str(CONFINEMENT))
    assert rc == 1 and "NOT isolated: interfaces eth0, lo" in capsys.readouterr().err
    assert not marker.exists(), "the candidate's code ran"
    rc, _, _ = _run_cpu(tmp_path, k, [models["llama"]], "--require-network-isolation")
    assert rc == 1 and "no confinement check was given" in capsys.readouterr().err
    assert not marker.exists(), "the candidate's code ran"
    monkeypatch.setattr(socket, "if_nameindex", lambda: [(1, "lo")])
    rc, s, _ = _run_cpu(tmp_path, k, [models["llama"]], "--require-network-isolation",
                        "--confinement", str(CONFINEMENT))
    assert rc == 0 and marker.exists() and s["python"]["isolation"][0].startswith("isolated")


def test_a_cuda_kernel_still_needs_cuda_without_dry_run(tmp_path, models, capsys):
    with pytest.raises(SystemExit) as e:
        _run_cpu(tmp_path, KERNELS / "rms_norm_llama", [models["llama"]])
    assert e.value.code == 2 and "launches on a CUDA device" in capsys.readouterr().err


def test_kernelize_on_the_cpu_swaps_python_candidates_only(models):
    model = model_level.load_model(models["llama"], "bf16", torch.device("cpu"))
    rep = core.kernelize(model, kernels_dir=KERNELS / "rms_norm_llama", device="cpu", swap=True,
                         arch="sm_90", verbose=False)
    norms = [e for e in rep.entries if e.op == "rms_norm"]
    assert len(norms) == 5 and all(e.status == "kept" for e in norms)
    assert "a CUDA kernel launches on a CUDA device" in norms[0].reasons[0]
    rep = core.kernelize(model, kernels_dir=KERNELS / "third-party" / "f_rms_norm_as_llama",
                         device="cpu", swap=True, arch="sm_90", verbose=False)
    assert [e.status for e in rep.entries if e.op == "rms_norm"] == ["replaced"] * 5
    _logits(model, _ids(8))
    assert sorted(core.launch_counts(model).values()) == [1] * 5
    assert core.unkernelize(model) == 5
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match='device="cpu"'):
            core.kernelize(model, kernels_dir=KERNELS / "third-party" / "f_rms_norm_as_llama",
                           swap=True, arch="sm_90", verbose=False)


def test_a_compiled_python_candidate_runs_in_the_models(tmp_path, models):
    """A candidate whose function is torch.compile'd (Inductor on the CPU) runs in every matching
    layer. Coverage, not the regression test: this passed on the CPU before the loader registered
    the module too; the ModuleNotFoundError was seen on the GPU machine only, and
    test_a_loaded_python_candidate_is_importable_by_its_module_name fails without the fix."""
    k = _py_candidate(tmp_path, "compiled_llama_norm",
                      "import torch\nimport torch.nn.functional as F\n\nSCALE = 1.0\n\n\n"
                      "@torch.compile\n"
                      "def _norm(x, weight, eps):\n"
                      "    h = F.relu(x.float()) * 0.0 + x.float() * SCALE\n"
                      "    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)\n"
                      "    return weight * h.to(x.dtype)\n\n\n"
                      "def rms_norm(x, weight, eps):\n"
                      "    return _norm(x, weight, eps)\n")
    rc, s, _ = _run_cpu(tmp_path, k, [models["llama"]])
    assert rc == 0, s
    r = s["runs"][0]
    assert r["kernel_launches"] == 5 and r["replaced_never_launched"] == []


def test_a_loaded_python_candidate_is_importable_by_its_module_name(tmp_path):
    """Dynamo imports a traced function's module by name (importlib.import_module) to read its
    globals; the client's loader registers the candidate's module under its name."""
    import importlib

    from kernelize.digest import digest_of
    from kernelize.manifest import parse_manifest_toml
    from kernelize.pykernel import PythonKernel
    k = _py_candidate(tmp_path, "named_module", "VALUE = 41\n\n\ndef rms_norm(x, weight, eps):\n"
                      "    return x\n")
    man = parse_manifest_toml((k / "kernel.toml").read_text())
    src = (k / "kernel.py").read_text()
    pk = PythonKernel(digest_of(man, src), man, src, "bf16", torch.device("cpu"), allow_python=True)
    mod = importlib.import_module(pk.module.__name__)
    assert mod is pk.module and mod.VALUE == 41
