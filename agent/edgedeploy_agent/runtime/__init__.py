"""Inference runtimes behind one small interface. Heavy backends are imported lazily."""

from pathlib import Path
from typing import Any, Optional, Protocol

import numpy as np

from ..bundle import Manifest
from ..errors import IncompatibleBundle


class Runtime(Protocol):
    """Loads one bundle release and runs it on numpy inputs."""

    name: str

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]: ...

    def describe(self) -> dict[str, Any]: ...


def load_runtime(release_dir: Path, manifest: Manifest, tvm_runtime_lib: Optional[str] = None) -> Runtime:
    """Open the runtime the bundle asks for."""
    if manifest.target.runtime == "tvm":
        from .tvm import TvmRuntime

        return TvmRuntime(release_dir, manifest, runtime_lib=tvm_runtime_lib)
    raise IncompatibleBundle(f"runtime {manifest.target.runtime!r} is not supported by this agent")
