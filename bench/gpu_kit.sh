#!/usr/bin/env bash
# Prepares what bench/gpu_e2e.sh needs on the GPU machine, on the build host (no GPU needed):
#   bash bench/gpu_kit.sh KIT     (then carry KIT; keep it git-ignored)
set -euo pipefail
kit=${1:?usage: $0 KIT}
data=${EDGEDEPLOY_TEST_DATA:-$(cd .. && pwd)/shared/data}
py=.venv/bin/python; ed=.venv/bin/edgedeploy
mkdir -p "$kit/wheels" "$kit/lib" "$kit/bundles"
$py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$kit/wheels" apache-tvm-ffi==0.1.14.post1 pydantic==2.13.4 pydantic-core==2.46.4 annotated-types typing-inspection typing-extensions
tvmlib=$($py -c "import importlib.util as u, pathlib; print(pathlib.Path(u.find_spec('tvm').submodule_search_locations[0]) / 'lib')")
cp "$tvmlib/libtvm_runtime.so" "$tvmlib/libtvm_runtime_cuda.so" "$kit/lib/"
cp -L "${CUDA_PATH:-/usr/local/cuda}/lib64/libcudart.so.13" "$kit/lib/"
cp "$data/models/mobilenet_v1_0.25_224.onnx" "$kit/"
cp "$data/video/bikes.mp4" "$kit/video.mp4"
for prec in fp32 fp16 int8; do
  calib=(); [ "$prec" = int8 ] && calib=(--calibration "$data/imagenet-sample")
  for bs in 1 64; do
    $ed build "$data/models/mobilenet_v1_0.25_224.onnx" --profile h200 --card examples/cards/mobilenet_v1_0.25_224.toml \
      --precision "$prec" "${calib[@]}" --batch "$bs" -o "$kit/bundles/mobilenet_v1_0.25_224.$prec.bs$bs.edb"
  done
done
du -sh "$kit"
