import re, sys, collections
for path in sys.argv[1:]:
    tot = collections.Counter(); n = collections.Counter(); rt = 0.0; cases = 0; first = None; last = 0
    for line in open(path):
        m = re.match(r"trace \[pid \d+ \+([\d.]+) s\] (.*)", line)
        if not m: continue
        t, msg = float(m.group(1)), m.group(2)
        m2 = re.match(r"(\S+) ([^:]+): ([\d.]+) s$", msg)
        if msg.startswith("case ") and "round trip" in msg:
            rt += float(msg.split()[-2]); cases += 1
        elif m2 and "/" in m2.group(1):
            tot[m2.group(2)] += float(m2.group(3)); n[m2.group(2)] += 1
        elif msg.startswith("compile") or msg.startswith("Gpu::open") or msg.startswith("verify"):
            print("  ", msg[:150])
    print(path, f"cases {cases} round trips {rt:.2f} s")
    for k, v in tot.most_common():
        print(f"   {k:32s} {v:7.3f} s over {n[k]}")
