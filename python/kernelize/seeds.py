"""The three models whose compiled outputs differ from eager in the PyTorch reports the project
was founded on, written in the project's own code (issue 31; docs/compile.md):

| name | report | what compile rewrites |
| --- | --- | --- |
| `attention` | pytorch#179578 | `matmul -> div -> softmax -> dropout -> matmul` into scaled-dot-product attention |
| `einsum_mha` | pytorch#179575 | einsum projections with a bias add |
| `linear_layer_norm` | PyTorch PR 177163 | `native_layer_norm` decomposed into `var_mean` arithmetic |

`build(name, dtype, device)` gives the model (seeded weights, eval mode) and its input.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor, nn


class SingleHeadAttention(nn.Module):
    """One attention head written out as in pytorch#179578: scores = q k^T / sqrt(d), softmax,
    dropout, times v."""

    def __init__(self, d: int = 256, dropout: float = 0.1):
        super().__init__()
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.dropout = nn.Dropout(dropout)
        self.scale = math.sqrt(d)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = torch.matmul(q, k.transpose(-2, -1)).div(self.scale)
        return torch.matmul(self.dropout(scores.softmax(dim=-1)), v)


class EinsumMHA(nn.Module):
    """Multi-head attention with einsum projections and bias adds (pytorch#179575)."""

    def __init__(self, d: int = 256, heads: int = 4):
        super().__init__()
        self.heads, self.dk = heads, d // heads
        g = torch.Generator().manual_seed(1)
        def p(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.randn(*shape, generator=g) / math.sqrt(shape[0]))
        self.wq, self.wk, self.wv = p(d, heads, self.dk), p(d, heads, self.dk), p(d, heads, self.dk)
        self.bq, self.bk, self.bv = p(heads, self.dk), p(heads, self.dk), p(heads, self.dk)
        self.wo = p(heads, self.dk, d)
        self.bo = nn.Parameter(torch.zeros(d))

    def forward(self, x: Tensor) -> Tensor:
        q = torch.einsum("bsd,dhk->bshk", x, self.wq) + self.bq
        k = torch.einsum("bsd,dhk->bshk", x, self.wk) + self.bk
        v = torch.einsum("bsd,dhk->bshk", x, self.wv) + self.bv
        a = torch.einsum("bqhk,bshk->bhqs", q, k).div(math.sqrt(self.dk)).softmax(-1)
        o = torch.einsum("bhqs,bshk->bqhk", a, v)
        return torch.einsum("bqhk,hkd->bqd", o, self.wo) + self.bo


class LinearLayerNormLinear(nn.Module):
    """Linear -> LayerNorm(1024) -> Linear, PR 177163's case."""

    def __init__(self, d_in: int = 256, d: int = 1024):
        super().__init__()
        self.up = nn.Linear(d_in, d)
        self.norm = nn.LayerNorm(d)
        self.down = nn.Linear(d, d_in)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.norm(self.up(x)))


SEEDS: dict[str, tuple[str, Callable[[], nn.Module], tuple[int, ...]]] = {
    # name: (report, model, input shape)
    "attention": ("pytorch#179578", SingleHeadAttention, (4, 64, 256)),
    "einsum_mha": ("pytorch#179575", EinsumMHA, (4, 64, 256)),
    "linear_layer_norm": ("PyTorch PR 177163", LinearLayerNormLinear, (4, 512, 256)),
}


def build(name: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
          seed: int = 0) -> tuple[nn.Module, Tensor]:
    """The seed model `name` (weights drawn from `seed`, eval mode) and an input for it."""
    if name not in SEEDS:
        raise ValueError(f"no seed model {name!r}: one of {', '.join(SEEDS)}")
    _, make, shape = SEEDS[name]
    torch.manual_seed(seed)
    model = make().to(device=device, dtype=dtype).eval()
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(*shape, generator=g).to(device=device, dtype=dtype)
    return model, x
