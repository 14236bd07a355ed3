"""torch.compile's backward of HF LlamaRMSNorm as a kernelize backward candidate (issue 30;
docs/backward.md, "The field's backward as Python candidates").

The layer's formula (transformers' LlamaRMSNorm.forward, op by op) is compiled; called under
autograd, AOTAutograd traces its backward and Inductor compiles it: the gradients are those of a
compiled training step. The compiled forward runs too (its output is dropped).
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


def rms_norm_backward(dy, x, w, eps):
    with torch.enable_grad():
        xr = x.detach().requires_grad_(True)
        wr = w.detach().requires_grad_(True)
        dx, dw = torch.autograd.grad(_compiled(xr, wr, eps), (xr, wr), dy)
    return dx, dw
