"""kernelize's exact compile of silu(gate) * up (kernelize.exact.backend) as a candidate."""

import torch
import torch.nn.functional as F

from kernelize import exact  # the client package: pass its folder with --candidate-packages

torch._dynamo.config.cache_size_limit = 1024
if hasattr(torch._dynamo.config, "recompile_limit"):
    torch._dynamo.config.recompile_limit = 1024


@torch.compile(backend=exact.backend)
def _silu_mul(gate, up):
    return F.silu(gate) * up


def silu_mul(gate, up):
    with torch.no_grad():
        return _silu_mul(gate, up)
