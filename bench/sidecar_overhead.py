"""What the JetPack route costs per frame: TensorRT and GStreamer capture in a sidecar worker under another Python.

Issue 38's design runs TensorRT (and GStreamer capture) in a worker under JetPack's Python 3.8, fed through
pipes and shared memory. This measures, in one run:

  inference  the agent's SidecarEngine.run() wall time per frame vs the engine's own time inside the worker
             (the reply's engine_ms): overhead = the copy in, the request/reply and the copy out. The peer is
             the same engine in this process (the TensorRT double: the INT8 Q/DQ ONNX run by onnxruntime), for
             scale. MobileNetV1-0.25 (1x3x224x224 float32 in, 1x1001 out) and MNIST (1x1x28x28: the fixed cost).
  capture    SidecarCapture.read() wall per frame vs cv2's read inside the worker (read_ms), for an unpaced
             1280x720 videotestsrc pipeline under /usr/bin/python3 (Debian's OpenCV with GStreamer).

    .venv/bin/python bench/sidecar_overhead.py [--frames 300] [--python38 PATH] [--gst-python /usr/bin/python3]

--python38 defaults to the tests' JetPack stand-in (a pyenv 3.8 venv with numpy and onnxruntime under
/var/cache/edgedeploy-tests; `make test` makes it). Prints medians and p95 in ms and the overhead ratio.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def _p(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs), q))


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(xs), 4), "p95": round(_p(xs, 95), 4)}


def build_bundle(data: Path, out: Path, model: str) -> Path:
    """A batch-1 TensorRT bundle of `model` ("mobilenet": 1x3x224x224 in; "mnist": 1x1x28x28, the fixed cost)."""
    from edgedeploy.api import build_tensorrt
    from edgedeploy.compile.cards import ModelCard, Preprocess
    from edgedeploy.compile.int8.build import Int8Config
    from edgedeploy.compile.int8.quantize import QuantizeOptions
    from edgedeploy.compile.tensorrt_artifacts import TensorRTOptions

    if model == "mnist":
        card = ModelCard(name="mnist", labels=[str(i) for i in range(10)], preprocess=Preprocess(color="gray"))
        onnx, calibration = data / "models" / "mnist-8_opset13.onnx", data / "mnist"
    else:
        card, onnx, calibration = ModelCard(name="mobilenet"), data / "models" / "mobilenet_v1_0.25_224.onnx", None
    int8 = Int8Config(calibration=calibration or data / "imagenet-sample", options=QuantizeOptions(samples=16))
    return build_tensorrt(onnx, "t4", out, card, int8, TensorRTOptions(batch=(1, 1, 1))).bundle


def bench_inference(bundle: Path, python38: str, frames: int) -> dict[str, object]:
    from tests.agent.trt_double import OPTIONS_ENV, FakeTensorRT

    from edgedeploy_agent.config import AgentConfig
    from edgedeploy_agent.sidecar.tensorrt_client import SidecarTrtBackend
    from edgedeploy_agent.sidecar.worker import DOUBLE_ENV
    from edgedeploy_agent.store import DeviceStore

    os.environ.update({DOUBLE_ENV: "tests.agent.trt_double:sidecar_double", OPTIONS_ENV: '{"gpu": "T4"}'})
    os.environ["PYTHONPATH"] = str(REPO)
    store = DeviceStore(Path(tempfile.mkdtemp()) / "root")
    store.init(AgentConfig())
    m = store.stage(bundle)
    onnx = store.release_dir(m.release_name) / m.tensorrt.onnx  # type: ignore[union-attr]
    x = np.random.default_rng(0).standard_normal(m.inputs[0].shape).astype(np.float32)

    local = FakeTensorRT(version="8.5.2.2")
    local_engine = local.load(local.build(onnx, m.tensorrt, None, lambda s: None))  # type: ignore[arg-type]
    side = SidecarTrtBackend(python38).open()
    engine = side.load(side.build(onnx, m.tensorrt, None, lambda s: None))
    assert local_engine is not None and engine is not None
    walls, inside, here = [], [], []
    for i in range(frames + 20):
        t = time.perf_counter()
        engine.run([x])
        wall = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        local_engine.run([x])
        local_ms = (time.perf_counter() - t) * 1e3
        if i >= 20:  # warm-up
            walls.append(wall)
            inside.append(engine.engine_ms)
            here.append(local_ms)
    side.close()
    overhead = [w - e for w, e in zip(walls, inside, strict=False)]
    return {
        "sidecar_wall_ms": summary(walls),
        "engine_in_worker_ms": summary(inside),
        "overhead_ms": summary(overhead),
        "same_engine_in_process_ms": summary(here),
        "overhead_over_engine": round(statistics.median(overhead) / statistics.median(inside), 3),
        "input": m.inputs[0].shape,
        "worker_python": side.python,
    }


def bench_capture(gst_python: str, frames: int) -> dict[str, object]:
    from edgedeploy_agent.sidecar.capture_client import SidecarCapture
    from edgedeploy_agent.sources.frames import parse_source

    spec = parse_source("gst:videotestsrc ! video/x-raw,width=1280,height=720 ! appsink sync=false")
    capture = SidecarCapture(spec, gst_python)
    assert capture.open()
    walls, inside = [], []
    for i in range(frames + 10):
        t = time.perf_counter()
        image = capture.read()
        wall = (time.perf_counter() - t) * 1e3
        assert image is not None and image.shape == (720, 1280, 3)
        if i >= 10:
            walls.append(wall)
            inside.append(capture.read_ms)
    capture.release()
    overhead = [w - r for w, r in zip(walls, inside, strict=False)]
    return {
        "sidecar_wall_ms": summary(walls),
        "cv2_read_in_worker_ms": summary(inside),
        "overhead_ms": summary(overhead),
        "overhead_over_read": round(statistics.median(overhead) / statistics.median(inside), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument(
        "--data", type=Path, default=Path(os.environ.get("EDGEDEPLOY_DATA", REPO.parent / "shared" / "data"))
    )
    found = sorted(glob.glob("/var/cache/edgedeploy-tests/python38-*/bin/python"))
    ap.add_argument("--python38", default=found[-1] if found else None)
    ap.add_argument("--gst-python", default="/usr/bin/python3")
    args = ap.parse_args()
    if args.python38 is None:
        raise SystemExit("no Python 3.8 stand-in: run `make test` once, or pass --python38")
    out = Path(tempfile.mkdtemp())
    result = {
        "frames": args.frames,
        "load_average": os.getloadavg(),
        **{
            f"inference_{model}": bench_inference(
                build_bundle(args.data, out / f"{model}.edb", model), args.python38, args.frames
            )
            for model in ("mnist", "mobilenet")
        },
        "capture_1280x720": bench_capture(args.gst_python, args.frames),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
