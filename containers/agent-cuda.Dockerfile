# An x86_64 CUDA device image (T4 or newer, driver R580+ for CUDA 13):
#   docker build -f containers/agent-cuda.Dockerfile -t edgedeploy-agent:cuda .
# The TVM wheel's CUDA runtime links libcudart.so.13, which the base image provides.
FROM nvidia/cuda:13.0.0-runtime-ubuntu24.04
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends python3 python3-venv python3-pip \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --create-home --home-dir /var/lib/edgedeploy edgedeploy
COPY . /src
RUN python3 -m venv /opt/edgedeploy \
 && /opt/edgedeploy/bin/pip install --no-cache-dir "/src[agent]" \
 && PATH=/opt/edgedeploy/bin:$PATH /src/containers/tvm-runtime-kit.sh /opt/tvm-runtime \
 && ln -s /usr/local/cuda/lib64/libcudart.so.13 /opt/tvm-runtime/libcudart.so.13 \
 && rm -rf /src
USER edgedeploy
ENV PATH=/opt/edgedeploy/bin:$PATH
RUN edgedeploy-agent --root /var/lib/edgedeploy init --service process \
      --tvm-runtime-lib /opt/tvm-runtime/libtvm_runtime.so
CMD ["edgedeploy-agent", "--root", "/var/lib/edgedeploy", "run"]
