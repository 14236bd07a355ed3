"""Liger-Kernel's GeGLU backward as a kernelize backward candidate (issue 30; docs/backward.md,
"The field's backward as Python candidates").

Imports the installed package; no Liger code is copied here. Liger's GeGLU backward writes the
gradients into the tensors its forward saved (gate and up): they are copies here, never the
caller's inputs. Its forward runs too (the autograd node it builds is the backward's).
"""

import torch
from liger_kernel.transformers.functional import liger_geglu


def gelu_tanh_mul_backward(dy, gate, up):
    with torch.enable_grad():
        g = gate.detach().clone().requires_grad_(True)
        u = up.detach().clone().requires_grad_(True)
        d_gate, d_up = torch.autograd.grad(liger_geglu(g, u), (g, u), dy)
    return d_gate, d_up
