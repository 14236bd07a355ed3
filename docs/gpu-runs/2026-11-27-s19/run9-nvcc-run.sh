#!/usr/bin/env bash
# nvcc phase times (cicc = NVVM, ptxas) of the bundled norm kernels' bf16 module and variants.
out="$1"; mkdir -p "$out"; cd "$(dirname "$0")"
job() {  # name src flags...
    local n="$1" src="$2"; shift 2
    local s=$(date +%s.%N)
    nvcc -cubin -arch=sm_90 -DKERNELIZE_DTYPE_BF16 "$@" --time "$out/$n.csv" "$src" -o "/tmp/$n.cubin" 2>"$out/$n.err"
    local rc=$?
    local wall=$(python3 -c "import time;print(f'{time.time()-$s:.2f}')")
    local sass=$(cuobjdump -sass "/tmp/$n.cubin" | grep -v 'Function\|^$\|arch\|code for\|\.text' | md5sum | cut -c1-10)
    local regs=$(cuobjdump -res-usage "/tmp/$n.cubin" 2>/dev/null | grep -o 'REG:[0-9]*' | head -1)
    local cicc=$(awk -F' , ' '$2=="cicc"{print $7}' "$out/$n.csv"); local ptxas=$(awk -F' , ' '$2=="ptxas"{print $7}' "$out/$n.csv")
    echo "| $n | $rc | $wall | $cicc | $ptxas | $(stat -c %s /tmp/$n.cubin) | $sass | $regs |"
}
echo "| variant | rc | wall s | cicc ms | ptxas ms | cubin B | sass md5 | regs |"
echo "| --- | --- | ---: | ---: | ---: | ---: | --- | --- |"
for k in layer_norm fused_add_rms_norm; do
    job "$k-plain" "$k-plain.cu" &
    job "$k-O2" "$k-plain.cu" -Xptxas -O2 &
    job "$k-noexpensive" "$k-plain.cu" -Xptxas --allow-expensive-optimizations=false &
    job "$k-split" "$k-split.cu" &
    job "$k-inline" "$k-inline.cu" &
done
job rms_norm_llama-plain rms_norm_llama-plain.cu &
job silu-plain silu-plain.cu &
wait
