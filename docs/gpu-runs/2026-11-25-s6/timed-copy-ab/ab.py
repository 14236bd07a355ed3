# A/B: does a stream-order copy + compare after the end event change the next timed window?
import gc, statistics, sys, torch
torch.manual_seed(0)
x = torch.randn(4096, 8192, device="cuda", dtype=torch.bfloat16)
w = torch.randn(8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, device="cuda", dtype=torch.bfloat16)
ln = torch.compile(lambda x, w, b: torch.nn.functional.layer_norm(x, (8192,), w, b, 1e-5))
for _ in range(3):
    ln(x, w, b)
torch.cuda.synchronize()
l2 = torch.cuda.get_device_properties(0).L2_cache_size
flush = torch.empty(2 * l2, dtype=torch.uint8, device="cuda")
def run(snapshot, nogc, reps=25):
    if nogc:
        gc.collect(); gc.disable()
    ts = []
    for _ in range(reps):
        flush.zero_()
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        s.record(); out = ln(x, w, b); e.record()
        snap = out.clone() if snapshot else None
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) * 1e3)
        if snapshot:
            assert torch.equal(snap.view(torch.int16), out.view(torch.int16))
    gc.enable()
    return statistics.median(ts)
res = {k: [] for k in ["plain", "snapshot", "plain+nogc", "snapshot+nogc"]}
for _ in range(6):
    for k in res:
        res[k].append(run("snapshot" in k, "nogc" in k))
for k, v in res.items():
    print(f"{k:15} median of medians {statistics.median(v):7.1f} us  all {[round(t) for t in v]}")
