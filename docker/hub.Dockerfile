# syntax=docker/dockerfile:1
# The kernelize hub: `kernelize serve` (API + dashboard) with the bundled kernels/ loaded at
# start. Build from the top of the tree (docs/docker.md):
#   docker build -f docker/hub.Dockerfile -t kernelize-hub .
# tests/docker.rs checks this file against the binary (command lines, environment, COPY
# sources, user, health check); no Docker engine runs in CI.

# Debian bookworm for both stages: a binary linked against its glibc (2.36) also runs on the
# worker's Ubuntu 24.04 base.
ARG RUST_IMAGE=rust:1.95-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

# ---- build: the release binary, made by scripts/build-release as scripts/gpu-stage makes it
# (the same stage as in worker.Dockerfile).
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

# ---- hub: a small runtime image, run as an unprivileged user.
FROM ${RUNTIME_IMAGE} AS hub
ARG UID=10001
# /var/lib/kernelize: the SQLite database when no PostgreSQL is given (a volume).
# /var/lib/kernelize-token: where `kernelize token ensure` leaves the GPU workers' token (a
# volume shared with the workers in docker/compose.yaml; the same UID reads it there).
RUN useradd --system --uid "${UID}" --user-group --create-home --home-dir /home/kernelize \
        --shell /usr/sbin/nologin kernelize \
    && mkdir -p /var/lib/kernelize /var/lib/kernelize-token \
    && chown kernelize:kernelize /var/lib/kernelize /var/lib/kernelize-token \
    && chmod 0700 /var/lib/kernelize-token
COPY --from=build /usr/local/bin/kernelize /usr/local/bin/kernelize
COPY kernels /app/kernels
WORKDIR /app
ENV KERNELIZE_DB=sqlite:///var/lib/kernelize/kernelize.db
VOLUME ["/var/lib/kernelize"]
USER kernelize
EXPOSE 8080
# `kernelize health` GETs /healthz (which also queries the database): no curl in the image.
HEALTHCHECK --interval=30s --timeout=10s --start-period=30s --retries=3 \
    CMD ["kernelize", "health", "--server", "http://127.0.0.1:8080"]
ENTRYPOINT ["kernelize"]
CMD ["serve", "--bind", "0.0.0.0:8080", "--kernels", "/app/kernels"]
