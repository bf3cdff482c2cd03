# The host builder: everything `edgedeploy build` needs for every profile, pinned.
#   docker build -f containers/builder.Dockerfile -t edgedeploy-builder .
# CUDA 13 nvcc (sm_90) comes from the base image; sm_72 and sm_75 device code from the NVRTC 11.8 wheels of the
# `cuda11` extra (cubins every CUDA 11.4+ driver loads: docs/gpu.md); aarch64 host code and edgedeploy's CUDA
# backend from Debian's cross gcc/g++.
FROM nvidia/cuda:13.0.0-devel-ubuntu24.04
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
COPY . /src
RUN /src/containers/install-build-deps.sh && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/edgedeploy \
 && /opt/edgedeploy/bin/pip install --no-cache-dir "/src[host,cuda11]"
ENV PATH=/opt/edgedeploy/bin:/usr/local/cuda/bin:$PATH
WORKDIR /work
ENTRYPOINT ["edgedeploy"]
