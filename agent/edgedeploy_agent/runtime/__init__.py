"""Inference runtimes behind one small interface. Heavy backends are imported lazily."""

import importlib.util
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

import numpy as np

from ..bundle import Manifest
from ..errors import IncompatibleBundle, RuntimeLoadError


class Runtime(Protocol):
    """Loads one bundle release and runs it on numpy inputs."""

    name: str

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]: ...

    def describe(self) -> dict[str, Any]: ...

    def close(self) -> None:
        """Free what outlives a call (TensorRT's sidecar worker); the runtime is not used after."""


class FallbackRuntime:
    """The TVM runtime serving a bundle whose TensorRT engine could not be used, with the reason."""

    def __init__(self, inner: Runtime, reason: RuntimeLoadError) -> None:
        self._inner, self.name = inner, inner.name
        self.reason = {"code": reason.code, "message": reason.message}

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return self._inner.run(inputs)

    def describe(self) -> dict[str, Any]:
        return {**self._inner.describe(), "fallback_from": "tensorrt", "fallback_reason": self.reason}

    def close(self) -> None:
        self._inner.close()


def load_runtime(
    release_dir: Path,
    manifest: Manifest,
    tvm_runtime_lib: Optional[str] = None,
    engine_root: Optional[Path] = None,
    progress: Callable[[dict[str, Any]], None] = lambda event: None,
    tensorrt_options: Optional[dict[str, Any]] = None,
    cuda_backend: str = "auto",
    cuda_backend_lib: Optional[str] = None,
    system_python: Optional[str] = None,
    sidecar_timeout_s: float = 10.0,
) -> Runtime:
    """Open the runtime the bundle asks for; a TensorRT bundle that also carries TVM falls back to it.

    TensorRT runs in this process when its Python can import `tensorrt`, else in a sidecar worker under
    `system_python` (JetPack's Python 3.8, whose TensorRT bindings this Python cannot import)."""
    if manifest.target.runtime == "tvm":
        from .tvm import TvmRuntime

        return TvmRuntime(release_dir, manifest, tvm_runtime_lib, cuda_backend, cuda_backend_lib)
    if manifest.target.runtime == "tensorrt":
        from .tensorrt import TensorRTRuntime

        root = engine_root or release_dir.parent.parent / "engines"
        options = dict(tensorrt_options or {})
        sidecar = None
        if system_python and "backend" not in options and importlib.util.find_spec("tensorrt") is None:
            from ..sidecar.tensorrt_client import SidecarTrtBackend

            sidecar = SidecarTrtBackend(system_python, sidecar_timeout_s)
            options.update(backend=sidecar.open, probe=sidecar.probe)
        try:
            return TensorRTRuntime(release_dir, manifest, root, progress=progress, **options)
        except BaseException as e:  # whatever stopped it (a bad reference file too): its worker goes with it
            if sidecar is not None:
                sidecar.close()
            if not isinstance(e, RuntimeLoadError) or not any(a.role == "tvm-library" for a in manifest.artifacts):
                raise
            progress({"state": "fallback", "to": "tvm", "reason": e.message})
            from .tvm import TvmRuntime

            return FallbackRuntime(
                TvmRuntime(release_dir, manifest, tvm_runtime_lib, cuda_backend, cuda_backend_lib), e
            )
    raise IncompatibleBundle(f"runtime {manifest.target.runtime!r} is not supported by this agent")
