#!/usr/bin/env python3
"""Run several benchmark commands at once, one per GPU of this machine, and bring their results
back as one archive (issue 31's tables in one run on one machine).

    python3 bench/multi_gpu.py OUT_DIR --job NAME='COMMAND' [--job ...] [--timeout S]

Each job runs `bash -c COMMAND` with CUDA_VISIBLE_DEVICES set to one GPU of its own (the jobs
take the GPUs in the order given; a job waits for a free GPU when there are more jobs than GPUs)
and JOB_OUT set to OUT_DIR/NAME, a folder of its own for its files; its stdout and stderr go to
OUT_DIR/NAME.log. A job still running after --timeout seconds (counted from its start) is
stopped (SIGTERM, then SIGKILL), which the summary says; what it wrote so far stays (the bench
scripts append each row to a .rows.jsonl as they go).

When every job has ended, OUT_DIR holds two files: `results.tar.gz` (every job's folder and log)
and `summary.md` (per job: GPU, exit status, seconds, and the last markdown table its log
printed), which is also printed last. Two files, because the device tool brings back at most 8.
Jobs on different GPUs of one machine share its CPUs: compare speeds as ratios within one job.
Each job is pinned to a slice of the CPUs of its own (the CPUs this process may use, split evenly
over the GPUs by whole physical cores, SMT siblings kept together; `--no-pin` turns it off), and
inductor's compile workers are sized to that slice (TORCHINDUCTOR_COMPILE_THREADS), so that one
job's compilation does not take the cores that another job's host-bound timing runs on (session
21's runs 1-3 were not pinned; until session 25 the slices were halves of the CPU list, which may
be the same cores).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path


def gpus() -> list[str]:
    """The GPU indices this process may use: CUDA_VISIBLE_DEVICES where set, else nvidia-smi's."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis:
        return [g for g in vis.split(",") if g.strip()]
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                           capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"multi_gpu: no GPU list (nvidia-smi: {e}); set CUDA_VISIBLE_DEVICES")
    return [line.strip() for line in r.stdout.splitlines() if line.strip()]


def cores(cpus: list[int], sysfs: Path = Path("/sys/devices/system/cpu")) -> list[list[int]]:
    """`cpus` grouped by physical core: the CPUs of a core (SMT siblings, from sysfs'
    thread_siblings_list) together, in order of each core's first CPU. A CPU whose siblings
    cannot be read is a core of its own."""
    groups: dict[tuple[int, ...], list[int]] = {}
    mine = set(cpus)
    for c in sorted(cpus):
        try:
            text = (sysfs / f"cpu{c}" / "topology" / "thread_siblings_list").read_text().strip()
            sib = []
            for part in text.split(","):
                lo, _, hi = part.partition("-")
                sib += range(int(lo), int(hi or lo) + 1)
            key = tuple(sorted(set(sib) & mine)) or (c,)
        except (OSError, ValueError):
            key = (c,)
        groups.setdefault(key, []).append(c)
    return list(groups.values())


def cpu_slices(n: int, cpus: list[int] | None = None,
               sysfs: Path = Path("/sys/devices/system/cpu")) -> list[list[int]]:
    """The CPUs this process may use, split into `n` slices of whole physical cores (a core's
    SMT siblings always in one slice, so that two jobs never share a core: numbering often puts
    a core's second thread at CPU i + half, so halves of the CPU list may be the same cores),
    equal in cores, the remainder unused; one core each where there are fewer cores than
    slices."""
    groups = cores(sorted(cpus if cpus is not None else os.sched_getaffinity(0)), sysfs)
    per = max(1, len(groups) // n)
    out = []
    for i in range(n):
        start = (i * per) % len(groups)
        out.append(sorted(c for g in groups[start:start + per] for c in g))
    return out


def cpu_list(cpus: list[int]) -> str:
    """'0-7,16-23' for [0..7, 16..23]."""
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs)


def last_table(text: str) -> str:
    """The last run of lines that start with '|' in `text` (a bench script prints its table last)."""
    blocks, cur = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            cur.append(line)
        elif cur:
            blocks.append(cur)
            cur = []
    if cur:
        blocks.append(cur)
    return "\n".join(blocks[-1]) if blocks else "(no table)"


def parse_job(spec: str) -> tuple[str, str]:
    name, sep, cmd = spec.partition("=")
    if not sep or not name or not cmd:
        raise argparse.ArgumentTypeError(f"--job takes NAME=COMMAND, got {spec!r}")
    if not all(c.isalnum() or c in "._-" for c in name):
        raise argparse.ArgumentTypeError(f"a job's name is letters, digits, '.', '_', '-': {name!r}")
    return name, cmd


def stop(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    except ProcessLookupError:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--job", action="append", type=parse_job, required=True, metavar="NAME=COMMAND")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="leave every job on all CPUs (default: a slice of the CPUs per GPU)")
    ap.add_argument("--timeout", type=float, default=570.0,
                    help="seconds a job may run before it is stopped (default 570: under the "
                         "device tool's 600-second call)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [n for n, _ in a.job]
    if len(set(names)) != len(names):
        sys.exit(f"multi_gpu: job names must differ: {names}")
    free = gpus()
    if not free:
        sys.exit("multi_gpu: no GPU")
    slices = dict(zip(free, cpu_slices(len(free))))
    pending = list(a.job)
    running: dict[str, tuple[subprocess.Popen, str, float]] = {}
    done: list[dict] = []
    topo = cores(sorted(os.sched_getaffinity(0)))
    topology = (f"{sum(map(len, topo))} CPUs on {len(topo)} cores; each job pinned to whole cores"
                if a.pin else f"{sum(map(len, topo))} CPUs on {len(topo)} cores; jobs not pinned")
    print(f"multi_gpu: {len(pending)} jobs on GPUs {','.join(free)}; {topology}", flush=True)
    while pending or running:
        while pending and free:
            name, cmd = pending.pop(0)
            gpu = free.pop(0)
            (out / name).mkdir(exist_ok=True)
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu, JOB_OUT=str(out / name))
            cpus = slices[gpu] if a.pin else None
            if cpus:
                env["TORCHINDUCTOR_COMPILE_THREADS"] = str(len(cpus))
            log = (out / f"{name}.log").open("w")
            p = subprocess.Popen(["bash", "-c", cmd], env=env, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True,
                                 preexec_fn=(lambda c=cpus: os.sched_setaffinity(0, c)) if cpus else None)
            running[name] = (p, gpu, time.monotonic())
            where = f", CPUs {cpu_list(cpus)}" if cpus else ""
            print(f"multi_gpu: {name} started on GPU {gpu}{where}", flush=True)
        time.sleep(1.0)
        for name, (p, gpu, t0) in list(running.items()):
            timed_out = p.poll() is None and time.monotonic() - t0 > a.timeout
            if timed_out:
                stop(p)
            if p.poll() is None:
                continue
            del running[name]
            free.append(gpu)
            rec = dict(name=name, gpu=gpu, rc=p.returncode, s=time.monotonic() - t0, timed_out=timed_out)
            done.append(rec)
            print(f"multi_gpu: {name} ended: rc {p.returncode}{' (stopped: timeout)' if timed_out else ''}, "
                  f"{rec['s']:.0f} s", flush=True)
    lines = ["# multi_gpu summary", "", topology, ""]
    for rec in done:
        cmd = dict(a.job)[rec["name"]]
        text = (out / f"{rec['name']}.log").read_text(errors="replace")
        lines += [f"## {rec['name']} (GPU {rec['gpu']}, rc {rec['rc']}"
                  f"{', stopped at the timeout' if rec['timed_out'] else ''}, {rec['s']:.0f} s)", "",
                  f"    {cmd}", "", last_table(text), ""]
    summary = "\n".join(lines)
    with tarfile.open(out / "results.tar.gz", "w:gz") as tar:
        for name in names:
            for p in (out / name, out / f"{name}.log"):
                if p.exists():
                    tar.add(p, arcname=p.name)
    for name in names:
        subprocess.run(["rm", "-rf", str(out / name), str(out / f"{name}.log")], check=False)
    (out / "summary.md").write_text(summary)
    print(summary)
    return 0 if all(r["rc"] == 0 for r in done) else 1


if __name__ == "__main__":
    sys.exit(main())
