"""CPU latency while another process keeps one core busy: TVM's thread pool pinned to cores (TVM's own default)
against left to the scheduler (how the agent loads it), onnxruntime beside, in one run.

    python bench/cpu_contention.py [--model resnet18|mobilenet] [--runs 60] [--threads 2] [--data ../shared/data]

On a device the agent's decoder, a second model or any other service shares the cores with inference. TVM pins
each worker of its pool to one core (TVM_BIND_THREADS=1, its default), so a worker whose core is taken runs only in
its time slices there and every parallel kernel waits for it; runtime/tvm.py (unpin_thread_pool) sets TVM_BIND_THREADS=0
unless the device's environment says otherwise. Each peer runs in a fresh process (the pool reads its
environment when it starts), `--runs` calls after 10 uncounted, first with every core free, then with a busy loop
pinned to the last CPU this process may use. The INT8 bundle is bench/int8_cpu.py's for the most capable x86-64
profile this CPU runs (same build, same cache); the ratios are TVM / onnxruntime's best configuration in the same
condition, by medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from edgedeploy.api import build
from edgedeploy.build_store import host_file
from edgedeploy_agent.bundle import extract_bundle, read_manifest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from int8_cpu import MODELS, host_profiles, model_source  # noqa: E402

PEERS = {  # name: (what the child runs, environment)
    "TVM INT8, workers pinned (TVM's default)": ("tvm", {"TVM_BIND_THREADS": "1"}),
    "TVM INT8, as the agent loads it": ("tvm", {}),
    "onnxruntime FP32": ("onnx-model", {}),
    "onnxruntime INT8 (QDQ)": ("qdq-onnx", {}),
}


def child(kind: str, bundle: Path, rel: Path, runs: int, threads: int) -> None:
    """One peer in this process, on the bundle unpacked at `rel`: prints {"min": ms, "median": ms}."""
    m = read_manifest(bundle)
    x = np.random.default_rng(0).standard_normal(m.inputs[0].shape).astype(np.float32)
    if kind == "tvm":
        from edgedeploy_agent.runtime.tvm import TvmRuntime

        runtime = TvmRuntime(rel, m)

        def call() -> object:
            return runtime.run([x])
    else:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads, so.log_severity_level = threads, 3
        session = ort.InferenceSession(str(host_file(m, kind, rel)), so, providers=["CPUExecutionProvider"])
        name = m.inputs[0].name

        def call() -> object:
            return session.run(None, {name: x})

    for _ in range(10):
        call()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        call()
        times.append((time.perf_counter() - t) * 1000)
    print(json.dumps({"min": min(times), "median": statistics.median(times)}), flush=True)
    # no interpreter shutdown: TVM's exit joins its pool's worker, which with the default spin count calls
    # sched_yield some 300,000 times; pinned to the busy core, each yield waits out the busy process's time
    # slice, and the exit took minutes
    os._exit(0)


def int8_bundle(name: str, profile: str, data: Path, work: Path) -> Path:
    """bench/int8_cpu.py's INT8 bundle of `name` for `profile` (its build cache entry where it has one)."""
    model, card, cfg = model_source(name, data, work)
    t = time.perf_counter()
    res = build(model, profile, work / f"{name}.int8.edb", card, int8=cfg)
    took = time.perf_counter() - t
    print(f"{MODELS[name].file} INT8 for {profile}: bundle ready in {took:.1f} s (cached: {res.cached})")
    return res.bundle


def busy_core() -> subprocess.Popen[bytes]:
    cpu = max(os.sched_getaffinity(0))
    loop = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True:\n    pass\n"
    return subprocess.Popen([sys.executable, "-c", loop])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["resnet18", "mobilenet"], default="resnet18")
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--threads", type=int, default=2)
    data = Path(os.environ.get("EDGEDEPLOY_DATA", REPO.parent / "shared" / "data"))
    ap.add_argument("--data", type=Path, default=data)
    ap.add_argument("--child", nargs=3, metavar=("KIND", "BUNDLE", "RELEASE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]), Path(args.child[2]), args.runs, args.threads)
        return
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("needs at least two CPUs: one is kept busy")
    with tempfile.TemporaryDirectory() as tmp:
        profile = host_profiles()[-1]  # the most capable x86-64 profile this CPU runs (v4 where it has VNNI)
        bundle = int8_bundle(args.model, profile, args.data, Path(tmp))
        release = Path(tmp) / "release"  # unpacked once; each child reads its manifest from the bundle
        extract_bundle(bundle, release)
        base = {k: v for k, v in os.environ.items() if k != "TVM_BIND_THREADS"}
        base["TVM_NUM_THREADS"] = str(args.threads)
        results: dict[str, dict[str, dict[str, float]]] = {}
        for condition in ("every core free", "one core busy"):
            loop = busy_core() if condition == "one core busy" else None
            try:
                for peer, (kind, env) in PEERS.items():
                    cmd = [sys.executable, __file__, "--child", kind, str(bundle), str(release)]
                    cmd += ["--runs", str(args.runs), "--threads", str(args.threads)]
                    out = subprocess.run(cmd, env={**base, **env}, capture_output=True, text=True, check=True)
                    results.setdefault(peer, {})[condition] = json.loads(out.stdout.strip().splitlines()[-1])
            finally:
                if loop is not None:
                    loop.kill()
                    loop.wait()
    print(f"{MODELS[args.model].file} INT8 ({profile}), batch 1, {args.threads} threads each, {args.runs} calls")
    width = max(map(len, PEERS))
    print(f"  {'':{width}s}  {'every core free':>21s}  {'one core busy':>21s}   (ms, min / median)")
    for peer, r in results.items():
        cells = "  ".join(f"{r[c]['min']:9.3f} / {r[c]['median']:9.3f}" for c in r)
        print(f"  {peer:{width}s}  {cells}")
    for condition in ("every core free", "one core busy"):
        ort_best = min(results[p][condition]["median"] for p in ("onnxruntime FP32", "onnxruntime INT8 (QDQ)"))
        tvm = list(PEERS)[:2]
        ratios = ", ".join(f"{p.split(', ')[1]} {results[p][condition]['median'] / ort_best:.2f}x" for p in tvm)
        print(f"  {condition}: TVM / onnxruntime best, medians: {ratios}")


if __name__ == "__main__":
    main()
