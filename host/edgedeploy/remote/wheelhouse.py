"""A wheelhouse: the agent and every wheel it needs for one device Python and platform, in one folder.

`edgedeploy agent wheelhouse DIR --python 3.9 --platform manylinux_2_28_aarch64` prepares it on a host
that can reach PyPI (`pip download --only-binary=:all:`: no source builds, nothing compiled for the wrong
machine); `edgedeploy agent install DEVICE --offline DIR` installs from it alone (`pip install --no-index`),
for a device that has never seen the internet. DIR/wheelhouse.json says what it was made for, and an
install refuses a device with another Python or architecture before anything is uploaded.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import InputError
from .wheels import agent_wheels

MANIFEST = "wheelhouse.json"
_PYTHON = re.compile(r"^3\.\d{1,2}$")
_PLATFORM = re.compile(r"^(?:manylinux_\d+_\d+|manylinux2014|musllinux_\d+_\d+)_(x86_64|aarch64)$")
_EXTRAS = ("agent-metrics", "agent-nvidia", "tensorrt")


class WheelhouseMismatch(InputError):
    """The wheelhouse was made for another Python version or architecture than the device has."""


@dataclass(frozen=True)
class Wheelhouse:
    folder: str
    python: str
    platform: str
    arch: str
    extras: list[str]
    wheels: list[str]
    download_s: float
    cuda_backend: str = ""  # cuda-backend/<arch>/libedgedeploy_cuda.so, or why it is missing


def platform_tags(platform: str) -> list[str]:
    """Pure: manylinux_2_N_ARCH -> it and every older glibc tag (pip takes a --platform literally)."""
    m = re.match(r"^manylinux_2_(\d+)_(x86_64|aarch64)$", platform)
    if not m:
        return [platform]
    newest, arch = int(m.group(1)), m.group(2)
    return [f"manylinux_2_{n}_{arch}" for n in range(newest, 16, -1)] + [f"manylinux2014_{arch}"]


def build_wheelhouse(out: Path, python: str, platform: str, extras: tuple[str, ...] = ()) -> Wheelhouse:
    """Build the agent's wheel from this checkout and download its dependencies' wheels beside it."""
    if not _PYTHON.match(python):
        raise InputError(f"--python {python!r}: expected the device's Python as MAJOR.MINOR, e.g. 3.9")
    m = _PLATFORM.match(platform)
    if not m:
        raise InputError(
            f"--platform {platform!r} is not a Linux wheel platform",
            hint="e.g. manylinux_2_28_x86_64, or manylinux_2_28_aarch64 for a Jetson (JetPack 5: glibc 2.31)",
        )
    unknown = [e for e in extras if e not in _EXTRAS]
    if unknown:
        raise InputError(f"unknown extra {unknown[0]!r}", hint=f"choose from {', '.join(_EXTRAS)}")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        built = agent_wheels(Path(tmp), None)[0]
        for old in out.glob("edgedeploy-*.whl"):
            old.unlink()
        agent = Path(shutil.copy2(built, out / built.name))
    t = time.monotonic()
    argv = [
        sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--only-binary=:all:",
        "--python-version", python, "--implementation", "cp",
        *(arg for tag in platform_tags(platform) for arg in ("--platform", tag)), "--dest", str(out),
        f"{agent}[{','.join(('agent', *extras))}]",
    ]  # fmt: skip
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode != 0:
        lines = [ln.strip() for ln in p.stderr.splitlines() if ln.strip()] or ["no output"]
        why = next((ln for ln in lines if ln.startswith("ERROR")), lines[-1])
        raise InputError(
            f"pip download for Python {python} on {platform} failed: {why}",
            hint="this host needs PyPI (or PIP_INDEX_URL); a dependency without a wheel for that platform "
            "cannot go into a wheelhouse",
        )
    download_s = round(time.monotonic() - t, 1)
    # edgedeploy's CUDA backend for the platform's architecture, which `agent install --offline` uploads
    from ..cuda_backend import build_backend
    from ..errors import BuildError
    from .wheels import wheelhouse_backend

    backend = wheelhouse_backend(out, m.group(1))
    try:
        built = build_backend(m.group(1))
        backend.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, backend)
        backend_note = str(backend.relative_to(out))
    except BuildError as e:
        backend_note = f"not included: {e.message}"
    house = Wheelhouse(
        str(out), python, platform, m.group(1), sorted(extras), sorted(w.name for w in out.glob("*.whl")),
        download_s, backend_note,
    )  # fmt: skip
    (out / MANIFEST).write_text(json.dumps(asdict(house), indent=1) + "\n", encoding="utf-8")
    return house


def check_wheelhouse(folder: Path, device_python: str | None, device_arch: str) -> None:
    """Refuse a wheelhouse made for another Python or architecture (a hand-made folder is taken as it is)."""
    try:
        meta = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return
    except ValueError as e:
        raise InputError(f"{folder / MANIFEST} is not valid JSON: {e}") from None
    made_for = (str(meta.get("python")), str(meta.get("arch")))
    if made_for != (device_python, device_arch):
        raise WheelhouseMismatch(
            f"wheelhouse {folder} is for Python {made_for[0]} on {made_for[1]}, "
            f"the device has Python {device_python} on {device_arch}",
            hint=f"make one for it: edgedeploy agent wheelhouse DIR --python {device_python} "
            f"--platform manylinux_2_28_{device_arch}",
        )
