"""Liger-Kernel's GeGLU backward as a kernelize backward candidate (issue 30; docs/backward.md,
"The field's backward as Python candidates").

Imports the installed package; no Liger code is copied here. Liger's GeGLU backward writes the
gradients into the tensors its forward saved (gate and up): `forward`, the candidate's setup
(`[setup]`, docs/spec.md section 2b), runs Liger's forward on copies, never the caller's inputs,
and hands its autograd graph to the entry, which runs only the backward (so the verifier times
the backward alone).
"""

import torch
from liger_kernel.transformers.functional import liger_geglu


def forward(gate, up):
    with torch.enable_grad():
        g = gate.detach().clone().requires_grad_(True)
        u = up.detach().clone().requires_grad_(True)
        y = liger_geglu(g, u)
    return g, u, y


def gelu_tanh_mul_backward(dy, gate, up, state):
    g, u, y = state
    d_gate, d_up = torch.autograd.grad(y, (g, u), dy)
    return d_gate, d_up
