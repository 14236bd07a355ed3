"""Liger-Kernel's SwiGLU (silu(gate) * up) as a kernelize candidate."""

from liger_kernel.transformers.functional import liger_swiglu


def silu_mul(gate, up):
    return liger_swiglu(gate, up)
