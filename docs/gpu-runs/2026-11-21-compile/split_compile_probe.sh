#!/usr/bin/env bash
# Does NVRTC's / nvcc's `--split-compile=0` (optimisation passes on all cores) change the machine
# code of the bundled row kernels, and what does it save? Run on the GPU machine from the
# repository root after scripts/gpu-stage:   bench/compile_probe.sh OUT_DIR
#
# 1. nvcc default vs -split-compile=0: wall time, then the SASS of every function compared
#    (cuobjdump -sass, addresses stripped, functions matched by name, so a different function
#    order in the ELF does not count as a difference).
# 2. The verifier itself (NVRTC), KERNELIZE_SPLIT_COMPILE=0 vs 1, each from an empty CUBIN
#    cache: NVRTC time (KERNELIZE_TRACE), wall time of a full verification, and the SASS of the
#    cached CUBINs compared the same way.
# 3. Speed of the two CUBINs: full f16/bf16/f32 verifications alternated 3 times each from the
#    warm caches; the summary's GB/s at 4096x8192 and 32768x4096 per dtype.
set -u
out="${1:?usage: bench/compile_probe.sh OUT_DIR}"
mkdir -p "$out"
root="$(pwd)"
k="$root/.gpu-stage/bin/kernelize"
kernels="$root/kernels"
tmp="$(mktemp -d)"
sm="sm_$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)"
{
    echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) $sm"
    nvcc --version | tail -2
} | tee "$out/probe.txt"

sass_cmp() { # A.sass B.sass -> one line: functions, identical, differing names
    python3 - "$1" "$2" <<'PY'
import re, sys
def funcs(path):
    fs, name = {}, None
    for line in open(path, errors="replace"):
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            name = m.group(1); fs[name] = []; continue
        if name is None:
            continue
        line = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line)   # instruction addresses
        line = re.sub(r"/\* 0x[0-9a-f]+ \*/", "", line)  # encodings (checked via the text)
        line = line.strip()
        if line:
            fs[name].append(line)
    return fs
a, b = funcs(sys.argv[1]), funcs(sys.argv[2])
names = sorted(set(a) | set(b))
diff = [n for n in names if a.get(n) != b.get(n)]
print(f"functions {len(names)} (A {len(a)}, B {len(b)}), identical SASS {len(names) - len(diff)}, differing {len(diff)}"
      + (": " + " ".join(diff[:8]) if diff else ""))
PY
}

echo "== 1. nvcc default vs -split-compile=0" | tee -a "$out/probe.txt"
for name in rms_norm_llama layer_norm silu; do
    for v in default split; do
        opt=""; [ "$v" = split ] && opt="-split-compile=0"
        s=$(date +%s.%N)
        nvcc -cubin -arch="$sm" $opt -o "$tmp/$name.$v.cubin" "$kernels/$name/kernel.cu"
        e=$(date +%s.%N)
        cuobjdump -sass "$tmp/$name.$v.cubin" >"$tmp/$name.$v.sass"
        printf '%s nvcc %-8s %6.2f s  %s B  md5 %s\n' "$name" "$v" "$(echo "$e - $s" | bc)" \
            "$(stat -c %s "$tmp/$name.$v.cubin")" "$(md5sum <"$tmp/$name.$v.cubin" | cut -c1-12)" | tee -a "$out/probe.txt"
    done
    echo "$name nvcc SASS: $(sass_cmp "$tmp/$name.default.sass" "$tmp/$name.split.sass")" | tee -a "$out/probe.txt"
done

echo "== 2. the verifier (NVRTC), cold CUBIN cache, KERNELIZE_SPLIT_COMPILE=0 vs 1" | tee -a "$out/probe.txt"
for name in rms_norm_llama layer_norm; do
    for sc in 0 1; do
        cache="$tmp/cache-$name-$sc"
        s=$(date +%s.%N)
        KERNELIZE_SPLIT_COMPILE=$sc KERNELIZE_COMPILE_CACHE="$cache" KERNELIZE_TRACE=1 \
            "$k" verify "$kernels/$name" --seed 7 --json "$out/$name.split$sc.cold.json" \
            >"$tmp/$name.$sc.log" 2>&1
        rc=$?
        e=$(date +%s.%N)
        nv=$(grep -o "compile $name[^,]*: NVRTC [0-9.]* s" "$tmp/$name.$sc.log" | head -1)
        printf '%s split=%s full verification %6.2f s (rc %s); %s\n' "$name" "$sc" \
            "$(echo "$e - $s" | bc)" "$rc" "${nv:-NVRTC line not found}" | tee -a "$out/probe.txt"
        cat "$cache"/*.cubin >/dev/null 2>&1 || echo "  (no CUBIN cached in $cache)" | tee -a "$out/probe.txt"
        : >"$tmp/$name.$sc.nvrtc.sass"
        for c in "$cache"/*.cubin; do cuobjdump -sass "$c" >>"$tmp/$name.$sc.nvrtc.sass" 2>/dev/null; done
        tail -3 "$tmp/$name.$sc.log" >>"$out/verify-tails.txt"
    done
    echo "$name NVRTC SASS split 0 vs 1: $(sass_cmp "$tmp/$name.0.nvrtc.sass" "$tmp/$name.1.nvrtc.sass")" | tee -a "$out/probe.txt"
    echo "$name NVRTC (split 0) vs nvcc default SASS: $(sass_cmp "$tmp/$name.0.nvrtc.sass" "$tmp/$name.default.sass")" | tee -a "$out/probe.txt"
done

echo "== 3. speed, warm caches, alternated (GB/s at 4096x8192 / 32768x4096)" | tee -a "$out/probe.txt"
for rep in 1 2 3; do
    for sc in 0 1; do
        KERNELIZE_SPLIT_COMPILE=$sc KERNELIZE_COMPILE_CACHE="$tmp/cache-rms_norm_llama-$sc" \
            "$k" verify "$kernels/rms_norm_llama" --seed 7 --json "$tmp/speed.json" >/dev/null 2>&1
        python3 - "$tmp/speed.json" "$rep" "$sc" <<'PY' | tee -a "$out/probe.txt"
import json, sys
r = json.load(open(sys.argv[1]))
pd = r["summary"]["per_dtype"]
cells = " ".join(f"{d} {v.get('gbps_4096x8192') or 0:7.1f}/{v.get('gbps_32768x4096') or 0:7.1f}" for d, v in sorted(pd.items()))
print(f"rms_norm_llama rep {sys.argv[2]} split={sys.argv[3]}: {cells}")
PY
    done
done
rm -rf "$tmp"
