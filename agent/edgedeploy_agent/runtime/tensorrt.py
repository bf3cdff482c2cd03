"""The TensorRT runtime: find or build the device's engine for a bundle's QDQ ONNX, accept it, run it.

At activation (the agent's load step, never on a camera frame): probe CUDA, compute the engine-cache
key, reuse a cached plan when the key matches and TensorRT deserializes it, otherwise build one under
the cache lock with progress and duration reported. A new or reused engine serves frames only after
its outputs on the bundle's reference samples agree with the exact INT8 reference (acceptance.py); an engine that
fails is marked bad in the cache and never loaded again.
"""

import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from ..bundle import Manifest, check_compatible
from ..errors import IncompatibleBundle, RuntimeLoadError
from ..sidecar.cuda_probe import CudaDevice, l4t_release, probe_cuda
from ..sidecar.trt_backend import Engine, TrtBackend
from .acceptance import compare, load_references, run_references
from .engine_cache import EngineCache, engine_key, engine_key_fields

Progress = Callable[[dict[str, Any]], None]


class EngineRejected(RuntimeLoadError):
    """The engine's outputs on the reference samples disagree with the exact INT8 reference."""

    code = "engine-rejected"


def _default_backend() -> TrtBackend:
    from ..sidecar.trt_backend import PolygraphyBackend

    return PolygraphyBackend()


class TensorRTRuntime:
    """A TensorRT engine for one release, found in or added to the device's engine cache."""

    name = "tensorrt"

    def __init__(
        self,
        release_dir: Path,
        manifest: Manifest,
        engine_root: Path,
        backend: Callable[[], TrtBackend] = _default_backend,
        probe: Callable[[], CudaDevice] = probe_cuda,
        system_root: Path = Path("/"),
        progress: Progress = lambda event: None,
        heartbeat_s: float = 5.0,
    ) -> None:
        settings = manifest.tensorrt
        if settings is None:
            raise IncompatibleBundle(
                f"bundle {manifest.model.name} names runtime tensorrt but has no tensorrt settings"
            )
        self._settings, self._heartbeat_s = settings, heartbeat_s
        self._progress_lock = threading.Lock()  # the heartbeat and TensorRT's builder thread both report

        def report(event: dict[str, Any]) -> None:
            with self._progress_lock:
                progress(event)

        self._progress = report
        device = probe()  # before anything touches TensorRT: without a driver it can segfault
        check_compatible(manifest, gpu=device.as_gpu())
        self._backend = backend()
        info: dict[str, Any] = {**device.as_dict(), "l4t": l4t_release(system_root)}
        onnx_art = next((a for a in manifest.artifacts if a.path == settings.onnx), None)
        if onnx_art is None:
            raise IncompatibleBundle(f"bundle {manifest.model.name} lists no artifact {settings.onnx}")
        self._onnx = release_dir / onnx_art.path
        self._fields = engine_key_fields(manifest, settings, onnx_art.sha256, self._backend.version, info)
        self.key = engine_key(self._fields)
        self._cache = EngineCache(engine_root)
        self.record: dict[str, Any] = {
            "engine_key": self.key,
            "tensorrt": self._backend.version,
            "tensorrt_python": self._backend.python,
            **info,
        }
        self._engine = self._find_or_build()
        refs = load_references(release_dir / settings.reference, manifest)
        batch = max(1, settings.profiles[0][0].min[0]) if settings.profiles else 1
        self._progress({"state": "accepting", "samples": refs.samples})
        verdict = compare(run_references(self._engine.run, refs, batch), refs, settings)
        self.record["acceptance"] = verdict
        if not verdict["passed"]:
            self._cache.mark_bad(self.key, verdict.get("reason", "failed"), verdict)
            raise EngineRejected(
                f"TensorRT engine {self.key[:12]} failed acceptance on {refs.samples} reference samples: "
                f"{verdict.get('reason')}",
                hint="the engine is marked bad in the cache; rebuild the bundle (e.g. other calibration or "
                "--keep-float layers) or deploy the TVM runtime",
            )

    def _find_or_build(self) -> Engine:
        engine = self._load_cached()
        if engine is not None:
            self.record["engine"] = "cached"
            return engine
        with self._cache.lock():
            engine = self._load_cached()  # another process may have built it while this one waited
            if engine is not None:
                self.record["engine"] = "cached"
                return engine
            bad = self._cache.is_bad(self.key)
            if bad is not None:
                raise EngineRejected(
                    f"TensorRT engine {self.key[:12]} was rejected before: {bad.get('reason')}",
                    hint=f"delete {self._cache.entry(self.key)} to build and check it again",
                )
            return self._build()

    def _load_cached(self) -> Optional[Engine]:
        plan = self._cache.lookup(self.key, self._fields)
        return self._backend.load(plan) if plan is not None else None

    def _build(self) -> Engine:
        version, gpu = self._backend.version, str(self._fields["gpu_name"])
        timing = self._cache.timing_cache_path(version, gpu)
        timing.parent.mkdir(parents=True, exist_ok=True)
        had_timing = timing.exists()
        started = time.monotonic()
        self._progress({"state": "building-engine", "elapsed_s": 0.0, "timing_cache": had_timing})
        done = threading.Event()

        def beat() -> None:
            while not done.wait(self._heartbeat_s):
                self._progress({"state": "building-engine", "elapsed_s": round(time.monotonic() - started, 1)})

        beater = threading.Thread(target=beat, name="engine-build-heartbeat", daemon=True)
        beater.start()
        try:
            plan = self._backend.build(
                self._onnx,
                self._settings,
                timing,
                lambda msg: self._progress(
                    {"state": "building-engine", "elapsed_s": round(time.monotonic() - started, 1), "phase": msg}
                ),
            )
        finally:
            done.set()
            beater.join()
        build_s = round(time.monotonic() - started, 3)
        engine = self._backend.load(plan)
        if engine is None:
            raise RuntimeLoadError(f"TensorRT {version} cannot deserialize the engine it just built")
        self._cache.store(self.key, self._fields, plan, {"build_s": build_s, "timing_cache_reused": had_timing})
        self.record.update(engine="built", build_s=build_s, timing_cache_reused=had_timing, plan_bytes=len(plan))
        self._progress({"state": "engine-built", "build_s": build_s})
        return engine

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return self._engine.run(inputs)

    def describe(self) -> dict[str, Any]:
        return {"runtime": "tensorrt", **self.record}

    def close(self) -> None:
        self._backend.close()
