"""The checked manifest, exactly as the Rust registry checks it (`Manifest::parse`), and the
launch rule it carries (`Manifest::launch_dims`).

`parse_manifest_toml` reproduces `Manifest::parse` (the checks and the defaults that change
the canonical form), so a local kernel folder gets the same digest (`kernelize.digest`) as the
hub gives it. It checks the same length limits (`MANIFEST_LIMITS`, bytes of UTF-8;
tests/test_digest.py reads the Rust constants to keep them equal). One check is left to the
hub: that `license` is an SPDX expression. The hub parses it strictly with the `spdx` crate and
refuses a submission whose licence does not parse (422, naming the field); the client only
requires a licence to be given, since the digest does not depend on it being valid and no SPDX
parser ships with the client (docs/manifest.md, License).
"""

from __future__ import annotations

import re
from typing import Any

# kernel-registry's Op, in declaration order (python/tests/fixtures/abi.json is checked against it)
OPS = ("rms_norm", "fused_add_rms_norm", "layer_norm", "fused_add_layer_norm", "silu", "silu_and_mul",
       "gelu", "gelu_tanh", "silu_mul", "gelu_tanh_mul")
SEMANTICS = {"rms_norm": ("llama", "gemma", "torch"), "rms_norm_backward": ("llama", "gemma", "torch")}
# kernel-registry's backward ops (docs/spec.md section 2c) and their entries (`Op::stages`, in
# launch order; python/tests/fixtures/abi.json's `backward_ops` is checked against it).
BACKWARD_OPS = {"rms_norm_backward": ("dx", "dwp", "dw"), "silu_mul_backward": ("grad",),
                "layer_norm_backward": ("dx", "dwdb"), "gelu_tanh_mul_backward": ("grad",),
                "silu_backward": ("grad",), "gelu_backward": ("grad",), "gelu_tanh_backward": ("grad",),
                "fused_add_rms_norm_backward": ("dx", "dwp", "dw")}
# (forward op, semantics) -> its backward op (`Op::forward` read the other way; checked against
# abi.json's `backward_ops` too): what a training-mode layer can get a backward kernel for.
BACKWARD_OF = {("rms_norm", "llama"): "rms_norm_backward", ("rms_norm", "gemma"): "rms_norm_backward",
               ("rms_norm", "torch"): "rms_norm_backward",
               ("silu_mul", "default"): "silu_mul_backward",
               ("layer_norm", "default"): "layer_norm_backward",
               ("gelu_tanh_mul", "default"): "gelu_tanh_mul_backward",
               ("silu", "default"): "silu_backward", ("gelu", "default"): "gelu_backward",
               ("gelu_tanh", "default"): "gelu_tanh_backward",
               ("fused_add_rms_norm", "default"): "fused_add_rms_norm_backward"}
# The backward ops whose verdict holds only for the GPU figures (SM count, threads per SM) it
# was measured with (`Op::verdict_depends_on_device`): rms_norm_backward's dw follows eager's
# column sum, split over CTAs by both. The gated and the activations' backward ops are elementwise, and layer_norm_backward
# takes at most 65536 rows, below eager's SM-dependent two-pass column sum: no figure matters.
VERDICT_ON_DEVICE = ("rms_norm_backward", "fused_add_rms_norm_backward")
# A norm op -> the op that adds a residual before the same norm of its default semantics
# (`residual := round(x + residual)`, then the norm; kernel-registry's `Op::updates_residual`):
# what exact compile fuses a residual add and a swapped norm into.
FUSED_ADD = {"rms_norm": "fused_add_rms_norm", "layer_norm": "fused_add_layer_norm"}
DTYPES = ("bf16", "f16", "f32")  # BTreeMap<DType, _> order (enum declaration order)
ROWWISE_OPS = ("rms_norm", "fused_add_rms_norm", "layer_norm", "fused_add_layer_norm", "silu_and_mul",
               "silu_mul", "gelu_tanh_mul")

# Manifest::parse's length limits (kernel-registry/src/manifest.rs MAX_*; bytes of UTF-8).
MANIFEST_LIMITS = {
    "MAX_NAME": 64, "MAX_VERSION": 64, "MAX_DESCRIPTION": 4096, "MAX_AUTHORS": 32,
    "MAX_AUTHOR": 200, "MAX_LICENSE": 200, "MAX_SOURCE_NAME": 128, "MAX_ENTRY": 128,
    "MAX_NVRTC_OPTIONS": 32, "MAX_NVRTC_OPTION": 256, "MAX_REQUIREMENT": 200, "MAX_WORD": 64,
    "MAX_STAGES": 8,
}


def _check_lengths(raw: dict[str, Any]) -> None:
    """Manifest::parse's `check_lengths`: every limit, before any other rule, naming the field."""
    L = MANIFEST_LIMITS

    def at_most(field: str, v: Any, limit: str) -> None:
        if isinstance(v, str) and len(v.encode()) > L[limit]:
            raise _fe(field, f"is {len(v.encode())} bytes long; at most {L[limit]} are accepted")

    def listed(field: str, v: Any, limit: str, what: str) -> None:
        if isinstance(v, list) and len(v) > L[limit]:
            raise _fe(field, f"lists {len(v)} {what}; at most {L[limit]} are accepted")

    at_most("name", raw.get("name"), "MAX_NAME")
    at_most("version", raw.get("version"), "MAX_VERSION")
    at_most("op", raw.get("op"), "MAX_WORD")
    at_most("semantics", raw.get("semantics"), "MAX_WORD")
    at_most("description", raw.get("description"), "MAX_DESCRIPTION")
    authors = raw.get("authors")
    listed("authors", authors, "MAX_AUTHORS", "authors")
    for i, a in enumerate(authors if isinstance(authors, list) else []):
        at_most(f"authors[{i}]", a, "MAX_AUTHOR")
    at_most("license", raw.get("license"), "MAX_LICENSE")
    at_most("source", raw.get("source"), "MAX_SOURCE_NAME")
    entry = raw.get("entry")
    for k, v in (entry.items() if isinstance(entry, dict) else []):
        at_most("entry", k, "MAX_WORD")
        if isinstance(v, dict):  # a backward op's entries
            if len(v) > L["MAX_STAGES"]:
                raise _fe(f"entry.{k}", f"names {len(v)} entries; at most {L['MAX_STAGES']} are accepted")
            for stage, sym in v.items():
                at_most(f"entry.{k}", stage, "MAX_WORD")
                at_most(f"entry.{k}.{stage}", sym, "MAX_ENTRY")
        else:
            at_most(f"entry.{k}", v, "MAX_ENTRY")
    constraints = raw.get("constraints")
    archs = constraints.get("archs") if isinstance(constraints, dict) else None
    for i, a in enumerate(archs if isinstance(archs, list) else []):
        at_most(f"constraints.archs[{i}]", a, "MAX_WORD")
    opts = raw.get("nvrtc_options")
    listed("nvrtc_options", opts, "MAX_NVRTC_OPTIONS", "options")
    for i, o in enumerate(opts if isinstance(opts, list) else []):
        at_most(f"nvrtc_options[{i}]", o, "MAX_NVRTC_OPTION")
    at_most("runtime", raw.get("runtime"), "MAX_WORD")
    reqs = raw.get("requires")
    for i, r in enumerate(reqs if isinstance(reqs, list) else []):
        at_most(f"requires[{i}]", r, "MAX_REQUIREMENT")
    setup = raw.get("setup")
    if isinstance(setup, dict):
        if len(setup) > len(DTYPES):
            raise _fe("setup", f"names {len(setup)} functions; at most one per dtype ({len(DTYPES)})")
        for k, v in setup.items():
            at_most("setup", k, "MAX_WORD")
            at_most(f"setup.{k}", v, "MAX_ENTRY")


MANIFEST_FIELDS = (
    "name", "version", "op", "semantics", "description", "authors", "license", "source",
    "entries", "launch", "constraints", "nvrtc_options",
)
# Left out of the canonical form of a CUDA kernel (`runtime` "cuda", `requires` empty), so that
# CUDA digests made before Python candidates (docs/spec.md section 2b) hold.
OPTIONAL_FIELDS = ("runtime", "requires", "capabilities", "stages", "setup")
# `[[capability]]` names in kernel-registry's `Capability` order (the canonical form sorts the
# declarations by it); `inline_asm` is found by the audit but never declared.
CAPABILITIES = ("clock", "environment", "state", "global_atomics", "printf", "trap",
                "dynamic_parallelism", "indirect_call", "inline_asm")
RUNTIMES = ("cuda", "python")
MAX_REQUIRES = 16
_ALLOWED_OPTION_PREFIXES = (
    "--use_fast_math", "-use_fast_math", "--fmad=", "-fmad=", "--ftz=", "-ftz=",
    "--prec-div=", "-prec-div=", "--prec-sqrt=", "-prec-sqrt=", "--maxrregcount=",
    "-maxrregcount=", "--std=c++", "-std=c++", "--define-macro=", "-D", "-lineinfo",
    "--generate-line-info", "--extra-device-vectorization", "-default-device",
)


def is_ptxas_threads_option(o: str) -> bool:
    """The one ptxas option an author may pass, whole (kernel_registry::manifest's
    `is_ptxas_threads_option`): `-Xptxas=--split-compile=N` or `--ptxas-options=--split-compile=N`,
    N of one to three digits; ptxas's threads, not the code (the same SASS)."""
    for p in ("-Xptxas=--split-compile=", "--ptxas-options=--split-compile="):
        if o.startswith(p):
            n = o[len(p):]
            return 1 <= len(n) <= 3 and n.isascii() and n.isdigit()
    return False


class ManifestError(ValueError):
    """A kernel.toml the registry would refuse; the message names the field."""


def canonical_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest with its keys in the Rust struct's order (what serde writes)."""
    missing = [f for f in MANIFEST_FIELDS if f not in manifest]
    extra = [f for f in manifest if f not in MANIFEST_FIELDS + OPTIONAL_FIELDS]
    if missing or extra:
        raise ManifestError(f"manifest fields: missing {missing}, unknown {extra}")
    m = {f: manifest[f] for f in MANIFEST_FIELDS}
    if manifest.get("runtime", "cuda") != "cuda":
        m["runtime"] = manifest["runtime"]
    if manifest.get("requires"):
        m["requires"] = list(manifest["requires"])
    if manifest.get("capabilities"):
        m["capabilities"] = [{"name": c["name"], "reason": c["reason"]} for c in manifest["capabilities"]]
    if manifest.get("stages"):  # a backward op's entries per dtype (after capabilities: serde's order)
        m["stages"] = {d: {k: manifest["stages"][d][k] for k in sorted(manifest["stages"][d])}
                       for d in DTYPES if d in manifest["stages"]}
    if manifest.get("setup"):  # a Python backward candidate's setup functions (serde's order: last)
        m["setup"] = {d: manifest["setup"][d] for d in DTYPES if d in manifest["setup"]}
    m["entries"] = {d: manifest["entries"][d] for d in DTYPES if d in manifest["entries"]}
    if len(m["entries"]) != len(manifest["entries"]):
        raise ManifestError(f"entries: unknown dtype in {sorted(manifest['entries'])}")
    m["launch"] = [_canonical_rule(r) for r in manifest["launch"]]
    c = manifest["constraints"]
    m["constraints"] = {k: c[k] for k in ("cols_min", "cols_max", "cols_multiple_of", "archs")}
    return m


def _canonical_rule(r: dict[str, Any]) -> dict[str, Any]:
    g = r["grid"]
    kind = g["kind"]
    key = {"per_row": "rows_per_block", "per_element": "elements_per_thread",
           "persistent": "blocks_per_sm"}[kind]
    return {
        "cols_max": r["cols_max"],
        "block": list(r["block"]),
        "grid": {"kind": kind, key: g[key]},
        "smem_bytes": r["smem_bytes"],
        "smem_bytes_per_col": r["smem_bytes_per_col"],
    }


# ---- kernel.toml -> checked manifest (Manifest::parse) ------------------------------------

# Rust's str::trim strips Unicode White_Space; Python's str.strip also strips U+001C..U+001F.
_RUST_WS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007" \
           "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"


def _rust_trim(s: str) -> str:
    return s.strip(_RUST_WS)


def _fe(field: str, msg: str) -> ManifestError:
    return ManifestError(f"kernel.toml: field `{field}`: {msg}")


_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?")
_ARCH = re.compile(r"sm_(\d+)(\d)")


def _arch_key(a: str) -> tuple[int, int]:
    m = _ARCH.fullmatch(a)
    if not m or not (3 <= int(m.group(1)) <= 20):
        raise ValueError(a)
    return int(m.group(1)), int(m.group(2))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_manifest_toml(text: str) -> dict[str, Any]:
    """Parse and check a kernel.toml as the registry does; returns the canonical manifest."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        import tomli as tomllib  # type: ignore
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ManifestError(f"kernel.toml: {e}") from None
    known = {"name", "version", "op", "semantics", "description", "authors", "license",
             "source", "entry", "launch", "constraints", "nvrtc_options", "runtime", "requires",
             "capability", "setup"}
    for k in raw:
        if k not in known:
            raise ManifestError(f"kernel.toml: unknown field `{k}`")
    for k in ("name", "version", "op", "description", "authors", "license", "source", "entry"):
        if k not in raw:
            raise ManifestError(f"kernel.toml: missing field `{k}`")
    _check_lengths(raw)
    runtime = raw.get("runtime", "cuda")
    if runtime not in RUNTIMES:
        raise _fe("runtime", f"`{runtime}` is not valid: one of cuda, python")
    name = raw["name"]
    if not (isinstance(name, str) and 1 <= len(name) <= 64 and all(
            c.isascii() and (c.islower() or c.isdigit() or c == "_" or (i > 0 and c in "-."))
            for i, c in enumerate(name))):
        raise _fe("name", f"`{name}` is not allowed")
    version = raw["version"]
    if not isinstance(version, str) or not _SEMVER.fullmatch(version):
        raise _fe("version", f"`{version}` is not a semantic version")
    op = raw["op"]
    if op not in OPS and op not in BACKWARD_OPS:
        raise _fe("op", f"op `{op}` is not valid: one of {', '.join(OPS + tuple(BACKWARD_OPS))}")
    allowed_sem = SEMANTICS.get(op, ("default",))
    semantics = raw.get("semantics", allowed_sem[0])
    if semantics not in allowed_sem:
        raise _fe("semantics", f"for op {op}: one of {', '.join(allowed_sem)}")
    description = raw["description"]
    if not isinstance(description, str) or not _rust_trim(description):
        raise _fe("description", "must say what the kernel computes")
    authors = raw["authors"]
    if not isinstance(authors, list) or not authors or any(
            not isinstance(a, str) or not _rust_trim(a) for a in authors):
        raise _fe("authors", "list at least one author, none empty")
    lic = raw["license"]
    if not isinstance(lic, str) or not _rust_trim(lic):
        raise _fe("license", "give an SPDX license expression")
    source = raw["source"]
    ext = "cu" if runtime == "cuda" else "py"
    if not (isinstance(source, str) and source.endswith("." + ext) and "/" not in source
            and "\\" not in source and not source.startswith(".")):
        raise _fe("source", f"`{source}` must be a `.{ext}` file name in the kernel's folder (no path)")
    if runtime == "python" and "capability" in raw:
        raise _fe("capability", "a Python candidate's code is not audited (it compiles its kernels at run "
                  "time); remove it")
    # A Python candidate of a backward op names one function per dtype, as a forward one does
    # (its signature: docs/spec.md section 2b), not its stages.
    if runtime == "python":
        return _parse_python(raw, name, version, op, semantics, _rust_trim(description), authors,
                             _rust_trim(lic), source)
    if "requires" in raw:
        raise _fe("requires", "only a Python candidate (runtime = \"python\") names Python packages")
    if "setup" in raw:
        raise _fe("setup", "only a Python candidate of a backward op has a setup function (a CUDA "
                  "kernel's stages are its entries); remove it")
    capabilities = _capabilities(raw.get("capability"))
    if op in BACKWARD_OPS:
        entries, stages = _backward_entries(raw, op)
        return canonical_manifest({
            "name": name, "version": version, "op": op, "semantics": semantics,
            "description": _rust_trim(description), "authors": authors, "license": _rust_trim(lic),
            "source": source, "entries": entries, "launch": [], "constraints": _constraints(raw),
            "nvrtc_options": _nvrtc_options(raw), "capabilities": capabilities, "stages": stages,
        })
    if "launch" not in raw:
        raise _fe("launch", "a CUDA kernel needs launch rules: `[launch]` or `[[launch]]`")
    entry = raw["entry"]
    if not isinstance(entry, dict) or not entry:
        raise _fe("entry", "declare one entry symbol per supported dtype")
    entries = {}
    for k, v in entry.items():
        if k not in DTYPES:
            raise _fe(f"entry.{k}", f"dtype `{k}` is not valid")
        if not isinstance(v, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise _fe(f"entry.{k}", f"`{v}` is not a C identifier")
        entries[k] = v
    launch_raw = raw["launch"]
    rules = [launch_raw] if isinstance(launch_raw, dict) else launch_raw
    if not isinstance(rules, list) or not rules:
        raise _fe("launch", "give at least one launch rule")
    n = len(rules)
    launch = []
    prev_max = 0
    for i, r in enumerate(rules):
        at = (lambda k: f"launch.{k}") if n == 1 else (lambda k, i=i: f"launch[{i}].{k}")
        if not isinstance(r, dict):
            raise _fe("launch", "must be a table `[launch]` or tables `[[launch]]`")
        for k in r:
            if k not in ("cols_max", "block", "grid", "rows_per_block", "elements_per_thread",
                         "blocks_per_sm", "smem_bytes", "smem_bytes_per_col"):
                raise ManifestError(f"kernel.toml: `{at(k)}`: unknown field")
        b = r.get("block")
        if _is_int(b):
            block = [b, 1, 1]
        elif isinstance(b, list) and 1 <= len(b) <= 3 and all(_is_int(x) for x in b):
            block = list(b) + [1] * (3 - len(b))
        else:
            raise _fe(at("block"), "give 1 to 3 block dimensions")
        threads = block[0] * block[1] * block[2]
        if any(d <= 0 or d >= 2**32 for d in block) or threads > 1024 or block[2] > 64:
            raise _fe(at("block"), f"{block} is not a valid CUDA block")
        grid = r.get("grid")
        keys = {"per_row": "rows_per_block", "per_element": "elements_per_thread",
                "persistent": "blocks_per_sm"}
        if grid not in keys:
            raise _fe(at("grid"), f"`{grid}` is not valid: one of per_row, per_element, persistent")
        for other in keys.values():
            if other != keys[grid] and other in r:
                raise _fe(at(other), f'is not used with grid = "{grid}"; remove it')
        val = r.get(keys[grid], None if grid == "persistent" else 1)
        if val is None:
            raise _fe(at(keys[grid]), "is required for this grid")
        if not _is_int(val) or val < 1:
            raise _fe(at(keys[grid]), "must be at least 1")
        cm = r.get("cols_max")
        last = i + 1 == n
        if cm is not None and last and n > 1:
            raise _fe(at("cols_max"), "the last launch rule must cover all larger problems")
        if cm is None and not last:
            raise _fe(at("cols_max"), "every launch rule but the last needs cols_max")
        if cm is not None:
            if cm <= prev_max:
                raise _fe(at("cols_max"), "must be larger than the previous rule's cols_max")
            prev_max = cm
        smem = r.get("smem_bytes", 0)
        smem_col = r.get("smem_bytes_per_col", 0)
        if smem + smem_col * 65536 > (227 << 10) * 4:
            raise _fe(at("smem_bytes"), "asks for far more shared memory than any GPU has")
        launch.append({"cols_max": cm, "block": block, "grid": {"kind": grid, keys[grid]: val},
                       "smem_bytes": smem, "smem_bytes_per_col": smem_col})
    constraints = _constraints(raw)
    opts = _nvrtc_options(raw)
    return canonical_manifest({
        "name": name, "version": version, "op": op, "semantics": semantics,
        "description": _rust_trim(description), "authors": authors, "license": _rust_trim(lic),
        "source": source, "entries": entries, "launch": launch,
        "constraints": constraints,
        "nvrtc_options": opts, "capabilities": capabilities,
    })


def _capabilities(raw: Any) -> list[dict[str, str]]:
    """`[[capability]]` as Manifest::parse checks it: known names that need a declaration, each
    once, a reason (trimmed); sorted in the registry's order."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _fe("capability", "declare each capability as a [[capability]] table")
    if len(raw) > len(CAPABILITIES):
        raise _fe("capability", f"lists {len(raw)} capabilities; there are {len(CAPABILITIES)}")
    out: list[dict[str, str]] = []
    for i, c in enumerate(raw):
        if not isinstance(c, dict) or set(c) - {"name", "reason"}:
            raise _fe(f"capability[{i}]", "a capability has a `name` and a `reason`")
        name, reason = c.get("name"), c.get("reason", "")
        if name not in CAPABILITIES:
            raise _fe(f"capability[{i}].name", f"`{name}` is not a capability: one of {', '.join(CAPABILITIES)}")
        if name == "inline_asm":
            raise _fe(f"capability[{i}].name", "`inline_asm` needs no declaration; remove it")
        if any(d["name"] == name for d in out):
            raise _fe(f"capability[{i}].name", f"`{name}` is declared twice")
        reason = _rust_trim(reason) if isinstance(reason, str) else ""
        if not reason:
            raise _fe(f"capability[{i}].reason", f"say why the kernel needs `{name}`")
        out.append({"name": name, "reason": reason})
    return sorted(out, key=lambda d: CAPABILITIES.index(d["name"]))


def _nvrtc_options(raw: dict[str, Any]) -> list[str]:
    opts = raw.get("nvrtc_options", [])
    for i, o in enumerate(opts):
        defined = o[len("--define-macro="):] if o.startswith("--define-macro=") else (o[2:] if o.startswith("-D") else "")
        if defined.startswith("KERNELIZE_"):
            raise _fe(f"nvrtc_options[{i}]", f"`{o}`: macros named KERNELIZE_* are the verifier's")
        if not any(o.startswith(p) for p in _ALLOWED_OPTION_PREFIXES) and not is_ptxas_threads_option(o):
            raise _fe(f"nvrtc_options[{i}]", f"`{o}` is not allowed")
    return opts


def _backward_entries(raw: dict[str, Any], op: str) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """Manifest::check's `check_entries` for a backward op: per dtype a table naming each of the
    op's entries (`entries` names the first), no launch rules (the ABI's: docs/spec.md 2c)."""
    if "launch" in raw:
        raise _fe("launch", f"{op}'s launches are its ABI's (docs/spec.md section 2c); remove it")
    want = BACKWARD_OPS[op]
    entry = raw["entry"]
    if not isinstance(entry, dict) or not entry:
        raise _fe("entry", "declare one entry symbol per supported dtype")
    entries, stages = {}, {}
    for k, t in entry.items():
        if k not in DTYPES:
            raise _fe(f"entry.{k}", f"dtype `{k}` is not valid")
        if not isinstance(t, dict):
            raise _fe(f"entry.{k}", f"{op} launches {len(want)} entries in this order: give a table "
                      f"`[entry.{k}]` naming each ({', '.join(want)})")
        extra = next((s for s in sorted(t) if s not in want), None)
        if extra is not None:
            raise _fe(f"entry.{k}.{extra}", f"{op} has no entry `{extra}`; its entries are {', '.join(want)}")
        missing = next((s for s in want if s not in t), None)
        if missing is not None:
            raise _fe(f"entry.{k}.{missing}", f"is missing: {op} launches {', '.join(want)} in this order")
        seen = set()
        for stage in sorted(t):
            sym = t[stage]
            if not isinstance(sym, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", sym):
                raise _fe(f"entry.{k}.{stage}", f"`{sym}` is not a C identifier")
            if sym in seen:
                raise _fe(f"entry.{k}.{stage}", f"`{sym}` is named for two entries")
            seen.add(sym)
        entries[k] = t[want[0]]
        stages[k] = dict(t)
    return entries, stages


def _constraints(raw: dict[str, Any]) -> dict[str, Any]:
    c = raw.get("constraints", {})
    for k in c:
        if k not in ("cols_min", "cols_max", "cols_multiple_of", "archs"):
            raise ManifestError(f"kernel.toml: `constraints.{k}`: unknown field")
    cols_min = c.get("cols_min", 1)
    cols_multiple_of = c.get("cols_multiple_of", 1)
    if cols_min == 0:
        raise _fe("constraints.cols_min", "must be at least 1")
    if cols_multiple_of == 0:
        raise _fe("constraints.cols_multiple_of", "must be at least 1")
    cols_max = c.get("cols_max")
    if cols_max is not None and cols_max < cols_min:
        raise _fe("constraints.cols_max", f"{cols_max} is below cols_min {cols_min}")
    archs = []
    for i, a in enumerate(c.get("archs", [])):
        try:
            archs.append(_arch_key(a))
        except ValueError:
            raise _fe(f"constraints.archs[{i}]", f"arch `{a}` is not valid") from None
    return {"cols_min": cols_min, "cols_max": cols_max, "cols_multiple_of": cols_multiple_of,
            "archs": [f"sm_{maj}{mi}" for (maj, mi) in sorted(set(archs))]}


_REQ_OPS = ("==", ">=", "<=", "~=", "!=", "<", ">")


def check_requirement(r: str) -> str:
    """kernel-registry `check_requirement`: the pip-normalised package name of one `requires`
    entry (`name` then comma-separated specifiers); ValueError says what is wrong."""
    hint = "write `name` and version specifiers, e.g. `liger-kernel==0.8.5` or `torch>=2.5,<3`"
    m = re.match(r"[A-Za-z0-9._-]*", r)
    name, rest = m.group(0), r[m.end():]
    if not (name and len(name) <= 100 and name[0].isascii() and name[0].isalnum()
            and name[-1].isascii() and name[-1].isalnum()):
        raise ValueError(f"`{r}`: the package name is not valid; {hint}")
    if not _rust_trim(rest):
        raise ValueError(f"`{r}` gives no version; say which versions the source was written for, "
                         f"e.g. `{name}==1.2.3`")
    for spec in rest.split(","):
        spec = _rust_trim(spec)
        op = next((o for o in _REQ_OPS if spec.startswith(o)), None)
        if op is None:
            raise ValueError(f"`{r}`: `{spec}` is not a version specifier; {hint}")
        v = _rust_trim(spec[len(op):])
        if not (v and v[0].isascii() and v[0].isdigit()
                and re.fullmatch(r"[A-Za-z0-9.*+!_-]+", v)):
            raise ValueError(f"`{r}`: `{v}` is not a version; {hint}")
    return re.sub(r"[-_.]+", "-", name).lower()


def _parse_python(raw, name, version, op, semantics, description, authors, lic, source):
    """Manifest::check_python: a Python candidate (docs/spec.md section 2b)."""
    if "launch" in raw:
        raise _fe("launch", "a Python candidate has no launch rules (the function launches its own kernels)")
    if "nvrtc_options" in raw:
        raise _fe("nvrtc_options", "a Python candidate is not compiled by NVRTC")
    entry = raw["entry"]
    if not isinstance(entry, dict) or not entry:
        raise _fe("entry", "name one Python function per supported dtype")
    entries = {}
    for k, v in entry.items():
        if k not in DTYPES:
            raise _fe(f"entry.{k}", f"dtype `{k}` is not valid")
        if isinstance(v, dict):
            raise _fe(f"entry.{k}", f"name one Python function, e.g. `{k} = \"{op}\"` (a Python "
                      "candidate of a backward op too: it returns every gradient)")
        if (not isinstance(v, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v)
                or v.startswith("__")):
            raise _fe(f"entry.{k}", f"`{v}` is not a Python function name")
        entries[k] = v
    setup = _setup(raw.get("setup"), entries, op)
    if "requires" not in raw:
        raise _fe("requires", "list the Python packages the source imports, with versions")
    requires = raw["requires"]
    if (not isinstance(requires, list) or not requires or len(requires) > MAX_REQUIRES
            or not all(isinstance(r, str) for r in requires)):
        raise _fe("requires", f"list 1 to {MAX_REQUIRES} packages")
    seen = set()
    for i, r in enumerate(requires):
        try:
            pkg = check_requirement(r)
        except ValueError as e:
            raise _fe(f"requires[{i}]", str(e)) from None
        if pkg in seen:
            raise _fe(f"requires[{i}]", f"package `{pkg}` is listed twice")
        seen.add(pkg)
    return canonical_manifest({
        "name": name, "version": version, "op": op, "semantics": semantics,
        "description": description, "authors": authors, "license": lic, "source": source,
        "entries": entries, "launch": [], "constraints": _constraints(raw), "nvrtc_options": [],
        "runtime": "python", "requires": requires, "setup": setup,
    })


def _setup(raw: Any, entries: dict[str, str], op: str) -> dict[str, str]:
    """kernel-registry `check_setup`: a Python backward candidate's `[setup]`, one function per
    dtype of `[entry]` (docs/spec.md section 2b); {} when absent."""
    if raw is None:
        return {}
    if op not in BACKWARD_OPS:
        raise _fe("setup", f"{op} is a forward op: its function is the whole computation; a setup "
                  "function is for a backward op's candidate; remove it")
    if not isinstance(raw, dict):
        raise _fe("setup", "name one Python function per dtype, e.g. `[setup]` with `bf16 = \"prepare\"`")
    setup = {}
    for k, v in raw.items():
        if k not in DTYPES:
            raise _fe(f"setup.{k}", f"dtype `{k}` is not valid")
        if k not in entries:
            raise _fe(f"setup.{k}", f"`[entry]` names no function for {k}")
        if (not isinstance(v, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v)
                or v.startswith("__")):
            raise _fe(f"setup.{k}", f"`{v}` is not a Python function name")
        setup[k] = v
    missing = [d for d in DTYPES if d in entries and d not in setup]
    if missing:
        raise _fe("setup", f"names no setup function for {missing[0]}: give one for every dtype of `[entry]`")
    return setup


def defines_function(source: str, name: str) -> bool:
    """KernelBundle::from_parts's check of a Python candidate's entry: `def name(` starts a line."""
    return any(line.startswith(f"def {name}(") for line in source.splitlines())


def not_applicable(manifest: dict[str, Any], cols: int, arch: str | None) -> str | None:
    """Manifest::not_applicable: why `cols` (elements for elementwise ops) is outside."""
    c = manifest["constraints"]
    if cols < c["cols_min"]:
        return f"cols {cols} < cols_min {c['cols_min']}"
    if c["cols_max"] is not None and cols > c["cols_max"]:
        return f"cols {cols} > cols_max {c['cols_max']}"
    if cols % c["cols_multiple_of"]:
        return f"cols {cols} is not a multiple of {c['cols_multiple_of']}"
    if arch and c["archs"] and arch not in c["archs"]:
        return f"arch {arch} is not among the declared archs"
    return None


def launch_rule(manifest: dict[str, Any], cols: int) -> dict[str, Any]:
    """Manifest::launch_rule: the first launch rule whose cols_max admits `cols` (the last one
    otherwise)."""
    return next((r for r in manifest["launch"] if r["cols_max"] is None or cols <= r["cols_max"]),
                manifest["launch"][-1])


def launch_dims(manifest: dict[str, Any], rows: int, cols: int, sm_count: int) -> tuple[tuple, tuple, int]:
    """Manifest::launch_dims: (grid, block, dynamic shared memory) for rows x cols."""
    rule = launch_rule(manifest, cols)
    block = tuple(rule["block"])
    threads = block[0] * block[1] * block[2]
    g = rule["grid"]
    if g["kind"] == "per_row":
        blocks = -(-rows // g["rows_per_block"])
    elif g["kind"] == "per_element":
        blocks = -(-(rows * cols) // (threads * g["elements_per_thread"]))
    else:
        blocks = g["blocks_per_sm"] * sm_count
    blocks = max(blocks, 1)
    if blocks > 2**31 - 1:
        raise ValueError(f"grid of {blocks} blocks exceeds CUDA's limit of 2^31-1")
    smem = rule["smem_bytes"] + rule["smem_bytes_per_col"] * cols
    return (blocks, 1, 1), block, smem
