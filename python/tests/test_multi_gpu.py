"""bench/multi_gpu.py's CPU slices: a job's CPUs are whole physical cores, so two jobs never
share a core through SMT siblings (a sysfs tree written here)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import multi_gpu as M  # noqa: E402


def fake_sysfs(tmp_path: Path, siblings: dict[int, str]) -> Path:
    for cpu, text in siblings.items():
        d = tmp_path / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "thread_siblings_list").write_text(text + "\n")
    return tmp_path


def test_siblings_at_i_plus_half_stay_together(tmp_path):
    # 8 CPUs on 4 cores, core k = CPUs k and k + 4 (the usual numbering)
    sysfs = fake_sysfs(tmp_path, {c: f"{c % 4},{c % 4 + 4}" for c in range(8)})
    assert M.cores(list(range(8)), sysfs) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # the old split (CPUs 0-3 | 4-7) would have put both jobs on every core
    assert M.cpu_slices(2, list(range(8)), sysfs) == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_ranges_and_no_smt(tmp_path):
    sysfs = fake_sysfs(tmp_path, {0: "0-1", 1: "0-1", 2: "2-3", 3: "2-3", 4: "4", 5: "5"})
    assert M.cores(list(range(6)), sysfs) == [[0, 1], [2, 3], [4], [5]]
    assert M.cpu_slices(2, list(range(6)), sysfs) == [[0, 1, 2, 3], [4, 5]]
    # a sibling outside the CPUs this process may use is left out; an unreadable CPU is a core
    assert M.cores([0, 2, 9], sysfs) == [[0], [2], [9]]


def test_fewer_cores_than_slices_and_cpu_list(tmp_path):
    sysfs = fake_sysfs(tmp_path, {0: "0,1", 1: "0,1"})
    assert M.cpu_slices(3, [0, 1], sysfs) == [[0, 1], [0, 1], [0, 1]]
    assert M.cpu_list([0, 1, 2, 3, 16, 17, 18, 20]) == "0-3,16-18,20"
