#!/usr/bin/env bash
# Debian/Ubuntu packages a build host needs; the builder image and CI both run this script.
#   gcc, libc6-dev: TVM links exported libraries (and the stub CUDA driver for GPU-less hosts)
#   gcc-aarch64-linux-gnu: host code for Jetson profiles;  binutils: readelf checks;  make: README commands
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends gcc libc6-dev gcc-aarch64-linux-gnu binutils make "$@" >/dev/null
