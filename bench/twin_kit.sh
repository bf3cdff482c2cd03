#!/usr/bin/env bash
# Builds here (no GPU) the twins of the t4 and xavier-agx profiles that bench/gpu_backend.sh runs on the GPU machine:
# MobileNetV1-0.25 and ResNet-18, INT8 and FP16, batch 1 and 8 (16 bundles: each profile's own kernels as PTX with
# an x86_64 host library, docs/gpu.md "Twins"), then their references (bench/gpu_backend.py make):
#
#   bash bench/twin_kit.sh KIT                            # after bash bench/gpu_kit.sh KIT (its models/)
#   bash bench/twin_kit.sh KIT resnet18.t4.int8.bs8        # only these twins (the references are made again)
#
# Writes KIT/twins/<model>.<profile>.<precision>.bs<N>.edb and KIT/backend_reference.npz. Existing twins are kept.
set -euo pipefail
kit=${1:?usage: $0 KIT [MODEL.PROFILE.PRECISION.bsN ...]}
shift
only=" $* "
data=${EDGEDEPLOY_DATA:-$(cd .. && pwd)/shared/data}
py=.venv/bin/python
ed=.venv/bin/edgedeploy
mkdir -p "$kit/twins"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[ -f "$kit/models/resnet18.onnx.gz" ] || { echo "run bench/gpu_kit.sh $kit first (it makes models/)" >&2; exit 1; }
gunzip -c "$kit/models/resnet18.onnx.gz" >"$work/resnet18.onnx"
declare -A onnx=([resnet18]="$work/resnet18.onnx" [mobilenet_v1_0.25_224]="$data/models/mobilenet_v1_0.25_224.onnx")
declare -A card=(
  [resnet18]="--name resnet18 --color rgb --resize center_crop --crop-fraction 0.875 --mean 123.675,116.28,103.53 --std 58.395,57.12,57.375"
  [mobilenet_v1_0.25_224]="--card examples/cards/mobilenet_v1_0.25_224.toml"
)
for stem in mobilenet_v1_0.25_224 resnet18; do
  for profile in t4 xavier-agx; do
    for prec in int8 fp16; do
      for bs in 1 8; do
        name=$stem.$profile.$prec.bs$bs
        out=$kit/twins/$name.edb
        [ "$only" = "  " ] || [[ "$only" == *" $name "* ]] || continue
        if [ -f "$out" ]; then echo "$name: kept"; continue; fi
        calib=()
        [ "$prec" = int8 ] && calib=(--calibration "$data/imagenet-sample")
        start=$(date +%s)
        # shellcheck disable=SC2086  # the card options are words
        $ed build "${onnx[$stem]}" --profile "$profile" --twin ${card[$stem]} --precision "$prec" "${calib[@]}" \
          --batch "$bs" -o "$out" >"$work/$name.log" 2>&1 || { tail -5 "$work/$name.log"; exit 1; }
        echo "$name: built in $(($(date +%s) - start)) s, $(du -h "$out" | cut -f1)"
      done
    done
  done
done
# the H200 bundles of bench/gpu_kit.sh too: the yardstick a twin is judged beside
$py bench/gpu_backend.py make "$kit/backend_reference.npz" "$data/imagenet-sample" "$kit"/twins/*.edb "$kit"/bundles/*/*.edb
du -sh "$kit/twins" "$kit/backend_reference.npz"
