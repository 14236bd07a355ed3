"""kernelize_verifier: the verifier's Python programs (run by the Rust verifier as child
processes, not imported by users).

`python3 -m kernelize_verifier.model_level` is the model-level measurement (docs/verifier.md,
docs/python.md). These programs import the client package `kernelize` and measure a kernel
through the client's own discovery and launch path on purpose: what the verifier measures is
what a user's `kernelize.kernelize(model)` runs. They are not installed with the client
(python/pyproject.toml packages only `kernelize`); the verifier runs them from the repository's
python/ folder (`--python-path DIR` or `KERNELIZE_PYTHONPATH`), which holds both packages.
"""
