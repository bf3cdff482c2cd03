"""edgedeploy's CUDA backend on the GPU machine (issue 39): every bundle of a kit through both CUDA backends,
outputs compared bit for bit and speed as a ratio; and the t4/xavier twins against their references.

Here (build host):
    python bench/gpu_backend.py make KIT/backend_reference.npz IMAGES TWIN.edb...
  16 images through the agent's preprocessing (stored as float32: another machine's JPEG decoder may differ),
  and per twin bundle its reference outputs: the exact INT8 reference of its Q/DQ model for INT8
  (compile/int8/qdq_reference.py), onnxruntime FP32 of its source model for FP16 and FP32.
There (GPU machine; bench/gpu_backend.sh sets up the two runtime folders):
    python bench/gpu_backend.py compare --tvm DIR --edgedeploy DIR BUNDLE...
  each bundle in four processes, backends in the order tvm, edgedeploy, edgedeploy, tvm (a process holds one
  CUDA backend; the order evens out clock drift): the outputs of a fixed input, which must be equal bit for
  bit, and the median time of run() (host to host, as the agent calls it) and of the VM's main on device
  tensors (kernels and launches alone). Prints one row per bundle and the ratios edgedeploy / tvm.
    python bench/gpu_backend.py twins --runtime DIR KIT/backend_reference.npz TWIN...
  each twin (PTX for compute_72/75, x86_64 host code: the driver JIT-compiles it) and each H200 bundle of the
  kit through edgedeploy's backend on the reference's inputs; a twin passes with 100 % top-1 agreement and a
  max |diff| of at most 1 % (INT8) / 2 % (FP16) of the output range, or at most 1.25x the H200 bundle's own
  distance (its closest batch size) to the same reference where that is larger (MobileNet's softmax output:
  twins() says why).
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


def make(out: Path, images: Path, bundles: list[Path]) -> int:
    import cv2
    import onnx
    import onnxruntime as ort

    from edgedeploy.build_store import host_file
    from edgedeploy.compile.int8.qdq_reference import reference_outputs
    from edgedeploy_agent.bundle import extract_bundle
    from edgedeploy_agent.preprocess import preprocess

    def fp32(path: Path, x: np.ndarray) -> np.ndarray:
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        return np.concatenate([sess.run(None, {name: x[i : i + 1]})[0] for i in range(len(x))])

    files = sorted(images.glob("*.jpg"))[:IMAGES]
    arrays: dict[str, np.ndarray] = {}
    # bundles of one model and preprocessing (a twin of each profile, the H200's own) share one reference
    references: dict[tuple[str, str], np.ndarray] = {}
    for b in bundles:
        with tempfile.TemporaryDirectory() as tmp:
            m = extract_bundle(b, Path(tmp) / "rel")
            x = np.stack([preprocess(cv2.imread(str(f)), m.preprocess, m.inputs[0])[0] for f in files])
            x = x.astype(np.float32)
            key = "inputs:" + hashlib.sha256(x.tobytes()).hexdigest()[:12]  # one copy per preprocessing
            arrays[key] = x
            arrays[f"{b.name}:inputs"] = np.array(key)
            int8 = m.quantization.precision == "int8"
            path = host_file(m, "qdq-onnx" if int8 else "onnx-model", Path(tmp) / "rel")
            digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
            if (digest, key) not in references:
                ref = reference_outputs(onnx.load(path), x)[0] if int8 else fp32(path, x)
                references[digest, key] = np.asarray(ref, dtype=np.float32)
            arrays[b.name] = references[digest, key]
            kind = "exact INT8 reference" if int8 else "onnxruntime FP32"
            print(f"{b.name}: {kind} {arrays[b.name].shape} (model {digest})", flush=True)
    np.savez_compressed(out, **arrays)
    return 0


def _spread(rt: object, x: np.ndarray, ref: np.ndarray, batch: int) -> tuple[float, float, float]:
    """(top-1 agreement %, max |diff| in % of the reference's range, % of outputs equal) on the images `x`."""
    chunks = []
    for i in range(0, len(x), batch):  # the images in batches, a batch larger than the rest filled round-robin
        chunk = x[[(i + k) % len(x) for k in range(batch)]]
        chunks.append(rt.run([chunk])[0][: len(x) - i])  # type: ignore[attr-defined]
    out = np.concatenate(chunks)
    agree = 100.0 * float(np.mean(out.argmax(1) == ref.argmax(1)))
    span = float(ref.max() - ref.min()) or 1.0
    return agree, 100.0 * float(np.abs(out.astype(np.float64) - ref).max()) / span, 100.0 * float(np.mean(out == ref))


def twins(runtime: Path, ref_file: Path, bundles: list[Path]) -> int:
    """Each bundle against its reference; a twin (MODEL.PROFILE.PRECISION.bsN.edb) is judged beside the H200's own
    bundles of the same model and precision (MODEL.PRECISION.bsN.edb, given too): it passes with 100 % top-1
    agreement and a max |diff| within the limit (INT8 1 %, FP16 2 % of the output range) or, where the H200's own
    kernels are farther than that from the same reference (a softmax output magnifies a logit's last bit), within
    1.25x of the H200 bundle's own distance (the closest of its batch sizes)."""
    from edgedeploy_agent.bundle import extract_bundle
    from edgedeploy_agent.runtime.tvm import TvmRuntime

    data = np.load(ref_file)
    seen: dict[str, tuple[float, float, float, int, str, float]] = {}
    for b in bundles:
        if b.name not in data:
            print(f"{b.name}: no reference in {ref_file.name}")
            continue
        ref, x = data[b.name], data[str(data[f"{b.name}:inputs"])]
        rel = Path(tempfile.mkdtemp()) / "rel"
        m = extract_bundle(b, rel)
        t = time.perf_counter()
        rt = TvmRuntime(rel, m, runtime_lib=str(runtime / "libtvm_runtime.so"), cuda_backend="edgedeploy")
        batch = int(m.inputs[0].shape[0])
        agree, diff, equal = _spread(rt, x, ref, batch)
        first_s = time.perf_counter() - t  # load, JIT of a twin's PTX, the 16 images
        seen[b.name] = (agree, diff, equal, batch, m.quantization.precision, first_s)
        print(f"{b.name} ({m.profile}): top-1 agreement {agree:.1f}% of {len(x)}; max |diff| {diff:.3f}% of the "
              f"output range; {equal:.1f}% of outputs equal; first run {first_s:.1f} s", flush=True)  # fmt: skip
    failed = sum(b.name not in seen for b in bundles)
    print("\n| twin | precision | batch | top-1 agreement | max diff (% of range) | H200 bundle's own | "
          "outputs equal | result |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
    for name, (agree, diff, equal, batch, precision, _) in seen.items():
        parts = name.split(".")
        if len(parts) < 5 or parts[-4] not in ("t4", "xavier-agx", "xavier-nx"):
            continue  # not a twin: a yardstick
        stem = ".".join(parts[:-4])
        own = [v[1] for k, v in seen.items() if k.startswith(f"{stem}.{precision}.bs")]  # every batch: the closest
        limit = 1.0 if precision == "int8" else 2.0
        bound = max(limit, 1.25 * min(own)) if own else limit
        ok = agree == 100.0 and diff <= bound
        failed += not ok
        own_text = f"{min(own):.3f}" if own else "-"
        print(f"| {name} | {precision} | {batch} | {agree:.1f}% | {diff:.3f} | {own_text} | {equal:.1f}% | "
              f"{'pass' if ok else 'FAIL'} (<= {bound:.3f}) |")  # fmt: skip
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
    mk.add_argument("bundles", type=Path, nargs="+")
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
        return make(a.out, a.images, a.bundles)
    return twins(a.runtime, a.ref, a.bundles)


if __name__ == "__main__":
    sys.exit(main())
