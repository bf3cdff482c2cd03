# A CPU device image for edgedeploy-agent (x86_64). Build from the repository root:
#   docker build -f containers/agent-cpu.Dockerfile -t edgedeploy-agent:cpu .
FROM python:3.9-slim-bookworm
RUN useradd --system --create-home --home-dir /var/lib/edgedeploy edgedeploy
COPY . /src
RUN python -m pip install --no-cache-dir "/src[agent]" \
 && /src/containers/tvm-runtime-kit.sh /opt/tvm-runtime \
 && rm -rf /src
USER edgedeploy
RUN edgedeploy-agent --root /var/lib/edgedeploy init --service process --tvm-runtime-lib /opt/tvm-runtime/libtvm_runtime.so
CMD ["edgedeploy-agent", "--root", "/var/lib/edgedeploy", "run"]
