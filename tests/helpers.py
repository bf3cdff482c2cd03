"""Small helpers shared by tests (not fixtures), and the one rule for what a test needs (require)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BIN = Path(sys.executable).parent
# a test clip played in a loop comes at a camera's rate: unpaced, its agent takes a core of the two CI has while the
# test's own commands wait (the two-model test: 178 s -> 61 s in a full run)
CAMERA_FPS = 30


def looped(path: Path | str) -> str:
    """The source URI of a video file played in a loop at CAMERA_FPS."""
    return f"file:{path}?loop=1&fps={CAMERA_FPS}"


# --- what a test needs: one rule ------------------------------------------------------------------------


def require(variable: str, missing: str | None) -> None:
    """The one rule for anything a test needs that a machine may lack (a tool, a service, root, a package, a
    GPU): `missing` says what is not there (None: it is). Where EDGEDEPLOY_REQUIRE_<variable>=1 is set (.ci/run
    sets it for what CI has) the test FAILS; elsewhere it skips with that reason. Also at module level.

    Every skip for a missing requirement goes through here: a test's markers (conftest.NEEDS), its fixtures
    (sshd, netns, pull_fleet, python39) and the checks inside tests call it; nothing else skips silently."""
    if missing is None:
        return
    if os.environ.get(f"EDGEDEPLOY_REQUIRE_{variable}") == "1":
        pytest.fail(f"{missing}, but EDGEDEPLOY_REQUIRE_{variable}=1 says this test must run here", pytrace=False)
    # reported at the test's location, not this line's (pytest.skip's private flag; pytest 7-9)
    raise pytest.skip.Exception(
        f"{missing} [EDGEDEPLOY_REQUIRE_{variable}]", allow_module_level=True, _use_item_location=True
    )


def require_module(name: str, variable: str, install: str) -> ModuleType:
    """`import name` through require() (pytest.importorskip's job, with the CI rule); `install` says how."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        require(variable, f"{name} is not installed ({install}): {e}")
        raise AssertionError("unreachable: require() skipped or failed") from e


def require_root(why: str) -> None:
    """Tests that act as root (mounts, other users' files); CI runs as root and sets EDGEDEPLOY_REQUIRE_ROOT=1."""
    require("ROOT", None if os.geteuid() == 0 else f"needs root: {why}")


def mount_tmpfs(path: Path, size: str) -> None:
    """A small tmpfs at `path` (a disk that fills up on demand): needs root that may mount (CI: ROOT)."""
    require_root(f"mounting a {size} tmpfs")
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    require("ROOT", None if r.returncode == 0 else f"cannot mount a tmpfs here: {r.stderr.strip()}")


def require_host() -> None:
    """Agent tests that need a bundle built by the host package skip where only the agent is installed
    (as on a device); CI installs both and sets EDGEDEPLOY_REQUIRE_HOST=1."""
    try:
        import edgedeploy.api  # noqa: F401
    except ImportError as e:
        require("HOST", f"the host package is not installed here ({e})")


def system_python() -> str | None:
    """/usr/bin/python3 (Debian's: the one with python3-opencv), or None."""
    import shutil

    return shutil.which("python3", path="/usr/bin")


def require_gstreamer_python() -> str:
    """/usr/bin/python3 with an OpenCV built with GStreamer (Debian's python3-opencv) and numpy; CI has it
    (EDGEDEPLOY_REQUIRE_GSTREAMER=1)."""
    py = system_python()
    probe = "import cv2, numpy, re; print(re.search(r'GStreamer:\\s*YES', cv2.getBuildInformation()) is not None)"
    found = py is not None and subprocess.run([py, "-c", probe], capture_output=True, text=True).stdout == "True\n"
    require("GSTREAMER", None if found else "no /usr/bin/python3 with a GStreamer-enabled OpenCV (python3-opencv)")
    assert py is not None
    return py


def sshd_missing() -> str | None:
    from edgedeploy.localdevice import sshd_available

    return None if sshd_available() else "OpenSSH server not installed (apt-get install openssh-server)"


def require_sshd() -> None:
    require("SSHD", sshd_missing())


@dataclass
class Ran:
    code: int
    out: str
    err: str


@dataclass
class CompileGuard:
    """May the running test compile models? tests/conftest.py sets this before each test from its `compile`
    marker and stops TVM compiles in-process; Cli stops a model built through the command line."""

    allowed: bool = True
    test: str = ""

    def refuse(self, what: str) -> None:
        if not self.allowed:
            pytest.fail(f"{self.test} compiles ({what}) but is not marked `compile`: mark it (tests/conftest.py)")


COMPILE_GUARD = CompileGuard()


class Cli:
    def __call__(self, *args: str, timeout: float = 300, env: dict[str, str] | None = None) -> Ran:
        p = subprocess.run(
            [str(BIN / "edgedeploy"), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "COLUMNS": "200", **(env or {})},
            stdin=subprocess.DEVNULL,
        )
        if p.returncode == 0 and args and (args[0] in ("build", "demo") or _tunes(args)):
            COMPILE_GUARD.refuse(f"`edgedeploy {args[0]}`")
        return Ran(p.returncode, p.stdout, p.stderr)


def _tunes(args: tuple[str, ...]) -> bool:
    return args[0] == "tune" and not {"--export", "--import"} & set(args)


def agent(*args: str, timeout: float = 120) -> Ran:
    p = subprocess.run(
        [str(BIN / "edgedeploy-agent"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return Ran(p.returncode, p.stdout, p.stderr)


def assert_one_line_error(r: Ran, code: int | None = None, contains: str = "") -> None:
    """A failed command prints `error: ...` (and maybe `hint: ...`), never a traceback."""
    assert r.code != 0, r
    if code is not None:
        assert r.code == code, r
    assert "Traceback" not in r.err and "Traceback" not in r.out, r.err
    lines = [ln for ln in r.err.splitlines() if ln.strip() and not ln.startswith("hint:")]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1, r.err
    assert contains.lower() in errors[0].lower(), r.err


def schema1_bundle(bundle: Path, out: Path, host_files: dict[str, Path]) -> Path:
    """`bundle` as edgedeploy wrote it before host-only files left bundles (schema 1): they ride along as
    artifacts (`host_files`: role -> file; model.onnx, model.qdq.onnx) and the manifest has no host_files."""
    from edgedeploy_agent.bundle import describe_artifact, extract_bundle, write_bundle

    unpacked = out.with_name(out.stem + "-files")
    m = extract_bundle(bundle, unpacked)
    names = {"onnx-model": "model.onnx", "qdq-onnx": "model.qdq.onnx"}
    files = {a.path: unpacked / a.path for a in m.artifacts} | {names[r]: p for r, p in host_files.items()}
    arts = [*m.artifacts, *(describe_artifact(p, r, names[r]) for r, p in host_files.items())]
    old = m.model_copy(update={"schema_version": 1, "artifacts": sorted(arts, key=lambda a: a.path), "host_files": []})
    return write_bundle(out, old, files)


def keep_user_files_out(mp: pytest.MonkeyPatch, home: Path, cache: Path) -> None:
    """Point edgedeploy's config and state under `home` and its cache at `cache`, and drop the user's inventory
    and profile overrides: what every test, session fixture and module fixture runs with (tests/conftest.py)."""
    mp.setenv("EDGEDEPLOY_CONFIG_DIR", str(home / "config"))
    mp.setenv("EDGEDEPLOY_STATE_DIR", str(home / "state"))
    mp.setenv("EDGEDEPLOY_CACHE_DIR", str(cache))
    mp.delenv("EDGEDEPLOY_INVENTORY", raising=False)
    mp.delenv("EDGEDEPLOY_PROFILES", raising=False)


def wait_for(what: str, check: Callable[[], Any], timeout: float, every: float = 1.0) -> Any:
    """Poll `check` until it returns something true (returned), or fail naming `what` and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")
