"""torch.compile's backward of silu(gate) * up as a kernelize backward candidate (issue 30;
docs/backward.md, "The field's backward as Python candidates").

Called under autograd, AOTAutograd traces the compiled product's backward and Inductor compiles
it: the gradients of a compiled training step. The compiled forward runs in `forward`, the
candidate's setup (`[setup]`, docs/spec.md section 2b), and the entry runs only the backward
(so the verifier times the backward alone).
"""

import torch
import torch.nn.functional as F

# The verifier calls with many shapes and eps values: allow the recompilations a real model would
# not need rather than fall back to eager silently.
torch._dynamo.config.cache_size_limit = 1024
if hasattr(torch._dynamo.config, "recompile_limit"):
    torch._dynamo.config.recompile_limit = 1024


@torch.compile
def _silu_mul(gate, up):
    return F.silu(gate) * up


def forward(gate, up):
    with torch.enable_grad():
        g = gate.detach().requires_grad_(True)
        u = up.detach().requires_grad_(True)
        y = _silu_mul(g, u)
    return g, u, y


def silu_mul_backward(dy, gate, up, state):
    g, u, y = state
    d_gate, d_up = torch.autograd.grad(y, (g, u), dy)
    return d_gate, d_up
