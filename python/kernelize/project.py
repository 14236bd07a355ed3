"""`kernelize lock`: one lock file for every model of a project (docs/python.md, "A project's lock").

    python -m kernelize.project lock [--project pyproject.toml] [--hub URL] [--out FILE] ...
    kernelize lock -- [the same options]      (the hub's binary runs this module)

The project names its models and the hub in its `pyproject.toml` (or a file of its own with
the same table):

    [tool.kernelize]
    hub = "http://127.0.0.1:8080"
    models = ["models/tiny-llama", "Qwen/Qwen2.5-0.5B"]   # folders or Hugging Face ids
    dtypes = ["bf16"]            # default: each model's own dtype
    arch = "sm_90"               # default: this machine's GPU
    policy = "bit_exact"
    mode = "inference"           # or "training": also pin each layer's backward kernel
    lock = "kernelize.lock.json"
    trusted_keys = "kernels/certificates/trusted-keys.txt"   # optional: certified kernels only

Each model is built from its configuration (no weights are downloaded: every layer kernelize
replaces is found from the model's classes and shapes, with random weights on the CPU), each of
its replaceable layers is resolved against the hub for every dtype, and the answers of all
models go into one lock, which `kernelize.kernelize(model, lock=PATH)` then reads offline, with
every digest (and, with trusted keys, every certificate) checked again.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from .certs import parse_key_list
from .discover import DTYPE_OF_NAME, TORCH_DTYPES

try:
    import tomllib
except ImportError:  # pragma: no cover - Python 3.10
    tomllib = None  # type: ignore[assignment]

TABLE = "tool.kernelize"
KEYS = {"hub": str, "models": list, "dtypes": list, "arch": str, "policy": str, "lock": str,
        "trusted_keys": str, "mode": str}


class ProjectError(ValueError):
    """The project file or an option is not usable; the message says what and how to fix it."""


def read_project(path: str | Path) -> dict[str, Any]:
    """The `[tool.kernelize]` table of `path`, checked: known keys only, each of its type."""
    p = Path(path)
    if tomllib is None:  # pragma: no cover
        raise ProjectError("reading a project file needs Python 3.11 (tomllib)")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProjectError(f"{p} not found: write a [{TABLE}] table there (see `--help`), or "
                           "pass --project FILE") from None
    except tomllib.TOMLDecodeError as e:
        raise ProjectError(f"{p} is not valid TOML: {e}") from None
    table = data.get("tool", {}).get("kernelize")
    if not isinstance(table, dict):
        raise ProjectError(f"{p} has no [{TABLE}] table: add one with at least "
                           "`models = [\"path/or/hf-id\"]` and `hub = \"http://...\"`")
    for k, v in table.items():
        if k not in KEYS:
            raise ProjectError(f"{p}: [{TABLE}] {k} is not a known key; known: {', '.join(KEYS)}")
        if not isinstance(v, KEYS[k]):
            raise ProjectError(f"{p}: [{TABLE}] {k} must be a {KEYS[k].__name__}, "
                               f"not {type(v).__name__}")
    for k in ("models", "dtypes"):
        if k in table and not all(isinstance(x, str) and x for x in table[k]):
            raise ProjectError(f"{p}: [{TABLE}] {k} must be a list of non-empty strings")
    for d in table.get("dtypes", []):
        if d not in DTYPE_OF_NAME:
            raise ProjectError(f"{p}: [{TABLE}] dtypes: {d!r} is not one of {', '.join(DTYPE_OF_NAME)}")
    if "mode" in table:
        from .core import _check_mode
        try:
            _check_mode(table["mode"], False)
        except ValueError as e:
            raise ProjectError(f"{p}: [{TABLE}] {e}") from None
    return table


def build_model(ref: str, dtype: str | None, base: Path) -> tuple[Any, str]:
    """The model `ref` (a folder, relative to the project file's folder, or a Hugging Face id)
    built from its configuration with random weights on the CPU, in `dtype` (default: the
    configuration's); returns it and the dtype used."""
    import transformers
    local = base / ref
    src = str(local) if local.exists() else ref
    try:
        cfg = transformers.AutoConfig.from_pretrained(src)
    except Exception as e:  # noqa: BLE001 - any failure to read a config is the user's to fix
        raise ProjectError(f"model {ref!r}: its configuration could not be read ({e}); give a "
                           "folder holding config.json or a Hugging Face model id") from None
    if dtype is None:
        own = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None) or torch.float32
        own = getattr(torch, own, own) if isinstance(own, str) else own
        dtype = TORCH_DTYPES.get(own)
        if dtype is None:
            raise ProjectError(f"model {ref!r} is {own}: name the dtypes to lock for "
                               "(`dtypes = [\"bf16\"]`)")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    return model.to(DTYPE_OF_NAME[dtype]).eval(), dtype


def lock_project(table: dict[str, Any], base: Path, out: Path, log=print) -> dict:
    """Resolve every model of `table` for every dtype and write one lock at `out`."""
    from .core import _arch_of, _check_mode, _pin_backward, _resolve_all
    from .sources import HubSource, write_lock
    if not table.get("models"):
        raise ProjectError(f"[{TABLE}] models is empty: name the models to lock")
    if not table.get("hub"):
        raise ProjectError(f"no hub: set [{TABLE}] hub = \"http://...\" or pass --hub URL")
    keys = None
    if table.get("trusted_keys"):
        kf = base / table["trusted_keys"]
        try:
            keys = parse_key_list(kf.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ProjectError(f"trusted_keys file {kf} not found") from None
    src = HubSource(table["hub"], trusted_keys=keys)
    arch = _arch_of(_cuda_device_or_none(), table.get("arch"))
    policy = table.get("policy", "bit_exact")
    mode, _ = _check_mode(table.get("mode", "inference"), False)
    merged: dict = {}
    for ref in table["models"]:
        for dt in table.get("dtypes") or [None]:
            model, used = build_model(ref, dt, base)
            found, cache, plan = _resolve_all(model, src, policy, arch, used)
            pinned = sum(1 for _, _, r, _, _ in plan if r is not None and r.kernel is not None)
            extra = ""
            if mode == "training":
                before = len(cache)
                _pin_backward(plan, cache, src, policy, arch)
                with_bwd = sum(1 for k, r in cache.items()
                               if k.op.endswith("_backward") and r.kernel is not None)
                extra = (f"; training: {len(cache) - before} backward resolution(s), "
                         f"{with_bwd} with a kernel")
            log(f"{ref} ({used}): {len(found.sites)} layers, {pinned} with a kernel "
                f"meeting {policy} on {arch}{extra}")
            merged.update(cache)
            del model
    data = write_lock(out, src.url, merged, trusted_keys=keys)
    n = sum(1 for e in data["resolutions"] if e["digest"])
    log(f"wrote {out}: {len(data['resolutions'])} resolutions, {n} pinned to a kernel, "
        f"{len(data['kernels'])} kernels")
    return data


def _cuda_device_or_none():
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="kernelize lock",
        description="Write one lock file for every model of a project: each model's replaceable "
                    "layers resolved against the hub, pinned by digest with the kernels' source "
                    "(read offline by kernelize.kernelize(model, lock=PATH)).",
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["lock"], help="what to do (one command: lock)")
    p.add_argument("--project", default="pyproject.toml",
                   help="the file holding the [tool.kernelize] table (default: pyproject.toml)")
    p.add_argument("--hub", help="the hub's URL (overrides the project's)")
    p.add_argument("--arch", help="the GPU architecture to lock for, e.g. sm_90 (default: the "
                                  "project's, else this machine's GPU)")
    p.add_argument("--policy", help="the exactness policy (default: the project's, else bit_exact)")
    p.add_argument("--mode", help="inference, or training to pin each layer's backward kernel too "
                                  "(default: the project's, else inference)")
    p.add_argument("--out", help="the lock file (default: the project's `lock`, else "
                                 "kernelize.lock.json beside the project file)")
    a = p.parse_args(argv)
    try:
        project = Path(a.project)
        table = read_project(project)
        for k in ("hub", "arch", "policy", "mode"):
            if getattr(a, k):
                table[k] = getattr(a, k)
        base = project.resolve().parent
        out = Path(a.out) if a.out else base / table.get("lock", "kernelize.lock.json")
        lock_project(table, base, out)
    except ValueError as e:   # ProjectError, or e.g. no arch without a GPU: says what to pass
        print(f"kernelize lock: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
