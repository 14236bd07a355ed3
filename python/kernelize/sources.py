"""Where kernels come from: a hub (REST), a lock file (pinned digests, offline) or a local
kernel folder. Every kernel handed to the patcher has had its digest recomputed here."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .certs import CertificateError, verify
from .pykernel import OPT_IN, is_python
from .digest import DigestMismatch, check_digest, digest_of, normalize_digest
from .manifest import VERDICT_ON_DEVICE, canonical_manifest, not_applicable, parse_manifest_toml


@dataclass(frozen=True)
class Key:
    """What is asked for one layer: the hub's resolve query."""
    op: str
    semantics: str
    dtype: str
    arch: str
    cols: int
    policy: str

    def query(self) -> dict[str, Any]:
        return {"op": self.op, "semantics": self.semantics, "dtype": self.dtype,
                "arch": self.arch, "cols": self.cols, "policy": self.policy}


@dataclass
class Resolved:
    """A kernel chosen for a key, its content checked against its digest."""
    name: str
    version: str
    digest: str
    # the manifest and the source stay out of the repr: `print(report.replaced)` would print
    # every kernel's whole CUDA source
    manifest: dict[str, Any] = field(repr=False)
    source: str = field(repr=False)
    origin: str                      # "hub URL", "lock PATH", "dir PATH"
    evidence: dict[str, Any] = field(default_factory=dict)  # class, device, verification_id, speed

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"


@dataclass
class Resolution:
    kernel: Resolved | None
    excluded: list[str]
    # Verifications of this width the hub queued (kernels that meet the policy but were not
    # verified at this row length): {"kernel", "job_id", "job_url", "shape", ...}.
    queued_jobs: list[dict[str, Any]] = field(default_factory=list)
    # What happened about an unverified width: waited for the jobs (and how they ended), or
    # did not wait; None when the width was not the issue.
    width_note: str | None = None
    # The hub's description of the explicit request that queues a verification of this width
    # ({"method", "url", "scope", "body"}), when a kernel meets the policy but was not verified
    # at it: a resolve (GET) never queues anything.
    request_verification: dict[str, Any] | None = None


class HubError(RuntimeError):
    """The hub answered with an error other than "no kernel qualifies" (404)."""


class HubRateLimited(HubError):
    """The hub answered 429 Too Many Requests (its rate limit: requests without a valid token
    per client address, or writes per token), also after one retry when it asked to wait at
    most `HubSource.rate_limit_wait_s`. `retry_after` is the hub's Retry-After in seconds (None
    when it sent none)."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


def retry_after_seconds(value: str | None) -> float | None:
    """A Retry-After header's wait in seconds: delta-seconds or an HTTP date (RFC 9110 10.2.3);
    None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        from email.utils import parsedate_to_datetime
        from datetime import datetime, timezone
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def _check_matches(key: Key, manifest: dict[str, Any], what: str) -> None:
    if manifest["op"] != key.op or manifest["semantics"] != key.semantics:
        raise DigestMismatch(f"{what}: is {manifest['op']} ({manifest['semantics']}), "
                             f"asked for {key.op} ({key.semantics}); refusing it")
    if key.dtype not in manifest["entries"]:
        raise DigestMismatch(f"{what}: has no {key.dtype} entry; refusing it")


class HubSource:
    """The hub's REST API. The hub hands a kernel out only at a row length it was verified at;
    asked for another, it answers 404 and queues nothing (a read has no side effect). With a
    token (`token=`, else the environment's KERNELIZE_TOKEN; scope `submit`) the client then
    asks for a verification of that width explicitly (POST /v1/resolve/verifications) and the
    report names the queued job; without one it says that nothing was queued and how to ask.
    `request_widths=False` never asks (a dry run: `kernelize(..., swap=False)` or no CUDA).
    `wait_for_verification_s` > 0 waits up to that long for the queued jobs (polling every
    `poll_s`), then asks again; 0 (the default) does not wait: the layer is kept this time, so a
    later run (or `kernelize(..., wait_for_verification_s=600)`) gets the kernel once a GPU
    worker has verified the width."""

    def __init__(self, url: str, timeout: float = 30.0, token: str | None = None,
                 wait_for_verification_s: float = 0.0, poll_s: float = 2.0,
                 trusted_keys: list[str] | None = None, allow_python: bool = False,
                 request_widths: bool = True, rate_limit_wait_s: float = 5.0):
        self.url = url.rstrip("/")
        # A 429 whose Retry-After is at most this many seconds is waited out and the request
        # sent once more; a longer one (or a second 429) raises HubRateLimited at once.
        self.rate_limit_wait_s = float(rate_limit_wait_s)
        self.request_widths = request_widths
        # Python candidates (docs/spec.md section 2b) run their code in this process: the hub is asked to
        # consider them (`runtime=any`) only when the caller opted in, and one handed out
        # anyway is refused.
        self.allow_python = allow_python
        # With trusted keys, a kernel is taken only when its verification carries a
        # certificate signed by one of them that certifies that verification's report and
        # this very source (certs.verify); the certificate and report go into the evidence
        # (and so into a lock).
        self.trusted_keys = list(trusted_keys or [])
        self.timeout = timeout
        self.token = token or os.environ.get("KERNELIZE_TOKEN")
        self.wait_for_verification_s = float(wait_for_verification_s)
        self.poll_s = float(poll_s)
        self._sources: dict[str, tuple[dict, str]] = {}

    def _get(self, path: str) -> tuple[int, Any]:
        return self._send(urllib.request.Request(self.url + path,
                                                 headers={"Accept": "application/json"}))

    def _post(self, path: str, body: Any) -> tuple[int, Any]:
        return self._send(urllib.request.Request(
            self.url + path, data=json.dumps(body).encode("utf-8"), method="POST",
            headers={"Accept": "application/json", "Content-Type": "application/json"}))

    def _send(self, req: urllib.request.Request) -> tuple[int, Any]:
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        status, body, retry_after = self._send_once(req)
        if status != 429:
            return status, body
        # Rate-limited. A short wait is waited out once; a long one is the caller's to decide.
        waited = None
        if retry_after is not None and retry_after <= self.rate_limit_wait_s:
            time.sleep(retry_after)
            waited = retry_after
            status, body, retry_after = self._send_once(req)
            if status != 429:
                return status, body
        raise HubRateLimited(self._rate_limited_message(req, body, retry_after, waited),
                             retry_after)

    def _send_once(self, req: urllib.request.Request) -> tuple[int, Any, float | None]:
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return r.status, json.loads(r.read().decode("utf-8")), None
        except urllib.error.HTTPError as e:
            raw = e.read().decode("utf-8", "replace")
            retry_after = retry_after_seconds(e.headers.get("Retry-After")) if e.headers else None
            try:
                body = json.loads(raw)
            except ValueError:
                body = {"detail": raw}
            if not isinstance(body, dict):
                body = {"detail": body}
            return e.code, body, retry_after
        except urllib.error.URLError as e:
            raise HubError(f"cannot reach the hub at {self.url}: {e.reason}") from None

    def _rate_limited_message(self, req: urllib.request.Request, body: dict[str, Any],
                              retry_after: float | None, waited: float | None) -> str:
        path = req.full_url[len(self.url):] if req.full_url.startswith(self.url) else req.full_url
        if len(path) > 120:
            path = path[:120] + "..."
        detail = str(body.get("detail") or "").strip()
        if len(detail) > 300:
            detail = detail[:300] + "..."
        when = (f"retry after {retry_after:.0f} s" if retry_after is not None
                else "the hub sent no Retry-After")
        if self.token:
            why = ("the hub limits writes per token (kernelize serve --write-rate-per-minute / "
                   "--write-burst)")
        else:
            why = ("the hub limits requests without a token per client address (kernelize serve "
                   "--anonymous-rate-per-minute / --anonymous-burst); requests with a valid token "
                   "are not limited by it: pass token= (HubSource(url, token=...)) or set "
                   "KERNELIZE_TOKEN")
        again = f"; already waited {waited:.0f} s and asked once more" if waited is not None else ""
        return (f"the hub at {self.url} rate-limited {req.get_method()} {path} "
                f"(429 Too Many Requests{': ' + detail if detail else ''}): {when}{again}; {why}")

    def source(self, digest: str) -> tuple[dict[str, Any], str]:
        """GET /v1/sources/{digest}; the content is re-hashed and must give that digest."""
        digest = normalize_digest(digest)
        if digest not in self._sources:
            status, body = self._get("/v1/sources/" + urllib.parse.quote(digest))
            if status != 200:
                raise HubError(f"GET /v1/sources/{digest}: {status} {body.get('detail', body)}")
            manifest = canonical_manifest(body["manifest"])
            check_digest(manifest, body["source"], digest, f"hub source {digest}")
            self._sources[digest] = (manifest, body["source"])
        return self._sources[digest]

    def wait_for_jobs(self, jobs: list[dict[str, Any]], timeout_s: float) -> dict[int, str]:
        """Poll GET /v1/jobs/{id} until every job is done or failed, or `timeout_s` passes;
        returns each job's last state."""
        deadline = time.monotonic() + timeout_s
        states: dict[int, str] = {int(j["job_id"]): "queued" for j in jobs}
        while True:
            for jid in [j for j, s in states.items() if s not in ("done", "failed")]:
                status, body = self._get(f"/v1/jobs/{jid}")
                if status != 200:
                    raise HubError(f"GET /v1/jobs/{jid}: {status} {body.get('detail', body)}")
                states[jid] = body.get("state", "?")
            if all(s in ("done", "failed") for s in states.values()) or time.monotonic() >= deadline:
                return states
            time.sleep(max(0.01, min(self.poll_s, deadline - time.monotonic())))

    def resolve(self, key: Key, device: tuple[int, int] | None = None) -> Resolution:
        """`device`: the GPU's (SMs, threads per SM), sent with the query of a backward op whose
        verdict depends on them (`VERDICT_ON_DEVICE`: the hub hands out such a kernel only for
        the figures its verification ran on)."""
        r = self._resolve_once(key, device)
        if r.kernel is not None or not r.request_verification:
            return r
        ask = r.request_verification
        width = f"cols={key.cols} ({key.dtype} on {key.arch})"
        how = (f"{ask.get('method', 'POST')} {self.url}{ask.get('url', '/v1/resolve/verifications')} "
               f"with {json.dumps(ask.get('body', {}), sort_keys=True)} and a token of scope "
               f"{ask.get('scope', 'submit')}")
        if not self.request_widths:
            r.width_note = (f"not verified at {width}; nothing queued (a dry run asks the hub for "
                            f"no GPU work); to ask for it: {how}")
            return r
        if not self.token:
            r.width_note = (f"not verified at {width}; nothing queued: the hub verifies a width "
                            f"only when asked with a token (pass token= or set KERNELIZE_TOKEN), "
                            f"or {how}")
            return r
        try:
            status, body = self._post(ask.get("url", "/v1/resolve/verifications"),
                                      ask.get("body", {}))
        except HubRateLimited as e:
            r.width_note = f"not verified at {width}; nothing queued: {e}"
            return r
        if status not in (200, 201):
            r.width_note = (f"not verified at {width}; the hub refused to queue its verification "
                            f"({status}: {body.get('detail', body)})")
            return r
        r.queued_jobs = list(body.get("queued_jobs") or [])
        if not r.queued_jobs:
            r.width_note = (f"not verified at {width}; nothing queued: "
                            f"{body.get('queue_full') or body.get('detail', '')}")
            return r
        jobs = ", ".join(f"{j.get('kernel', '?')}: {self.url}{j['job_url']}" for j in r.queued_jobs)
        if self.wait_for_verification_s <= 0:
            r.width_note = (f"not verified at {width}; verification asked for and queued ({jobs}); "
                            "not waiting (pass wait_for_verification_s=SECONDS to wait for it)")
            return r
        t0 = time.monotonic()
        states = self.wait_for_jobs(r.queued_jobs, self.wait_for_verification_s)
        waited = time.monotonic() - t0
        ended = ", ".join(f"job {j} {s}" for j, s in sorted(states.items()))
        again = self._resolve_once(key, device)
        if again.kernel is not None:
            again.width_note = (f"waited {waited:.0f} s for the verification of {width} ({ended}); "
                                "now verified")
            return again
        timed_out = any(s not in ("done", "failed") for s in states.values())
        again.width_note = (f"not verified at {width}; waited {waited:.0f} s for the verification "
                            f"({jobs}; {ended})" + ("; timed out" if timed_out else ""))
        again.queued_jobs = again.queued_jobs or r.queued_jobs
        return again

    def _resolve_once(self, key: Key, device: tuple[int, int] | None = None) -> Resolution:
        query = key.query()
        if self.allow_python:
            query["runtime"] = "any"
        if device is not None and key.op in VERDICT_ON_DEVICE:
            query["sms"], query["threads_per_sm"] = device
        status, body = self._get("/v1/resolve?" + urllib.parse.urlencode(query))
        if status == 404:
            excluded = body.get("excluded") or [body.get("detail", "no kernel qualifies")]
            return Resolution(None, list(excluded), list(body.get("queued_jobs") or []),
                              request_verification=body.get("request_verification"))
        if status != 200:
            raise HubError(f"GET /v1/resolve {key.query()}: {status} {body.get('detail', body)}")
        digest = normalize_digest(body["digest"])
        k = body["kernel"]
        manifest, source = self.source(digest)
        label = f"{k['name']} {k['version']} ({digest})"
        if (manifest["name"], manifest["version"]) != (k["name"], k["version"]):
            raise DigestMismatch(f"{label}: the source is {manifest['name']} {manifest['version']}")
        _check_matches(key, manifest, label)
        if is_python(manifest) and not self.allow_python:
            return Resolution(None, [f"{label}: {OPT_IN}"] + list(body.get("excluded") or []))
        evidence = {e: body.get(e) for e in ("policy", "class", "device", "verified_at",
                                             "verification_id", "verification_url", "speed",
                                             "coverage", "stale")}
        if self.trusted_keys:
            try:
                evidence.update(self._certified(body, digest, label))
            except CertificateError as e:
                return Resolution(None, [str(e)] + list(body.get("excluded") or []))
        if key.op in VERDICT_ON_DEVICE:
            # eager's dw order depends on the GPU's SM count and threads per SM: the verdict
            # holds for the figures it was measured with (the training plan compares them). The
            # answer names them (a hub before session 19's does not: then the report does).
            if body.get("device_sm_count") is not None:
                evidence["device_shape"] = {"name": body.get("device"),
                                            "sm_count": body["device_sm_count"],
                                            "threads_per_sm": body.get("device_threads_per_sm")}
            else:
                report = evidence.get("report")
                if report is None:
                    vid = body.get("verification_id")
                    status, v = self._get(f"/v1/verifications/{vid}")
                    if status != 200:
                        raise HubError(f"GET /v1/verifications/{vid}: {status} {v.get('detail', v)}")
                    report = v.get("report") or {}
                evidence["device_shape"] = device_shape_of(report)
        return Resolution(Resolved(k["name"], k["version"], digest, manifest, source,
                                   f"hub {self.url}", evidence),
                          list(body.get("excluded") or []), list(body.get("queued_jobs") or []))


    def _certified(self, body: dict[str, Any], digest: str, label: str) -> dict[str, Any]:
        """The resolved verification's certificate, checked against the trusted keys, its report
        and the kernel's digest (the source was re-hashed to it)."""
        vid = body.get("verification_id")
        status, v = self._get(f"/v1/verifications/{vid}")
        if status != 200:
            raise HubError(f"GET /v1/verifications/{vid}: {status} {v.get('detail', v)}")
        verify(v.get("certificate"), self.trusted_keys, report=v.get("report"), digest=digest,
               what=f"{label}: the certificate of verification {vid}")
        return {"certificate": v["certificate"], "report": v["report"]}


def device_shape_of(report: dict[str, Any]) -> dict[str, Any]:
    """The figures of the GPU a backward verification ran on that its verdict depends on (eager's
    column sum for dw is configured from them): name, SMs and threads per SM."""
    d = report.get("device") or {}
    return {"name": d.get("name"), "sm_count": d.get("sm_count"),
            "threads_per_sm": d.get("threads_per_sm")}


LOCK_FORMAT = 1


class LockSource:
    """A lock file: resolutions pinned by digest, with the kernels' content, for offline use.
    Every kernel's digest is recomputed on load; one that does not match refuses the lock."""

    def __init__(self, path: str | os.PathLike, trusted_keys: list[str] | None = None,
                 allow_python: bool = False):
        self.path = Path(path)
        self.allow_python = allow_python
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"lock file {self.path} not found; write one with "
                                    "kernelize.lock(model, hub=URL, path=...)") from None
        if data.get("kernelize_lock") != LOCK_FORMAT:
            raise ValueError(f"{self.path}: not a kernelize lock (format {LOCK_FORMAT})")
        self.data = data
        self.kernels: dict[str, tuple[dict, str, dict]] = {}
        for digest, k in data["kernels"].items():
            manifest = canonical_manifest(k["manifest"])
            check_digest(manifest, k["source"], digest, f"{self.path}: kernel {k.get('name')}")
            self.kernels[normalize_digest(digest)] = (manifest, k["source"], k)
        self.entries: dict[Key, dict] = {}
        for e in data["resolutions"]:
            key = Key(e["op"], e["semantics"], e["dtype"], e["arch"], int(e["cols"]), e["policy"])
            if e.get("digest") and normalize_digest(e["digest"]) not in self.kernels:
                raise ValueError(f"{self.path}: resolution {key} pins {e['digest']}, "
                                 "which the lock does not hold")
            self.entries[key] = e
        # Certificates: checked against the keys the caller trusts, else the lock's own
        # (`trusted_keys`, written by kernelize.lock with trusted keys). A tampered report,
        # source or key refuses the lock, as a tampered source does.
        self.trusted_keys = list(trusted_keys or data.get("trusted_keys") or [])
        if self.trusted_keys:
            for key, e in self.entries.items():
                if not e.get("digest"):
                    continue
                ev = e.get("evidence") or {}
                verify(ev.get("certificate"), self.trusted_keys, report=ev.get("report"),
                       digest=e["digest"], what=f"{self.path}: {e.get('kernel')} for {key}")

    def resolve(self, key: Key, device: tuple[int, int] | None = None) -> Resolution:
        # `device`: the lock holds one answer per key; the training plan compares the locked
        # verification's GPU figures itself (core.other_device_shape)
        e = self.entries.get(key)
        if e is None:
            return Resolution(None, [f"not in lock {self.path} (locked for: "
                                     f"{sorted({(k.op, k.semantics, k.dtype, k.arch, k.cols, k.policy) for k in self.entries})}); "
                                     "re-run kernelize.lock with the hub"])
        if not e.get("digest"):
            return Resolution(None, list(e.get("excluded") or ["no kernel qualified when locked"]))
        digest = normalize_digest(e["digest"])
        manifest, source, k = self.kernels[digest]
        _check_matches(key, manifest, f"{self.path}: {digest}")
        if is_python(manifest) and not self.allow_python:
            return Resolution(None, [f"{manifest['name']} {manifest['version']} (locked): {OPT_IN}"]
                              + list(e.get("excluded") or []))
        return Resolution(Resolved(manifest["name"], manifest["version"], digest, manifest, source,
                                   f"lock {self.path}", dict(e.get("evidence") or {})),
                          list(e.get("excluded") or []))


def write_lock(path: str | os.PathLike, hub: str, resolutions: dict[Key, Resolution],
               trusted_keys: list[str] | None = None) -> dict:
    kernels: dict[str, Any] = {}
    entries = []
    for key, r in sorted(resolutions.items(), key=lambda kv: tuple(str(x) for x in kv[0].query().values())):
        e: dict[str, Any] = dict(key.query())
        e["digest"] = r.kernel.digest if r.kernel else None
        e["excluded"] = r.excluded
        if r.kernel:
            e["kernel"] = r.kernel.label
            e["evidence"] = r.kernel.evidence
            kernels[r.kernel.digest] = {"name": r.kernel.name, "version": r.kernel.version,
                                        "manifest": r.kernel.manifest, "source": r.kernel.source}
        entries.append(e)
    data = {"kernelize_lock": LOCK_FORMAT, "hub": hub, "resolutions": entries, "kernels": kernels}
    if trusted_keys:
        data["trusted_keys"] = list(trusted_keys)
    Path(path).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return data


class DirSource:
    """A local folder of kernel folders (kernel.toml + .cu), read without a hub, or one kernel
    folder (a `path` that holds a kernel.toml itself). These kernels carry no verification:
    the policy cannot be checked, and the report says so. When several match a layer,
    `names` picks which (otherwise the layer is left alone). A broken kernel among many is
    reported in `errors` and skipped; a single kernel folder that is broken raises."""

    def __init__(self, path: str | os.PathLike, names: list[str] | None = None):
        self.path = Path(path)
        if not self.path.is_dir():
            raise FileNotFoundError(f"kernel folder {self.path} not found")
        self.names = set(names) if names is not None else None
        self.kernels: list[tuple[dict, str, str]] = []
        self.errors: list[str] = []
        single = (self.path / "kernel.toml").is_file()
        folders = [self.path] if single else sorted(
            p for p in self.path.iterdir() if (p / "kernel.toml").is_file())
        for d in folders:
            try:
                text = (d / "kernel.toml").read_text(encoding="utf-8")
                manifest = parse_manifest_toml(text)
                source = (d / manifest["source"]).read_text(encoding="utf-8")
                for dt, sym in manifest["entries"].items():
                    if is_python(manifest) and not any(
                            line.startswith(f"def {sym}(") for line in source.splitlines()):
                        raise ValueError(f"entry.{dt}: function `{sym}` is not defined in {manifest['source']}")
                    if sym not in source:
                        raise ValueError(f"entry.{dt}: symbol `{sym}` not in {manifest['source']}")
            except Exception as e:  # a broken folder is reported, not fatal
                if single:
                    raise ValueError(f"kernel folder {d}: {e}") from None
                self.errors.append(f"{d.name}: {e}")
                continue
            if self.names is None or manifest["name"] in self.names:
                self.kernels.append((manifest, source, digest_of(manifest, source)))
        if self.names is not None:
            missing = self.names - {m["name"] for m, _, _ in self.kernels}
            if missing:
                raise ValueError(f"{self.path}: no kernel named {sorted(missing)} "
                                 f"(errors: {self.errors})")

    def resolve(self, key: Key, device: tuple[int, int] | None = None) -> Resolution:
        # `device` is for a hub's backward answers: local kernels carry no verification
        excluded, ok = [], []
        for m, src, dg in self.kernels:
            if m["op"] != key.op or m["semantics"] != key.semantics:
                continue
            label = f"{m['name']} {m['version']}"
            if key.dtype not in m["entries"]:
                excluded.append(f"{label}: has no {key.dtype} entry")
            elif (why := not_applicable(m, key.cols, key.arch)):
                excluded.append(f"{label}: {why}")
            else:
                ok.append((m, src, dg))
        if len(ok) > 1:
            names = ", ".join(m["name"] for m, _, _ in ok)
            return Resolution(None, excluded + [
                f"{len(ok)} local kernels match ({names}); choose with names=[...]"])
        if not ok:
            return Resolution(None, excluded or [f"no kernel for {key.op} ({key.semantics}) in {self.path}"])
        m, src, dg = ok[0]
        return Resolution(Resolved(m["name"], m["version"], dg, m, src, f"dir {self.path}",
                                   {"class": "unverified local kernel (policy not checked)"}),
                          excluded)
