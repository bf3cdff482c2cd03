#!/usr/bin/env bash
# The GPU benchmark (bench/gpu_vs_torch.py: edgedeploy bundles vs PyTorch eager / torch.compile, in one
# process) on the GPU machine (H200, python3 3.12 with torch 2.11 + torchvision 0.26 + nvidia-ml-py +
# opencv, CUDA 13 driver), from the repo root, with the kit that bench/gpu_kit.sh made here:
#
#   bash bench/gpu_bench.sh KIT OUT [MODELS] [BATCHES] [more gpu_vs_torch.py options]
#
# Carry (the repo's tracked files travel anyway): the kit's common part and ONE model's bundles, < 60 MiB:
#   RESNET = [".gpu/wheels", ".gpu/lib", ".gpu/models", ".gpu/images", ".gpu/KIT.json", ".gpu/bundles/resnet18"]
#   MOBILE = [".gpu/wheels", ".gpu/lib", ".gpu/models", ".gpu/images", ".gpu/KIT.json",
#             ".gpu/bundles/mobilenet_v1_0.25_224"]
# With the device tool (kind nvidia-h200, timeout_s 600), three calls, back to back so that the machine
# stays warm (inductor's cache in /tmp then serves the later calls):
#   carry RESNET: bash bench/gpu_bench.sh .gpu $OUT resnet18 1
#   carry RESNET: bash bench/gpu_bench.sh .gpu $OUT resnet18 64
#   carry MOBILE: bash bench/gpu_bench.sh .gpu $OUT mobilenet_v1_0.25_224 1,64
# Each should take 3-6 minutes (not yet measured: most of it is torch.compile, max-autotune the longest);
# gpu_vs_torch.py starts no compile after --deadline-s 450 less its reserve (printed as skipped; timing and
# energy take ~1 min after the last compile), so a call ends before
# the tool's 600 s. Writes to OUT: gpu.txt (nvidia-smi), gpu_vs_torch.<models>.bs<batches>.{txt,json}
# (and, after a CUDA fault, the reruns below).
# Then here: copy OUT's files to `python3 bench/results_dir.py --new NAME` (outside the tree) and add the run's
# conclusions, with these commands, to docs/benchmarks.md (bench/README.md).
set -euo pipefail
kit=$(realpath "$1")
out=$(python3 bench/results_dir.py "$2") || exit 2 # made; refused inside the source tree
models=${3:-resnet18,mobilenet_v1_0.25_224}
batches=${4:-1,64}
shift $(($# < 4 ? $# : 4))
tag="$(echo "$models" | tr ',' '_').bs$(echo "$batches" | tr ',' '_')"

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$kit"/wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD/agent:$PWD/bench PYTHONUNBUFFERED=1
# a work copy of the kit: libcudart.so.13 beside the CUDA backend (RUNPATH $ORIGIN), ResNet-18 unpacked
run=/tmp/kit
mkdir -p "$run/lib" "$run/models"
cp "$kit"/lib/* "$run/lib/"
cp "$kit"/models/*.onnx "$run/models/"
for gz in "$kit"/models/*.onnx.gz; do [ -e "$gz" ] || continue; gunzip -c "$gz" >"$run/models/$(basename "$gz" .gz)"; done
ln -sfn "$kit/bundles" "$run/bundles"
ln -sfn "$kit/images" "$run/images"
cp "$kit/KIT.json" "$run/" 2>/dev/null || true
export TVM_RUNTIME_LIB=$run/lib/libtvm_runtime.so

nvidia-smi --query-gpu=name,driver_version,power.draw,power.limit,clocks.sm,clocks.max.sm,temperature.gpu \
  --format=csv | tee "$out/gpu.txt"
status=0
python3 bench/gpu_vs_torch.py --kit "$run" --models "$models" --batches "$batches" --deadline-s 450 \
  --json "$out/gpu_vs_torch.$tag.json" "$@" 2>&1 | tee "$out/gpu_vs_torch.$tag.txt" || status=$?
[ "$status" = 0 ] && exit 0
# A CUDA fault while timing (gpu_vs_torch.py exits 3 and names it in the JSON's "fault") loses the process's
# CUDA context, and with it the group and every later one: MobileNetV1-0.25 batch 64 died so twice, right
# after torch.compile max-autotune's first call (run13, run16). Those groups run again in a new process
# without max-autotune, written to *.rerun<N>.{txt,json}; with DIAGNOSE=1, first once more with every mode
# and CUDA_LAUNCH_BLOCKING=1, so that the fault names the case whose kernel faulted (*.blocking.{txt,json}).
rerun=$(python3 bench/gpu_bench_rerun.py "$out/gpu_vs_torch.$tag.json" "$models" "$batches")
[ -n "$rerun" ] || exit "$status"
first=$(head -n 1 <<<"$rerun")
if [ "${DIAGNOSE:-0}" = 1 ]; then
  CUDA_LAUNCH_BLOCKING=1 python3 bench/gpu_vs_torch.py --kit "$run" --models "${first% *}" --batches "${first#* }" \
    --deadline-s 450 --json "$out/gpu_vs_torch.$tag.blocking.json" "$@" 2>&1 |
    tee "$out/gpu_vs_torch.$tag.blocking.txt" || true
fi
n=0
while read -r rmodels rbatches; do
  n=$((n + 1))
  python3 bench/gpu_vs_torch.py --kit "$run" --models "$rmodels" --batches "$rbatches" --deadline-s 450 \
    --modes default,reduce-overhead --json "$out/gpu_vs_torch.$tag.rerun$n.json" "$@" 2>&1 |
    tee "$out/gpu_vs_torch.$tag.rerun$n.txt"
done <<<"$rerun"
exit "$status"
