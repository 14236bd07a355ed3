"""F.rms_norm posing as LlamaRMSNorm, as a kernelize candidate."""

import torch.nn.functional as F


def rms_norm(x, weight, eps):
    return F.rms_norm(x, x.shape[-1:], weight, eps)
