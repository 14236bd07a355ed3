#!/usr/bin/env python3
"""Verify every hostile Python candidate (verifier/tests/fixtures/python-hostile) with
`kernelize verify` and check that the verdict says what its `expect.toml` asks: the trick is
caught. The control candidate beside them must pass the same checks (on the GPU: bit-exact).

    scripts/python_hostile_check.py OUT_DIR [--bin target/release/kernelize] [--fixtures DIR]
        [--dtype bf16] [--case-limit-s 20] [NAME ...]

Writes OUT_DIR/NAME.json (the report), NAME.log (verify's output) and table.md; prints the table
last and exits 1 when a trick was missed or the control failed. The same expectations are
checked on the CPU in CI by verifier/tests/python_candidates.rs.
"""

import argparse
import json
import os
import subprocess
import sys
import time
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def texts_of(report):
    """Every line a person reads of a report: problems, case notes, integrity failures."""
    out = list(report["summary"]["overall"].get("problems", []))
    for c in report.get("cases", []):
        out.extend(c.get("integrity_failures") or [])
        if c.get("note"):
            out.append(c["note"])
    return out


def check(expect, report, on_gpu):
    """The expectations `expect` misses in `report`, as sentences (empty: all met)."""
    v = report["summary"]["overall"]
    missed = []
    cls = v["class"] if isinstance(v["class"], str) else json.dumps(v["class"])
    want = expect.get("class")
    if on_gpu and expect.get("gpu_class"):
        want = expect["gpu_class"]
    if want and cls != want:
        missed.append(f"class {cls}, expected {want}")
    if "deterministic" in expect and v["deterministic"] != expect["deterministic"]:
        missed.append(f"deterministic {v['deterministic']}, expected {expect['deterministic']}")
    if "integrity_ok" in expect and v["integrity_ok"] != expect["integrity_ok"]:
        missed.append(f"integrity_ok {v['integrity_ok']}, expected {expect['integrity_ok']}: "
                      + "; ".join(v.get("problems", [])[:2]))
    texts = expect.get("gpu_text") if on_gpu and expect.get("gpu_text") else expect.get("text")
    if texts:
        texts = [texts] if isinstance(texts, str) else texts
        lines = texts_of(report)
        if not any(t in line for t in texts for line in lines):
            missed.append(f"no line says {' or '.join(repr(t) for t in texts)}")
    above = expect.get("mismatch_above")
    if above is not None and not v["max_mismatch_fraction"] > above:
        missed.append(f"largest mismatch fraction {v['max_mismatch_fraction']}, expected above {above}")
    below = expect.get("wrong_below_rows")
    if below:
        small = [c for c in report["cases"] if c["status"] == "ran" and c["rows"] < below and c.get("exactness")]
        if not small:
            missed.append(f"no case below {below} rows ran")
        elif not all(c["exactness"]["mismatch_fraction"] > 0.25 for c in small):
            missed.append(f"a case below {below} rows was not found wrong")
        if cls == "bit_exact":
            missed.append("the verdict is bit_exact")
    return missed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("names", nargs="*")
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/kernelize"))
    ap.add_argument("--fixtures", default=os.path.join(ROOT, "verifier/tests/fixtures/python-hostile"))
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--case-limit-s", type=int, default=20,
                    help="--candidate-case-limit-s of each verify (the hang's limit)")
    ap.add_argument("--timeout-s", type=int, default=240, help="the whole verify of one candidate")
    a = ap.parse_intermixed_args()
    if not os.access(a.bin, os.X_OK):
        sys.exit(f"python_hostile_check.py: {a.bin} is not an executable kernelize; build it "
                 "(scripts/build-release) or pass --bin PATH")
    os.makedirs(a.out, exist_ok=True)
    names = a.names or sorted(n for n in os.listdir(a.fixtures) if os.path.isfile(os.path.join(a.fixtures, n, "expect.toml")))
    try:
        import torch
        on_gpu = torch.cuda.is_available()
    except ImportError:
        on_gpu = False
    extra = []
    # The candidate's child runs `python3 -I` (no user site-packages): if torch lives there, pass it.
    if subprocess.run(["python3", "-I", "-c", "import torch"], capture_output=True).returncode != 0:
        try:
            import torch
            extra = ["--candidate-packages", os.path.dirname(os.path.dirname(torch.__file__))]
        except ImportError:
            pass
    rows = []
    for name in names:
        d = os.path.join(a.fixtures, name)
        with open(os.path.join(d, "expect.toml"), "rb") as f:
            expect = tomllib.load(f)
        if expect.get("gpu_only") and not on_gpu:
            rows.append((name, "skipped (needs a GPU)", "", 0.0))
            continue
        js = os.path.join(a.out, name + ".json")
        cmd = [a.bin, "verify", d, "--quick", "--dtype", a.dtype, "--json", js,
               "--candidate-case-limit-s", str(a.case_limit_s)] + extra
        t0 = time.time()
        with open(os.path.join(a.out, name + ".log"), "w") as log:
            try:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=a.timeout_s).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        secs = time.time() - t0
        if not os.path.exists(js):
            rows.append((name, "MISSED", f"no report (verify exit {rc})", secs))
            continue
        with open(js) as f:
            report = json.load(f)
        missed = check(expect, report, on_gpu)
        v = report["summary"]["overall"]
        cls = v["class"] if isinstance(v["class"], str) else json.dumps(v["class"])
        first = (v.get("problems") or [""])[0].replace("|", "/").replace("\n", " ")[:140]
        verdict = "as expected" if name == "control" else "CAUGHT"
        rows.append((name, verdict if not missed else "MISSED", f"{cls}; {first}" + (
            f" -- missed: {'; '.join(missed)}" if missed else ""), secs))
    lines = ["| candidate | result | verdict; first problem | s |", "| --- | --- | --- | ---: |"]
    lines += [f"| {n} | {r} | {w} | {s:.0f} |" for n, r, w, s in rows]
    table = "\n".join(lines)
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    bad = [n for n, r, _, _ in rows if r == "MISSED"]
    print(f"\n{len(rows) - len(bad)} of {len(rows)} as expected" + (f"; MISSED: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
