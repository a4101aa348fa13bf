# Image of numaplane-exporter (and numaplane-scheduler), as referenced by deploy/.
# scripts/image builds that image with no registry and no Docker daemon, as an OCI archive to load
# onto the nodes (deploy/README.md, "Build and load the image"); the tests check that one. This
# Dockerfile builds an equivalent image on debian:bookworm-slim, where a registry serves the rust
# and debian base images.
# Build: docker build -t ghcr.io/numaplane/numaplane:0.1.0 .
FROM rust:1.95-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends libhwloc-dev libudev-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p numaplane-exporter -p numaplane-scheduler

FROM debian:bookworm-slim
# hwloc's runtime library (and libudev, which it links) only; no shell tools are needed.
RUN apt-get update && apt-get install -y --no-install-recommends libhwloc15 libudev1 ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/numaplane-exporter /src/target/release/numaplane-scheduler /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/numaplane-exporter"]
