"""Liger-Kernel's RMSNorm backward (llama casting mode) as a kernelize backward candidate
(issue 30; docs/backward.md, "The field's backward as Python candidates").

Imports the installed package; no Liger code is copied here. Liger's backward reads the RSTD
its own forward saved, so the function runs Liger's forward too (its output is dropped): the
gradients are those a training step with liger_rms_norm gets. in_place=False: Liger's in-place
mode writes dX into dY's memory (the caller's input).
"""

import torch
from liger_kernel.transformers.functional import liger_rms_norm


def rms_norm_backward(dy, x, w, eps):
    with torch.enable_grad():
        xr = x.detach().clone().requires_grad_(True)
        wr = w.detach().clone().requires_grad_(True)
        y = liger_rms_norm(xr, wr, eps, offset=0.0, casting_mode="llama", in_place=False)
        dx, dw = torch.autograd.grad(y, (xr, wr), dy)
    return dx, dw
