"""Test doubles for the agent: real classes behind its protocols, scripted, and a fake CUDA driver library."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from edgedeploy_agent.bundle import Manifest, TensorSpec, read_manifest
from edgedeploy_agent.service import write_health
from edgedeploy_agent.store import LEGACY_RUN_FILES, DeviceStore
from tests.agent.bundles import make_bundle
from tests.helpers import require

FAKE_LIBCUDA = Path(__file__).resolve().parents[1] / "fixtures" / "fake_libcuda.c"


class ScriptedService:
    """Acts like the agent process: on restart it 'loads' whatever `current` points at."""

    def __init__(self, store: DeviceStore, bad: set[str] | None = None) -> None:
        self.store, self.bad, self.running, self.restarts = store, bad or set(), False, 0

    def restart(self) -> None:
        self.restarts += 1
        name = self.store.current()
        self.running = name is not None and name not in self.bad
        state = "failed" if name in self.bad else "ready"
        write_health(self.store, name, state, error={"message": "library does not load"})

    def stop(self) -> None:
        self.running = False

    def is_running(self) -> bool:
        return self.running


def lay_out_as_before_slots(root: Path) -> None:
    """Move a root's default model slot to where the agent kept everything before model slots (releases/,
    current, state.json and run/'s files at the top), as a device from then has it."""
    slot = root / "models" / "default"
    os.rename(slot / "releases", root / "releases")
    if (slot / "current").is_symlink():
        os.symlink(os.readlink(slot / "current"), root / "current")
    os.rename(slot / "state.json", root / "state.json")
    for name in LEGACY_RUN_FILES:
        if (slot / "run" / name).exists():
            os.rename(slot / "run" / name, root / "run" / name)
    shutil.rmtree(root / "models")


def fake_libcuda(tmp: Path, driver: int, sm: int, name: str, integrated: bool = False) -> str:
    """Build tests/fixtures/fake_libcuda.c answering one GPU (what a GPU-less machine cannot provide for real);
    the library's path, named libcuda.so.1 in a folder of its own (for LD_LIBRARY_PATH). `integrated`: a GPU that
    shares the host's memory (a Jetson's)."""
    require("GCC", "needs gcc to build the fake driver" if shutil.which("gcc") is None else None)
    out = tmp / f"libcuda-{driver}-{sm}{'-integrated' if integrated else ''}"
    out.mkdir(exist_ok=True)
    lib = out / "libcuda.so.1"
    defines = [f"-DDRIVER={driver}", f"-DMAJOR={sm // 10}", f"-DMINOR={sm % 10}", f'-DNAME="{name}"']
    defines.append(f"-DINTEGRATED={int(integrated)}")
    subprocess.run(["gcc", "-shared", "-fPIC", *defines, "-o", str(lib), str(FAKE_LIBCUDA)], check=True)
    return str(lib)


class RowMeans:
    """Output row i: class 0 scores the mean pixel of input row i; it keeps every call's row means."""

    name = "row-means"

    def __init__(self) -> None:
        self.calls: list[list[float]] = []

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        means = [float(x[i].mean()) for i in range(x.shape[0])]
        self.calls.append(means)
        out = np.zeros((x.shape[0], 10), dtype=np.float32)
        out[:, 0] = means
        return [out]

    def describe(self) -> dict[str, Any]:
        return {"runtime": self.name}


def batched_manifest(tmp_path: Path, batch: int) -> Manifest:
    """A bundle's manifest with a gray 8x8 input and 10 outputs, both of this batch."""
    inputs = [TensorSpec(name="x", shape=[batch, 1, 8, 8], layout="NCHW")]
    return read_manifest(make_bundle(tmp_path / "b", inputs=inputs, outputs=[TensorSpec(name="y", shape=[batch, 10])]))


class PacedCapture:
    """A Capture whose frames come `delay_s` apart (a decoder or camera slower than the consumer), then end."""

    def __init__(self, frames: int, delay_s: float) -> None:
        self.left, self.delay_s, self.image = frames, delay_s, np.zeros((8, 8, 3), np.uint8)

    def open(self) -> bool:
        return True

    def read(self, out: object = None) -> object:
        if self.left == 0:
            return None
        time.sleep(self.delay_s)
        self.left -= 1
        return self.image.copy()

    def release(self) -> None:
        pass
