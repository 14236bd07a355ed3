"""The client compiles exactly as the verifier does (issue 13 item 8), checked without a GPU:
the option list and program name against the fixture the verifier's Rust test reads too,
where libnvrtc is looked for, the error when it is missing, and the CUBIN check's comparison.
Compiling a real kernel runs only where some libnvrtc loads (the PyPI torch wheel brings one);
loading and launching it is the GPU machine's (scripts/cubin_check.py, test_gpu.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kernelize import launch, nvrtc
from kernelize.manifest import parse_manifest_toml
from conftest import load_script

REPO = Path(__file__).resolve().parents[2]
FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "nvrtc_options.json").read_text())


# ---- the option list, the include path, the program name ------------------------------------

@pytest.mark.parametrize("case", FIXTURE["options"], ids=lambda c: f"{c['arch']}-{c['dtype']}")
def test_option_list_matches_the_verifier_fixture(case):
    got = nvrtc.nvrtc_options(case["arch"], case["include_dir"],
                              nvrtc.entry_options(case["nvrtc_options"], case["dtype"]))
    assert got == case["expected"]
    # the same through a manifest, as the client builds it
    man = {"name": "k", "nvrtc_options": case["nvrtc_options"]}
    assert nvrtc.module_options(man, case["dtype"], case["arch"], case["include_dir"]) == case["expected"]


def test_arch_forms_agree():
    for a in ("sm_90", "90", "9.0", (9, 0)):
        assert nvrtc.nvrtc_options(a, "/i", [])[0] == "--gpu-architecture=sm_90"
    assert nvrtc.nvrtc_options((12, 0), "/i", [])[0] == "--gpu-architecture=sm_120"
    with pytest.raises(ValueError):
        nvrtc.nvrtc_options("sm_x", "/i", [])


@pytest.mark.parametrize("case", FIXTURE["include_dir"], ids=lambda c: json.dumps(c["env"]))
def test_include_dir_matches_the_verifier_fixture(case):
    assert nvrtc.cuda_include_dir(case["env"]) == case["expected"]


@pytest.mark.parametrize("case", FIXTURE["program_name"], ids=lambda c: c["expected"])
def test_program_name_matches_the_verifier_fixture(case):
    assert nvrtc.program_name(case["kernel"], case["dtype"]) == case["expected"]


def test_one_entry_options_function():
    # launch re-exports nvrtc's: one function for the module's options
    assert launch.entry_options is nvrtc.entry_options
    assert launch.entry_options(["--fmad=false"], "bf16") == ["--fmad=false", "-DKERNELIZE_DTYPE_BF16"]


def test_bundled_manifests_give_the_verifier_list(monkeypatch):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    n = 0
    for d in sorted((REPO / "kernels").iterdir()):
        if not (d / "kernel.toml").is_file():
            continue
        man = parse_manifest_toml((d / "kernel.toml").read_text(encoding="utf-8"))
        for dt in man["entries"]:
            assert nvrtc.module_options(man, dt, "sm_90") == [
                "--gpu-architecture=sm_90", "--include-path=/usr/local/cuda/include",
                *man["nvrtc_options"], f"-DKERNELIZE_DTYPE_{dt.upper()}"]
            n += 1
    assert n > 0


# ---- finding libnvrtc ---------------------------------------------------------------------

def _touch(p: Path) -> str:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b"")
    return str(p)


def test_library_search_order(tmp_path, monkeypatch):
    monkeypatch.setattr(nvrtc, "DEFAULT_CUDA_ROOT", str(tmp_path / "usr-local-cuda"))
    home = tmp_path / "cuda-home"
    site = tmp_path / "site"
    site2 = tmp_path / "site2"
    h13 = _touch(home / "lib64" / "libnvrtc.so.13")
    h = _touch(home / "lib64" / "libnvrtc.so")
    d12 = _touch(tmp_path / "usr-local-cuda" / "lib64" / "libnvrtc.so.12")
    p13 = _touch(site / "nvidia" / "cu13" / "lib" / "libnvrtc.so.13")
    p12 = _touch(site2 / "nvidia" / "cuda_nvrtc" / "lib" / "libnvrtc.so.12")
    _touch(site / "nvidia" / "cu13" / "lib" / "libnvrtc.so.14")  # not a major looked for
    env = {"CUDA_HOME": str(home) + "/"}
    got = nvrtc.nvrtc_candidates(env, [str(site), "", str(site2)], cuda_major=13)
    # toolkit (CUDA_HOME, then the default root) first, then the pip packages, then the loader
    assert got == [h13, h, d12, p13, p12, "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
    # PyTorch's CUDA major goes first
    got12 = nvrtc.nvrtc_candidates(env, [str(site), str(site2)], cuda_major=12)
    assert got12[-3:] == ["libnvrtc.so.12", "libnvrtc.so.13", "libnvrtc.so"]
    # CUDA_PATH is looked at too, after CUDA_HOME
    path = tmp_path / "cuda-path"
    c13 = _touch(path / "lib" / "libnvrtc.so.13")
    got = nvrtc.nvrtc_candidates({"CUDA_HOME": str(home), "CUDA_PATH": str(path)}, [], cuda_major=13)
    assert got[:4] == [h13, h, c13, d12]
    # nothing installed: only the loader's names
    monkeypatch.setattr(nvrtc, "DEFAULT_CUDA_ROOT", str(tmp_path / "none"))
    assert nvrtc.nvrtc_candidates({}, [str(tmp_path / "none")], cuda_major=None) == [
        "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]


def test_library_override(tmp_path):
    assert nvrtc.nvrtc_candidates({"KERNELIZE_NVRTC": "/x/libnvrtc.so.13", "CUDA_HOME": str(tmp_path)}) == [
        "/x/libnvrtc.so.13"]


def test_client_include_dir(tmp_path):
    home = tmp_path / "cuda"
    site = tmp_path / "site"
    (home / "include").mkdir(parents=True)
    assert nvrtc.include_dir_for_client({"CUDA_HOME": str(home)}, [str(site)]) == (str(home / "include"), True)
    # no toolkit headers where the verifier looks: the pip package's, flagged as different
    _touch(site / "nvidia" / "cu13" / "include" / "cuda_bf16.h")
    got = nvrtc.include_dir_for_client({"CUDA_HOME": str(tmp_path / "missing")}, [str(site)])
    assert got == (str(site / "nvidia" / "cu13" / "include"), False)
    assert nvrtc.include_dir_for_client({"CUDA_HOME": str(tmp_path / "missing")}, []) == (
        str(tmp_path / "missing" / "include"), True)


def test_missing_nvrtc_is_a_clear_error(tmp_path, monkeypatch):
    with pytest.raises(nvrtc.NvrtcNotFound, match="pip install nvidia-cuda-nvrtc"):
        nvrtc.load_nvrtc([str(tmp_path / "libnvrtc.so.13"), "libnvrtc-not-here.so.99"])
    # through the compile path, with the process's library not loaded yet
    monkeypatch.setattr(nvrtc, "_LIB", None)
    monkeypatch.setenv("KERNELIZE_NVRTC", str(tmp_path / "no" / "libnvrtc.so.13"))
    man = {"name": "k", "entries": {"f32": "k_f32"}, "nvrtc_options": []}
    with pytest.raises(nvrtc.NvrtcNotFound) as e:
        nvrtc.compile_entry(man, "extern \"C\" __global__ void k_f32() {}", "f32", "sm_90")
    msg = str(e.value)
    assert "CUDA_HOME" in msg and "KERNELIZE_NVRTC" in msg and str(tmp_path / "no") in msg
    assert nvrtc._LIB is None  # a failure is not cached: a later call may find one
    assert issubclass(nvrtc.NvrtcNotFound, RuntimeError)


def test_importing_launch_touches_no_driver():
    # the CPU-only client imports launch (core does) without loading libcuda
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    assert launch._LIBCUDA is None
    assert launch.compile_records() == []


# ---- compiling for real, where a libnvrtc loads (no GPU needed) -----------------------------

def _nvrtc_or_skip() -> nvrtc.Nvrtc:
    try:
        return nvrtc.load_nvrtc()
    except nvrtc.NvrtcNotFound as e:
        pytest.skip(f"no libnvrtc here: {str(e).splitlines()[0]}")


def test_compile_a_bundled_kernel_to_a_cubin():
    nv = _nvrtc_or_skip()
    d = REPO / "kernels" / "silu"
    man = parse_manifest_toml((d / "kernel.toml").read_text(encoding="utf-8"))
    src = (d / man["source"]).read_bytes().decode("utf-8")
    inc, _ = nvrtc.include_dir_for_client()
    c = nvrtc.compile_entry(man, src, "f32", "sm_90", include_dir=inc)
    assert c.code_kind == "cubin" and c.code[:4] == b"\x7fELF"
    assert c.code_sha256 == hashlib.sha256(c.code).hexdigest()
    assert c.options == nvrtc.module_options(man, "f32", "sm_90", inc)
    assert c.program_name == "silu (f32).cu"
    assert c.nvrtc_version == nv.version and c.nvrtc_library
    # the same source, name and options give the same bytes (the hash is worth comparing)
    assert nvrtc.compile_entry(man, src, "f32", "sm_90", include_dir=inc).code_sha256 == c.code_sha256
    # another architecture is other code
    assert nvrtc.compile_entry(man, src, "f32", "sm_80", include_dir=inc).code_sha256 != c.code_sha256


def test_every_bundled_kernel_compiles():
    # Every kernels/<name>/kernel.cu, every dtype's module, with the client's (the verifier's)
    # options. To PTX (NVRTC's front end and optimiser, not ptxas: a CUBIN of every module takes
    # minutes on a small CPU); KERNELIZE_TEST_CUBIN=1 builds the sm_90 CUBINs instead.
    import concurrent.futures as cf
    import os

    nv = _nvrtc_or_skip()
    inc, _ = nvrtc.include_dir_for_client()
    arch = "sm_90" if os.environ.get("KERNELIZE_TEST_CUBIN") == "1" else "compute_90"
    jobs = []
    for d in sorted((REPO / "kernels").iterdir()):
        if (d / "kernel.toml").is_file():
            man = parse_manifest_toml((d / "kernel.toml").read_text(encoding="utf-8"))
            src = (d / man["source"]).read_text(encoding="utf-8")
            jobs += [(man, src, dt) for dt in man["entries"]]

    def build(job):
        man, src, dt = job
        opts = [f"--gpu-architecture={arch}", f"--include-path={inc}", *man["nvrtc_options"],
                f"-DKERNELIZE_DTYPE_{dt.upper()}"]
        c = nvrtc.compile_program(src, nvrtc.program_name(man["name"], dt), opts, nv)
        entry = man["entries"][dt].encode()
        assert c.code and (arch.startswith("sm_") or entry in c.code), (man["name"], dt)
        return man["name"], dt

    with cf.ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1))) as ex:
        done = list(ex.map(build, jobs))
    assert len(done) == len(jobs) >= 14 * 3


def test_compile_error_carries_nvrtc_log():
    _nvrtc_or_skip()
    with pytest.raises(nvrtc.NvrtcCompileError, match="not_declared"):
        nvrtc.compile_program('extern "C" __global__ void k(float* o) { o[0] = not_declared; }',
                              "broken (f32).cu", ["--gpu-architecture=sm_90"])
    with pytest.raises(nvrtc.NvrtcCompileError, match="NUL"):
        nvrtc.compile_program("a\0b", "x.cu", [])


# ---- scripts/cubin_check.py's comparison ----------------------------------------------------

def _cubin_check():
    return load_script(REPO / "scripts" / "cubin_check.py", "cubin_check")


def test_cubin_check_compare():
    cc = _cubin_check()
    opts = ["--gpu-architecture=sm_90", "--include-path=/usr/local/cuda/include", "-DKERNELIZE_DTYPE_BF16"]
    client = {"symbol": "s", "options": opts, "code_kind": "cubin", "code_sha256": "a" * 64,
              "nvrtc_version": "13.0"}
    ver = {"dtype": "bf16", "symbol": "s", "options": opts, "code_kind": "cubin",
           "code_sha256": "a" * 64, "nvrtc_version": "13.0"}
    row, probs = cc.compare("k", "bf16", client, ver)
    assert probs == [] and row["same_code"] and row["same_options"]
    row, probs = cc.compare("k", "bf16", client, dict(ver, code_sha256="b" * 64))
    assert not row["same_code"] and len(probs) == 1 and "aaaaaaaaaaaa" in probs[0]
    row, probs = cc.compare("k", "bf16", client, dict(ver, options=opts[:2]))
    assert row["same_code"] and not row["same_options"] and len(probs) == 1
    row, probs = cc.compare("k", "bf16", client, None)
    assert "no compiled[] record" in probs[0]
    row, probs = cc.compare("k", "bf16", None, ver)
    assert "did not compile" in probs[0]


def test_cubin_check_reads_reports(tmp_path):
    cc = _cubin_check()
    recs, why = cc.verifier_records(tmp_path / "kernel-x.json")
    assert recs == {} and "no report" in why
    (tmp_path / "kernel-x.json").write_text(json.dumps({"schema_version": 1}))
    recs, why = cc.verifier_records(tmp_path / "kernel-x.json")
    assert recs == {} and "no compiled[]" in why
    (tmp_path / "kernel-x.json").write_text(json.dumps({"compiled": [
        {"dtype": "bf16", "code_sha256": "c" * 64}, {"dtype": "f32", "code_sha256": "d" * 64}]}))
    recs, why = cc.verifier_records(tmp_path / "kernel-x.json")
    assert why is None and recs["f32"]["code_sha256"] == "d" * 64


def test_cubin_check_without_a_gpu_says_so(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the check itself runs (gpu-check's cubin step)")
    cc = _cubin_check()
    assert cc.main([str(tmp_path), str(REPO / "kernels"), str(tmp_path / "out.json")]) == 2
    assert "no CUDA device" in capsys.readouterr().out


def test_client_loads_the_code_it_hashed(monkeypatch):
    """CompiledKernel wiring without a GPU: the bytes given to cuModuleLoadData are the bytes
    whose hash is recorded, compiled with the verifier's name and options; cached per process."""
    _nvrtc_or_skip()
    import ctypes
    import types

    import torch
    loaded = []

    class FakeCuda:
        def cuModuleGetFunction(self, out, module, name):
            out._obj.value = 1234
            return 0

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d=None: types.SimpleNamespace(multi_processor_count=132,
                                                             shared_memory_per_block_optin=232448))
    monkeypatch.setattr(launch, "_libcuda", lambda: FakeCuda())
    monkeypatch.setattr(launch, "_load_module",
                        lambda image, dev: loaded.append(image) or ctypes.c_void_p(99))
    monkeypatch.setattr(launch, "_CACHE", {})
    d = REPO / "kernels" / "silu"
    man = parse_manifest_toml((d / "kernel.toml").read_text(encoding="utf-8"))
    src = (d / man["source"]).read_bytes().decode("utf-8")
    dev = torch.device("cuda", 0)
    k = launch.compiled("sha256:" + "1" * 64, man, src, "bf16", dev)
    assert launch.compiled("sha256:" + "1" * 64, man, src, "bf16", dev) is k and len(loaded) == 1
    rec = launch.compile_record("sha256:" + "1" * 64, "bf16", dev)
    assert rec["code_sha256"] == hashlib.sha256(loaded[0]).hexdigest()
    assert rec["program_name"] == "silu (bf16).cu" and rec["symbol"] == man["entries"]["bf16"]
    inc, _ = nvrtc.include_dir_for_client()
    assert rec["options"] == nvrtc.module_options(man, "bf16", "sm_90", inc)
    assert rec["code_kind"] == "cubin" and k.func.value == 1234
    assert [r["digest"] for r in launch.compile_records()] == ["sha256:" + "1" * 64]


def test_cubin_check_end_to_end_with_a_stand_in_device(tmp_path, monkeypatch, capsys):
    """scripts/cubin_check.py from kernel folder to table, JSON and exit status, the device
    replaced by stand-ins (NVRTC is real): equal hashes pass; a different hash or a missing
    report fails."""
    import shutil
    import types

    import torch
    _nvrtc_or_skip()
    cc = _cubin_check()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Stand-in GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d=None: types.SimpleNamespace(multi_processor_count=132,
                                                             shared_memory_per_block_optin=232448))

    class FakeCuda:
        def cuModuleGetFunction(self, out, module, name):
            out._obj.value = 1
            return 0

    monkeypatch.setattr(launch, "_libcuda", lambda: FakeCuda())
    monkeypatch.setattr(launch, "_load_module", lambda image, dev: None)
    monkeypatch.setattr(launch, "_CACHE", {})
    kdir = tmp_path / "kernels"
    shutil.copytree(REPO / "kernels" / "silu", kdir / "silu")
    man = parse_manifest_toml((kdir / "silu" / "kernel.toml").read_text(encoding="utf-8"))
    src = (kdir / "silu" / man["source"]).read_text(encoding="utf-8")
    inc, _ = nvrtc.include_dir_for_client()
    compiled = []
    for dt, sym in man["entries"].items():
        c = nvrtc.compile_entry(man, src, dt, "sm_90", include_dir=inc)
        compiled.append({"dtype": dt, "symbol": sym, "options": c.options, "nvrtc_version": c.nvrtc_version,
                         "code_kind": c.code_kind, "code_sha256": c.code_sha256})
    reports = tmp_path / "out"
    reports.mkdir()
    (reports / "kernel-silu.json").write_text(json.dumps({"compiled": compiled}))
    out_json = tmp_path / "cubin.json"
    assert cc.main([str(reports), str(kdir), str(out_json), "--no-torch"]) == 0
    text = capsys.readouterr().out
    res = json.loads(out_json.read_text())
    assert res["ok"] and res["modules"] == res["identical"] == len(man["entries"])
    assert f"cubin: {len(man['entries'])} of {len(man['entries'])} modules identical" in text.splitlines()[-1]
    # one dtype's hash differs in the report: exit 1, that row says NO
    compiled[0]["code_sha256"] = "0" * 64
    (reports / "kernel-silu.json").write_text(json.dumps({"compiled": compiled}))
    assert cc.main([str(reports), str(kdir), str(out_json), "--no-torch"]) == 1
    res = json.loads(out_json.read_text())
    assert not res["ok"] and res["identical"] == len(man["entries"]) - 1
    assert any("!= verifier" in p for p in res["problems"])
    # no report at all: exit 1, said once
    (reports / "kernel-silu.json").unlink()
    assert cc.main([str(reports), str(kdir), str(out_json), "--no-torch"]) == 1
    res = json.loads(out_json.read_text())
    assert res["identical"] == 0 and len(res["problems"]) == 1 and "no report" in res["problems"][0]
