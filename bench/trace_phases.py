"""Sum a verification's KERNELIZE_TRACE output per case phase (issue 29's verification time).

    python3 bench/trace_phases.py TRACE... [--split-ms 30]

For each trace (the stderr of `KERNELIZE_TRACE=1 kernelize verify ...`; bench/compile_time.sh
writes one per kernel): the compile and verify lines as they are, then when the first dtype's
cases started (the first module ready), how long the cases took from there, their round trips
and each phase's sum over the cases; then the same sums over the small cases (round trip under
--split-ms) and over the large ones apart, per case for the small, since the two are shortened
by different things (fixed costs a case, against bandwidth).
"""
import argparse
import collections
import re

LINE = re.compile(r"trace \[pid \d+ \+([\d.]+) s\] (.*)")
PHASE = re.compile(r"(\S+/\S+/\S+) ([^:]+): ([\d.]+) s$")
ROUND_TRIP = re.compile(r"case (\S+) round trip ([\d.]+) s")


def summary(path, split_s):
    phases = collections.defaultdict(dict)  # case -> phase -> seconds
    trips = {}
    first = done = None
    for line in open(path, errors="replace"):
        m = LINE.match(line)
        if not m:
            continue
        t, msg = float(m.group(1)), m.group(2)
        if r := ROUND_TRIP.match(msg):
            trips[r.group(1)] = float(r.group(2))
        elif (p := PHASE.match(msg)) and "/" in p.group(1):
            phases[p.group(1)][p.group(2)] = float(p.group(3))
        elif msg.startswith(("compile", "Gpu::open", "verify")):
            print("  ", msg[:150])
            if msg.startswith("verify") and "cases now" in msg and first is None:
                first = t
            if msg.startswith("verify") and "cases done" in msg:
                done = t
    print(path, f"cases {len(trips)} round trips {sum(trips.values()):.2f} s")
    if first is not None and done is not None:
        print(f"   first module ready {first:.2f} s, cases from there {done - first:.2f} s")

    def sums(cases):
        tot, n = collections.Counter(), collections.Counter()
        for c in cases:
            for k, v in phases[c].items():
                tot[k] += v
                n[k] += 1
        return tot, n

    tot, n = sums(trips)
    for k, v in tot.most_common():
        print(f"   {k:32s} {v:7.3f} s over {n[k]}")
    small = [c for c, t in trips.items() if t < split_s]
    large = [c for c in trips if c not in small]
    for name, cases in (("small", small), ("large", large)):
        if not cases:
            continue
        tot, _ = sums(cases)
        per = ", ".join(f"{k} {1e3 * v / len(cases):.2f} ms" for k, v in tot.most_common(6))
        print(f"   {name} cases ({len(cases)}, round trip {'<' if name == 'small' else '>='} "
              f"{1e3 * split_s:.0f} ms): round trips {sum(trips[c] for c in cases):.2f} s; "
              f"a case: {per}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+")
    p.add_argument("--split-ms", type=float, default=30.0,
                   help="round trip below which a case counts as small (default 30)")
    a = p.parse_args()
    for path in a.traces:
        summary(path, a.split_ms / 1e3)


if __name__ == "__main__":
    main()
