#!/usr/bin/env bash
# Prepares a MetaSchedule tuning run on the GPU machine, on the build host (no GPU needed):
#   bash bench/gpu_tune_kit.sh KIT BUNDLE...     (then carry KIT, git-ignored, and run bench/gpu_tune.sh there)
# KIT gets the full TVM compiler for Python 3.12 (libtvm_compiler.so xz-compressed, 59 MiB, in two parts:
# one transfer carries at most 64 MiB, the working tree's 7 MB included, so the first part travels in a call
# of its own, bench/gpu_tune.sh), and for each bundle the tuning module `edgedeploy tune --export` writes,
# with the database stored so far for it, so that every run continues the last one.
set -euo pipefail
kit=${1:?usage: $0 KIT BUNDLE...}; shift
py=.venv/bin/python; ed=.venv/bin/edgedeploy
site=$($py -c "import importlib.util as u, pathlib; print(pathlib.Path(u.find_spec('tvm').submodule_search_locations[0]).parent)")
mkdir -p "$kit"
echo "*" >"$kit/.gitignore" # the kit ignores itself: it travels with the device tool's carry, never in git
if [ ! -f "$kit/libtvm_compiler.so.xz" ]; then
  xz -9e -T0 -c "$site/tvm/lib/libtvm_compiler.so" > "$kit/libtvm_compiler.so.xz.part"
  mv "$kit/libtvm_compiler.so.xz.part" "$kit/libtvm_compiler.so.xz"
fi
rm -f "$kit"/compiler.xz.part0*
split -b 31000000 -d "$kit/libtvm_compiler.so.xz" "$kit/compiler.xz.part" # part00, part01
# the Python package without sources, web runtime, 3rdparty headers and the unused frontends
tar -C "$site" -cJf "$kit/tvm-py.tar.xz" --exclude=tvm/lib/libtvm_compiler.so --exclude=tvm/3rdparty \
  --exclude=tvm/src --exclude=tvm/web --exclude=tvm/cmake --exclude=__pycache__ \
  --exclude=tvm/relax/frontend/tflite --exclude=tvm/relax/frontend/torch --exclude=tvm/relax/frontend/stablehlo tvm
# apache-tvm-ffi for cp312, unpacked and xz-compressed (a third smaller than its wheel)
tmp=$(mktemp -d)
$py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d "$tmp/whl" apache-tvm-ffi==0.1.14.post1
mkdir "$tmp/ffi" && (cd "$tmp/ffi" && unzip -q "$tmp"/whl/*.whl) && tar -C "$tmp/ffi" -cJf "$kit/tvm-ffi-cp312.tar.xz" .
# one tuning module per bundle, plus the databases so far
mkdir "$tmp/tasks"
for b in "$@"; do
  d="$tmp/tasks/$(basename "$b" .edb)"
  $ed tune "$b" --export "$d" >/dev/null
  profile=$($py -c "import json,sys; print(json.load(open(sys.argv[1]))['profile'])" "$d/tuning.json")
  key=$($py -c "import json,sys; print(json.load(open(sys.argv[1]))['key'])" "$d/tuning.json")
  if [ -f "profiles/tuning/$profile/$key/database_workload.json" ]; then
    cp "profiles/tuning/$profile/$key"/database_*.json "$d/"
  fi
  if [ -f "profiles/tuning/$profile/$key/gemm_configs.json" ]; then # the GEMM search resumes from it
    cp "profiles/tuning/$profile/$key/gemm_configs.json" "$d/"
  fi
  echo "$(basename "$d"): $profile/$key, $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['tasks'])" "$d/tuning.json") tasks"
done
tar -C "$tmp/tasks" -cJf "$kit/tasks.tar.xz" .
rm -rf "$tmp"
du -b "$kit"/* | awk '{s+=$1; print} END {printf "total %.1f MiB\n", s/1048576}'
