"""QuACK's RMSNorm as a kernelize candidate (torch.nn.RMSNorm semantics)."""

import os
import sys

import nvidia_cutlass_dsl

# The wheel's .pth file puts the DSL's packages on sys.path; a folder made with
# `pip install --target` is not a site directory, so its .pth files are not read.
_DSL = os.path.join(nvidia_cutlass_dsl.__path__[0], "dsl_packages")
if _DSL not in sys.path:
    sys.path.insert(0, _DSL)

from quack.rmsnorm import rmsnorm as _rmsnorm  # noqa: E402


def rms_norm(x, weight, eps):
    return _rmsnorm(x, weight, eps=eps)
