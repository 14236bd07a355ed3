"""Offline checks of verification certificates (docs/trust.md, "Signed certificates").

A GPU worker signs each report with its own ed25519 key; the hub serves the certificate with
the verification. A certificate's claims bind the report by the SHA-256 of its RFC 8785
canonical JSON (integers outside +-(2^53 - 1) written as decimal strings first, as the hub
does), the kernel digest, the class and where and with what it was measured. Two formats are
read: `kernelize-certificate/2`, whose claims also name the hub's job and the nonce of its claim
(what a worker signs for a job: the hub refuses a certificate replayed for another job), and
`kernelize-certificate/1`, bound to no job (the bundled certificates of the project's GPU runs,
imported by a hub). `verify` checks all of it against the public keys the caller trusts. Needs the `cryptography` and `rfc8785`
packages (`pip install 'kernelize[certs]'`), imported only when a certificate is checked.
"""
from __future__ import annotations

import base64
import hashlib
import json
from typing import Any, Iterable

from .digest import normalize_digest

FORMAT_UNBOUND = "kernelize-certificate/1"
FORMAT_JOB = "kernelize-certificate/2"
FORMATS = (FORMAT_UNBOUND, FORMAT_JOB)
MAX_SAFE_INTEGER = 2**53 - 1


class CertificateError(ValueError):
    """A certificate is missing, malformed, untrusted, or does not certify what it is given."""


def _deps():
    try:
        import rfc8785
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    except ImportError as e:  # pragma: no cover - exercised only without the packages
        raise CertificateError(
            "checking certificates needs the `cryptography` and `rfc8785` packages: "
            "pip install 'kernelize[certs]' (or pip install cryptography rfc8785)") from e
    return rfc8785, Ed25519PublicKey, InvalidSignature


def _exact_integers(v: Any) -> Any:
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v if abs(v) <= MAX_SAFE_INTEGER else str(v)
    if isinstance(v, list):
        return [_exact_integers(x) for x in v]
    if isinstance(v, dict):
        return {k: _exact_integers(x) for k, x in v.items()}
    return v


def canonical_sha256(value: Any) -> str:
    """SHA-256 (hex) of a JSON value's RFC 8785 form, large integers as strings (the hub's
    `kernel_registry::cert::canonical_sha256`)."""
    rfc8785, _, _ = _deps()
    return hashlib.sha256(rfc8785.dumps(_exact_integers(value))).hexdigest()


def _key_bytes(key_b64: str, what: str) -> bytes:
    try:
        raw = base64.b64decode(key_b64.strip(), validate=True)
    except (ValueError, TypeError):
        raw = b""
    if len(raw) != 32:
        raise CertificateError(f"{what} `{key_b64}` is not an ed25519 public key "
                               "(32 bytes, standard base64)")
    return raw


def parse_key_list(text: str) -> list[str]:
    """The public keys of a trusted-keys file (kernels/certificates/trusted-keys.txt): one per
    line, `#` starts a comment anywhere on a line; the rule of the hub's
    `kernel_registry::cert::parse_key_list`."""
    keys = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [k for k in keys if k]


def key_id(key_b64: str) -> str:
    """The hub's short name of a public key (first 16 hex digits of SHA-256 of its text)."""
    return hashlib.sha256(key_b64.encode()).hexdigest()[:16]


def _report_claims(report: dict) -> dict[str, Any]:
    """The claims a report supports (what `Claims::of` takes from it), but for report_sha256
    and signed_at."""
    compiled = report.get("compiled") or []
    k = report["kernel"]
    d = report["device"]
    return {
        "kernel_digest": normalize_digest(k["digest"]),
        "kernel": f"{k['name']}@{k['version']}",
        "class": report["summary"]["overall"]["class"],
        "arch": d["arch"],
        "device": d["name"],
        "driver_version": d["driver_version"],
        "cuda_version": d["cuda_version"],
        "nvrtc_versions": sorted({c["nvrtc_version"] for c in compiled}),
        "verifier_version": report["verifier_version"],
        "suite_version": report["suite_version"],
        "compiled": [{"dtype": c["dtype"], "code_sha256": c["code_sha256"]} for c in compiled],
    }


def _check_format(claims: Any, what: str) -> None:
    """A known format, bound to a job exactly when the format says (the hub's `Claims::parse`)."""
    if not isinstance(claims, dict):
        raise CertificateError(f"{what}: the claims are not a JSON object")
    fmt = claims.get("format")
    bound = [k for k in ("job_id", "nonce") if claims.get(k) is not None]
    if fmt == FORMAT_UNBOUND:
        if bound:
            raise CertificateError(f"{what}: format {fmt!r} names no job, but the claims carry "
                                   f"{', '.join(bound)}")
    elif fmt == FORMAT_JOB:
        job, nonce = claims.get("job_id"), claims.get("nonce")
        if (not isinstance(job, int) or isinstance(job, bool) or job <= 0
                or not isinstance(nonce, str) or not nonce):
            raise CertificateError(f"{what}: format {fmt!r} needs a positive job_id and a "
                                   "non-empty nonce")
    else:
        raise CertificateError(f"{what}: format {fmt!r}, expected one of {', '.join(FORMATS)}")


def verify(certificate: dict | None, trusted_keys: Iterable[str], *, report: dict | None = None,
           digest: str | None = None, what: str = "the certificate") -> dict[str, Any]:
    """Check `certificate` (as the hub serves it: claims, key, signature) and return its claims.

    The signer must be one of `trusted_keys` (base64 public keys, as `kernelize worker-key init`
    prints them) and the signature must verify; with `report`, the report must be the one
    certified (its canonical digest and every claimed field); with `digest`, the kernel (its
    digest recomputed from manifest and source by the caller) must be the one certified.
    Raises `CertificateError` saying which check failed."""
    if not certificate:
        raise CertificateError(f"{what}: none; the verification was not signed by a worker key")
    _, Ed25519PublicKey, InvalidSignature = _deps()
    try:
        claims_text, key_b64, sig_b64 = (certificate["claims"], certificate["key"],
                                         certificate["signature"])
    except (KeyError, TypeError):
        raise CertificateError(f"{what}: not a certificate (claims, key, signature)") from None
    key = _key_bytes(key_b64, f"{what}'s key")
    trusted = {_key_bytes(k, "trusted key") for k in trusted_keys}
    if not trusted:
        raise CertificateError(f"{what}: no trusted key given; pass the worker keys you trust")
    if key not in trusted:
        raise CertificateError(f"{what} is signed by key {key_id(key_b64)}, "
                               "which is not among the trusted keys")
    try:
        sig = base64.b64decode(sig_b64, validate=True)
        Ed25519PublicKey.from_public_bytes(key).verify(sig, claims_text.encode("utf-8"))
    except (InvalidSignature, ValueError, TypeError):
        raise CertificateError(f"{what}: the signature does not verify (the claims, the "
                               "signature or the key were changed)") from None
    claims = json.loads(claims_text)
    _check_format(claims, what)
    if report is not None:
        got = canonical_sha256(report)
        if got != claims["report_sha256"]:
            raise CertificateError(f"{what}: the report is not the one certified (its canonical "
                                   f"SHA-256 is {got}, the certificate's {claims['report_sha256']})")
        for field, actual in _report_claims(report).items():
            claimed = claims.get(field)
            if field == "kernel_digest":
                claimed = normalize_digest(claimed)
            if claimed != actual:
                raise CertificateError(f"{what}: the certificate says {field} {claimed!r}, "
                                       f"the report {actual!r}")
    if digest is not None and normalize_digest(digest) != normalize_digest(claims["kernel_digest"]):
        raise CertificateError(f"{what}: the kernel is not the one certified (its digest is "
                               f"{digest}, the certificate's {claims['kernel_digest']})")
    return claims
