"""Shared fixtures. Tests are hermetic: every host folder (config, state, cache) is a temp dir."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Cli
from tests.leftovers import Leftovers

LEFTOVERS = Leftovers()
LEFTOVERS.mark()

REPO = Path(__file__).resolve().parents[1]


def _data_dir() -> Path:
    return Path(os.environ.get("EDGEDEPLOY_TEST_DATA", REPO.parent / "shared" / "data")).resolve()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    d = _data_dir()
    if not (d / "models").is_dir():
        pytest.skip(f"test data not found at {d} (set EDGEDEPLOY_TEST_DATA)")
    return d


@pytest.fixture(scope="session", autouse=True)
def no_process_outlives_the_run() -> Iterator[None]:
    """At the end of the session, what is still running below pytest (or was, and was orphaned) is killed and
    named, and the session fails (tests/leftovers.py)."""
    yield
    left = LEFTOVERS.finish()
    if left:
        pytest.fail("processes outlived their tests (killed now):\n" + "\n".join(left), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    try:
        return (yield)
    finally:
        LEFTOVERS.note(item.nodeid)  # after the body, before the fixtures are torn down


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build cache for the session: each model is compiled once."""
    return tmp_path_factory.mktemp("build-cache")


@pytest.fixture(autouse=True)
def hermetic(tmp_path: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep the user's config, inventory, known_hosts, reports and caches out of every test."""
    home = tmp_path / "host"
    monkeypatch.setenv("EDGEDEPLOY_CONFIG_DIR", str(home / "config"))
    monkeypatch.setenv("EDGEDEPLOY_STATE_DIR", str(home / "state"))
    monkeypatch.setenv("EDGEDEPLOY_CACHE_DIR", str(build_cache))
    monkeypatch.delenv("EDGEDEPLOY_INVENTORY", raising=False)
    monkeypatch.delenv("EDGEDEPLOY_PROFILES", raising=False)
    return home


# --- services and tools: skip where missing, fail where CI requires them --------------------


def require(variable: str, missing: str | None) -> None:
    """The one skip rule for a service or tool a test needs: `missing` (None when it is there) says what
    is not; CI sets EDGEDEPLOY_REQUIRE_<variable>=1 (.ci/run) and then the test fails instead of skipping."""
    if missing is None:
        return
    if os.environ.get(f"EDGEDEPLOY_REQUIRE_{variable}") == "1":
        pytest.fail(f"{missing}, but EDGEDEPLOY_REQUIRE_{variable}=1 says this test must run here")
    pytest.skip(missing)


def require_host() -> None:
    """Agent tests that need a bundle built by the host package skip where only the agent is installed
    (as on a device); CI installs both and sets EDGEDEPLOY_REQUIRE_HOST=1."""
    try:
        import edgedeploy.api  # noqa: F401
    except ImportError as e:
        require("HOST", f"the host package is not installed here ({e})")


def require_sshd() -> None:
    from edgedeploy.localdevice import sshd_available

    require("SSHD", None if sshd_available() else "OpenSSH server not installed (apt-get install openssh-server)")


# --- hardware markers: declared in pyproject.toml, checked here at run time -------------------


def _has_gpu() -> bool:
    return (
        shutil.which("nvidia-smi") is not None
        and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
    )


def _has_tensorrt() -> bool:
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return False
    return True


HARDWARE = {
    "gpu": (_has_gpu, "needs an NVIDIA GPU (nvidia-smi -L failed)"),
    "tensorrt": (_has_tensorrt, "needs the tensorrt Python package"),
    "jetson": (lambda: Path("/etc/nv_tegra_release").exists(), "needs a Jetson (/etc/nv_tegra_release)"),
    "camera": (lambda: Path("/dev/video0").exists(), "needs a camera at /dev/video0"),
}


def _arm64_systemd_missing() -> str | None:
    from tests.integration.arm64root import missing

    return missing()


# what this machine may lack for a test, with the variable CI (.ci/run) sets so that the test fails instead
EMULATION = {"arm64_systemd": (_arm64_systemd_missing, "EDGEDEPLOY_REQUIRE_ARM64_SYSTEMD")}


def pytest_runtest_setup(item: pytest.Item) -> None:
    for name, (why_not, require) in EMULATION.items():
        if name in item.keywords:
            reason = why_not()
            if reason and os.environ.get(require) == "1":
                pytest.fail(f"{require}=1 but this machine cannot run it: {reason}")
            if reason:
                pytest.skip(reason)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cache: dict[str, bool] = {}
    for item in items:
        for name, (check, reason) in HARDWARE.items():
            if name in item.keywords:
                if name not in cache:
                    cache[name] = check()
                if not cache[name]:
                    item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def netns() -> None:
    """Network-namespace devices need root and iproute2; CI sets EDGEDEPLOY_REQUIRE_NETNS=1."""
    from edgedeploy.localdevice import netns_available

    ok, why = netns_available()
    if not ok:
        require("NETNS", why)


@pytest.fixture(scope="session")
def python39() -> Path:
    """A CPython 3.9 interpreter, the agent's floor (JetPack 5): $EDGEDEPLOY_TEST_PYTHON39, python3.9 on PATH or
    pyenv's; EDGEDEPLOY_REQUIRE_PYTHON39=1 fails instead of skipping."""
    found = [os.environ.get("EDGEDEPLOY_TEST_PYTHON39"), shutil.which("python3.9")]
    found += sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.9.*/bin/python3.9"))
    for candidate in filter(None, found):
        # the real interpreter, not a shim (pyenv's python3.9 shim fails where 3.9 is not the selected version)
        p = subprocess.run(
            [candidate, "-c", "import sys; print(sys.version_info[:2] == (3, 9), sys.executable)"],
            capture_output=True,
            text=True,
        )
        ok, _, exe = p.stdout.strip().partition(" ")
        if p.returncode == 0 and ok == "True":
            return Path(exe)
    require("PYTHON39", "no Python 3.9 interpreter (set EDGEDEPLOY_TEST_PYTHON39)")
    raise AssertionError("unreachable: require() skipped or failed")


@pytest.fixture
def cli(hermetic: Path) -> Cli:
    """Run the real `edgedeploy` console script in a subprocess (what a user types)."""
    return Cli()
