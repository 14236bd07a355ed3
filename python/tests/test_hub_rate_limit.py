"""The client against a hub that rate-limits it (429 Too Many Requests with Retry-After, the
hub's limit on requests without a valid token and on writes per token): a short wait is waited
out once, anything else raises `kernelize.HubRateLimited` saying what happened and what to do.
A tiny local HTTP server stands in for the hub; no GPU, no network."""

from __future__ import annotations

import json
import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import kernelize
from kernelize.sources import HubRateLimited, HubSource, Key, retry_after_seconds

KEY = Key("layer_norm", "default", "bf16", "sm_90", 64, "bit_exact")


class FakeHub:
    """Answers each request with the next of `answers` ((status, headers, body)), the last one
    repeated; records (method, path, authorization) of every request."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.requests: list[tuple[str, str, str | None]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                hub.requests.append((self.command, self.path, self.headers.get("Authorization")))
                status, headers, body = hub.answers[min(len(hub.requests), len(hub.answers)) - 1]
                raw = json.dumps(body).encode()
                self.send_response(status)
                ctype = "application/problem+json" if status >= 400 else "application/json"
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(raw)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = _answer

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def limited(seconds: str | None):
    headers = {} if seconds is None else {"Retry-After": seconds}
    return (429, headers, {"type": "about:blank", "title": "Too Many Requests", "status": 429,
                           "detail": "too many requests without a valid token from this address; "
                                     f"retry after {seconds} s"})


NOT_FOUND = (404, {}, {"detail": "no kernel qualifies", "excluded": ["layer_norm 1.0.0: never verified"]})


def test_a_long_retry_after_raises_at_once_saying_so():
    with FakeHub([limited("3600")]) as hub:
        t0 = time.monotonic()
        with pytest.raises(HubRateLimited) as e:
            HubSource(hub.url).resolve(KEY)
        assert time.monotonic() - t0 < 2, "did not wait an hour"
        assert len(hub.requests) == 1
    msg = str(e.value)
    assert e.value.retry_after == 3600
    assert isinstance(e.value, kernelize.HubError) and kernelize.HubRateLimited is HubRateLimited
    assert "429 Too Many Requests" in msg and "rate-limited GET /v1/resolve?" in msg
    assert "retry after 3600 s" in msg
    assert "without a token" in msg and "KERNELIZE_TOKEN" in msg


def test_a_short_retry_after_is_waited_out_once(monkeypatch):
    monkeypatch.delenv("KERNELIZE_TOKEN", raising=False)
    with FakeHub([limited("1"), NOT_FOUND]) as hub:
        t0 = time.monotonic()
        r = HubSource(hub.url).resolve(KEY)
        assert time.monotonic() - t0 >= 0.9
        assert [m for m, _, _ in hub.requests] == ["GET", "GET"]
    assert r.kernel is None and r.excluded == ["layer_norm 1.0.0: never verified"]


def test_limited_again_after_the_retry_raises():
    with FakeHub([limited("0")]) as hub:
        with pytest.raises(HubRateLimited, match=r"retry after 0 s; already waited 0 s and asked once more"):
            HubSource(hub.url).resolve(KEY)
        assert len(hub.requests) == 2, "one retry, not a loop"


def test_no_retry_after_and_an_http_date():
    with FakeHub([limited(None)]) as hub:
        with pytest.raises(HubRateLimited, match="the hub sent no Retry-After") as e:
            HubSource(hub.url).resolve(KEY)
        assert e.value.retry_after is None and len(hub.requests) == 1
    assert retry_after_seconds("120") == 120
    assert 50 < retry_after_seconds(formatdate(time.time() + 60, usegmt=True)) <= 61
    assert retry_after_seconds(formatdate(time.time() - 60, usegmt=True)) == 0
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None
    # waiting is the caller's choice: rate_limit_wait_s=0 never sleeps
    with FakeHub([limited("1"), NOT_FOUND]) as hub:
        with pytest.raises(HubRateLimited):
            HubSource(hub.url, rate_limit_wait_s=0).resolve(KEY)
        assert len(hub.requests) == 1


def test_with_a_token_the_message_names_the_per_token_write_limit():
    with FakeHub([limited("3600")]) as hub:
        with pytest.raises(HubRateLimited, match="limits writes per token") as e:
            HubSource(hub.url, token="kz_test").resolve(KEY)
        assert hub.requests[0][2] == "Bearer kz_test"
    assert "KERNELIZE_TOKEN" not in str(e.value)


def test_a_limited_verification_request_keeps_the_layer_with_one_line():
    # The width is not verified; the client has a token, asks for a verification and is
    # rate-limited: the layer is kept and the note says why, kernelize does not fail.
    unverified = (404, {}, {
        "detail": "no kernel qualifies", "excluded": ["layer_norm 1.0.0: verified at cols 4096, not at 64"],
        "request_verification": {"method": "POST", "url": "/v1/resolve/verifications", "scope": "submit",
                                 "body": KEY.query()}})
    with FakeHub([unverified, limited("3600")]) as hub:
        r = HubSource(hub.url, token="kz_test").resolve(KEY)
        assert [m for m, _, _ in hub.requests] == ["GET", "POST"]
    assert r.kernel is None and r.queued_jobs == []
    assert r.width_note.startswith("not verified at cols=64 (bf16 on sm_90); nothing queued: ")
    assert "429 Too Many Requests" in r.width_note and "retry after 3600 s" in r.width_note


def test_kernelize_says_the_hub_rate_limited_it():
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.LayerNorm(64)).to(torch.bfloat16)
    with FakeHub([limited("3600")]) as hub:
        with pytest.raises(kernelize.HubError, match="rate-limited GET /v1/resolve"):
            kernelize.kernelize(model, hub=hub.url, arch="sm_90", verbose=False)
