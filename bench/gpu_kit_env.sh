# Sourced by the GPU machine's scripts (bench/gpu_variants.sh, bench/gpu_ncu.sh) with KIT set: the kit's
# wheels installed into /tmp/site, the agent and bench/ importable, and the TVM runtime with libcudart.so.13
# beside its CUDA backend (RUNPATH $ORIGIN) in /tmp/kitlib.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$kit"/wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD/agent:$PWD/bench PYTHONUNBUFFERED=1
mkdir -p /tmp/kitlib
cp "$kit"/lib/* /tmp/kitlib/
export TVM_RUNTIME_LIB=/tmp/kitlib/libtvm_runtime.so
