#!/usr/bin/env bash
# Local stand-ins for the images' base images, for machines that reach Debian's package archive but
# no image registry: a Debian bookworm root made by debootstrap (minbase + python3, venv, pip,
# ca-certificates) and `docker import`ed. It is tagged as the two bases the Dockerfiles take:
#   lightbox-standin/python:3.11-slim   for infra/Dockerfile      (--build-arg BASE=...)
#   lightbox-standin/cuda:runtime       for infra/Dockerfile.gpu  (--build-arg CUDA_BASE=...)
# The GPU stand-in has no CUDA libraries: it proves the image builds and that the GPU ONNX Runtime
# is the one installed, not that a GPU runs it. Idempotent: an existing tag is kept.
# Usage: infra/images/standin-base.sh   (root; needs debootstrap and a running dockerd)
set -euo pipefail
PY_TAG=lightbox-standin/python:3.11-slim
CUDA_TAG=lightbox-standin/cuda:runtime
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if ! docker image inspect "$PY_TAG" >/dev/null 2>&1; then
  root=$(mktemp -d /tmp/lightbox-standin.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    bookworm "$root" "$MIRROR" >/dev/null
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | docker import -c 'CMD ["python3"]' - "$PY_TAG" >/dev/null
fi
docker tag "$PY_TAG" "$CUDA_TAG"
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep lightbox-standin
