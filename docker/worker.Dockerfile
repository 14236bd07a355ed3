# syntax=docker/dockerfile:1
# A kernelize GPU worker: `kernelize worker` verifying a hub's queued kernels on one GPU.
# Build from the top of the tree (docs/docker.md):
#   docker build -f docker/worker.Dockerfile -t kernelize-worker .
#   docker build -f docker/worker.Dockerfile --target worker-model -t kernelize-worker-model .
# Run with the NVIDIA container runtime (it mounts the host driver's libcuda.so.1):
#   docker run --gpus device=0 -e KERNELIZE_SERVER=http://HUB:8080 -e KERNELIZE_TOKEN=kz_... kernelize-worker
# tests/docker.rs checks this file against the binary; no Docker engine runs in CI.

ARG RUST_IMAGE=rust:1.95-bookworm
# CUDA 13.0, the version the verifier is built for (cudarc's cuda-13000) and was run with.
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-runtime-ubuntu24.04

# ---- build: the release binary, made by scripts/build-release as scripts/gpu-stage makes it
# (the same stage as in hub.Dockerfile).
FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY kernel-registry kernel-registry
COPY kernel-store kernel-store
COPY verifier verifier
COPY server server
COPY migrations migrations
COPY tests tests
COPY scripts/build-release scripts/build-release
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    scripts/build-release && install -m 0755 target/release/kernelize /usr/local/bin/kernelize

# ---- worker-base: CUDA runtime + what NVRTC needs at run time.
FROM ${CUDA_IMAGE} AS worker-base
# The runtime image brings libnvrtc.so.13 (cuda-libraries); cudarc loads it and libcuda.so.1
# at run time. NVRTC does not find cuda_bf16.h / cuda_fp16.h on its own: the verifier passes
# --include-path=$CUDA_HOME/include, so these headers (and the ones they include: vector_types.h,
# crt/host_defines.h, ...) must be there. If a kernel's compile still misses a header, build on
# the devel image instead: --build-arg CUDA_IMAGE=nvidia/cuda:13.0.2-devel-ubuntu24.04
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        cuda-cudart-dev-13-0 cuda-crt-13-0 cuda-cccl-13-0 \
    && rm -rf /var/lib/apt/lists/* \
    && test -f /usr/local/cuda/include/cuda_bf16.h \
    && test -f /usr/local/cuda/include/cuda_fp16.h \
    && test -f /usr/local/cuda/include/vector_types.h \
    && test -f /usr/local/cuda/include/crt/host_defines.h \
    && ls /usr/local/cuda/lib64/libnvrtc.so.13* >/dev/null
ARG UID=10001
# /var/cache/kernelize: the CUBIN compile cache (a volume; entries are written atomically, so
# workers on one host may share it). /var/lib/kernelize-token: the token volume written by
# `kernelize token ensure` in docker/compose.yaml, read with the same UID.
RUN useradd --system --uid "${UID}" --user-group --create-home --home-dir /home/kernelize \
        --shell /usr/sbin/nologin kernelize \
    && mkdir -p /var/cache/kernelize/cubin /var/lib/kernelize-token \
    && chown -R kernelize:kernelize /var/cache/kernelize /var/lib/kernelize-token
COPY --from=build /usr/local/bin/kernelize /usr/local/bin/kernelize
# The bundled kernels, for a smoke test in the container (`kernelize verify /app/kernels/silu --quick`).
COPY kernels /app/kernels
WORKDIR /app
ENV CUDA_HOME=/usr/local/cuda \
    KERNELIZE_COMPILE_CACHE=/var/cache/kernelize/cubin
VOLUME ["/var/cache/kernelize"]
USER kernelize
# Healthy: the hub (KERNELIZE_SERVER) answers and this container sees a usable GPU. A worker
# that loses its GPU or its hub exits non-zero; a restart policy brings it back.
HEALTHCHECK --interval=30s --timeout=10s --start-period=20s --retries=3 \
    CMD ["kernelize", "health", "--gpu"]
ENTRYPOINT ["kernelize"]
CMD ["worker"]

# ---- worker-model: also measures kernels inside the shipped models (`--model`, which the
# `argmax` policy needs): Python with torch (CUDA 13.0 wheels) and transformers, the
# `kernelize_verifier` Python package (the model-level harness) with the `kernelize` client it
# imports, and models/. Several GB larger.
FROM worker-base AS worker-model
USER root
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir "torch>=2.9" --index-url https://download.pytorch.org/whl/cu130 \
    && /opt/venv/bin/pip install --no-cache-dir "transformers>=4.45" safetensors
COPY python/kernelize /app/python/kernelize
COPY python/kernelize_verifier /app/python/kernelize_verifier
COPY models /app/models
ENV KERNELIZE_PYTHON=/opt/venv/bin/python \
    KERNELIZE_PYTHONPATH=/app/python
USER kernelize
CMD ["worker", "--model", "/app/models"]

# ---- worker (the default target): worker-base as is.
FROM worker-base AS worker
