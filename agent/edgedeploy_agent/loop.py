"""capture -> preprocess -> infer -> postprocess -> report, with per-stage timings."""

import datetime as _dt
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from .bundle import Manifest, Postprocess, load_labels
from .config import AgentConfig
from .errors import AgentError, FrameFailed, RuntimeLoadError, SourceUnavailable
from .heartbeat import Heartbeat
from .notify import Notifier
from .preprocess import preprocess
from .report import STAGES, PowerReport, Prediction, Report, latency_histogram, stage_latency
from .runtime import Runtime, load_runtime
from .service import write_health
from .sources.capture import CapturedSource, SourceState, fine_naps, open_source
from .sources.power import NoPowerSensor, PowerSensor, discover_power_sensor
from .sources.thermal import ThermalZones
from .spool import Spool
from .store import DeviceStore

if TYPE_CHECKING:
    from .metrics import PrometheusExporter

READ_TIMEOUT_S = 0.5


def top_k(output: np.ndarray, manifest: Manifest, labels: Sequence[str]) -> list[list[Any]]:
    """Classifier post-processing: [[class_index, label, score], ...] best first, ties by the lower class
    (what the GPU's postprocess function computes: compile/postprocess_kernel.py)."""
    scores = class_scores(output, manifest.postprocess)
    idx = np.argsort(-scores, kind="stable")[: manifest.postprocess.top_k]
    return labelled(idx, scores[idx], manifest, labels)


def class_scores(output: np.ndarray, post: Postprocess) -> np.ndarray:
    """The scores top_k ranks: one output row as float64, through a softmax where the card asks for one."""
    scores = output.reshape(-1).astype(np.float64)
    if post.softmax:
        e = np.exp(scores - scores.max())
        scores = e / e.sum()
    return scores


def labelled(classes: np.ndarray, scores: np.ndarray, manifest: Manifest, labels: Sequence[str]) -> list[list[Any]]:
    """[[class_index, label, score], ...] of the classes (output indices) and their scores, in that order, each score
    to 6 decimals. On Python numbers, the scores rounded as round(s * 1e6) / 1e6: a top 5 took 3.7 us against
    4.6-4.7 with round(s, 6) (correctly rounded through a decimal string; the two agreed on 200,000 random scores;
    timeit, min of 15 interleaved, three runs, the development machine); numpy's round is slower than either."""
    offset, known = manifest.postprocess.label_offset, len(labels)
    values = scores.tolist()
    try:
        rounded = [round(s * 1e6) / 1e6 for s in values]
    except (ValueError, OverflowError):  # a NaN or infinite score (outputs are checked in the health check only)
        rounded = [round(s, 6) for s in values]
    ids = [int(i) - offset for i in classes.tolist()]
    return [[li, labels[li] if 0 <= li < known else str(li), s] for li, s in zip(ids, rounded)]


def output_problem(outs: Sequence[np.ndarray], manifest: Manifest) -> Optional[str]:
    """Why these outputs break the manifest's promise (count, shapes, finite values), or None."""
    if len(outs) != len(manifest.outputs):
        return f"gave {len(outs)} outputs, manifest declares {len(manifest.outputs)}"
    for o, spec in zip(outs, manifest.outputs):
        if list(o.shape) != list(spec.shape):
            return f"output {spec.name} has shape {list(o.shape)}, expected {spec.shape}"
        if not np.all(np.isfinite(o)):
            return f"output {spec.name} is not finite"
    return None


def load_inputs(runtime: Runtime, x: np.ndarray) -> bool:
    """The CPU path's preprocessed input to the device, queued, where the runtime loads inputs apart from the model
    (a GPU's: TvmRuntime.load_inputs): the preprocess stage then ends with the input on the device, as the GPU path's
    does, and run_preprocessed runs the model. False where the caller runs `runtime.run([x])` (a CPU)."""
    if not getattr(runtime, "loads_inputs", False):
        return False
    runtime.load_inputs([x])  # type: ignore[attr-defined]
    return True


def run_preprocessed(
    runtime: Runtime, outputs: bool, frames: Optional[np.ndarray] = None
) -> tuple[Optional[np.ndarray], list[np.ndarray], Optional[float]]:
    """The model on the input load_inputs left on the device, or on `frames` (uint8, as captured) loaded and
    preprocessed on the device first, with the top k where the bundle computes it there: (that (N, 2, k) top k or
    None; the outputs: always without a device top k, with it only when `outputs`; the host's time when the GPU had
    finished the input's copy and preprocessing, the model already queued behind it, or None where the runtime
    cannot tell). That time ends the preprocess stage: the loads only queue, so the stage would otherwise end before
    the GPU's copy did, and the infer stage's wait would carry the rest of it. With the device's top k, `frames`
    go in one call (run_frames_top: one CUDA graph for the whole frame where the runtime can)."""
    ended: list[float] = []

    def preprocessed() -> None:
        ended.append(time.perf_counter())

    if getattr(runtime, "top_k_on_device", False):
        if frames is not None:
            run: Any = runtime.run_frames_top  # type: ignore[attr-defined]
            tops, outs = run(frames, outputs=outputs, preprocessed=preprocessed)
        else:
            tops, outs = runtime.run_loaded_top(outputs=outputs, preprocessed=preprocessed)  # type: ignore
    else:
        if frames is not None:
            runtime.load_frames(frames)  # type: ignore[attr-defined]
        tops, outs = None, runtime.run_loaded(preprocessed=preprocessed)  # type: ignore[attr-defined]
    return tops, outs, ended[0] if ended else None


def warm_up(runtime: Runtime, manifest: Manifest) -> float:
    """One inference on zeros; checks output shapes and finiteness. Returns milliseconds."""
    inputs = [np.zeros(s.shape, dtype=np.dtype(s.dtype)) for s in manifest.inputs]
    t = time.perf_counter()
    outs = runtime.run(inputs)
    ms = (time.perf_counter() - t) * 1000.0
    problem = output_problem(outs, manifest)
    if problem:
        raise RuntimeLoadError(f"warm-up {problem}")
    return ms


def frame_buffers(runtime: Runtime) -> dict[str, Any]:
    """How a capture fills frames for this runtime (open_source's `allocate_frame` and `send_frame`): a batch-1
    bundle that preprocesses on the GPU lends page-locked buffers it uploads without a host copy (frame_batch, each
    with a device buffer of its own: `ahead`), and each frame decoded into one is sent to the GPU from the capture
    thread at once (send_frames); {} for any other runtime."""
    if not getattr(runtime, "frames_on_device", False):
        return {}
    return {
        "allocate_frame": lambda height, width: runtime.frame_batch(height, width, ahead=True)[0],  # type: ignore
        "send_frame": runtime.send_frames,  # type: ignore[attr-defined]
    }


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
        notifier: Optional[Notifier] = None,
        thermal: Optional[ThermalZones] = None,
        metrics: Optional["PrometheusExporter"] = None,
        health_frames: int = 0,
        heartbeat: Optional[Heartbeat] = None,
    ) -> None:
        self.runtime, self.manifest, self.labels, self.cfg = runtime, manifest, labels, cfg
        self.spool, self.power, self.bundle_id = spool, power, bundle_id
        self.notifier = notifier or Notifier({})
        self.thermal, self.metrics = thermal, metrics
        # the first `health_frames` real frames are the health check: their outputs are checked too
        self.health_frames, self.heartbeat = health_frames, heartbeat
        self.stop_requested = False
        self._dropped_before = 0
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

    def _progress(self, frames: int, infer_ms: float, busy_s: float) -> None:
        self._count += frames
        self._infer_ms.append(infer_ms)
        self._busy_s += busy_s
        now = time.monotonic()
        if self._count <= max(self.health_frames, 1) or now - self._last_progress >= 0.5:
            self._last_progress = now
            self.on_progress(self.stats())

    def serve(self, sources: Sequence[CapturedSource], max_frames: Optional[int] = None) -> int:
        """Serve the agent's sources (this loop: one) until they end or a stop; returns reports written."""
        return self.run(sources[0], max_frames)

    def run(self, source: CapturedSource, max_frames: Optional[int] = None) -> int:
        """Process frames until the source ends, a stop is requested or max_frames; returns reports written."""
        frame_index, reports = 0, 0
        self._count = 0
        spin_s = self.cfg.frame_spin_ms / 1e3
        if spin_s > 0:
            fine_naps()  # this thread's naps while it spins for a frame: ~15 us, not 70
        while not self.stop_requested:
            window = ReportWindow()
            self.power.start_window()
            ended = False
            while not self.stop_requested and window.elapsed() < self.cfg.report_interval_s:
                if self._tick(frame_index, max_frames):
                    ended = True
                    break
                t_wait = time.perf_counter()
                frame = source.read(timeout=READ_TIMEOUT_S, spin_s=spin_s)
                t0 = time.perf_counter()
                if frame is None:
                    if source.ended:
                        ended = True
                        break
                    continue  # no frame yet (camera lost or slow): keep the watchdog fed and wait again
                age_ms = frame.age_ms
                top, (t1, t2, t3), gpu_ms = self._serve(frame.image, frame_index, source.uri)
                ms = ((t0 - t_wait) * 1e3, (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3)
                window.add(age_ms, *ms)
                if gpu_ms is not None:
                    window.model_gpu_ms.append(gpu_ms)
                window.latency_ms.append(frame.age_ms)  # captured -> its prediction
                self._progress(1, ms[2], sum(ms) / 1e3)
                if self.cfg.record_predictions:
                    window.predictions.append(Prediction(frame=frame_index, top=top))
                frame_index += 1
            state = source.state()
            if window.frames or not state.camera_up:
                dropped = state.dropped_frames - self._dropped_before
                self._dropped_before = state.dropped_frames
                self._emit(
                    self._report(window, source.uri, state, ended, dropped, self.power.end_window(window.frames))
                )
                reports += 1
            self.notifier.status(
                f"{'camera up' if state.camera_up else 'camera DOWN'}, {frame_index} frames, "
                f"{state.reconnects} reconnects, {reports} reports"
            )
            if ended:
                break
        return reports

    def _tick(self, served: int, max_frames: Optional[int]) -> bool:
        """Once per turn of the main loop: watchdog ping and heartbeat; True when max_frames were served."""
        self.notifier.ping()  # from the main loop: a hung loop is killed by the watchdog
        if self.heartbeat is not None:
            self.heartbeat.beat()
        return max_frames is not None and served >= max_frames

    def _serve(
        self, image: np.ndarray, index: int, uri: str
    ) -> tuple[list[list[Any]], tuple[float, float, float], Optional[float]]:
        """preprocess -> infer -> postprocess one frame; any failure is a FrameFailed naming the stage. Returns the
        top k, the host's times at the ends of the first three stages (where a GPU runtime loads the input apart from
        the model, the preprocess stage ends when the GPU's copy and preprocessing did: run_preprocessed), and the
        model's own GPU time where the runtime measured it for this frame (`model_gpu_ms`: CUDA events on a sample of
        the frames a GPU runtime loaded)."""
        stage = "preprocessing"
        try:
            on_device = getattr(self.runtime, "frames_on_device", False)  # the bundle preprocesses on the GPU
            loaded = on_device
            if not on_device:  # into a GPU runtime's page-locked input where it has one: no host copy before the upload
                out = getattr(self.runtime, "input_array", None)
                x = preprocess(image, self.manifest.preprocess, self.manifest.inputs[0], out=out)
                loaded = load_inputs(self.runtime, x)
            t1 = time.perf_counter()
            # on the device the frame's load, preprocessing and model are one call (one graph): its failure is either
            stage = "preprocessing and inference on the GPU" if on_device else "inference"
            checked = self._count < self.health_frames
            best = None  # the top k the device computed: (2, k) scores and classes
            if loaded:  # with the device's top k, only that comes back
                tops, outs, preprocessed = run_preprocessed(
                    self.runtime, outputs=checked, frames=image if on_device else None
                )
                best = tops[0] if tops is not None else None
                t1 = preprocessed if preprocessed is not None else t1
            else:
                outs = self.runtime.run([x])
            t2 = time.perf_counter()
            gpu_ms = getattr(self.runtime, "model_gpu_ms", None) if loaded else None
            problem = output_problem(outs, self.manifest) if checked else None
            if problem:
                raise FrameFailed(f"frame {index} from {uri}: {problem}")
            stage = "postprocessing"
            top = (
                top_k(outs[0], self.manifest, self.labels)
                if best is None
                else labelled(best[1], best[0], self.manifest, self.labels)
            )
            return top, (t1, t2, time.perf_counter()), gpu_ms
        except AgentError:
            raise
        except Exception as e:  # a runtime fails in its FFI with any error type
            raise FrameFailed(f"frame {index} from {uri}: {stage} failed: {type(e).__name__}: {e}") from e

    def _emit(self, report: Report) -> None:
        self.spool.write(report)
        if self.metrics is not None:
            self.metrics.update(report)

    def _report(
        self,
        w: "ReportWindow",
        uri: str,
        state: SourceState,
        final: bool,
        dropped: int,
        power: PowerReport,
        fps: Optional[float] = None,
        **extra: Any,
    ) -> Report:
        """One source's window; fps defaults to frames per second of busy time (the window's stages)."""
        end = _dt.datetime.now(_dt.timezone.utc)
        if fps is None:
            busy_s = sum(sum(v) for v in w.stages.values()) / 1e3
            fps = round(w.frames / busy_s, 3) if busy_s > 0 else 0.0
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
            fps=fps,
            latency_ms={s: stage_latency(v) for s, v in w.stages.items()} if w.frames else {},
            predictions=w.predictions,
            power=power,
            final=final,
            camera_up=state.camera_up,
            reconnects=state.reconnects,
            dropped_frames=dropped,
            frame_age_ms=stage_latency(w.ages) if w.ages else None,
            temperatures_c=(self.thermal.read() or None) if self.thermal else None,
            spool_dropped=self.spool.dropped,
            latency_hist={s: latency_histogram(v) for s, v in w.stages.items()} if w.frames else None,
            frame_latency_ms=stage_latency(w.latency_ms) if w.latency_ms else None,
            model_gpu_ms=stage_latency(w.model_gpu_ms) if w.model_gpu_ms else None,
            **extra,
        )


class ReportWindow:
    """One report's worth of a source's frames: per-stage samples, frame ages, predictions."""

    def __init__(self, stages: Sequence[str] = STAGES) -> None:
        self.start = _dt.datetime.now(_dt.timezone.utc)
        self._t0 = time.monotonic()
        self.stages: dict[str, list[float]] = {s: [] for s in stages}
        self.ages: list[float] = []
        self.latency_ms: list[float] = []  # each frame's capture -> prediction
        self.model_gpu_ms: list[float] = []  # the runtime's model clock, on the frames it sampled
        self.predictions: list[Prediction] = []
        self.frames = 0

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def add(self, age_ms: float, *ms: float) -> None:
        self.ages.append(age_ms)
        for s, v in zip(self.stages, ms):
            self.stages[s].append(v)
        self.frames += 1


def run_agent(
    store: DeviceStore,
    max_frames: Optional[int] = None,
    sys_root: Path = Path("/"),
    tensorrt_options: Optional[dict[str, Any]] = None,
) -> int:
    """The agent's main: load the current release (building its engine), warm up, serve frames.

    A TensorRT engine is built and accepted here, at activation, so `health.json` says `building-engine`
    (with elapsed seconds and build phases) until the engine passed its acceptance check. With a source,
    `health.json` says `checking-frames` until the first `health_frames` real frames went through
    preprocessing, inference (outputs of the declared shapes, finite) and postprocessing, then `ready`;
    a frame that fails is `failed` with `frame-failed`. Without a source, `ready` follows the warm-up.
    """
    cfg = store.config()
    notifier = Notifier()
    release = store.current()
    if release is None:
        write_health(store, None, "failed", error={"code": "no-bundle", "message": "no active bundle"})
        return 2
    write_health(store, release, "loading")
    notifier.status(f"loading {release}")
    power: PowerSensor = NoPowerSensor()
    sources: list[CapturedSource] = []
    runtime: Optional[Runtime] = None
    try:
        manifest = store.load_release(release)
        rdir = store.release_dir(release)
        runtime = load_runtime(
            rdir,
            manifest,
            cfg.tvm_runtime_lib,
            engine_root=store.root / "engines",
            progress=lambda event: write_health(store, release, **event),
            tensorrt_options=tensorrt_options,
            cuda_backend=cfg.cuda_backend,
            cuda_backend_lib=cfg.cuda_backend_lib,
            system_python=cfg.system_python,
            sidecar_timeout_s=cfg.sidecar_timeout_s,
        )
        warm_ms = warm_up(runtime, manifest)
        labels = load_labels(rdir, manifest)
        metrics = None
        if cfg.metrics_port is not None:
            from .metrics import PrometheusExporter

            metrics = PrometheusExporter(cfg.metrics_port)
        power = discover_power_sensor(sys_root, interval_s=cfg.power_interval_s)
        if cfg.idle_baseline_s > 0:
            power.measure_idle(cfg.idle_baseline_s, time.sleep)  # before capture starts: nothing else runs
        # several sources, or a bundle compiled for a batch: frames of the sources share its calls (batcher.py)
        batched = len(cfg.source_uris) > 1 or manifest.inputs[0].shape[0] > 1
        lent = frame_buffers(runtime) if not batched else {}
        for uri in cfg.source_uris:
            sources.append(
                open_source(uri, system_python=cfg.system_python, sidecar_timeout_s=cfg.sidecar_timeout_s, **lent)
            )
    except AgentError as e:
        for opened in sources:
            opened.close()
        power.close()
        if runtime is not None:
            runtime.close()
        print(f"edgedeploy-agent: cannot serve {release} [{e.code}]: {e.message}", file=sys.stderr, flush=True)
        write_health(store, release, "failed", error=e.to_dict())
        return e.exit_code
    except Exception as e:  # a broken library can fail in the FFI with any error type
        for opened in sources:
            opened.close()
        power.close()
        if runtime is not None:
            runtime.close()
        print(f"edgedeploy-agent: cannot serve {release}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        write_health(store, release, "failed", error={"code": "load-failed", "message": f"{type(e).__name__}: {e}"})
        return 1
    heartbeat = Heartbeat(store.run_dir)
    from .batcher import MultiSourceLoop  # (it imports this module)

    loop = (MultiSourceLoop if batched else InferenceLoop)(
        runtime,
        manifest,
        labels,
        cfg,
        Spool(store, cfg.spool_max_bytes),
        power,
        manifest.bundle_id,
        notifier=notifier,
        thermal=ThermalZones(sys_root / "sys"),
        metrics=metrics,
        health_frames=cfg.health_frames,
        heartbeat=heartbeat,
    )

    def _stop(signum: int, frame: object) -> None:
        loop.stop_requested = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    named = ", ".join(cfg.source_uris) or None
    ready: dict[str, Any] = {
        "warmup_ms": round(warm_ms, 3),
        "runtime": runtime.describe(),
        "source": named,
        "capture": sources[0].where if sources else None,
    }
    needed = cfg.health_frames if sources else 0

    def progress(stats: dict[str, Any]) -> None:
        state = "ready" if stats["inferences"] >= needed else "checking-frames"
        write_health(store, release, state, **ready, **stats, health_frames=needed)

    loop.on_progress = progress
    heartbeat.beat()  # before the first state a reader checks it against
    progress(loop.stats())
    # READY=1 means loaded and warmed up: systemd must not give up on a device whose camera is unplugged
    notifier.ready(f"serving {release} on {named or 'no source'}")
    # one line per start and end for the service's log (journald under systemd, logs/agent.log otherwise)
    print(
        f"edgedeploy-agent: serving {release} on {named or 'no source'} (warm-up {warm_ms:.0f} ms)",
        file=sys.stderr,
        flush=True,
    )
    try:
        if not sources:
            while not loop.stop_requested:  # nothing to watch: stay loaded, healthy and pinging until stopped
                notifier.ping()
                heartbeat.beat()
                time.sleep(0.2)
            return 0
        reports = loop.serve(sources, max_frames=max_frames)
        if loop.stats()["inferences"] == 0 and not loop.stop_requested and max_frames != 0:
            raise SourceUnavailable(f"source {named} ended without delivering a frame")
    except AgentError as e:
        print(f"edgedeploy-agent: {e.message}", file=sys.stderr, flush=True)  # into logs/agent.log
        write_health(store, release, "failed", error=e.to_dict(), **ready, **loop.stats())
        return e.exit_code
    finally:
        notifier.stopping()
        for opened in sources:
            opened.close()
        power.close()
        runtime.close()
        if metrics is not None:
            metrics.close()
    end_state = "finished" if not loop.stop_requested else "stopped"
    print(
        f"edgedeploy-agent: {end_state} {release} after {loop.stats()['inferences']} inferences",
        file=sys.stderr,
        flush=True,
    )
    write_health(store, release, end_state, reports=reports, **ready, **loop.stats())
    return 0
