#!/usr/bin/env bash
# Install what the Python tests need into python/.venv (idempotent; reused when complete).
# torch comes from PyPI (the only index reachable here): the Linux x86_64 wheel pulls the
# CUDA runtime packages too (about 5.6 GB installed, ~5 minutes on the build machine); the
# tests themselves only use the CPU.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if .venv/bin/python -c "import torch, transformers, pytest" 2>/dev/null; then
  echo "python/.venv: torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'), transformers present"
else
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "torch>=2.8" "transformers>=4.45" pytest
fi
# The certificate checks (kernelize[certs]): ed25519 and RFC 8785 canonical JSON.
if ! .venv/bin/python -c "import cryptography, rfc8785" 2>/dev/null; then
  .venv/bin/python -m pip install -q "cryptography>=42" "rfc8785>=0.1.4"
fi
# schemathesis fuzzes the API from its OpenAPI document (tests/schemathesis.rs, run by
# scripts/test after this).
if [ -x .venv/bin/schemathesis ]; then
  echo "python/.venv: $(.venv/bin/schemathesis --version)"
else
  .venv/bin/python -m pip install -q "schemathesis>=4.3,<5"
fi
