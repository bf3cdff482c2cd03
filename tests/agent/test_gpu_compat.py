"""The agent's CUDA compatibility check against a fake driver library: a small C libcuda that reports a
chosen driver version and GPU (the one thing a GPU-less machine cannot provide for real)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgedeploy_agent.bundle import Target, check_compatible, read_manifest
from edgedeploy_agent.errors import IncompatibleBundle
from edgedeploy_agent.gpu import probe_cuda
from tests.agent.bundles import make_bundle
from tests.agent.doubles import fake_libcuda


def gpu_manifest(tmp: Path, sm: int, min_driver: str):
    m = read_manifest(make_bundle(tmp / f"b{sm}"))
    target = Target(arch="x86_64", device="cuda", cuda_sm=sm, min_cuda_driver=min_driver, runtime_abi="tvm-ffi-0.1")
    return m.model_copy(update={"target": target})


def test_probe_reads_the_driver(tmp_path: Path) -> None:
    gpu, reason = probe_cuda(fake_libcuda(tmp_path, 11040, 72, "Xavier", integrated=True))
    assert gpu is not None and reason == ""
    assert (gpu.driver_api, gpu.sm, gpu.name, gpu.integrated) == ("11.4", 72, "Xavier", True)
    t4, _ = probe_cuda(fake_libcuda(tmp_path, 13000, 75, "Tesla T4"))
    assert t4 is not None and not t4.integrated  # a discrete GPU: frames are copied, not read in place
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


def test_ptx_runs_on_newer_gpus_sass_only_on_its_own_major(tmp_path: Path) -> None:
    """A twin's device code is compute_72 PTX: the driver JIT-compiles it for any SM >= 72, so an H200 (sm_90)
    takes it; the same SM as SASS (a real Xavier bundle) stays refused there."""
    h200, _ = probe_cuda(fake_libcuda(tmp_path, 13000, 90, "NVIDIA H200"))
    t4, _ = probe_cuda(fake_libcuda(tmp_path, 12020, 75, "Tesla T4"))
    m = gpu_manifest(tmp_path, 72, "11.8")
    twin = m.model_copy(
        update={"target": m.target.model_copy(update={"device_code": ["compute_72 ptx (module, 1 B)"]})}
    )
    sass = m.model_copy(update={"target": m.target.model_copy(update={"device_code": ["sm_72 sass (cubin, 1 B)"]})})
    assert twin.target.ptx_only() and not sass.target.ptx_only() and not m.target.ptx_only()
    check_compatible(twin, machine="x86_64", gpu=h200)
    check_compatible(twin, machine="x86_64", gpu=t4)
    with pytest.raises(IncompatibleBundle, match="sm_72 code, this device's NVIDIA H200 is sm_90"):
        check_compatible(sass, machine="x86_64", gpu=h200)
    newer = twin.model_copy(update={"target": twin.target.model_copy(update={"cuda_sm": 90})})
    with pytest.raises(IncompatibleBundle, match="compute_90 PTX, this device's Tesla T4 is sm_75"):
        check_compatible(newer, machine="x86_64", gpu=t4)


def test_driver_refusal_names_the_floor_and_its_reason(tmp_path: Path) -> None:
    xavier_jp5, _ = probe_cuda(fake_libcuda(tmp_path, 11040, 72, "Xavier"))
    m = gpu_manifest(tmp_path, 72, "11.8")
    why = "compute_72 PTX ISA 7.8: the driver's JIT needs CUDA 11.8+"
    m = m.model_copy(update={"target": m.target.model_copy(update={"driver_floor_reason": why})})
    with pytest.raises(
        IncompatibleBundle, match=r"needs CUDA driver API 11\.8\+ \(compute_72 PTX ISA 7\.8.*offers 11\.4"
    ) as e:
        check_compatible(m, machine="x86_64", gpu=xavier_jp5)
    assert "CUDA 11.8 or newer" in (e.value.hint or "")
    check_compatible(gpu_manifest(tmp_path, 72, "11.4"), machine="x86_64", gpu=xavier_jp5)
