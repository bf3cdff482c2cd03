"""sha256 digests of what the GPU builds generate, to show that a refactor of compile/ changed no output.

    PYTHONPATH=host:agent .venv/bin/python bench/gpu_codegen_digest.py [--only h200-int8 ...]

For each GPU profile (h200, t4, xavier-agx) and precision (fp32, fp16, int8) it builds MobileNetV1-0.25 (and once
with EDGEDEPLOY_CUDA_KNOBS=int8_mma=1 on h200) in a fresh cache, bypassing the build cache, and prints one line per
generated artifact: each CUDA source TVM wrote (recorded from the `tvm_callback_cuda_postproc` hook inside the CUDA
worker), the PTX, each embedded device binary (fatbin or cubin), the device kernels' names and the host library.
Run it at two commits and diff the outputs: a bit-for-bit identical build prints identical lines. Runs on the CPU
(nvcc / NVRTC compile, no GPU needed)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

DATA = Path(os.environ.get("EDGEDEPLOY_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
MODEL = DATA / "models" / "mobilenet_v1_0.25_224.onnx"
CASES = {f"{p}-{prec}": (p, prec, "") for p in ("h200", "t4", "xavier-agx") for prec in ("fp32", "fp16", "int8")}
CASES["h200-int8-mma"] = ("h200", "int8", "int8_mma=1")
WORKER = "cuda_worker"  # the CUDA worker module's name ends so (python -m edgedeploy.compile[...].cuda_worker)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def worker(request: str, record: Path) -> int:
    """The CUDA worker, with TVM's CUDA sources recorded as the postproc hook hands them on."""
    import tvm_ffi

    try:
        from edgedeploy.compile import cuda_worker
        from edgedeploy.compile.cuda import source as cuda_source
    except ImportError:  # before compile/ had sub-packages
        from edgedeploy.compile import cuda_source, cuda_worker  # type: ignore[no-redef]
    n = [0]

    def recording(code: str, *args: Any) -> str:
        out = cuda_source.postprocess(code, *args)
        n[0] += 1
        (record / f"source{n[0]}.cu").write_text(out)
        return out

    tvm_ffi.register_global_func("tvm_callback_cuda_postproc", recording, override=True)
    return cuda_worker.main(request)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", choices=sorted(CASES), help="these builds only")
    ap.add_argument("--worker", nargs=2, metavar=("REQUEST", "RECORD"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker[0], Path(args.worker[1]))

    with tempfile.TemporaryDirectory(prefix="gpu-digest-") as tmp:
        root = Path(tmp)
        for var in ("CACHE", "CONFIG", "STATE", "STORE"):
            os.environ[f"EDGEDEPLOY_{var}_DIR"] = str(root / var.lower())
        popen = subprocess.Popen
        record = root / "record"

        def rerouted(argv: Any, *a: Any, **k: Any) -> Any:
            if isinstance(argv, list) and len(argv) == 4 and argv[1] == "-m" and argv[2].endswith(WORKER):
                argv = [argv[0], __file__, "--worker", argv[3], str(record)]
            return popen(argv, *a, **k)

        subprocess.Popen = rerouted  # type: ignore[misc]
        for name in args.only or CASES:
            for line in digest(name, *CASES[name], root, record):
                print(line, flush=True)
    return 0


def digest(name: str, profile: str, precision: str, knobs: str, root: Path, record: Path) -> list[str]:
    from edgedeploy.api import build
    from edgedeploy.compile.cards import ModelCard

    try:
        from edgedeploy.compile.cuda.devcode import cubin_functions, device_blobs, ptx_entries
    except ImportError:
        from edgedeploy.compile.devcode import cubin_functions, device_blobs, ptx_entries  # type: ignore[no-redef]
    from edgedeploy_agent.bundle import Preprocess, extract_bundle

    try:
        from edgedeploy.compile.int8.build import Int8Config
        from edgedeploy.compile.int8.quantize import QuantizeOptions
    except ImportError:
        from edgedeploy.compile.int8_build import Int8Config  # type: ignore[no-redef]
        from edgedeploy.compile.quantize import QuantizeOptions  # type: ignore[no-redef]

    record.mkdir(exist_ok=True)
    for f in record.iterdir():
        f.unlink()
    if knobs:
        os.environ["EDGEDEPLOY_CUDA_KNOBS"] = knobs
    else:
        os.environ.pop("EDGEDEPLOY_CUDA_KNOBS", None)
    card = ModelCard(name="mobilenet", preprocess=Preprocess(mean=[127.5] * 3, std=[127.5] * 3))
    int8 = None
    if precision == "int8":
        int8 = Int8Config(calibration=DATA / "imagenet-sample", options=QuantizeOptions(samples=16))
    out = root / f"{name}.edb"
    options: dict[str, Any] = {}
    try:  # the CUDA configuration is handed to the build (before, the build read EDGEDEPLOY_CUDA_KNOBS itself)
        from edgedeploy.compile.config import CudaConfig, Knobs

        options["cuda"] = CudaConfig(Knobs.parse(knobs))
    except ImportError:
        pass
    res = build(MODEL, profile, out, card, precision=precision, int8=int8, use_cache=False, **options)
    rel = root / name
    extract_bundle(res.bundle, rel)
    sources = [f.read_text() for f in sorted(record.iterdir())]
    lines = [f"{name} cuda-source {i} {sha(s.encode())}" for i, s in enumerate(sources)]
    if (rel / "model.ptx").exists():
        lines.append(f"{name} ptx {sha((rel / 'model.ptx').read_bytes())}")
    kernels = [k for s in sources for k in re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", s)]
    for i, (kind, blob) in enumerate(device_blobs((rel / "model.so").read_bytes())):
        lines.append(f"{name} device-code {i} {kind} {sha(blob)}")
        if kind == "cubin":
            kernels += cubin_functions(blob)
        elif kind == "ptx":
            kernels += ptx_entries(blob)
    lines.append(f"{name} kernels {len(kernels)} {sha(json.dumps(sorted(kernels)).encode())}")
    lines.append(f"{name} library {sha((rel / 'model.so').read_bytes())}")
    target = res.manifest.target.model_dump(mode="json")
    lines.append(f"{name} target {sha(json.dumps(target, sort_keys=True).encode())}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
