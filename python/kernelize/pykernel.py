"""Python candidates (docs/spec.md section 2b) in the client: a kernel whose manifest says `runtime = "python"`
is a function of its `.py` source, called with the layer's tensors as `[rows, cols]` contiguous
tensors. Loading one runs its code in this process, so the client does it only when the caller
opted in (`kernelize(..., allow_python=True)`); sources refuse it otherwise
(`PythonNotAllowed`).

`PythonKernel` stands where `launch.CompiledKernel` stands: `launch.compiled` returns one for a
Python manifest, and `launch`'s runners call it with the op's Python signature.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
import types
from typing import Any

import torch

OPT_IN = ("a Python candidate (runtime = \"python\") runs its own code in this process: "
          "pass allow_python=True to kernelize/lock to use it")


class PythonNotAllowed(RuntimeError):
    """A Python candidate was about to be loaded without the caller's opt-in."""


def is_python(manifest: dict[str, Any]) -> bool:
    return manifest.get("runtime", "cuda") == "python"


def _package_name(requirement: str) -> str:
    """pip's normalised name of a `requires` entry (`Liger_Kernel==0.8.5` -> `liger-kernel`)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement).group(0)).lower()


def missing_packages(manifest: dict[str, Any]) -> list[str]:
    """The `requires` packages not installed here (by pip-normalised name)."""
    out = []
    for r in manifest.get("requires", []):
        try:
            importlib.metadata.version(_package_name(r))
        except importlib.metadata.PackageNotFoundError:
            out.append(r)
    return out


def package_versions(manifest: dict[str, Any]) -> dict[str, str]:
    """Each `requires` package's installed version here, "missing" when it is not installed
    (torch: the imported one's version, which a source build may not register)."""
    out = {}
    for r in manifest.get("requires", []):
        name = _package_name(r)
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = torch.__version__ if name == "torch" else "missing"
    return out


class SharedOnCopy:
    """A loaded kernel is a process-wide resource (loaded once, `launch.compiled`'s cache, filed
    under a key in `ops`; a CUDA one holds ctypes handles into the driver): a copied model shares
    it, as it shares the kernel's code."""

    def __copy__(self):
        return self

    def __deepcopy__(self, memo: dict):
        return self


class PythonKernel(SharedOnCopy):
    """One dtype's function of a Python candidate, loaded as a module of its own."""

    runtime = "python"

    def __init__(self, digest: str, manifest: dict[str, Any], source: str, dtype: str,
                 device: torch.device, allow_python: bool):
        if not allow_python:
            raise PythonNotAllowed(f"{manifest['name']} {manifest['version']}: {OPT_IN}")
        self.manifest = manifest
        self.dtype = dtype
        self.device = device
        self.digest = digest
        name = "kernelize_candidate_" + digest.split(":")[-1][:16]
        mod = types.ModuleType(name)
        mod.__file__ = f"<kernelize {manifest['name']} {manifest['version']} {digest}>"
        # importable by its name, as an imported module is: torch.compile'd functions of the
        # source are traced by Dynamo, which imports a function's module by name to read its
        # globals (compile(silu(g) * u) failed in a model on the GPU machine without this)
        sys.modules[name] = mod
        try:
            exec(compile(source, mod.__file__, "exec"), mod.__dict__)  # noqa: S102 - opted in
        except BaseException:
            sys.modules.pop(name, None)
            raise
        fn = getattr(mod, manifest["entries"][dtype], None)
        if not callable(fn):
            raise ValueError(f"{manifest['name']}: entry.{dtype} `{manifest['entries'][dtype]}` "
                             "is not a function of its source")
        self.fn = fn
        self.module = mod
        self.record = {"runtime": "python", "function": manifest["entries"][dtype],
                       "requires": list(manifest.get("requires", []))}

    def _rows(self, t: torch.Tensor, cols: int) -> torch.Tensor:
        return t.reshape(-1, cols).contiguous()

    def _out(self, out: torch.Tensor, like: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        if not (isinstance(out, torch.Tensor) and tuple(out.shape) == (rows, cols)
                and out.dtype == like.dtype and out.device == like.device):
            got = (tuple(out.shape), out.dtype, out.device) if isinstance(out, torch.Tensor) else type(out)
            raise RuntimeError(f"{self.manifest['name']}: returned {got}, expected "
                               f"({rows}, {cols}) {like.dtype} on {like.device}")
        return out.reshape(like.shape)

    def rms_norm(self, x, w, eps):
        cols = x.shape[-1]
        x2 = self._rows(x, cols)
        return self._out(self.fn(x2, w.contiguous(), float(eps)), x, x2.shape[0], cols)

    def fused_add(self, x, residual, params, eps):
        """The fused adds (`f(x, residual, *params, eps)`, updating `residual`): params are the
        norm's weight, or weight and bias."""
        cols = x.shape[-1]
        x2 = self._rows(x, cols)
        r2 = residual.view(-1, cols) if residual.is_contiguous() else residual.reshape(-1, cols).clone()
        out = self._out(self.fn(x2, r2, *(p.contiguous() for p in params), float(eps)), x, x2.shape[0], cols)
        if r2.data_ptr() != residual.data_ptr():
            residual.copy_(r2.reshape(residual.shape))
        return out

    def layer_norm(self, x, w, b, eps):
        cols = x.shape[-1]
        x2 = self._rows(x, cols)
        return self._out(self.fn(x2, w.contiguous(), b.contiguous(), float(eps)), x, x2.shape[0], cols)

    def elementwise(self, x):
        cols = x.shape[-1] if x.dim() else 1
        x2 = self._rows(x, cols)
        return self._out(self.fn(x2), x, x2.shape[0], cols)

    def silu_and_mul(self, g, u):
        cols = g.shape[-1]
        x2 = torch.cat([g, u], dim=-1).reshape(-1, 2 * cols)
        return self._out(self.fn(x2), g.contiguous(), x2.shape[0], cols)

    def gated(self, g, u):
        if g.shape != u.shape:
            raise ValueError(f"gated op: gate {tuple(g.shape)} and up {tuple(u.shape)} differ in shape")
        cols = g.shape[-1]
        g2, u2 = self._rows(g, cols), self._rows(u, cols)
        return self._out(self.fn(g2, u2), g, g2.shape[0], cols)
