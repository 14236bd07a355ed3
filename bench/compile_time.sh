#!/usr/bin/env bash
# Time per full verification of every bundled kernel, the first on a machine (empty CUBIN cache,
# reference layers included) and the next (cache warm), and proof that compiling one dtype's
# entry as its own module (-DKERNELIZE_DTYPE_<DT>, docs/manifest.md) leaves its machine code as
# it was in the all-entries module.
# Run on the GPU machine from the repository root after scripts/gpu-stage:
#   bench/compile_time.sh OUT_DIR        (a short table is printed last)
# KERNELS="silu_backward layer_norm" verifies only those (default: every kernels/*/); KERNELS_ROOT=DIR
# takes them from DIR/<name>/ instead of kernels/ (e.g. a released version beside the tree's);
# KERNELIZE_BIN=PATH verifies with another kernelize binary (default .gpu-stage/bin/kernelize);
# PASSES=cold skips the warm pass; SKIP_NVCC=1 skips step 1. Each cold verification's trace is
# summed per case phase by bench/trace_phases.py into OUT_DIR/phases.txt; KEEP_TRACES=1 also keeps
# the whole traces (every case's phases, by case) in OUT_DIR/traces.tgz.
set -u
out="${1:?usage: bench/compile_time.sh OUT_DIR}"
mkdir -p "$out"
root="$(pwd)"
k="${KERNELIZE_BIN:-$root/.gpu-stage/bin/kernelize}"
tmp="$(mktemp -d)"
sm="sm_$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)"
now() { python3 -c 'import time; print(time.time())'; }
log="$out/compile-time.txt"
{
    echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) $sm; commit $(cat "$root/.gpu-stage/COMMIT" 2>/dev/null)"
    nvcc --version | tail -1
} | tee "$log"

echo "== 1. nvcc: the all-entries module vs one module per dtype (SASS per function, addresses stripped)" | tee -a "$log"
[ "${SKIP_NVCC:-0}" = 1 ] && echo "skipped (SKIP_NVCC=1)" | tee -a "$log"
for name in $([ "${SKIP_NVCC:-0}" = 1 ] || echo rms_norm_llama fused_add_rms_norm layer_norm); do
    s=$(now); nvcc -cubin -arch="$sm" -o "$tmp/all.cubin" "kernels/$name/kernel.cu"; e=$(now)
    cuobjdump -sass "$tmp/all.cubin" >"$tmp/all.sass"
    line="$name: all entries $(python3 -c "print(f'{$e-$s:.2f}')") s;"
    for dt in BF16 F16 F32; do
        s=$(now); nvcc -cubin -arch="$sm" -DKERNELIZE_DTYPE_$dt -o "$tmp/$dt.cubin" "kernels/$name/kernel.cu"; e=$(now)
        cuobjdump -sass "$tmp/$dt.cubin" >"$tmp/$dt.sass"
        cmp=$(python3 - "$tmp/all.sass" "$tmp/$dt.sass" <<'PY'
import re, sys
def funcs(path):
    fs, name = {}, None
    for line in open(path, errors="replace"):
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            name = m.group(1); fs[name] = []; continue
        if name is None: continue
        line = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line); line = re.sub(r"/\* 0x[0-9a-f]+ \*/", "", line).strip()
        if line: fs[name].append(line)
    return fs
a, b = funcs(sys.argv[1]), funcs(sys.argv[2])
print(" ".join(f"{n} {'identical' if a.get(n) == b[n] else 'DIFFERS'} ({len(b[n])} lines)" for n in sorted(b)) or "no functions")
PY
)
        line="$line $dt $(python3 -c "print(f'{$e-$s:.2f}')") s: $cmp;"
    done
    echo "$line" | tee -a "$log"
done

echo "== 2. kernelize verify (full suite, 3 dtypes), first on the machine (empty CUBIN cache) then warm" | tee -a "$log"
rows=()
mkdir -p "$tmp/reports"
kernels_root="${KERNELS_ROOT:-kernels}"
kernels_dirs=$(for n in ${KERNELS:-}; do echo "$kernels_root/$n/"; done)
for d in ${kernels_dirs:-$kernels_root/*/}; do
    name=$(basename "$d")
    cache="$tmp/cache-$name"
    warm=-
    for pass in ${PASSES:-cold warm}; do
        s=$(now)
        KERNELIZE_COMPILE_CACHE="$cache" KERNELIZE_TRACE=1 "$k" verify "$d" --json "$tmp/reports/$name.$pass.json" \
            >"$tmp/$name.$pass.log" 2>&1
        rc=$?
        e=$(now)
        t=$(python3 -c "print(f'{$e-$s:.1f}')")
        [ $pass = cold ] && cold=$t && rc_cold=$rc
        [ $pass = warm ] && warm=$t
        [ $pass = cold ] && grep "compile .*NVRTC" "$tmp/$name.cold.log" | sed "s/^/  /" >>"$log"
    done
    python3 "$root/bench/trace_phases.py" "$tmp/$name.cold.log" >>"$out/phases.txt"
    verdict=$(grep -m1 "^overall:" "$tmp/$name.cold.log" | cut -c1-100)
    echo "$name cold ${cold} s (rc $rc_cold) warm ${warm} s (rc $rc) | $verdict" | tee -a "$log"
    rows+=("| $name | $cold | $warm | $rc |")
    grep -v "^trace" "$tmp/$name.cold.log" >"$tmp/reports/$name.cold.txt"
    [ -f "$tmp/$name.warm.log" ] && grep -v "^trace" "$tmp/$name.warm.log" >"$tmp/reports/$name.warm.txt"
done
tar czf "$out/reports.tgz" -C "$tmp/reports" .
[ "${KEEP_TRACES:-0}" = 1 ] && (cd "$tmp" && tar czf "$out/traces.tgz" ./*.cold.log)
rm -rf "$tmp"
{
    echo
    echo "| kernel | first verification (s, empty cache) | next (s) | exit |"
    echo "| --- | --- | --- | --- |"
    printf '%s\n' "${rows[@]}"
} | tee -a "$log"
