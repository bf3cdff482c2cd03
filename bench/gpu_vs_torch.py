"""edgedeploy GPU bundles against PyTorch on the same GPU, model, weights and inputs, in ONE process.

Runs on the GPU machine (bench/gpu_bench.sh calls it with a kit from bench/gpu_kit.sh):

    python bench/gpu_vs_torch.py --kit KIT --json OUT/gpu_vs_torch.json [--models resnet18,...] [--batches 1,64]

What is measured, per model (KIT/models/<stem>.onnx) and batch size:
  edgedeploy fp32|fp16|int8   KIT/bundles/<stem>/<stem>.<precision>.bs<batch>.edb, unpacked with the agent's
                              extract_bundle and opened with its load_runtime (agent/edgedeploy_agent/runtime/),
                              exactly as a device opens it: TVM runtime only, no compiler in the process.
                              A bundle that is missing is skipped with the reason; one that was built
                              from another ONNX file (manifest source_sha256), for another batch or
                              precision is skipped as MISMATCH.
  torch fp32 eager            bench/onnx_torch.py (the same ONNX graph and weights as torch ops), NCHW,
                              TF32 off: the reference every output is compared with.
  torch fp16 eager            fp16 weights and input, channels_last, cudnn.benchmark on.
  compile default / reduce-overhead / max-autotune
                              torch.compile(fullgraph=True, mode=...) of the fp16 channels_last model;
                              reduce-overhead and max-autotune replay CUDA graphs. fullgraph=True makes
                              a graph break an error (printed as PEER BROKEN), never a slow peer.
  torchvision ...             ResNet-18 only: torchvision.models.resnet18 holding the ONNX's weights
                              (bench/resnet18_onnx.py), fp16 channels_last, eager and compiled the same
                              way. Its outputs must equal the peer's and its time must not be much lower:
                              otherwise the ONNX peer is suspect (printed as PEER SUSPECT).

How:
  - Inputs: real images (KIT/images/*.jpg) through the agent's preprocess with the bundle's manifest,
    cycled to fill the batch; already on the GPU before timing, for every case.
  - One call = run the model + copy the small output (logits) back to host memory; that copy is the
    synchronisation. Wall clock (time.perf_counter) per call. After warm-up (compilation, CUDA graph
    capture), the cases are timed in --rounds interleaved rounds (case A, B, C, ..., A, B, C, ...) so
    that clock or thermal drift does not favour one of them; median and p90 over all calls.
  - Ratio: median / the median of the fastest torch.compile variant of the same model and batch
    (>1 = slower than the best torch.compile), and its range over the rounds (each round's median over the
    baseline's in the same round): a ratio whose range straddles 1.0 is not a robust win or loss.
  - Memory: torch cases report torch.cuda.max_memory_allocated over setup + warm-up, less what was
    allocated before (weights, activations, CUDA graph pools; not the CUDA context). Every case also
    reports the device-wide used-memory delta over its setup + warm-up (NVML, else cudaMemGetInfo):
    for TVM bundles that is the only figure (its pooled allocator, weights, loaded kernels, CUDA
    graph). Bundles are set up before any torch model so that torch's caching allocator is not in it.
  - Energy: NVML's total-energy counter over a loop of --energy-s seconds per case: mJ per image
    (whole GPU, gross), and net of the idle power measured at the start (GPU idle for 2 s).
  - Outputs: each case's top-1 agreement and max |difference| (also relative to max |reference|) vs the
    torch fp32 reference on the same inputs; torchvision's fp32 output vs the peer's.
Results: a table on stdout and a JSON (--json), rewritten after every model/batch, with the command,
the GPU, versions, each bundle's manifest facts and every row. --deadline-s skips what would not finish.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from onnx_torch import OnnxModule  # noqa: E402
from resnet18_onnx import torchvision_from_onnx  # noqa: E402
from results_dir import output_file  # noqa: E402

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
PRECISIONS = ("fp32", "fp16", "int8")
T0 = time.monotonic()
DEV = "cuda"  # "cpu" with --smoke-cpu


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


# ---------------------------------------------------------------- GPU counters (NVML, torch fallback)


class Gpu:
    def __init__(self) -> None:
        self.nvml: Any = None
        if DEV == "cpu":
            self.memory_source = "none (cpu)"
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml, self.h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as e:  # no nvidia-ml-py, or NVML refuses
            log(f"NVML unavailable ({e}): no energy figures; memory from cudaMemGetInfo")
        self.memory_source = "nvml used" if self.nvml else "cudaMemGetInfo"

    def used_bytes(self) -> int:
        sync()
        if DEV == "cpu":
            return 0
        if self.nvml:
            return int(self.nvml.nvmlDeviceGetMemoryInfo(self.h).used)
        free, total = torch.cuda.mem_get_info()
        return int(total - free)

    def energy_mj(self) -> float | None:
        if not self.nvml:
            return None
        try:
            return float(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.h))
        except Exception:
            return None

    def describe(self) -> dict[str, Any]:
        if DEV == "cpu":
            return {"name": f"cpu smoke test ({platform.processor() or platform.machine()}), numbers meaningless"}
        d: dict[str, Any] = {"name": torch.cuda.get_device_name(0), "capability": torch.cuda.get_device_capability(0)}
        if self.nvml:
            n = self.nvml
            d |= {
                "driver": n.nvmlSystemGetDriverVersion(),
                "power_limit_w": n.nvmlDeviceGetEnforcedPowerLimit(self.h) / 1e3,
                "sm_clock_max_mhz": n.nvmlDeviceGetMaxClockInfo(self.h, n.NVML_CLOCK_SM),
            }
        return d


# ---------------------------------------------------------------- cases


@dataclass
class Case:
    name: str
    kind: str  # "edgedeploy" | "torch" | "torchvision"
    call: Callable[[], np.ndarray] | None = None
    out: np.ndarray | None = None
    samples: list[float] = field(default_factory=list)
    round_medians: list[float] = field(default_factory=list)  # one per interleaved timing round
    info: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None
    is_compile: bool = False  # counts for the "best torch.compile" baseline


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def bundle_case(path: Path, prec: str, batch: int, onnx_sha: str, lib: str, x: np.ndarray, gpu: Gpu) -> Case:
    """Open a bundle the way the agent does, check it is what the row claims, time run minus upload."""
    from edgedeploy_agent.bundle import extract_bundle, read_manifest
    from edgedeploy_agent.runtime import load_runtime

    case = Case(f"edgedeploy {prec}", "edgedeploy")
    if not path.is_file():
        case.skipped = f"no bundle {path.name} in the kit"
        return case
    m = read_manifest(path)
    facts = {
        "bundle": path.name,
        "bundle_id": m.bundle_id,
        "profile": m.profile,
        "precision": m.quantization.precision,
        "input_shape": m.inputs[0].shape,
        "cuda_sm": m.target.cuda_sm,
        "device_code": m.target.device_code,
        "cuda_graph": m.target.cuda_graph,
        "tools": m.provenance.tools,
        "options": m.provenance.options,
        "float_in_runtime": m.quantization.float_in_runtime,
    }
    case.info["manifest"] = facts
    wrong = []
    if m.model.source_sha256 != onnx_sha:
        wrong.append(f"built from ONNX {m.model.source_sha256[:12]}, the peer runs {onnx_sha[:12]}")
    if m.quantization.precision != prec:
        wrong.append(f"precision {m.quantization.precision}")
    if m.inputs[0].shape[0] != batch or list(m.inputs[0].shape[1:]) != list(x.shape[1:]):
        wrong.append(f"input shape {m.inputs[0].shape}")
    if m.target.device != DEV:
        wrong.append(f"device {m.target.device}")
    if wrong:
        case.skipped = "MISMATCH: " + "; ".join(wrong)
        return case
    used0 = gpu.used_bytes()
    rel = Path(tempfile.mkdtemp(prefix="edb-")) / "release"
    rt: Any = load_runtime(rel, extract_bundle(path, rel), tvm_runtime_lib=lib)
    d = rt.describe()
    case.info["runtime"] = {k: d.get(k) for k in ("runtime", "runtime_lib", "loaded_tvm_libraries", "fallback_from")}
    if any("compiler" in name for name in d.get("loaded_tvm_libraries", [])):
        case.skipped = f"MISMATCH: the TVM compiler is loaded in this process ({d['loaded_tvm_libraries']})"
        return case
    # The runtime's own steps (agent/edgedeploy_agent/runtime/tvm.py): the input is uploaded once, each
    # call launches main and copies the output back (synchronous): what run() does minus the upload.
    xd = rt._to_device(np.ascontiguousarray(x))

    def call() -> np.ndarray:
        return np.from_dlpack(rt._to_host(rt._main(xd))).copy()

    t = time.perf_counter()
    case.out = call()
    case.info["first_call_s"] = round(time.perf_counter() - t, 3)
    for _ in range(20):
        call()
    case.info["device_used_delta_mib"] = round((gpu.used_bytes() - used0) / 2**20, 1)
    full = rt.run([x])[0]  # the agent's own run() gives the same numbers
    if not np.array_equal(full, case.out):
        case.info["run_vs_timed_call_max_diff"] = float(np.abs(full - case.out).max())
    case.call = call
    return case


def torch_case(
    name: str, kind: str, make: Callable[[], torch.nn.Module], x: np.ndarray, fp16: bool, mode: str | None, gpu: Gpu
) -> Case:
    """An eager (mode None) or torch.compile(fullgraph=True, mode=mode) case; errors become a skip reason."""
    case = Case(name, kind, is_compile=mode is not None)
    sync()
    gc.collect()
    cuda = DEV == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    alloc0, used0 = torch.cuda.memory_allocated() if cuda else 0, gpu.used_bytes()
    try:
        m = make().to(DEV).eval()
        xd = torch.from_numpy(x).to(DEV)
        if fp16:
            m = m.half().to(memory_format=torch.channels_last)
            xd = xd.half().contiguous(memory_format=torch.channels_last)
        f: Any = m
        if mode is not None:  # static shapes, as the bundles have
            f = torch.compile(m, fullgraph=True, mode=mode, dynamic=False)
        graphs = cuda and mode in ("reduce-overhead", "max-autotune")

        def call() -> np.ndarray:
            if graphs:
                torch.compiler.cudagraph_mark_step_begin()
            with torch.inference_mode():
                return f(xd).float().cpu().numpy()

        t = time.perf_counter()
        case.out = call()
        case.info["first_call_s"] = round(time.perf_counter() - t, 3)  # includes compilation
        for _ in range(20):  # CUDA graphs are recorded on the first calls after compilation
            call()
    except Exception as e:
        what = "PEER BROKEN" if mode is not None else "FAILED"
        case.skipped = f"{what}: {type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
        case.info["traceback"] = traceback.format_exc()[-4000:]
        log(f"{name}: {case.skipped}")
        return case
    if cuda:
        case.info["peak_allocated_mib"] = round((torch.cuda.max_memory_allocated() - alloc0) / 2**20, 1)
    case.info["device_used_delta_mib"] = round((gpu.used_bytes() - used0) / 2**20, 1)
    case.call = call
    return case


# ---------------------------------------------------------------- measuring


class CaseFault(Exception):
    """A case's call raised while timing (a CUDA error is sticky: the context, and every later case, is lost).
    With CUDA_LAUNCH_BLOCKING=1 the case named is the one whose kernel faulted; without it, only the one in
    which the error surfaced."""

    def __init__(self, case: str, error: BaseException) -> None:
        self.case = case
        self.error = f"{type(error).__name__}: {error}"
        super().__init__(f"{case}: {self.error}")


def measure(cases: list[Case], n: int, rounds: int) -> None:
    live = [c for c in cases if c.call is not None]
    per = max(n // rounds, 1)
    for _ in range(rounds):
        for c in live:
            assert c.call is not None
            try:
                for _ in range(3):  # re-warm after the other cases ran
                    c.call()
                for _ in range(per):
                    t = time.perf_counter()
                    c.call()
                    c.samples.append((time.perf_counter() - t) * 1e3)
            except Exception as e:
                raise CaseFault(c.name, e) from e
            c.round_medians.append(statistics.median(c.samples[-per:]))


def ratio_range(rounds: list[float], best_rounds: list[float]) -> list[float]:
    """The lowest and highest ratio of a case's round median to the baseline's in the same round: how far one
    run's ratio moves with the machine's drift (the rounds are interleaved, so both saw the same drift)."""
    ratios = [a / b for a, b in zip(rounds, best_rounds, strict=True)]
    return [min(ratios), max(ratios)]


def energy(gpu: Gpu, c: Case, seconds: float) -> dict[str, Any]:
    assert c.call is not None
    e0, t0, calls = gpu.energy_mj(), time.perf_counter(), 0
    if e0 is None:
        return {}
    while time.perf_counter() - t0 < seconds:
        c.call()
        calls += 1
    e1, dt_s = gpu.energy_mj(), time.perf_counter() - t0
    return {"energy_mj": e1 - e0, "energy_s": dt_s, "energy_calls": calls}


def idle_power_w(gpu: Gpu, seconds: float = 2.0) -> float | None:
    sync()
    e0, t0 = gpu.energy_mj(), time.perf_counter()
    if e0 is None:
        return None
    time.sleep(seconds)
    e1 = gpu.energy_mj()
    return None if e1 is None else (e1 - e0) / (time.perf_counter() - t0) / 1e3


def compare(out: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    diff = float(np.abs(out.astype(np.float64) - ref).max())
    return {
        "top1_agree": float(np.mean(out.argmax(1) == ref.argmax(1))),
        "max_abs_diff": diff,
        "max_rel_diff": diff / float(np.abs(ref).max()),
    }


# ---------------------------------------------------------------- one model, one batch size


def load_inputs(images: Path, bundles: list[Path], onnx_sha: str, batch: int, seed: int) -> tuple[np.ndarray, str]:
    """A batch of real images through the agent's preprocess, as the manifest of the first bundle built
    from this ONNX file says."""
    from edgedeploy_agent.bundle import read_manifest

    files = sorted(images.glob("*.jpg")) if images.is_dir() else []
    manifests = [b for b in bundles if b.is_file() and read_manifest(b).model.source_sha256 == onnx_sha]
    if files and manifests:
        import cv2

        from edgedeploy_agent.preprocess import preprocess

        m = read_manifest(manifests[0])
        spec = m.inputs[0]
        rows = [preprocess(cv2.imread(str(files[i % len(files)])), m.preprocess, spec)[0] for i in range(batch)]
        note = f"{min(batch, len(files))} images of {images}, {manifests[0].name}'s preprocess"
        return np.stack(rows).astype(np.float32), note
    x = np.random.default_rng(seed).uniform(-1, 1, (batch, 3, 224, 224)).astype(np.float32)
    return x, "uniform(-1, 1) random (no images or no bundle to read the preprocessing from)"


def run_group(args: argparse.Namespace, gpu: Gpu, idle_w: float | None, stem: str, batch: int) -> dict[str, Any]:
    onnx_path = args.kit / "models" / f"{stem}.onnx"
    onnx_sha = sha256(onnx_path)
    paths = {p: args.kit / "bundles" / stem / f"{stem}.{p}.bs{batch}.edb" for p in PRECISIONS}
    x, x_note = load_inputs(args.kit / "images", list(paths.values()), onnx_sha, batch, args.seed)
    torch._dynamo.reset()  # nothing compiled for another model or batch is reused
    log(f"== {stem} batch {batch}: inputs {x_note}")
    cases: list[Case] = []
    for prec in PRECISIONS:  # bundles first: the NVML delta then sees no torch allocations
        if prec in args.precisions:
            try:
                cases.append(bundle_case(paths[prec], prec, batch, onnx_sha, args.tvm_runtime_lib, x, gpu))
            except Exception as e:  # a bundle that does not load is a result, not a crash
                c = Case(f"edgedeploy {prec}", "edgedeploy", skipped=f"FAILED to load: {type(e).__name__}: {e}")
                c.info["traceback"] = traceback.format_exc()[-4000:]
                cases.append(c)
            log(f"{cases[-1].name}: {cases[-1].skipped or 'ready'}")

    def peer() -> torch.nn.Module:
        return OnnxModule(str(onnx_path))

    ref_case = torch_case("torch fp32 eager", "torch", peer, x, fp16=False, mode=None, gpu=gpu)
    if ref_case.out is None:
        raise SystemExit(f"the reference failed: {ref_case.skipped}")
    ref = ref_case.out.astype(np.float64)
    cases.append(ref_case)
    cases.append(torch_case("torch fp16 eager", "torch", peer, x, True, None, gpu))
    tv_make: Callable[[], torch.nn.Module] | None = None
    tv_check: dict[str, Any] = {}
    if stem.startswith("resnet18"):
        tv_source = torchvision_from_onnx(str(onnx_path))[1]
        tv_check["source"] = tv_source

        def tv_make() -> torch.nn.Module:
            return torchvision_from_onnx(str(onnx_path))[0]

        tv32 = torch_case("torchvision fp32 eager", "torchvision", tv_make, x, False, None, gpu)
        if tv32.out is not None:
            tv_check |= {"fp32_vs_peer_fp32": compare(tv32.out, ref)}
        del tv32
    for mode in COMPILE_MODES:
        if mode not in args.modes:
            continue
        for kind, make in (("torch", peer), ("torchvision", tv_make)):
            if make is None or (kind == "torchvision" and mode not in args.torchvision_modes):
                continue
            label = "torch.compile" if kind == "torch" else "torchvision.compile"
            name = f"{label} {mode}"
            left = args.deadline_s - (time.monotonic() - T0)
            if left < args.reserve_s.get(mode, 60):
                cases.append(Case(name, kind, skipped=f"deadline: {left:.0f} s left", is_compile=True))
                log(f"{name}: skipped, {left:.0f} s left before --deadline-s")
                continue
            log(f"{name}: compiling (fullgraph=True)")
            cases.append(torch_case(name, kind, make, x, True, mode, gpu))
            c = cases[-1]
            log(f"{name}: {c.skipped or 'ready, first call {:.1f} s'.format(c.info['first_call_s'])}")
    if tv_make is not None:
        cases.append(torch_case("torchvision fp16 eager", "torchvision", tv_make, x, True, None, gpu))

    log(f"timing {sum(c.call is not None for c in cases)} cases: {args.rounds} interleaved rounds")
    measure(cases, args.n if batch == 1 else max(args.n // 4, 40), args.rounds)
    rows = []
    for c in cases:
        row: dict[str, Any] = {"model": stem, "batch": batch, "case": c.name, "kind": c.kind, **c.info}
        if c.skipped:
            row["skipped"] = c.skipped
            rows.append(row)
            continue
        assert c.out is not None
        s = sorted(c.samples)
        row |= {
            "calls": len(s),
            "median_ms": statistics.median(s),
            "p90_ms": s[int(0.9 * (len(s) - 1))],
            "min_ms": s[0],
            "images_per_s": batch * 1e3 / statistics.median(s),
            "round_medians_ms": c.round_medians,
            **compare(c.out, ref),
        }
        e = energy(gpu, c, args.energy_s)
        if e:
            images = e["energy_calls"] * batch
            row["mj_per_image"] = e["energy_mj"] / images
            if idle_w is not None:
                row["mj_per_image_net_of_idle"] = (e["energy_mj"] - idle_w * 1e3 * e["energy_s"]) / images
            row["avg_power_w"] = e["energy_mj"] / e["energy_s"] / 1e3
        rows.append(row)
    # the baseline: the fastest compiled PyTorch, the ONNX peer's or torchvision's
    compiled = [r for r, c in zip(rows, cases, strict=True) if c.is_compile and "median_ms" in r]
    best = min(compiled, key=lambda r: r["median_ms"]) if compiled else None
    for r in rows:
        if best and "median_ms" in r:
            r["x_best_compile"] = r["median_ms"] / best["median_ms"]
            r["x_best_compile_rounds"] = ratio_range(r["round_medians_ms"], best["round_medians_ms"])
    verdicts = peer_verdicts(rows, tv_check)
    for c in cases:  # free the GPU for the next group (CUDA graph pools, TVM pools)
        c.call = None
    del cases
    gc.collect()
    torch._dynamo.reset()
    if DEV == "cuda":
        torch.cuda.empty_cache()
    return {
        "model": stem,
        "batch": batch,
        "onnx": str(onnx_path),
        "onnx_sha256": onnx_sha,
        "inputs": x_note,
        "best_compile": best["case"] if best else None,
        "torchvision": tv_check,
        "verdicts": verdicts,
        "rows": rows,
    }


def peer_verdicts(rows: list[dict[str, Any]], tv_check: dict[str, Any]) -> list[str]:
    """What makes the comparison untrustworthy, in words (empty: nothing found)."""
    out = []
    by = {r["case"]: r for r in rows}
    for r in rows:
        if str(r.get("skipped", "")).startswith(("PEER BROKEN", "MISMATCH", "FAILED")):
            out.append(f"{r['case']}: {r['skipped']}")
        elif r["kind"] != "edgedeploy" and "max_rel_diff" in r and r["max_rel_diff"] > 0.05:
            out.append(f"{r['case']}: output differs from the fp32 reference (relative {r['max_rel_diff']:.3f})")
    diff = tv_check.get("fp32_vs_peer_fp32", {}).get("max_rel_diff")
    if diff is not None and diff > 1e-3:
        out.append(f"PEER SUSPECT: torchvision with the ONNX weights differs from the ONNX peer (relative {diff:.2e})")
    for mode in COMPILE_MODES:
        p, t = by.get(f"torch.compile {mode}", {}), by.get(f"torchvision.compile {mode}", {})
        if "median_ms" in p and "median_ms" in t and p["median_ms"] > 1.15 * t["median_ms"]:
            ratio = p["median_ms"] / t["median_ms"]
            out.append(f"PEER SUSPECT: torch.compile {mode} of the ONNX peer is {ratio:.2f}x torchvision's")
    return out


# ---------------------------------------------------------------- report


def fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _range(r: list[float] | None) -> str:
    return f"{r[0]:.2f}-{r[1]:.2f}" if r else "n/a"


def print_group(g: dict[str, Any], memory_source: str) -> None:
    print(f"\n{g['model']}  batch {g['batch']}  (ratio: median / {g['best_compile'] or 'n/a'})")
    head = (
        "case",
        "median ms",
        "p90 ms",
        "img/s",
        "x best",
        "(rounds)",
        "alloc MiB",
        "dev MiB",
        "mJ/img",
        "top1",
        "max|d|",
    )
    print("{:28s} {:>9s} {:>9s} {:>9s} {:>7s} {:>11s} {:>9s} {:>8s} {:>8s} {:>5s} {:>9s}".format(*head))
    for r in g["rows"]:
        if "skipped" in r:
            print(f"{r['case']:28s} skipped: {r['skipped']}")
            continue
        print(
            f"{r['case']:28s} {r['median_ms']:9.3f} {r['p90_ms']:9.3f} {r['images_per_s']:9.0f} "
            f"{fmt(r.get('x_best_compile'), '6.2f')}x {_range(r.get('x_best_compile_rounds')):>11s} "
            f"{fmt(r.get('peak_allocated_mib'), '9.1f')} "
            f"{fmt(r.get('device_used_delta_mib'), '8.1f')} {fmt(r.get('mj_per_image'), '8.2f')} "
            f"{r['top1_agree']:5.2f} {r['max_abs_diff']:9.2e}"
        )
    tv = g["torchvision"].get("fp32_vs_peer_fp32")
    if tv:
        src = g["torchvision"]["source"]
        print(f"torchvision ({src}) fp32 vs ONNX peer fp32: max rel diff {tv['max_rel_diff']:.1e}")
    print("checks: " + ("; ".join(g["verdicts"]) if g["verdicts"] else "no MISMATCH, PEER BROKEN or PEER SUSPECT"))
    print(f"(alloc: torch.cuda.max_memory_allocated; dev: device-wide {memory_source} delta over setup)")


def environment(gpu: Gpu, idle_w: float | None, kit: Path) -> dict[str, Any]:
    env: dict[str, Any] = {
        "gpu": gpu.describe(),
        "idle_power_w": idle_w,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "tf32": False,
        "memory_source": gpu.memory_source,
    }
    for mod in ("torchvision", "triton", "tvm_ffi", "onnx"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception as e:
            env[mod] = f"not importable: {type(e).__name__}"
    kit_json = kit / "KIT.json"
    if kit_json.is_file():
        env["kit"] = json.loads(kit_json.read_text())
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description="edgedeploy bundles vs PyTorch on one GPU (see the module docstring)")
    ap.add_argument("--kit", type=Path, required=True, help="from bench/gpu_kit.sh: models/, bundles/, images/, lib/")
    ap.add_argument("--json", type=Path, required=True, help="results file, rewritten after every model/batch")
    ap.add_argument("--models", default="resnet18,mobilenet_v1_0.25_224", help="ONNX stems in KIT/models")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--modes", default=",".join(COMPILE_MODES), help="torch.compile modes of the ONNX peer")
    ap.add_argument("--torchvision-modes", default="reduce-overhead", help="same, for torchvision")
    ap.add_argument("--n", type=int, default=300, help="timed calls at batch 1 (a quarter, at least 40, above)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    ap.add_argument("--energy-s", type=float, default=2.0, help="seconds of the energy loop per case")
    ap.add_argument("--deadline-s", type=float, default=540, help="skip compiles that would end after this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--smoke-cpu",
        action="store_true",
        help="check this script without a GPU: torch on the CPU, cpu-x86_64 bundles; the numbers mean nothing",
    )
    args = ap.parse_args()
    args.json = output_file(args.json, "gpu_vs_torch", "gpu_vs_torch.json")  # refused inside the tree
    global DEV
    DEV = "cpu" if args.smoke_cpu else "cuda"
    args.models = args.models.split(",")
    args.batches = [int(b) for b in args.batches.split(",")]
    args.precisions = args.precisions.split(",")
    args.modes = args.modes.split(",")
    args.torchvision_modes = args.torchvision_modes.split(",")
    args.reserve_s = {"default": 60, "reduce-overhead": 60, "max-autotune": 200}  # guesses: compile + timing
    lib = args.kit / "lib" / "libtvm_runtime.so"
    args.tvm_runtime_lib = os.environ.get("TVM_RUNTIME_LIB", str(lib))

    if DEV == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device visible to torch")
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference is real fp32
    torch.backends.cudnn.allow_tf32 = False
    torch._dynamo.config.cache_size_limit = 64  # one forward compiled in several modes
    torch._dynamo.config.fail_on_recompile_limit_hit = True  # never a silent fallback to eager
    gpu = Gpu()
    # CUDA context, cuBLAS and cuDNN handles before anything is measured
    w = torch.randn(8, 3, 3, 3, device=DEV)
    for dtype in (torch.float32, torch.float16):
        torch.nn.functional.conv2d(torch.randn(1, 3, 16, 16, device=DEV, dtype=dtype), w.to(dtype))
        torch.randn(16, 16, device=DEV, dtype=dtype) @ torch.randn(16, 16, device=DEV, dtype=dtype)
    idle_w = idle_power_w(gpu)
    result: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "environment": environment(gpu, idle_w, args.kit),
        "groups": [],
    }
    log(f"{result['environment']['gpu']}, torch {torch.__version__}, idle {fmt(idle_w, '.1f')} W")
    for stem in args.models:
        for batch in args.batches:
            try:
                g = run_group(args, gpu, idle_w, stem, batch)
            except CaseFault as e:  # recorded for bench/gpu_bench.sh, which reruns this group in a new process
                result["fault"] = {
                    "model": stem,
                    "batch": batch,
                    "case": e.case,
                    "error": e.error,
                    "launch_blocking": os.environ.get("CUDA_LAUNCH_BLOCKING") == "1",
                }
                args.json.write_text(json.dumps(result, indent=1, default=str))
                print(f"\nFAULT while timing {stem} batch {batch}, in {e.case}: {e.error}", flush=True)
                sys.stderr.flush()
                os._exit(3)  # not `return`: destructors on the lost CUDA context abort the process (exit 134)
            result["groups"].append(g)
            result["elapsed_s"] = round(time.monotonic() - T0, 1)
            args.json.write_text(json.dumps(result, indent=1, default=str))
            print_group(g, gpu.memory_source)
    print(f"\nall groups in {time.monotonic() - T0:.0f} s; JSON: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
