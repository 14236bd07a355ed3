"""scripts/eager_sass.py's parsing, on the CPU without cuobjdump: the mangled names found in a
library's bytes, one architecture's function cut out of a cuobjdump -sass listing, and the
rounding instructions kept from it."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import eager_sass as E  # noqa: E402

F = "_ZN2at6native4kernIffLb0EEEvPKT_i"
G = "_ZN2at6native4kernIN3c108BFloat16EfLb0EEEvPKT_i"
LISTING = f"""
Fatbin elf code:
================
arch = sm_80
code version = [1,8]

	code for sm_80
		Function : {F}
        /*0000*/                   FFMA R1, R2, R3, R4 ;                  /* 0x0000000000007802 */
arch = sm_90
code version = [1,8]

	code for sm_90
		Function : {G}
        /*0000*/                   FMUL R9, R9, R9 ;                      /* 0x0000000000007802 */
		Function : {F}
        /*0000*/                   LDG.E.128.CONSTANT R8, desc[UR10][R8.64] ;  /* 0x00 */
        /*0010*/                   FMUL R24, R4, R12 ;                    /* 0x00 */
        /*0020*/                   FFMA R26, R26, UR12, R3 ;              /* 0x00 */
        /*0030*/                   FADD R17, R24, R17 ;                   /* 0x00 */
        /*0040*/                   SHFL.DOWN PT, R2, R17, 0x10, 0x1f ;    /* 0x00 */
        /*0050*/                   MUFU.RCP R2, R3 ;                      /* 0x00 */
        /*0060*/                   EXIT ;                                 /* 0x00 */
arch = sm_100
		Function : {F}
        /*0000*/                   FADD R1, R1, R1 ;                      /* 0x00 */
"""


def test_function_for_arch_takes_one_function_of_one_arch():
    f = E.function_for_arch(LISTING, F, "sm_90")
    assert f is not None and "FFMA R26, R26, UR12, R3" in f
    assert "FFMA R1, R2, R3, R4" not in f and "FMUL R9, R9, R9" not in f and "FADD R1, R1, R1" not in f
    assert E.function_for_arch(LISTING, F, "sm_75") is None
    assert "FFMA R1, R2, R3, R4" in E.function_for_arch(LISTING, F, "sm_80")


def test_fp_instructions_in_order_without_loads():
    rows = E.fp_instructions(E.function_for_arch(LISTING, F, "sm_90"))
    assert rows == ["/*0010*/ FMUL R24, R4, R12", "/*0020*/ FFMA R26, R26, UR12, R3",
                    "/*0030*/ FADD R17, R24, R17", "/*0040*/ SHFL.DOWN PT, R2, R17, 0x10, 0x1f",
                    "/*0050*/ MUFU.RCP R2, R3"]


def test_mangled_names_from_the_library_bytes(tmp_path):
    lib = tmp_path / "libfake.so"
    lib.write_bytes(b"\0junk" + F.encode() + b"\0" + G.encode() + b"\0_ZL12__device_stub__"
                    + F.encode() + b"\0" + F.encode() + b"\0" + F.encode() + b"PKfiE5__tmp\0"
                    + F.encode() + b"PKfiE8__handle\0")
    assert E.mangled_names(lib, "kernIffLb0E") == [F]
    assert E.mangled_names(lib, r"kern(IffLb0E|IN3c108BFloat16E)") == sorted([F, G])
    assert E.mangled_names(lib, "nothing_like_it") == []
