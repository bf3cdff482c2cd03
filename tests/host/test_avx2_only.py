"""bench/avx2_only.c (bench/int8_cpu.py --cpu avx2): preloaded, a process sees an AVX2-only CPU through cpuid, and
real faults still end the process (through the program's own SIGSEGV handler where it installed one).

Needs gcc and a CPU with CPUID faulting (cpuid_fault in /proc/cpuinfo); on a CPU without AVX-512 there is nothing
to hide and the check of the hidden flags skips."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import avx2_only  # noqa: E402

pytestmark = pytest.mark.bench

CPUINFO = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""


@pytest.fixture(scope="module")
def preload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    reason = avx2_only.why_not()
    if reason:
        pytest.skip(reason)
    return avx2_only.build(tmp_path_factory.mktemp("avx2"))


def _python(preload: Path, code: str, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {"LD_PRELOAD": str(preload), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, *flags, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_numpy_and_onnxruntime_see_no_avx512(preload: Path) -> None:
    if "avx512f" not in CPUINFO.split():
        pytest.skip("this CPU has no AVX-512 to hide")
    code = (
        "import os, numpy as np, onnxruntime\n"
        "from numpy._core._multiarray_umath import __cpu_features__ as f\n"
        "print(os.environ.get('EDGEDEPLOY_AVX2_ONLY'), f['AVX2'], f['AVX512F'], f.get('AVX512VNNI'))\n"
    )
    got = _python(preload, code)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["1", "True", "False", "False"]


def test_a_real_fault_still_ends_the_process(preload: Path) -> None:
    crash = "import ctypes; ctypes.string_at(0)"
    got = _python(preload, crash)
    assert got.returncode == -signal.SIGSEGV
    # a handler the program installs later (faulthandler here, TVM's backtrace printer in the bench) still runs
    got = _python(preload, crash, "-X", "faulthandler")
    assert got.returncode == -signal.SIGSEGV and "Segmentation fault" in got.stderr
