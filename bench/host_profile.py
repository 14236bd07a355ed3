#!/usr/bin/env python3
"""Where the host's time of a decode step goes (issue 31): the Python functions a step runs, for
one candidate of bench/exact_compile.py (1B Llama architecture or `--arch`, bf16, random weights).

    python3 bench/host_profile.py OUT_DIR --candidate kernelize+exact-ro [--batch 1] [--steps 50]
        [--arch qwen2] [--prefill 512]

The step (bench/exact_compile.decode_step) is run until compiled, then `--steps` times under
cProfile, each followed by a synchronisation as in the speed phase. Under CUDA graphs the GPU
work is one replay; what the step's wall time has above its GPU time is spent here. Writes
OUT_DIR/host-CANDIDATE.txt (pstats by own time and by cumulative time) and prints the top rows.

`--sync-debug`: also run the steps once more with CUDA's sync debug mode on and count the
operations that synchronise with the device, by the Python line that called them (the step's
own `torch.cuda.synchronize()` is one). `--no-gc`: Python's garbage collector off while timing
(a pause of the collector lands in whichever function runs).

`--torch-profiler`: also run the steps under `torch.profiler` (CPU activity: every dispatcher
call with its own host time, far less overhead per call than cProfile's per Python function) and
write OUT_DIR/ops-CANDIDATE.txt, the operators by their own host time and by total host time.

`--prefill N`: the step is a forward of `--batch` x N prompt tokens without a KV cache (the speed
phase's prefill) instead of a decode step.
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import gc
import io
import pstats
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import exact_compile as B  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--candidate", default="kernelize+exact-ro")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--sync-debug", action="store_true")
    p.add_argument("--no-gc", action="store_true")
    p.add_argument("--torch-profiler", action="store_true")
    p.add_argument("--arch", default="llama", help="the 1B-class config of bench/exact_compile.py")
    p.add_argument("--prefill", type=int, default=0, metavar="N",
                   help="a forward of batch x N prompt tokens without a KV cache instead of a decode step")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    base = B.build_arch(a.arch, "large", torch.bfloat16)
    m = B.candidate(base, a.candidate)
    with torch.no_grad():
        g = torch.Generator().manual_seed(5)
        if a.prefill:
            ids = torch.randint(0, B.VOCAB_IDS, (a.batch, a.prefill), generator=g).cuda()
            step = lambda: m(ids, use_cache=False)  # noqa: E731
        else:
            step = B.decode_step(m, a.batch, g, prefill=None)
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        if a.no_gc:
            gc.collect()
            gc.disable()
        wall = B.timed_ms(step, a.steps)
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        for _ in range(a.steps):
            step()
            torch.cuda.synchronize()
        prof.disable()
        per_step = (time.perf_counter() - t0) / a.steps * 1e3
        syncs: collections.Counter = collections.Counter()
        if a.sync_debug:
            def record(message, category, filename, lineno, file=None, line=None):
                where = [f for f in traceback.extract_stack()[:-1] if "warnings" not in f.filename]
                syncs[f"{where[-1].filename}:{where[-1].lineno} ({where[-1].name})" if where else "?"] += 1

            with warnings.catch_warnings():   # restores showwarning and the filters on exit
                warnings.simplefilter("always")
                warnings.showwarning = record
                torch.cuda.set_sync_debug_mode("warn")
                for _ in range(a.steps):
                    step()
                    torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("default")
        if a.torch_profiler:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU]) as tp:
                for _ in range(a.steps):
                    step()
                    torch.cuda.synchronize()
            ka = tp.key_averages()
            (out / f"ops-{a.candidate.replace('+', '_')}.txt").write_text(
                f"{a.candidate} batch {a.batch}: torch.profiler, CPU activity, {a.steps} steps\n"
                + ka.table(sort_by="self_cpu_time_total", row_limit=50, max_name_column_width=90)
                + "\n" + ka.table(sort_by="cpu_time_total", row_limit=50, max_name_column_width=90))
            print(ka.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70))
    from torch._dynamo.utils import counters
    breaks = {k: dict(v) for k, v in counters.items() if k in ("graph_break", "stats", "frames")}
    s = io.StringIO()
    s.write(f"dynamo counters: {breaks}\n")
    st = pstats.Stats(prof, stream=s)
    what = f"{a.arch} {a.candidate} batch {a.batch}" + (f" prefill {a.prefill}" if a.prefill else "")
    s.write(f"{what}: step wall {wall:.3f} ms (CUDA events), "
            f"{per_step:.3f} ms a step under cProfile; {a.steps} steps; gc "
            f"{'off' if a.no_gc else 'on'}\n")
    if a.sync_debug:
        s.write(f"synchronising operations over {a.steps} steps (sync debug mode), by caller:\n")
        for where, n in syncs.most_common(20):
            s.write(f"  {n:6d}  {where}\n")
    st.sort_stats("tottime").print_stats(40)
    st.sort_stats("cumulative").print_stats(60)
    safe = a.candidate.replace("+", "_")
    (out / f"host-{safe}.txt").write_text(s.getvalue())
    print(s.getvalue()[:6000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
