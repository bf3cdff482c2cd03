#!/usr/bin/env bash
# Builds, on this host (nvcc 13, no GPU needed), the kit bench/gpu_pipeline.sh runs on the GPU machine:
#
#   bash bench/gpu_pipeline_kit.sh KIT [GPU_KIT]
#
# GPU_KIT (default .gpu) is a kit of bench/gpu_kit.sh: its wheels, runtime libraries and the INT8 bundles of
# MobileNetV1-0.25 and ResNet-18 at batch 1 and 64 (--profile h200). Each bundle gets its frame library
# (compile/preprocess_kernel.py add_to_bundle: the preprocessing kernel and the postprocess function, the stage
# `edgedeploy build` now runs for GPU profiles), so the model libraries are the ones measured before. KIT/multi
# holds MobileNetV1-0.25 INT8 at batch 1 (the same bundle), 4 and 16 for bench/multi_source.py, built here by
# `edgedeploy build` (the h200 profile has no tuning records for batch 4 and 16: default schedules). KIT/lib has
# edgedeploy's CUDA backend (libedgedeploy_cuda.so, built here) beside the GPU kit's libraries. KIT also holds
# both videos and this tree's agent/ and bench/ (src/): the device tool copies the session's checkout, which need
# not be this one. KIT ignores itself. A bundle older than the kernel modules is rebuilt.
set -euo pipefail
kit=${1:?usage: $0 KIT [GPU_KIT]}
src=${2:-.gpu}
data=${EDGEDEPLOY_DATA:-$(cd .. && pwd)/shared/data}
[ -d "$data" ] || data=$(cd ../.. && pwd)/shared/data # a worktree under /work/wt/
py=.venv/bin/python
export PYTHONPATH=$PWD/host:$PWD/agent # this tree's compiler, not the venv's editable install
kernels=(host/edgedeploy/compile/preprocess_kernel.py host/edgedeploy/compile/postprocess_kernel.py)
fresh() { # the bundle exists and is newer than the kernel modules
  [ -f "$1" ] && [ "$1" -nt "${kernels[0]}" ] && [ "$1" -nt "${kernels[1]}" ]
}
mkdir -p "$kit"/{wheels,lib,bundles,multi,video,src}
echo '*' >"$kit/.gitignore"
cp "$src"/wheels/*.whl "$kit/wheels/"
cp "$src"/lib/* "$kit/lib/"
# edgedeploy's CUDA backend beside libtvm_runtime.so: the agent's `auto` takes it, as on a device it installed;
# gpu_pipeline.sh also runs the frame graphs' A/B on the wheel's (CUDA_BACKEND=tvm)
cp "$($py -c 'from edgedeploy.cuda_backend import build_backend; print(build_backend("x86_64"))')" "$kit/lib/"
cp "$data/video/bikes.mp4" "$data/video/bigbuckbunny.mp4" "$kit/video/"
rm -rf "$kit/src/agent" "$kit/src/bench"
cp -r agent bench "$kit/src/"
for b in "$src"/bundles/mobilenet_v1_0.25_224/*.int8.bs{1,64}.edb "$src"/bundles/resnet18/*.int8.bs{1,64}.edb; do
  out=$kit/bundles/$(basename "$b")
  fresh "$out" && continue
  $py - "$b" "$out" <<'PY'
import sys, tempfile
from pathlib import Path
from edgedeploy.compile.preprocess_kernel import add_to_bundle
from edgedeploy.profiles import get_profile
with tempfile.TemporaryDirectory() as tmp:
    m = add_to_bundle(Path(sys.argv[1]), Path(sys.argv[2]), get_profile("h200"), Path(tmp))
print(sys.argv[2], m.bundle_id, [a.path for a in m.artifacts])
PY
done
stem=mobilenet_v1_0.25_224
cp "$kit/bundles/$stem.int8.bs1.edb" "$kit/multi/"
for bs in 4 16; do
  out=$kit/multi/$stem.int8.bs$bs.edb
  fresh "$out" && continue
  start=$(date +%s)
  $py -m edgedeploy.cli.main build "$data/models/$stem.onnx" --profile h200 --card "examples/cards/$stem.toml" \
    --precision int8 --calibration "$data/imagenet-sample" --batch "$bs" -o "$out"
  echo "$out: built in $(($(date +%s) - start)) s"
done
du -sh "$kit"
