"""Liger-Kernel's GeGLU (gelu_tanh(gate) * up) as a kernelize candidate."""

from liger_kernel.transformers.functional import liger_geglu


def gelu_tanh_mul(gate, up):
    return liger_geglu(gate, up)
