"""Liger-Kernel's RMSNorm, llama casting mode, as a kernelize candidate (SPEC 2b).

Imports the installed package; no Liger code is copied here.
"""

from liger_kernel.transformers.functional import liger_rms_norm


def rms_norm(x, weight, eps):
    return liger_rms_norm(x, weight, eps, offset=0.0, casting_mode="llama", in_place=False)
