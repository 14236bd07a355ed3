set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
W=$OUT/w; mkdir -p $W
timeout 300 $NCU --profile-from-start off --set full --import-source no -k regex:_bwd_d -f -o $W/bwd \
  python3 bench/ncu_backward.py --against .gpu-bw/release-llama.cu --out $W/launches.json --launches 1 > $W/ncu.log 2>&1
echo "ncu rc=$?"; tail -5 $W/ncu.log
$NCU --import $W/bwd.ncu-rep --page details --csv > $W/details.csv 2>&1
$NCU --import $W/bwd.ncu-rep --page raw --csv > $W/raw.csv 2>&1
xz -T0 $W/raw.csv $W/bwd.ncu-rep
tar czf $OUT/run2.tgz -C $W .
python3 - $W/details.csv <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
want = ["Duration", "DRAM Throughput", "Memory Throughput", "Achieved Occupancy", "Registers Per Thread",
        "L2 Hit Rate", "Theoretical Occupancy", "Executed Ipc Active", "Block Limit Registers", "L1/TEX Hit Rate",
        "Local Memory Spilling Requests", "Warp Cycles Per Issued Instruction", "Max Bandwidth"]
by = {}
for r in rows:
    k = (r["ID"], r["Kernel Name"][:30])
    if r["Metric Name"] in want:
        by.setdefault(k, {})[r["Metric Name"]] = r["Metric Value"] + " " + r["Metric Unit"]
for k, v in by.items():
    print(k, "; ".join(f"{m}={v.get(m,'-')}" for m in want if m in v))
PY
