"""Liger-Kernel's RMSNorm backward (llama casting mode) as a kernelize backward candidate
(issue 30; docs/backward.md, "The field's backward as Python candidates").

Imports the installed package; no Liger code is copied here. Liger's backward reads the RSTD
its own forward saved: `forward`, the candidate's setup (`[setup]`, docs/spec.md section 2b),
runs Liger's forward on copies of x and w and hands its autograd graph to the entry, which runs
only the backward, so the verifier times the backward alone. in_place=False: Liger's in-place
mode writes dX into dY's memory (the caller's input).
"""

import torch
from liger_kernel.transformers.functional import liger_rms_norm


def forward(x, w, eps):
    with torch.enable_grad():
        xr = x.detach().clone().requires_grad_(True)
        wr = w.detach().clone().requires_grad_(True)
        y = liger_rms_norm(xr, wr, eps, offset=0.0, casting_mode="llama", in_place=False)
    return xr, wr, y


def rms_norm_backward(dy, x, w, eps, state):
    xr, wr, y = state
    dx, dw = torch.autograd.grad(y, (xr, wr), dy)
    return dx, dw
