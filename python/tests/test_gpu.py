"""GPU: kernelize tiny models with the bundled exact kernels (local folder, as the hub would
hand them out once verified) and compare the logits bit for bit with eager.
Skips loudly without CUDA (CI has no GPU); run on the GPU machine with
`python3 -m pytest -q -rs python/tests/test_gpu.py`."""

import warnings

import pytest
import torch

import kernelize
from conftest import REPO

if not torch.cuda.is_available():
    warnings.warn("test_gpu.py: no CUDA device here: the launch path is NOT tested")
    pytest.skip("no CUDA device: GPU launch tests skipped (run on the GPU machine)",
                allow_module_level=True)

transformers = pytest.importorskip("transformers")
KERNELS = REPO / "kernels"
EXACT = ["rms_norm_llama", "rms_norm_gemma", "rms_norm_torch", "layer_norm", "silu",
         "silu_and_mul", "gelu", "gelu_tanh"]
DEV = torch.device("cuda")


def _bits_differ(a, b):
    v = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return int((a.contiguous().view(v) != b.contiguous().view(v)).sum())


def _llama(dtype):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=704,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=256)
    return transformers.LlamaForCausalLM(cfg).to(DEV, dtype).eval()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_llama_logits_bit_exact(dtype):
    model = _llama(dtype)
    with torch.no_grad():  # trained-looking weights: RMSNorm weights away from 1
        for m in model.modules():
            if "RMSNorm" in type(m).__name__:
                m.weight.copy_(1 + 0.3 * torch.randn_like(m.weight))
    ids = torch.randint(0, 512, (2, 100), device=DEV)
    with torch.no_grad():
        eager = model(ids).logits
    rep = kernelize.kernelize(model, kernels_dir=KERNELS, names=EXACT)
    assert rep.swapped and len(rep.replaced) == 7, str(rep)
    with torch.no_grad():
        got = model(ids).logits
    assert _bits_differ(got, eager) == 0, f"max abs diff {(got.float() - eager.float()).abs().max()}"
    assert kernelize.unkernelize(model) == 7
    with torch.no_grad():
        assert torch.equal(model(ids).logits, eager)


def test_gpt2_layernorm_gelu_bit_exact():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=512, n_embd=256, n_layer=2, n_head=4,
                                  n_positions=128, activation_function="gelu")
    model = transformers.GPT2LMHeadModel(cfg).to(DEV, torch.bfloat16).eval()
    ids = torch.randint(0, 512, (2, 100), device=DEV)
    with torch.no_grad():
        eager = model(ids).logits
    rep = kernelize.kernelize(model, kernels_dir=KERNELS, names=EXACT)
    assert {e.op for e in rep.replaced} == {"layer_norm", "gelu"}, str(rep)
    with torch.no_grad():
        got = model(ids).logits
    assert _bits_differ(got, eager) == 0
    kernelize.unkernelize(model)


@pytest.mark.parametrize("cols", [64, 127, 1000, 4096, 8192])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_layers_bit_exact(cols, dtype):
    from torch import nn
    layers = nn.ModuleDict({
        "rms": nn.RMSNorm(cols, eps=1e-6), "ln": nn.LayerNorm(cols), "silu": nn.SiLU(),
        "gelu": nn.GELU(), "gelu_tanh": nn.GELU(approximate="tanh"),
    }).to(DEV, dtype)
    with torch.no_grad():
        layers["rms"].weight.normal_(1, 0.3)
        layers["ln"].weight.normal_(1, 0.3)
        layers["ln"].bias.normal_(0, 0.1)
    x = torch.randn(33, cols, device=DEV, dtype=dtype) * 3
    with torch.no_grad():
        eager = {k: m(x) for k, m in layers.items()}
        rep = kernelize.kernelize(layers, kernels_dir=KERNELS, names=EXACT, verbose=False)
        assert len(rep.replaced) == 5, str(rep)
        for k, m in layers.items():
            assert _bits_differ(m(x), eager[k]) == 0, k
    kernelize.unkernelize(layers)


def test_autograd_and_other_dtypes_fall_back():
    model = _llama(torch.bfloat16)
    kernelize.kernelize(model, kernels_dir=KERNELS, names=EXACT, verbose=False)
    norm = model.model.norm
    x = torch.randn(4, 256, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    y = norm(x)
    y.float().sum().backward()  # the original forward ran: a graph exists
    assert x.grad is not None
    kernelize.unkernelize(model)
