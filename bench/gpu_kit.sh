#!/usr/bin/env bash
# Builds, on this host (no GPU needed: nvcc 13 + a stub libcuda, docs/gpu.md), everything the GPU
# machine needs for bench/gpu_bench.sh (the benchmark) and bench/gpu_e2e.sh (the agent on a video):
#
#   bash bench/gpu_kit.sh .gpu                 # all 12 bundles: 2 models x fp32/fp16/int8 x batch 1/64
#   bash bench/gpu_kit.sh .gpu resnet18.fp16.bs1 mobilenet_v1_0.25_224.fp32.bs1   # only these bundles
#
# KIT (inside the repo, ignored by its own .gitignore; the device tool carries it with carry=[".gpu"]):
#   wheels/   apache-tvm-ffi, pydantic (+ pydantic-core, annotated-types, typing-inspection,
#             typing-extensions) for cp312, the versions of .venv: the agent's only non-image dependencies
#   lib/      libtvm_runtime.so, libtvm_runtime_cuda.so (from the apache-tvm wheel), libcudart.so.13
#   models/   mobilenet_v1_0.25_224.onnx, resnet18.onnx.gz (bench/resnet18_onnx.py, tiled weights:
#             46.7 MB raw, ~2 MB gzipped; gpu_bench.sh unpacks it)
#   bundles/<stem>/<stem>.<fp32|fp16|int8>.bs<1|64>.edb, built with --profile h200 (int8: calibrated on
#             ../shared/data/imagenet-sample); one folder per model, so that a call carries one model's
#             bundles (all 12 together would be ~45 MB, over the limit beside the rest)
#   images/   64 ImageNet JPEGs (inputs for the output checks), video.mp4 (gpu_e2e.sh)
#   KIT.json  what was built, from which commit, with which tools and hashes
# The device tool carries at most 64 MiB per call (the repo's tracked files, ~3 MB, included): this script
# prints `du` and fails when the common part plus one model's bundles is above 60 MiB.
# Existing bundles built from the same ONNX file are kept, so a second run only builds what is missing.
# Needs .venv with edgedeploy[dev] and, to generate ResNet-18, torch (CPU is enough:
# `.venv/bin/pip install torch`). Time here (2 shared cores), seen: ResNet-18 fp16 bs1 455 s, MobileNet fp32
# bs1 158 s; INT8 adds calibration: expect 1-1.5 h for all 12. Run it in the background (nohup).
set -euo pipefail
kit=${1:?usage: $0 KIT [STEM.PRECISION.bsN ...]}
shift
only=" $* "
data=${EDGEDEPLOY_DATA:-$(cd .. && pwd)/shared/data}
[ -d "$data" ] || data=$(cd ../.. && pwd)/shared/data # a worktree under /work/wt/
py=.venv/bin/python
ed=.venv/bin/edgedeploy
mkdir -p "$kit"/{wheels,lib,bundles,models,images}
echo '*' >"$kit/.gitignore" # the kit ignores itself: it travels with the device tool's carry=[KIT], never in git
ver() { $py -c "import importlib.metadata as m; print(m.version('$1'))"; }

echo "== wheels (cp312, for the GPU machine's python3)"
$py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$kit/wheels" "apache-tvm-ffi==$(ver apache-tvm-ffi)" "pydantic==$(ver pydantic)" \
  "pydantic-core==$(ver pydantic-core)" "annotated-types==$(ver annotated-types)" \
  "typing-inspection==$(ver typing-inspection)" "typing-extensions==$(ver typing-extensions)"

echo "== TVM runtime libraries"
tvmlib=$($py -c "import importlib.util as u, pathlib; print(pathlib.Path(u.find_spec('tvm').submodule_search_locations[0]) / 'lib')")
cp "$tvmlib/libtvm_runtime.so" "$tvmlib/libtvm_runtime_cuda.so" "$kit/lib/"
cp -L "${CUDA_PATH:-/usr/local/cuda}/lib64/libcudart.so.13" "$kit/lib/"

echo "== models and inputs"
cp "$data/models/mobilenet_v1_0.25_224.onnx" "$kit/models/"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The tuning databases are per model graph (profiles/tuning/h200/<graph digest[:16]>-<precision>, weights left
# out: docs/tuning.md): bench/resnet18_onnx.py's files, whatever their weights, find 23d84f127e2996ed. Check
# `compile-cuda: N of M tensor-core kernels tuned` in the build log below: "no tuning database" means another
# graph (another exporter or opset?), whose kernels may still be the same: copy the folders to its key and rebuild.
if [ -f "$kit/models/resnet18.onnx.gz" ]; then
  gunzip -c "$kit/models/resnet18.onnx.gz" >"$work/resnet18.onnx"
else
  $py -W ignore::DeprecationWarning bench/resnet18_onnx.py "$work/resnet18.onnx" --weights tiled --seed 0
  gzip -c -6 "$work/resnet18.onnx" >"$kit/models/resnet18.onnx.gz"
fi
# (awk stops at 64 itself: `head` closing the pipe early made the script exit under pipefail, now and then)
find "$data/imagenet-sample" -name '*.jpg' | sort | awk 'NR % 7 == 1 && n++ < 64' | xargs cp -t "$kit/images/"
cp "$data/video/bikes.mp4" "$kit/images/video.mp4"

echo "== bundles (--profile h200)"
declare -A onnx=([resnet18]="$work/resnet18.onnx" [mobilenet_v1_0.25_224]="$kit/models/mobilenet_v1_0.25_224.onnx")
declare -A card=(
  [resnet18]="--name resnet18 --color rgb --resize center_crop --crop-fraction 0.875 --mean 123.675,116.28,103.53 --std 58.395,57.12,57.375"
  [mobilenet_v1_0.25_224]="--card examples/cards/mobilenet_v1_0.25_224.toml"
)
same_source() { # the bundle exists and was built from this ONNX file
  [ -f "$1" ] && $py - "$1" "$2" <<'EOF'
import hashlib, sys
from pathlib import Path
from edgedeploy_agent.bundle import read_manifest
sys.exit(read_manifest(Path(sys.argv[1])).model.source_sha256 != hashlib.sha256(Path(sys.argv[2]).read_bytes()).hexdigest())
EOF
}
for stem in resnet18 mobilenet_v1_0.25_224; do
  for prec in fp32 fp16 int8; do
    for bs in 1 64; do
      name=$stem.$prec.bs$bs
      mkdir -p "$kit/bundles/$stem"
      out=$kit/bundles/$stem/$name.edb
      [ "$only" = "  " ] || [[ "$only" == *" $name "* ]] || continue
      if same_source "$out" "${onnx[$stem]}"; then echo "$name: kept"; continue; fi
      calib=()
      [ "$prec" = int8 ] && calib=(--calibration "$data/imagenet-sample")
      start=$(date +%s)
      # shellcheck disable=SC2086  # the card options are words
      $ed build "${onnx[$stem]}" --profile h200 ${card[$stem]} --precision "$prec" "${calib[@]}" --batch "$bs" -o "$out"
      echo "$name: built in $(($(date +%s) - start)) s, $(du -h "$out" | cut -f1)"
    done
  done
done

$py - "$kit" "${onnx[resnet18]}" <<'EOF'
import datetime, hashlib, importlib.metadata as md, json, subprocess, sys
from pathlib import Path
kit = Path(sys.argv[1])
sha = lambda p: hashlib.sha256(Path(p).read_bytes()).hexdigest()
def version(p):
    try:
        return md.version(p)
    except md.PackageNotFoundError:
        return None
info = {
    "made": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
    "dirty": bool(subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True).stdout.strip()),
    "tools": {p: version(p) for p in ("edgedeploy", "apache-tvm", "apache-tvm-ffi", "onnx", "torch")},
    "onnx_sha256": {"resnet18.onnx": sha(sys.argv[2]), "mobilenet_v1_0.25_224.onnx": sha(kit / "models/mobilenet_v1_0.25_224.onnx")},
    "bundles": {p.name: p.stat().st_size for p in sorted((kit / "bundles").rglob("*.edb"))},
}
(kit / "KIT.json").write_text(json.dumps(info, indent=1))
EOF
du -sh "$kit"/bundles/*
du -sh "$kit"/*
common=(wheels lib models images KIT.json)
for stem in resnet18 mobilenet_v1_0.25_224; do
  size=$(cd "$kit" && mkdir -p "bundles/$stem" && du -smc "${common[@]}" "bundles/$stem" | tail -n 1 | cut -f1)
  echo "a call for $stem carries $size MiB: ${common[*]/#/$kit/} $kit/bundles/$stem"
  [ "$size" -le 60 ] || { echo "over the 60 MiB kept under the 64 MiB transfer limit" >&2; exit 1; }
done
