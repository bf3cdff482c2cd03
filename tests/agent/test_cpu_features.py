"""The agent refuses a bundle whose host code needs CPU features (e.g. AVX2) this device lacks."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest

from edgedeploy_agent.aligned import aligned
from edgedeploy_agent.bundle import Preprocess, Target, TensorSpec, check_compatible, cpu_flags, read_manifest
from edgedeploy_agent.config import AgentConfig
from edgedeploy_agent.errors import IncompatibleBundle
from edgedeploy_agent.lifecycle import Deployment
from edgedeploy_agent.preprocess import preprocess
from edgedeploy_agent.store import DeviceStore
from tests.agent.bundles import copy, make_bundle
from tests.agent.doubles import ScriptedService
from tests.helpers import require

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu sse sse2 pni ssse3 sse4_1 sse4_2 avx
bogomips\t: 4800.00

processor\t: 1
flags\t\t: fpu sse sse2 pni ssse3 sse4_1 sse4_2 avx
"""


def needing(tmp: Path, *features: str) -> Path:
    target = Target(arch="x86_64", device="cpu", runtime_abi="tvm-ffi-0.1", cpu_features=list(features))
    return make_bundle(tmp, target=target)


def test_cpu_flags_reads_the_flags_line(tmp_path: Path) -> None:
    (tmp_path / "x86").write_text(CPUINFO)
    assert cpu_flags(tmp_path / "x86") == frozenset("fpu sse sse2 pni ssse3 sse4_1 sse4_2 avx".split())
    (tmp_path / "arm").write_text("processor\t: 0\nFeatures\t: fp asimd evtstrm aes crc32 atomics\n")
    assert cpu_flags(tmp_path / "arm") == frozenset("fp asimd evtstrm aes crc32 atomics".split())
    (tmp_path / "none").write_text("processor\t: 0\n")
    assert cpu_flags(tmp_path / "none") is None
    assert cpu_flags(tmp_path / "absent") is None


def test_missing_cpu_features_are_named(tmp_path: Path) -> None:
    m = read_manifest(needing(tmp_path, "avx2", "fma"))
    assert m.target.cpu_features == ["avx2", "fma"]
    old_cpu, newer_cpu, no_flags = tmp_path / "old", tmp_path / "newer", tmp_path / "none"
    old_cpu.write_text(CPUINFO)
    newer_cpu.write_text(CPUINFO.replace(" avx\n", " avx avx2 fma\n"))
    no_flags.write_text("processor\t: 0\n")
    with pytest.raises(IncompatibleBundle, match="needs CPU features this device lacks: avx2, fma$") as err:
        check_compatible(m, machine="x86_64", cpuinfo=old_cpu)
    assert "\n" not in str(err.value)
    with pytest.raises(IncompatibleBundle, match="needs CPU features avx2, fma; .*/none lists no CPU flags"):
        check_compatible(m, machine="x86_64", cpuinfo=no_flags)
    check_compatible(m, machine="x86_64", cpuinfo=newer_cpu)
    # a bundle that needs nothing beyond the arch never reads cpuinfo
    check_compatible(read_manifest(make_bundle(tmp_path / "plain")), machine="x86_64", cpuinfo=no_flags)


def test_bundle_without_cpu_features_keeps_its_manifest_bytes(tmp_path: Path) -> None:
    m = read_manifest(make_bundle(tmp_path))
    assert m.target.cpu_features == [] and "cpu_features" not in m.canonical_bytes().decode()


def test_deploy_refuses_a_bundle_needing_a_flag_this_cpu_lacks(tmp_path: Path) -> None:
    x86 = platform.machine() == "x86_64" and cpu_flags() is not None
    require("X86_64", None if x86 else "needs an x86-64 /proc/cpuinfo")
    store = DeviceStore(tmp_path / "device")
    store.init(AgentConfig(device_name="t", keep_releases=2))
    svc = ScriptedService(store)
    have = cpu_flags()
    assert have is not None and "sse2" in have  # every x86-64 CPU
    lacking = "amx_fp8_edgedeploy_test"  # no CPU has it
    with pytest.raises(IncompatibleBundle, match=f"lacks: {lacking}$") as err:
        Deployment(store, svc).deploy(copy(needing(tmp_path / "b", "sse2", lacking), store.incoming), timeout=2)
    assert "\n" not in str(err.value) and store.current() is None and svc.restarts == 0
    r = Deployment(store, svc).deploy(copy(needing(tmp_path / "ok", "sse2"), store.incoming), timeout=2)
    assert r["outcome"] == "committed"


def test_inputs_are_handed_to_tvm_64_byte_aligned() -> None:
    raw = np.zeros(4 * 100 + 64, dtype=np.uint8)
    start = -raw.ctypes.data % 64 + 4
    odd = raw[start : start + 400].view(np.float32).reshape(4, 25)
    odd[...] = np.linspace(-1, 1, 100, dtype=np.float32).reshape(4, 25)
    got = aligned(odd)
    assert got.ctypes.data % 64 == 0 and got.shape == (4, 25) and got.dtype == np.float32
    assert np.array_equal(got, odd) and aligned(got) is got


def test_preprocessed_frames_go_to_tvm_without_a_copy() -> None:
    """preprocess() allocates its output 64-byte aligned, so the runtime hands it over as it is."""
    frame = np.random.default_rng(0).integers(0, 256, (240, 320, 3), dtype=np.uint8)
    for layout, shape, dtype in (("NCHW", [1, 3, 224, 224], "float32"), ("NHWC", [1, 96, 96, 3], "float16")):
        for _ in range(8):  # several allocations: an aligned result by luck would not pass every time
            x = preprocess(
                frame, Preprocess(color="rgb"), TensorSpec(name="x", shape=shape, dtype=dtype, layout=layout)
            )
            assert x.ctypes.data % 64 == 0 and aligned(x) is x and list(x.shape) == shape and x.dtype == dtype
