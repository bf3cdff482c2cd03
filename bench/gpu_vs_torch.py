"""Runs on the GPU machine: edgedeploy bundles (TVM runtime, as the agent loads them) against PyTorch
eager and torch.compile(mode="reduce-overhead") on the same model and GPU, batch 1 latency and batch 64
throughput, printed as ratios. Energy per inference from NVML's total-energy counter where available.

    python bench/gpu_vs_torch.py --bundles DIR --model models/mobilenet_v1_0.25_224.onnx [--json OUT]

Bundles are found as DIR/<model stem>.<precision>.bs<batch>.edb (built with --profile h200).
Timing: inputs already on the GPU, one small output copied back per call (that copy is the sync),
median of N calls after warm-up, all in one process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from onnx_torch import OnnxModule

from edgedeploy_agent.bundle import extract_bundle
from edgedeploy_agent.runtime.tvm import TvmRuntime


def timed(fn: Callable[[], Any], n: int, warm: int = 10) -> float:
    for _ in range(warm):
        fn()
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1e3)
    return statistics.median(samples)


def energy_mj(fn: Callable[[], Any], seconds: float = 2.0) -> float | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        e0, n, t0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h), 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            fn()
            n += 1
        return (pynvml.nvmlDeviceGetTotalEnergyConsumption(h) - e0) / n
    except Exception:
        return None


def tvm_case(bundle: Path, x: np.ndarray) -> tuple[Callable[[], Any], np.ndarray]:
    rel = Path(tempfile.mkdtemp()) / "rel"
    m = extract_bundle(bundle, rel)
    rt = TvmRuntime(rel, m, runtime_lib=str(Path(__import__("os").environ["TVM_RUNTIME_LIB"])))
    xd = rt._to_device(x)
    return (lambda: rt._to_host(rt._main(xd))), rt.run([x])[0]


def torch_case(
    module: torch.nn.Module, x: np.ndarray, half: bool, compile_: bool
) -> tuple[Callable[[], Any], np.ndarray]:
    m = module.cuda().eval()
    xd = torch.from_numpy(x).cuda()
    if half:
        m, xd = m.half(), xd.half()
    f = torch.compile(m, mode="reduce-overhead") if compile_ else m

    def call() -> Any:
        with torch.inference_mode():
            return f(xd).float().cpu()

    out = call()
    return call, out.numpy()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundles", type=Path, required=True)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    stem = args.model.stem
    rows: list[dict[str, Any]] = []
    for batch in (1, 64):
        x = np.random.default_rng(0).uniform(-1, 1, (batch, 3, 224, 224)).astype(np.float32)
        cases: dict[str, tuple[Callable[[], Any], np.ndarray]] = {}
        for prec in ("fp32", "fp16", "int8"):
            b = args.bundles / f"{stem}.{prec}.bs{batch}.edb"
            if b.exists():
                cases[f"edgedeploy {prec}"] = tvm_case(b, x)
        cases["torch eager fp32"] = torch_case(OnnxModule(str(args.model)), x, half=False, compile_=False)
        cases["torch eager fp16"] = torch_case(OnnxModule(str(args.model)), x, half=True, compile_=False)
        cases["torch.compile fp16"] = torch_case(OnnxModule(str(args.model)), x, half=True, compile_=True)
        ref = cases["torch eager fp32"][1]
        for name, (fn, out) in cases.items():
            ms = timed(fn, args.n if batch == 1 else max(args.n // 4, 20))
            rows.append(
                {
                    "model": stem,
                    "batch": batch,
                    "case": name,
                    "median_ms": round(ms, 4),
                    "images_per_s": round(batch * 1e3 / ms, 1),
                    "top1_agree_vs_torch_fp32": float(np.mean(out.argmax(1) == ref.argmax(1))),
                    "max_abs_diff_vs_torch_fp32": float(np.abs(out - ref).max()),
                    "energy_mj_per_batch": energy_mj(fn),
                }
            )
    base = {r["batch"]: r["median_ms"] for r in rows if r["case"] == "torch.compile fp16"}
    head = ("model", "bs", "case", "ms", "img/s", "vs compile", "agree", "mJ/batch")
    print("{:24s} {:>3s} {:20s} {:>9s} {:>9s} {:>10s} {:>6s} {:>9s}".format(*head))
    for r in rows:
        r["ratio_vs_torch_compile_fp16"] = round(r["median_ms"] / base[r["batch"]], 3)
        e = r["energy_mj_per_batch"]
        print(
            f"{r['model']:24s} {r['batch']:3d} {r['case']:20s} {r['median_ms']:9.3f} {r['images_per_s']:9.1f} "
            f"{r['ratio_vs_torch_compile_fp16']:9.2f}x {r['top1_agree_vs_torch_fp32']:6.3f} "
            f"{(f'{e:9.2f}' if e is not None else '        -')}"
        )
    if args.json:
        args.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
