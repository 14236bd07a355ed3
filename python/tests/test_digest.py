"""The Python digest against digests computed by the Rust hub (fixture recorded from it)."""

import json
import re
import random
from pathlib import Path

import pytest

from kernelize.digest import DigestMismatch, check_digest, digest_of
from kernelize.manifest import ManifestError, canonical_manifest, launch_dims, not_applicable, parse_manifest_toml

CASES = json.loads((Path(__file__).parent / "fixtures" / "digests.json").read_text(encoding="utf-8"))["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_digest_matches_rust(case):
    assert digest_of(case["manifest"], case["source"]) == case["digest"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_toml_parses_to_the_same_canonical_manifest(case):
    m = parse_manifest_toml(case["manifest_toml"])
    assert m == canonical_manifest(case["manifest"])
    assert digest_of(m, case["source"]) == case["digest"]


def test_key_order_of_the_json_does_not_matter():
    case = CASES[0]
    items = list(case["manifest"].items())
    random.Random(0).shuffle(items)
    assert digest_of(dict(items), case["source"]) == case["digest"]


def test_odd_fixture_covers_escapes_and_defaults():
    odd = next(c for c in CASES if c["name"] == "odd-chars.kernel")
    m = odd["manifest"]
    assert "\t" in m["description"] and "\u0001" in m["description"] and "😀" in m["description"]
    assert m["constraints"]["archs"] == ["sm_80", "sm_90", "sm_100"]  # sorted, deduplicated
    assert m["license"] == "MIT"  # trimmed


@pytest.mark.parametrize("mutate", ["source", "description", "launch", "entries"])
def test_any_change_is_refused(mutate):
    case = CASES[1]
    m = json.loads(json.dumps(case["manifest"]))
    src = case["source"]
    if mutate == "source":
        src = src.replace("rsqrtf", "rsqrtf ", 1)
    elif mutate == "description":
        m["description"] += "."
    elif mutate == "launch":
        m["launch"][0]["block"][0] += 32
    else:
        m["entries"]["bf16"] = "evil"
    with pytest.raises(DigestMismatch, match="refusing"):
        check_digest(m, src, case["digest"])


def test_manifest_errors_name_the_field():
    base = next(c for c in CASES if c["name"] == "silu")["manifest_toml"]
    with pytest.raises(ManifestError, match="op"):
        parse_manifest_toml(base.replace('op = "silu"', 'op = "silly"'))
    with pytest.raises(ManifestError, match="unknown field"):
        parse_manifest_toml(base + "\nextra = 1\n")
    with pytest.raises(ManifestError, match="nvrtc_options"):
        parse_manifest_toml(base.replace('source = "kernel.cu"', 'source = "kernel.cu"\nnvrtc_options = ["-arch=sm_90"]'))
    with pytest.raises(ManifestError, match="verifier's"):
        parse_manifest_toml(base.replace('source = "kernel.cu"', 'source = "kernel.cu"\nnvrtc_options = ["-DKERNELIZE_DTYPE_F16"]'))


def test_length_limits_are_the_registrys():
    """MANIFEST_LIMITS holds Manifest::parse's constants, read from the Rust source."""
    from kernelize.manifest import MANIFEST_LIMITS
    rust = (Path(__file__).parents[2] / "kernel-registry" / "src" / "manifest.rs").read_text(encoding="utf-8")
    consts = {k: int(v) for k, v in re.findall(r"pub const (MAX_[A-Z_]+): usize = (\d+);", rust)}
    for k, v in MANIFEST_LIMITS.items():
        assert consts.get(k) == v, (k, v, consts.get(k))
    assert set(MANIFEST_LIMITS) == set(consts) - {"MAX_REQUIRES"}, set(consts) ^ set(MANIFEST_LIMITS)


def test_length_limits_name_the_field_like_the_hub():
    from kernelize.manifest import MANIFEST_LIMITS as L
    base = next(c for c in CASES if c["name"] == "silu")["manifest_toml"]
    version = re.search(r'^version = "([^"]*)"', base, re.M).group(0)
    long_pre = "1.0.0-" + "a" * 10_000
    with pytest.raises(ManifestError, match=r"field `version`: is 10006 bytes long; at most 64"):
        parse_manifest_toml(base.replace(version, f'version = "{long_pre}"'))
    at_limit = "1.0.0-" + "a" * (L["MAX_VERSION"] - 6)
    assert parse_manifest_toml(base.replace(version, f'version = "{at_limit}"'))["version"] == at_limit
    lic = re.search(r'^license = "([^"]*)"', base, re.M).group(0)
    with pytest.raises(ManifestError, match=r"field `license`: is \d+ bytes long; at most 200"):
        parse_manifest_toml(base.replace(lic, 'license = "' + " OR ".join(["MIT"] * 60) + '"'))
    desc = re.search(r'^description = .*$', base, re.M).group(0)
    with pytest.raises(ManifestError, match=r"field `description`: is 4097 bytes long"):
        parse_manifest_toml(base.replace(desc, 'description = "' + "d" * 4097 + '"'))
    # The SPDX check is the hub's (the digest module's docstring says why): a licence that is
    # not an SPDX expression parses here and is refused at submission.
    assert parse_manifest_toml(base.replace(lic, 'license = "Apache 2.0"'))["license"] == "Apache 2.0"


def test_entry_options_match_the_verifier():
    from kernelize.launch import entry_options
    assert entry_options(["--fmad=false"], "bf16") == ["--fmad=false", "-DKERNELIZE_DTYPE_BF16"]
    assert entry_options([], "f32") == ["-DKERNELIZE_DTYPE_F32"]


def test_launch_dims_and_constraints_follow_the_rules():
    llama = next(c for c in CASES if c["name"] == "rms_norm_llama")["manifest"]
    m = canonical_manifest(llama)
    # first rule whose cols_max >= cols; per_row: ceil(rows / rows_per_block)
    grid, block, smem = launch_dims(m, rows=10, cols=64, sm_count=132)
    rule = m["launch"][0]
    assert block == tuple(rule["block"])
    assert grid[0] == -(-10 // rule["grid"]["rows_per_block"])
    grid, block, _ = launch_dims(m, rows=10, cols=10**6, sm_count=132)
    assert block == tuple(m["launch"][-1]["block"])
    odd = canonical_manifest(next(c for c in CASES if c["name"] == "odd-chars.kernel")["manifest"])
    assert launch_dims(odd, 5, 1000, 132) == ((264, 1, 1), (128, 1, 1), 16 + 4 * 1000)
    assert not_applicable(odd, 12, None) == "cols 12 is not a multiple of 8"
    assert "sm_89" in not_applicable(odd, 16, "sm_89")
    assert not_applicable(odd, 16, "sm_90") is None


def test_every_bundled_kernel_has_the_digest_the_rust_hub_recorded():
    # kernels/released.toml holds the digest of every bundled (name, version), checked against
    # the Rust hub's digest_of by `cargo test -p kernelize --test bundled`; the client must
    # compute the same for every bundled kernel, whatever its op.
    import tomllib
    repo = Path(__file__).resolve().parents[2]
    with open(repo / "kernels" / "released.toml", "rb") as f:
        released = {(k["name"], k["version"]): k["digest"] for k in tomllib.load(f)["kernel"]}
    n = 0
    for d in sorted((repo / "kernels").iterdir()):
        if not (d / "kernel.toml").is_file():
            continue
        m = parse_manifest_toml((d / "kernel.toml").read_text(encoding="utf-8"))
        src = (d / m["source"]).read_bytes().decode("utf-8")
        key = (m["name"], m["version"])
        assert key in released, f"{key} not in kernels/released.toml (run cargo test -p kernelize --test bundled)"
        assert digest_of(m, src) == released[key], f"kernels/{d.name}: Python and Rust digests differ"
        n += 1
    assert n >= 14


def test_op_lists_are_the_registrys():
    from kernelize import manifest
    abi = json.loads((Path(__file__).parent / "fixtures" / "abi.json").read_text(encoding="utf-8"))["ops"]
    assert set(manifest.OPS) == set(abi) and len(manifest.OPS) == len(abi)
    assert set(manifest.ROWWISE_OPS) == {op for op, a in abi.items() if a["rowwise"]}
    assert {op: list(manifest.SEMANTICS.get(op, ("default",))) for op in abi} == {
        op: a["semantics"] for op, a in abi.items()}


LAUNCH = json.loads((Path(__file__).parent / "fixtures" / "launch_dims.json").read_text(encoding="utf-8"))["cases"]


@pytest.mark.parametrize("case", LAUNCH, ids=[c["name"] for c in LAUNCH])
def test_launch_dims_are_the_registrys_for_every_bundled_kernel(case):
    # python/tests/fixtures/launch_dims.json: Manifest::launch_dims (the rule's one home) for
    # every bundled CUDA kernel at decode to large rows, both sides of each cols_max, two SM
    # counts; the client's launch_dims (scripts/bench_kernels.py launches with it too) agrees
    m = parse_manifest_toml(case["manifest_toml"])
    assert len(case["dims"]) >= 70
    for key, want in case["dims"].items():
        rows, cols, sms = (int(v) for v in key.split(","))
        if isinstance(want, str):
            with pytest.raises(ValueError):
                launch_dims(m, rows, cols, sms)
            continue
        grid, block, smem = launch_dims(m, rows, cols, sms)
        assert [list(grid), list(block), smem] == want, (case["name"], key)
