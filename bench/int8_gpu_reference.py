"""INT8 bundles on the GPU against the exact INT8 reference (compile/int8/qdq_reference.py), issue 12 item 2.

Here (build host, the bundles' Q/DQ models in the build store):
    python bench/int8_gpu_reference.py make KIT/int8_reference.npz IMAGES BUNDLE...
  16 images of IMAGES through the agent's preprocess as the first bundle's manifest says (the float32
  inputs are stored: a JPEG decoder or resize on another machine could differ), and for each bundle the
  exact reference's outputs of its Q/DQ model.
There (GPU machine, agent runtime only):
    python bench/int8_gpu_reference.py check KIT/int8_reference.npz BUNDLE...
  runs each bundle on those inputs (batch-1 bundles image by image, larger batches with the 16 images
  tiled) and prints top-1 agreement, max |difference| relative to the output range, and how many outputs
  are equal to the reference in float32.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

IMAGES = 16


def make(out: Path, images: Path, bundles: list[Path]) -> int:
    import cv2
    import onnx

    from edgedeploy.build_store import host_file
    from edgedeploy.compile.int8.qdq_reference import reference_outputs
    from edgedeploy_agent.bundle import extract_bundle, read_manifest
    from edgedeploy_agent.preprocess import preprocess

    files = sorted(images.glob("*.jpg"))[:IMAGES]
    first = read_manifest(bundles[0])
    x = np.stack([preprocess(cv2.imread(str(f)), first.preprocess, first.inputs[0])[0] for f in files])
    arrays: dict[str, np.ndarray] = {"inputs": x.astype(np.float32)}
    by_model: dict[str, np.ndarray] = {}  # bundles built from the same Q/DQ model share its reference
    for b in bundles:
        with tempfile.TemporaryDirectory() as tmp:
            m = extract_bundle(b, Path(tmp) / "rel")
            if m.preprocess != first.preprocess:
                raise SystemExit(f"{b.name}: other preprocessing than {bundles[0].name}")
            path = host_file(m, "qdq-onnx", Path(tmp) / "rel")
            key = hashlib.sha256(path.read_bytes()).hexdigest()
            if key not in by_model:
                by_model[key] = np.asarray(reference_outputs(onnx.load(path), x)[0], dtype=np.float32)
        arrays[b.name] = by_model[key]
        print(f"{b.name}: reference outputs {arrays[b.name].shape} (Q/DQ model {key[:12]})", flush=True)
    np.savez_compressed(out, **arrays)
    return 0


def check(ref_file: Path, bundles: list[Path]) -> int:
    from edgedeploy_agent.bundle import extract_bundle
    from edgedeploy_agent.runtime.tvm import TvmRuntime

    data = np.load(ref_file)
    x = data["inputs"]
    worst = 100.0
    for b in bundles:
        # a variant (bench/gpu_variants.sh: resnet18.int8.bs64.async.edb) has its model's reference
        name = next((n for n in (b.name, re.sub(r"(\.bs\d+)\.[^.]+\.edb$", r"\1.edb", b.name)) if n in data), None)
        if name is None:
            print(f"{b.name}: no reference in {ref_file.name}")
            continue
        ref = data[name]
        rel = Path(tempfile.mkdtemp()) / "rel"
        m = extract_bundle(b, rel)
        rt = TvmRuntime(rel, m, runtime_lib=os.environ["TVM_RUNTIME_LIB"])
        batch = int(m.inputs[0].shape[0])
        if batch == 1:
            out = np.concatenate([rt.run([x[i : i + 1]])[0] for i in range(len(x))])
        else:
            tiled = np.concatenate([x] * (-(-batch // len(x))))[:batch]
            out = rt.run([tiled])[0][: len(x)]
        agree = 100.0 * float(np.mean(out.argmax(1) == ref.argmax(1)))
        diff = float(np.abs(out.astype(np.float64) - ref).max())
        span = float(ref.max() - ref.min()) or 1.0
        equal = 100.0 * float(np.mean(out == ref))
        worst = min(worst, agree)
        print(
            f"{b.name}: top-1 agreement with the exact reference {agree:.1f}% of {len(x)} images; "
            f"max |diff| {diff:.4g} ({100 * diff / span:.3f}% of the output range); {equal:.1f}% of outputs equal"
        )
    return 0 if worst >= 90.0 else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make")
    mk.add_argument("out", type=Path)
    mk.add_argument("images", type=Path)
    mk.add_argument("bundles", type=Path, nargs="+")
    ck = sub.add_parser("check")
    ck.add_argument("ref", type=Path)
    ck.add_argument("bundles", type=Path, nargs="+")
    args = ap.parse_args()
    if args.cmd == "make":
        return make(args.out, args.images, args.bundles)
    return check(args.ref, args.bundles)


if __name__ == "__main__":
    sys.exit(main())
