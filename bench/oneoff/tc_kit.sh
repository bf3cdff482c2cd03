#!/usr/bin/env bash
# Kept for the record (bench/oneoff/README.md): issue 12's tensor-core before/after (docs/benchmarks.md,
# tensorcore run1-run3). bench/gpu_kit.sh + bench/gpu_variants.sh do this job now and are maintained.
# Before/after kit for tensor-core convolutions (issue 12, item 2), on the build host (no GPU needed):
#   bash bench/oneoff/tc_kit.sh KIT [PRECISIONS] [BATCHES]      e.g. bash bench/tc_kit.sh .tc "fp16 int8" "64 1"
# (.tc and .tc.tar.xz are git-ignored: carry .tc.tar.xz to the GPU machine explicitly)
# Builds ResNet-18 (bench/resnet18_onnx.py, random weights) for --profile h200 twice per precision and
# batch: with tensor cores (this branch's default) and without (EDGEDEPLOY_CUDA_TENSOR_CORES=0, the
# previous kernels), names them resnet18.<prec>.bs<N>.<tc|default>.edb, adds the runtime libraries and
# cp312 wheels, and packs everything into KIT.tar.xz (carry that one file; it must stay under 64 MiB).
# On the GPU machine: bash bench/oneoff/gpu_tc.sh KIT.tar.xz $OUT
set -euo pipefail
kit=${1:?usage: $0 KIT [PRECISIONS] [BATCHES]}
precisions=${2:-fp16 int8}; batches=${3:-64 1}
data=${EDGEDEPLOY_DATA:-$(cd .. && pwd)/shared/data}
py=.venv/bin/python; ed=.venv/bin/edgedeploy
mkdir -p "$kit/wheels" "$kit/lib" "$kit/bundles"
[ -f "$kit/resnet18.onnx" ] || $py bench/resnet18_onnx.py "$kit/resnet18.onnx" --weights tiled --seed 0  # needs torch (CPU wheel)
$py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$kit/wheels" apache-tvm-ffi==0.1.14.post1 pydantic==2.13.4 pydantic-core==2.46.4 annotated-types typing-inspection typing-extensions
tvmlib=$($py -c "import importlib.util as u, pathlib; print(pathlib.Path(u.find_spec('tvm').submodule_search_locations[0]) / 'lib')")
cp "$tvmlib/libtvm_runtime.so" "$tvmlib/libtvm_runtime_cuda.so" "$kit/lib/"
cp -L "${CUDA_PATH:-/usr/local/cuda}/lib64/libcudart.so.13" "$kit/lib/"
for prec in $precisions; do
  calib=(); [ "$prec" = int8 ] && calib=(--calibration "$data/imagenet-sample" --samples 32)
  for bs in $batches; do
    for variant in tc default; do
      b="$kit/bundles/resnet18.$prec.bs$bs.$variant.edb"
      [ -f "$b" ] && continue
      tc=1; [ "$variant" = default ] && tc=0
      start=$(date +%s)
      EDGEDEPLOY_CUDA_TENSOR_CORES=$tc $ed build "$kit/resnet18.onnx" --profile h200 --precision "$prec" \
        "${calib[@]}" --batch "$bs" --mean 123.7,116.3,103.5 --std 58.4,57.1,57.4 -o "$b"
      echo "$b built in $(( $(date +%s) - start )) s"
      $py bench/tc_sass.py "$b" | tee -a "$kit/sass.txt"
    done
  done
done
rm -f "$kit/resnet18.onnx"          # the bundles hold the model; gpu_tc.sh needs none
tar -C "$(dirname "$kit")" -cJf "$kit.tar.xz" "$(basename "$kit")"
du -sh "$kit" "$kit.tar.xz"
