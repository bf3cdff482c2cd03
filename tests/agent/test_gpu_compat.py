"""The agent's CUDA compatibility check against a fake driver library: a small C libcuda that reports a
chosen driver version and GPU (the one thing a GPU-less machine cannot provide for real)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from edgedeploy_agent.bundle import Target, check_compatible, read_manifest
from edgedeploy_agent.errors import IncompatibleBundle
from edgedeploy_agent.gpu import probe_cuda
from tests.agent.bundles import make_bundle
from tests.helpers import require

FAKE = r"""
#include <string.h>
int cuInit(unsigned f) { return 0; }
int cuDriverGetVersion(int *v) { *v = DRIVER; return 0; }
int cuDeviceGetCount(int *n) { *n = 1; return 0; }
int cuDeviceGet(int *d, int i) { *d = 0; return 0; }
int cuDeviceGetAttribute(int *v, int attr, int d) { *v = attr == 75 ? MAJOR : MINOR; return 0; }
int cuDeviceGetName(char *name, int len, int d) { strncpy(name, NAME, len); return 0; }
"""


def fake_libcuda(tmp: Path, driver: int, sm: int, name: str) -> str:
    require("GCC", "needs gcc to build the fake driver" if shutil.which("gcc") is None else None)
    src, lib = tmp / "fake.c", tmp / f"libcuda-{driver}-{sm}.so"
    src.write_text(FAKE)
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            f"-DDRIVER={driver}",
            f"-DMAJOR={sm // 10}",
            f"-DMINOR={sm % 10}",
            f'-DNAME="{name}"',
            "-o",
            str(lib),
            str(src),
        ],
        check=True,
    )
    return str(lib)


def gpu_manifest(tmp: Path, sm: int, min_driver: str):
    m = read_manifest(make_bundle(tmp / f"b{sm}"))
    target = Target(arch="x86_64", device="cuda", cuda_sm=sm, min_cuda_driver=min_driver, runtime_abi="tvm-ffi-0.1")
    return m.model_copy(update={"target": target})


def test_probe_reads_the_driver(tmp_path: Path) -> None:
    gpu, reason = probe_cuda(fake_libcuda(tmp_path, 11040, 72, "Xavier"))
    assert gpu is not None and reason == ""
    assert (gpu.driver_api, gpu.sm, gpu.name) == ("11.4", 72, "Xavier")
    assert probe_cuda(str(tmp_path / "absent.so")) == (None, "no CUDA driver (libcuda.so.1 not found)")


def test_refusals_say_why(tmp_path: Path) -> None:
    xavier_jp5, _ = probe_cuda(fake_libcuda(tmp_path, 11040, 72, "Xavier"))
    xavier_compat, _ = probe_cuda(fake_libcuda(tmp_path, 12020, 72, "Xavier"))
    t4, _ = probe_cuda(fake_libcuda(tmp_path, 13000, 75, "Tesla T4"))
    with pytest.raises(IncompatibleBundle, match="sm_90 code, this device's Tesla T4 is sm_75"):
        check_compatible(gpu_manifest(tmp_path, 90, "13.0"), machine="x86_64", gpu=t4)
    with pytest.raises(IncompatibleBundle, match="needs CUDA driver API 12.0\\+, this device's driver offers 11.4"):
        check_compatible(gpu_manifest(tmp_path, 72, "12.0"), machine="x86_64", gpu=xavier_jp5)
    check_compatible(gpu_manifest(tmp_path, 72, "12.0"), machine="x86_64", gpu=xavier_compat)
    check_compatible(gpu_manifest(tmp_path, 75, "13.0"), machine="x86_64", gpu=t4)
    with pytest.raises(IncompatibleBundle, match="needs a CUDA GPU .*no CUDA driver"):
        check_compatible(
            gpu_manifest(tmp_path, 75, "13.0"),
            machine="x86_64",
            gpu=None,
            gpu_reason="no CUDA driver (libcuda.so.1 not found)",
        )
