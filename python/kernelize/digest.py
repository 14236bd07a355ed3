"""Kernel digests, exactly as the Rust registry computes them.

The digest (kernel-registry/src/manifest.rs `digest_of`) is

    sha256( b"kernelize-kernel-v1\\0"
            + u64le(len(M)) + M
            + u64le(len(S)) + S )

where M is serde_json's compact serialisation of the checked `Manifest` struct (fields in
declaration order, `entries` a BTreeMap ordered bf16 < f16 < f32, the launch grid an
internally tagged enum `{"kind": ...}`) and S the UTF-8 source bytes.
`json.dumps(separators=(",", ":"), ensure_ascii=False)` writes the same bytes as serde_json
for these values (strings, integers, null, lists, objects): both escape only `"`, `\\` and
control characters, with the same short forms and lowercase `\\u00XX`. The checked manifest
comes from `kernelize.manifest.parse_manifest_toml`.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from typing import Any

from .manifest import canonical_manifest

DIGEST_PREFIX = "sha256:"
_DOMAIN = b"kernelize-kernel-v1\0"


class DigestMismatch(Exception):
    """A downloaded or pinned kernel whose content does not hash to its digest."""


def manifest_json_bytes(manifest: dict[str, Any]) -> bytes:
    """serde_json::to_vec(&manifest) for a checked manifest."""
    return json.dumps(canonical_manifest(manifest), separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8")


def digest_of(manifest: dict[str, Any], source: str) -> str:
    """`sha256:<hex>` over the canonical encoding (kernel-registry `digest_of`)."""
    m = manifest_json_bytes(manifest)
    s = source.encode("utf-8")
    h = hashlib.sha256()
    h.update(_DOMAIN)
    h.update(struct.pack("<Q", len(m)))
    h.update(m)
    h.update(struct.pack("<Q", len(s)))
    h.update(s)
    return DIGEST_PREFIX + h.hexdigest()


def normalize_digest(d: str) -> str:
    hexpart = d[len(DIGEST_PREFIX):] if d.startswith(DIGEST_PREFIX) else d
    if not re.fullmatch(r"[0-9a-f]{64}", hexpart):
        raise ValueError(f"`{d}` is not a digest: sha256:<64 lowercase hex digits>")
    return DIGEST_PREFIX + hexpart


def check_digest(manifest: dict[str, Any], source: str, expected: str, what: str = "kernel") -> str:
    """Recompute the digest; raise DigestMismatch when the content is not what was pinned."""
    expected = normalize_digest(expected)
    actual = digest_of(manifest, source)
    if actual != expected:
        raise DigestMismatch(
            f"{what}: content hashes to {actual}, not the expected {expected}; "
            "refusing it (tampered or corrupted download, or a stale lock)")
    return actual
