"""kernelize: put verified hub kernels into a PyTorch model (see docs/python.md)."""

from .core import Entry, Report, kernelize, lock, unkernelize
from .digest import DigestMismatch, ManifestError, digest_of, parse_manifest_toml
from .sources import DirSource, HubError, HubSource, Key, LockSource

__all__ = ["kernelize", "unkernelize", "lock", "Report", "Entry", "digest_of",
           "parse_manifest_toml", "DigestMismatch", "ManifestError", "HubSource",
           "LockSource", "DirSource", "Key", "HubError"]
__version__ = "0.1.0"
