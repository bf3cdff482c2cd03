"""Shared fixtures, the test tiers and what each tier needs. Tests are hermetic: every host folder (config,
state, cache) is a temp dir.

Tiers: a marker (pyproject.toml) says what a test costs or needs. Markers come from the test or its module
(`pytestmark`), from the fixtures it uses (BY_FIXTURE), and every test in tests/integration is `integration`.
Any test with a SLOW marker is also marked `slow`: `make test` runs `-m "not slow"` (the fast tier), `make
test-all` all. Markers that name something a machine may lack (NEEDS) are checked before the test through require()."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgedeploy_agent import tvm_without_torch
from tests.helpers import COMPILE_GUARD, Cli, keep_user_files_out, require, require_host, sshd_missing
from tests.leftovers import Leftovers

tvm_without_torch.install()  # as the CLI and the agent do: TVM's import would bring PyTorch along
LEFTOVERS = Leftovers()
LEFTOVERS.mark()

REPO = Path(__file__).resolve().parents[1]

# markers that keep a test out of the fast tier (`make test`); `make test-all` runs them too
SLOW = (
    "compile",
    "cuda",
    "integration",
    "sshd",
    "fleet_servers",
    "netns",
    "arm64",
    "network",
    "bench",
    "gpu",
    "tensorrt",
    "jetson",
    "camera",
)

# fixtures whose use makes a test slow or needy: the markers it gets from them
BY_FIXTURE: dict[str, tuple[str, ...]] = {
    "sshd": ("sshd",),  # a real OpenSSH server on loopback (tests/integration/conftest.py)
    "device": ("sshd",),  # an enrolled device behind that sshd
    "netns": ("netns",),
    "pull_fleet": ("fleet_servers",),  # docker-registry + mosquitto
    "arm64_root": ("arm64",),
    "mnist_bundle": ("compile",),  # built with TVM (tests/integration/conftest.py, test_tuning.py)
    "trt_bundle": ("compile",),  # an INT8 TensorRT bundle built by the host (tests/agent/conftest.py)
    "both_runtimes_release": ("compile",),  # TVM library + TensorRT artifacts (tests/agent/test_tensorrt_runtime.py)
}


def _data_dir() -> Path:
    return Path(os.environ.get("EDGEDEPLOY_DATA", REPO.parent / "shared" / "data")).resolve()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    d = _data_dir()
    require("TEST_DATA", None if (d / "models").is_dir() else f"test data not found at {d} (set EDGEDEPLOY_DATA)")
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


@pytest.fixture(scope="session", autouse=True)
def hermetic_session(tmp_path_factory: pytest.TempPathFactory, build_cache: Path) -> Iterator[None]:
    """What `hermetic` does, for the whole run: session- and module-scoped fixtures are set up before a test's
    `hermetic`, and without this they built into the user's cache and config (the CUDA stub driver, NVRTC
    builds, TensorRT test bundles). Fixtures that want a config of their own still set one."""
    with pytest.MonkeyPatch.context() as mp:
        keep_user_files_out(mp, tmp_path_factory.mktemp("session-host"), build_cache)
        yield


@pytest.fixture(autouse=True)
def hermetic(tmp_path: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep the user's config, inventory, known_hosts, reports and caches out of every test."""
    home = tmp_path / "host"
    keep_user_files_out(monkeypatch, home, build_cache)
    return home


# --- what a marker needs, checked through require() before the test (and before its fixtures) -------------


def _gpu_missing() -> str | None:
    found = (
        shutil.which("nvidia-smi") is not None
        and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
    )
    return None if found else "needs an NVIDIA GPU (nvidia-smi -L failed)"


def _tensorrt_missing() -> str | None:
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return "needs the tensorrt Python package"
    return None


def _netns_missing() -> str | None:
    from edgedeploy.localdevice import netns_available

    ok, why = netns_available()
    return None if ok else why


def _fleet_servers_missing() -> str | None:
    from edgedeploy.fleet_servers import servers_available

    return servers_available()


def _arm64_missing() -> str | None:
    from tests.integration.arm64root import missing

    return missing()


# marker -> (EDGEDEPLOY_REQUIRE_<variable>, what is missing on this machine or None)
NEEDS: dict[str, tuple[str, Callable[[], str | None]]] = {
    "sshd": ("SSHD", sshd_missing),
    "netns": ("NETNS", _netns_missing),
    "fleet_servers": ("FLEET_SERVERS", _fleet_servers_missing),
    "arm64": ("ARM64_SYSTEMD", _arm64_missing),
    "gpu": ("GPU", _gpu_missing),
    "tensorrt": ("TENSORRT", _tensorrt_missing),
    "jetson": (
        "JETSON",
        lambda: None if Path("/etc/nv_tegra_release").exists() else "needs a Jetson (/etc/nv_tegra_release)",
    ),
    "camera": ("CAMERA", lambda: None if Path("/dev/video0").exists() else "needs a camera at /dev/video0"),
}
_checked: dict[str, str | None] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Markers from fixtures, then `slow` on every test with a SLOW marker; tryfirst: before `-m` selects."""
    for item in items:
        if item.nodeid.startswith("tests/integration/"):
            item.add_marker("integration")
        for fixture in getattr(item, "fixturenames", ()):
            for name in BY_FIXTURE.get(fixture, ()):
                item.add_marker(name)
        if any(item.get_closest_marker(name) for name in SLOW):
            item.add_marker("slow")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the test's fixtures: what its markers need (require), and the compile guard."""
    for name, (variable, missing) in NEEDS.items():
        if item.get_closest_marker(name):
            if name not in _checked:
                _checked[name] = missing()
            require(variable, _checked[name])
    _guard_compiles(item)


# --- the compile guard: a test not marked `compile` must not compile (the fast tier stays fast, the marker true) --

# TVM's compile entries (tvm.compile calls relax.build or tirx.build), replaced while such a test runs; a build or
# tune through the command line is caught by tests/helpers.py Cli
TVM_COMPILE = (("tvm", "compile"), ("tvm", "build"), ("tvm.relax", "build"), ("tvm.tirx", "build"))
_replaced: list[tuple[object, str, object]] = []


def _guard_compiles(item: pytest.Item) -> None:
    COMPILE_GUARD.allowed = item.get_closest_marker("compile") is not None
    COMPILE_GUARD.test = item.nodeid
    if COMPILE_GUARD.allowed:
        return
    for module_name, name in TVM_COMPILE:
        module = sys.modules.get(module_name)  # not imported yet: nothing of TVM's can have run
        if hasattr(module, name):

            def refused(*args: object, _what: str = f"{module_name}.{name}", **kwargs: object) -> None:
                COMPILE_GUARD.refuse(_what)

            _replaced.append((module, name, getattr(module, name)))
            setattr(module, name, refused)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """After the test's fixtures are torn down: TVM as it was, and compiles allowed between tests."""
    while _replaced:
        module, name, original = _replaced.pop()
        setattr(module, name, original)
    COMPILE_GUARD.allowed = True


@pytest.fixture
def netns() -> None:
    """Network-namespace devices need root and iproute2; CI sets EDGEDEPLOY_REQUIRE_NETNS=1 (the test is marked
    `netns` through BY_FIXTURE, so the check has run already; the fixture says so where it is used)."""
    require("NETNS", _netns_missing())


def find_python(minor: int) -> Path | None:
    """A real CPython 3.<minor> interpreter: $EDGEDEPLOY_TEST_PYTHON3<minor>, python3.<minor> on PATH or pyenv's
    (this project's machines, CI's included, come with pyenv's 3.8 and 3.9)."""
    found = [os.environ.get(f"EDGEDEPLOY_TEST_PYTHON3{minor}"), shutil.which(f"python3.{minor}")]
    found += sorted(str(p) for p in Path.home().glob(f".pyenv/versions/3.{minor}.*/bin/python3.{minor}"))
    for candidate in filter(None, found):
        # the real interpreter, not a shim (pyenv's shim fails where that version is not the selected one)
        p = subprocess.run(
            [candidate, "-c", f"import sys; print(sys.version_info[:2] == (3, {minor}), sys.executable)"],
            capture_output=True,
            text=True,
        )
        ok, _, exe = p.stdout.strip().partition(" ")
        if p.returncode == 0 and ok == "True":
            return Path(exe)
    return None


@pytest.fixture(scope="session")
def python39() -> Path:
    """A CPython 3.9 interpreter, the agent's floor (JetPack 5's python3.9 venv); EDGEDEPLOY_REQUIRE_PYTHON39=1
    fails instead of skipping."""
    found = find_python(9)
    require("PYTHON39", None if found else "no Python 3.9 interpreter (set EDGEDEPLOY_TEST_PYTHON39)")
    assert found is not None
    return found


# what the stand-in for JetPack's system Python gets: numpy (JetPack has python3-numpy) and onnxruntime, which
# computes for the TensorRT double (tests/agent/trt_double.py)
JETPACK_PYTHON_PACKAGES = ("numpy==1.24.4", "onnxruntime==1.19.2")


@pytest.fixture(scope="session")
def jetpack_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """JetPack 5's system Python as far as it can exist here: a CPython 3.8 venv with numpy and onnxruntime,
    made once per machine under /var/cache/edgedeploy-tests (pip needs PyPI the first time).
    EDGEDEPLOY_REQUIRE_PYTHON38=1 fails instead of skipping."""
    base = find_python(8)
    require("PYTHON38", None if base else "no Python 3.8 interpreter (set EDGEDEPLOY_TEST_PYTHON38)")
    assert base is not None
    cache = Path(os.environ.get("EDGEDEPLOY_TEST_CACHE", "/var/cache/edgedeploy-tests"))
    if not os.access(cache if cache.exists() else cache.parent, os.W_OK):
        cache = tmp_path_factory.mktemp("cache")
    venv = cache / ("python38-" + "-".join(p.replace("==", "") for p in JETPACK_PYTHON_PACKAGES))
    python = venv / "bin" / "python"
    if not (venv / ".complete").exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([str(base), "-m", "venv", str(venv)], check=True, capture_output=True)
        r = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *JETPACK_PYTHON_PACKAGES], capture_output=True, text=True
        )
        require(
            "PYTHON38", None if r.returncode == 0 else f"cannot install {JETPACK_PYTHON_PACKAGES}: {r.stderr[-300:]}"
        )
        (venv / ".complete").touch()
    return python


@pytest.fixture
def cli(hermetic: Path) -> Cli:
    """Run the real `edgedeploy` console script in a subprocess (what a user types)."""
    return Cli()


@pytest.fixture(scope="session")
def mnist_trt_bundle(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small TensorRT bundle (MNIST, profile t4, batch 1:1:8, 16 calibration digits): seconds to build, no
    TVM compile, so fast-tier tests can deploy a TensorRT bundle."""
    require_host()
    from edgedeploy.api import build_tensorrt
    from edgedeploy.compile.cards import ModelCard, Postprocess, Preprocess
    from edgedeploy.compile.int8.build import Int8Config
    from edgedeploy.compile.int8.quantize import QuantizeOptions
    from edgedeploy.compile.tensorrt_artifacts import TensorRTOptions

    card = ModelCard(
        name="mnist",
        version="1",
        labels=[str(i) for i in range(10)],
        preprocess=Preprocess(color="gray", interpolation="area"),
        postprocess=Postprocess(top_k=3, softmax=True),
    )
    int8 = Int8Config(calibration=data_dir / "mnist", options=QuantizeOptions(samples=16))
    res = build_tensorrt(
        data_dir / "models" / "mnist-8_opset13.onnx",
        "t4",
        tmp_path_factory.mktemp("mnist-trt") / "mnist.t4-trt.edb",
        card,
        int8,
        TensorRTOptions(batch=(1, 1, 8)),
    )
    return res.bundle
