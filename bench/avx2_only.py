"""bench/avx2_only.c built and preloaded: a process that sees an AVX2-only CPU through cpuid (the C file says how).
Used by bench/int8_cpu.py --cpu avx2 and tests/host/test_avx2_only.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().with_suffix(".c")
ACTIVE = "EDGEDEPLOY_AVX2_ONLY"  # set by the library once it took effect


def hidden(flag: str) -> bool:
    """Whether the library hides this /proc/cpuinfo flag from cpuid (AVX-512 and VNNI, as the C file clears)."""
    return flag.startswith("avx512") or flag == "avx_vnni"


def why_not() -> str | None:
    """Why the library cannot work here, or None."""
    cpuinfo = Path("/proc/cpuinfo")
    if "cpuid_fault" not in (cpuinfo.read_text().split() if cpuinfo.exists() else []):
        return "this CPU or kernel has no CPUID faulting (cpuid_fault in /proc/cpuinfo)"
    if shutil.which("gcc") is None:
        return "needs gcc to build bench/avx2_only.c"
    return None


def build(out_dir: Path) -> Path:
    """The library, built into out_dir."""
    lib = out_dir / "avx2_only.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(lib), str(SOURCE)], check=True)
    return lib


def rerun_preloaded(out_dir: Path) -> None:
    """Run this process's command again with the library (built into out_dir) preloaded; returns only when it
    already is."""
    if os.environ.get(ACTIVE):
        return
    env = dict(os.environ)
    env["LD_PRELOAD"] = " ".join(filter(None, [str(build(out_dir)), env.get("LD_PRELOAD", "")]))
    os.execve(sys.executable, [sys.executable, *sys.argv], env)
