"""Liger-Kernel's LayerNorm backward as a kernelize backward candidate (issue 30; docs/backward.md,
"The field's backward as Python candidates").

Imports the installed package; no Liger code is copied here. The op is a function of the saved
statistics (docs/spec.md section 2c): Liger's backward is called on the given mean and rstd (its
forward would save them in x's dtype; that is its forward's business). Liger reads b only for
db's dtype: a zero tensor of w's stands for it.
"""

import torch
from liger_kernel.ops.layer_norm import layer_norm_backward as _liger_backward


def layer_norm_backward(dy, x, mean, rstd, w):
    rows = x.shape[0]
    dx, dw, db = _liger_backward(dy.contiguous(), x.contiguous(), w, torch.zeros_like(w),
                                 mean.reshape(rows).contiguous(), rstd.reshape(rows).contiguous())
    return dx, dw, db
