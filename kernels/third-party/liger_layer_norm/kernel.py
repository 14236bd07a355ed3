"""Liger-Kernel's LayerNorm as a kernelize candidate."""

from liger_kernel.transformers.functional import liger_layer_norm


def layer_norm(x, weight, bias, eps):
    return liger_layer_norm(x, weight, bias, eps)
