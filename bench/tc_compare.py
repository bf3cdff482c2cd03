"""Runs on the GPU machine: ResNet-18 bundles of two build variants, one process, same inputs: by
default with tensor-core convolutions (`tc`) against the same bundles built without them (`default`,
bench/oneoff/tc_kit.sh); `--variants nchw,nhwc` compares `<stem>.nchw.edb` with `<stem>.nhwc.edb`.
Prints per pair the median time, the speed-up, and whether the outputs agree: INT8 must be
bit-identical (both compute exact int32 sums and the same requantize), FP16 within fp16 rounding. With
--profile, the top kernels by GPU time (CUPTI, via torch.profiler) for each bundle. A torchvision
ResNet-18 (fp16, channels_last, torch.compile) is timed as a peer when torchvision is installed.

    python bench/tc_compare.py --bundles KIT/bundles [--variants BEFORE,AFTER] [--profile] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from results_dir import output_file

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


def load(bundle: Path) -> TvmRuntime:
    rel = Path(tempfile.mkdtemp()) / "rel"
    m = extract_bundle(bundle, rel)
    return TvmRuntime(rel, m, runtime_lib=os.environ["TVM_RUNTIME_LIB"])


def kernel_profile(fn: Callable[[], Any], top: int = 12) -> list[dict[str, Any]]:
    try:
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return []
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            fn()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if us:
            rows.append({"kernel": e.key[:80], "calls": e.count // 20, "ms_per_run": round(us / 20 / 1e3, 4)})
    rows.sort(key=lambda r: -r["ms_per_run"])
    return rows[:top]


def torchvision_peer(batch: int) -> float | None:
    try:
        import torch
        import torchvision
    except ImportError:
        return None
    m = torchvision.models.resnet18().cuda().half().eval().to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, 224, 224, device="cuda").half().to(memory_format=torch.channels_last)
    f = torch.compile(m, fullgraph=True, mode="reduce-overhead")

    def call() -> Any:
        with torch.inference_mode():
            return f(x)[:, :8].float().cpu()

    return timed(call, 50)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundles", type=Path, required=True)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--top", type=int, default=12, help="kernels listed per bundle with --profile")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-peer", action="store_true", help="skip the torchvision torch.compile peer")
    ap.add_argument("--variants", default="default,tc", help="BEFORE,AFTER: the bundles' name suffixes")
    args = ap.parse_args()
    if args.json:  # refused inside the tree, before anything is timed
        args.json = output_file(args.json, "tc_compare", "tc_compare.json")
    before, after = args.variants.split(",")
    rows: list[dict[str, Any]] = []
    suffix = re.compile(rf"\.({re.escape(before)}|{re.escape(after)})\.edb$")
    pairs = sorted({suffix.sub("", p.name) for p in args.bundles.glob("*.edb") if suffix.search(p.name)})
    for pair in pairs:
        batch = int(pair.rsplit(".bs", 1)[1])
        x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
        outs: dict[str, np.ndarray] = {}
        for variant in (before, after):
            b = args.bundles / f"{pair}.{variant}.edb"
            if not b.exists():
                continue
            rt = load(b)
            outs[variant] = rt.run([x])[0]
            xd = rt._to_device(x)  # as bench/gpu_vs_torch.py: input on the GPU, the output copy back syncs

            def run(xd: Any = xd, rt: TvmRuntime = rt) -> Any:
                return rt._to_host(rt._main(xd))

            ms = timed(run, args.n if batch == 1 else max(args.n // 4, 20))
            row: dict[str, Any] = {"bundle": b.name, "batch": batch, "median_ms": round(ms, 4)}
            row["images_per_s"] = round(batch * 1e3 / ms, 1)
            if args.profile:
                row["kernels"] = kernel_profile(run, args.top)
            rows.append(row)
            print(f"{b.name:34s} {ms:9.3f} ms {row['images_per_s']:10.1f} img/s", flush=True)
        if len(outs) == 2:
            d, t = outs[before], outs[after]
            same = bool(np.array_equal(d, t))
            diff = float(np.abs(d.astype(np.float64) - t).max())
            rel = diff / max(float(np.abs(d).max()), 1e-12)
            speedup = rows[-2]["median_ms"] / rows[-1]["median_ms"]
            rows[-1].update({"speedup_vs_default": round(speedup, 3), "bit_identical": same, "max_abs_diff": diff})
            verdict = "bit-identical" if same else f"max|d| {diff:.3g} (rel {rel:.2g})"
            if pair.split(".")[1] == "int8" and not same:
                verdict += "  <-- INT8 MUST BE IDENTICAL"
            print(f"  {pair}: {after} {speedup:.2f}x {before}; outputs {verdict}", flush=True)
    for batch in sorted({r["batch"] for r in rows}) if not args.no_peer else []:
        peer = torchvision_peer(batch)
        if peer is not None:
            rows.append(
                {"bundle": "torchvision resnet18 fp16 torch.compile", "batch": batch, "median_ms": round(peer, 4)}
            )
            print(f"torchvision resnet18 fp16 compile bs{batch}: {peer:.3f} ms", flush=True)
    if args.profile:
        for r in rows:
            for k in r.get("kernels", []):
                print(f"  {r['bundle']:34s} {k['ms_per_run']:8.3f} ms x{k['calls']:<3d} {k['kernel']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
