"""torch.compile's backward of HF LlamaRMSNorm as a kernelize backward candidate (issue 30;
docs/backward.md, "The field's backward as Python candidates").

The layer's formula (transformers' LlamaRMSNorm.forward, op by op) is compiled; called under
autograd, AOTAutograd traces its backward and Inductor compiles it: the gradients are those of a
compiled training step. The compiled forward runs in `forward`, the candidate's setup (`[setup]`,
docs/spec.md section 2b), and the entry runs only the backward (so the verifier times the
backward alone).
"""

import torch

# The verifier calls with many shapes and eps values: allow the recompilations a real model would
# not need rather than fall back to eager silently.
torch._dynamo.config.cache_size_limit = 1024
if hasattr(torch._dynamo.config, "recompile_limit"):
    torch._dynamo.config.recompile_limit = 1024


def _llama_rms_norm(x, w, eps):
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


_compiled = torch.compile(_llama_rms_norm)


def forward(x, w, eps):
    with torch.enable_grad():
        xr = x.detach().requires_grad_(True)
        wr = w.detach().requires_grad_(True)
        y = _compiled(xr, wr, eps)
    return xr, wr, y


def rms_norm_backward(dy, x, w, eps, state):
    xr, wr, y = state
    dx, dw = torch.autograd.grad(y, (xr, wr), dy)
    return dx, dw
