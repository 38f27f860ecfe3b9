#!/usr/bin/env bash
# Build lightbox:cpu (infra/Dockerfile) and lightbox:gpu (infra/Dockerfile.gpu) from the repository root.
# Base images: the real ones (python:3.11-slim, nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04) when they
# are present or can be pulled, else local Debian stand-ins (infra/images/standin-base.sh).
# The CA certificates under /usr/local/share/ca-certificates (an egress proxy's, on some networks) go
# to the build stages only, as the EXTRA_CA_CERTS build argument. Prints each build's time and size.
# Usage: infra/images/build.sh [cpu] [gpu]      (both by default)
set -euo pipefail
cd "$(dirname "$0")/../.."
flavours=("$@"); [ ${#flavours[@]} -gt 0 ] || flavours=(cpu gpu)

have() { docker image inspect "$1" >/dev/null 2>&1 || docker pull -q "$1" >/dev/null 2>&1; }
CPU_BASE=python:3.11-slim
CUDA_BASE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04
if ! have "$CPU_BASE" || ! have "$CUDA_BASE"; then
  echo "no registry: building on local stand-ins for $CPU_BASE and $CUDA_BASE"
  if ! command -v debootstrap >/dev/null 2>&1; then
    echo "the base images cannot be pulled and the local stand-ins need debootstrap: apt-get install debootstrap" >&2
    exit 1
  fi
  infra/images/standin-base.sh
  CPU_BASE=lightbox-standin/python:3.11-slim
  CUDA_BASE=lightbox-standin/cuda:runtime
fi
ca=""
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  ca="$(cat /usr/local/share/ca-certificates/*.crt)"
fi

for flavour in "${flavours[@]}"; do
  case "$flavour" in
    cpu) file=infra/Dockerfile; arg="BASE=$CPU_BASE" ;;
    gpu) file=infra/Dockerfile.gpu; arg="CUDA_BASE=$CUDA_BASE" ;;
    *) echo "unknown flavour $flavour (cpu or gpu)" >&2; exit 2 ;;
  esac
  start=$(date +%s)
  log="${TMPDIR:-/tmp}/lightbox-image-$flavour.log"
  if ! docker build -f "$file" --build-arg "$arg" --build-arg "EXTRA_CA_CERTS=$ca" -t "lightbox:$flavour" . >"$log" 2>&1; then
    tail -n 40 "$log" >&2; echo "docker build of lightbox:$flavour failed (log: $log)" >&2; exit 1
  fi
  size=$(docker image inspect -f '{{.Size}}' "lightbox:$flavour")
  echo "lightbox:$flavour built in $(( $(date +%s) - start )) s, $(( size / 1000000 )) MB"
done
