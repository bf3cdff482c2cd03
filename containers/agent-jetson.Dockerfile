# A Jetson Xavier device image (JetPack 5.1 / L4T r35, aarch64, CUDA 11.4). NOT VERIFIED: built on a
# Jetson (or an aarch64 builder with the L4T base), see docs/gpu.md.
#   docker build -f containers/agent-jetson.Dockerfile --build-arg TVM_SRC=tvm -t edgedeploy-agent:jetson .
FROM nvcr.io/nvidia/l4t-jetpack:r35.4.1
ARG TVM_SRC=tvm
# Ubuntu 20.04's python3.9 for the agent; JetPack's own OpenCV (with GStreamer) is built for 3.8 only,
# so the venv gets pip's OpenCV (no GStreamer: V4L2/file sources) unless a 3.9 GStreamer build is added.
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends python3.9 python3.9-venv cmake ninja-build g++ \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --create-home --home-dir /var/lib/edgedeploy --groups video edgedeploy
COPY . /src
COPY ${TVM_SRC} /tvm
RUN python3.9 -m venv /opt/edgedeploy \
 && /opt/edgedeploy/bin/pip install --no-cache-dir "/src[agent]" \
 && /src/containers/jetson-runtime.sh /opt/tvm-runtime /tvm \
 && rm -rf /src /tvm
USER edgedeploy
ENV PATH=/opt/edgedeploy/bin:$PATH
RUN edgedeploy-agent --root /var/lib/edgedeploy init --service process \
      --tvm-runtime-lib /opt/tvm-runtime/libtvm_runtime.so
CMD ["edgedeploy-agent", "--root", "/var/lib/edgedeploy", "run"]
