#!/usr/bin/env python3
"""Where the exact norm kernels and eager part ways inside the shipped models (GPU only).

    python3 models/norm_mismatch.py        # from the repository root, after models/train.py

Captures the input of every LlamaRMSNorm (tiny-llama) and nn.LayerNorm (tiny-gpt2) during a bf16
forward over the first T bytes of models/eval.txt, runs kernels/rms_norm_llama resp.
kernels/layer_norm on the same input and prints, per T, how many output elements differ bit for
bit from eager, per layer; then the same on random N(0, 4) rows of the same width, by row count.
The model-level difference the harness reports comes from these few elements.
"""
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
import kernelize.launch as L  # noqa: E402
from kernelize import DirSource  # noqa: E402
from kernelize_verifier.model_level import byte_ids, load_model  # noqa: E402

dev = torch.device("cuda", 0)


def compiled(name):
    m, s, d = DirSource(REPO / "kernels" / name).kernels[0]
    return L.compiled(d, m, s, "bf16", dev)


def bits_differ(a, b):
    return int((a.view(torch.int16) != b.view(torch.int16)).sum())


def main():
    kr, kl = compiled("rms_norm_llama"), compiled("layer_norm")
    ids = torch.tensor(byte_ids((REPO / "models" / "eval.txt").read_text(encoding="utf-8")), device=dev)
    cases = (("tiny-llama", "LlamaRMSNorm",
              lambda m, x: L.run_rms_norm(kr, x, m.weight, m.variance_epsilon)),
             ("tiny-gpt2", "LayerNorm",
              lambda m, x: L.run_layer_norm(kl, x, m.weight, m.bias, m.eps)))
    for name, cls, run in cases:
        model = load_model(REPO / "models" / name, "bf16", dev)
        caps = []
        for mod in model.modules():
            if type(mod).__name__ == cls:
                mod.register_forward_hook(lambda mod, i, o: caps.append((mod, i[0], o)))
        for T in (50, 100, 200, 256, 300, 512, 1024):
            caps.clear()
            with torch.no_grad():
                model(input_ids=ids[None, :T], use_cache=False)
                mm = [bits_differ(run(mod, x), y) for mod, x, y in caps]
            print(name, "tokens", T, "mismatched", sum(mm), "of", sum(y.numel() for _, _, y in caps),
                  mm, "max|x|", max(float(x.abs().max()) for _, x, _ in caps))
        mod = caps[0][0]
        for R in (1, 8, 64, 100, 128, 200, 256, 257, 512, 1024, 4096):
            torch.manual_seed(R)
            x = (torch.randn(R, 256, device=dev) * 2).bfloat16()
            with torch.no_grad():
                print(name, "random rows", R, "mismatched", bits_differ(run(mod, x), mod(x)),
                      "of", x.numel())


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit("norm_mismatch.py launches kernels: run it on a CUDA GPU")
    main()
