"""The client against a real `kernelize serve` (the repo's binary), lock files and local
kernel folders. No GPU: kernelize reports what it would replace and swaps nothing."""

import json
import logging
import threading
import time
import urllib.request

import pytest
import torch

import kernelize
from kernelize import DigestMismatch, HubSource
from kernelize.digest import digest_of
from conftest import REPO, retarget, tiny_gemma

transformers = pytest.importorskip("transformers")


def by_path(report):
    return {e.path: e for e in report.entries}


def v(name):
    """`name version` of the bundled kernel, as the hub names it in its reasons."""
    import tomllib
    with open(REPO / "kernels" / name / "kernel.toml", "rb") as f:
        return f"{name} {tomllib.load(f)['version']}"


def test_unverified_bundled_kernels_are_never_handed_out(hub, tiny_llama, capsys):
    rep = kernelize.kernelize(tiny_llama, hub=hub.url, arch="sm_90")
    assert rep.replaced == [] and not rep.swapped
    e = by_path(rep)["model.norm"]
    assert e.status == "kept" and e.op == "rms_norm" and e.semantics == "llama"
    assert any(r.startswith(f"{v('rms_norm_llama')}: never verified") for r in e.reasons)
    mlp = by_path(rep)["model.layers.0.mlp"]
    assert any(r.startswith(f"{v('silu_and_mul')}: never verified") for r in mlp.reasons)
    out = capsys.readouterr().out
    assert "0 of 7 layers would be replaced" in out and "never verified" in out
    # nothing was touched
    assert "forward" not in tiny_llama.model.norm.__dict__


def test_verified_kernels_resolve_on_their_arch_only(hub, tiny_llama):
    digests = hub.verify_as_worker({"rms_norm_llama", "silu_and_mul"}, arch="sm_90",
                                 report="tiny/exact")
    rep = kernelize.kernelize(tiny_llama, hub=hub.url, arch="sm_90", verbose=False)
    entries = by_path(rep)
    norm, mlp = entries["model.layers.1.post_attention_layernorm"], entries["model.layers.1.mlp"]
    assert norm.status == "would replace" and norm.kernel.name == "rms_norm_llama"
    assert norm.kernel.digest == digests["rms_norm_llama"]
    assert digest_of(norm.kernel.manifest, norm.kernel.source) == norm.kernel.digest
    assert norm.kernel.evidence["class"] and norm.kernel.evidence["verification_id"]
    # the recorded report is of an older suite than the hub's verifier: the report says so
    assert any("suite" in w for w in norm.kernel.evidence["stale"])
    assert "! stale verdict: measured by suite" in str(rep)
    assert mlp.status == "would replace" and mlp.kernel.digest == digests["silu_and_mul"]
    assert len(rep.replaced) == 7
    # another architecture: the sm_90 evidence does not count
    rep80 = kernelize.kernelize(tiny_llama, hub=hub.url, arch="sm_80", verbose=False)
    assert rep80.replaced == []
    assert any("not verified on sm_80 (only on sm_90)" in r for r in by_path(rep80)["model.norm"].reasons)
    # a model in f16: the recorded report has bf16 cases only, so bit_exact is not shown for f16
    rep16 = kernelize.kernelize(tiny_llama, hub=hub.url, arch="sm_90", dtype="f16", verbose=False)
    assert rep16.replaced == []


def test_gated_mlps_take_the_two_input_kernel_and_fall_back_to_silu_and_mul(hub, tiny_llama):
    # only silu_and_mul verified: the MLP falls back to it (gate and up concatenated), and the
    # report says why silu_mul was not taken
    hub.verify_as_worker({"silu_and_mul"}, report="tiny/exact")
    mlp = by_path(kernelize.kernelize(tiny_llama, hub=hub.url, arch="sm_90", verbose=False))[
        "model.layers.0.mlp"]
    assert (mlp.status, mlp.op, mlp.kernel.name) == ("would replace", "silu_and_mul", "silu_and_mul")
    assert mlp.tried == ["silu_mul", "silu_and_mul"]
    assert any(r.startswith(f"{v('silu_mul')}: never verified") for r in mlp.reasons)
    # silu_mul verified too: it is the first choice (no concatenation)
    digests = hub.verify_as_worker({"silu_mul"}, report="tiny/exact")
    rep = kernelize.kernelize(tiny_llama, hub=hub.url, arch="sm_90", verbose=False)
    mlp = by_path(rep)["model.layers.1.mlp"]
    assert (mlp.status, mlp.op, mlp.tried) == ("would replace", "silu_mul", ["silu_mul"])
    assert mlp.kernel.digest == digests["silu_mul"]
    assert f"-> {v('silu_mul')} {digests['silu_mul'][:19]}" in str(rep)


@pytest.mark.parametrize("names,path,op,tried", [
    (["gelu_tanh_mul", "gelu_tanh", "rms_norm_gemma"], "model.layers.0.mlp", "gelu_tanh_mul",
     ["gelu_tanh_mul"]),
    (["gelu_tanh", "rms_norm_gemma"], "model.layers.0.mlp.act_fn", "gelu_tanh",
     ["gelu_tanh_mul", "gelu_tanh"]),
])
def test_gemma_mlp_takes_gelu_tanh_mul_or_its_act_fn_a_gelu_tanh_kernel(names, path, op, tried):
    rep = kernelize.kernelize(tiny_gemma(), kernels_dir=REPO / "kernels", names=names,
                              arch="sm_90", verbose=False)
    e = by_path(rep)
    assert (e[path].status, e[path].op, e[path].kernel.name, e[path].tried) == (
        "would replace", op, op, tried)
    assert e["model.norm"].kernel.name == "rms_norm_gemma"
    # one replacement per MLP, never both the MLP and its act_fn
    assert len([p for p in e if p.startswith("model.layers.0.mlp")]) == 1


def test_policy_picks_between_exact_and_faster_inexact(hub, tiny_llama):
    hub.verify_as_worker({"rms_norm_llama"}, report="tiny/exact")
    hub.verify_as_worker({"rms_norm_llama_wbr"}, report="tiny/one_ulp_fast")
    exact = by_path(kernelize.kernelize(tiny_llama, hub=hub.url, arch="sm_90", verbose=False))
    assert exact["model.norm"].kernel.name == "rms_norm_llama"
    assert any(r.startswith(f"{v('rms_norm_llama_wbr')}:") for r in exact["model.norm"].reasons)
    loose = by_path(kernelize.kernelize(tiny_llama, hub=hub.url, arch="sm_90", policy="ulp:1",
                                        verbose=False))
    assert loose["model.norm"].kernel.name == "rms_norm_llama_wbr"  # faster, within 1 ulp


def test_a_tampered_hub_source_is_refused(hub, tiny_llama, monkeypatch):
    hub.verify_as_worker({"rms_norm_llama"}, report="tiny/exact")
    real_get = HubSource._get

    def evil_get(self, path):
        status, body = real_get(self, path)
        if path.startswith("/v1/sources/"):
            body["source"] = body["source"].replace("rsqrtf(", "rsqrtf(0.5f + ", 1)
        return status, body

    monkeypatch.setattr(HubSource, "_get", evil_get)
    with pytest.raises(DigestMismatch, match="refusing"):
        kernelize.kernelize(tiny_llama, hub=hub.url, arch="sm_90", verbose=False)


def test_bad_query_and_swap_without_cuda_are_clear_errors(hub, tiny_llama):
    with pytest.raises(kernelize.HubError, match="400"):
        kernelize.kernelize(tiny_llama, hub=hub.url, arch="sm_9x", verbose=False)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            kernelize.kernelize(tiny_llama, hub=hub.url, arch="sm_90", swap=True)
        with pytest.raises(ValueError, match="arch"):
            kernelize.kernelize(tiny_llama, hub=hub.url)
    with pytest.raises(ValueError, match="exactly one"):
        kernelize.kernelize(tiny_llama, hub=hub.url, lock="x.json")


def test_lock_round_trip_offline(hub, tiny_llama, tmp_path):
    hub.verify_as_worker({"rms_norm_llama"}, report="tiny/exact")
    path = tmp_path / "kernelize.lock.json"
    kernelize.lock(tiny_llama, hub=hub.url, path=path, arch="sm_90")
    online = by_path(kernelize.kernelize(tiny_llama, hub=hub.url, arch="sm_90", verbose=False))
    hub.proc.terminate()
    hub.proc.wait(10)  # offline from here on
    offline = by_path(kernelize.kernelize(tiny_llama, lock=path, arch="sm_90", verbose=False))
    assert {p: (e.status, e.kernel and e.kernel.digest) for p, e in offline.items()} == \
           {p: (e.status, e.kernel and e.kernel.digest) for p, e in online.items()}
    assert offline["model.norm"].status == "would replace"
    # the unverified MLP kernel's reasons were locked too
    assert any("never verified" in r for r in offline["model.layers.0.mlp"].reasons)
    # asking the lock for something it was not locked for: kept, with the reason
    other = by_path(kernelize.kernelize(tiny_llama, lock=path, arch="sm_80", verbose=False))
    assert other["model.norm"].status == "kept" and "not in lock" in other["model.norm"].reasons[0]

    data = json.loads(path.read_text())
    (digest, k), = data["kernels"].items()
    k["source"] = k["source"].replace("rsqrtf(", "rsqrtf(2.0f * ", 1)
    path.write_text(json.dumps(data))
    with pytest.raises(DigestMismatch, match="refusing"):
        kernelize.kernelize(tiny_llama, lock=path, arch="sm_90", verbose=False)


def test_local_kernel_folder_gives_the_hubs_digests(hub, tiny_llama):
    listed = json.load(urllib.request.urlopen(hub.url + "/v1/kernels?limit=500"))["kernels"]
    hub_digest = {k["name"]: k["digest"] for k in listed}
    rep = kernelize.kernelize(tiny_llama, kernels_dir=REPO / "kernels",
                              names=["rms_norm_llama", "silu_and_mul"], arch="sm_90", verbose=False)
    e = by_path(rep)
    assert e["model.norm"].status == "would replace"
    assert e["model.norm"].kernel.digest == hub_digest["rms_norm_llama"]
    assert e["model.layers.0.mlp"].kernel.digest == hub_digest["silu_and_mul"]
    assert "unverified" in e["model.norm"].kernel.evidence["class"]
    # without names, several llama RMSNorm kernels match: ambiguous, left alone
    amb = by_path(kernelize.kernelize(tiny_llama, kernels_dir=REPO / "kernels", arch="sm_90",
                                      verbose=False))
    assert amb["model.norm"].status == "kept"
    assert "choose with names" in amb["model.norm"].reasons[-1]


def jobs_of(hub, name):
    """The verification jobs the hub holds for the bundled kernel `name`."""
    status, k = hub.call("GET", "/v1/kernels/" + v(name).replace(" ", "/"))
    assert status == 200, k
    return k["jobs"]


def test_an_unverified_width_queues_nothing_without_a_token_and_says_how(hub, tiny_llama,
                                                                          monkeypatch):
    # Issue 27 item 5: a resolve is a read; without a token the client asks for no GPU work.
    monkeypatch.delenv("KERNELIZE_TOKEN", raising=False)
    hub.verify_as_worker({"rms_norm_llama"}, report="exact")
    before = jobs_of(hub, "rms_norm_llama")
    # Neither a swap without a token (device="cpu" swaps Python candidates only) nor a dry run
    # (no CUDA, swap=None: would replace) queues anything.
    for kw in ({"swap": True, "device": "cpu"}, {}):
        norm = by_path(kernelize.kernelize(tiny_llama, hub=hub.url, arch="sm_90", verbose=False,
                                           **kw))["model.norm"]
        assert norm.status == "kept"
        assert any(r.startswith(f"{v('rms_norm_llama')}: verified at cols 8192 for bf16 on sm_90, "
                                "not at 64") for r in norm.reasons), norm.reasons
        note = norm.width_note
        assert "\n" not in note and "nothing queued" in note, note
        assert "/v1/resolve/verifications" in note and '"cols": 64' in note, note
        assert ("KERNELIZE_TOKEN" in note) == bool(kw), note
    # A dry run with a token asks for nothing either.
    src = HubSource(hub.url, token=hub.token("submit"))
    norm = by_path(kernelize.kernelize(tiny_llama, hub=src, arch="sm_90", verbose=False,
                                       swap=False))["model.norm"]
    assert "nothing queued (a dry run" in norm.width_note, norm.width_note
    assert src.request_widths  # the caller's source is left as it was
    assert jobs_of(hub, "rms_norm_llama") == before
    # A token without scope submit: the hub refuses, the report says so, nothing queued.
    wrong = HubSource(hub.url, token=hub.token("worker"))
    norm = by_path(kernelize.kernelize(tiny_llama, hub=wrong, arch="sm_90", verbose=False,
                                       swap=True, device="cpu"))["model.norm"]
    assert "refused to queue" in norm.width_note and "403" in norm.width_note, norm.width_note
    assert jobs_of(hub, "rms_norm_llama") == before


def test_an_unverified_width_is_asked_for_with_a_token_and_the_client_can_wait_for_it(
        hub, tiny_llama, caplog):
    # Verified at cols 8192 only: the tiny model's RMSNorm (cols 64) is a width never run.
    hub.verify_as_worker({"rms_norm_llama"}, report="exact")
    submit = hub.token("submit")
    caplog.set_level(logging.WARNING, logger="kernelize")
    # device="cpu", swap=True: not a dry run (CUDA kernels are then kept, saying why).
    run = dict(arch="sm_90", verbose=False, swap=True, device="cpu")
    rep = by_path(kernelize.kernelize(tiny_llama, hub=HubSource(hub.url, token=submit), **run))
    norm = rep["model.norm"]
    assert norm.status == "kept"
    assert any(r.startswith(f"{v('rms_norm_llama')}: verified at cols 8192 for bf16 on sm_90, not at 64")
               for r in norm.reasons), norm.reasons
    assert "/v1/jobs/" in norm.width_note and "not waiting" in norm.width_note, norm.width_note
    assert "asked for and queued" in norm.width_note, norm.width_note
    job_url = norm.width_note.split(f"{v('rms_norm_llama')}: ")[1].split(")")[0].split(";")[0]
    job = json.load(urllib.request.urlopen(job_url))
    assert job["state"] == "queued"
    assert job["shapes"] == [{"cols": 64, "rows_min": 1, "rows_max": 64}]
    logged = [r.getMessage() for r in caplog.records if r.name == "kernelize"]
    assert any("model.norm" in m and "cols=64" in m and job_url in m and "keeping the layer" in m
               for m in logged), logged
    # one line for the event, not one per layer (issue 27 item 7)
    assert sum("cols=64" in m and "rms_norm" in m for m in logged) == 1, logged
    assert any("layers)" in m for m in logged), logged
    # every rms_norm layer asked for the same width: one job, not one per layer
    assert len({e.width_note for e in rep.values() if e.width_note}) == 1

    # Waiting with no worker running: a short timeout, the layer is kept and it says so.
    t0 = time.monotonic()
    short = by_path(kernelize.kernelize(
        tiny_llama, hub=HubSource(hub.url, token=submit, wait_for_verification_s=0.5),
        **run))["model.norm"]
    assert time.monotonic() - t0 < 20
    assert short.status == "kept" and "timed out" in short.width_note, short.width_note

    # A GPU worker (simulated) takes the width job a moment later and reports a run covering 64.
    tok = hub.token("worker")
    fixture = json.loads((REPO / "tests/fixtures/reports/tiny/exact.json").read_text())
    done = []

    def worker():
        time.sleep(1.5)
        for _ in range(200):
            status, claim = hub.call("POST", "/v1/jobs/claim", {"worker": "pytest-width", "arch": "sm_90"},
                                     tok)
            if status == 204:
                time.sleep(0.2)
                continue
            if not claim["job"]["shapes"]:
                continue  # a suite job of another kernel: left leased
            r = retarget(fixture, claim)
            status, body = hub.call("POST", f"/v1/jobs/{claim['job']['id']}/report",
                                    {"lease_id": claim["lease_id"], "report": r}, tok)
            done.append((status, body))
            return

    t = threading.Thread(target=worker)
    t.start()
    waited = by_path(kernelize.kernelize(
        tiny_llama, hub=HubSource(hub.url, token=submit, wait_for_verification_s=60), **run))
    t.join(30)
    assert done and done[0][0] == 201, done
    norm = waited["model.norm"]
    # found and verified at 64 now; kept here only because this model runs on the CPU
    assert norm.kernel is not None and norm.kernel.name == "rms_norm_llama"
    assert norm.reasons == ["a CUDA kernel launches on a CUDA device; this model runs on the CPU"]
    assert "waited" in norm.width_note and "now verified" in norm.width_note, norm.width_note
    assert norm.kernel.evidence["coverage"]["cols"] == 64
    assert json.load(urllib.request.urlopen(job_url))["state"] == "done"
