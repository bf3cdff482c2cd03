"""edgedeploy's CUDA backend on the GPU machine (issue 39): every bundle of a kit through both CUDA backends,
outputs compared bit for bit and speed as a ratio; and the t4/xavier twins against their references.

Here (build host):
    python bench/gpu_backend.py make KIT/backend_reference.npz IMAGES TWIN.edb...
  16 images through the agent's preprocessing (stored as float32: another machine's JPEG decoder may differ),
  and per twin bundle its reference outputs: the exact INT8 reference of its Q/DQ model for INT8
  (compile/qdq_reference.py), onnxruntime FP32 of its source model for FP16 and FP32.
There (GPU machine; bench/gpu_backend.sh sets up the two runtime folders):
    python bench/gpu_backend.py compare --tvm DIR --edgedeploy DIR BUNDLE...
  each bundle in four processes, backends in the order tvm, edgedeploy, edgedeploy, tvm (a process holds one
  CUDA backend; the order evens out clock drift): the outputs of a fixed input, which must be equal bit for
  bit, and the median time of run() (host to host, as the agent calls it) and of the VM's main on device
  tensors (kernels and launches alone). Prints one row per bundle and the ratios edgedeploy / tvm.
    python bench/gpu_backend.py twins --runtime DIR KIT/backend_reference.npz TWIN...
  each twin (PTX for compute_72/75, x86_64 host code: the driver JIT-compiles it) through edgedeploy's backend
  on the reference's inputs: INT8 passes with 100 % top-1 agreement and max |diff| <= 1 % of the output range
  (the h200 INT8 bundles' own spread against the same reference is 0.72 %); FP16 with 100 % top-1 agreement
  and max |diff| <= 2 % of the range against FP32.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

IMAGES = 16


def measure(bundle: Path, runtime: Path, backend: str, out: Path, calls: int) -> None:
    """One process, one backend: outputs of a fixed input into `out`, and timings as a JSON line."""
    import tvm_ffi

    from edgedeploy_agent.bundle import extract_bundle
    from edgedeploy_agent.runtime.tvm import TvmRuntime, loaded_tvm_libraries

    rel = Path(tempfile.mkdtemp()) / "rel"
    m = extract_bundle(bundle, rel)
    rt = TvmRuntime(rel, m, runtime_lib=str(runtime / "libtvm_runtime.so"), cuda_backend=backend)
    shape = tuple(int(d) for d in m.inputs[0].shape)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    outputs = rt.run([x])
    np.save(out, outputs[0])
    for _ in range(20):
        rt.run([x])
    wall = []
    for _ in range(calls):
        t = time.perf_counter()
        rt.run([x])
        wall.append(time.perf_counter() - t)
    # the VM's main on device tensors: kernels and launches, no host copies
    dev = rt._to_device(x)
    sync = tvm_ffi.get_global_func("runtime.Device_StreamSync")
    for _ in range(20):
        rt._main(dev)
    sync(rt._device, 0)
    main = []
    for _ in range(calls):
        t = time.perf_counter()
        rt._main(dev)
        sync(rt._device, 0)
        main.append(time.perf_counter() - t)
    print(
        json.dumps(
            {
                "backend": rt.describe()["cuda_backend"],
                "run_ms": 1e3 * statistics.median(wall),
                "main_ms": 1e3 * statistics.median(main),
                "libraries": loaded_tvm_libraries(),
            }
        ),
        flush=True,
    )


def compare(tvm_dir: Path, ed_dir: Path, bundles: list[Path], calls: int) -> int:
    failed = 0
    rows = []
    for b in bundles:
        seen: dict[str, list[dict[str, float]]] = {"tvm": [], "edgedeploy": []}
        outs: dict[str, list[np.ndarray]] = {"tvm": [], "edgedeploy": []}
        for backend in ("tvm", "edgedeploy", "edgedeploy", "tvm"):
            runtime = tvm_dir if backend == "tvm" else ed_dir
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "out.npy"
                p = subprocess.run(
                    [sys.executable, __file__, "measure", str(b), str(runtime), backend, str(out), str(calls)],
                    capture_output=True,
                    text=True,
                )
                if p.returncode != 0:
                    print(f"{b.name} [{backend}]: FAILED\n{p.stderr[-2000:]}", flush=True)
                    failed += 1
                    break
                row = json.loads(p.stdout.strip().splitlines()[-1])
                assert row["backend"] == backend, row
                seen[backend].append(row)
                outs[backend].append(np.load(out))
        else:
            ref = outs["tvm"][0]
            identical = all(o.shape == ref.shape and o.tobytes() == ref.tobytes() for v in outs.values() for o in v)
            run = {k: statistics.median(r["run_ms"] for r in v) for k, v in seen.items()}
            main = {k: statistics.median(r["main_ms"] for r in v) for k, v in seen.items()}
            rows.append((b.name, run, main, identical))
            failed += not identical
            print(
                f"{b.name}: run() tvm {run['tvm']:.3f} ms, edgedeploy {run['edgedeploy']:.3f} ms "
                f"({run['edgedeploy'] / run['tvm']:.3f}x); main tvm {main['tvm']:.3f} ms, edgedeploy "
                f"{main['edgedeploy']:.3f} ms ({main['edgedeploy'] / main['tvm']:.3f}x); "
                f"outputs {'bit-identical' if identical else 'DIFFER'}",
                flush=True,
            )
    print("\n| bundle | run() tvm | run() edgedeploy | ratio | main tvm | main edgedeploy | ratio | outputs |")
    print("|---|---|---|---|---|---|---|---|")
    for name, run, main, identical in rows:
        print(
            f"| {name} | {run['tvm']:.3f} | {run['edgedeploy']:.3f} | {run['edgedeploy'] / run['tvm']:.3f} | "
            f"{main['tvm']:.3f} | {main['edgedeploy']:.3f} | {main['edgedeploy'] / main['tvm']:.3f} | "
            f"{'identical' if identical else 'DIFFER'} |"
        )
    return 1 if failed else 0


def make(out: Path, images: Path, twins: list[Path]) -> int:
    import cv2
    import onnx

    from edgedeploy.build_store import host_file
    from edgedeploy.compile.qdq_reference import reference_outputs
    from edgedeploy_agent.bundle import extract_bundle
    from edgedeploy_agent.preprocess import preprocess

    files = sorted(images.glob("*.jpg"))[:IMAGES]
    arrays: dict[str, np.ndarray] = {}
    for b in twins:
        with tempfile.TemporaryDirectory() as tmp:
            m = extract_bundle(b, Path(tmp) / "rel")
            x = np.stack([preprocess(cv2.imread(str(f)), m.preprocess, m.inputs[0])[0] for f in files])
            x = x.astype(np.float32)
            key = "inputs:" + hashlib.sha256(x.tobytes()).hexdigest()[:12]  # one copy per preprocessing
            arrays[key] = x
            arrays[f"{b.name}:inputs"] = np.array(key)
            if m.quantization.precision == "int8":
                path = host_file(m, "qdq-onnx", Path(tmp) / "rel")
                ref = reference_outputs(onnx.load(path), x)[0]
                kind = "exact INT8 reference"
            else:
                import onnxruntime as ort

                path = host_file(m, "onnx-model", Path(tmp) / "rel")
                sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
                name = sess.get_inputs()[0].name
                ref = np.concatenate([sess.run(None, {name: x[i : i + 1]})[0] for i in range(len(x))])
                kind = "onnxruntime FP32"
            arrays[b.name] = np.asarray(ref, dtype=np.float32)
            digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
            print(f"{b.name}: {kind} {arrays[b.name].shape} (model {digest})", flush=True)
    np.savez_compressed(out, **arrays)
    return 0


def twins(runtime: Path, ref_file: Path, bundles: list[Path]) -> int:
    from edgedeploy_agent.bundle import extract_bundle
    from edgedeploy_agent.runtime.tvm import TvmRuntime

    data = np.load(ref_file)
    rows, failed = [], 0
    for b in bundles:
        if b.name not in data:
            print(f"{b.name}: no reference in {ref_file.name}")
            failed += 1
            continue
        ref, x = data[b.name], data[str(data[f"{b.name}:inputs"])]
        rel = Path(tempfile.mkdtemp()) / "rel"
        m = extract_bundle(b, rel)
        t = time.perf_counter()
        rt = TvmRuntime(rel, m, runtime_lib=str(runtime / "libtvm_runtime.so"), cuda_backend="edgedeploy")
        batch = int(m.inputs[0].shape[0])
        chunks = []
        for i in range(0, len(x), batch):  # the images in batches; the last one filled with the first images
            chunk = np.concatenate([x[i : i + batch], x[: max(0, i + batch - len(x))]])
            chunks.append(rt.run([chunk])[0][: len(x) - i])
        out = np.concatenate(chunks)
        first_s = time.perf_counter() - t  # load, JIT of the PTX, the 16 images
        precision = m.quantization.precision
        agree = 100.0 * float(np.mean(out.argmax(1) == ref.argmax(1)))
        span = float(ref.max() - ref.min()) or 1.0
        rel_diff = 100.0 * float(np.abs(out.astype(np.float64) - ref).max()) / span
        equal = 100.0 * float(np.mean(out == ref))
        limit = 1.0 if precision == "int8" else 2.0
        ok = agree == 100.0 and rel_diff <= limit
        failed += not ok
        rows.append((b.name, precision, batch, agree, rel_diff, equal, ok))
        print(
            f"{b.name}: top-1 agreement {agree:.1f}% of {len(x)}; max |diff| {rel_diff:.3f}% of the output range "
            f"(limit {limit}%); {equal:.1f}% of outputs equal; first run {first_s:.1f} s; {'PASS' if ok else 'FAIL'}",
            flush=True,
        )
    print("\n| twin | precision | batch | top-1 agreement | max diff (% of range) | outputs equal | result |")
    print("|---|---|---|---|---|---|---|")
    for name, precision, batch, agree, rel_diff, equal, ok in rows:
        result = "pass" if ok else "FAIL"
        print(f"| {name} | {precision} | {batch} | {agree:.1f}% | {rel_diff:.3f} | {equal:.1f}% | {result} |")
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ms = sub.add_parser("measure")
    ms.add_argument("bundle", type=Path)
    ms.add_argument("runtime", type=Path)
    ms.add_argument("backend")
    ms.add_argument("out", type=Path)
    ms.add_argument("calls", type=int)
    cp = sub.add_parser("compare")
    cp.add_argument("--tvm", type=Path, required=True)
    cp.add_argument("--edgedeploy", type=Path, required=True)
    cp.add_argument("--calls", type=int, default=300)
    cp.add_argument("bundles", type=Path, nargs="+")
    mk = sub.add_parser("make")
    mk.add_argument("out", type=Path)
    mk.add_argument("images", type=Path)
    mk.add_argument("twins", type=Path, nargs="+")
    tw = sub.add_parser("twins")
    tw.add_argument("--runtime", type=Path, required=True)
    tw.add_argument("ref", type=Path)
    tw.add_argument("bundles", type=Path, nargs="+")
    a = ap.parse_args()
    if a.cmd == "measure":
        measure(a.bundle, a.runtime, a.backend, a.out, a.calls)
        return 0
    if a.cmd == "compare":
        return compare(a.tvm, a.edgedeploy, a.bundles, a.calls)
    if a.cmd == "make":
        return make(a.out, a.images, a.twins)
    return twins(a.runtime, a.ref, a.bundles)


if __name__ == "__main__":
    sys.exit(main())
