"""torch.compile's LayerNorm backward as a kernelize backward candidate (issue 30;
docs/backward.md, "The field's backward as Python candidates").

The op is a function of the saved statistics (docs/spec.md section 2c), so eager's own backward
op on them is compiled: Inductor decomposes `native_layer_norm_backward` (as it does in a
compiled training step's backward graph) into its own kernels.
"""

import torch

# The verifier calls with many shapes and eps values: allow the recompilations a real model would
# not need rather than fall back to eager silently.
torch._dynamo.config.cache_size_limit = 1024
if hasattr(torch._dynamo.config, "recompile_limit"):
    torch._dynamo.config.recompile_limit = 1024


def _backward(dy, x, mean, rstd, w):
    rows, cols = x.shape
    return torch.ops.aten.native_layer_norm_backward(
        dy, x, [cols], mean.reshape(rows, 1), rstd.reshape(rows, 1), w, torch.zeros_like(w),
        [True, True, True])


_compiled = torch.compile(_backward)


def layer_norm_backward(dy, x, mean, rstd, w):
    with torch.no_grad():
        dx, dw, db = _compiled(dy, x, mean, rstd, w)
    return dx, dw, db
