#!/usr/bin/env python3
"""The model-level table (the seeds' experiment) from `kernelize verify --model ... --json`
reports: per kernel, model and dtype, what substituting the kernel for every matching layer
did to the logits, next to the kernel's per-layer verdict.

    python3 scripts/model_table.py OUT/kernel-*.json > model-level.md
"""

import json
import sys


def main(paths: list[str]) -> None:
    reports = []
    for p in paths:
        try:
            reports.append(json.load(open(p)))
        except (OSError, ValueError) as e:
            print(f"skipping {p}: {e}", file=sys.stderr)
    if not reports:
        sys.exit("no reports given")
    r0 = reports[0]
    d = r0["device"]
    print(f"Device: {d['name']} ({d['arch']}), driver {d['driver_version']}, CUDA {d['cuda_version']}; "
          f"date {r0['started_at'][:10]}.\n")
    print("| kernel | per-layer verdict | model | dtype | layers replaced | max logit abs diff "
          "| argmax match | top-5 overlap | mean KL | eager top-1 prob |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    notes = []
    for r in sorted(reports, key=lambda r: r["kernel"]["name"]):
        name = r["kernel"]["name"]
        per = r["summary"]["per_dtype"]
        if not r.get("model"):
            why = next((n for n in r.get("model_notes", []) if "not measured" in n or "failed" in n),
                       "no model-level run")
            notes.append(f"- {name}: {why}")
            continue
        for m in r["model"]:
            verdict = per.get(m["dtype"], {}).get("class", "?")
            top1 = m.get("eager_mean_top1_prob")
            print(f"| {name} | {verdict} | {m['model_name']} | {m['dtype']} | {m['layers_replaced']} "
                  f"| {m['max_logit_abs_diff']:.4g} | {100 * m['argmax_match_fraction']:.2f}% "
                  f"| {100 * m['top5_overlap']:.2f}% | {m['mean_kl']:.3g} "
                  f"| {'' if top1 is None else f'{top1:.3f}'} |")
        for n in r.get("model_notes", []):
            if "failed" in n:
                notes.append(f"- {name}: {n}")
    if notes:
        print("\nNot measured:\n")
        print("\n".join(notes))


if __name__ == "__main__":
    main(sys.argv[1:])
