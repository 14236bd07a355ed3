"""Verification certificates in the client: kernels taken from a hub or a lock only when a
trusted worker key certifies their report and source; every tampering refused. Against a real
`kernelize serve`, with reports signed by `kernelize cert sign` (the CI has no GPU)."""

import base64
import copy
import json

import pytest

import kernelize
from kernelize import CertificateError
from kernelize.certs import canonical_sha256, parse_key_list, verify

transformers = pytest.importorskip("transformers")
pytest.importorskip("cryptography")
pytest.importorskip("rfc8785")


def by_path(report):
    return {e.path: e for e in report.entries}


def test_the_canonical_digest_is_the_hubs():
    # The same input and digest as kernel_registry::cert's the_canonical_digest_is_pinned.
    v = json.loads(r'{"z": [1, 2.5, 1e21, 1.0, -0.0, "é\u0001"], '
                   r'"a": {"seed": 18446744073709551615, "f": 0.1}}')
    assert canonical_sha256(v) == "185591ca3e49ce3f6071872be7ad55eaae24ba06bdd9edd02439ae3c715963e2"
    # a seed beyond doubles changed by one changes the digest
    w = copy.deepcopy(v)
    w["a"]["seed"] -= 1
    assert canonical_sha256(w) != canonical_sha256(v)


def test_hub_kernels_need_a_certificate_from_a_trusted_key(hub, tiny_llama, tmp_path):
    key = tmp_path / "w.key"
    public = hub.worker_key(key)
    signed = hub.verify_as_worker({"rms_norm_llama"}, report="tiny/exact", key_file=key)
    hub.verify_as_worker({"silu_and_mul", "silu_mul"}, report="tiny/exact")  # unsigned
    rep = by_path(kernelize.kernelize(tiny_llama, hub=hub.url, arch="sm_90", verbose=False,
                                      trusted_keys=[public]))
    norm, mlp = rep["model.norm"], rep["model.layers.0.mlp"]
    assert norm.status == "would replace" and norm.kernel.digest == signed["rms_norm_llama"]
    cert = norm.kernel.evidence["certificate"]
    assert json.loads(cert["claims"])["kernel_digest"] == signed["rms_norm_llama"]
    assert mlp.status == "kept"
    assert any("not signed by a worker key" in r for r in mlp.reasons), mlp.reasons
    # without trusted keys the unsigned verification counts as before
    plain = by_path(kernelize.kernelize(tiny_llama, hub=hub.url, arch="sm_90", verbose=False))
    assert plain["model.layers.0.mlp"].status == "would replace"
    # another key: nothing is trusted
    other = base64.b64encode(bytes(range(32))).decode()
    rep = by_path(kernelize.kernelize(tiny_llama, hub=hub.url, arch="sm_90", verbose=False,
                                      trusted_keys=[other]))
    assert rep["model.norm"].status == "kept"
    assert any("not among the trusted keys" in r for r in rep["model.norm"].reasons)


def test_a_certified_lock_is_checked_offline_and_refuses_tampering(hub, tiny_llama, tmp_path):
    key = tmp_path / "w.key"
    public = hub.worker_key(key)
    hub.verify_as_worker({"rms_norm_llama", "silu_mul"}, report="tiny/exact", key_file=key)
    path = tmp_path / "kernelize.lock.json"
    kernelize.lock(tiny_llama, hub=hub.url, path=path, arch="sm_90", trusted_keys=[public])
    hub.proc.terminate()
    hub.proc.wait(10)  # offline from here on
    data = json.loads(path.read_text())
    assert data["trusted_keys"] == [public]
    ok = by_path(kernelize.kernelize(tiny_llama, lock=path, arch="sm_90", verbose=False))
    assert ok["model.norm"].status == "would replace"

    def refused(change, match, **kw):
        d = copy.deepcopy(data)
        entry = next(e for e in d["resolutions"] if e.get("digest"))
        change(d, entry)
        bad = tmp_path / "bad.lock.json"
        bad.write_text(json.dumps(d))
        with pytest.raises(CertificateError, match=match):
            kernelize.kernelize(tiny_llama, lock=bad, arch="sm_90", verbose=False, **kw)

    def report_figure(d, e):
        e["evidence"]["report"]["cases"][0]["exactness"]["mismatches"] += 1

    def claimed_class(d, e):
        c = json.loads(e["evidence"]["certificate"]["claims"])
        c["class"] = "bit_exact"
        c["kernel"] += "x"
        e["evidence"]["certificate"]["claims"] = json.dumps(c)

    def signer(d, e):
        e["evidence"]["certificate"]["key"] = base64.b64encode(bytes(32)).decode()

    def swapped(d, e):
        # another kernel's (valid) certificate and report moved onto this entry
        other = next(x for x in d["resolutions"] if x.get("digest") not in (None, e["digest"]))
        e["evidence"]["certificate"] = other["evidence"]["certificate"]
        e["evidence"]["report"] = other["evidence"]["report"]

    def unsigned(d, e):
        e["evidence"].pop("certificate")

    refused(report_figure, "the report is not the one certified")
    refused(claimed_class, "signature does not verify")
    refused(signer, "not among the trusted keys|signature does not verify")
    refused(unsigned, "none; the verification was not signed")
    # trusting another key than the lock's own: the caller's keys win
    other = base64.b64encode(bytes(range(32))).decode()
    refused(lambda d, e: None, "not among the trusted keys", trusted_keys=[other])
    refused(swapped, "the kernel is not the one certified")


def test_verify_names_what_is_missing_or_malformed():
    with pytest.raises(CertificateError, match="none"):
        verify(None, ["x"])
    with pytest.raises(CertificateError, match="not a certificate"):
        verify({"claims": "{}"}, [base64.b64encode(bytes(32)).decode()])
    with pytest.raises(CertificateError, match="not an ed25519 public key"):
        verify({"claims": "{}", "key": "short", "signature": ""}, ["also-short"])


def test_a_fresh_hub_hands_out_the_bundled_certified_kernels(fresh_hub, tiny_llama):
    from conftest import REPO
    keys = parse_key_list((REPO / "kernels/certificates/trusted-keys.txt").read_text())
    rep = by_path(kernelize.kernelize(tiny_llama, hub=fresh_hub.url, arch="sm_90", verbose=False,
                                      trusted_keys=keys))
    norm = rep["model.norm"]
    assert norm.status == "would replace", norm.reasons
    assert norm.kernel.name == "rms_norm_llama" and norm.kernel.evidence["device"] == "NVIDIA H200"
    claims = json.loads(norm.kernel.evidence["certificate"]["claims"])
    assert (claims["arch"], claims["class"]) == ("sm_90", "bit_exact")
    # not on another architecture: the recorded verdicts are sm_90's
    rep80 = by_path(kernelize.kernelize(tiny_llama, hub=fresh_hub.url, arch="sm_80", verbose=False))
    assert rep80["model.norm"].status == "kept"


def _signed(claims: dict):
    """A certificate over `claims` by a fresh key, and that key (base64)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
    k = Ed25519PrivateKey.generate()
    public = base64.b64encode(k.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
    text = json.dumps(claims)
    cert = {"claims": text, "key": public,
            "signature": base64.b64encode(k.sign(text.encode())).decode()}
    return cert, public


def test_both_certificate_formats_are_read_each_in_its_own_shape():
    # Issue 26: /2 names the hub's job and its claim's nonce, /1 (bundled) names none.
    base = {"report_sha256": "00" * 32, "kernel_digest": "sha256:" + "ab" * 32, "kernel": "k@1.0.0",
            "class": "bit_exact", "signed_at": "2026-11-27T00:00:00Z"}
    for claims in ({"format": "kernelize-certificate/1", **base},
                   {"format": "kernelize-certificate/2", "job_id": 12, "nonce": "00ff", **base}):
        cert, public = _signed(claims)
        assert verify(cert, [public]) == claims
    for claims, why in [
        ({"format": "kernelize-certificate/1", "job_id": 12, **base}, "names no job"),
        ({"format": "kernelize-certificate/2", "job_id": 12, **base}, "needs a positive job_id"),
        ({"format": "kernelize-certificate/2", "nonce": "00ff", **base}, "needs a positive job_id"),
        ({"format": "kernelize-certificate/2", "job_id": 0, "nonce": "00ff", **base},
         "needs a positive job_id"),
        ({"format": "kernelize-certificate/2", "job_id": 12, "nonce": "", **base},
         "needs a positive job_id"),
        ({"format": "kernelize-certificate/3", **base}, "expected one of"),
    ]:
        cert, public = _signed(claims)
        with pytest.raises(CertificateError, match=why):
            verify(cert, [public])


def test_a_workers_certificate_names_its_job_and_claim(hub, tmp_path):
    key = tmp_path / "w.key"
    public = hub.worker_key(key)
    signed = hub.verify_as_worker({"rms_norm_llama"}, report="tiny/exact", key_file=key)
    status, v = hub.call("GET", "/v1/verifications/1")
    assert status == 200, v
    claims = verify(v["certificate"], [public], report=v["report"], digest=signed["rms_norm_llama"])
    assert claims["format"] == "kernelize-certificate/2"
    assert claims["job_id"] == v["job_id"]
    assert len(claims["nonce"]) == 32 and int(claims["nonce"], 16) >= 0


def test_the_key_list_rule_is_the_hubs():
    """`#` starts a comment anywhere on a line, blank lines are skipped (kernel_registry's
    cert::parse_key_list)."""
    text = "# header\n\nAAAA=\n  BBBB=  # session 12's worker\n#CCCC=\n"
    assert parse_key_list(text) == ["AAAA=", "BBBB="]


def test_every_bundled_certificate_is_signed_by_a_trusted_key_for_its_kernel():
    """Each committed certificate verifies offline against kernels/certificates/trusted-keys.txt,
    for its report and the digest of the kernel folder it names (what a fresh hub imports)."""
    import glob
    from conftest import REPO
    from kernelize.digest import digest_of
    from kernelize.manifest import parse_manifest_toml
    keys = parse_key_list((REPO / "kernels/certificates/trusted-keys.txt").read_text())
    files = sorted(glob.glob(str(REPO / "kernels/certificates/sm_90/*.json")))
    assert len(files) >= 16
    for f in files:
        v = json.load(open(f))
        name, version = v["report"]["kernel"]["name"], v["report"]["kernel"]["version"]
        folder = REPO / "kernels" / name
        manifest = parse_manifest_toml((folder / "kernel.toml").read_text())
        assert manifest["version"] == version, f"{f}: certifies {version}, the folder is {manifest['version']}"
        digest = digest_of(manifest, (folder / manifest["source"]).read_text())
        claims = verify(v["certificate"], keys, report=v["report"], digest=digest)
        assert claims["arch"] == "sm_90", f
