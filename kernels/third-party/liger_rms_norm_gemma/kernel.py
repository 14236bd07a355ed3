"""Liger-Kernel's RMSNorm, gemma casting mode (weight offset 1), as a kernelize candidate."""

from liger_kernel.transformers.functional import liger_rms_norm


def rms_norm(x, weight, eps):
    return liger_rms_norm(x, weight, eps, offset=1.0, casting_mode="gemma", in_place=False)
