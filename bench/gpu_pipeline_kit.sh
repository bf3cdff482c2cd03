#!/usr/bin/env bash
# Builds, on this host (nvcc 13, no GPU needed), the kit bench/gpu_pipeline.sh runs on the GPU machine:
#
#   bash bench/gpu_pipeline_kit.sh KIT [GPU_KIT]
#
# GPU_KIT (default .gpu) is a kit of bench/gpu_kit.sh: its wheels, runtime libraries and the INT8 bundles of
# MobileNetV1-0.25 and ResNet-18 at batch 1 and 64 (--profile h200). Each bundle gets its preprocessing kernel
# (compile/preprocess_kernel.py add_to_bundle: the stage `edgedeploy build` now runs for GPU profiles), so the
# model libraries are the ones measured before. KIT also holds both videos and this tree's agent/ and bench/
# (src/): the device tool copies the session's checkout, which need not be this one. KIT ignores itself.
set -euo pipefail
kit=${1:?usage: $0 KIT [GPU_KIT]}
src=${2:-.gpu}
data=${EDGEDEPLOY_DATA:-$(cd .. && pwd)/shared/data}
[ -d "$data" ] || data=$(cd ../.. && pwd)/shared/data # a worktree under /work/wt/
py=.venv/bin/python
mkdir -p "$kit"/{wheels,lib,bundles,video,src}
echo '*' >"$kit/.gitignore"
cp "$src"/wheels/*.whl "$kit/wheels/"
cp "$src"/lib/* "$kit/lib/"
cp "$data/video/bikes.mp4" "$data/video/bigbuckbunny.mp4" "$kit/video/"
rm -rf "$kit/src/agent" "$kit/src/bench"
cp -r agent bench "$kit/src/"
for b in "$src"/bundles/mobilenet_v1_0.25_224/*.int8.bs{1,64}.edb "$src"/bundles/resnet18/*.int8.bs{1,64}.edb; do
  out=$kit/bundles/$(basename "$b")
  [ -f "$out" ] && continue
  PYTHONPATH=$PWD/host:$PWD/agent $py - "$b" "$out" <<'PY'
import sys, tempfile
from pathlib import Path
from edgedeploy.compile.preprocess_kernel import add_to_bundle
from edgedeploy.profiles import get_profile
with tempfile.TemporaryDirectory() as tmp:
    m = add_to_bundle(Path(sys.argv[1]), Path(sys.argv[2]), get_profile("h200"), Path(tmp))
print(sys.argv[2], m.bundle_id, [a.path for a in m.artifacts])
PY
done
du -sh "$kit"
