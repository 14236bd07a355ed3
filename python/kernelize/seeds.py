"""The three models whose compiled outputs differ from eager in the PyTorch reports the project
was founded on, written in the project's own code (issue 31; docs/compile.md):

| name | report | what compile rewrites |
| --- | --- | --- |
| `attention` | pytorch#179578 | `matmul -> div -> softmax -> dropout -> matmul` into scaled-dot-product attention |
| `einsum_mha` | pytorch#179575 | einsum projections with a bias add |
| `linear_layer_norm` | PyTorch PR 177163 | `native_layer_norm` decomposed into `var_mean` arithmetic |

Beside them, `BLOCKS`: two more pieces of a model that issue 31 asks the rewrite table to cover,
rotary position embedding and attention through `F.scaled_dot_product_attention`.

`build(name, dtype, device)` gives the model (seeded weights, eval mode) and its input, for a
seed or a block.
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


class RotaryEmbedding(nn.Module):
    """A projection's heads rotated by position as Llama's attention rotates q and k (its rotary
    embedding: inverse frequencies and the angles in f32, cos and sin cast to the input's dtype,
    `x * cos + rotate_half(x) * sin`)."""

    def __init__(self, d: int = 256, heads: int = 4, base: float = 10000.0):
        super().__init__()
        self.heads, self.dk = heads, d // heads
        self.proj = nn.Linear(d, d, bias=False)
        self.register_buffer("inv_freq", 1.0 / (base ** (torch.arange(0, self.dk, 2).float() / self.dk)),
                             persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        b, s, _ = x.shape
        q = self.proj(x).view(b, s, self.heads, self.dk).transpose(1, 2)
        pos = torch.arange(s, device=x.device, dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq.float())
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        half = self.dk // 2
        rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
        return (q * cos + rotated * sin).transpose(1, 2).reshape(b, s, -1)


class SdpaAttention(nn.Module):
    """Causal multi-head self-attention through `F.scaled_dot_product_attention`: one qkv
    projection, the heads, `is_causal=True`, the output projection."""

    def __init__(self, d: int = 256, heads: int = 4):
        super().__init__()
        self.heads, self.dk = heads, d // heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x: Tensor) -> Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.dk).permute(2, 0, 3, 1, 4)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(o.transpose(1, 2).reshape(b, s, d))


BLOCKS: dict[str, tuple[str, Callable[[], nn.Module], tuple[int, ...]]] = {
    # name: (what, model, input shape)
    "rotary": ("rotary position embedding (Llama's)", RotaryEmbedding, (4, 64, 256)),
    "sdpa_attention": ("causal attention via F.scaled_dot_product_attention", SdpaAttention,
                       (4, 64, 256)),
}


def build(name: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
          seed: int = 0) -> tuple[nn.Module, Tensor]:
    """The seed model or block `name` (weights drawn from `seed`, eval mode) and an input for it."""
    models = {**SEEDS, **BLOCKS}
    if name not in models:
        raise ValueError(f"no seed model or block {name!r}: one of {', '.join(models)}")
    _, make, shape = models[name]
    torch.manual_seed(seed)
    model = make().to(device=device, dtype=dtype).eval()
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(*shape, generator=g).to(device=device, dtype=dtype)
    return model, x
