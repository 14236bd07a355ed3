# session 34 run 4 (nvidia-h200-x4): issue 31's bits on the current tree, the first GPU run since
# session 33's exact.matmuls_folded_as_eager: the seeds, the two blocks and the five architectures
# under kernelize(compile=True) and kernelize(compile="reduce-overhead"), one dtype per GPU
# (prefill 2x64, 3 decode steps, 8 greedy tokens of generate()), and the shipped tiny models in
# all three dtypes on the fourth.
set -u
export PYTHONUNBUFFERED=1
E="python3 bench/exact_compile.py \$JOB_OUT/e --phase exact --seed-candidates kernelize+exact-ro,kernelize+exact --candidates kernelize+exact-ro,kernelize+exact --generate 8"
timeout 490 python3 bench/multi_gpu.py /tmp/r4 --timeout 465 \
  --job bf16="$E --dtypes bf16 --no-shipped" \
  --job f16="$E --dtypes f16 --no-shipped" \
  --job f32="$E --dtypes f32 --no-shipped" \
  --job shipped="$E --dtypes bf16,f16,f32 --archs '' --no-seeds"
cp /tmp/r4/results.tar.gz /tmp/r4/summary.md $OUT/ 2>/dev/null
# (multi_gpu.py packs the job folders into results.tar.gz and removes them: read them there; the
# run itself read the removed folders and printed "rows 0", the count below was made from the
# archive afterwards: 72 rows, 0 differing)
mkdir -p /tmp/r4x && tar xzf /tmp/r4/results.tar.gz -C /tmp/r4x
python3 - /tmp/r4x <<'PY'
import json, pathlib, sys
rows = [json.loads(l) for p in pathlib.Path(sys.argv[1]).glob("*/e/exact.rows.jsonl") for l in open(p)]
keys = ("mismatched", "prefill_mismatched", "decode_mismatched", "generate_mismatched")
bad = [r for r in rows if "error" in r or any(r.get(k, 0) for k in keys) or r.get("generate_tokens_same") is False]
print(f"rows {len(rows)}, differing or failed {len(bad)}")
for r in bad:
    print({k: r.get(k) for k in ("model", "dtype", "candidate", "error") + keys})
PY
