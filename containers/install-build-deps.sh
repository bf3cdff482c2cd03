#!/usr/bin/env bash
# Debian/Ubuntu packages a build host needs; the builder image and CI both run this script.
#   gcc, libc6-dev: TVM links exported libraries (and the stub CUDA driver for GPU-less hosts)
#   g++, g++-aarch64-linux-gnu: edgedeploy's CUDA backend for the TVM runtime (host/edgedeploy/cuda_backend.py)
#   gcc-aarch64-linux-gnu + libc6-dev-arm64-cross: host code for Jetson profiles (the cross libc's crti.o
#   is only a Recommends of the compiler, which --no-install-recommends skips);  binutils: readelf checks;  make: README commands
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends gcc g++ libc6-dev gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-dev-arm64-cross binutils make "$@" >/dev/null
