"""kernelize: put verified hub kernels into a PyTorch model (see docs/python.md).

The names below are imported on first use, so that programs built on this package (the
verifier's `python3 -m kernelize_verifier.model_level`) can start, and say clearly what is
missing, on a Python without PyTorch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "kernelize": "core", "unkernelize": "core", "lock": "core", "launch_counts": "core",
    "Report": "core", "Entry": "core", "get_kernel": "core", "Kernel": "core",
    "KernelNotFound": "core",
    "digest_of": "digest", "parse_manifest_toml": "digest", "DigestMismatch": "digest",
    "ManifestError": "digest",
    "HubSource": "sources", "LockSource": "sources", "DirSource": "sources", "Key": "sources",
    "HubError": "sources", "HubRateLimited": "sources",
    "CertificateError": "certs",
    "PythonNotAllowed": "pykernel",
    "exact_compile": "exact", "compile_state": "exact",
    "diff": "locate", "Divergence": "locate",
}
__all__ = list(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'kernelize' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
