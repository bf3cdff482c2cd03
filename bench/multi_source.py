"""Many cameras per device: one agent serving N sources against N single-source agents (issue 36 part 3).

For each N in --sources (default 1,4,16), measured in the same run:

    one agent:  one `edgedeploy-agent run` process serving N video sources through one bundle (--model, default
                MobileNetV1-0.25, with its --card) compiled for
                batch B = min(N, --max-batch): the newest frame of each source batched into one call
                (agent/edgedeploy_agent/batcher.py, --wait-ms is the agent's max_batch_wait_ms)
    peer:       N `edgedeploy-agent run` processes started together, each serving one source through the
                batch 1 bundle; twice, with the agent's default frame_spin_ms (0: each loop sleeps until its
                next frame) and with 2 (each polls up to 2 ms first: a frame costs less, but N polling loops may
                take the cores N decoders need): the faster of the two stands for the peer

Every source plays its own copy of --video once, unpaced (a file hands each frame over as soon as the agent took
the previous one), at most --frames frames per source. What is printed, from the agents' own reports:

    aggregate fps   all frames of all sources / (last window end - first window start), windows of all agents
    p99 per source  each source's p99 frame latency, from capture to its prediction (report frame_latency_ms)
    ratio           one agent / peer: aggregate fps (higher is better) and the median and worst per-source p99
                    (lower is better); each side runs --repeat times, alternating which goes first, and the run
                    of median aggregate fps stands for it

The agents run as real processes with their real main (loop.run_agent): bundle load, warm-up, capture threads,
reports. N processes each start their own runtime and its thread pool: on a small CPU they compete for the same
cores, which is what N agents on one device would do.

    .venv/bin/python bench/multi_source.py [--profile cpu-x86_64] [--sources 1,4,16] [--frames 250] [--data DIR]
        [--max-batch 16] [--wait-ms 10] [--repeat 3] [--int8] [--model M.onnx --card CARD.toml]
        [--bundles DIR] [--runtime-lib libtvm_runtime.so] [--json results.json] [--work DIR]

--profile names the device profile the bundles are built for and run on; --int8 calibrates on imagenet-sample.
--bundles takes them ready-made instead (DIR/MODEL_STEM.*.bs<B>.edb, one per batch the counts need;
bench/gpu_pipeline_kit.sh builds the H200's): on the GPU machine, whose kit has the agent and the TVM runtime but
no compiler (bench/gpu_pipeline.sh runs it so); --runtime-lib (default $TVM_RUNTIME_LIB) is the agents'
tvm_runtime_lib.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from results_dir import out_dir, output_file

from edgedeploy_agent.config import AgentConfig
from edgedeploy_agent.gpu import probe_cuda
from edgedeploy_agent.spool import pending_reports
from edgedeploy_agent.store import DeviceStore

REPO = Path(__file__).resolve().parents[1]
MODEL = "mobilenet_v1_0.25_224.onnx"
CARD = REPO / "examples" / "cards" / "mobilenet_v1_0.25_224.toml"
PEER_SPIN_MS = 2.0  # the peer agents' frame_spin_ms in their second setting (the default, 0, is the first)


def bundle_for(args: argparse.Namespace, work: Path, batch: int) -> Path:
    """The model for the profile at this batch: from --bundles, or built (the build cache makes a rebuild instant)."""
    if args.bundles is not None:
        pattern = f"{args.model.stem}.*.bs{batch}.edb"  # as bench/gpu_kit.sh names them
        found = sorted(args.bundles.glob(pattern))
        if len(found) != 1:
            raise SystemExit(f"error: {args.bundles} holds {len(found)} bundles {pattern}, the bench needs one")
        return found[0]
    from edgedeploy.api import build  # the host's compiler: not on a device
    from edgedeploy.compile.cards import load_card
    from edgedeploy.compile.int8.build import Int8Config
    from edgedeploy.compile.int8.quantize import QuantizeOptions

    out = work / f"{args.model.stem}-b{batch}.{args.profile}.edb"
    if not out.exists():
        int8 = None
        if args.int8:
            int8 = Int8Config(calibration=args.data / "imagenet-sample", options=QuantizeOptions(samples=64))
        t = time.perf_counter()
        build(args.model, args.profile, out, load_card(args.card), batch=batch, int8=int8)
        print(f"built {out.name} in {time.perf_counter() - t:.1f} s", flush=True)
    return out


def prepare(
    root: Path, bundle: Path, sources: list[str], wait_ms: float, runtime_lib: str | None, spin_ms: float | None = None
) -> None:
    """An agent root with the bundle active and these sources; one report per source at the end of its run;
    `spin_ms`: frame_spin_ms (None: the agent's default)."""
    store = DeviceStore(root)
    one = len(sources) == 1
    store.init(
        AgentConfig(
            device_name="bench",
            source=sources[0] if one else None,
            sources=[] if one else sources,
            max_batch_wait_ms=wait_ms,
            report_interval_s=1e6,
            record_predictions=False,
            idle_baseline_s=0.0,
            health_frames=0,
            tvm_runtime_lib=runtime_lib,
            **({} if spin_ms is None else {"frame_spin_ms": spin_ms}),
        )
    )
    manifest = store.stage(bundle)
    store.activate(manifest.release_name)


def run_agents(roots: list[Path], max_frames: list[int]) -> float:
    """Start one `edgedeploy-agent run` per root together; wait for all; returns the wall seconds."""
    t = time.perf_counter()
    procs = []
    for root, frames in zip(roots, max_frames, strict=True):
        log = open(root / "bench.log", "wb")
        argv = [sys.executable, "-m", "edgedeploy_agent", "--root", str(root), "run", "--max-frames", str(frames)]
        procs.append((subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=root), log, root))
    failed = []
    for p, log, root in procs:
        if p.wait() != 0:
            failed.append(f"{root}: exit {p.returncode}: {(root / 'bench.log').read_text()[-500:]}")
        log.close()
    if failed:
        raise SystemExit("error: an agent failed\n" + "\n".join(failed))
    return time.perf_counter() - t


def measure(roots: list[Path]) -> dict[str, Any]:
    """Aggregate fps and per-source p99 frame latency from the agents' reports."""
    reports = [r for root in roots for _, r in pending_reports(DeviceStore(root)) if r["frames"]]
    starts = [dt.datetime.fromisoformat(r["window_start"].replace("Z", "+00:00")) for r in reports]
    ends = [dt.datetime.fromisoformat(r["window_end"].replace("Z", "+00:00")) for r in reports]
    span = (max(ends) - min(starts)).total_seconds()
    frames = sum(r["frames"] for r in reports)
    p99 = {r["source"]: r["frame_latency_ms"]["p99"] for r in reports}
    return {
        "frames": frames,
        "span_s": round(span, 3),
        "aggregate_fps": round(frames / span, 1),
        "p99_ms": p99,
        "p99_median_ms": round(statistics.median(p99.values()), 2),
        "p99_max_ms": round(max(p99.values()), 2),
        "infer_p50_ms": round(statistics.median(r["latency_ms"]["infer"]["p50"] for r in reports), 3),
    }


def bench_n(args: argparse.Namespace, work: Path, n: int) -> dict[str, Any]:
    batch = min(n, args.max_batch)
    batched, single = bundle_for(args, work, batch), bundle_for(args, work, 1)
    base = work / f"n{n}"
    shutil.rmtree(base, ignore_errors=True)
    videos = []
    for i in range(n):  # each source its own file (an agent refuses one source named twice)
        v = base / "video" / f"cam{i:02d}{args.video.suffix}"
        v.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(args.video.resolve(), v)
        videos.append(f"file:{v}")
    runs: dict[str, list[dict[str, Any]]] = {"one_agent": [], "peer": [], "peer_spinning": []}
    for k in range(args.repeat):  # alternating, so that a neighbour's load falls on both sides alike
        one = base / f"run{k}" / "one-agent"
        prepare(one, batched, videos, args.wait_ms, args.runtime_lib)
        sides = [("one_agent", [one], [args.frames * n])]
        for side, spin in (("peer", None), ("peer_spinning", PEER_SPIN_MS)):
            peers = [base / f"run{k}" / side / f"agent{i:02d}" for i in range(n)]
            for root, uri in zip(peers, videos, strict=True):
                prepare(root, single, [uri], args.wait_ms, args.runtime_lib, spin)
            sides.append((side, peers, [args.frames] * n))
        for side, roots, frames in sides[:: -1 if k % 2 else 1]:
            run_agents(roots, frames)
            runs[side].append(measure(roots))
    out: dict[str, Any] = {"sources": n, "batch": batch, "runs": runs}
    for side, measured in runs.items():  # the run of median aggregate fps stands for the side
        out[side] = sorted(measured, key=lambda m: m["aggregate_fps"])[len(measured) // 2]
    # the peer as its experts would set it up: the faster of the two frame_spin_ms settings
    spun = out["peer_spinning"]["aggregate_fps"] > out["peer"]["aggregate_fps"]
    out["peer_spin"] = f"{PEER_SPIN_MS:g}" if spun else "0 (default)"
    out["peer"] = max(out["peer"], out.pop("peer_spinning"), key=lambda m: m["aggregate_fps"])
    a, p = out["one_agent"], out["peer"]
    out["ratio"] = {
        "aggregate_fps": round(a["aggregate_fps"] / p["aggregate_fps"], 3),
        "p99_median": round(a["p99_median_ms"] / p["p99_median_ms"], 3),
        "p99_max": round(a["p99_max_ms"] / p["p99_max_ms"], 3),
    }
    return out


def show(r: dict[str, Any]) -> None:
    n, a, p, q = r["sources"], r["one_agent"], r["peer"], r["ratio"]
    print(f"\n{n} source(s): one agent, batch {r['batch']} bundle  vs  {n} single-source agent(s), batch 1 bundle")
    sides = (
        ("one_agent", "one agent"),
        ("peer", f"{n} agent(s)"),
        ("peer_spinning", f"{n} agent(s), frame_spin_ms {PEER_SPIN_MS:g}"),
    )
    for side, name in sides:
        print(f"  {name} aggregate fps, each run: {', '.join(str(m['aggregate_fps']) for m in r['runs'][side])}")
    print(f"  the peer below: the {n} agent(s) with frame_spin_ms {r['peer_spin']} (the faster)")
    for name, m in ((f"one agent ({n} sources)", a), (f"{n} agent(s)", p)):
        per = ", ".join(f"{v:.1f}" for _, v in sorted(m["p99_ms"].items())) if n <= 4 else ""
        print(
            f"  {name:<24} {m['frames']:>5} frames in {m['span_s']:7.2f} s: {m['aggregate_fps']:8.1f} fps aggregate; "
            f"p99 frame latency per source median {m['p99_median_ms']:.1f} ms, worst {m['p99_max_ms']:.1f} ms"
            f"{f' [{per}]' if per else ''}; infer p50 {m['infer_p50_ms']:.2f} ms a call"
        )
    print(
        f"  ratio one agent / {n} agent(s): aggregate fps {q['aggregate_fps']:.2f}x, "
        f"p99 median {q['p99_median']:.2f}x, p99 worst {q['p99_max']:.2f}x"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="cpu-x86_64", help="device profile to build for and run on")
    ap.add_argument("--sources", default="1,4,16", help="comma-separated source counts")
    ap.add_argument("--frames", type=int, default=250, help="frames per source at most")
    ap.add_argument("--max-batch", type=int, default=16, help="the one agent's bundle batch: min(N, this)")
    ap.add_argument("--wait-ms", type=float, default=10.0, help="the one agent's max_batch_wait_ms")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each side (the median run is compared)")
    ap.add_argument("--int8", action="store_true", help="INT8 bundles, calibrated on imagenet-sample")
    ap.add_argument(
        "--data",
        type=Path,
        default=Path(os.environ.get("EDGEDEPLOY_DATA", REPO.parent / "shared" / "data")),
        help="the shared data folder (default $EDGEDEPLOY_DATA, else ../shared/data)",
    )
    ap.add_argument("--video", type=Path, default=None, help="default: DATA/video/bikes.mp4")
    ap.add_argument("--model", type=Path, default=None, help=f"ONNX model (default: DATA/models/{MODEL})")
    ap.add_argument("--card", type=Path, default=CARD, help="its model card (default: MobileNet's)")
    ap.add_argument(
        "--bundles", type=Path, default=None, help="ready-made bundles, DIR/MODEL_STEM.*.bs<B>.edb (builds none)"
    )
    ap.add_argument("--runtime-lib", default=os.environ.get("TVM_RUNTIME_LIB"), help="the agents' libtvm_runtime.so")
    ap.add_argument(
        "--work", type=Path, default=None, help="bundles and agent roots, outside the tree (default: a temp folder)"
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the results here, outside the tree")
    args = ap.parse_args()
    args.video = args.video or args.data / "video" / "bikes.mp4"
    args.model = args.model or args.data / "models" / MODEL
    try:
        counts = [int(x) for x in args.sources.split(",")]
    except ValueError:
        raise SystemExit(f"error: --sources takes comma-separated whole numbers, got {args.sources!r}") from None
    needed = [("video", args.video)]
    needed += [("bundles", args.bundles)] if args.bundles else [("model", args.model), ("model card", args.card)]
    for what, path in needed:
        if not path.exists():
            raise SystemExit(f"error: no {what} at {path} (give --data, --video, --model or --card)")
    if min(counts) < 1 or args.frames < 1 or args.max_batch < 1 or args.repeat < 1:
        raise SystemExit("error: --sources, --frames, --max-batch and --repeat must be at least 1")
    json_out = output_file(args.json, "multi-source", "multi_source.json") if args.json else None
    what = f"bundles {args.bundles}" if args.bundles else f"{'INT8' if args.int8 else 'FP32'} {args.model.name}"
    gpu, why = probe_cuda()  # the card it runs on: the profile names the one the bundles were built for
    print(f"bundles for profile {args.profile}, on GPU {gpu.name if gpu else f'none ({why})'}, {what}, "
          f"video {args.video.name}, {os.cpu_count()} CPUs seen, max_batch_wait_ms {args.wait_ms}")  # fmt: skip
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            work = out_dir(args.work) if args.work else Path(tmp)
        except ValueError as e:  # inside the tree
            raise SystemExit(f"multi-source: {e}") from None
        for n in counts:  # each count printed and written as it is measured: a run cut short keeps what it has
            results.append(bench_n(args, work, n))
            show(results[-1])
            if json_out is not None:
                results_json = {"profile": args.profile, "int8": args.int8, "results": results}
                json_out.write_text(json.dumps(results_json, indent=1))


if __name__ == "__main__":
    main()
