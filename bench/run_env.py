"""The header every bench script records with its results: when, on what, with which versions,
by which command (one home for it; the scripts run as `python3 bench/NAME.py`, so this folder
is on their path)."""
from __future__ import annotations

import sys
import time

import torch


def run_env(device: str | None = None, **extra) -> dict:
    """date (UTC), device (the CUDA device's name, or `device`), torch, CUDA, Triton and
    transformers where importable, the command line, then `extra`."""
    env = dict(date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               device=device or (torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"),
               torch=torch.__version__, cuda=torch.version.cuda)
    for name in ("triton", "transformers"):
        try:
            env[name] = __import__(name).__version__
        except ImportError:
            pass
    env.update(extra, command=" ".join(sys.argv))
    return env
