"""capture -> preprocess -> infer -> postprocess -> report, with per-stage timings."""

import datetime as _dt
import json
import os
import signal
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .bundle import Manifest, load_labels
from .config import AgentConfig
from .errors import AgentError, RuntimeLoadError
from .preprocess import preprocess
from .report import STAGES, Prediction, Report, stage_latency
from .runtime import Runtime, load_runtime
from .service import write_health
from .sources.frames import FrameSource, open_source, timed_read
from .sources.power import PowerSensor, discover_power_sensor
from .store import DeviceStore, write_json_atomic


def top_k(output: np.ndarray, manifest: Manifest, labels: Sequence[str]) -> list[list[Any]]:
    """Classifier post-processing: [[class_index, label, score], ...] best first."""
    pp = manifest.postprocess
    scores = output.reshape(-1).astype(np.float64)
    if pp.softmax:
        e = np.exp(scores - scores.max())
        scores = e / e.sum()
    k = min(pp.top_k, scores.size)
    idx = np.argpartition(-scores, k - 1)[:k]
    idx = idx[np.argsort(-scores[idx], kind="stable")]
    out = []
    for i in idx:
        li = int(i) - pp.label_offset
        label = labels[li] if 0 <= li < len(labels) else str(li)
        out.append([li, label, round(float(scores[i]), 6)])
    return out


class Spool:
    """Reports as JSON-lines files, each written to a temp name and renamed when complete."""

    def __init__(self, store: DeviceStore) -> None:
        self.dir = store.spool
        self._seq_path = store.run_dir / "report_seq"
        try:
            self.seq = int(self._seq_path.read_text())
        except (FileNotFoundError, ValueError):
            self.seq = 0

    def next_seq(self) -> int:
        self.seq += 1
        self._seq_path.write_text(str(self.seq))
        return self.seq

    def write(self, report: Report) -> Path:
        stamp = report.window_end.strftime("%Y%m%dT%H%M%S")
        path = self.dir / f"{stamp}-{report.seq:08d}.jsonl"
        tmp = self.dir / f".{path.name}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(report.model_dump_json() + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return path


def warm_up(runtime: Runtime, manifest: Manifest) -> float:
    """One inference on zeros; checks output shapes and finiteness. Returns milliseconds."""
    inputs = [np.zeros(s.shape, dtype=np.dtype(s.dtype)) for s in manifest.inputs]
    t = time.perf_counter()
    outs = runtime.run(inputs)
    ms = (time.perf_counter() - t) * 1000.0
    if len(outs) != len(manifest.outputs):
        raise RuntimeLoadError(f"warm-up gave {len(outs)} outputs, manifest declares {len(manifest.outputs)}")
    for o, spec in zip(outs, manifest.outputs):
        if list(o.shape) != list(spec.shape):
            raise RuntimeLoadError(f"warm-up output {spec.name} has shape {list(o.shape)}, expected {spec.shape}")
        if not np.all(np.isfinite(o)):
            raise RuntimeLoadError(f"warm-up output {spec.name} is not finite")
    return ms


class InferenceLoop:
    def __init__(
        self,
        runtime: Runtime,
        manifest: Manifest,
        labels: Sequence[str],
        cfg: AgentConfig,
        spool: Spool,
        power: PowerSensor,
        bundle_id: str,
    ) -> None:
        self.runtime, self.manifest, self.labels, self.cfg = runtime, manifest, labels, cfg
        self.spool, self.power, self.bundle_id = spool, power, bundle_id
        self.stop_requested = False
        # the health check reads these through run/health.json (see progress())
        self.on_progress: Callable[[dict[str, Any]], None] = lambda stats: None
        self._infer_ms: deque[float] = deque(maxlen=1000)
        self._busy_s = 0.0
        self._last_progress = 0.0
        self._count = 0

    def stats(self) -> dict[str, Any]:
        """Inferences so far, p95 of the recent inference latencies, FPS over busy time."""
        n = len(self._infer_ms)
        p95 = float(np.percentile(np.array(self._infer_ms), 95)) if n else None
        return {
            "inferences": self._count,
            "infer_p95_ms": None if p95 is None else round(p95, 3),
            "fps": round(self._count / self._busy_s, 3) if self._busy_s > 0 else None,
        }

    def _progress(self, ms: tuple[float, ...]) -> None:
        self._count += 1
        self._infer_ms.append(ms[2])
        self._busy_s += sum(ms) / 1e3
        now = time.monotonic()
        if self._count == 1 or now - self._last_progress >= 0.5:
            self._last_progress = now
            self.on_progress(self.stats())

    def run(self, source: FrameSource, max_frames: Optional[int] = None) -> int:
        """Process frames until the source ends, a stop is requested or max_frames; returns reports written."""
        spec = self.manifest.inputs[0]
        frame_index, reports = 0, 0
        self._count = 0
        while not self.stop_requested:
            window = _Window()
            self.power.start_window()
            ended = False
            while not self.stop_requested and window.elapsed() < self.cfg.report_interval_s:
                if max_frames is not None and frame_index >= max_frames:
                    ended = True
                    break
                frame, cap_ms = timed_read(source)
                if frame is None:
                    ended = True
                    break
                t0 = time.perf_counter()
                x = preprocess(frame, self.manifest.preprocess, spec)
                t1 = time.perf_counter()
                outs = self.runtime.run([x])
                t2 = time.perf_counter()
                top = top_k(outs[0], self.manifest, self.labels)
                t3 = time.perf_counter()
                ms = (cap_ms, (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3)
                window.add(*ms)
                self._progress(ms)
                if self.cfg.record_predictions:
                    window.predictions.append(Prediction(frame=frame_index, top=top))
                frame_index += 1
            if window.frames:
                self.spool.write(self._report(window, source.uri, final=ended))
                reports += 1
            if ended:
                break
        return reports

    def _report(self, w: "_Window", uri: str, final: bool) -> Report:
        end = _dt.datetime.now(_dt.timezone.utc)
        busy_s = sum(sum(w.stages[s]) for s in STAGES) / 1e3
        return Report(
            device=self.cfg.device_name or socket.gethostname(),
            seq=self.spool.next_seq(),
            bundle_id=self.bundle_id,
            model=self.manifest.model.name,
            model_version=self.manifest.model.version,
            runtime=self.runtime.name,
            source=uri,
            window_start=w.start,
            window_end=end,
            frames=w.frames,
            fps=round(w.frames / busy_s, 3) if busy_s > 0 else 0.0,
            latency_ms={s: stage_latency(w.stages[s]) for s in STAGES},
            predictions=w.predictions,
            power=self.power.end_window(w.frames),
            final=final,
        )


class _Window:
    def __init__(self) -> None:
        self.start = _dt.datetime.now(_dt.timezone.utc)
        self._t0 = time.monotonic()
        self.stages: dict[str, list[float]] = {s: [] for s in STAGES}
        self.predictions: list[Prediction] = []
        self.frames = 0

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def add(self, *ms: float) -> None:
        for s, v in zip(STAGES, ms):
            self.stages[s].append(v)
        self.frames += 1


def run_agent(store: DeviceStore, max_frames: Optional[int] = None) -> int:
    """The agent's main: load the current release, warm up, report ready, then serve frames."""
    cfg = store.config()
    release = store.current()
    if release is None:
        write_health(store, None, "failed", error={"code": "no-bundle", "message": "no active bundle"})
        return 2
    write_health(store, release, "loading")
    try:
        manifest = store.load_release(release)
        rdir = store.release_dir(release)
        runtime = load_runtime(rdir, manifest, cfg.tvm_runtime_lib)
        warm_ms = warm_up(runtime, manifest)
        labels = load_labels(rdir, manifest)
        source = open_source(cfg.source) if cfg.source else None
    except AgentError as e:
        write_health(store, release, "failed", error=e.to_dict())
        return e.exit_code
    except Exception as e:  # a broken library can fail in the FFI with any error type
        write_health(store, release, "failed", error={"code": "load-failed", "message": f"{type(e).__name__}: {e}"})
        return 1
    loop = InferenceLoop(runtime, manifest, labels, cfg, Spool(store), discover_power_sensor(), manifest.bundle_id)

    def _stop(signum: int, frame: object) -> None:
        loop.stop_requested = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    ready = {"warmup_ms": round(warm_ms, 3), "runtime": runtime.describe(), "source": cfg.source}
    loop.on_progress = lambda stats: write_health(store, release, "ready", **ready, **stats)
    write_health(store, release, "ready", **ready, inferences=0)
    if source is None:
        while not loop.stop_requested:  # nothing to watch: stay loaded and healthy until stopped
            time.sleep(0.2)
        return 0
    try:
        reports = loop.run(source, max_frames=max_frames)
    finally:
        source.close()
    end_state = "finished" if not loop.stop_requested else "stopped"
    write_health(store, release, end_state, reports=reports, **ready, **loop.stats())
    return 0


def pending_reports(store: DeviceStore) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for p in sorted(store.spool.glob("*.jsonl")):
        for line in p.read_text(encoding="utf-8").splitlines():
            if line.strip():
                out.append((p.name, json.loads(line)))
    return out


def ack_reports(store: DeviceStore, names: Sequence[str]) -> int:
    moved = 0
    for name in names:
        src = store.spool / Path(name).name
        if src.is_file():
            os.replace(src, store.spool / "sent" / src.name)
            moved += 1
    write_json_atomic(store.run_dir / "last_ack.json", {"count": moved})
    return moved
