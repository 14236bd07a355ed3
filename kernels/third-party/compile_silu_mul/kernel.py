"""torch.compile(silu(gate) * up) as a kernelize candidate."""

import torch
import torch.nn.functional as F

torch._dynamo.config.cache_size_limit = 1024
if hasattr(torch._dynamo.config, "recompile_limit"):
    torch._dynamo.config.recompile_limit = 1024


@torch.compile
def _silu_mul(gate, up):
    return F.silu(gate) * up


def silu_mul(gate, up):
    with torch.no_grad():
        return _silu_mul(gate, up)
