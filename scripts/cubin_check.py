#!/usr/bin/env python3
"""The client runs exactly what was verified (issue 13 item 8), checked on a GPU machine.

    python3 scripts/cubin_check.py REPORT_DIR KERNELS_DIR OUT_JSON

For every bundled kernel `KERNELS_DIR/<name>/` and each dtype of its manifest, the Python client
compiles and loads the entry as it does for a model (`kernelize.launch.compiled`), and the
SHA-256 of its CUBIN is compared with `compiled[].code_sha256` of the verification report
`REPORT_DIR/kernel-<name>.json` (as scripts/gpu-check writes them). The NVRTC option lists are
compared too. Prints a table, writes OUT_JSON, exits 1 on any difference or missing record
(2 when it cannot run at all: no CUDA device, no NVRTC).

For comparison (informative only, never failing the check; `--no-torch` skips both): the CUBIN
that NVRTC makes of the same entry with the flags `torch.cuda._compile_kernel` adds (PyTorch's
`-I` paths and `-D__CUDA_NO_*` macros), and what the client's old path really ran: the PTX of
`torch.cuda._utils._nvrtc_compile`, JIT-compiled by the driver (cuLink*, in a child process).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))


def short(h: str | None) -> str:
    return h[:12] if h else "-"


def compare(kernel: str, dtype: str, client: dict[str, Any] | None,
            verifier: dict[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """One (kernel, dtype): the row of the table and what is wrong (nothing when the client's
    code and options are the verifier's). `client` is a `launch.CompiledKernel.record` (None when
    the client could not compile), `verifier` the report's `compiled[]` entry of that dtype."""
    problems = []
    row = {"kernel": kernel, "dtype": dtype,
           "client_sha256": client.get("code_sha256") if client else None,
           "verifier_sha256": verifier.get("code_sha256") if verifier else None,
           "same_code": False, "same_options": False}
    if client is None:
        problems.append(f"{kernel} ({dtype}): the client did not compile it")
    if verifier is None:
        problems.append(f"{kernel} ({dtype}): no compiled[] record for {dtype} in the report")
    if client is None or verifier is None:
        return row, problems
    row["same_code"] = bool(client["code_sha256"]) and client["code_sha256"] == verifier.get("code_sha256")
    row["same_options"] = list(client["options"]) == list(verifier.get("options") or [])
    row["client_kind"], row["verifier_kind"] = client.get("code_kind"), verifier.get("code_kind")
    row["client_nvrtc"], row["verifier_nvrtc"] = client.get("nvrtc_version"), verifier.get("nvrtc_version")
    if verifier.get("symbol") not in (None, client.get("symbol")):
        problems.append(f"{kernel} ({dtype}): symbol {client.get('symbol')} vs the report's {verifier.get('symbol')}")
    if not row["same_code"]:
        problems.append(
            f"{kernel} ({dtype}): client {client.get('code_kind')} {short(client['code_sha256'])} "
            f"(NVRTC {client.get('nvrtc_version')}) != verifier {verifier.get('code_kind')} "
            f"{short(verifier.get('code_sha256'))} (NVRTC {verifier.get('nvrtc_version')})")
    if not row["same_options"]:
        problems.append(f"{kernel} ({dtype}): options {client['options']} != the report's {verifier.get('options')}")
    return row, problems


def verifier_records(report_path: Path) -> tuple[dict[str, dict], str | None]:
    """dtype -> the report's compiled[] entry, and why there are none (when so)."""
    if not report_path.is_file():
        return {}, f"no report {report_path}"
    try:
        r = json.loads(report_path.read_text(encoding="utf-8"))
    except ValueError as e:
        return {}, f"{report_path}: not JSON ({e})"
    comp = r.get("compiled") or []
    if not comp:
        return {}, f"{report_path}: no compiled[] records (a verifier that does not record CUBIN hashes?)"
    return {c.get("dtype"): c for c in comp}, None


def loader_nvrtc() -> str:
    """The file a bare dlopen("libnvrtc.so"), then libnvrtc.so.13, gives in a fresh process
    without PyTorch: what the verifier's cudarc loads."""
    code = r"""
import ctypes, os
class I(ctypes.Structure):
    _fields_ = [("f", ctypes.c_char_p), ("b", ctypes.c_void_p), ("s", ctypes.c_char_p), ("a", ctypes.c_void_p)]
for n in ("libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"):
    try:
        lib = ctypes.CDLL(n)
    except OSError:
        continue
    d = ctypes.CDLL(None).dladdr
    d.argtypes = [ctypes.c_void_p, ctypes.POINTER(I)]
    i = I()
    d(ctypes.cast(lib.nvrtcVersion, ctypes.c_void_p), ctypes.byref(i))
    a, b = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(a), ctypes.byref(b))
    print(f"{n} -> {os.path.realpath(i.f.decode()) if i.f else '?'} (NVRTC {a.value}.{b.value})")
    break
else:
    print("none found on the loader's path")
"""
    try:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=60).stdout.strip() or "?"
    except Exception as e:  # noqa: BLE001
        return f"? ({e})"


def torch_flag_options(entry_opts: list[str], arch: str) -> list[str]:
    """The options `torch.cuda._compile_kernel` gave NVRTC in the client's old path
    (torch/cuda/_utils.py `_nvrtc_compile`)."""
    from torch.cuda import _utils as tu

    from kernelize import launch, nvrtc
    opts = [f"--gpu-architecture={arch}"]
    try:
        from torch.utils.cpp_extension import include_paths
        opts += [f"-I{p}" for p in include_paths("cuda")]
    except Exception:  # noqa: BLE001 (no CUDA_HOME: PyTorch adds none)
        pass
    opts += [f"-I{d}" for d in launch.cuda_include_dirs()]
    inc = f"-I{nvrtc.include_dir_for_client()[0]}"
    if inc not in opts:  # (a machine whose headers the old path did not find: compare anyway)
        opts.append(inc)
    opts += entry_opts
    try:
        opts += tu._get_gpu_rtc_compatible_flags()
    except Exception:  # noqa: BLE001
        pass
    return opts


def old_path_child(kernels_dir: Path, out: Path) -> None:
    """In a child process (a crash here must not end the check): what the client's old path ran,
    per (kernel dir, dtype): `torch.cuda._utils._nvrtc_compile` as `torch.cuda._compile_kernel`
    called it (PyTorch's flags; it returns PTX), then the driver's JIT of that PTX to a CUBIN
    (cuLinkAddData / cuLinkComplete in the device's context, as cuModuleLoadData of PTX does).
    Writes {"<dir>/<dtype>": {"ptx_sha256", "jit_cubin_sha256"} or {"error"}} to `out`."""
    import ctypes
    import hashlib

    import torch
    from torch.cuda import _utils as tu

    from kernelize import launch
    from kernelize.manifest import parse_manifest_toml
    torch.empty(1, device="cuda")  # the primary context, current on this thread
    major, minor = torch.cuda.get_device_capability()
    cu = ctypes.CDLL("libcuda.so.1")
    P, S, U = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint
    cu.cuLinkCreate_v2.argtypes = [U, P, P, ctypes.POINTER(P)]
    cu.cuLinkAddData_v2.argtypes = [P, ctypes.c_int, ctypes.c_char_p, S, ctypes.c_char_p, U, P, P]
    cu.cuLinkComplete.argtypes = [P, ctypes.POINTER(P), ctypes.POINTER(S)]
    cu.cuLinkDestroy.argtypes = [P]
    res: dict[str, Any] = {}
    for d in sorted(p for p in kernels_dir.iterdir() if (p / "kernel.toml").is_file()):
        try:
            man = parse_manifest_toml((d / "kernel.toml").read_bytes().decode("utf-8"))
            src = (d / man["source"]).read_bytes().decode("utf-8")
        except Exception as e:  # noqa: BLE001
            res[d.name] = {"error": str(e)[:300]}
            continue
        for dt, sym in man["entries"].items():
            key = f"{d.name}/{dt}"
            try:
                ptx, _ = tu._nvrtc_compile(src, sym, f"{major}{minor}",
                                           cuda_include_dirs=launch.cuda_include_dirs(),
                                           nvcc_options=launch.entry_options(man.get("nvrtc_options", []), dt))
                ptx = bytes(ptx)
                st = P()
                if cu.cuLinkCreate_v2(0, None, None, ctypes.byref(st)) != 0:
                    raise RuntimeError("cuLinkCreate failed")
                try:
                    data = ptx + b"\0"
                    r = cu.cuLinkAddData_v2(st, 1, data, len(data), b"old-path.ptx", 0, None, None)
                    if r != 0:
                        raise RuntimeError(f"cuLinkAddData: CUDA error {r}")
                    out_p, size = P(), S()
                    r = cu.cuLinkComplete(st, ctypes.byref(out_p), ctypes.byref(size))
                    if r != 0:
                        raise RuntimeError(f"cuLinkComplete: CUDA error {r}")
                    cubin = ctypes.string_at(out_p.value, size.value)
                finally:
                    cu.cuLinkDestroy(st)
                res[key] = {"ptx_sha256": hashlib.sha256(ptx).hexdigest(),
                            "jit_cubin_sha256": hashlib.sha256(cubin).hexdigest()}
            except Exception as e:  # noqa: BLE001
                res[key] = {"error": str(e)[:300]}
    out.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")


def old_path(kernels_dir: Path, tmp: Path) -> tuple[dict[str, Any], str | None]:
    """`old_path_child` in a child process: its results, and why there are none (when so)."""
    out = tmp.with_suffix(".old-path.json")
    try:
        p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--old-path-child",
                            str(kernels_dir), str(out)], capture_output=True, text=True, timeout=300)
        if p.returncode != 0 or not out.is_file():
            last = ((p.stderr or p.stdout).strip().splitlines() or ["no output"])[-1]
            return {}, f"failed (rc {p.returncode}): {last[:300]}"
        return json.loads(out.read_text(encoding="utf-8")), None
    except Exception as e:  # noqa: BLE001
        return {}, str(e)[:300]
    finally:
        out.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--old-path-child"]:
        old_path_child(Path(args[1]), Path(args[2]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report_dir", type=Path)
    ap.add_argument("kernels_dir", type=Path)
    ap.add_argument("out_json", type=Path)
    ap.add_argument("--no-torch", action="store_true", help="skip the torch-flags comparison")
    a = ap.parse_args(args)

    import torch

    from kernelize import launch, nvrtc
    from kernelize.digest import digest_of
    from kernelize.manifest import parse_manifest_toml

    if not torch.cuda.is_available():
        print("cubin: no CUDA device here (this check runs on the GPU machine)")
        return 2
    try:
        nv = nvrtc.load_nvrtc()
    except nvrtc.NvrtcNotFound as e:
        print(f"cubin: {e}")
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    major, minor = torch.cuda.get_device_capability(dev)
    arch = f"sm_{major}{minor}"
    loader = loader_nvrtc()
    inc, inc_same = nvrtc.include_dir_for_client()
    print(f"device: {torch.cuda.get_device_name(dev)} ({arch}); torch {torch.__version__}")
    print(f"client NVRTC: {nv.path} (NVRTC {nv.version}); include path {inc}"
          f"{'' if inc_same else ' (NOT the verifier include path ' + nvrtc.cuda_include_dir() + ')'}")
    print(f"loader's NVRTC (what the verifier's cudarc loads): {loader}")

    rows, problems, torch_differs, torch_n = [], [], 0, 0
    kdirs = sorted(p for p in a.kernels_dir.iterdir() if (p / "kernel.toml").is_file())
    if not kdirs:
        problems.append(f"no kernels in {a.kernels_dir}")
    for d in kdirs:
        name = d.name
        try:
            man = parse_manifest_toml((d / "kernel.toml").read_bytes().decode("utf-8"))
            src = (d / man["source"]).read_bytes().decode("utf-8")  # exact bytes, as the verifier
        except Exception as e:  # noqa: BLE001
            problems.append(f"{name}: cannot read the kernel: {e}")
            continue
        digest = digest_of(man, src)
        vrec, why = verifier_records(a.report_dir / f"kernel-{name}.json")
        if why:
            problems.append(f"{name}: {why}")
        for dt in man["entries"]:
            t0 = time.perf_counter()
            try:
                crec = launch.compiled(digest, man, src, dt, dev).record
            except Exception as e:  # noqa: BLE001
                crec = None
                problems.append(f"{name} ({dt}): client compile/load failed: {e}")
            secs = time.perf_counter() - t0
            row, probs = compare(name, dt, crec, vrec.get(dt) if not why else None)
            if why:  # already said once for the kernel
                probs = [p for p in probs if "no compiled[] record" not in p]
            problems += probs
            row["client"], row["verifier"], row["client_s"] = crec, vrec.get(dt), round(secs, 3)
            if crec is not None and not a.no_torch:
                try:
                    topts = torch_flag_options(nvrtc.entry_options(man.get("nvrtc_options", []), dt), arch)
                    tc = nvrtc.compile_program(src, f"{man['entries'][dt]}.cu", topts, nv)
                    row["torch_flags_sha256"], row["torch_flags_options"] = tc.code_sha256, topts
                    torch_n += 1
                    torch_differs += tc.code_sha256 != crec["code_sha256"]
                except Exception as e:  # noqa: BLE001
                    row["torch_flags_error"] = str(e)[:300]
            rows.append(row)

    old_res, old_why = ({}, "skipped (--no-torch)") if a.no_torch else old_path(a.kernels_dir, a.out_json)
    old_differs = old_n = 0
    for r in rows:
        o = old_res.get(f"{r['kernel']}/{r['dtype']}") or {}
        r["old_path"] = o
        if o.get("jit_cubin_sha256") and r["client_sha256"]:
            old_n += 1
            old_differs += o["jit_cubin_sha256"] != r["client_sha256"]

    def vs(h: str | None, err: bool, ref: str | None) -> str:
        if not h:
            return "error" if err else "-"
        return f"{short(h)} ({'same' if h == ref else 'differs'})"

    hdr = ("kernel", "dtype", "client", "verifier", "same code", "same options", "torch flags",
           "old path: PTX -> driver JIT")
    table = [hdr] + [(r["kernel"], r["dtype"], short(r["client_sha256"]), short(r["verifier_sha256"]),
                      "yes" if r["same_code"] else "NO", "yes" if r["same_options"] else "NO",
                      vs(r.get("torch_flags_sha256"), "torch_flags_error" in r, r["client_sha256"]),
                      vs(r["old_path"].get("jit_cubin_sha256"), "error" in r["old_path"], r["client_sha256"]))
                     for r in rows]
    w = [max(len(str(t[i])) for t in table) for i in range(len(hdr))]
    print()
    for t in table:
        print("  ".join(str(c).ljust(w[i]) for i, c in enumerate(t)).rstrip())
    if problems:
        print("\nproblems:")
        for p in problems:
            print(f"  {p}")
    same = sum(r["same_code"] and r["same_options"] for r in rows)
    out = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "device": torch.cuda.get_device_name(dev), "arch": arch, "torch": torch.__version__,
           "client_nvrtc": {"library": nv.path, "version": nv.version},
           "loader_nvrtc": loader, "include_dir": inc, "include_dir_is_verifiers": inc_same,
           "command": " ".join([os.path.basename(sys.argv[0])] + args),
           "old_path_error": old_why, "modules": len(rows), "identical": same, "ok": not problems, "problems": problems,
           "rows": rows}
    a.out_json.parent.mkdir(parents=True, exist_ok=True)
    a.out_json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    if old_why:
        print(f"\nold path (informative): {old_why}")
    tf = f"; torch's flags give other code for {torch_differs} of {torch_n}" if torch_n else ""
    tf += f", its PTX JIT-compiled by the driver for {old_differs} of {old_n}" if old_n else ""
    print(f"\ncubin: {same} of {len(rows)} modules identical to the verifier's (code and options)"
          f"{'' if not problems else f', {len(problems)} problem(s)'}{tf}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
